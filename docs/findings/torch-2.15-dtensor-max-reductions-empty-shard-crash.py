"""torch 2.15 DTensor: max-like reductions crash on a rank whose shard is empty.

A [2, 4] tensor sharded Shard(0) over 3 ranks holds rows 1, 1 and 0: the last rank's local piece is
empty ([0, 4]), which DTensor creates itself for uneven shards. Reducing over the sharded dim with max,
amax, argmax, argmin (and linalg.vector_norm with ord=inf, and their min counterparts) runs the local
reduction on every rank, and on the empty piece ATen raises ("max(): Expected reduction dim to be
specified for input.numel() == 0", "Expected reduction dim 0 to have non-zero size"); the other ranks then
lose their peer in the collective that combines the results. Single-device torch reduces the [2, 4] tensor
fine, sum() over the same sharding is right (an empty sum is 0), and reductions over the unsharded dim
(argmax(1), amin(1)) are right. A max over an empty shard should contribute the identity (-inf) or be
left out. Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --time 12m --seed 83`: argmax, amin,
masked.argmin / masked.argmax and vector_norm(inf) crash findings with an empty shard; reduced by hand).

Run:  torchrun --nproc_per_node 3 torch-2.15-dtensor-max-reductions-empty-shard-crash.py [OP]
OP is one of argmax (default), argmin, argmax0, amax, max, norm_inf, or sum (the control): one reduction
per run, since a crash leaves the process group unusable. Prints each rank's outcome; exits 1 on a crash
or a wrong result. torch 2.5.1 refuses these cleanly (no sharding strategy).
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

OPS = {
    "argmax": lambda t: t.argmax(),
    "argmin": lambda t: t.argmin(),
    "argmax0": lambda t: t.argmax(0),
    "amax": lambda t: t.amax(),
    "max": lambda t: t.max(),
    "norm_inf": lambda t: torch.linalg.vector_norm(t, float("inf")),
    "sum": lambda t: t.sum(),
}


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "argmax"
    # A short timeout: after one rank fails, the others would otherwise wait in the collective.
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    x = torch.randn(2, 4, dtype=torch.float64)
    op = OPS[name]
    xd = distribute_tensor(x, mesh, [Shard(0)])
    try:
        got = op(xd).full_tensor()
        ok = torch.equal(got, op(x))
        outcome = "OK" if ok else f"MISMATCH: {got.tolist()} where single-device torch gives {op(x).tolist()}"
    except RuntimeError as e:
        ok, outcome = False, f"CRASH: {str(e).splitlines()[0][:110]}"
    print(f"{name}: rank {rank} (local rows {xd.to_local().shape[0]}): {outcome}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
