"""torch DTensor: the gradient of a full amax (no dim) of a Shard(0) tensor is NaN / inf.

The value is right. Autograd's backward divides the gradient by the count of maxima,
`mask.sum(dim=[], keepdim=True)`, and DTensor reads an empty dim list as "reduce nothing"
(`_infer_reduction_dims` in torch/distributed/tensor/_ops/_math_ops.py) where ATen reduces every
dim: each rank divides by its own count, 0 on the ranks without the maximum
(see torch-2.15-dtensor-sum-empty-dim-list-sharded.py). Found by shardfuzz (amax OpInfo sample 8,
mesh [3], input Shard(0), float64). torch 2.5.1 behaves the same, and so does amin (every amax
replaced by amin: NaN / inf gradient, checked 2026-11-26).

torchrun --nproc_per_node 3 torch-2.15-dtensor-amax-full-reduction-sharded-grad-nan.py   (CPU, gloo)
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
x = torch.tensor([[-4.83, -7.58, -0.60, -1.54, -1.97],
                  [-4.15, -5.42, -4.78, -4.15, 7.38],
                  [5.58, -8.32, 4.18, 2.05, -4.08]], dtype=torch.float64)
gout = torch.tensor(0.63, dtype=torch.float64)
xr = x.clone().requires_grad_()
xr.amax().backward(gout)

dx = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
y = dx.amax()
value = y.full_tensor()
value.backward(gout)
grad = dx.grad.full_tensor()
if rank == 0:
    print("output placements", y.placements, "value", value.item(), "expected", x.amax().item())
    print("gradient (sharded)\n", grad, "\nexpected\n", xr.grad)
    print("MISMATCH" if not torch.allclose(grad, xr.grad) else "OK")
bad = torch.tensor([0.0 if torch.allclose(grad, xr.grad) else 1.0])
dist.destroy_process_group()
sys.exit(int(bad.item()))
