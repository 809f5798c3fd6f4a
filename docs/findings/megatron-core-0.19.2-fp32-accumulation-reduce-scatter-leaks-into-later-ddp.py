"""megatron-core 0.19.2: one DDP's `reduce_scatter_with_fp32_accumulation` silently becomes every later DDP's
reduce-scatter in the process, and under `overlap_grad_reduce` their gradients are then never reduced.

`_ParamAndGradBucketGroup.__init__` (distributed/param_and_grad_buffer.py:247-249) does
`global dist_reduce_scatter_func; if ddp_config.reduce_scatter_with_fp32_accumulation: dist_reduce_scatter_func =
reduce_scatter_with_fp32_accumulation` and never sets it back. Every DistributedDataParallel built afterwards in the
same process, with the option off, reduce-scatters through the all-to-all implementation too. That implementation
does its fp32 sum and writes the rank's slice only in its handle's `wait()`; with `overlap_grad_reduce` and the
option off, `start_grad_sync` keeps the coalescing manager as the handle (param_and_grad_buffer.py:756-771), whose
wait never calls it: the distributed optimizer's slice keeps the rank's own unreduced gradient, silently.

A process that builds more than one DDP meets it: two models trained or evaluated side by side, or a test suite
(pytest runs many configurations in one process). Found by shardfuzz's megatron-ddp target (2026-11-30), whose rank
pools run many cases per process: a case after one with the option diverged with gradients 10^6 times its noise off,
and passed alone; the target now restores the function before every case. The fix here (`--fixed`) does the same
before each DDP is built; upstream would set the function per bucket group instead of in a module global.

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-fp32-accumulation-reduce-scatter-leaks-into-later-ddp.py [--fixed]
(CPU, gloo). Prints MISMATCH (exit 1) or OK.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29551")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class NoStream:
    """What megatron waits on before a reduction: on the CPU, work is done when it returns."""

    def wait_stream(self, _stream):
        pass

    def wait_event(self, _event):
        pass

    def synchronize(self):
        pass


class CudaOnCpu(TorchFunctionMode):
    """megatron-core allocates its buffers on 'cuda' and checks parameters' CUDA type names: the CPU instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


torch.cuda.current_device = lambda: "cpu"
torch.cuda.current_stream = lambda *args, **kwargs: NoStream()

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.distributed import param_and_grad_buffer  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402

parallel_state.initialize_model_parallel()
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)
released = param_and_grad_buffer.dist_reduce_scatter_func


def ddp(module, **options):
    if "--fixed" in sys.argv:
        param_and_grad_buffer.dist_reduce_scatter_func = released
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, **options)
    return DistributedDataParallel(config, ddp_config, module)


with CudaOnCpu():
    # Some other model of the process, whose DDP reduces with fp32 accumulation.
    ddp(torch.nn.Linear(8, 8, bias=False), reduce_scatter_with_fp32_accumulation=True)
    # The model under test: the plain reduce-scatter, overlapped with the backward pass.
    torch.manual_seed(0)
    model = ddp(torch.nn.Linear(8, 64, bias=False), overlap_grad_reduce=True)
    x = torch.randn(4, 8) * (rank + 1)  # (each rank's batch differs)
    model(x).sum().backward()
    model.finish_grad_sync()

    # What the distributed optimizer will read: this rank's slice of the reduced (averaged) gradient buffer.
    xs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(xs, x)
    expected_grad = sum(torch.ones(64, 1) * xr.sum(0, keepdim=True) for xr in xs) / world
    bucket = model.bucket_groups[0].buckets[0]
    expected = torch.zeros_like(bucket.grad_data)
    start, end = bucket.param_to_index[model.module.weight]
    expected[start:end] = expected_grad.flatten()
    mine = bucket.grad_data.view(world, -1)[rank]
    want = expected.view(world, -1)[rank]

error = (mine - want).abs().max().item()
ok = error < 1e-5
print(f"rank {rank}: reduced gradient slice off by {error:.4g} (largest entry {want.abs().max().item():.4g}): "
      f"{'OK' if ok else 'MISMATCH'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
