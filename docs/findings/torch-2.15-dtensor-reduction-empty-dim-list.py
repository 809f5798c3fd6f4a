"""torch 2.15 DTensor: a reduction over `dim=[]` (ATen: every dim) reduces nothing, and max-like gradients turn NaN.

In ATen an empty dim list means "reduce over every dim": x.sum(dim=[], keepdim=True) of a [4, 2] tensor is
its [1, 1] total. DTensor's `_infer_reduction_dims` (torch/distributed/tensor/_ops/_math_ops.py) maps `[]` to
"all dims" only for 0-d tensors; otherwise it returns the empty list, so the sharding rule reduces over no
dim at all:
  - keepdim=True: each rank reduces its own shard and the [1, 1] result is marked Shard(0) (sum of a [4, 2]
    tensor sharded on dim 0 over 2 ranks: 6.0 where 28.0 is right). sum, mean, nansum, amax, var, std,
    logsumexp, linalg.vector_norm.
  - keepdim=False: IndexError ("list index out of range"), e.g. sum, count_nonzero.
Autograd itself reaches it: the backward of a full amax / amin / linalg.vector_norm(ord=inf) counts the
elements equal to the result with sum(dim=[], keepdim=True). When the extreme element lies on any rank but
the first, the count is wrong and the whole gradient comes back NaN (inf at the extreme), silently.

torch 2.5.1 has the same rule: sum, mean, var and vector_norm are wrong there too (the other ops had no
sharding strategy then).

Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --corpus corpus --time 12m --seed 83` and
`--seed 85`: NaN gradients of `norm.inf` and `amin`; minimized by `shardfuzz report`, traced to the sum with
an empty dim list and reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-reduction-empty-dim-list.py
Prints one line per case (MISMATCH, ERROR or OK); exits 1 unless every one is OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

FORWARD = {
    "sum(dim=[], keepdim=True)": lambda t: t.sum(dim=[], keepdim=True),
    "mean(dim=[], keepdim=True)": lambda t: t.mean(dim=[], keepdim=True),
    "amax(dim=[], keepdim=True)": lambda t: t.amax(dim=[], keepdim=True),
    "var(dim=[], keepdim=True)": lambda t: t.var(dim=[], keepdim=True),
    "linalg.vector_norm(dim=[], keepdim=True)": lambda t: torch.linalg.vector_norm(t, dim=[], keepdim=True),
    "sum(dim=[])": lambda t: t.sum(dim=[]),
}

BACKWARD = {
    "amax": torch.amax,
    "amin": torch.amin,
    "linalg.vector_norm(ord=inf)": lambda t: torch.linalg.vector_norm(t, float("inf")),
}


def forward_cases(mesh):
    x = torch.arange(8, dtype=torch.float64).reshape(4, 2)
    for name, f in FORWARD.items():
        expected = f(x)
        try:
            y = f(distribute_tensor(x, mesh, [Shard(0)]))
            got = y.full_tensor()
            ok = got.shape == expected.shape and torch.allclose(got, expected)
            yield ok, f"{name} of x[4, 2] Shard(0): {'OK' if ok else 'MISMATCH'}: {got.flatten().tolist()} " \
                      f"marked {y.placements}, expected {expected.flatten().tolist()}"
        except Exception as e:  # noqa: BLE001 - any exception is the outcome being reported
            yield False, f"{name} of x[4, 2] Shard(0): ERROR {type(e).__name__}: {str(e).splitlines()[0][:90]}"


def backward_cases(mesh):
    for name, f in BACKWARD.items():
        x = torch.ones(4, 2, dtype=torch.float64)
        x[3, 1] = -6.0 if name == "amin" else 6.0  # the extreme element, on the second rank
        reference = x.clone().requires_grad_()
        f(reference).backward()
        xd = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
        try:
            f(xd).redistribute(mesh, [Replicate()]).backward()
        except Exception as e:  # noqa: BLE001 - any exception is the outcome being reported
            yield False, f"{name} of x[4, 2] Shard(0), gradient: ERROR {type(e).__name__}: {str(e).splitlines()[0][:90]}"
            continue
        got = xd.grad.full_tensor()
        ok = torch.allclose(got, reference.grad)
        yield ok, f"{name} of x[4, 2] Shard(0), extreme on rank 1, gradient: {'OK' if ok else 'MISMATCH'}: " \
                  f"{got.flatten().tolist()}, expected {reference.grad.flatten().tolist()}"


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    bad = 0
    for ok, line in [*forward_cases(mesh), *backward_cases(mesh)]:
        bad += not ok
        if rank == 0:
            print(line, flush=True)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
