"""torch 2.15 DTensor: squeeze_copy drops a sharded dimension on a rank whose shard of it has size 1.

x of shape [5, 1, 5, 1] sharded on dim 2 over 3 ranks holds 2, 2 and 1 of those 5 elements. squeeze_copy()
(no dims) gives a [5, 5] DTensor placed Shard(1), right, but each rank runs the plain kernel on its local
piece, and rank 2's piece [5, 1, 1, 1] loses its sharded dim as well: its local tensor is [5], not [5, 1].
Gathering it (`full_tensor()`) then raises IndexError on rank 2 ("Dimension out of range") and the other
ranks lose their peer. `torch.squeeze` is handled (its rule squeezes only the dims that are 1 globally) in
torch 2.15; in torch 2.5.1 `torch.squeeze` itself fails the same way, so the fix did not reach the copy
variant. Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --time 12m --seed 81`: OpInfo squeeze_copy
sample 0 with its input Shard(2) on a mesh [3]; minimized by `shardfuzz report`; reduced by hand to this).

Run:  torchrun --nproc_per_node 3 torch-2.15-dtensor-squeeze-copy-size1-local-shard.py
Prints each rank's local shape against the one its placement implies; MISMATCH (exit 1) when any differs,
OK (exit 0) otherwise. (It compares shapes only, so it does not hang in a collective.)
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(25.0).reshape(5, 1, 5, 1)
    x = distribute_tensor(full, mesh, [Shard(2)])
    y = torch.squeeze_copy(x)
    # The local piece Shard(1) of the [5, 5] result implies on this rank.
    expected = tuple(torch.tensor_split(torch.squeeze_copy(full), world, dim=1)[rank].shape)
    shapes = [None] * world
    dist.all_gather_object(shapes, (tuple(y.to_local().shape), expected))
    ok = all(got == want for got, want in shapes)
    if rank == 0:
        print(f"torch {torch.__version__}: squeeze_copy of [5, 1, 5, 1] Shard(2) on {world} ranks -> "
              f"{tuple(y.shape)} {y.placements}")
        for r, (got, want) in enumerate(shapes):
            print(f"  rank {r}: local {got}, its placement implies {want}{'' if got == want else '  <-- wrong'}")
        print("OK" if ok else "MISMATCH")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
