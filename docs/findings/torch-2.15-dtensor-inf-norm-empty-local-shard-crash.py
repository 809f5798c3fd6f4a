"""torch 2.5.1 to 2.15: the infinity norm of a DTensor crashes on every rank whose local shard is empty, so
`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=inf)` (foreach or not) over an FSDP2 model
with a parameter of fewer rows than data-parallel ranks fails in its first step:

    RuntimeError: linalg.vector_norm cannot compute the inf norm on an empty tensor because the operation does not
    have an identity          (foreach=True: "_foreach_norm cannot compute the infinity norm on an empty tensor")

on the ranks holding no row of it, while the others wait in the norm's all-reduce. The same gradients clip by their L1
and L2 norms, and one device clips them by the infinity norm.

Root cause: DTensor computes a vector norm (`aten.linalg_vector_norm`, `aten._foreach_norm`) on each rank's local
shard and reduces the partial results (`_NormPartial`: a sum of p-th powers, or for ord ±inf a max / min). FSDP2
shards each parameter along dim 0 as torch.chunk does, so a [1, 8] weight on 2 ranks leaves rank 1 an empty local
shard; the local L1 / L2 norm of an empty tensor is 0, the identity of their reduction, but max |x| over no element
has no value and the kernel refuses it. DTensor's norm rule does not handle an empty local shard. Fix (`--fixed`): an
empty local shard enters a full reduction of order inf as 0 (of -inf as inf), the identity of the reduction over |x|;
the clipped gradients then equal one device's. torchrec filters empty gradients out of its own inf-norm clipping for
the same reason (pytorch/torchrec#3809, #3891); torch's DTensor norm itself does not.

The op itself, `torch.linalg.vector_norm(d, inf)` of a DTensor with an empty shard, was found crashing by shardfuzz's
torch-dtensor op cases on 2026-11-26 (torch-2.15-dtensor-max-reductions-empty-shard-crash.py, beside max / amax /
argmax); this script shows the training path users meet it on, gradient clipping over FSDP2, and `_foreach_norm`
(foreach clipping) failing the same way.

Found by shardfuzz's torch-fsdp2 target (2026-12-06, campaign 278) on a case with the new case field
`train.clip_norm_type` "inf" (`tests/python-clip-norm/dp2-zero3-ffn1-sgd-clip-inf-empty-shard-f32.json`: ffn 1 on
2 ranks); with the fix (known fix `torch-dtensor-inf-norm-empty-shard`) it passes.

Run: torchrun --nproc_per_node 2 torch-2.15-dtensor-inf-norm-empty-local-shard-crash.py [--fixed] [--foreach]
(CPU, gloo). Prints CRASH, MISMATCH or OK on rank 0. On torch 2.5.1 (whose FSDP2 needs CUDA) it checks the DTensor
norm alone, which crashes the same way.
"""

import copy
import math
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

try:
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
except ImportError:  # torch 2.4 / 2.5
    from torch.distributed._tensor import DTensor, Shard, distribute_tensor

dist.init_process_group("gloo")
RANK = dist.get_rank()
FOREACH = "--foreach" in sys.argv


def fix():
    """Empty local shards enter a full reduction of order ±inf as the identity (0 for max |x|, inf for min |x|)."""
    handlers = DTensor._op_dispatcher._custom_op_handlers
    foreach = torch.ops.aten._foreach_norm.Scalar

    def identity_shard(t, order):
        if isinstance(t, DTensor) and abs(order) == math.inf and t.to_local().numel() == 0:
            local = torch.full([1] * t.dim(), 0.0 if order > 0 else math.inf, dtype=t.dtype)
            return DTensor(local, t._spec, requires_grad=False)
        return t

    def handler(op_call, args, kwargs):
        order = args[1] if len(args) > 1 else kwargs.get("ord", kwargs.get("scalar", 2))
        if (op_call is foreach or (len(args) < 3 and kwargs.get("dim") is None)) and isinstance(order, (int, float)):
            first = [identity_shard(t, order) for t in args[0]] if op_call is foreach else identity_shard(args[0], order)
            args = (first, *args[1:])
        own = handlers.pop(op_call)
        try:
            return op_call(*args, **kwargs)
        finally:
            handlers[op_call] = own

    for op in (torch.ops.aten.linalg_vector_norm.default, foreach):
        handlers[op] = handler


if "--fixed" in sys.argv:
    fix()


def dtensor_norm():
    """The DTensor norm alone: a [1, 4] tensor sharded by rows over 2 ranks (rank 1's shard empty)."""
    t = torch.tensor([[3.0, -1.0, 2.0, 0.5]])
    d = distribute_tensor(t, init_device_mesh("cpu", (dist.get_world_size(),)), [Shard(0)])
    got = torch.linalg.vector_norm(d, math.inf).full_tensor()
    return "OK" if torch.equal(got, torch.linalg.vector_norm(t, math.inf)) else f"MISMATCH: inf norm {got.item()} != 3.0"


def fsdp2_clip(fully_shard):
    """An FSDP2 model whose second weight is [1, 8] clipped by its infinity norm, against the same model on one
    device (every rank runs the same batch, so FSDP2's averaged gradients equal one device's)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    ref = copy.deepcopy(model)
    fully_shard(model)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    for m in (model, ref):
        m(x).square().sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, norm_type=math.inf, foreach=FOREACH)
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05, norm_type=math.inf)
    norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
    grads = [(p.grad.full_tensor(), q.grad) for p, q in zip(model.parameters(), ref.parameters())]
    if not torch.allclose(norm, want) or not all(torch.allclose(a, b, atol=1e-7) for a, b in grads):
        return f"MISMATCH: inf norm {norm.item()} against one device's {want.item()}"
    return "OK"


try:
    try:
        from torch.distributed.fsdp import fully_shard  # torch 2.6 and later (CPU FSDP2)
        verdict = fsdp2_clip(fully_shard)
    except ImportError:
        verdict = dtensor_norm()
except Exception as e:
    verdict = f"CRASH on rank {RANK}: {type(e).__name__}: {str(e).splitlines()[0]}"
    print(verdict, flush=True)
    # (the other rank waits in the norm's all-reduce for the rank that raised)
    import os

    os._exit(1)
if RANK == 0:
    print(verdict)
dist.destroy_process_group()
