"""torch 2.15 DTensor: torch.fft ops carry a Partial(max) / Partial(min) input straight through as if they were
Partial(sum)-linear (found by shardfuzz, 2026-11-25: fft.irfftn sample 4 with its input P(min) on 2 ranks).

Each rank holds a partial value whose max (or min) over the ranks is x (per element a random rank holds x). An FFT is linear in its input: it
commutes with a sum, not with a max, so a rule must reduce a Partial(max/min) input before the op (as torch
2.15 does for mean). Prints per op the largest difference between the gathered sharded result and the op on
x; MISMATCH (exit 1) when any op is off.

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-fft-partial-max-min.py
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial

#: (name, call) with real outputs (a complex Partial(max) result cannot be all-reduced at all on gloo).
OPS = (("irfft(x)", lambda x: torch.fft.irfft(x)), ("irfftn(x)", lambda x: torch.fft.irfftn(x)),
       ("irfftn(x, dim=-1)", lambda x: torch.fft.irfftn(x, dim=-1)), ("irfftn(x, dim=(0, 2))", lambda x: torch.fft.irfftn(x, dim=(0, 2))))
# (hfft(x) gives a complex intermediate: gathering it under Partial(max) trips gloo's "Invalid other op value"
# internal assert instead.)


def main():
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    x = torch.randn(5, 6, 7, dtype=torch.float64)
    bad = []
    for how, shift in (("max", -1.0), ("min", 1.0)):
        # Per element one rank (at random) holds x, the other a value beyond it: the max (min) over the ranks is x.
        g = torch.Generator().manual_seed(1)
        holder = torch.randint(0, world, x.shape, generator=g)
        local = torch.where(holder == rank, x, x + shift * (0.25 + torch.rand(x.shape, generator=g, dtype=torch.float64)))
        dx = DTensor.from_local(local, mesh, [Partial(how)], run_check=False)
        for name, f in OPS:
            got = f(dx).full_tensor()
            err = (got - f(x)).abs().max().item()
            if rank == 0:
                print(f"{name:<22} input Partial({how}): max |sharded - single-device| = {err:.3g}")
            if err > 1e-9:
                bad.append((name, how))
    if rank == 0:
        print(f"MISMATCH: {len(bad)} of {2 * len(OPS)} op/partial pairs" if bad else "OK")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
