"""torch 2.5.1 DTensor: a call's result depends on an earlier call of the same op with another scalar argument.

DTensor caches sharding propagation per op schema (`ShardingPropagator.propagate_op_sharding`, an lru_cache).
In torch 2.5.1 the cache key leaves out non-tensor positional arguments (scalars, pad values) beyond the op's
`static_argnum`, while the cached answer, when the inputs need a redistribution (a `Partial` input of an op
that is not linear in it), carries the suggested schema *with the first call's arguments*. A later call that
differs only in such an argument hits the entry and runs with the first call's scalar:

  * `x * 2` after `x * -2` on a `Partial(sum)` x gives `x * -2` (and the other way round);
  * `constant_pad_nd(x, (1, 2), 1.0)` after the same call with value 2.0 pads with 2.0.

Silent wrong values, placed `Replicate`. Known upstream: pytorch/pytorch#147180 and #153603 (the cached scalar
of `mul`); torch 2.15 gives the right values for every case here.

Found 2026-11-27 by hand (checking Partial propagation of pointwise ops under torch 2.5.1), then with shardfuzz's
warm-up call (`library_op.warmup`: the op runs once with other sample edits before the case's own call):
`constant_pad_nd` sample 1 with a `Partial` input and the warm-up edit `increment` on the pad value diverges
under torch 2.5.1 and passes under torch 2.15 (tests/python_targets.rs, tests/python_repro.rs).

Run:  torchrun --nproc_per_node 2 torch-2.5.1-dtensor-propagation-cache-ignores-scalar-args.py
Prints OK or MISMATCH per call; exits 1 on a mismatch.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial


def partial(full, mesh, rank, world):
    """`full` as a Partial(sum) DTensor: rank r holds full * (r + 1) / (world (world + 1) / 2)."""
    share = (rank + 1) / (world * (world + 1) / 2)
    return DTensor.from_local(full * share, mesh, [Partial()], run_check=False)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    full = torch.randn(4, dtype=torch.float64)
    x = partial(full, mesh, rank, world)
    calls = [
        ("x * -2", lambda t: t * -2),
        ("x * 2 (after x * -2)", lambda t: t * 2),
        ("pad value 2.0", lambda t: F.pad(t.reshape(1, 4), (1, 2), value=2.0)),
        ("pad value 1.0 (after 2.0)", lambda t: F.pad(t.reshape(1, 4), (1, 2), value=1.0)),
    ]
    bad = 0
    for name, f in calls:
        got, want = f(x).full_tensor(), f(full)
        ok = torch.allclose(got, want)
        bad += not ok
        if rank == 0:
            print(f"{name}: {'OK' if ok else 'MISMATCH'}  sharded {got.flatten().tolist()[:3]}  single-device {want.flatten().tolist()[:3]}")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
