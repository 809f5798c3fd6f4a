#!/usr/bin/env python3
"""torch 2.4.1 / 2.5.1 DTensor: the backward of redistribute(Partial -> Replicate) drops a Partial gradient's other
summands. A tensor made Replicate from a Partial sum, then used with a sharded tensor: its gradient comes back
Partial(sum), and the gradient reaching the source is not their sum (x's gradient 1.2414 where -0.2958 is
right). Silent.
Mechanism (2.5.1's source): `Redistribute.backward` sends the gradient back to the source's placement, Partial ->
Partial (a no-op), then labels the result Replicate without reducing it. torch 2.15 is right (likely fixed by
pytorch/pytorch#167686, "Fix silently skipping Partial related redistribution in backward"; not bisected).

Found by shardfuzz: campaign 218 (torch-dtensor library ops under torch 2.4.1), as `sum` of a sharded tensor whose
output was made Replicate and given a Partial cotangent; reduced by hand to this program, which needs no hand-made
cotangent. The same bug as torch-2.15-dtensor-redistribute-partial-to-replicate-backward.py's 2.5.1 mismatch.

Run: torchrun --nproc_per_node 3 torch-2.5.1-dtensor-replicated-sum-backward-drops-partial-grad.py
MISMATCH (exit status 1) under torch 2.4.1 and 2.5.1, OK (0) under 2.15.0."""
import sys

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
except ImportError:  # torch < 2.5 kept DTensor private
    from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
x, v = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)

# Single device: loss = sum(x) * sum(v), so d loss / d x = sum(v) everywhere.
expected = torch.full((6,), float(v.sum()), dtype=torch.float64)

d = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
s = d.sum().redistribute(mesh, [Replicate()])  # Partial(sum) -> Replicate: an all-reduce
loss = (s * distribute_tensor(v, mesh, [Shard(0)])).sum()  # s's gradient is Partial(sum): each rank its part of sum(v)
loss.full_tensor().backward()
got, loss_value = d.grad.full_tensor(), loss.full_tensor().item()
ok = torch.allclose(got, expected)
if rank == 0:
    print(f"torch {torch.__version__}: loss {loss_value:.6f} (single device {float(x.sum() * v.sum()):.6f})")
    print(f"  grad of x: {[round(g, 4) for g in got.tolist()]}")
    print(f"  expected:  {[round(g, 4) for g in expected.tolist()]}")
    print("OK" if ok else "MISMATCH: the gradient through redistribute(Partial -> Replicate) lost a Partial gradient's "
          "other summands")
dist.destroy_process_group()
sys.exit(0 if ok else 1)
