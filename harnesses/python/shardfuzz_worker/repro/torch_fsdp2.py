"""Repro of a torch-fsdp2 model case: the case's model with fully_shard on every block and on the root over the
data-parallel ranks, each training on its rows of the batch, under torchrun."""

from ..targets.base import parallel, reduce_dtype_name
from .common import ReproError
from .torch_dp import generate_dp
from .torch_model import IMPORTS as TORCH_IMPORTS, TORCH_DTYPES, check_model_case
from .torch_model import producible  # noqa: F401 - the generator's interface

TARGET = "torch-fsdp2"

IMPORTS = TORCH_IMPORTS + """from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
"""


def check(case):
    from ..targets.torch_fsdp2 import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")
    if reduce_dtype_name(case) not in TORCH_DTYPES:
        raise ReproError(f"{TARGET}: case.train.reduce_dtype {reduce_dtype_name(case)!r} has no torch dtype")


def generate(case, inputs, bounds, dropped):
    p = parallel(case)
    reshard = p["zero_stage"] == 3
    what = (f"torch FSDP2 (fully_shard on every block and on the root) over dp={p['dp']} ranks, case ZeRO stage"
            f" {p['zero_stage']}: reshard_after_forward={reshard}, gradients reduce-scattered in"
            f" {reduce_dtype_name(case)}")
    settings = [f"REDUCE_DTYPE = {TORCH_DTYPES[reduce_dtype_name(case)]}\n"
                f"RESHARD_AFTER_FORWARD = {reshard}  # ZeRO-3 (case.parallel.zero_stage == 3)"]
    return generate_dp(TARGET, case, inputs, bounds, dropped, what, settings, IMPORTS)
