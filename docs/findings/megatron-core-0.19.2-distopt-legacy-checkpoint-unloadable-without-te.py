"""megatron-core 0.19.2 (and 0.15.3): a distributed-optimizer checkpoint in the legacy format (`--ckpt-format torch`:
`optimizer.state_dict()` beside `save_parameter_state`) cannot be loaded into a fresh optimizer when megatron runs
torch's own Adam (no Transformer Engine or Apex: megatron warns "Falling back to Torch optimizers" and runs); and
behind that crash, the loaded optimizer's step count is one tensor shared by all its parameters, which torch's Adam
advances once per parameter: every update after the resume is bias-corrected for the wrong step, silently.

`DistributedOptimizer.load_state_dict` (distrib_optimizer.py:1022-1029) gives every parameter's inner state a `step`
as torch's Adam needs when neither Apex nor TE is installed: the same tensor object for all of them (`s["step"] =
step`; its HybridDeviceOptimizer branch right below clones it per parameter), and torch's `Optimizer.load_state_dict`
keeps that sharing. `load_parameter_state` then copies the checkpoint's tensors into each parameter's state through
`_set_main_param_and_optimizer_states` (:1217-1224), which takes every tensor of the inner state as a destination,
`step` included, and looks it up among the checkpoint's `param`, `exp_avg`, `exp_avg_sq`: KeyError: 'step'. With
fp32 parameters its first destination, the main parameter (a view of the model's parameter: the distributed
optimizer steps fp32 parameters in place), is copied into outside `torch.no_grad()` and fails first: "a view of a leaf
Variable that requires grad is being used in an in-place operation". With those copies made, the shared step shows:
a rank whose shard holds n parameters advances it by n per step (torch's `_foreach_add_(state_steps, 1)` over a list
holding it n times).

Found by shardfuzz's megatron-ddp target (2026-12-06, the day it learned `resume_after`: megatron's legacy checkpoint
saved after step 1 and loaded into a fresh model, DDP, optimizer and scheduler in megatron's order), dp 2 ZeRO-1, f32
and bf16: the crashes; with them fixed, f32 divergent from the first step after the resume (loss 15,445 times its
noise); with both fixes it passes.

This script: 2 ranks, two Linear layers in DDP with the distributed optimizer (Adam), one step, the legacy
checkpoint, a fresh model, DDP and optimizer loading it (megatron's load order), one more step on both, compared.
`--bf16`: bf16 parameters with fp32 main parameters. `--fixed-copy`: the copies under `torch.no_grad()` and of the
tensors the checkpoint has only (the load passes; the shared step remains: MISMATCH). `--fixed`: that and a step
tensor of its own for every parameter (OK).

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-distopt-legacy-checkpoint-unloadable-without-te.py [--bf16]
[--fixed-copy | --fixed] (CPU, gloo). Prints CRASH / MISMATCH (exit 1) or OK.
"""

import contextlib
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29553")
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

BF16 = "--bf16" in sys.argv
DTYPE = torch.bfloat16 if BF16 else torch.float32

if "--fixed" in sys.argv or "--fixed-copy" in sys.argv:
    def set_main_param_and_optimizer_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        state = self.optimizer.state[main_param]
        with torch.no_grad():
            main_param.copy_(tensors["param"])
            for key, value in tensors.items():
                if key != "param" and isinstance(value, torch.Tensor):
                    state[key].copy_(value)

    DistributedOptimizer._set_main_param_and_optimizer_states = set_main_param_and_optimizer_states

if "--fixed" in sys.argv:
    load_state_dict = DistributedOptimizer.load_state_dict

    def load_state_dict_own_steps(self, state_dict):
        load_state_dict(self, state_dict)
        for state in self.optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()

    DistributedOptimizer.load_state_dict = load_state_dict_own_steps

parallel_state.initialize_model_parallel()  # (with its gloo copies of the groups, which the legacy checkpoint uses)
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True,
                           bf16=BF16, params_dtype=DTYPE)


def fresh():
    torch.manual_seed(0)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True),
                                  torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 8)).to(DTYPE))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.01, bf16=BF16, params_dtype=DTYPE,
                                                 use_distributed_optimizer=True), [ddp])
    return ddp, opt


def step(ddp, opt, iteration):
    ddp.zero_grad_buffer()
    opt.zero_grad()
    torch.manual_seed(100 + 10 * iteration + rank)
    ddp(torch.randn(4, 8, dtype=DTYPE)).float().square().sum().backward()
    ddp.finish_grad_sync()
    opt.step()


with CudaOnCpu():
    ddp, opt = fresh()
    step(ddp, opt, 0)
    path = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(path)
    opt.save_parameter_state(os.path.join(path[0], "distrib_optim.pt"))
    if rank == 0:
        torch.save({"model": ddp.module.state_dict(), "optimizer": opt.state_dict()},
                   os.path.join(path[0], "model_optim_rng.pt"))
    dist.barrier()
    ddp2, opt2 = fresh()
    try:
        state = torch.load(os.path.join(path[0], "model_optim_rng.pt"), weights_only=False)
        ddp2.module.load_state_dict(state["model"])
        opt2.load_state_dict(state["optimizer"])
        opt2.load_parameter_state(os.path.join(path[0], "distrib_optim.pt"))
    except Exception as e:  # noqa: BLE001
        print(f"rank {rank}: CRASH: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    step(ddp, opt, 1)
    step(ddp2, opt2, 1)
    error = max((a.float() - b.float()).abs().max().item() for a, b in zip(ddp.module.parameters(),
                                                                              ddp2.module.parameters()))
    print(f"rank {rank}: the resumed run's parameters after step 2 differ by up to {error:.3g}: "
          f"{'OK' if error == 0 else 'MISMATCH'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if error == 0 else 1)
