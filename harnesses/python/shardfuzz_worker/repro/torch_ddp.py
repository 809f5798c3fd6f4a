"""Repro of a torch-ddp model case: the case's model in DistributedDataParallel over the data-parallel ranks,
each training on its rows of the batch, under torchrun."""

from ..targets.base import dtype_name, parallel, reduce_dtype_name
from .common import worker_source
from .torch_dp import generate_dp, torch_context_parallel
from .torch_model import IMPORTS as TORCH_IMPORTS, check_model_case
from .torch_dp import producible  # noqa: F401 - the generator's interface

TARGET = "torch-ddp"

IMPORTS = (TORCH_IMPORTS + "from torch.distributed.device_mesh import init_device_mesh\n"
           + "from torch.nn.parallel import DistributedDataParallel as DDP\n")


def check(case):
    from ..targets.torch_ddp import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")


def generate(case, inputs, bounds, dropped):
    from ..targets.torch_common import torch_dtype
    from ..targets.base import sync_every_microbatch
    from ..targets.torch_ddp import bucket_cap_mb, compress_hook_name

    p = parallel(case)
    cap = bucket_cap_mb(case, torch_dtype(dtype_name(case)))
    view, static, unused = bool(p["contiguous_grads"]), bool(p["static_graph"]), bool(p["find_unused"])
    hook = compress_hook_name(case)
    what = (f"torch DistributedDataParallel (bucket_cap_mb={cap!r}, gradient_as_bucket_view={view}, static_graph={static}"
            f", find_unused_parameters={unused}{f', comm hook {hook}' if hook else ''}) over dp={p['dp']} ranks")
    settings = [f"BUCKET_CAP_MB = {cap!r}", f"GRADIENT_AS_BUCKET_VIEW = {view}", f"STATIC_GRAPH = {static}",
                f"FIND_UNUSED = {unused}",
                f"SYNC_EVERY_MICROBATCH = {sync_every_microbatch(case, False)}  # False: no_sync() on all but the last",
                f"COMPRESS_HOOK = {hook!r}  # a default_hooks name: gradients reduced in {reduce_dtype_name(case)}"]
    if p["zero_stage"] == 1:
        g = p["zero_shard_group"]
        what += (f", torch's ZeroRedundancyOptimizer (ZeRO 1{f', partitions within groups of {g} ranks' if g else ''}"
                 f", parameters_as_bucket_view={bool(p['param_buckets'])})")
    settings += [f"ZERO_STAGE = {p['zero_stage']}  # 1: torch's ZeroRedundancyOptimizer",
                 f"ZERO_SHARD_GROUP = {p['zero_shard_group']!r}  # its partitions within groups of this many ranks",
                 f"PARAM_BUCKETS = {bool(p['param_buckets'])}  # parameters_as_bucket_view",
                 f"COMPILED = {bool(case['train'].get('compiled'))}  # the DDP module under torch.compile (aot_eager)"]
    if case["train"].get("compiled"):
        what += ", compiled with torch.compile (backend aot_eager)"
    cp_setting, cp_sources = torch_context_parallel(case)
    if cp_sources:
        what += f" x cp={p['cp']} ranks of torch's context parallelism (ring attention under context_parallel)"
        settings.append(cp_setting)
    sources = (worker_source("targets/torch_zero_redundancy.py", "shard_group", "zero_redundancy_optimizer",
                             "saved_and_loaded")
               + "\n\n" + worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs"))
    return generate_dp(TARGET, case, inputs, bounds, dropped, what, settings, IMPORTS,
                       sources + (f"\n\n{cp_sources}" if cp_sources else ""))
