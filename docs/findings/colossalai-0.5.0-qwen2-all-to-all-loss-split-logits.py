# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin with sequence_parallelism_mode
# "all_to_all" (DeepSpeed-Ulysses) and no tensor parallelism cannot compute a Qwen2's own loss. Qwen2ForCausalLMPolicy
# replaces Qwen2ForCausalLM.forward with the one computing dist_cross_entropy only under tensor parallelism or the
# zero-bubble schedule (policies/qwen2.py:421-450), where LlamaForCausalLMPolicy does so under sequence parallelism
# too (policies/llama.py:434). Qwen2Policy still replaces Qwen2Model.forward (policies/qwen2.py:297-316), which splits
# the sequence and, with parallel_output=True (the plugin's default), leaves the last hidden states split
# (modeling/qwen2.py); transformers' own forward then pairs a rank's half of the logits with the whole sequence's
# labels: ValueError "Expected input batch_size (..) to match target batch_size (..)". Training a Qwen2 with Ulysses
# and labels fails on every step.
# Fix (`--fixed`, shardfuzz's known fix colossalai-qwen2-sequence-parallel-loss): the forward
# get_lm_forward_with_dist_cross_entropy(shard_config) under sequence parallelism as well.
# Found by shardfuzz (target colossalai-hybrid, Qwen2 with all_to_all over 2 ranks, the model's own labels path).
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo; the plugin wants the sequence length divisible
# by sp_size). Measured: both ranks raise ValueError "Expected input batch_size (6) to match target batch_size
# (12)." (logits of 3 of the 6 positions for 2 sequences): CRASH. --fixed: the loss 2.790327 on both ranks, one
# device's 2.790327, and the embedding's gradient one device's: OK.
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.tensor([[3, 7, 1, 4, 9, 2], [2, 9, 5, 8, 6, 11]])


def fix():
    """The forward with dist_cross_entropy under sequence parallelism too, as LlamaForCausalLMPolicy has it."""
    from colossalai.shardformer.modeling.qwen2 import get_lm_forward_with_dist_cross_entropy
    from colossalai.shardformer.policies.base_policy import ModulePolicyDescription
    # (The policy's own key: the class's name, its import of transformers' Qwen2 classes fails on 4.51.)
    from colossalai.shardformer.policies.qwen2 import Qwen2ForCausalLM, Qwen2ForCausalLMPolicy

    original = Qwen2ForCausalLMPolicy.module_policy

    def module_policy(self):
        policy = original(self)
        config = self.shard_config
        if config.enable_sequence_parallelism and self.pipeline_stage_manager is None:
            description = policy.setdefault(Qwen2ForCausalLM, ModulePolicyDescription(sub_module_replacement=[]))
            replaced = dict(description.method_replacement or {})
            replaced.setdefault("forward", get_lm_forward_with_dist_cross_entropy(config))
            description.method_replacement = replaced
        return policy

    Qwen2ForCausalLMPolicy.module_policy = module_policy


def all_to_all_list(output_list, input_list, group=None, async_op=False):
    """List-form all_to_all over all_to_all_single (gloo implements only the single-tensor form)."""
    flat_in = torch.cat([t.reshape(-1) for t in input_list])
    flat_out = torch.empty(sum(t.numel() for t in output_list), dtype=flat_in.dtype)
    dist.all_to_all_single(flat_out, flat_in, output_split_sizes=[t.numel() for t in output_list],
                           input_split_sizes=[t.numel() for t in input_list], group=group)
    start = 0
    for t in output_list:
        t.copy_(flat_out[start:start + t.numel()].view_as(t))
        start += t.numel()
    assert not async_op


def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                        sliding_window=None, _attn_implementation="eager"))


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29573", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    dist.all_to_all = all_to_all_list  # (the attention uses the list form)
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    # One device: the same model and batch, transformers' own loss with the same labels.
    reference = model()
    expected = reference(input_ids=IDS, labels=IDS).loss
    expected.backward()

    plugin = HybridParallelPlugin(tp_size=1, pp_size=1, sp_size=2, precision="fp32", enable_sequence_parallelism=True,
                                  sequence_parallelism_mode="all_to_all")  # parallel_output=True, the default
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model(), torch.optim.SGD(reference.parameters(), lr=0.1))
    try:
        loss = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS).loss
    except Exception as e:  # the crash
        print(f"rank {rank}: loss raised {type(e).__name__}: {e} -> CRASH", flush=True)
        dist.destroy_process_group()
        return
    booster.backward(loss, optimizer)  # the plugin averages the sequence-parallel ranks' gradients
    got, want = boosted.unwrap().model.embed_tokens.weight.grad, reference.model.embed_tokens.weight.grad
    ok = torch.allclose(loss, expected, rtol=1e-5, atol=1e-6) and torch.allclose(got, want, rtol=1e-4, atol=1e-6)
    print(f"rank {rank}: loss {float(loss):.6f}, one device {float(expected):.6f}; embedding grad max |difference|"
          f" {float((got - want).abs().max()):.3e} (|one device| max {float(want.abs().max()):.3e})"
          f" -> {'OK' if ok else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
