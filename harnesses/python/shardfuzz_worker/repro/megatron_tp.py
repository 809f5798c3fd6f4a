"""Repro of a megatron-tp model case: the case's model from megatron-core's tensor-parallel layers (the worker's
megatron_model.py) over the tensor-parallel ranks under torchrun, against the torch targets' plain model in
float64 on one device."""

import re

from ..targets.base import dtype_name, parallel
from ..targets.megatron_common import optimizer_instances
from ..targets.megatron_checkpoint import FUNCTIONS as CHECKPOINT_FUNCTIONS
from .common import megatron_release_source, ReproError, assemble, embed, header, literal, rule, template, worker_source
from .megatron_ddp import resumed_settings
from .torch_model import IMPORTS as TORCH_IMPORTS
from .torch_model import MODEL_SOURCE, TORCH_DTYPES, check_model_case, model_about, model_arrays, model_line
from .torch_model import producible, training_source  # noqa: F401 - producible: the generator's interface

TARGET = "megatron-tp"

IMPORTS = TORCH_IMPORTS.replace("import sys\n", "import sys\nimport types\n") + """
from megatron.core import parallel_state
"""

MEGATRON_SOURCE = ("COLUMN", "linear_kind", "shard_dim", "_init", "Attention", "Mlp", "Block", "MegatronModel",
                   "load_local", "case_name", "case_view", "run", "coordinates", "RankRows", "train_megatron", "resume",
                   "first_step", "case_parameters", "megatron_setup", "MicroBatches", "micro_batch_count", "GptLoss", "token_loss_sum",
                   "assemble_outputs", "replica_of", "assembled")


def check(case):
    from ..targets.megatron_tp import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")
    if "moe" in case["model"].get("layers", ()):
        # (The script's reference is the plain torch model in float64, which has no MoE block.)
        raise ReproError(f"{TARGET}: no standalone script for a case with MoE blocks (its float64 reference, the plain "
                         "torch model, has none)")


def renamed(source, names):
    """`source` with every call or definition `Name(` of `names` ({old: new}) renamed."""
    for old, new in names.items():
        source = re.sub(rf"\b{old}\(", f"{new}(", source)
    return source


def sources():
    """The helpers, the plain torch model (its blocks renamed Ref*: megatron's blocks take their names), the
    worker's torch training loop (the reference's) and megatron_model.py (its `run` renamed run_megatron)."""
    helpers = (worker_source("targets/base.py", "IGNORE_INDEX", "loss_denominator", "class_weight", "parallel", "is_frozen",
                             "vocab_sharded_loss", "dtype_name", "micro_batches", "chunk_range", "reduce_bucket",
                             "reduce_dtype_name", "label_smoothing", "overlap_param_gather", "resume_after",
                             "checkpoint_layout", "resumed_case", "resumed_layout_changes")
               + "\n\n" + worker_source("targets/torch_common.py", "torch_dtype", "_Done", "_reduce_scatter_list")
               + "\n\n" + worker_source("targets/megatron_common.py", "cuda_on_cpu", "patch_cuda", "_NoStream", "_NoEvent",
                                          "_uneven_collectives",
                                          "optimizer_settings", "decoupled_weight_decay", "weight_decay_overrides", "constant_schedule",
                                          "transformer_config", "_REDUCE_SCATTER", "fresh_reduce_scatter",
                                          "megatron_training", "ddp_settings", "fp32_accumulating_reduce_scatter",
                                          "optimizer_instances", "param_gather_overlapped", "sync_parameters",
                                          "reduced_grads", "per_token_loss", "loss_scaling_settings",
                                          "scales_loss", "loss_scale_of", "megatron_step")
               + "\n\n" + worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs")
               + "\n\n" + worker_source("targets/megatron_checkpoint.py", *CHECKPOINT_FUNCTIONS)
               + "\n\n" + worker_source("targets/megatron_moe.py", "is_moe_param", "patch_moe_host_copies")
               + "\n\n" + worker_source("targets/megatron_tp.py", "_patch_cuda")
               + "\n\n" + megatron_release_source())
    plain = worker_source("targets/torch_model.py", *MODEL_SOURCE, "model_defaults").replace("HarnessError", "RuntimeError")
    plain = renamed(plain, {"Attention": "RefAttention", "Mlp": "RefMlp", "Block": "RefBlock"}).replace(
        "torch_model.py\n", "torch_model.py (Attention, Mlp, Block renamed Ref*)\n", 1)
    megatron = worker_source("targets/megatron_model.py", *MEGATRON_SOURCE)
    megatron = re.sub(r"(?m)^def run\(", "def run_megatron(", megatron).replace(
        "megatron_model.py\n", "megatron_model.py (run renamed run_megatron)\n", 1)
    return [
        rule("helpers (as the worker's)") + "\n" + helpers,
        rule("the plain torch model (the reference's)") + "\n" + plain,
        training_source(),
        rule("the megatron model and its training (as the worker's)") + "\n" + megatron,
    ]


def describe(case):
    p = parallel(case)
    sp = ", sequence parallel" if p["sequence_parallel"] else ""
    schedule = "interleaved 1F1B schedule" if p["pipeline_schedule"] == "interleaved" else "1F1B schedule"
    data = f" x pp={p['pp']} pipeline stages (megatron's {schedule}, {p['microbatches']} micro-batches)" if p["pp"] > 1 else ""
    if p["dp"] > 1 or p["zero_stage"]:
        data += (f" x dp={p['dp']} data-parallel replicas in megatron's DistributedDataParallel"
                + (" with its distributed optimizer" if p["zero_stage"] else ""))
    return [
        f"megatron-core tensor parallelism (VocabParallelEmbedding, Column/RowParallelLinear,"
        f" vocab_parallel_cross_entropy) over tp={p['tp']} ranks{sp}{data}, dtype {dtype_name(case)}."
        " Reference: the torch targets' plain model (the same math) in float64.",
        *model_about(case),
    ]


def generate(case, inputs, bounds, dropped):
    arrays = model_arrays(case, inputs, TARGET)
    p = parallel(case)
    command = f"torchrun --nproc_per_node {p['tp'] * p['dp'] * p['pp']} repro.py"
    config = [
        rule("the case"),
        literal("CASE", case),
        f"TP = {p['tp']}\nPP = {p['pp']}\nVS = {p['virtual_stages'] if p['pipeline_schedule'] == 'interleaved' else 1}\nWORLD = {p['tp'] * p['dp'] * p['pp']}\nDTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        f"INSTANCES = {optimizer_instances(case)}  # megatron's num_distributed_optimizer_instances",
        *resumed_settings(case),
        model_line(case),
        literal("BOUNDS", bounds),
    ]
    sections = [
        "\n".join(c.rstrip("\n") for c in config),
        template("common"),
        *sources(),
        template("torch_reference"),
        template("megatron_tp"),
        template("megatron_resume"),
        template("torch_main"),
    ]
    head = header(f"{TARGET}, model", describe(case), command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS, sections, embed(arrays)), command
