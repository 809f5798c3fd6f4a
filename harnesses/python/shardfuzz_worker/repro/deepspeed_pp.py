"""Repro of a deepspeed-pp model case: the case's model as a DeepSpeed PipelineModule trained by DeepSpeed's pipeline
engine (its 1F1B TrainSchedule or DualPipeV) over pp x dp ranks, under torchrun; the pipeline's code is the worker's
own."""

from ..targets.base import dtype_name, parallel, resumed_case
from .common import assemble, embed, header, literal, module_source, rule, template, worker_source
from .deepspeed_zero import IMPORTS
from .torch_dp import producible  # noqa: F401 - the generator's interface (the dp replicas included)
from .torch_model import TORCH_DTYPES, check_model_case, model_about, model_arrays, model_line, model_source
from .torch_model import training_source

TARGET = "deepspeed-pp"

#: The worker's pipeline (targets/deepspeed_pp.py) the script runs as is.
PIPELINE_SOURCE = ("dual_pipe", "micro_batch_count", "uneven_micro_batches", "_GROUPS", "configure_checkpointing",
                   "pipeline_layers",
                   "case_name", "PipelineRun")


def check(case):
    from ..targets.deepspeed_pp import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")


def generate(case, inputs, bounds, dropped):
    from ..targets.deepspeed_pp import TARGET as WORKER
    from ..targets.deepspeed_pp import dual_pipe, micro_batch_count, optimizer_path

    p = parallel(case)
    world = p["pp"] * p["dp"]
    command = f"torchrun --nproc_per_node {world} repro.py"
    schedule = "DualPipeV (DualPipeVModule / DualPipeVEngine)" if dual_pipe(p) else "its 1F1B TrainSchedule"
    what = (f"DeepSpeed's pipeline engine (PipelineModule, engine.train_batch): {p['pp']} pipeline ranks under "
            f"{schedule}, {micro_batch_count(case)} micro-batch(es) per step, dp={p['dp']} at ZeRO {p['zero_stage']} "
            f"({optimizer_path(case)})")
    config = [
        rule("the case"),
        literal("CASE", case),
        f"PP = {p['pp']}\nDP = {p['dp']}\nWORLD = {world}  # PP x DP, dp fastest\nDTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        "# The engine's configuration before the rank's micro-batch size, as the worker's DeepSpeedPp.config() writes it",
        "# (RESUMED_DS_CONFIG: the layout the run resumes into, case.train.resume_parallel; None: the run's own).",
        literal("DS_CONFIG", WORKER.config(case, world)),
        literal("RESUMED_DS_CONFIG", None if case["train"].get("resume_parallel") is None
                else WORKER.config(resumed_case(case), world)),
        model_line(case),
        literal("BOUNDS", bounds),
    ]
    helpers = (worker_source("targets/base.py", "parallel", "dtype_name", "resumed_case") + "\n\n"
               + worker_source("targets/torch_common.py", "torch_dtype", "shared_tempdir") + "\n\n"
               + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs") + "\n\n"
               + worker_source("targets/deepspeed_zero.py", "configure_deepspeed_checkpointing") + "\n\n"
               + worker_source("targets/torch_pp.py", "combine_stages") + "\n\n"
               + worker_source("targets/base.py", "checkpoint_layout") + "\n\n"
               # (The pipeline's resume writes, and converts, its checkpoint through the worker's module.)
               + module_source("targets/deepspeed_checkpoint.py", "TAG", "universal", "save", "convert_to_universal",
                               "load_config"))
    pipeline = worker_source("targets/deepspeed_pp.py", *PIPELINE_SOURCE)
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        model_source(),
        training_source(),
        rule("the pipeline (as the worker's)") + "\n" + helpers + "\n\n" + pipeline,
        template("deepspeed_pp"),
        template("pipeline_stages"),
        template("torch_reference"),
        template("torch_main"),
    ]
    about = [f"{what}, dtype {dtype_name(case)}.", *model_about(case)]
    head = header(f"{TARGET}, model", about, command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS + "import copy\n", sections, embed(model_arrays(case, inputs, TARGET))), command
