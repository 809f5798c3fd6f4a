"""megatron-core 0.19.2 (and 0.15.3): where megatron runs torch's own Adam (no Apex or Transformer Engine: it warns "Falling back to
Torch optimizers" and runs), its distributed optimizer cannot write a checkpoint (1) before its first step, or (2) on
a pipeline stage that holds no MoE layer of a model that has some.

(1) The inner torch optimizer has no state until its first step, and `get_parameter_state_dp_zero` (the legacy
format's `save_parameter_state`) reads each parameter's `exp_avg`: KeyError: 'exp_avg'; `state_dict` asserts one step
count among none. A checkpoint before training (a seed checkpoint) meets it, and so does one after an fp16 first step
its loss scaler skipped.
(2) `get_megatron_optimizer` aligns the parameter groups across all ranks (all_gather_object of their keys, so that
checkpoints load), so a rank without expert parameters gets an expert-parallel DistributedOptimizer with one empty
parameter group rather than a stub, and its `state_dict` asserts one step count among none
(distrib_optimizer.py:839; the Apex / TE branch allows none). Models whose first layers are dense (DeepSeek's
`first_k_dense_replace`, megatron's `moe_layer_freq`) put such a stage first.

Found by shardfuzz's megatron-ddp and megatron-tp targets (2026-12-06, `resume_after` 0, and a MoE model on pp 2 x
dp 2 x ep 2 with its attention block on stage 0 and its MoE block on stage 1).

This script: 2 ranks, a Linear in DDP with the distributed optimizer (Adam). Default: dp 2, the checkpoint's writes
(`save_parameter_state`, `state_dict`) before any step. `--dense-stage`: pp 2, rank 1's weight an expert parameter
(`allreduce = False`, as megatron marks them), rank 0's not; one step, then `state_dict`. `--fixed`: (1) the state
materialised inertly before the writes (a step over zero gradients at learning rate and weight decay 0, the step
counts back to zero), (2) an optimizer without parameters writes its parameter groups only.

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-distopt-checkpoint-before-first-step-or-on-a-dense-stage.py
[--dense-stage] [--fixed] (CPU, gloo). Prints CRASH (exit 1) or OK.
"""

import contextlib
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29554")
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
torch.cuda.Stream = lambda *args, **kwargs: NoStream()
torch.cuda.stream = lambda _stream: contextlib.nullcontext()

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402

DENSE_STAGE = "--dense-stage" in sys.argv

if "--fixed" in sys.argv:
    def materialised(method):
        def call(self, *args, **kwargs):
            inner = self.optimizer
            params = [q for g in inner.param_groups for q in g["params"]]
            if params and not inner.state:
                kept = [{k: g[k] for k in ("lr", "weight_decay")} for g in inner.param_groups]
                for g in inner.param_groups:
                    g["lr"], g["weight_decay"] = 0.0, 0.0
                for q in params:
                    q.grad = torch.zeros_like(q)
                inner.step()
                for g, k in zip(inner.param_groups, kept):
                    g.update(k)
                for q in params:
                    q.grad = None
                    inner.state[q]["step"] = torch.zeros_like(inner.state[q]["step"])
            return method(self, *args, **kwargs)

        return call

    state_dict = DistributedOptimizer.state_dict

    def state_dict_of_empty(self):
        if any(g["params"] for g in self.optimizer.param_groups):
            return state_dict(self)
        return {"optimizer": {"param_groups": [{k: v for k, v in g.items() if k != "params"}
                                               for g in self.optimizer.param_groups]}}

    DistributedOptimizer.get_parameter_state_dp_zero = materialised(DistributedOptimizer.get_parameter_state_dp_zero)
    DistributedOptimizer.state_dict = materialised(state_dict_of_empty)

parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2 if DENSE_STAGE else 1)
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)

with CudaOnCpu():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    if DENSE_STAGE and rank == 1:
        model.weight.allreduce = False  # (an expert's parameter, as megatron's expert layers mark them)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.01, use_distributed_optimizer=True), [ddp])
    try:
        if DENSE_STAGE:
            ddp.zero_grad_buffer()
            ddp(torch.randn(4, 8)).square().sum().backward()
            ddp.finish_grad_sync()
            opt.step()
        else:
            with tempfile.TemporaryDirectory() as path:
                opt.save_parameter_state(os.path.join(path, f"distrib_optim_{rank}.pt"))
        opt.state_dict()
    except Exception as e:  # noqa: BLE001
        print(f"rank {rank}: CRASH: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print(f"rank {rank}: the checkpoint's state written: OK", flush=True)
dist.destroy_process_group()
