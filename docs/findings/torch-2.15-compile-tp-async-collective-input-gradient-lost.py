"""torch 2.15: under tensor parallelism, a compiled block fed by a vocabulary-parallel embedding gets no gradient to its
input, and the backward fails: "AttributeError: 'Tensor' object has no attribute '_local_tensor'" (in
Redistribute.backward, torch/distributed/tensor/_redistribute.py). A regression: torch 2.5.1 (`.venv-colossalai`) runs
this script OK. This is torchtitan's recipe: the embedding in
RowwiseParallel, each transformer block compiled (`torch.compile(block)`) after `parallelize_module`.

Setup: 2 ranks, nn.Embedding(13, 8) in RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()), then a
block x + down(up(x)) with ColwiseParallel up / RowwiseParallel down, the block compiled with backend="aot_eager"
(any backend: the failure is in AOTAutograd's runtime wrapper), one forward and backward. Eager, or with a Linear in
ColwiseParallel(output_layouts=Replicate()) in place of the embedding (`--linear`), it passes.

Root cause: the embedding's output is a _MaskPartial DTensor redistributed to Replicate by a functional all_reduce,
so its local tensor is an AsyncCollectiveTensor, and `to_local()` (RowwiseParallel's use_local_output) returns a view
of it: an AsyncCollectiveTensor whose grad_fn is _ToTorchTensorBackward. AOTAutograd resolves AsyncCollectiveTensor
inputs with `trigger_wait()` (torch/_functorch/_aot_autograd/frontend_utils.py `_resolve_input_async_collectives`,
and the runtime wrapper re-waits them), which returns the inner tensor without autograd history: the compiled
function's input is detached from the graph, `_ToTorchTensor.backward` receives None (the block's whole gradient to
its input, residual included, is lost), and the engine hands Redistribute.backward a materialised plain zero tensor,
where it expects a DTensor. Fix (`--fixed`, one of several possible): `to_local()` waits for an AsyncCollectiveTensor
local tensor itself, so the compiled block's input is a plain tensor with its autograd edge; the embedding's
gradient then equals the eager run's (the script compares its norm).

Found by shardfuzz's torch-tp target (2026-12-05) on its first case with the case field `train.compiled`
(`tests/python-compile/tp2-compiled-blocks-adamw-clip-f32.json`, tp 2, with or without sequence parallelism); with
the fix (known fix `torch-compile-async-collective-input-grad`) it passes. Under FSDP2 beside tensor parallelism
(torchtitan's 2-D layout, blocks compiled before fully_shard; torch-fsdp2 on
`tests/python-compile/dp2-tp2-compiled-blocks-zero2-adamw-clip-f32.json`) the same loss is **silent**: no crash, the
embedding's gradient is zero (norm error 1.0, every other tensor within its bounds), and the fix restores it.

Run: torchrun --nproc_per_node 2 torch-2.15-compile-tp-async-collective-input-gradient-lost.py [--fixed] [--linear]
(CPU, gloo). Prints CRASH, MISMATCH (the embedding's gradient differs from the eager run's) or OK on rank 0.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dist.init_process_group("gloo")
RANK = dist.get_rank()
MESH = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))

if "--fixed" in sys.argv:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import _api

    to_local = _api._ToTorchTensor.forward

    def forward(ctx, input, grad_placements):
        local = input._local_tensor
        if isinstance(local, AsyncCollectiveTensor):
            input = type(input)(local.trigger_wait(), input._spec, requires_grad=False)
        return to_local(ctx, input, grad_placements)

    _api._ToTorchTensor.forward = staticmethod(forward)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x):
        return x + self.down(self.up(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.pre, self.block = nn.Embedding(13, 8), nn.Linear(8, 8), Block()

    def forward(self, ids):
        x = self.embed(ids)
        if "--linear" in sys.argv:
            x = self.pre(x)
        return self.block(x)


def embedding_grad_norm(compiled):
    torch.manual_seed(0)
    model = Model()
    plan = {"block.up": ColwiseParallel(), "block.down": RowwiseParallel(),
            "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "pre": ColwiseParallel(output_layouts=Replicate())}
    parallelize_module(model, MESH, plan)
    if compiled:
        model.block = torch.compile(model.block, backend="aot_eager")
    ids = torch.randint(0, 13, (2, 4), generator=torch.Generator().manual_seed(1))
    model(ids).sum().backward()
    return float(model.embed.weight.grad.full_tensor().norm())


eager = embedding_grad_norm(False)
try:
    compiled = embedding_grad_norm(True)
    verdict = "OK" if abs(compiled - eager) <= 1e-5 * eager else f"MISMATCH: {compiled} against eager {eager}"
    verdict += f" (embedding gradient norm {compiled:.6f}, eager {eager:.6f})"
except Exception as e:
    verdict = f"CRASH: {type(e).__name__}: {e}"
if RANK == 0:
    print(verdict)
dist.destroy_process_group()
