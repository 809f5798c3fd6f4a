"""Repro of a megatron-ddp model case: the case's model in megatron-core's DistributedDataParallel, trained by
megatron-core's optimizer (plain or distributed) under its parameter scheduler over the data-parallel ranks on the
CPU with gloo, each rank training on its rows of the batch, under torchrun."""

from ..targets.base import parallel
from ..targets.megatron_checkpoint import FUNCTIONS as CHECKPOINT_FUNCTIONS
from .common import megatron_release_source, literal, template, worker_source
from .torch_dp import generate_dp
from .torch_model import IMPORTS as TORCH_IMPORTS, check_model_case
from .torch_dp import producible  # noqa: F401 - the generator's interface

TARGET = "megatron-ddp"

IMPORTS = TORCH_IMPORTS + """
from megatron.core import parallel_state  # noqa: E402
"""


def check(case):
    from ..targets.megatron_ddp import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")


def generate(case, inputs, bounds, dropped):
    from ..targets.megatron_common import ddp_settings, optimizer_settings, weight_decay_overrides

    p = parallel(case)
    kind = "the distributed optimizer" if p["zero_stage"] == 1 else "its optimizer"
    what = f"megatron-core DistributedDataParallel + {kind} (CPU, gloo) over dp={p['dp']} ranks"
    settings = ["# megatron's configuration, as the worker's ddp_settings() / optimizer_settings() write it for this case.",
                literal("DDP_SETTINGS", ddp_settings(case)), literal("OPTIMIZER_SETTINGS", optimizer_settings(case)),
                f"WEIGHT_DECAY_OVERRIDES = {weight_decay_overrides(case)!r}  # None: megatron's default groups",
                *resumed_settings(case)]
    sources = (worker_source("targets/base.py", "dtype_name", "resume_after", "checkpoint_layout", "parallel",
                             "resumed_case", "resumed_layout_changes")
               + "\n\n" + worker_source("targets/torch_common.py", "_Done", "_reduce_scatter_list")
               + "\n\n" + worker_source("targets/megatron_common.py", "cuda_on_cpu", "patch_cuda", "_NoStream", "_NoEvent",
                                          "_uneven_collectives",
                                          "transformer_config", "_REDUCE_SCATTER", "fresh_reduce_scatter",
                                          "megatron_training", "constant_schedule", "reduced_grads", "per_token_loss",
                                          "counted_tokens", "scales_loss", "loss_scale_of", "megatron_step",
                                          "sync_parameters")
               + "\n\n" + worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs")
               + "\n\n" + worker_source("targets/megatron_checkpoint.py", *CHECKPOINT_FUNCTIONS)
               + "\n\n" + worker_source("targets/megatron_ddp.py", "train_dp")
               + "\n\n" + template("megatron_resume")
               + "\n\n" + megatron_release_source())
    return generate_dp(TARGET, case, inputs, bounds, dropped, what, settings, IMPORTS, sources)


def resumed_settings(case):
    """The settings of the layout the case's run resumes into (`train.resume_parallel`; None: its own): megatron's DDP
    and optimizer configuration as ddp_settings() / optimizer_settings() write it for that layout, its
    tensor-parallel degree, its pipeline stages and virtual stages per stage."""
    from ..targets.base import parallel, resumed_case
    from ..targets.megatron_common import ddp_settings, optimizer_settings, pipeline_degrees

    resumed = resumed_case(case) if case["train"].get("resume_parallel") is not None else None
    pp, vs = (None, None) if resumed is None else pipeline_degrees(resumed)
    return ["# the layout the run resumes into (case.train.resume_parallel; None: the run's own)",
            literal("RESUMED_DDP_SETTINGS", None if resumed is None else ddp_settings(resumed)),
            literal("RESUMED_OPTIMIZER_SETTINGS", None if resumed is None else optimizer_settings(resumed)),
            literal("RESUMED_TP", None if resumed is None else parallel(resumed)["tp"]),
            literal("RESUMED_PP", pp), literal("RESUMED_VS", vs)]
