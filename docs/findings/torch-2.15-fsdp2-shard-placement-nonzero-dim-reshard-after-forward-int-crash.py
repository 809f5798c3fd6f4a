# torch 2.15.0: FSDP2 (`fully_shard`) with a `shard_placement_fn` that shards a parameter on a nonzero dimension
# (Shard(1)) and an integer `reshard_after_forward` (reshard after the forward onto a smaller group of ranks than the
# one the parameter is sharded over) crashes in the first forward/backward. FSDPParam keeps the post-forward shard's
# metadata chunked on dimension 0 (`_init_sharded_post_forward_param_metadata`, _fsdp_param.py:797-808:
# `_chunk_with_empty(param_data, mesh_info.shard_mesh_size, dim=0)`) and `to_sharded_post_forward` (:975-1000) narrows
# the flat all-gather output on dimension 0 as well, while the all-gather output of a Shard(1) parameter is laid out
# by column chunks. Rows of 13 over 2 ranks: "setStorage: sizes [7, 16], strides [16, 1], storage offset 0, and itemsize
# 4 requiring a storage size of 448 are out of bounds for storage of size 416" (_fsdp_param.py:995); with 16 rows the
# backward's all-gather fails instead: "IndexError: list index out of range" in _reassemble_all_gather_outputs
# (_fsdp_collectives.py:573). Shard(0), or reshard_after_forward True / False, is right.
# Found by shardfuzz (target torch-fsdp2, campaign 132, 2026-11-28: the new case field `param_shard_dim` 1 with
# `reshard_group` 2 of dp 4; each alone passes).
# Run: timeout 300 python this.py [--dim0] [--reshard-true] [--rows N]  (4 CPU ranks, gloo). Prints the crash, or each
# rank's loss and gradient error against one device's: OK.
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROWS = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 13


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, ROWS))


def run(rank, dim, reshard):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29583")
    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=60))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    reference = model()
    reference(x).square().mean().backward()

    mesh = init_device_mesh("cpu", (4,))
    m = model()
    place = lambda p: Shard(dim) if p.dim() > dim else None  # noqa: E731 - every matrix on `dim` (8 and 16 divide by 4)
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh, shard_placement_fn=place, reshard_after_forward=reshard)
    fully_shard(m, mesh=mesh, shard_placement_fn=place, reshard_after_forward=reshard)
    try:
        loss = m(x).square().mean()  # every rank the same batch: the gradients equal one device's
        loss.backward()
    except RuntimeError as e:
        print(f"rank {rank}: {type(e).__name__}: {e}", flush=True)
        os._exit(1)
    except IndexError as e:
        print(f"rank {rank}: {type(e).__name__}: {e}", flush=True)
        os._exit(1)
    error = max(float((p.grad.full_tensor() - r.grad).abs().max()) for p, r in zip(m.parameters(), reference.parameters()))
    print(f"rank {rank}: loss {float(loss):.6f}, largest gradient error {error:.2e}: {'OK' if error < 1e-5 else 'MISMATCH'}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    dim = 0 if "--dim0" in sys.argv else 1
    reshard = True if "--reshard-true" in sys.argv else 2
    mp.spawn(run, args=(dim, reshard), nprocs=4)
