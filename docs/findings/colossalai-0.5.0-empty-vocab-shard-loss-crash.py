# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin(tp_size=2) with its default
# parallel_output=True crashes a Llama's own loss when one tensor-parallel rank's vocabulary shard is all padding.
# VocabParallelLMHead1D pads the vocabulary to a multiple of make_vocab_size_divisible_by (64) x tp and, without
# gather_output, returns each rank's valid columns only (layer/linear.py:750-758, 797-800). With a vocabulary of 16
# under tp=2 the head has 128 columns, 64 per rank, and rank 1's are all padding: its logits have width 0, and
# dist_cross_entropy (layer/loss.py:223) fails there with "cannot reshape tensor of 0 elements into shape [-1, 0]"
# (rank 0 then fails in the loss's all-reduce). Any vocabulary below 64 x tp x (tp - 1) can leave a rank empty, e.g.
# a byte-level vocabulary of 259 under tp=4. Fix (`--fixed`): such a rank takes one column of -inf (no target falls
# in its range; exp(-inf) adds nothing to the softmax's sum; its gradient is 0); the step then matches one device.
# Found by shardfuzz (target colossalai-hybrid, its first case with the case field vocab_loss = "sharded").
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IDS = torch.tensor([[3, 7, 1, 4, 9, 2], [2, 9, 5, 8, 6, 11]])
LABELS = IDS.clone()  # a causal LM's labels are its inputs (the model shifts them)


def fix():
    from colossalai.shardformer.modeling import llama

    original = llama.dist_cross_entropy

    def dist_cross_entropy(labels, logits, shard_config, vocab_size, dtype, seq_dim=1):
        if shard_config.enable_tensor_parallelism and shard_config.parallel_output and logits.size(-1) == 0:
            logits = torch.cat([logits, torch.full((*logits.shape[:-1], 1), float("-inf"), dtype=logits.dtype)], -1)
        return original(labels, logits, shard_config, vocab_size, dtype, seq_dim)

    llama.dist_cross_entropy = dist_cross_entropy


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=8, attn_implementation="eager")
    return LlamaForCausalLM(config)


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    reference = model()
    expected = reference(input_ids=IDS, labels=LABELS).loss  # one device, plain transformers
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32")  # parallel_output=True, the default
    booster = Booster(plugin=plugin)
    sharded = model()
    boosted, optimizer, *_ = booster.boost(sharded, torch.optim.SGD(sharded.parameters(), lr=0.1))
    try:
        loss = boosted(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=LABELS).loss
        ok = torch.allclose(loss, expected, rtol=1e-5, atol=1e-6)
        print(f"rank {rank}: loss {loss.item():.6f}, one device {expected.item():.6f}: {'OK' if ok else 'MISMATCH'}")
    except Exception as e:  # the crash (the other rank then times out waiting for it)
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:160]}")
    os._exit(0)  # (a rank left waiting in a collective would hold the process group's shutdown)


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
