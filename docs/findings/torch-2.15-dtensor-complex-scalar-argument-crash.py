"""torch 2.15 DTensor: any op with a complex Python scalar argument crashes, and so does polar's backward.

torch.pow(z, 2+1j), z.masked_fill(mask, 1j), z.index_fill(0, idx, 1j), torch.lerp(z, w, 0.5+0j) on a
complex DTensor raise "RuntimeError: unhashable type: 'complex'" for every placement, Replicate included.
The error comes from DTensor's C++ dispatch path (the traceback has no Python frame below the call), before
any sharding rule runs; the same ops with a real scalar (pow(z, 2.0), masked_fill(mask, 1.0)) work, and so
do add/sub with a complex scalar (Python wraps those scalars into tensors). Autograd reaches it by itself:
the backward of torch.polar(abs, angle) uses such an op, so any DTensor program through polar fails in
backward. Single-device torch runs all of these.

torch 2.5.1 cannot be compared on gloo: distribute_tensor of a complex tensor already fails there ("Invalid
scalar type").

Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --corpus corpus --time 12m --seed 85`: `polar`
crashes in backward, with every input replicated; reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-complex-scalar-argument-crash.py
Prints one line per op and placement (CRASH, MISMATCH or OK); exits 1 unless every one is OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def cases():
    """(name, f(z, idx)) pairs; idx is a replicated index tensor of the same kind as z."""
    return {
        "pow(z, 2+1j)": lambda z, idx: torch.pow(z, 2 + 1j),
        "masked_fill(z, z.real > 0, 1j)": lambda z, idx: z.masked_fill(z.real > 0, 1j),
        "index_fill(z, 0, idx, 1j)": lambda z, idx: z.index_fill(0, idx, 1j),
        "lerp(z, 2 z, 0.5+0j)": lambda z, idx: torch.lerp(z, z * 2, 0.5 + 0j),
        "pow(z, 2.0) (real scalar)": lambda z, idx: torch.pow(z, 2.0),
        "masked_fill(z, z.real > 0, 1.0) (real scalar)": lambda z, idx: z.masked_fill(z.real > 0, 1.0),
    }


def polar_backward(mesh, placements):
    magnitude, angle = torch.rand(4, dtype=torch.float64) + 0.5, torch.randn(4, dtype=torch.float64)
    m = distribute_tensor(magnitude, mesh, placements).requires_grad_()
    a = distribute_tensor(angle, mesh, placements).requires_grad_()
    torch.view_as_real(torch.polar(m, a)).sum().backward()
    ref_m, ref_a = magnitude.clone().requires_grad_(), angle.clone().requires_grad_()
    torch.view_as_real(torch.polar(ref_m, ref_a)).sum().backward()
    return torch.allclose(m.grad.full_tensor(), ref_m.grad) and torch.allclose(a.grad.full_tensor(), ref_a.grad)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    z = torch.randn(4, dtype=torch.complex128)
    idx = torch.tensor([0, 2])
    bad = 0
    for placements in ([Replicate()], [Shard(0)]):
        runs = [(name, lambda f=f: torch.allclose(
                    f(distribute_tensor(z, mesh, placements), distribute_tensor(idx, mesh, [Replicate()])).full_tensor(),
                    f(z, idx)))
                for name, f in cases().items()]
        runs.append(("polar(magnitude, angle), backward", lambda: polar_backward(mesh, placements)))
        for name, run in runs:
            try:
                outcome = "OK" if run() else "MISMATCH"
            except RuntimeError as e:
                outcome = "CRASH: " + str(e).splitlines()[0][:100]
            bad += outcome != "OK"
            if rank == 0:
                print(f"{placements[0]!s:15} {name}: {outcome}", flush=True)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
