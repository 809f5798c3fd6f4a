"""DTensor: the backward of redistributing a Partial tensor to Replicate, when the gradient comes back
Partial(sum).

x is Partial (a pending reduction: "sum", "avg", "max" or "min") and is redistributed to Replicate, then
multiplied by a Shard(0) matrix and summed. The gradient reaching the redistribution is then Partial(sum)
(each rank holds the sum over its own rows). The right gradient of x is the column sums of the whole
matrix, [18, 22, 26] in this script.
- torch 2.15: with a Partial("sum") source the gradient is right. With "avg", "max" or "min" the backward
  raises `AssertionError: Redistribution from one partial type (P(sum)) to another (P(max)) is
  unsupported` (`Redistribute.backward` -> `_redistribute_backward`). It sends the gradient back to the
  source's own Partial placement, where `from_local`'s backward normalizes a Partial source to
  Replicate (our reading).
- torch 2.5.1: no error, but the gradient is **wrong** for every source, sum included. It is placed
  Replicate without being reduced, so rank 0 holds [3, 5, 7] and rank 1 [15, 17, 19] (its own partial
  sums), and the two replicas disagree.
Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --time 12m --seed 83`: a conv3d weight made
Partial(max) and redistributed to Replicate, input Shard(0); minimized by `shardfuzz report`). Reduced by
hand to this; the torch 2.5.1 behaviour was met while doing so.

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-redistribute-partial-to-replicate-backward.py
Prints one line per reduction; exits 1 on a crash or a wrong gradient.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    a = torch.arange(12, dtype=torch.float64).reshape(4, 3)
    want = a.sum(0)
    bad = 0
    for reduce_op in ("sum", "avg", "max", "min"):
        x = DTensor.from_local(torch.ones(3, dtype=torch.float64), mesh, [Partial(reduce_op)]).detach().requires_grad_()
        try:
            xr = x.redistribute(mesh, [Replicate()])
            (distribute_tensor(a, mesh, [Shard(0)]) * xr).sum().backward()
            local = x.grad.to_local()
            copies = [None] * dist.get_world_size()
            dist.all_gather_object(copies, local.tolist())
            got = x.grad.full_tensor()
            ok = torch.equal(got, want)
            outcome = (f"grad placed {x.grad.placements}, local pieces {copies}, gathered {got.tolist()}: "
                       + ("OK" if ok else "MISMATCH"))
        except AssertionError as e:
            ok, outcome = False, f"CRASH: AssertionError: {e}"
        except RuntimeError as e:  # torch 2.5.1 reduces "avg" with ReduceOp.AVG, which gloo lacks
            ok, outcome = True, f"not run on this backend: {str(e).splitlines()[0]}"
        bad += not ok
        if rank == 0:
            print(f"Partial({reduce_op}) -> Replicate: {outcome}")
    if rank == 0:
        print(f"torch {torch.__version__}; right gradient: {want.tolist()}")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
