"""megatron-core 0.19.2: megatron's non-distributed optimizers (FP32Optimizer, Float16OptimizerWithFloat16Params) cannot
be resumed from megatron's default checkpoint (`--ckpt-format torch_dist`) (1) with SGD, at all, and (2) with Adam, from
a checkpoint taken before the first step.

(1) `get_megatron_optimizer` gives only Adam and Lion an `init_state_fn` (optimizer/__init__.py:588, :611); SGD gets
`init_state_fn = None` (:624), and MegatronOptimizer keeps that None (optimizer.py:214). Megatron-LM's
`load_checkpoint` builds the state dict to load into with `optimizer.sharded_state_dict(..., is_loading=True)`, which
first calls `self.init_state_fn(self.optimizer, self.config)` (optimizer.py:1146 in Float16OptimizerWithFloat16Params,
:1362 in FP32Optimizer): TypeError: 'NoneType' object is not callable. SGD can use no other optimizer (the distributed
one is Adam-family only); the legacy format (`--ckpt-format torch`) loads. Megatron-LM main (2026-08) has the same code.
(2) Before its first step (a seed checkpoint, or a first fp16 step its loss scaler skipped) the inner Adam has no state,
so `sharded_state_dict` writes none; the fresh optimizer's `sharded_state_dict(..., is_loading=True)` runs
`init_state_fn` (Adam's moments) and asks the checkpoint for them: "optimizer.state.exp_avg.<param> from model not in
state dict". Materialising the state before the save is not enough: `sharded_state_dict` saves the common step count
only `if step:` (optimizer.py:1187, :1376), so a count of 0 is dropped and the load fails in Adam's `__setstate__`
(KeyError: 'step').

Found by shardfuzz's megatron-tp target (campaign 289, 2026-12-06, the day it learned megatron's distributed
checkpoint): (1) tp 2, bf16, SGD, resumed after step 1 or before the first; (2) bf16 Adam, dp 1, a seed checkpoint
(53 of the campaign's crashes); each passes with its fix.

This script: 2 ranks, two Linear layers in megatron's DDP with its FP32Optimizer (SGD; `--adam-seed`: Adam and the
checkpoint before any step), two steps (none with `--adam-seed`), the distributed checkpoint as Megatron-LM writes it,
a fresh model and optimizer loading it as Megatron-LM's `load_checkpoint` does, one more step on both, compared.
`--fixed`: (1) an SGD's `init_state_fn` initialising what torch's SGD holds (a zero momentum buffer where momentum is
not 0, nothing else); (2) before a save without state, the state materialised inertly (a step over zero gradients at
learning rate and weight decay 0, the step counts back to zero) and its step count saved (OK).

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-non-distributed-optimizer-torch-dist-resume.py [--adam-seed]
[--fixed] (CPU, gloo). Prints CRASH (exit 1) or OK / MISMATCH.
"""

import contextlib
import os
import queue
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29559")
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
torch.cuda.synchronize = lambda *args, **kwargs: None  # (the checkpoint writer waits for copies to the host)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402

from megatron.core import dist_checkpointing  # noqa: E402
from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy  # noqa: E402
from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper  # noqa: E402
from megatron.core.dist_checkpointing.strategies import filesystem_async  # noqa: E402
from megatron.core.transformer.utils import sharded_state_dict_default  # noqa: E402

# (A synchronous save puts and takes its write results in this process; megatron's default queue for them, a
# multiprocessing Manager's, spawns a process that would run this unguarded script again.)
filesystem_async._results_queue = queue.Queue()

from megatron.core import dist_checkpointing  # noqa: E402
from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy  # noqa: E402
from megatron.core.dist_checkpointing.strategies import filesystem_async  # noqa: E402
from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper  # noqa: E402
from megatron.core.transformer.utils import sharded_state_dict_default  # noqa: E402

# (A synchronous save puts and takes its write results in this process; megatron's default queue for them, a
# multiprocessing Manager's, spawns a process that would run this unguarded script again.)
filesystem_async._results_queue = queue.Queue()

parallel_state.initialize_model_parallel()
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)
METADATA = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
ADAM_SEED = "--adam-seed" in sys.argv


def fresh():
    torch.manual_seed(0)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(),
                                  torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 8)))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam" if ADAM_SEED else "sgd", lr=0.01, sgd_momentum=0.0,
                                                 weight_decay=0.0), [ddp])
    if "--fixed" in sys.argv:
        def init_sgd_state(inner, _config=None):
            for group in inner.param_groups:
                if group.get("momentum", 0) != 0:
                    for p in group["params"]:
                        inner.state[p].setdefault("momentum_buffer", torch.zeros_like(p.data))

        for o in getattr(opt, "chained_optimizers", [opt]):
            if o.init_state_fn is None:
                o.init_state_fn = init_sgd_state
            o.sharded_state_dict = materialising(o)
    return ddp, opt


def materialising(o):
    """`o.sharded_state_dict` that first materialises a missing state inertly and saves its step count of 0."""
    sharded_state_dict = o.sharded_state_dict

    def call(model_sharded_state_dict, is_loading=False, **kwargs):
        inner = o.optimizer
        fresh = not is_loading and not inner.state and o.init_state_fn is not None
        if fresh:
            params = [p for g in inner.param_groups for p in g["params"]]
            for p in params:
                p.grad = torch.zeros_like(p)
            kept = [(g["lr"], g["weight_decay"]) for g in inner.param_groups]
            for g in inner.param_groups:
                g["lr"], g["weight_decay"] = 0.0, 0.0
            inner.step()
            for g, (lr, wd) in zip(inner.param_groups, kept):
                g["lr"], g["weight_decay"] = lr, wd
            for state in inner.state.values():
                state["step"] = torch.zeros_like(state["step"])
            for p in params:
                p.grad = None
        state = sharded_state_dict(model_sharded_state_dict, is_loading, **kwargs)
        saved = state["optimizer"]["state"] if "optimizer" in state else state["state"]  # (Float16…, FP32Optimizer)
        steps = [s["step"] for s in inner.state.values() if "step" in s] if fresh else []
        if steps and "common_step" not in saved:
            saved["common_step"] = steps[0]
        return state

    return call


def sharded(ddp, opt, is_loading):
    metadata = {**METADATA, "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    state = {"model": sharded_state_dict_default(ddp.module, metadata=metadata)}
    state["optimizer"] = opt.sharded_state_dict(state, is_loading=is_loading, metadata=metadata)
    return state


def step(ddp, opt, iteration):
    ddp.zero_grad_buffer()
    opt.zero_grad()
    torch.manual_seed(100 + 10 * iteration + rank)
    ddp(torch.randn(4, 8)).square().sum().backward()
    ddp.finish_grad_sync()
    opt.step()


with CudaOnCpu():
    ddp, opt = fresh()
    if not ADAM_SEED:
        step(ddp, opt, 0)
        step(ddp, opt, 1)
    path = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(path)
    strategy = FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(),
                                                parallel_state.get_data_parallel_group(with_context_parallel=True))
    dist_checkpointing.save(sharded(ddp, opt, False), path[0], strategy, content_metadata=METADATA)
    ddp2, opt2 = fresh()
    try:
        state = dist_checkpointing.load(sharded(ddp2, opt2, True), path[0])
        ddp2.module.load_state_dict(state["model"])
        opt2.load_state_dict(state["optimizer"])
    except Exception as e:  # noqa: BLE001
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"rank {rank}: CRASH: {type(e).__name__}: {e} (at {os.path.basename(where.filename)}:{where.lineno}, "
              f"{where.name}: {where.line})", flush=True)
        sys.exit(1)
    step(ddp, opt, 2)
    step(ddp2, opt2, 2)
    error = max((a - b).abs().max().item() for a, b in zip(ddp.module.parameters(), ddp2.module.parameters()))
    print(f"rank {rank}: the resumed run's parameters after step 3 differ by up to {error:.3g}: "
          f"{'OK' if error == 0 else 'MISMATCH'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if error == 0 else 1)
