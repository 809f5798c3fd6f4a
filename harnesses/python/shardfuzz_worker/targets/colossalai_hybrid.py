"""colossalai-hybrid: the case's model as a `transformers` Llama or GPT-2 (colossalai_family.py: RMSNorm + SwiGLU
cases a Llama, LayerNorm + GELU ones a GPT-2) trained through Colossal-AI's
Booster with HybridParallelPlugin: tp x pp x dp from the case (ranks dp-outermost, as the plugin lays them out),
ZeRO stage 0-2 over dp (with `zero_offload`), sequence parallelism in each mode the plugin offers
(`split_gather` and `ring` over the tensor-parallel group; `all_to_all`, DeepSpeed-Ulysses, over a
sequence-parallel group of the case's tp ranks with tensor parallelism off), the 1F1B and interleaved pipeline
schedules (the case's `virtual_stages` as model chunks) with the case's micro-batches, clipping by the plugin's global norm, fp32 / bf16 / fp16 precision (fp32 masters).
The data-parallel gradient reduction (ZeRO's, or DDP's at stage 0) takes the case's `reduce_bucket` and
`overlap_comm`; by default the plugin's buckets (a whole case model) and no overlap. With a ZeRO stage the updated
parameters are gathered asynchronously after the step where the case's `overlap_param_gather` asks
(`overlap_allgather`).

The loss is the case's: token cross-entropy summed and divided by the global count of targets it does not ignore.
Where the model's own loss computes exactly that (every sequence's last target ignored, since a causal LM shifts
its labels; no class weights; shardformer's forward in place: tp, sp or pp), the model is given `labels` and its
loss is used as returned, as Colossal-AI's examples do (`colossalai_hybrid_run.model_labels`): this is how
shardformer's `dist_cross_entropy` and the plugin's own normalisation are fuzzed. Otherwise our criterion takes the
logits: the summed loss scaled by dp / count on each data-parallel rank (the plugin averages gradients over dp)
and each micro-batch by the micro-batch count (the pipeline schedule divides by it).

The case's `vocab_loss` sets `parallel_output`: `gathered` (and by default) False, the LM head gathers the whole
vocabulary; `sharded` True (the plugin's own default), each tensor-parallel rank keeps its vocabulary shard, which
the model's loss takes into shardformer's vocabulary-parallel cross-entropy, and under all_to_all each
sequence-parallel rank keeps its part of the sequence. There our criterion and the reported logits gather the
shards themselves (`colossalai_hybrid_run.gather`).

Reported: losses, step-0 logits, step-0 gradients (after the plugin's own synchronisation: data-parallel
all-reduce or ZeRO partitions, sequence-parallel partial gradients) and final parameters, each rank's local
shard with its tp / pp / dp coordinates; `combine` concatenates tensor-parallel shards and keeps every
data-parallel copy as a replica.
"""

from .base import (dtype_name, loss_denominator, overlap_comm, overlap_param_gather, param_gather_feature, parallel,
                   reduce_dtype_name, reduction_feature, resume_feature, resumed_case, vocab_padding_feature,
                   vocab_sharded_loss)
from . import colossalai_release
from .colossalai_common import ColossalTarget, loss_scaling, unsupported_loss_scale
from .torch_common import torch_dtype
from .torch_model import unsupported_layout

PRECISION = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
SP_MODES = ("split_gather", "ring", "all_to_all")


class ColossalHybrid(ColossalTarget):
    name = "colossalai-hybrid"
    plugin_name = "HybridParallelPlugin"
    freezes = True
    rotates = True
    parallel_blocks = True  # (Command's decoder layers; every other family refuses them)
    qk_norms = True  # (Command's use_qk_norm; every other family refuses them)
    checkpoint_layouts = ("sharded", "gathered")  # (the booster's sharded checkpoints, or shard=False)
    # A run resumes into another plugin (`train.resume_parallel`): HybridParallelCheckpointIO writes whole tensors
    # (tensor-parallel shards gathered, the vocabulary unpadded, ZeRO's optimizer states gathered) under their names,
    # which another data-, tensor- or pipeline-parallel degree, ZeRO stage, sequence-parallel mode or vocabulary
    # padding loads.
    resumes_into = ("dp", "tp", "pp", "zero_stage", "zero_offload", "reduce_bucket", "overlap_comm", "overlap_param_gather",
                    "sequence_parallel", "sequence_parallel_mode", "vocab_divisible_by")

    def __init__(self):
        super().__init__()
        import colossalai.booster.plugin.hybrid_parallel_plugin  # noqa: F401
        import transformers.models.llama.modeling_llama  # noqa: F401

    def unsupported(self, case):
        why = unsupported_layout(case, ("dp", "tp", "pp"), "colossalai-hybrid runs dp x tp x pp (no cp/ep)", SP_MODES,
                                 offload=True, loss_scaling=True) or unsupported_loss_scale(case, dtype_name(case))
        if why:
            return why
        from .colossalai_family import expressible, unfreezable

        return expressible(case["model"]) or unfreezable(case["model"], case) or self.unsupported_plugin(case)

    def unsupported_plugin(self, case):
        """Why the plugin cannot train the case's model (one the family expresses) as the case asks, or None."""
        if case["model"].get("layer_passes", 1) > 1:
            return "a transformers model runs each decoder layer once (model.layer_passes > 1 is not expressed)"
        p, dt, t = parallel(case), dtype_name(case), case["train"]
        if dt not in PRECISION:
            return "HybridParallelPlugin keeps fp32 master weights (and Llama's RMSNorm computes in fp32): f64 is not expressed"
        if p["zero_stage"] > 2:
            return "HybridParallelPlugin runs ZeRO stages 0-2 (stage 3 is Gemini: CUDA only)"
        if p["pp"] > 1 and p["pipeline_schedule"] == "gpipe":
            return "Colossal-AI's pipeline schedules are 1F1B and interleaved, not GPipe"
        if case["model"]["batch"] % p["dp"]:
            # Colossal-AI feeds data-parallel ranks through a DistributedSampler: the same number of rows each.
            return "Colossal-AI gives every data-parallel rank the same number of rows (batch not divisible by dp)"
        if p["pp"] > 1 and t.get("grad_accumulation", 1) > 1:
            return "under pipeline parallelism the micro-batches are the accumulation (grad_accumulation is not expressed)"
        if case["model"].get("hf_model") == "qwen2" and p["tp"] > 1 and case["model"]["vocab"] % p["tp"]:
            # (Refused when the LM head is sharded, on the last pipeline stage's ranks only.)
            return "Qwen2's policy shards its LM head without padding (Linear1D_Col): the vocabulary must divide by tp"
        rd = reduce_dtype_name(case)
        if rd not in (dt, "f32"):
            return f"gradient reduction in {rd} for {dt} parameters is not expressed by HybridParallelPlugin"
        return colossalai_release.unsupported_options(self.plugin_name, self.plugin_options(case))

    def plugin(self, case):
        """The target's plugin (`plugin_name`, a class of colossalai.booster.plugin) for the case."""
        from colossalai.booster import plugin

        return getattr(plugin, self.plugin_name)(**colossalai_release.options(self.plugin_name, self.plugin_options(case)))

    def plugin_options(self, case):
        """HybridParallelPlugin's keyword arguments for the case (options of newer releases included)."""
        import torch

        p, t, dt = parallel(case), case["train"], dtype_name(case)
        sp, ulysses = p["sequence_parallel"] and p["tp"] > 1, all_to_all(p)
        clip = t.get("clip_grad_norm")
        kw = dict(
            tp_size=1 if ulysses else p["tp"], pp_size=p["pp"], sp_size=p["tp"] if ulysses else None,
            precision=PRECISION[dt], zero_stage=p["zero_stage"], cpu_offload=p["zero_offload"],
            enable_sequence_parallelism=sp, sequence_parallelism_mode=p["sequence_parallel_mode"] if sp else None,
            parallel_output=vocab_sharded_loss(case, False), **loss_scaling(case), max_norm=float(clip) if clip is not None else 0.0,
            overlap_communication=overlap_comm(case, False), overlap_p2p=False, enable_metadata_cache=False,
            overlap_allgather=overlap_param_gather(case, False),
            communication_dtype=torch.float32 if (reduce_dtype_name(case) == "f32" and dt != "f32") else None,
        )
        if p["vocab_divisible_by"] is not None:
            kw["make_vocab_size_divisible_by"] = p["vocab_divisible_by"]
        if p["reduce_bucket"] is not None:
            # ZeRO's bucket in units of 2^20 elements and DDP's (ZeRO stage 0) in MB; neither is rounded.
            kw.update(zero_bucket_size_in_m=p["reduce_bucket"] / 2**20,
                      ddp_bucket_cap_mb=p["reduce_bucket"] * torch_dtype(dt).itemsize / 2**20)
        if p["pp"] > 1:
            kw["num_microbatches"] = p["microbatches"]
            if p["pipeline_schedule"] == "interleaved":
                # overlap_p2p stays off: with it the interleaved schedule hangs on CPU (colossalai-on-cpu.md).
                # The metadata cache stays on, the plugin's default: without it Colossal-AI 0.5.0's
                # interleaved schedule always hangs (known_fixes: colossalai-interleaved-metadata), and
                # 1F1B covers the uncached path.
                kw.update(pp_style="interleaved", num_model_chunks=p["virtual_stages"], enable_metadata_cache=True)
        return kw

    def run_rank(self, rank, world, case, inputs):
        from colossalai.shardformer.layer.utils import Randomizer

        from .colossalai_hybrid_run import run

        from .. import known_fixes

        # Each case starts from a fresh dropout-randomizer index, as in a fresh process: a case refused at different
        # points on different ranks (pipeline stages) leaves the global index out of step across the pool's ranks,
        # and the next case's policy would fail Colossal-AI's check that it is the same everywhere (campaign 128).
        Randomizer.reset_index()

        def laid_out(layout):
            # (The plugin of the case as laid out, and what the known fixes that count the batch's tokens need.)
            plugin = self.plugin(layout)
            micro = parallel(layout)["microbatches"] if plugin.stage_manager is not None else 1
            known_fixes.batch_tokens(loss_denominator(inputs), micro * plugin.dp_group.size())
            return plugin, layout

        resumed = resumed_case(case)
        out = run(laid_out(case)[0], case, inputs, torch_dtype(dtype_name(case)),
                  relayout=None if resumed is case else lambda: laid_out(resumed))
        if rank == 0:
            from .colossalai_hybrid_run import single_device

            out["baseline"] = single_device(case, inputs)
        return out

    def combine(self, case, outs):
        from .colossalai_hybrid_run import combine

        p = parallel(case)
        sp = p["sequence_parallel_mode"] if p["sequence_parallel"] and p["tp"] > 1 else "none"
        feature = f"colossalai-hybrid:dp{p['dp']}:tp{p['tp']}:pp{p['pp']}:zero{p['zero_stage']}:sp-{sp}"
        if p["pp"] > 1:
            feature += f":{p['pipeline_schedule']}{p['virtual_stages'] if p['pipeline_schedule'] == 'interleaved' else ''}"
        # The model's own loss (labels), shardformer's dist_cross_entropy, or our criterion on its logits.
        loss = "colossalai-hybrid:loss:" + ("model-labels" if any(o.get("model_loss") for o in outs) else "criterion")
        logits = loss + (":vocab-sharded" if vocab_sharded_loss(case, False) else ":gathered")
        features = [feature, loss, logits, reduction_feature(feature, case)]
        if p["zero_stage"] > 0:
            features += param_gather_feature(feature, case)
        if p["vocab_divisible_by"] is not None:
            tp = 1 if all_to_all(p) else p["tp"]
            features.append(vocab_padding_feature("colossalai-hybrid", case["model"]["vocab"], p["vocab_divisible_by"], tp))
        features += resume_feature(feature, case)
        return combine(case, outs, features)


def all_to_all(p):
    """Whether the case's tensor-parallel ranks run all_to_all (Ulysses) sequence parallelism instead: the plugin's
    tp_size is then 1 and its sp_size the case's tp."""
    return p["sequence_parallel"] and p["tp"] > 1 and p["sequence_parallel_mode"] == "all_to_all"


TARGET = ColossalHybrid()
