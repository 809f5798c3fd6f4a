"""torch 2.15 DTensor: quantile / nanquantile with a scalar q return a DTensor whose global shape has an extra
dimension.

torch.quantile(x, 0.5, dim=-1) on a [4] tensor is 0-d. On a DTensor (replicated or sharded) the result's
local tensor is 0-d too, but its global shape is (1,): with keepdim=True (1, 1) where torch gives (1,), and
nanquantile(x, 0.5, dim=0) on [3, 4] gives (4, 1) for (4,). The metadata and the data disagree, so any
code reading `.shape` is wrong, and a later redistribution crashes (`Shard` of the "(1,)" tensor:
"AssertionError: Expected tensor.dim() > 0, got 0" in `_custom_chunk`). Our reading (not traced): ATen's
quantile computes with q unsqueezed to a trailing dim and squeezes it away in place at the end for a scalar
q, and the output spec keeps the unsqueezed shape. torch 2.5.1 refuses the op (no strategy for sort).
Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --time 12m --seed 83`: nanquantile sample 8 with
dim edited to -1, then redistributed to a shard; minimized by `shardfuzz report`; reduced by hand).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-quantile-scalar-q-wrong-global-shape.py
Prints global, local and single-device shapes per call; exits 1 when any global shape is wrong.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    x1, x2 = torch.randn(4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    calls = [
        ("quantile(x[4], 0.5, dim=-1)", x1, lambda t: torch.quantile(t, 0.5, dim=-1)),
        ("quantile(x[4], 0.5, dim=-1, keepdim=True)", x1, lambda t: torch.quantile(t, 0.5, dim=-1, keepdim=True)),
        ("nanquantile(x[3, 4], 0.5, dim=0)", x2, lambda t: torch.nanquantile(t, 0.5, dim=0)),
    ]
    bad = 0
    for name, x, f in calls:
        for placement in (Replicate(), Shard(0)):
            y, want = f(distribute_tensor(x, mesh, [placement])), f(x)
            ok = tuple(y.shape) == tuple(want.shape)
            bad += not ok
            if rank == 0:
                print(f"{name} on {placement}: global {tuple(y.shape)}, local {tuple(y.to_local().shape)}, "
                      f"single-device {tuple(want.shape)}{'' if ok else '  <-- MISMATCH'}")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
