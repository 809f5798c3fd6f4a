#!/usr/bin/env python3
"""torch 2.4.1 / 2.5.1 DTensor: casting a `Partial(sum)` DTensor to an integer dtype (`.int()`, `.long()`,
`.to(torch.int64)`) keeps the placement Partial, so each rank truncates its own summand and the reduction adds the
truncated parts: a value of 1.2 held as 0.6 + 0.6 on two ranks casts to 0 + 0 = 0 where single-device torch gives 1.
Silent. torch 2.15 reduces first (the output is Replicate) and is right. The float casts are the same rule with
smaller errors (torch-2.15-dtensor-bfloat16-cast-of-partial.py: bf16 still keeps Partial in 2.15).

Found by shardfuzz: campaign 217 (torch-dtensor library ops under torch 2.4.1) listed `int` / `long` OpInfo entries
with a `Partial` input among its divergences; written by hand from that, checked under 2.4.1, 2.5.1 and 2.15 (the
campaign's own cases were lost with its directory). No upstream report of it was found; the fixing release was not
pinned down (2.5.1 wrong, 2.15.0 right).

Run: torchrun --nproc_per_node 2 torch-2.5.1-dtensor-integer-cast-of-partial.py
MISMATCH (exit status 1) under torch 2.4.1 and 2.5.1, OK (0) under 2.15.0.
"""
import sys

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor, Partial, init_device_mesh
except ImportError:  # torch < 2.5 kept DTensor private
    from torch.distributed._tensor import DTensor, Partial, init_device_mesh

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
full = torch.tensor([1.2, 2.5, -1.8, 7.0], dtype=torch.float64)
x = DTensor.from_local(full / world, mesh, [Partial()], run_check=False)  # each rank holds an equal summand
ok = True
for name, cast in (("int()", lambda t: t.int()), ("long()", lambda t: t.long()),
                   ("to(int64)", lambda t: t.to(torch.int64))):
    out = cast(x)
    got, expected = out.full_tensor(), cast(full)
    ok &= torch.equal(got, expected)
    if rank == 0:
        print(f"Partial(sum) of {full.tolist()} .{name}: {got.tolist()} (placements {tuple(out.placements)}), "
              f"single device {expected.tolist()}")
if rank == 0:
    print(f"torch {torch.__version__}: " + ("OK" if ok else "MISMATCH: the integer cast truncated each rank's summand"))
dist.destroy_process_group()
sys.exit(0 if ok else 1)
