"""DeepSpeed 0.19.8 (found by shardfuzz, 2026-12-04): AutoTP training with `tensor_parallel.tp_overlap_comm: true`
crashes in the backward of an ordinary attention block.

With `tp_overlap_comm`, AutoTP's column-parallel layers run through `AsyncColumnParallel`, whose backward flattens the
output gradient and the saved input with `.view(-1, features)` (module_inject/layers.py:281). An attention projection
whose output is viewed per head and transposed (as every transformers attention does) receives a non-contiguous
gradient as soon as a micro-batch holds two sequences, and `.view` fails: "RuntimeError: view size is not compatible
with input tensor's size and stride (at least one dimension spans across two contiguous subspaces). Use .reshape(...)
instead." (apex fixed the same line of its own overlapped layer in NVIDIA/apex#1573.) With one sequence per
micro-batch it trains, and right (shardfuzz's deepspeed-zero target passes such cases).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-autotp-overlap-comm-noncontiguous-grad-crash.py [--fixed]
(CPU, gloo; tp 2, two sequences of 4 tokens). Released: every rank fails with that RuntimeError in the backward. With
`--fixed` (`reshape` in place of `view`): the gradients equal the same block's on one process, OK.
"""

import importlib
import math
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
import deepspeed.comm as ds_dist  # noqa: E402
from deepspeed.module_inject.layers import AsyncColumnParallel  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
HEADS, HEAD_DIM = 2, 4

if "--fixed" in sys.argv:

    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        grad_input = grad_output.matmul(weight)
        handle = ds_dist.all_reduce(grad_input.contiguous(), group=ctx.group, async_op=True)
        grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(input.reshape(-1, input.shape[-1]))
        grad_bias = grad_output.sum(0) if ctx.use_bias else None
        handle.wait()
        return None, grad_input, grad_weight, grad_bias

    AsyncColumnParallel.backward = staticmethod(backward)


class Attention(torch.nn.Module):
    """Causal self-attention as transformers writes it: q / k / v viewed per head and transposed."""

    def __init__(self):
        super().__init__()
        h = HEADS * HEAD_DIM
        self.q, self.k, self.v, self.o = (torch.nn.Linear(h, h) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, t.shape[-1] // HEAD_DIM, HEAD_DIM).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        a = torch.softmax(scores, dim=-1) @ v
        return self.o(a.transpose(1, 2).reshape(b, s, a.shape[1] * HEAD_DIM))


torch.manual_seed(0)
reference = Attention()
model = Attention()
model.load_state_dict(reference.state_dict())
x = torch.randn(2, 4, HEADS * HEAD_DIM)  # two sequences in the micro-batch
cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
       "zero_optimization": {"stage": 0}, "zero_allow_untested_optimizer": True,
       "tensor_parallel": {"autotp_size": WORLD, "tp_overlap_comm": True, "partition_config": {
           "use_default_specs": False, "layer_specs": [
               {"patterns": [r"[qkv]\.(weight|bias)$"], "partition_type": "column"},
               {"patterns": [r"o\.(weight|bias)$"], "partition_type": "row"}]}}}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg)
engine.backward(engine(x).pow(2).sum())  # the bug: AsyncColumnParallel.backward raises here
reference(x).pow(2).sum().backward()
expected = reference.q.weight.grad.chunk(WORLD, 0)[RANK]
error = float((engine.module.q.weight.grad - expected).abs().max())
errors = [torch.zeros(()) for _ in range(WORLD)]
dist.all_gather(errors, torch.tensor(error))
if RANK == 0:
    print("q.weight gradient, max |engine shard - one process| per rank:", ", ".join(f"{float(e):.3g}" for e in errors))
    print("OK" if max(float(e) for e in errors) < 1e-5 else "MISMATCH")
