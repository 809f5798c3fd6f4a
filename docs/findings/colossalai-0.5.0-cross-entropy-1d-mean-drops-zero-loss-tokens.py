"""Colossal-AI 0.5.0: cross_entropy_1d's mean leaves out every token whose loss is exactly zero.

`colossalai.shardformer.layer.cross_entropy_1d` (DistCrossEntropy, the vocabulary-parallel cross-entropy;
its default mode is "mean", and shardformer's Falcon calls it so) computes

    loss = torch.where(target == ignore_index, 0.0, log(sum_exp_logits) - pred_logits)
    num_non_zero = torch.sum(loss != 0.0)
    loss = torch.sum(loss).div_(num_non_zero)          # and the backward scales by 1 / num_non_zero

so the denominator is the number of tokens whose loss is not exactly zero, not the number of tokens it
does not ignore. A token the model predicts with certainty in fp32 (every other exp(logit - max) below half
an ulp of 1, a logit margin above about 17) has a loss of exactly 0.0: it drops out of the denominator, and
the loss and every gradient come out counted / nonzero times too large. (dist_cross_entropy, the shardformer
Llama's loss, calls mode="sum" and counts `labels != ignore_index` itself: it is right.)

Found by reading the function while giving the colossalai-tp target ignored targets, then shown by the target
once it takes the function's own mean (a tp2 f32 case with saturated logits: loss and gradients 16/13 too
large), and a 10-minute colossalai-tp campaign found it on its own (seed 94: 7 of its 14 divergences pass
only with this fix, all on `large` data). The same sum divided by the counted targets (`--fixed`) agrees
with torch.

Run: python colossalai-0.5.0-cross-entropy-1d-mean-drops-zero-loss-tokens.py [--fixed]
(one process, CPU, gloo; or under `torchrun --nproc_per_node 2`, the vocabulary split over two ranks).
Prints MISMATCH or OK.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29547")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

from colossalai.shardformer.layer import cross_entropy_1d  # noqa: E402

# Three tokens over a vocabulary of 4; token 0 is predicted with certainty (margin 28), token 2 is ignored.
logits = torch.tensor([[30.0, 0.0, 1.0, 2.0], [0.5, 0.2, 0.1, 0.3], [1.0, 2.0, 0.0, 0.5]], dtype=torch.float64)
target = torch.tensor([0, 1, -100])
counted = int((target != -100).sum())

want = F.cross_entropy(logits, target)  # torch: the mean over the 2 counted targets
want_grad = torch.autograd.functional.jacobian(lambda x: F.cross_entropy(x, target), logits)

cols = logits.shape[1] // world
local = logits[:, rank * cols:(rank + 1) * cols].float().clone().requires_grad_(True)
if "--fixed" in sys.argv:
    got = cross_entropy_1d(local, target, process_group=dist.group.WORLD, vocab_size=4, mode="sum") / counted
else:
    got = cross_entropy_1d(local, target, process_group=dist.group.WORLD, vocab_size=4)  # mode="mean"
got.backward()
grad = local.grad.double()
ok_loss = abs(float(got) - float(want)) <= 1e-5 * abs(float(want))
ok_grad = torch.allclose(grad, want_grad[:, rank * cols:(rank + 1) * cols].double(), rtol=1e-5, atol=1e-7)
if rank == 0:
    print(f"per-token fp32 losses: {[round(float(x), 6) for x in F.cross_entropy(logits.float(), target, reduction='none')]}")
    print(f"cross_entropy_1d: {float(got):.6f}, torch (mean over {counted} counted targets): {float(want):.6f}"
          f" ratio {float(got) / float(want):.4f}")
print(f"rank {rank}: " + ("OK" if ok_loss and ok_grad else
                         f"MISMATCH: loss {float(got):.6f} vs {float(want):.6f}, gradient ratio "
                         f"{(grad[1] / want_grad[1, rank * cols:(rank + 1) * cols]).tolist()}"))
dist.destroy_process_group()
