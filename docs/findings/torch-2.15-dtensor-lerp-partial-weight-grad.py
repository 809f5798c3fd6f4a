"""torch DTensor: `fill_` keeps Partial(sum), so a filled tensor is world-size times its value;
through it, lerp with a Partial(sum) weight has a wrong gradient for `start`.

torchrun --nproc_per_node 2 torch-2.15-dtensor-lerp-partial-weight-grad.py   (CPU, gloo)

`aten.fill_.Scalar` is registered with clone / detach / zero_ in
`propagate_single_input_single_dim_strategy` (torch/distributed/tensor/_ops/_tensor_ops.py), which
forwards Partial("sum") unchanged: every rank writes the value and the pending sum adds them up
(right for zero_, and for fill_ under Partial max / min / avg, not for fill_ under a sum).
lerp's backward computes 1 - weight as empty_like(weight).fill_(1).sub_(weight): with the weight
Partial(sum) that is world_size - weight, and the gradient of `start` is off (0.83 relative here);
the output and the gradient of `end` are right. Found by shardfuzz (lerp OpInfo sample 12,
weight Partial on a 3x2 mesh, float64; minimized to mesh [2]). torch 2.5.1: fill_ the same, lerp's
gradient right (its backward takes another path there).
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
start, end, weight = torch.randn(5, dtype=torch.float64), torch.randn(5, 5, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)
gout = torch.randn(5, 5, 5, dtype=torch.float64)
s_ref = start.clone().requires_grad_()
e_ref = end.clone().requires_grad_()
out_ref = torch.lerp(s_ref, e_ref, weight)
out_ref.backward(gout)

# weight as Partial(sum): uneven summands that add up to it
split = torch.randn(5, 5, dtype=torch.float64)
d_w = DTensor.from_local(weight - split if rank == 0 else split, mesh, [Partial()])
d_s = distribute_tensor(start, mesh, [Replicate()]).requires_grad_()
d_e = distribute_tensor(end, mesh, [Replicate()]).requires_grad_()
out = torch.lerp(d_s, d_e, d_w)
full = out.full_tensor()
full.backward(gout)
filled = DTensor.from_local(torch.zeros(3, dtype=torch.float64), mesh, [Partial()]).fill_(1.0).full_tensor()
checks = {"fill_(1.0) of a Partial tensor": (filled, torch.ones(3, dtype=torch.float64)), "out": (full, out_ref), "grad start": (d_s.grad.full_tensor(), s_ref.grad), "grad end": (d_e.grad.full_tensor(), e_ref.grad)}
bad = False
for name, (got, want) in checks.items():
    err = ((got - want).norm() / want.norm()).item()
    bad |= err > 1e-10
    if rank == 0:
        print(f"{name}: relative error {err:.3e}")
if rank == 0:
    print("MISMATCH" if bad else "OK")
dist.destroy_process_group()
sys.exit(1 if bad else 0)
