"""Repro of a torch-fsdp2 model case: the case's model with fully_shard on every block and on the root over the
data-parallel ranks, each training on its rows of the batch, under torchrun."""

from ..targets.base import (dtype_name, master_dtype_name, parallel, reduce_dtype_name, resumed_case, vocab_sharded_loss,
                            zero_offloaded)
from .common import ReproError, literal, worker_source
from .torch_tp import plan_source, tp_imports
from .torch_dp import check_reduced_model_case, generate_dp, torch_context_parallel
from .torch_model import IMPORTS as TORCH_IMPORTS, TORCH_DTYPES
from .torch_dp import producible  # noqa: F401 - the generator's interface

TARGET = "torch-fsdp2"

IMPORTS = TORCH_IMPORTS + """from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
"""


def check(case):
    from ..targets.torch_fsdp2 import TARGET as WORKER

    check_reduced_model_case(case, TARGET, WORKER)
    if any(parallel(resumed_case(case))[k] != parallel(case)[k] for k in ("dp", "tp")):
        # (The script's resume rebuilds the model in the resumed FSDP layout of the same degrees; the worker's split of
        # the data anew and its meshes of other degrees are not carried.)
        raise ReproError(f"{TARGET}: no standalone script for a case resumed into other data- and tensor-parallel "
                         "degrees (train.resume_parallel dp / tp)")


def generate(case, inputs, bounds, dropped):
    from ..targets.base import sync_every_microbatch
    from ..targets.torch_context_parallel import rotate_method

    p = parallel(case)
    layout = fsdp_layout(case)
    reshard, mesh, offload = layout["RESHARD_AFTER_FORWARD"], (layout["MESH_SHAPE"], layout["MESH_NAMES"]), layout["CPU_OFFLOAD"]
    master = master_dtype_name(case)
    beside = "" if p["tp"] == 1 else (f" beside torch tensor parallelism over tp={p['tp']} (the last dimension of one "
                                     f"mesh{', sequence parallel' if p['sequence_parallel'] else ''})")
    if p["cp"] > 1:
        beside = (f" x cp={p['cp']} ranks of torch's context parallelism (ring attention under context_parallel, "
                  f"key/value rotated by {rotate_method(case)}; FSDP2 over dp x cp together)")
    what = (f"torch FSDP2 (fully_shard on every block and on the root) over dp={p['dp']} ranks on a {mesh[0]} mesh{beside},"
            f" case ZeRO stage {p['zero_stage']}: reshard_after_forward={reshard}, gradients reduced in"
            f" {reduce_dtype_name(case)}{', CPU offload' if offload else ''}"
            f"{f', parameters held in {master}' if master != dtype_name(case) else ''}"
            f"{', each block compiled (torch.compile, aot_eager)' if case['train'].get('compiled') else ''}")
    resumed = fsdp_layout(resumed_case(case)) if case["train"].get("resume_parallel") is not None else None
    settings = [f"REDUCE_DTYPE = {TORCH_DTYPES[reduce_dtype_name(case)]}\n"
                "# RESHARD_AFTER_FORWARD: ZeRO-3 (an int: case.parallel.reshard_group); MESH_SHAPE, MESH_NAMES: HSDP where\n"
                "# case.parallel.zero_shard_group < dp; CPU_OFFLOAD: case.parallel.zero_offload; SHARD_DIM:\n"
                "# case.parallel.param_shard_dim (Shard(d) where d divides evenly); SUM_COLLECTIVES:\n"
                "# case.parallel.sum_collectives (set_force_sum_reduction_for_comms); DIVIDE_FACTOR: with\n"
                "# case.parallel.explicit_grad_divide, the dp ranks handed to set_gradient_divide_factor\n"
                + literal("LAYOUT", layout)
                + "# the layout the run resumes into (case.train.resume_parallel; None: LAYOUT)\n"
                + literal("RESUMED_LAYOUT", resumed)
                + f"COMPILED = {bool(case['train'].get('compiled'))}  # each block under torch.compile (aot_eager)\n"
                f"MASTER_DTYPE = {TORCH_DTYPES[master]}  # parameters held in it, computed on a copy in DTYPE\n"
                f"SYNC_EVERY_MICROBATCH = {sync_every_microbatch(case, True)}  # False: set_requires_gradient_sync(False)"
                " on all but the last micro-batch",
                f"TP = {p['tp']}  # tensor parallel over the last mesh dimension (torch-tp's plan), before fully_shard\n"
                f"SEQUENCE_PARALLEL = {bool(p['sequence_parallel'])}\n"
                f"VOCAB_SHARDED_LOSS = {vocab_sharded_loss(case, True)}  # loss_parallel on the LM head's vocabulary shards"]
    sources = (worker_source("targets/torch_fsdp2.py", "shard_placement", "set_gradient_reduction",
                             "without_gradient_sync")
               + "\n\n" + worker_source("targets/torch_dcp.py", "save_checkpoint", "load_checkpoint", "save_full_checkpoint",
                                          "load_full_checkpoint")
               + "\n\n" + worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs"))
    imports = IMPORTS
    cp_setting, cp_sources = torch_context_parallel(case)
    if cp_sources:
        settings.append(cp_setting)
        sources += "\n\n" + cp_sources
    if p["tp"] > 1:
        sources += "\n\n" + plan_source(case) + "\n\n" + worker_source("targets/torch_tp.py", "replicas_per_rank",
                                                                           "replicated_norms")
        imports += tp_imports(p["sequence_parallel"])
    return generate_dp(TARGET, case, inputs, bounds, dropped, what, settings, imports, sources)


def fsdp_layout(case):
    """The case's FSDP2 layout as the script's LAYOUT names it: reshard_after_forward, the mesh FSDP2 shards over,
    CPU offload, the shard dimension."""
    from ..targets.torch_fsdp2 import reshard_after_forward

    p = parallel(case)
    g = p["zero_shard_group"] or p["dp"] * p["cp"]
    mesh = ((p["dp"] * p["cp"],), ("dp",)) if g == p["dp"] * p["cp"] else ((p["dp"] // g, g), ("replicate", "shard"))
    return {"RESHARD_AFTER_FORWARD": reshard_after_forward(p, g), "MESH_SHAPE": mesh[0], "MESH_NAMES": mesh[1],
            "CPU_OFFLOAD": zero_offloaded(case), "SHARD_DIM": p["param_shard_dim"] or 0,
            "SUM_COLLECTIVES": p["sum_collectives"],
            "DIVIDE_FACTOR": p["dp"] * p["cp"] if p["explicit_grad_divide"] else None}
