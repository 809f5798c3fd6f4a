"""torch 2.15 DTensor: a p-norm of a sharded float16 tensor overflows to inf where single-device torch is finite.

linalg.vector_norm(x, ord=p) of x [6, 64] float16 sharded on dim 0 over 3 ranks: each rank computes its
local norm (ATen accumulates in float32 and returns float16), and the `_NormPartial(p)` placement then
combines them by raising each local norm to the p-th power in float16, summing and taking the p-th root.
The p-th powers overflow float16 long before the norm does: a tensor of 30.0 gives inf where the norm is
588 (single-device torch: 588.0); for ord=4 a tensor of 8.0 gives inf where the norm is 35.4.

`Partial(avg)` has the same flaw: mean() of a float16 [6, 8] tensor of 40000.0 sharded over 3 ranks sums the local
means (40000 each) in float16 before dividing, and gives inf where single-device torch gives 40000.0.

Consequence: `clip_grad_norm_` over float16 DTensor gradients computes a total norm of inf and multiplies
every gradient by max_norm / inf = 0. The step silently zeroes the gradients that single-device torch
only scales down (part 2).

Found by shardfuzz on 2026-11-27 (torch-dtensor, `fuzz --corpus corpus --time 12m --seed 87`: `dist` with
p=4 in float16, a zero gradient where single-device torch has a nonzero one; reduced by hand to the
p-norm's partial reduction).

Run:  torchrun --nproc_per_node 3 torch-2.15-dtensor-f16-pnorm-partial-overflow.py
Prints one line per case (MISMATCH or OK); exits 1 unless every one is OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def norms(mesh):
    for p, fill in ((2.0, 1.0), (2.0, 30.0), (4.0, 1.0), (4.0, 8.0)):
        x = torch.full((6, 64), fill, dtype=torch.float16)
        expected = torch.linalg.vector_norm(x, p).item()
        got = torch.linalg.vector_norm(distribute_tensor(x, mesh, [Shard(0)]), p).full_tensor().item()
        ok = abs(got - expected) <= 1e-2 * expected
        yield ok, f"vector_norm(ord={p}) of a float16 [6, 64] of {fill}: sharded {got}, single-device {expected}"


def means(mesh):
    """Partial(avg), the same pattern: local means are summed in float16 before the division."""
    x = torch.full((6, 8), 40000.0, dtype=torch.float16)
    expected = x.mean().item()
    try:
        got = distribute_tensor(x, mesh, [Shard(0)]).mean().full_tensor().item()
    except RuntimeError as e:  # torch 2.5.1 on gloo: "Cannot use ReduceOp.AVG with Gloo"
        yield False, "mean() of a float16 [6, 8] of 40000.0: CRASH: " + str(e).splitlines()[0][:80]
        return
    yield abs(got - expected) <= 1e-2 * expected, f"mean() of a float16 [6, 8] of 40000.0: sharded {got}, single-device {expected}"


def clipping(mesh):
    g = torch.full((6, 64), 30.0, dtype=torch.float16)
    p = torch.nn.Parameter(distribute_tensor(torch.zeros(6, 64, dtype=torch.float16), mesh, [Shard(0)]))
    p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
    q = torch.nn.Parameter(torch.zeros(6, 64, dtype=torch.float16))
    q.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_([p], 1.0).full_tensor().item()
    expected = torch.nn.utils.clip_grad_norm_([q], 1.0).item()
    got_grad, want_grad = p.grad.full_tensor()[0, 0].item(), q.grad[0, 0].item()
    ok = abs(got_grad - want_grad) <= 1e-2 * abs(want_grad)
    yield ok, (f"clip_grad_norm_(max_norm=1) of float16 gradients of 30.0: total norm sharded {total}, "
               f"single-device {expected}; a gradient element after clipping: sharded {got_grad}, single-device {want_grad}")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    bad = 0
    for ok, line in [*norms(mesh), *means(mesh), *clipping(mesh)]:
        bad += not ok
        if rank == 0:
            print(("OK " if ok else "MISMATCH ") + line, flush=True)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
