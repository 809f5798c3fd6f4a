"""torch 2.15 tensor parallel: loss_parallel cross-entropy with a class `weight` crashes in backward on an ignored target.

`torch.distributed.tensor.parallel.loss_parallel()` computes cross_entropy on vocab-sharded logits. With a
class `weight` (replicated, as the context manager requires) and any target equal to `ignore_index`
(-100 by default: padding tokens), the forward is right but the backward raises "index -100 is out of
bounds for dimension 1 with size 8". In torch/distributed/tensor/parallel/loss.py the forward gathers the
weight at `safe_target` (ignored targets replaced by 0), but `_nll_loss_and_log_softmax_backward` gathers it
at the raw `target` (`w_target = torch.gather(w, channel_dim, target)`) before masking the ignored
positions. Without a weight, or with no ignored target, everything is right; single-device torch runs all
of these. Every reduction (mean, sum, none) fails the same way.

torch 2.5.1 crashes the same way.

Found on 2026-11-26 by hand, checking the loss_parallel options one by one (reduction, weight,
ignore_index) while triaging shardfuzz's torch-tp findings; not by a campaign: shardfuzz's model cases use
neither class weights nor ignored targets.

Run:  torchrun --nproc_per_node 2 torch-2.15-tp-loss-parallel-weight-ignore-index-backward-crash.py
Prints one line per reduction, weight and target set (OK, MISMATCH, or CRASH in forward or backward);
exits 1 unless every one is OK.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel


def run(mesh, logits, target, weight, reduction):
    """'OK', 'MISMATCH …' or 'CRASH in forward/backward: …' for one loss_parallel call against single-device torch."""
    reference = logits.clone().requires_grad_()
    expected = F.cross_entropy(reference, target, weight=weight, reduction=reduction)
    expected.sum().backward()
    x = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
    w = distribute_tensor(weight, mesh, [Replicate()]) if weight is not None else None
    with loss_parallel():
        try:
            loss = F.cross_entropy(x, target, weight=w, reduction=reduction)
        except RuntimeError as e:
            return "CRASH in forward: " + str(e).splitlines()[0][:80]
        forward_ok = torch.allclose(loss.full_tensor(), expected)
        try:
            (loss.sum() if loss.dim() else loss).backward()
        except RuntimeError as e:
            return f"CRASH in backward (forward {'right' if forward_ok else 'wrong'}): " + str(e).splitlines()[0][:80]
    if forward_ok and torch.allclose(x.grad.full_tensor(), reference.grad):
        return "OK"
    return "MISMATCH"


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    logits = torch.randn(6, 8, dtype=torch.float64)
    weight = torch.rand(8, dtype=torch.float64) + 0.5
    target = torch.randint(0, 8, (6,))
    padded = target.clone()
    padded[2] = -100
    bad = 0
    for reduction in ("mean", "sum", "none"):
        for name, w in (("no weight", None), ("weight", weight)):
            for tname, t in (("no ignored target", target), ("target[2] = -100", padded)):
                outcome = run(mesh, logits, t, w, reduction)
                bad += outcome != "OK"
                if rank == 0:
                    print(f"reduction {reduction:4}, {name:9}, {tname:17}: {outcome}", flush=True)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
