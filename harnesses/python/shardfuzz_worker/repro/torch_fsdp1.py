"""Repro of a torch-fsdp1 model case: the case's model in FSDP1's FullyShardedDataParallel on every block and on the
root over the data-parallel ranks, each training on its rows of the batch, under torchrun."""

from ..targets.base import dtype_name, master_dtype_name, parallel, reduce_dtype_name
from .common import worker_source
from .torch_dp import check_reduced_model_case, generate_dp
from .torch_model import IMPORTS as TORCH_IMPORTS, TORCH_DTYPES
from .torch_dp import producible  # noqa: F401 - the generator's interface

TARGET = "torch-fsdp1"

IMPORTS = TORCH_IMPORTS + "from torch.distributed.device_mesh import init_device_mesh\n"


def check(case):
    from ..targets.torch_fsdp1 import TARGET as WORKER

    check_reduced_model_case(case, TARGET, WORKER)


def generate(case, inputs, bounds, dropped):
    from ..targets.base import resumed_case, sync_every_microbatch
    from ..targets.torch_fsdp1 import hybrid_group, strategy as fsdp1_strategy

    p, q = parallel(case), parallel(resumed_case(case))
    g, rg = hybrid_group(p, p["dp"]), hybrid_group(q, q["dp"])
    strategy = fsdp1_strategy(p, p["dp"])
    master = master_dtype_name(case)
    what = (f"torch FSDP1 (FullyShardedDataParallel, use_orig_params={not p['flat_params']}, on every block and on "
            f"the root) over "
            f"dp={p['dp']} ranks, {strategy} (case ZeRO stage {p['zero_stage']}), gradients reduced in "
            f"{reduce_dtype_name(case)}{f', parameters held in {master}' if master != dtype_name(case) else ''}")
    settings = [f"STRATEGY = {strategy!r}  # from case.parallel.zero_stage (and zero_shard_group: hybrid)\n"
                f"MESH_SHAPE = {(p['dp'] // g, g) if g else None!r}  # hybrid sharding's (replicate, shard) mesh\n"
                f"RESUMED_STRATEGY = {fsdp1_strategy(q, q['dp'])!r}  # the same for case.train.resume_parallel\n"
                f"RESUMED_MESH_SHAPE = {(q['dp'] // rg, rg) if rg else None!r}\n"
                f"REDUCE_DTYPE = {TORCH_DTYPES[reduce_dtype_name(case)]}\n"
                f"MASTER_DTYPE = {TORCH_DTYPES[master]}  # parameters held in it, computed in DTYPE\n"
                f"FLAT_PARAMS = {bool(p['flat_params'])}  # use_orig_params=False: the optimizer steps flat parameters\n"
                f"SYNC_EVERY_MICROBATCH = {sync_every_microbatch(case, True)}  # False: the root's no_sync() on all but"
                " the last micro-batch"]
    sources = (worker_source("targets/torch_fsdp1.py", "clean", "wrap_units", "sharded_grad_scaler", "LostParameters",
                             "Fsdp1Run", "flat_gradients")
               + "\n\n" + worker_source("targets/torch_dcp.py", "save_checkpoint", "load_checkpoint", "save_full_checkpoint",
                                          "load_full_checkpoint")
               + "\n\n" + worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs"))
    return generate_dp(TARGET, case, inputs, bounds, dropped, what, settings, IMPORTS, sources)
