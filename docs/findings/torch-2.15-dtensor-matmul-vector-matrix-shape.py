"""torch 2.15 DTensor: torch.matmul of a 1-D and a 2-D replicated DTensor returns a DTensor whose global shape is
(1, 5) while single-device torch's (and every rank's local tensor) is (5,); redistributing it to Shard(0) and
gathering gives a tensor of shape (1,). Found by shardfuzz on 2026-11-25 (matmul sample 2 with an output
redistribution; minimized to every argument replicated on 2 ranks, float64).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-matmul-vector-matrix-shape.py
Prints MISMATCH (exit 1) when the shapes differ, OK (exit 0) when they agree.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def main():
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    a, b = torch.randn(10, dtype=torch.float64), torch.randn(10, 5, dtype=torch.float64)
    out = torch.matmul(distribute_tensor(a, mesh, [Replicate()]), distribute_tensor(b, mesh, [Replicate()]))
    gathered = out.redistribute(mesh, [Shard(0)]).full_tensor()
    want = a @ b
    bad = tuple(out.shape) != tuple(want.shape) or tuple(gathered.shape) != tuple(want.shape)
    if dist.get_rank() == 0:
        print(f"single-device shape {tuple(want.shape)}; DTensor shape {tuple(out.shape)} (local {tuple(out.to_local().shape)});"
              f" after Shard(0) and full_tensor() {tuple(gathered.shape)}")
        print("MISMATCH: the DTensor's global shape is not the op's" if bad else "OK")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
