"""torch 2.15 DTensor: F.embedding with the weight sharded on its rows (a vocab-parallel embedding) returns
zeros for an out-of-range index, where single-device torch raises IndexError (found by shardfuzz, sample
edits, 2026-11-25).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-embedding-out-of-range-index-zeros.py
Prints MISMATCH (exit 1) when the sharded op returns a result for the call single-device torch refuses,
OK (exit 0) when it refuses too.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def main():
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    weight = torch.randn(10, 5, dtype=torch.float64)
    ids = torch.tensor([[0, 3, 10]])  # 10 == num_embeddings: out of range
    try:
        F.embedding(ids, weight)
        single = "returns a result"
    except IndexError as e:
        single = f"raises IndexError: {e}"
    w = distribute_tensor(weight, mesh, [Shard(0)])
    i = distribute_tensor(ids, mesh, [Replicate()])
    code = 0
    try:
        out = F.embedding(i, w).full_tensor()
        sharded = f"returns {out[0, 2].tolist()} for index 10"
        code = 1 if single.startswith("raises") else 0
    except Exception as e:  # noqa: BLE001
        sharded = f"raises {type(e).__name__}: {e}"
    if dist.get_rank() == 0:
        print(f"single-device: {single}\nsharded (weight Shard(0)): {sharded}")
        print("MISMATCH: the sharded op accepts an index single-device torch refuses" if code else "OK")
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
