"""torch 2.15 DTensor: after an uneven Shard(i) -> Shard(j) redistribution, reshape / flatten / matmul crash.

x [5, 5, 10] sharded on dim 1 over 2 ranks (3 and 2 rows) and redistributed to Shard(2) gets a local tensor
of shape (5, 5, 5) with strides (30, 5, 1): the all-to-all pads the uneven dim 1 to 6 rows and the local
result is a slice of the padded buffer, so it is not contiguous. DTensor's view rule decides from the
*global* tensor that x.reshape(25, 10) is a view, and then calls `view` on the local tensor, which ATen
refuses: "view size is not compatible with input tensor's size and stride (at least one dimension spans
across two contiguous subspaces). Use .reshape(...) instead." flatten and matmul (which folds the batch
dims with a reshape) fail the same way. With even shards (x [4, 4, 8]) the local tensor is contiguous and
all three work. Any uneven source dim and world size shows it (2, 3 and 4 ranks checked).

torch 2.5.1 crashes the same way.

Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --corpus corpus --time 12m --seed 85`: `conj_physical`
and `take_along_dim` cases whose inputs were redistributed between shards, minimized by `shardfuzz report`
to `matmul` of a [5, 5, 10] tensor moved from Shard(1) to Shard(2) over 4 ranks; reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-uneven-shard-to-shard-padded-local-view-crash.py
Prints one line per shape and op (CRASH, MISMATCH or OK) with the local tensor's strides; exits 1 unless
every one is OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

OPS = {
    "reshape(n * n, -1)": lambda t, v: t.reshape(t.shape[0] * t.shape[1], -1),
    "flatten(0, 1)": lambda t, v: t.flatten(0, 1),
    "matmul(x, v)": lambda t, v: t @ v,
}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    bad = 0
    for shape in ((5, 5, 10), (4, 4, 8)):
        x = torch.randn(*shape, dtype=torch.float64)
        v = torch.randn(shape[2], dtype=torch.float64)
        xd = distribute_tensor(x, mesh, [Shard(1)]).redistribute(mesh, [Shard(2)])
        vd = distribute_tensor(v, mesh, [Replicate()])
        local = xd.to_local()
        for name, f in OPS.items():
            try:
                outcome = "OK" if torch.allclose(f(xd, vd).full_tensor(), f(x, v)) else "MISMATCH"
            except RuntimeError as e:
                outcome = "CRASH: " + str(e).splitlines()[0][:90]
            bad += outcome != "OK"
            if rank == 0:
                print(f"x{list(shape)} Shard(1) -> Shard(2), local {tuple(local.shape)} strides {local.stride()}: "
                      f"{name}: {outcome}", flush=True)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
