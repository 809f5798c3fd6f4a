"""Repro of a torch-pp model case: the case's model cut into torch.distributed.pipelining stages run by torch's
schedule, beside DDP or FSDP2 over the data-parallel ranks, under torchrun; the stages' code is the worker's own."""

from ..targets.base import dtype_name, parallel
from .common import assemble, embed, header, literal, rule, template, worker_source
from .torch_dp import producible  # noqa: F401 - the generator's interface (the dp replicas included)
from .torch_model import IMPORTS, TORCH_DTYPES, check_model_case, model_about, model_arrays, model_line, model_source
from .torch_model import training_source

TARGET = "torch-pp"

#: The worker's pipeline (targets/torch_pp.py) the script runs as is.
PIPELINE_SOURCE = ("virtual_stages", "v_shaped", "dual_pipe", "breadth_first", "rank_stages", "fsdp_stages",
                   "scales_grads", "stage_module_class", "stage_layers", "Pipeline", "state_dict_options", "resumed_training",
                   "distributed", "combine_stages")


def check(case):
    from ..targets.torch_pp import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")


def schedule_words(p):
    from ..targets.torch_pp import breadth_first, dual_pipe, v_shaped, virtual_stages

    if v_shaped(p):
        return f"{'ScheduleDualPipeV' if dual_pipe(p) else 'ScheduleZBVZeroBubble'} (two V-placed stages per rank)"
    if p["pipeline_schedule"] == "interleaved":
        kind = "ScheduleInterleavedZeroBubble" if p["zero_bubble"] else "ScheduleInterleaved1F1B"
        kind = "ScheduleLoopedBFS" if breadth_first(p) else kind
        return f"{kind} ({virtual_stages(p)} stages per rank)"
    return "Schedule1F1B" if p["pipeline_schedule"] == "1f1b" else "ScheduleGPipe"


def generate(case, inputs, bounds, dropped):
    p = parallel(case)
    world = p["pp"] * p["dp"] * p["tp"]
    command = f"torchrun --nproc_per_node {world} repro.py"
    wrap = "" if p["dp"] == 1 else (" in DDP" if p["zero_stage"] == 0 else f" in FSDP2 (ZeRO-{p['zero_stage']})")
    tp = "" if p["tp"] == 1 else (f", torch's tensor-parallel plan over tp={p['tp']} ranks inside them"
                                  f"{' (sequence parallel)' if p['sequence_parallel'] else ''}")
    what = (f"torch.distributed.pipelining: {p['pp']} pipeline ranks under {schedule_words(p)}, {p['microbatches']} "
            f"micro-batch(es) per step, stages{wrap} over dp={p['dp']} ranks{tp}"
            f"{', each block compiled (torch.compile, aot_eager)' if case['train'].get('compiled') else ''}")
    config = [
        rule("the case"),
        literal("CASE", case),
        f"PP = {p['pp']}\nDP = {p['dp']}\nTP = {p['tp']}\nWORLD = {world}  # PP x DP x TP, tp fastest\n"
        f"DTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        "DEFERRED_FINALIZE = \"finalize_gradients\" in inspect.signature(ScheduleGPipe.step).parameters  # as the worker",
        model_line(case),
        literal("BOUNDS", bounds),
    ]
    base = worker_source("targets/base.py", "parallel", "dtype_name", "reduce_dtype_name", "master_dtype_name",
                         "vocab_sharded_loss", "resumed_case")  # (resume_after: training_source has it)
    dtypes = (worker_source("targets/torch_common.py", "torch_dtype", "compiled", "uncompiled_name", "shared_tempdir")
              + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs"))
    # (torch-tp's plan and per-rank reporting, which the pipeline calls where tp > 1.)
    plan = (worker_source("targets/torch_model.py", "model_defaults") + "\n\n"
            + worker_source("targets/torch_tp.py", "parallelize", "replicated_norms", "loss_context", "replicas_per_rank"))
    pipeline = worker_source("targets/torch_pp.py", *PIPELINE_SOURCE)
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        model_source(),
        training_source(),
        rule("the pipeline (as the worker's)") + "\n" + base + "\n\n" + dtypes + "\n\n" + plan + "\n\n" + pipeline,
        template("torch_pp"),
        template("pipeline_stages"),
        template("torch_reference"),
        template("torch_main"),
    ]
    about = [f"{what}, dtype {dtype_name(case)}.", *model_about(case)]
    head = header(f"{TARGET}, model", about, command, dropped, case.get("name", ""))
    imports = IMPORTS + "import inspect\n\nfrom torch.distributed.pipelining import ScheduleGPipe\n"
    return assemble(head, imports, sections, embed(model_arrays(case, inputs, TARGET))), command
