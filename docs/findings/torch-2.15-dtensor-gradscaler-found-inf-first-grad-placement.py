"""torch 2.15 DTensor: GradScaler's overflow check is reduced across ranks only if the *first* gradient is sharded.

`torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)`, which GradScaler.unscale_
calls on each device's gradients, has a DTensor handler (`found_inf_reduce_handler` in
torch/distributed/tensor/_dispatch.py). It checks every rank's local pieces, then decides how to combine
`found_inf` across ranks from `grads[0].placements` alone: Partial(max) over the mesh dims where grads[0] is
not Replicate, nothing where it is. When the first gradient is replicated (a norm weight, a bias) and an
inf or NaN sits in a later, sharded gradient on one rank, only that rank sees found_inf = 1. GradScaler then
skips the step on that rank and takes it on the others, and halves the scale on that rank alone: the
replicated parameters and the loss scale silently diverge across ranks.

Part 1 calls the op directly: found_inf is 0 on rank 0 and 1 on rank 1 when the replicated gradient comes
first, 1 on both when the sharded one does. Part 2 is a training step through GradScaler: a replicated
norm weight, then a column-parallel weight whose gradient overflows only in the output features on the last
rank. In torch 2.15 the replicated weight's gradient comes back Partial(sum) and this script reduces it
(`redistribute` to Replicate, as training code does before clipping); in torch 2.5.1 autograd already
returns it Replicate. Either way, rank 0 steps and rank 1 skips.

torch 2.5.1 behaves the same (both parts).

Found on 2026-11-26 by reading DTensor's custom op handlers after shardfuzz found that the convolution
handler skips the redistribution sharding propagation asks for (README, DTensor bugs); not by a campaign:
shardfuzz's torch targets do not express dynamic loss scaling yet.

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-gradscaler-found-inf-first-grad-placement.py
Prints found_inf per rank and order, then each rank's loss scale and replicated weight after the step;
exits 1 when the ranks disagree.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def gathered(value):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def direct_call(mesh):
    """found_inf per rank for each order of a replicated and a sharded gradient (inf on the last rank)."""
    results = {}
    for order in ("replicated first", "sharded first"):
        b = torch.ones(4)
        b[3] = float("inf")
        replicated = distribute_tensor(torch.ones(4), mesh, [Replicate()])
        sharded = distribute_tensor(b, mesh, [Shard(0)])
        grads = [replicated, sharded] if order == "replicated first" else [sharded, replicated]
        found_inf = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch.ones(1))
        results[order] = gathered(found_inf.item())
    return results


def training_step(mesh):
    """One GradScaler step; returns (scale, replicated weight) per rank."""
    g = torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh, [Replicate()]))          # a norm weight
    w = torch.nn.Parameter(distribute_tensor(torch.full((4, 4), 0.01), mesh, [Shard(0)]))  # column-parallel
    opt = torch.optim.SGD([g, w], lr=1e-38)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    x = distribute_tensor(torch.full((1, 4), 1e19), mesh, [Replicate()])
    c = distribute_tensor(torch.tensor([[1.0, 1.0, 1.0, 1e20]]), mesh, [Shard(1)])  # feature 3: last rank
    loss = (((x * g) @ w.t()) * c).sum()
    scaler.scale(loss).backward()  # w's gradient overflows in row 3 only; g's stays finite
    if g.grad.placements != (Replicate(),):
        g.grad = g.grad.redistribute(mesh, [Replicate()])
    scaler.step(opt)
    scaler.update()
    return gathered((scaler.get_scale(), [round(v, 4) for v in g.to_local().tolist()]))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    bad = 0
    for order, per_rank in direct_call(mesh).items():
        agree = len(set(per_rank)) == 1
        bad += not agree
        if rank == 0:
            print(f"direct call, {order}: found_inf per rank {per_rank} {'OK' if agree else 'MISMATCH'}")
    per_rank = training_step(mesh)
    agree = all(p == per_rank[0] for p in per_rank)
    bad += not agree
    if rank == 0:
        for r, (scale, weight) in enumerate(per_rank):
            print(f"GradScaler step, rank {r}: scale {scale}, replicated weight {weight}")
        print("GradScaler step: " + ("OK" if agree else "MISMATCH: the ranks disagree about skipping the step"))
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
