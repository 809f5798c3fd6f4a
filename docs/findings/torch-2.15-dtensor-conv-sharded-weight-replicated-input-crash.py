"""torch 2.15 DTensor: conv2d / conv_transpose2d with a replicated input and a weight sharded on any dim crash.

DTensor routes aten.convolution to its own handler (torch/distributed/tensor/_tp_conv.py, made for inputs
sharded on their width with halo exchange). Its sharding rule accepts a weight sharded on any of its dims,
output channels included (the plain column-parallel layout), and then runs the local convolution on the
local weight piece, which fails: "The size of tensor a (2) must match the size of tensor b (4)" (output
channels), "weight of size [4, 2, 3, 3], expected input[1, 3, 6, 6] to have 2 channels" (input channels),
size mismatches for the kernel dims. torch 2.5.1 refuses every one of these cleanly ("Sharding propagation
failed on op aten.convolution.default"), so this is a regression to a crash. The same rule gives wrong
results when the input's channels are sharded as well (see the README's first conv row). Found by shardfuzz
on 2026-11-26 (torch-dtensor, `fuzz --time 12m --seed 81`: conv2d / conv_transpose3d crashes with weights
Shard(0) / Shard(2); minimized by `shardfuzz report`; reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-conv-sharded-weight-replicated-input-crash.py
Prints one line per weight placement (CRASH, MISMATCH or OK); exits 1 unless every one is OK or a clean
refusal ("Sharding propagation failed").
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    x = torch.randn(1, 3, 6, 6, dtype=torch.float64)
    cases = [("conv2d", F.conv2d, torch.randn(4, 3, 3, 3, dtype=torch.float64)),
             ("conv_transpose2d", F.conv_transpose2d, torch.randn(3, 4, 3, 3, dtype=torch.float64))]
    bad = 0
    for name, op, w in cases:
        for d in range(4):
            try:
                y = op(distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(w, mesh, [Shard(d)]))
                ok = torch.allclose(y.full_tensor(), op(x, w))
                outcome = "OK" if ok else "MISMATCH"
            except RuntimeError as e:
                ok = "Sharding propagation failed" in str(e)
                outcome = ("refused: " if ok else "CRASH: ") + str(e).splitlines()[0][:110]
            bad += not ok
            if rank == 0:
                print(f"{name:17} weight Shard({d}) {outcome}")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
