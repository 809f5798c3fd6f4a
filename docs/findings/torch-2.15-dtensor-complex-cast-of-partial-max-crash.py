"""torch 2.15 DTensor: casting a Partial(max) or Partial(min) tensor to a complex dtype keeps the placement,
and the pending reduction then fails with an internal assertion.

`x.cdouble()` / `x.to(torch.complex64)` on a DTensor whose placement is Partial("max") (or "min") returns a
complex DTensor that is still Partial("max"): a max over complex numbers, which have no order. The cast
should have reduced first (a cast does not commute with a max in general, and a complex max is undefined).
Any later redistribution (`full_tensor()`, `redistribute(..., [Replicate()])`, an op needing Replicate) calls
the functional all_reduce with "max" on a complex tensor, which raises
    RuntimeError: other < 9 INTERNAL ASSERT FAILED at ".../c10d/Types.hpp":92, please report a bug to
    PyTorch. Invalid other op value
where `dist.all_reduce` checks the same request and refuses it cleanly (supports_complex). A complex
Partial("max") made directly with from_local fails alike. Partial("sum") and Partial("avg") cast right.
Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --time 12m --seed 81`: OpInfo cdouble sample 1 with
its input Partial(max) on a [2, 1] mesh; minimized by `shardfuzz report`; reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-complex-cast-of-partial-max-crash.py
Prints the placement after the cast and CRASH (exit 1) when the gather fails, OK (exit 0) when it gives
single-device torch's value.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    # Rank r holds r + 1: the pending max is world_size on every element.
    x = DTensor.from_local(torch.full((3,), float(rank + 1), dtype=torch.float64), mesh, [Partial("max")])
    want = x.full_tensor().cdouble()
    y = x.cdouble()
    code = 0
    try:
        got = y.full_tensor()
        ok = torch.equal(got, want)
        outcome = "OK" if ok else f"MISMATCH: {got.tolist()} where single-device torch gives {want.tolist()}"
        code = 0 if ok else 1
    except RuntimeError as e:
        outcome, code = f"CRASH on rank {rank}: {e}".splitlines()[0], 1
    if rank == 0:
        print(f"torch {torch.__version__}: x.cdouble() of a Partial('max') tensor is placed {y.placements}")
        print(outcome)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
