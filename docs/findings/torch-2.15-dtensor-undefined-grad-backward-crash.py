"""torch 2.15 DTensor: backward crashes where an op leaves an input's gradient undefined.

Some ops define no gradient for an input: `linalg.vector_norm` / `linalg.norm` with ord=0 (single-device
torch leaves x.grad None), and torch.cat for a legacy empty input (shape [0], which cat accepts beside
inputs of any shape and skips). When that input reaches the op through one of DTensor's autograd
functions, autograd materializes the undefined gradient as zeros for that function's backward, and the
zeros are a plain torch.Tensor: `DTensor.from_local`'s backward (`_FromTorchTensor.backward`,
torch/distributed/tensor/_api.py) then raises
    AttributeError: 'Tensor' object has no attribute 'placements'
and `redistribute`'s backward (`Redistribute.backward`, _redistribute.py) raises
    AttributeError: 'Tensor' object has no attribute '_local_tensor'.
Both functions already return None for a None gradient; they never see one, because neither turns off
grad materialization (ctx.set_materialize_grads(False)) nor accepts a plain tensor (our reading). The
forward is right. In torch 2.15 the second and third case crash (the first passes: from_local straight
into the norm); torch 2.5.1 crashes in all three ('placements', '_spec', 'placements').
Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --time 12m --seed 81`: OpInfo cat sample 5 with
Partial inputs on a mesh [3], and linalg.norm.subgradients_at_zero sample 31 sharded and redistributed
to Replicate; both minimized by `shardfuzz report`; reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-undefined-grad-backward-crash.py
Prints, per case, CRASH or OK; exits 1 when any case crashes or gives a gradient other than one device's.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

F64 = torch.float64


def norm_ord0_from_local(mesh):
    x = DTensor.from_local(torch.arange(1.0, 5.0, dtype=F64, requires_grad=True), mesh, [Replicate()])
    torch.linalg.vector_norm(x, 0).backward()


def norm_ord0_after_redistribute(mesh):
    x = DTensor.from_local(torch.arange(1.0, 3.0, dtype=F64), mesh, [Shard(0)]).requires_grad_()
    torch.linalg.vector_norm(x.redistribute(mesh, [Replicate()]), 0).backward()


def cat_legacy_empty(mesh):
    empty = DTensor.from_local(torch.empty(0, dtype=F64, requires_grad=True), mesh, [Replicate()])
    x = DTensor.from_local(torch.ones(5, 5, dtype=F64), mesh, [Replicate()]).requires_grad_()
    y = torch.cat([empty, x])
    y.sum().backward()
    if not torch.equal(x.grad.full_tensor(), torch.ones(5, 5, dtype=F64)):
        raise AssertionError("MISMATCH: wrong gradient of the non-empty input")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    failed = 0
    if rank == 0:
        print("torch", torch.__version__)
    for case in (norm_ord0_from_local, norm_ord0_after_redistribute, cat_legacy_empty):
        try:
            case(mesh)
            outcome = "OK (single-device torch: no error)"
        except (AttributeError, AssertionError) as e:
            failed += 1
            outcome = f"CRASH: {type(e).__name__}: {e}"
        if rank == 0:
            print(f"{case.__name__:30} {outcome}")
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
