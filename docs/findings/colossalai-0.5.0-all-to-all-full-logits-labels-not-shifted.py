# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin with sequence_parallelism_mode
# "all_to_all" (DeepSpeed-Ulysses) and parallel_output=False computes the causal-LM loss with unshifted labels
# on every sequence-parallel rank but the last. With parallel_output=False the Llama forward gathers the last
# hidden states to the whole sequence (modeling/llama.py:231), so dist_cross_entropy does not split the labels
# (split_labels_here is False, loss.py:183); it then shifts labels and logits "in the last rank without
# splitting" only (loss.py:190-194, `if split_labels_here or (sp_rank == sp_size - 1)`), and on the other ranks
# each position's logits meet their own input token as the label instead of the next one (the shapes agree,
# so nothing is raised). Those ranks' gradients (their sequence chunk's, through the gather's backward) are
# of the wrong loss, and the plugin averages them in. Any labels show it, padded or not.
# Fix (`--fixed`): with whole-sequence logits every rank shifts both, as without sequence parallelism.
# Found by shardfuzz (target colossalai-hybrid, the model's own labels path, all_to_all over 2 ranks).
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.tensor([[3, 7, 1, 4, 9, 2], [2, 9, 5, 8, 6, 11]])


def fix():
    from colossalai.shardformer.modeling import llama

    original = llama.dist_cross_entropy

    def dist_cross_entropy(labels, logits, shard_config, vocab_size, dtype, seq_dim=1):
        if shard_config.sequence_parallelism_mode == "all_to_all" and logits.size(seq_dim) == labels.shape[-1]:
            shifted, kept = labels[..., 1:].contiguous(), logits[..., :-1, :].contiguous()
            loss = torch.nn.functional.cross_entropy(kept.view(-1, kept.size(-1)), shifted.view(-1), reduction="sum")
            return (loss / (shifted != -100).sum()).squeeze()
        return original(labels, logits, shard_config, vocab_size, dtype, seq_dim)

    llama.dist_cross_entropy = dist_cross_entropy


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
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, attn_implementation="eager")
    return LlamaForCausalLM(config)


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29568", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    dist.all_to_all = all_to_all_list  # (the attention's backward uses the list form)
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    # One device: the same model and batch, transformers' own loss with the same labels.
    reference = model()
    expected = reference(input_ids=IDS, labels=IDS).loss
    expected.backward()

    plugin = HybridParallelPlugin(tp_size=1, pp_size=1, sp_size=2, precision="fp32", enable_sequence_parallelism=True,
                                  sequence_parallelism_mode="all_to_all", parallel_output=False)
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model(), torch.optim.SGD(reference.parameters(), lr=0.1))
    loss = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS).loss
    booster.backward(loss, optimizer)  # the plugin averages the sequence-parallel ranks' gradients
    got, want = boosted.unwrap().model.embed_tokens.weight.grad[:16], reference.model.embed_tokens.weight.grad
    loss_ok = torch.allclose(loss, expected, rtol=1e-5, atol=1e-6)
    grad_ok = torch.allclose(got, want, rtol=1e-4, atol=1e-6)
    print(f"rank {rank}: loss {float(loss):.6f}, one device {float(expected):.6f}; embedding grad max"
          f" |difference| {float((got - want).abs().max()):.3e} (|one device| max {float(want.abs().max()):.3e})"
          f" -> {'OK' if loss_ok and grad_ok else 'MISMATCH'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
