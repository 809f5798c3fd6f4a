"""colossalai-tp: the case's model built from Colossal-AI shardformer layers over tp = world ranks.

  embed        VocabParallelEmbedding1D (vocabulary padded to a multiple of the case's `vocab_divisible_by` x tp,
               by default of tp; rows per rank)
  q, k, v      Linear1D_Col (gather_output=False): whole heads per rank
  o            Linear1D_Row(parallel_input=True)
  up, gate     Linear1D_Col;  down  Linear1D_Row
  lm_head      VocabParallelLMHead1D + cross_entropy_1d (the vocabulary-parallel loss, mode "sum"), or, where
               the case's `vocab_loss` is `gathered`, VocabParallelLMHead1D(gather_output=True) + the plain loss
  norms        the plain torch norms, replicated; under sequence parallelism marked sp-partial-derived and
               all-reduced by SeqParallelUtils, as HybridParallelPlugin does

Sequence parallelism in the modes that share the tensor-parallel group (`split_gather`, `ring`); `all_to_all`
(Ulysses) needs a sequence-parallel group of its own and is refused here. The optimizer is the case's torch
optimizer on the local shards; clipping takes the global norm over the shards (colossalai_model.clip_global).
Sharded tensors are reported in full; replicated ones (norms, row-parallel biases) per rank as replicas.
"""

from .base import dtype_name, parallel, vocab_padding_feature, vocab_sharded_loss
from . import colossalai_release
from .colossalai_common import ColossalTarget
from .torch_model import model_defaults, unsupported_layout
from .torch_training import combine_dp, single_device

SP_MODES = ("split_gather", "ring")


class ColossalTp(ColossalTarget):
    name = "colossalai-tp"
    freezes = True

    def unsupported(self, case):
        why = unsupported_layout(case, ("tp",), "colossalai-tp runs tensor (and sequence) parallelism only", SP_MODES)
        if why:
            return why
        p, m = parallel(case), model_defaults(case)
        if p["zero_stage"] > 0:
            return "colossalai-tp has no ZeRO stage (colossalai-zero runs ZeRO)"
        if case.get("data", {}).get("class_weights"):
            return "Colossal-AI's cross_entropy_1d takes no class weights"
        if dtype_name(case) == "f64" and vocab_sharded_loss(case, True):
            # cross_entropy_1d sums exp(logits) with dtype=torch.float32 (layer/loss.py:91): the loss is fp32.
            return "Colossal-AI's cross_entropy_1d sums in fp32: f64 training is not expressed"
        if m.get("tied_embeddings"):
            return "tied embeddings are not expressed by colossalai-tp"
        tp = p["tp"]
        if m["heads"] % tp or m["kv_heads"] % tp:
            # What shardformer's policies assert before sharding attention (policies/llama.py:97-103).
            return "shardformer needs attention heads and kv heads divisible by tp"
        if vocab_sharded_loss(case, True):
            from .colossalai_model import loss_mode

            return colossalai_release.unsupported_options("cross_entropy_1d", {"mode": loss_mode(case)})
        return None

    def run_rank(self, rank, world, case, inputs):
        from .colossalai_model import run

        out = run(case, inputs, rank, world)
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        from .colossalai_model import assemble_outputs

        p = parallel(case)
        sp = p["sequence_parallel_mode"] if p["sequence_parallel"] else "none"
        loss = "colossalai-tp:loss:" + ("vocab-sharded" if vocab_sharded_loss(case, True) else "gathered")
        features = [f"colossalai:tp{p['tp']}:sp-{sp}", loss]
        if p["vocab_divisible_by"] is not None:
            features.append(vocab_padding_feature("colossalai-tp", case["model"]["vocab"], p["vocab_divisible_by"], p["tp"]))
        return combine_dp(case, assemble_outputs(case, outs), features)


TARGET = ColossalTp()
