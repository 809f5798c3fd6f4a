"""megatron-core 0.19.2 (and 0.15.3): where megatron runs torch's own Adam (no Transformer Engine or Apex: megatron
warns "Falling back to Torch optimizers" and runs), the distributed optimizer cannot be resumed from megatron's default
checkpoint (`--ckpt-format torch_dist`, the optimizer state `dp_reshardable`); and once it can, the resumed run
trains with the wrong Adam step count, silently.

1. A fresh process cannot build the state dict to load into: Megatron-LM's `load_checkpoint` asks the fresh optimizer
   for `sharded_state_dict(..., is_loading=True)`, which calls `state_dict()` (distrib_optimizer.py:1511), which
   without Apex/TE collects the step count of every parameter's inner state and asserts there is exactly one
   (:836-839): a fresh optimizer has no state, so `assert len(steps) == 1` fails on every resume, not only on a
   checkpoint taken before the first step. (Other projects materialise the state first with megatron's own
   `_init_optimizer_states_with_dummy_values()` to get past it.)
2. With the state materialised and the fp32 copy fixed (the copy into a main parameter, a view of the model's, runs
   outside no_grad: the same crash as the legacy format's, see
   megatron-core-0.19.2-distopt-legacy-checkpoint-unloadable-without-te.py), the checkpoint's step count is lost:
   `sharded_param_state_dp_reshardable` keeps each parameter's `step` as a LocalNonpersistentObject (:1780-1784, the
   live tensor of the optimizer building the state dict, never read from the checkpoint); `load_state_dict` sets
   the checkpoint's step (:1024-1032), and `load_parameter_state_from_dp_reshardable` then copies the non-persistent
   one over it through `_set_main_param_and_optimizer_states` (:2085-2094), where the fully-reshardable and
   model-space loaders skip `step` (:2108, :2390). The resumed optimizer counts from the materialising step, not from
   the checkpoint; and `load_state_dict` shares one step tensor among all parameters (the legacy format's bug too),
   which torch's Adam advances once per parameter. Every update after the resume is bias-corrected for the wrong step.

Found by shardfuzz's megatron-ddp target (2026-12-06, the day it learned megatron's distributed checkpoint), dp 2
ZeRO-1 f32, resume after step 1: the crash; with the known fixes of the legacy format's bugs applied, `loss/step2`
divergent (15,445 times its noise without the shared-step fix, and with it still 32,108 times, from the overwritten
step); with the dp_reshardable loader skipping `step` as the others do, it passes.

This script: 2 ranks, two Linear layers in DDP with the distributed optimizer (Adam), two steps, megatron's
distributed checkpoint (`dist_checkpointing.save` of the sharded state dicts, dp_reshardable, as Megatron-LM's
`save_checkpoint` writes it), a fresh model, DDP and optimizer loading it as Megatron-LM's `load_checkpoint` does, one
more step on both, compared. `--materialise`: the fresh optimizer's state materialised first with
`_init_optimizer_states_with_dummy_values()` and the main-parameter copies under no_grad (the load passes; the
step counts after it are printed: MISMATCH). `--fixed`: that, the dp_reshardable loader skipping `step`, and a step
tensor of its own for every parameter (OK).

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-distopt-torch-dist-resume-without-te.py [--materialise |
--fixed] (CPU, gloo). Prints CRASH / MISMATCH (exit 1) or OK.
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
os.environ.setdefault("MASTER_PORT", "29557")
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

FIXED = "--fixed" in sys.argv
MATERIALISE = FIXED or "--materialise" in sys.argv

if MATERIALISE:
    def set_main_param_and_optimizer_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        destinations = {"param": main_param, **self.optimizer.state[main_param]}
        with torch.no_grad():
            for key, value in tensors.items():
                if isinstance(value, torch.Tensor) and key in destinations:
                    destinations[key].copy_(value)

    DistributedOptimizer._set_main_param_and_optimizer_states = set_main_param_and_optimizer_states

if FIXED:
    load_dp_reshardable = DistributedOptimizer.load_parameter_state_from_dp_reshardable
    load_state_dict = DistributedOptimizer.load_state_dict

    def load_dp_reshardable_without_step(self, state_dict):
        for key, per_dtype in state_dict.items():
            if isinstance(key, int):
                for buckets in per_dtype.values():
                    for bucket in buckets:
                        for tensors in bucket:
                            tensors.pop("step", None)
        load_dp_reshardable(self, state_dict)

    def load_state_dict_own_steps(self, state_dict):
        load_state_dict(self, state_dict)
        for state in self.optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()

    DistributedOptimizer.load_parameter_state_from_dp_reshardable = load_dp_reshardable_without_step
    DistributedOptimizer.load_state_dict = load_state_dict_own_steps

parallel_state.initialize_model_parallel()
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)
METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True}  # what Megatron-LM's training passes (_build_sharded_state_dict_metadata)


def fresh():
    torch.manual_seed(0)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True),
                                  torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 8)))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.01, use_distributed_optimizer=True), [ddp])
    return ddp, opt


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
    step(ddp, opt, 0)
    step(ddp, opt, 1)
    path = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(path)
    strategy = FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(),
                                                parallel_state.get_data_parallel_group(with_context_parallel=True))
    dist_checkpointing.save(sharded(ddp, opt, False), path[0], strategy, content_metadata=METADATA)
    ddp2, opt2 = fresh()
    try:
        if MATERIALISE:
            for o in getattr(opt2, "chained_optimizers", [opt2]):
                o._init_optimizer_states_with_dummy_values()
        state = dist_checkpointing.load(sharded(ddp2, opt2, True), path[0])
        ddp2.module.load_state_dict(state["model"])
        opt2.load_state_dict(state["optimizer"])
    except Exception as e:  # noqa: BLE001
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"rank {rank}: CRASH: {type(e).__name__}: {e} (at {os.path.basename(where.filename)}:{where.lineno}, "
              f"{where.name}: {where.line})", flush=True)
        sys.exit(1)
    states = [s for o in getattr(opt2, "chained_optimizers", [opt2]) for s in o.optimizer.state.values()]
    steps = sorted({float(s["step"]) for s in states})
    shared = len({id(s["step"]) for s in states}) < len(states)
    print(f"rank {rank}: after loading, the step counts are {steps} (the checkpoint's: 2.0)"
          f"{', one tensor shared by all parameters' if shared else ''}", flush=True)
    step(ddp, opt, 2)
    step(ddp2, opt2, 2)
    error = max((a - b).abs().max().item() for a, b in zip(ddp.module.parameters(), ddp2.module.parameters()))
    print(f"rank {rank}: the resumed run's parameters after step 3 differ by up to {error:.3g}: "
          f"{'OK' if error == 0 else 'MISMATCH'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if error == 0 else 1)
