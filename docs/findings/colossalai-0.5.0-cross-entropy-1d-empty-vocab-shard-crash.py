# Colossal-AI 0.5.0 (torch 2.5.1): the vocabulary-parallel loss `cross_entropy_1d` crashes on a tensor-parallel rank
# whose shard of a padded vocabulary is all padding. VocabParallelLMHead1D pads the vocabulary to a multiple of
# make_vocab_size_divisible_by x tp and, without gather_output, returns each rank's valid columns only
# (layer/linear.py:750-758, 797-800): with a vocabulary of 13 under tp=2 and make_vocab_size_divisible_by=13 the head
# has 26 rows, rank 1's 13 all padding, so rank 1's logits have width 0. cross_entropy_1d (DistCrossEntropy.forward,
# layer/loss.py:55) first takes the maximum over the rank's columns and fails there: "IndexError: max(): Expected
# reduction dim 1 to have non-zero size" (rank 0 then waits in the loss's all-reduce). With the layers' default divisor
# (64) any vocabulary below 64 x tp x (tp - 1) leaves a rank empty. The same root as
# colossalai-0.5.0-empty-vocab-shard-loss-crash.py (there the model's dist_cross_entropy fails first, at a reshape).
# Fix (`--fixed`): such a rank's logits take one column of -inf (no target falls in its range, exp(-inf) adds nothing
# to the softmax's sum, its gradient is 0); the loss then matches one device.
# Found by shardfuzz (target colossalai-tp, case field vocab_divisible_by = 13, 2026-11-28); seen before on
# colossalai-tp cases whose vocabulary was smaller than tp.
# Run: timeout 120 python this.py [--fixed]  (2 CPU ranks, gloo).
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

VOCAB, HIDDEN, DIVISOR = 13, 8, 13
TARGETS = torch.tensor([3, 7, 1, 12, 9, 2])


def fix():
    from colossalai.shardformer.layer import loss

    original = loss.cross_entropy_1d

    def cross_entropy_1d(vocab_logits, labels, *args, **kwargs):
        if vocab_logits.size(-1) == 0:
            pad = torch.full((*vocab_logits.shape[:-1], 1), float("-inf"), dtype=vocab_logits.dtype)
            vocab_logits = torch.cat([vocab_logits, pad], -1)
        return original(vocab_logits, labels, *args, **kwargs)

    return cross_entropy_1d


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29573", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    from colossalai.shardformer.layer import VocabParallelLMHead1D, cross_entropy_1d

    if fixed:
        cross_entropy_1d = fix()
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    x = torch.randn(len(TARGETS), HIDDEN)
    expected = F.cross_entropy(head(x), TARGETS, reduction="sum")  # one device
    sharded = VocabParallelLMHead1D.from_native_module(head, process_group=dist.group.WORLD, gather_output=False,
                                                       make_vocab_size_divisible_by=DIVISOR)
    try:
        logits = sharded(x)  # [6, this rank's valid columns]: 13 on rank 0, 0 on rank 1
        loss = cross_entropy_1d(logits, TARGETS, process_group=dist.group.WORLD, vocab_size=2 * 13, mode="sum")
        ok = torch.allclose(loss, expected, rtol=1e-5, atol=1e-6)
        print(f"rank {rank}: logits width {logits.shape[-1]}, loss {loss.item():.6f}, one device {expected.item():.6f}: "
              f"{'OK' if ok else 'MISMATCH'}", flush=True)
    except Exception as e:  # the crash (the other rank then times out waiting for it)
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:160]}")
    os._exit(0)  # (a rank left waiting in a collective would hold the process group's shutdown)


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
