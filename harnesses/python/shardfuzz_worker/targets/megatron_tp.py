"""megatron-tp: the case's model built from megatron-core's tensor-parallel layers over the case's tp ranks, its
blocks split over pp pipeline stages (megatron's 1F1B or interleaved schedule), times its dp data-parallel replicas
(megatron's rank order: tp innermost, pp outermost).

  embed        VocabParallelEmbedding (rows of the vocabulary per rank; reduce-scatter to the sequence-parallel
               region under sequence parallelism)
  q, k, v      ColumnParallelLinear (gather_output=False): whole heads per rank (heads / tp, kv_heads / tp)
  o            RowParallelLinear(input_is_parallel=True)
  up, gate     ColumnParallelLinear;  down  RowParallelLinear(input_is_parallel=True)
  lm_head      ColumnParallelLinear(gather_output=False) + tensor_parallel.vocab_parallel_cross_entropy, or, where
               the case's `vocab_loss` is `gathered`, ColumnParallelLinear(gather_output=True) + the plain loss;
               tied embeddings as megatron's GPTModel ties them on one stage: the LM head allocates no weight
               (skip_weight_param_allocation) and takes the embedding's vocabulary shard at every forward
  norms        plain LayerNorm / RMSNorm (eps 1e-5) as torch_model.Norm, replicated; under sequence parallelism
               they run on the rank's sequence chunk, are marked `sequence_parallel` and their gradients are
               summed over the tensor-parallel group by megatron's own finalize_model_grads helper.

Activations are megatron's [s, b, h]. The model trains as megatron's training loop runs it: each data-parallel
replica on its rows of the batch, in megatron's DistributedDataParallel (ZeRO 1: its distributed optimizer; the
case's bucket size, overlap, fp32 reduction, partial distributed optimizer and overlapped parameter gather as
megatron-ddp maps them), with megatron's optimizer for the case's
(megatron_common; fp32 main parameters under bf16 / f16; under f16 its loss scaler, dynamic from the case's
`loss_scale`, applied by its schedule to the last stage's loss), its gradient norm over the model- and data-parallel groups
(tensor-parallel parameters from every rank, replicated ones once) and its clipping, under its parameter scheduler,
finalize_model_grads after the micro-batches; megatron's CUDA-only calls pointed at the CPU
(megatron_common.cuda_on_cpu). `resume_after` saves megatron's checkpoint (megatron_checkpoint: by default its distributed
checkpoint, `torch_dist`; with `train.checkpoint_layout` gathered its legacy one, a directory per model-parallel rank)
and loads it into fresh chunks, DDPs, optimizer and scheduler.

Sharded tensors are reported in full (each replica's tensor-parallel slices assembled in `combine`); replicated
tensors (norms, row-parallel biases), and the assembled ones per replica, per rank as replicas.
"""

from .base import (dtype_name, parallel, reduction_feature, resume_feature, resumed_layout_changes,
                   vocab_sharded_loss)
from .megatron_common import (MegatronTarget, RESUMES_INTO_DEGREES, data_parallel_features, model_parallel, optimizer_instances,
                              patch_cuda, pipeline_degrees, resumed_training,
                              per_token_loss, unsupported_training)
from .megatron_checkpoint import unsupported_resumed_layout
from .megatron_moe import expert_layout, moe_features, moe_of, patch_moe_host_copies, unsupported_moe
from .torch_model import unsupported_layout
from .torch_training import combine_dp, single_device

def _patch_cuda():
    """megatron-core asks torch.cuda for the device in its collectives and buffers: point it at the CPU. Its
    activation checkpoint saves and restores the CUDA generator's state around the recomputation: on the CPU there is
    none (the CPU generator's state it keeps; the case's model draws no random numbers)."""
    from megatron.core.tensor_parallel import random

    patch_cuda()
    patch_moe_host_copies()
    random._get_cuda_rng_state = lambda *args, **kwargs: None
    random._set_cuda_rng_state = lambda *args, **kwargs: None


class MegatronTp(MegatronTarget):
    name = "megatron-tp"
    freezes = True
    resumes_into = RESUMES_INTO_DEGREES
    smooths_labels = True

    def unsupported(self, case):
        why = unsupported_layout(case, ("tp", "dp", "pp", "ep"),
                                 "megatron-tp runs tensor (and sequence), pipeline, data and expert parallelism only",
                                 loss_scaling=True, fp32_optimizer_state=True, moe=True) or unsupported_moe(case)
        if why:
            return why
        p = parallel(case)
        if p["pp"] > 1:
            why = unsupported_pipeline(case)
            if why:
                return why
        if case["model"].get("sparse_embedding"):
            return "megatron's gradient buffers are dense: no sparse embedding gradient"
        if case.get("data", {}).get("class_weights"):
            return "megatron's vocab_parallel_cross_entropy takes no class weights"
        if dtype_name(case) == "f64":
            # vocab_parallel_cross_entropy casts the logits with .float(): the loss and its gradient are fp32
            # (measured: f64 cases diverge by ~3e-8 in loss and every gradient; with the cast patched out the
            # same cases pass at 0.04x the f64 noise, so the rest of the f64 path is exact).
            return "megatron's vocab_parallel_cross_entropy computes in fp32: f64 training is not expressed"
        return unsupported_training(case) or unsupported_resumed_layout(case) or unsupported_degree_change(case)

    def init_rank(self, rank, world, timeout_s):
        super().init_rank(rank, world, timeout_s)
        _patch_cuda()

    def run_rank(self, rank, world, case, inputs):
        from .megatron_model import run

        model_parallel(parallel(case)["tp"], *pipeline_degrees(case), optimizer_instances(case), *expert_layout(case))
        out = run(case, inputs, resumed_training(case, *expert_layout(case)))
        # The plain torch model on one device in the case dtype: the oracle's noise baseline (it has no MoE block:
        # there the oracle's own ensemble alone).
        out["baseline"] = single_device(case, inputs) if rank == 0 and not moe_of(case) else None
        return out

    def combine(self, case, outs):
        from .megatron_model import assemble_outputs

        p = parallel(case)
        full = assemble_outputs(case, outs)
        loss = "megatron:loss:" + ("vocab-parallel" if vocab_sharded_loss(case, True) else "gathered")
        features = [f"megatron:tp{p['tp']}:sp{int(p['sequence_parallel'])}", loss]
        if p["pp"] > 1:
            features.append(f"megatron:tp{p['tp']}:pp{p['pp']}:dp{p['dp']}:{p['pipeline_schedule']}")
        if p["dp"] > 1 or p["zero_stage"]:
            data = f"megatron:tp{p['tp']}:dp{p['dp']}:{'distributed-optimizer' if p['zero_stage'] else 'ddp'}"
            features += [data, reduction_feature(data, case), *data_parallel_features(data, case)]
        if per_token_loss(case):
            features.append(f"megatron:tp{p['tp']}:dp{p['dp']}:per-token-loss")
        features += moe_features(case) + resume_feature(f"megatron:tp{p['tp']}", case)
        return combine_dp(case, full, features)


def unsupported_degree_change(case):
    """Why the case cannot resume into its other data-, tensor- or pipeline-parallel degrees (None: it can, or keeps
    them): the experts' layout (expert-tensor and expert-data parallelism, which follow the tensor-parallel degree) is
    not resharded here."""
    changes = set(resumed_layout_changes(case)) & {"dp", "tp", "pp"}
    if changes and moe_of(case):
        return "megatron-tp resumes MoE blocks under their own data-, tensor- and pipeline-parallel degrees only"
    return None


def unsupported_pipeline(case):
    """Why megatron-tp's pipeline stages cannot run the case (None: they can)."""
    from .base import chunk_range
    from .megatron_model import micro_batch_count

    p, m = parallel(case), case["model"]
    if p["pipeline_schedule"] == "gpipe":
        return "megatron's pipeline schedules are 1F1B and interleaved 1F1B (no GPipe)"
    if m.get("layer_passes", 1) > 1:
        return "shared blocks (layer_passes) run on one stage only"
    chunks = p["pp"] * (p["virtual_stages"] if p["pipeline_schedule"] == "interleaved" else 1)
    if not m["layers"] and chunks > 2:
        # (campaign 177: the harness asked an empty chunk for its dtype)
        return "a model without blocks leaves the middle pipeline chunks nothing to hold (no block, embedding or head)"
    count = micro_batch_count(case)
    rows = [b - a for a, b in (chunk_range(m["batch"], p["dp"], i) for i in range(p["dp"]))]
    if min(rows) < count:
        return "a data-parallel replica would run an empty pipeline micro-batch (fewer rows than micro-batches)"
    if p["pipeline_schedule"] == "interleaved" and any(r % count for r in rows):
        # (Measured: with shapes sent between stages megatron's interleaved schedule hangs at two stages, each
        # exchanging shapes where the other exchanges a tensor.)
        return "megatron-tp runs megatron's interleaved schedule with equal micro-batches only (fixed message shapes)"
    return None


TARGET = MegatronTp()
