"""megatron-core 0.19.2: with several distributed-optimizer instances and `overlap_grad_reduce`, gradients are
reduced twice, in every iteration, on every pipeline stage whose schedule starts the reduction itself.

With `num_distributed_optimizer_instances` > 1 and `overlap_grad_reduce`, `_ParamAndGradBucketGroup.start_grad_sync`
runs synchronously (param_and_grad_buffer.py:676-679: `async_op` only with one instance) and leaves
`grad_reduce_handle` None (:779). Megatron's pipeline schedules keep `no_sync` through the backward passes of every
stage but the first and then call `config.grad_sync_func`, each DDP chunk's `start_grad_sync` (schedules.py:2399,
2445-2446); Megatron-LM's training loop sets it whenever `--overlap-grad-reduce` is on with its default
`align_grad_reduce` (`--no-align-grad-reduce` unset). On those stages the backward hooks never count a gradient
ready, so the bucket group's `is_first_batch` is never cleared (`reset`, :292-296, clears it only once counts were
recorded), and `finish_grad_sync` (finalize_model_grads) starts the reduction again (:809-810, "If first batch, start
asynchronous communication here"), relying on the guard at :603-606 ("a no-op if in first batch and collective has
already been dispatched"), which tests `grad_reduce_handle is not None`: after a synchronous start it is None. So the
bucket is scaled by 1/dp again and reduce-scattered within the instance and all-reduced across instances a second
time, over a buffer whose own slice is already the average and whose other slices still hold this rank's unreduced
gradients: every step of every stage but the first trains on wrong gradients, silently. With one instance the
reduction is asynchronous, the handle is set and the guard works.

Found by shardfuzz's megatron-tp target (2026-11-30, campaign 184, the day the target learned Megatron's partial
distributed optimizer and set `grad_sync_func` as Megatron-LM does): dp 4 x pp 2, `zero_shard_group` 2 (two
instances), `overlap_comm`, bf16: the last stage's step-0 `lm_head` gradient 46 times its noise off; it passes with
one instance, without the overlap, without `grad_sync_func`, or at pp 1.

This script does what a stage that is not the first does, without a pipeline, for three iterations: backward under
`no_sync`, the schedule's `start_grad_sync`, then `finish_grad_sync`, on 4 ranks as 2 instances of 2. `--instances 1`
is the control (the guard works). `--fixed` makes a second start in the same iteration a no-op.

Run: torchrun --nproc_per_node 4 megatron-core-0.19.2-partial-distopt-overlapped-grads-reduced-twice-on-later-pipeline-stages.py
[--fixed | --instances 1] (CPU, gloo). Prints MISMATCH (exit 1) or OK.
"""

import contextlib
import os
import sys

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29552")
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
torch.cuda.Stream = lambda *args, **kwargs: NoStream()  # (the side stream of several optimizer instances)
torch.cuda.stream = lambda _stream: contextlib.nullcontext()

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402

instances = int(sys.argv[sys.argv.index("--instances") + 1]) if "--instances" in sys.argv else 2
parallel_state.initialize_model_parallel(num_distributed_optimizer_instances=instances)
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)

if "--fixed" in sys.argv:
    start, reset = _ParamAndGradBucketGroup.start_grad_sync, _ParamAndGradBucketGroup.reset

    def start_grad_sync(self, *args, **kwargs):
        if getattr(self, "_started", False):
            return
        self._started = True
        return start(self, *args, **kwargs)

    def reset_(self):
        self._started = False
        return reset(self)

    _ParamAndGradBucketGroup.start_grad_sync, _ParamAndGradBucketGroup.reset = start_grad_sync, reset_

with CudaOnCpu():
    torch.manual_seed(0)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=True,
                                               num_distributed_optimizer_instances=instances)
    model = DistributedDataParallel(config, ddp_config, torch.nn.Linear(8, 64, bias=False))
    ok = True
    for iteration in range(3):
        model.zero_grad_buffer()
        x = torch.randn(4, 8) * (rank + 1)  # (each rank's batch differs)
        with model.no_sync():  # the schedule's backward passes on a stage that is not the first
            model(x).sum().backward()
        model.start_grad_sync()  # then its config.grad_sync_func
        model.finish_grad_sync()  # finalize_model_grads

        # What the distributed optimizer will read: this rank's slice (within its instance) of the averaged gradients.
        xs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(xs, x)
        expected_grad = sum(torch.ones(64, 1) * xr.sum(0, keepdim=True) for xr in xs) / world
        bucket = model.bucket_groups[0].buckets[0]
        expected = torch.zeros_like(bucket.grad_data)
        begin, end = bucket.param_to_index[model.module.weight]
        expected[begin:end] = expected_grad.flatten()
        size = world // instances
        want = expected.view(size, -1)[rank % size]
        error = (bucket.grad_data.view(size, -1)[rank % size] - want).abs().max().item()
        ok = ok and error < 1e-5
        print(f"rank {rank} iteration {iteration}: reduced gradient slice off by {error:.4g} (largest entry "
              f"{want.abs().max().item():.4g}): {'OK' if error < 1e-5 else 'MISMATCH'}", flush=True)

dist.destroy_process_group()
sys.exit(0 if ok else 1)
