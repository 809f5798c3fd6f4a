"""Repro of a colossalai-tp model case: the case's model from Colossal-AI's shardformer layers (the worker's
colossalai_model.py) over the tensor-parallel ranks under torchrun, with the worker's CPU start-up shims, against
the torch targets' plain model in float64 on one device."""

import re

from ..targets.base import dtype_name, parallel, vocab_sharded_loss
from .common import assemble, embed, header, literal, module_source, rule, template, worker_source
from .megatron_tp import renamed
from .torch_model import IMPORTS, MODEL_SOURCE, TORCH_DTYPES, check_model_case, model_about, model_arrays, model_line
from .torch_model import producible, training_source  # noqa: F401 - producible: the generator's interface

TARGET = "colossalai-tp"

SHIMS = ("_CpuStream", "_cpu_accelerator", "_all_to_all_list", "install_shims",
         "_shim_zero_sanity_checks")
SHIMS_ABOUT = ("The worker's start-up shims stand in for what a CPU and gloo lack (device management, list-form"
               " reduce_scatter / all_to_all, ZeRO's CUDA check); they do not change what Colossal-AI computes.")
COLOSSAL_SOURCE = ("_col", "_row", "Attention", "Mlp", "Block", "ColossalModel", "VOCAB_PARALLEL", "case_view",
                   "build", "loss_mode", "run", "is_distributed_tensor", "clip_global", "assemble_outputs")
RELEASE_IMPORTS = "import ast\nimport importlib.util\nimport inspect\n"  # (functools: in the torch imports)
RELEASE_OPTIONS = ("OPTIONS_OFF", "DEFINED_IN", "installed_version", "parameters", "missing_options", "options")


def check(case):
    from ..targets.colossalai_tp import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")


def shims_source():
    """The worker's CPU start-up shims (install_shims and what it calls): the script installs them after
    init_process_group, as the worker's ranks do."""
    return (rule("Colossal-AI on CPU with gloo (the worker's start-up shims)") + "\n"
            + worker_source("targets/torch_common.py", "_Done", "_reduce_scatter_list") + "\n\n"
            + worker_source("targets/colossalai_common.py", *SHIMS))


def release_source(*names):
    """The worker's Colossal-AI release differences (targets/colossalai_release.py), called as
    `colossalai_release.…` by the embedded helpers: its options and the other functions `names`."""
    return (rule("Colossal-AI release differences (as the worker's)") + "\n"
            + module_source("targets/colossalai_release.py", *RELEASE_OPTIONS, *names))


def sources():
    """The helpers, the worker's CPU shims, the plain torch model (its blocks renamed Ref*: the shardformer blocks
    take their names), the worker's torch training loop (the reference's) and colossalai_model.py (its `run`
    renamed run_colossalai)."""
    helpers = (worker_source("targets/base.py", "IGNORE_INDEX", "loss_denominator", "class_weight", "parallel", "dtype_name", "micro_batches",
                              "vocab_sharded_loss")
               + "\n\n" + worker_source("targets/torch_common.py", "torch_dtype")
               + "\n\n" + worker_source("targets/megatron_model.py", "COLUMN", "linear_kind", "shard_dim"))
    plain = worker_source("targets/torch_model.py", *MODEL_SOURCE, "model_defaults").replace("HarnessError", "RuntimeError")
    plain = renamed(plain, {"Attention": "RefAttention", "Mlp": "RefMlp", "Block": "RefBlock"}).replace(
        "torch_model.py\n", "torch_model.py (Attention, Mlp, Block renamed Ref*)\n", 1)
    colossal = worker_source("targets/colossalai_model.py", *COLOSSAL_SOURCE)
    colossal = re.sub(r"(?m)^def run\(", "def run_colossalai(", colossal).replace(
        "colossalai_model.py\n", "colossalai_model.py (run renamed run_colossalai)\n", 1)
    return [
        rule("helpers (as the worker's)") + "\n" + helpers,
        shims_source(),
        release_source(),
        rule("the plain torch model (the reference's)") + "\n" + plain,
        training_source(),
        rule("the shardformer model and its training (as the worker's)") + "\n" + colossal,
    ]


def describe(case):
    p = parallel(case)
    sp = f", sequence parallel ({p['sequence_parallel_mode']})" if p["sequence_parallel"] else ""
    loss = "cross_entropy_1d" if vocab_sharded_loss(case, True) else "gather_output=True and the plain loss"
    return [
        f"Colossal-AI shardformer tensor parallelism (VocabParallelEmbedding1D, Linear1D_Col / Linear1D_Row,"
        f" VocabParallelLMHead1D, {loss}) over tp={p['tp']} ranks{sp}, dtype {dtype_name(case)}."
        " Reference: the torch targets' plain model (the same math) in float64.",
        SHIMS_ABOUT,
        *model_about(case),
    ]


def generate(case, inputs, bounds, dropped):
    arrays = model_arrays(case, inputs, TARGET)
    p = parallel(case)
    command = f"torchrun --nproc_per_node {p['tp']} repro.py"
    config = [
        rule("the case"),
        literal("CASE", case),
        f"TP = WORLD = {p['tp']}\nDTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        model_line(case),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        *sources(),
        template("torch_reference"),
        template("colossalai_tp"),
        template("torch_main"),
    ]
    head = header(f"{TARGET}, model", describe(case), command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS + RELEASE_IMPORTS, sections, embed(arrays)), command
