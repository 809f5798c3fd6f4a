"""torch 2.15 DTensor: a Partial(sum) gradient flowing back into a Partial(avg) / Partial(max) tensor crashes.

A reduction over a sharded dim leaves its result Partial of the reduction's kind: `mean` → Partial(avg),
`amax` → Partial(max), `sum` → Partial(sum). Training code then redistributes it (to Replicate here) and
goes on. In the backward, `Redistribute.backward` (`_redistribute_backward`, torch/distributed/tensor/
_redistribute.py) takes the incoming gradient back to the forward input's placements. It normalises
Shard → Partial and Replicate → Partial to Replicate, but not Partial → Partial of another kind, and the
gradient of a Replicate tensor used in a matmul with a sharded contraction arrives Partial(sum). So it asks
`redistribute_local_tensor` for Partial(sum) → Partial(avg), which raises (since pytorch/pytorch#172041,
"Ban redistribute from one partial type to another"; before it, the same call was a silent no-op that
relabelled the sum as an average).

A gradient is a sum of contributions whatever the forward's reduction was: taking it to Replicate (as
the code already does for the other two cases, and as `from_local`'s backward does since #173153) gives the
right gradient. The control case, `sum` (Partial(sum) forward, Partial(sum) gradient), runs and matches.

Other releases: torch 2.9.1 (`scripts/setup-python.sh --env torch29 torch==2.9.1`) runs all three and returns
wrong gradients for all three, the `sum` control included (largest differences 0.38, 0.24, 2.27 here): that
release's backward relabels a Partial gradient without reducing it, the silent skip that
pytorch/pytorch#167686 removed. torch 2.5.1 cannot run the script (gloo has no AVG reduction; `amax` has no
sharding strategy).

Found on 2026-11-28 by a 10-minute shardfuzz campaign on torch-dtensor (`--seed 139`) with the new case
field `library_op.cotangent` (the backward's cotangent entering at the op's output as a partial or sharded
DTensor): `mean`, `nansum`, `prod`, `linalg.norm` and `vstack` crashed with "Redistribution from one partial
type (P(sum)) to another (P(avg)) is unsupported" and its P(max), P(product), _NormP siblings. Reduced by
hand to the plain training pattern below, where no cotangent is chosen: autograd makes the Partial(sum)
gradient itself.

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-partial-grad-through-avg-or-max-partial-crash.py
Prints, per reduction, the forward placement and CRASH / MISMATCH / OK against the single-device gradient;
exits 1 unless every case is OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

REDUCTIONS = {
    "mean": lambda x: x.mean(dim=1, keepdim=True),
    "amax": lambda x: x.amax(dim=1, keepdim=True),
    "sum (control)": lambda x: x.sum(dim=1, keepdim=True),
}


def single_device(reduce, x_full, w_full):
    x = x_full.clone().requires_grad_()
    (reduce(x) @ w_full).sum().backward()
    return x.grad


def sharded(reduce, mesh, x_full, w_full):
    """x and w split on their feature dim; the reduction's result made Replicate before the matmul."""
    x = distribute_tensor(x_full, mesh, [Shard(1)]).requires_grad_()
    w = distribute_tensor(w_full, mesh, [Shard(1)])
    m = reduce(x)
    placement = m.placements[0]
    loss = (m.redistribute(mesh, [Replicate()]) @ w).sum()
    loss.backward()
    return placement, x.grad.full_tensor()


def main():
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank = dist.get_rank()
    torch.manual_seed(0)
    x_full = torch.randn(4, 6, dtype=torch.float64)
    w_full = torch.randn(1, 6, dtype=torch.float64)
    failed = False
    for name, reduce in REDUCTIONS.items():
        want = single_device(reduce, x_full, w_full)
        try:
            placement, got = sharded(reduce, mesh, x_full, w_full)
            err = (got - want).abs().max().item()
            verdict = f"{placement}: " + ("OK" if err <= 1e-12 else f"MISMATCH (largest difference {err:.3e})")
            failed |= err > 1e-12
        except Exception as e:  # noqa: BLE001 - the crash is what this shows
            verdict = f"CRASH {type(e).__name__}: {str(e)[:160]}"
            failed = True
        if rank == 0:
            print(f"{name:14s} {verdict}", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
