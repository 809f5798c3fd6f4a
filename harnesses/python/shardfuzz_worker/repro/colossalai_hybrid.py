"""Repro of a colossalai-hybrid model case: the case's model as a `transformers` Llama trained through
Colossal-AI's Booster with HybridParallelPlugin (tp x pp x dp, ZeRO, sequence parallelism, the pipeline
schedule, parallel_output from the case's vocab_loss: the plugin's arguments exactly as the worker gives them), with the worker's CPU start-up shims and
its training code, under torchrun; against the same Llama or GPT-2 on one device in float64."""

import re
from unittest import mock

from ..targets.base import dtype_name, parallel, resumed_case
from .colossalai_tp import RELEASE_IMPORTS, SHIMS_ABOUT, release_source, shims_source
from .common import assemble, embed, header, literal, rule, template, worker_source
from .torch_model import IMPORTS as TORCH_IMPORTS
from .torch_model import TORCH_DTYPES, check_model_case, model_about, model_arrays
from .torch_model import producible  # noqa: F401 - the generator's interface

TARGET = "colossalai-hybrid"

IMPORTS = TORCH_IMPORTS + RELEASE_IMPORTS + """import contextlib
import re

from colossalai.booster.plugin import HybridParallelPlugin
"""

FAMILIES = {
    "colossalai_llama": ("NORM_EPS", "config", "NoRotation", "build", "_LAYER", "case_name", "is_projection_weight",
                         "to_llama", "to_case", "case_tensors", "shardformer_loss"),
    "colossalai_gpt2": ("NORM_EPS", "POSITIONS", "config", "build", "_BLOCK", "_PART", "case_tensors",
                        "shardformer_loss"),
}
RUN = ("Place", "local_view", "reported_name", "case_views", "checkpointed", "input_grads", "frozen_model", "_Gather", "gather", "full_vocabulary", "criterion_loss",
       "batches", "model_labels", "Layout", "run", "first_step", "sharded_flags", "as_scaled_loss", "plain_step", "pipeline_step", "reported_logits",
       "pipeline_result", "model_loss_plain_step", "model_loss_pipeline_step", "single_device", "assemble", "combine")


def check(case):
    from ..targets.colossalai_hybrid import TARGET as WORKER

    check_model_case(case, TARGET, WORKER, "case.model / case.parallel / case.train")


def plugin_arguments(case):
    """The keyword arguments the worker's ColossalHybrid.plugin() gives HybridParallelPlugin for the case (its own
    code run with the plugin class recording them); a torch dtype as its name."""
    import torch

    from ..targets.colossalai_hybrid import TARGET as WORKER

    with mock.patch("colossalai.booster.plugin.HybridParallelPlugin", lambda **kwargs: kwargs):
        kw = WORKER.plugin(case)
    return {k: (str(v).replace("torch.", "") if isinstance(v, torch.dtype) else v) for k, v in kw.items()}


def sources(case):
    helpers = (worker_source("targets/base.py", "IGNORE_INDEX", "loss_denominator", "class_weight", "chunk_range", "grad_or_fail", "is_frozen", "setup_features", "moe_setup_features", "optimizer_features", "moe_of", "drops_tokens", "case_slots", "micro_batches", "resume_after", "checkpoint_layout").replace("HarnessError", "RuntimeError")
               + "\n\n" + worker_source("targets/torch_common.py", "torch_dtype")
               + "\n\n" + worker_source("targets/torch_model.py", "model_defaults", "make_optimizer",
                                                 "optimizer_parts", "IMPLEMENTATION_KWARGS", "rounds_in_parameter_dtype",
                                                 "implementation_kwargs").replace("HarnessError", "RuntimeError")
               + "\n\n" + worker_source("targets/torch_training.py", "_LowPrecisionGradScaler", "loss_scaler", "scaled_step",
                                          "skipped_steps_stats")
               + "\n\n" + worker_source("targets/colossalai_common.py", "fp16_scaler", "plugin_step", "unscaled", "booster_resume")
               + "\n\n" + worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs"))
    from ..targets.colossalai_family import family

    module = family(case["model"]).__name__.rsplit(".", 1)[-1]
    kind = "GPT-2" if module == "colossalai_gpt2" else "Llama"
    return [
        rule("helpers (as the worker's)") + "\n" + helpers,
        shims_source(),
        rule(f"the case's model as a transformers {kind} (as the worker's)") + "\n"
        + worker_source(f"targets/{module}.py", *FAMILIES[module])
        + "\n\n" + worker_source("targets/megatron_model.py", "COLUMN", "linear_kind", "shard_dim"),
        release_source("LLAMA_NEWER_OPTIONS", "llama_options", "llama_model", "replace_llama_rotary_embedding"),
        rule("training on one rank, the single-device run, assembly (as the worker's; run renamed run_hybrid)") + "\n"
        + re.sub(r"(?m)^def run\(", "def run_hybrid(", worker_source("targets/colossalai_hybrid_run.py", *RUN)),
    ]


def describe(case, plugin):
    from ..targets.colossalai_llama import expressible

    p, family = parallel(case), "Llama" if expressible(case["model"]) is None else "GPT-2"
    sp = f", sequence parallel ({p['sequence_parallel_mode']})" if p["sequence_parallel"] and p["tp"] > 1 else ""
    pp = ""
    if p["pp"] > 1:
        chunks = f" x {p['virtual_stages']} chunks" if p["pipeline_schedule"] == "interleaved" else ""
        pp = f", {plugin.get('pp_style', '1f1b')} pipeline{chunks} over {p['microbatches']} micro-batches"
    return [
        f"Colossal-AI HybridParallelPlugin (Booster, precision {plugin['precision']}, ZeRO stage {p['zero_stage']}) over"
        f" dp={p['dp']} x tp={p['tp']} x pp={p['pp']} ranks{sp}{pp}, dtype {dtype_name(case)}."
        f" Reference: the same {family} on one device in float64.",
        SHIMS_ABOUT,
        *model_about(case),
    ]


def generate(case, inputs, bounds, dropped):
    arrays = model_arrays(case, inputs, TARGET)
    p = parallel(case)
    world = p["dp"] * p["tp"] * p["pp"]
    command = f"torchrun --nproc_per_node {world} repro.py"
    plugin = plugin_arguments(case)
    resumed = resumed_case(case)
    config = [
        rule("the case"),
        literal("CASE", case),
        f"WORLD = {world}\nDTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        "# HybridParallelPlugin's arguments, as the worker's ColossalHybrid.plugin() passes them for this case.",
        literal("PLUGIN", plugin),
        "# ... and for the layout the run resumes into (case.train.resume_parallel; None: the run's own).",
        literal("RESUMED_PLUGIN", None if resumed is case else plugin_arguments(resumed)),
        literal("BOUNDS", bounds),
    ]
    sections = ["\n".join(c.rstrip("\n") for c in config), template("common"), *sources(case), template("colossalai_hybrid"),
                template("torch_main")]
    head = header(f"{TARGET}, model", describe(case, plugin), command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS, sections, embed(arrays)), command
