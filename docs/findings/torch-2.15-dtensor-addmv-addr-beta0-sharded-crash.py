"""torch 2.15 DTensor: addmv and addr with beta=0 crash when the result is sharded.

torch.addmv(input, mat, vec, beta=0) ignores `input`'s values (beta = 0), but the CPU kernel still checks
its shape against the mv result. With `mat` Shard(0) (row-parallel, the plain layout) and `input` and `vec`
replicated, each rank's local mv has its share of the rows, and the local addmv raises
    RuntimeError: size mismatch, got input (5), mat (3x10), vec (10).
With any beta != 0, DTensor shards `input` like the result and the same call is right. Our reading: the
sharding is derived from PyTorch's own decomposition of addmv (torch/_decomp/decompositions.py
`_addmv_impl`), which returns `alpha * mv(mat, vec)` without touching `input` when beta == 0, so nothing asks
for `input` to follow the result; the local op is the real aten.addmv, which does look at it. torch 2.5.1
has no sharding strategy for addmv (a clean refusal). addr (the outer-product update) does the same with
vec1 Shard(0): beta 1 and 0.5 are right, beta 0 raises "The expanded size of the tensor (3) must match the
existing size (5)" (checked by hand after the addmv finding). Found by shardfuzz on 2026-11-26 (torch-dtensor,
`fuzz --time 12m --seed 81`: OpInfo addmv sample 1 with the sample edit `zero` turning beta 0.2 into 0.0;
minimized by `shardfuzz report`; reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-addmv-addr-beta0-sharded-crash.py
Prints one line per op and beta; exits 1 when any crashes or differs from single-device torch.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    f64 = torch.float64
    cases = [  # (name, op, input, its argument pair, the placements of that pair)
        ("addmv", torch.addmv, torch.randn(5, dtype=f64), (torch.randn(5, 10, dtype=f64), torch.randn(10, dtype=f64))),
        ("addr", torch.addr, torch.randn(5, 3, dtype=f64), (torch.randn(5, dtype=f64), torch.randn(3, dtype=f64))),
    ]
    bad = 0
    for name, op, inp, (a, b) in cases:
        for beta in (1.0, 0.5, 0.0):
            try:
                y = op(distribute_tensor(inp, mesh, [Replicate()]), distribute_tensor(a, mesh, [Shard(0)]),
                       distribute_tensor(b, mesh, [Replicate()]), beta=beta)
                ok = torch.allclose(y.full_tensor(), op(inp, a, b, beta=beta))
                outcome = f"{y.placements} " + ("OK" if ok else "MISMATCH")
            except RuntimeError as e:
                ok, outcome = False, f"CRASH: {str(e).splitlines()[0]}"
            bad += not ok
            if rank == 0:
                print(f"{name}(input R, {tuple(a.shape)} Shard(0), {tuple(b.shape)} R, beta={beta}): {outcome}")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
