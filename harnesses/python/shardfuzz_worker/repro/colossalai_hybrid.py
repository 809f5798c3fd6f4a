"""Repro of a colossalai-hybrid model case: the case's model as a `transformers` Llama trained through
Colossal-AI's Booster with HybridParallelPlugin (tp x pp x dp, ZeRO, sequence parallelism, the pipeline
schedule, parallel_output from the case's vocab_loss: the plugin's arguments exactly as the worker gives them), with the worker's CPU start-up shims and
its training code, under torchrun; against the same Llama or GPT-2 on one device in float64. colossalai-moe's repro
(colossalai_moe.py) is this generator with MoeHybridParallelPlugin and the Mixtral family."""

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

from colossalai.booster.plugin import HybridParallelPlugin, MoeHybridParallelPlugin
"""

FAMILIES = {
    "colossalai_llama": ("NORM_EPS", "config", "Rotation", "rotation", "architecture", "other_model", "is_extra", "build", "_LAYER",
                         "case_name", "is_projection_weight", "to_llama", "to_case", "case_tensors", "shardformer_loss"),
    "colossalai_gpt2": ("NORM_EPS", "POSITIONS", "config", "build", "_BLOCK", "_PART", "case_tensors",
                        "shardformer_loss"),
    "colossalai_opt": ("POSITIONS", "config", "build", "_LAYER", "_PART", "case_name", "to_opt", "case_tensors",
                       "shardformer_loss"),
    "colossalai_falcon": ("NORM_EPS", "config", "build", "_LAYER", "_PART", "_FIXED", "case_tensors", "to_falcon",
                          "parallel_attn", "_case_layer", "shardformer_loss"),
    "colossalai_command": ("NORM_EPS", "config", "Rotation", "build", "_LAYER", "_FIXED", "case_name", "_interleaved",
                           "_turns", "_is_head_norm", "to_command", "case_tensors", "shardformer_loss"),
    "colossalai_mixtral": ("EXPERT", "_PROJ", "_MOE_LAYER", "build", "split", "expert_part", "case_name",
                           "is_weight_matrix", "to_mixtral", "case_tensors", "shardformer_loss",
                           "unsteppable_unused_experts", "RoutingWatch"),
}
#: What the Mixtral, OPT, Falcon and Command families take from the Llama's (they import them; Mixtral's `case_name` as llama_case_name).
FROM_LLAMA = {"colossalai_mixtral": ("NORM_EPS", "Rotation", "rotation", "_LAYER", "case_name", "is_projection_weight"),
              "colossalai_opt": ("is_projection_weight",), "colossalai_falcon": ("Rotation", "rotation", "is_projection_weight"),
              "colossalai_command": ("is_projection_weight",)}
RUN = ("Place", "local_view", "reported_name", "named_parameters", "case_views", "checkpointed", "input_grads", "frozen_model", "_Gather", "gather", "full_vocabulary", "criterion_loss",
       "batches", "model_labels", "Layout", "routing_watch", "run", "first_step", "sharded_flags", "as_scaled_loss", "plain_step", "pipeline_step", "reported_logits",
       "pipeline_result", "model_loss_plain_step", "model_loss_pipeline_step", "single_device", "tensor_parallel_axis",
       "assemble", "stack_experts", "combine")


def worker_target(target=TARGET):
    from ..targets import colossalai_hybrid, colossalai_moe

    return {TARGET: colossalai_hybrid.TARGET, "colossalai-moe": colossalai_moe.TARGET}[target]


def check(case, target=TARGET):
    check_model_case(case, target, worker_target(target), "case.model / case.parallel / case.train")


def plugin_arguments(case, target=TARGET):
    """The keyword arguments the worker's plugin() (ColossalHybrid's, ColossalMoe's) gives its plugin class for the
    case (its own code run with the plugin class recording them); a torch dtype as its name."""
    import torch

    worker = worker_target(target)
    with mock.patch(f"colossalai.booster.plugin.{worker.plugin_name}", lambda **kwargs: kwargs):
        kw = worker.plugin(case)
    return {k: (str(v).replace("torch.", "") if isinstance(v, torch.dtype) else v) for k, v in kw.items()}


def sources(case):
    helpers = (worker_source("targets/base.py", "IGNORE_INDEX", "loss_denominator", "class_weight", "chunk_range", "grad_or_fail", "is_frozen", "setup_features", "moe_setup_features", "optimizer_features", "moe_of", "drops_tokens", "case_slots", "micro_batches", "resume_after", "checkpoint_layout").replace("HarnessError", "RuntimeError")
               + "\n\n" + worker_source("targets/torch_common.py", "torch_dtype")
               + "\n\n" + worker_source("targets/torch_model.py", "model_defaults", "rotary_cos_sin", "make_optimizer",
                                                 "optimizer_parts", "IMPLEMENTATION_KWARGS", "rounds_in_parameter_dtype",
                                                 "implementation_kwargs").replace("HarnessError", "RuntimeError")
               + "\n\n" + worker_source("targets/torch_training.py", "_LowPrecisionGradScaler", "loss_scaler", "scaled_step",
                                          "skipped_steps_stats")
               + "\n\n" + worker_source("targets/colossalai_common.py", "fp16_scaler", "plugin_step", "unscaled", "booster_resume")
               + "\n\n" + worker_source("targets/torch_common.py", "shared_tempdir")
               + "\n\n" + worker_source("lifetime.py", "orphan_dir_prefix", "remove_orphan_dirs"))
    module = family_module(case)
    borrowed = (worker_source("targets/colossalai_llama.py", *FROM_LLAMA[module]) + "\n\n\n") if module in FROM_LLAMA else ""
    if module == "colossalai_mixtral":
        borrowed += "llama_case_name = case_name\n\n\n"
    model = borrowed + worker_source(f"targets/{module}.py", *FAMILIES[module])
    experts = "" if module == "colossalai_mixtral" else "\n\n" + worker_source("targets/colossalai_mixtral.py", "EXPERT", "split",
                                                                                 "unsteppable_unused_experts", "RoutingWatch")
    return [
        rule("helpers (as the worker's)") + "\n" + helpers,
        shims_source(),
        rule(f"the case's model as a transformers {kind(case)} (as the worker's)") + "\n" + model + experts
        + "\n\n" + worker_source("targets/megatron_model.py", "COLUMN", "linear_kind", "shard_dim"),
        release_source("LLAMA_NEWER_OPTIONS", "llama_options", "llama_model", "replace_llama_rotary_embedding"),
        rule("training on one rank, the single-device run, assembly (as the worker's; run renamed run_hybrid)") + "\n"
        + re.sub(r"(?m)^def run\(", "def run_hybrid(", worker_source("targets/colossalai_hybrid_run.py", *RUN)),
    ]


KINDS = {"colossalai_llama": "Llama", "colossalai_gpt2": "GPT-2", "colossalai_opt": "OPT", "colossalai_falcon": "Falcon",
         "colossalai_command": "Command", "colossalai_mixtral": "Mixtral"}
#: The Llama family's other transformers classes (`model.hf_model`).
HF_KINDS = {"mistral": "Mistral", "qwen2": "Qwen2"}


def kind(case):
    """The transformers class the repro builds, in words."""
    return HF_KINDS.get(case["model"].get("hf_model"), KINDS[family_module(case)])


def family_module(case):
    from ..targets.colossalai_family import family

    return family(case["model"]).__name__.rsplit(".", 1)[-1]


def describe(case, plugin, target=TARGET):
    p, family = parallel(case), kind(case)
    sp = f", sequence parallel ({p['sequence_parallel_mode']})" if p["sequence_parallel"] and p["tp"] > 1 else ""
    pp = ""
    if p["pp"] > 1:
        chunks = f" x {p['virtual_stages']} chunks" if p["pipeline_schedule"] == "interleaved" else ""
        pp = f", {plugin.get('pp_style', '1f1b')} pipeline{chunks} over {p['microbatches']} micro-batches"
    ep = f" (experts over ep={p['ep']} of them)" if target != TARGET else ""
    return [
        f"Colossal-AI {worker_target(target).plugin_name} (Booster, precision {plugin['precision']}, ZeRO stage"
        f" {p['zero_stage']}) over dp={p['dp']}{ep} x tp={p['tp']} x pp={p['pp']} ranks{sp}{pp}, dtype {dtype_name(case)}."
        f" Reference: the same {family} on one device in float64.",
        SHIMS_ABOUT,
        *model_about(case),
    ]


def generate(case, inputs, bounds, dropped, target=TARGET):
    arrays = model_arrays(case, inputs, target)
    p = parallel(case)
    world = p["dp"] * p["tp"] * p["pp"]
    command = f"torchrun --nproc_per_node {world} repro.py"
    plugin = plugin_arguments(case, target)
    resumed = resumed_case(case)
    name = worker_target(target).plugin_name
    config = [
        rule("the case"),
        literal("CASE", case),
        f"WORLD = {world}\nDTYPE = {TORCH_DTYPES[dtype_name(case)]}",
        f"PLUGIN_CLASS = {name}",
        f"# {name}'s arguments, as the worker's plugin() passes them for this case.",
        literal("PLUGIN", plugin),
        "# ... and for the layout the run resumes into (case.train.resume_parallel; None: the run's own).",
        literal("RESUMED_PLUGIN", None if resumed is case else plugin_arguments(resumed, target)),
        literal("BOUNDS", bounds),
    ]
    sections = ["\n".join(c.rstrip("\n") for c in config), template("common"), *sources(case), template("colossalai_hybrid"),
                template("torch_main")]
    head = header(f"{target}, model", describe(case, plugin, target), command, dropped, case.get("name", ""))
    return assemble(head, IMPORTS, sections, embed(arrays)), command
