#!/usr/bin/env python3
"""torch 2.4.1 and 2.5.1 (gloo, CPU): `reduce_scatter_tensor` with `ReduceOp.MAX` (MIN, PRODUCT) sums instead, on the
c10d call and on the functional collective alike; so a DTensor `Partial("max")` / `Partial("min")` /
`Partial("product")` (what `prod` over a sharded dim returns) redistributed to `Shard(d)` on a gloo mesh holds the
shards of the ranks' sum, silently (to `Replicate` it is right: all-reduce keeps
its op). torch 2.15 is right. gloo has no reduce-scatter of its own; ProcessGroupGloo simulates one with an
all-reduce whose chunk each rank keeps (pytorch/pytorch#118911, 2024-02), and in these releases that all-reduce
does not get the call's reduce op. NCCL is not affected. No upstream report of this symptom was found; the release
that fixed it was not pinned down here (2.5.1 wrong, 2.15.0 right).

Found by shardfuzz: campaign 212, torch-dtensor library ops under torch 2.4.1 on gloo ranks (`--python` to an
overlay of torch 2.4.1 on the Colossal-AI environment), where every divergence whose sources were `P(max)` or
`P(min)` redistributed to a shard (`special.ndtr`, `mT`, `cosh`, `polygamma` ...) passes under 2.15; reduced by hand
to the collective. Campaign 218 (2026-12-02) found it again, also as `prod` over a dim sharded with empty shards,
its `Partial(product)` output redistributed to a shard (the empty shards' product 1 added: 2.625 where 0.625 is
right).

Run: python3 torch-2.5.1-gloo-reduce-scatter-ignores-reduce-op.py   (spawns 2 gloo ranks on 127.0.0.1)
Prints MISMATCH (exit status 1) under 2.4.1 and 2.5.1, OK (exit status 0) under 2.15.0.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.tensor import DTensor, Partial, Shard, init_device_mesh
    except ImportError:  # torch 2.4 kept DTensor private
        from torch.distributed._tensor import DTensor, Partial, Shard, init_device_mesh

    x = torch.tensor([1.0, 5.0, 2.0, 7.0]) * (rank + 1)  # rank 0 [1, 5, 2, 7], rank 1 [2, 10, 4, 14]
    mesh = init_device_mesh("cpu", (world,))
    checks = {}
    for name, op, full in (("max", dist.ReduceOp.MAX, [2.0, 10.0, 4.0, 14.0]),
                           ("product", dist.ReduceOp.PRODUCT, [2.0, 50.0, 8.0, 98.0])):
        want = full[2 * rank:2 * rank + 2]  # the element-wise reduction, this rank's half
        out = torch.empty(2)
        dist.reduce_scatter_tensor(out, x, op=op)
        shard = DTensor.from_local(x.clone(), mesh, [Partial(name)], run_check=False).redistribute(mesh, [Shard(0)])
        checks[name] = (out.tolist(), shard.to_local().tolist(), want)
    results[rank] = checks
    dist.destroy_process_group()


def main():
    world, port = 2, 29000 + os.getpid() % 1000
    results = mp.Manager().dict()
    mp.spawn(rank_main, args=(world, port, results), nprocs=world)
    ok = True
    for rank in range(world):
        for name, (c10d, dtensor, want) in results[rank].items():
            print(f"rank {rank}: reduce_scatter_tensor({name.upper()}) {c10d}, Partial({name}) -> Shard(0) {dtensor}, "
                  f"expected {want}")
            ok &= c10d == want and dtensor == want
    verdict = "OK" if ok else "MISMATCH: gloo's reduce-scatter summed where MAX / PRODUCT was asked"
    print(f"torch {torch.__version__}: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
