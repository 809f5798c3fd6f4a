#!/usr/bin/env python3
"""Colossal-AI 0.5.0: under sequence parallelism (split_gather, ring) a Cohere Command model's LayerNorm weights get the
gradient of the rank's own part of the sequence only.

With sequence parallelism each tensor-parallel rank runs the norms on its part of the sequence, so a norm weight's
gradient is a partial sum that must be all-reduced over the group. Colossal-AI does that for the parameters its norm
wrappers mark `sp_partial_derived` (layer/normalization.py:183-187; the plugin sums them,
booster/plugin/hybrid_parallel_plugin.py:775): the Llama policy replaces every norm with such a wrapper
(policies/llama.py:56, 272-293). CommandPolicy replaces none ("CohereLayerNorm has no bias in v4.51.3 transformers, so
we don't replace it.", policies/command.py:57), so the weights of every decoder layer's input_layernorm and of the final
norm are never reduced: each rank steps them by its own part's gradient, the ranks' copies drift apart, and the model
trains differently from the one on one device. (all_to_all sequence parallelism reduces them as data-parallel
gradients and is right.) The taxonomy's "LayerNorm gradients never all-reduced under sequence parallelism".

Here: a 2-layer Command (hidden 16, 4 heads, vocabulary 128), HybridParallelPlugin(tp 2, sequence parallelism
split_gather, fp32, flash attention on: the only way a Command runs at all without a pipeline, see
colossalai-0.5.0-command-without-flash-attention-crash.py), one forward and backward of the model's own loss, against the
same model and batch on one device; prints each norm weight's gradient error (relative) on each rank. Run:

    python -m torch.distributed.run --nproc_per_node 2 colossalai-0.5.0-command-sequence-parallel-norm-grads-not-reduced.py [--fixed]

(with Colossal-AI 0.5.0, torch 2.5.1 and transformers 4.51.3: shardfuzz's .venv-colossalai). On the CPU it installs the
gloo/CPU start-up shims shardfuzz's Colossal-AI targets use (found beside this file in the shardfuzz checkout; none
changes what Colossal-AI computes) and lets ColoAttention use Colossal-AI's own SDPA kernel (torch's
scaled_dot_product_attention, reported unavailable without CUDA). Found by reading CommandPolicy while adding Command to
shardfuzz's vocabulary; no Colossal-AI issue found.

Prints (2026-12-08):

    Command, tp 2, sequence parallelism split_gather, fp32: norm weight gradients against one device's
      rank 0: model.layers.0.input_layernorm.weight: 2.313e-01 (relative)
      rank 0: model.layers.1.input_layernorm.weight: 3.484e-01 (relative)
      rank 0: model.norm.weight: 7.430e-01 (relative)
      rank 1: model.layers.0.input_layernorm.weight: 1.094e+00 (relative)
      rank 1: model.layers.1.input_layernorm.weight: 1.134e+00 (relative)
      rank 1: model.norm.weight: 8.885e-01 (relative)
    MISMATCH

(exit status 1; the loss itself matches: the forward is right).

With `--fixed` (the norms' weights marked sp_partial_derived under split_gather and ring, as the Llama policy's wrappers
mark theirs) every gradient matches: OK (exit status 0):

    Command, tp 2, sequence parallelism split_gather, fp32: norm weight gradients against one device's
      rank 0: model.layers.0.input_layernorm.weight: 2.991e-07 (relative)
      rank 0: model.layers.1.input_layernorm.weight: 1.719e-07 (relative)
      rank 0: model.norm.weight: 2.205e-07 (relative)
      rank 1: model.layers.0.input_layernorm.weight: 2.991e-07 (relative)
      rank 1: model.layers.1.input_layernorm.weight: 1.719e-07 (relative)
      rank 1: model.norm.weight: 2.205e-07 (relative)
    OK
"""
import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harnesses", "python"))

IDS = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
RTOL = 1e-5


def fix():
    """CommandPolicy marks its norms' weights as Llama's norm wrappers mark theirs."""
    from colossalai.shardformer.layer.utils import SeqParallelUtils
    from colossalai.shardformer.policies.command import CommandPolicy

    original = CommandPolicy.postprocess

    def postprocess(self):
        if self.shard_config.sequence_parallelism_mode in ("split_gather", "ring"):
            for module in self.model.modules():
                if type(module).__name__ == "CohereLayerNorm":
                    SeqParallelUtils.marked_as_sp_partial_derived_param(module.weight)
        return original(self)

    CommandPolicy.postprocess = postprocess


def command():
    from transformers import CohereConfig, CohereForCausalLM

    config = CohereConfig(vocab_size=128, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, logit_scale=1.0, tie_word_embeddings=False,
                          pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    torch.manual_seed(0)
    return CohereForCausalLM(config).float()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    from shardfuzz_worker.targets.colossalai_common import install_shims
    from colossalai.kernel.kernel_loader import FlashAttentionSdpaCudaExtension

    install_shims()
    FlashAttentionSdpaCudaExtension.is_available = lambda self: True  # torch's SDPA runs on the CPU
    if "--fixed" in sys.argv:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    rank = dist.get_rank()
    reference = command()
    model = copy.deepcopy(reference)
    reference(input_ids=IDS, labels=IDS).loss.backward()
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", enable_sequence_parallelism=True,
                                  sequence_parallelism_mode="split_gather", enable_flash_attention=True)
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS).loss
    booster.backward(loss, optimizer)
    want = dict(reference.named_parameters())
    errors = [(name, float((p.grad - want[name].grad).norm() / want[name].grad.norm()))
              for name, p in boosted.unwrap().named_parameters() if "norm" in name]
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (rank, errors))
    wrong = any(e > RTOL for _, errs in rows for _, e in errs)
    if rank == 0:
        print("Command, tp 2, sequence parallelism split_gather, fp32: norm weight gradients against one device's")
        for r, errs in rows:
            for name, e in errs:
                print(f"  rank {r}: {name}: {e:.3e} (relative)")
        print("MISMATCH" if wrong else "OK")
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
