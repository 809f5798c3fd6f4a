"""torch DTensor: sum(dim=[]) -- which reduces every dimension -- keeps Shard(0) on a sharded input.

ATen reads an empty dim list as "every dim" (like dim=None); DTensor's `_infer_reduction_dims`
(torch/distributed/tensor/_ops/_math_ops.py) returns no reduction dims for it when ndim > 0, so
with keepdim=True every rank keeps its local sum, placed Shard(0) (on 3 ranks: 10 where torch gives
105), and with keepdim=False sharding propagation raises IndexError. Autograd itself emits this
call in the backward of full reductions (amax / amin), whose gradients come out NaN
(torch-2.15-dtensor-amax-full-reduction-sharded-grad-nan.py). Same in torch 2.5.1.

torchrun --nproc_per_node 3 torch-2.15-dtensor-sum-empty-dim-list-sharded.py   (CPU, gloo)
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
x = torch.arange(15, dtype=torch.float64).reshape(3, 5)
bad = False
for keepdim in (True, False):
    expected = x.sum(dim=[], keepdim=keepdim)
    try:
        out = distribute_tensor(x, mesh, [Shard(0)]).sum(dim=[], keepdim=keepdim)
        got = out.full_tensor()
    except Exception as e:  # noqa: BLE001 - the crash is what this script shows
        bad = True
        if rank == 0:
            print(f"keepdim={keepdim}: {type(e).__name__}: {e}; single device: {expected.item()}")
        continue
    ok = got.shape == expected.shape and torch.allclose(got, expected)
    bad |= not ok
    if rank == 0:
        print(f"keepdim={keepdim}: placements {out.placements}, global shape {tuple(got.shape)} value {got.flatten().tolist()}; "
              f"single device: shape {tuple(expected.shape)} value {expected.flatten().tolist()}")
if rank == 0:
    print("MISMATCH" if bad else "OK")
dist.destroy_process_group()
sys.exit(1 if bad else 0)
