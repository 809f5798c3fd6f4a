"""megatron-core 0.19.2: the distributed optimizer cannot write megatron's default distributed checkpoint
(`--ckpt-format torch_dist`, its state `dp_reshardable`) when a data-parallel rank's slice of a gradient bucket holds
no parameter, or ends in padding that runs past the bucket's unpadded size.

`sharded_param_state_dp_reshardable` (distrib_optimizer.py:1828-1976) writes each rank's slice of each bucket as
pieces of one tensor of the bucket's unpadded size: its parameters, and padding between and around them. (1) A slice
without parameters (a small bucket padded to a data-parallel multiple: megatron gives a `shared_embedding` parameter,
a tied embedding under pipeline parallelism, a bucket of its own) stops it at `assert bucket_state, 'empty bucket
encountered'` (:1899). (2) The gap after a slice's last parameter is written up to the end of the slice whenever it
starts before the unpadded end (:1915-1935); the unpadded size counts the alignment padding before the next bucket's
first parameter but not the padding to a data-parallel multiple, so where the gap runs past it torch's planner refuses
the piece: "Failed to validate global plan ... out of bounds chunk". Megatron-LM main (2026-08) has the same code.
With both fixed, loading such a checkpoint meets a third problem, known from radixark/Megatron-LM#69's review and #66:
each rank's list of entries per bucket has its own length, but is saved in rank 0's common state ("Cannot merge two
lists with different lengths").

Found by shardfuzz's megatron-tp target (campaign 289, 2026-12-06): fp16, pp 2 x dp 2 or 3, tied embeddings (the
shared embedding's own bucket): (1) on dp 3, (2) on dp 2; with both fixed the dp 2 case passes.

This script: 2 ranks, Linear(8, 5) and Linear(5, 8) in DDP with the distributed optimizer (Adam), the first weight
marked `shared_embedding` (its own bucket: 40 elements, padded to 128, rank 1's half without a parameter), two steps,
the distributed checkpoint as Megatron-LM writes it, a fresh model loading it. `--fixed`: an empty slice is one padding
entry of length 0, and the pieces are cut at the unpadded size: the save passes and the load meets the third problem.

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-distopt-dp-reshardable-bucket-padding.py [--fixed] (CPU, gloo).
Prints CRASH (exit 1) or OK / MISMATCH.
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
os.environ.setdefault("MASTER_PORT", "29561")
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
# (The fresh optimizer's state materialised and the copies under no_grad, without `step`: the torch_dist load's other
# bugs, megatron-core-0.19.2-distopt-torch-dist-resume-without-te.py, out of the way.)


def set_main_param_and_optimizer_states(self, model_param, tensors):
    group_index, group_order = self.model_param_group_index_map[model_param]
    main_param = self.optimizer.param_groups[group_index]["params"][group_order]
    destinations = {"param": main_param, **self.optimizer.state[main_param]}
    with torch.no_grad():
        for key, value in tensors.items():
            if isinstance(value, torch.Tensor) and key in destinations and key != "step":
                destinations[key].copy_(value)


DistributedOptimizer._set_main_param_and_optimizer_states = set_main_param_and_optimizer_states

if FIXED:
    from megatron.core.dist_checkpointing import ShardedTensor  # noqa: E402

    get_state = DistributedOptimizer.get_parameter_state_dp_reshardable
    sharded_state = DistributedOptimizer.sharded_param_state_dp_reshardable

    def get_state_padded(self):
        state = get_state(self)
        for key, per_dtype in state.items():
            for bucket in (b for buckets in per_dtype.values() for b in buckets) if isinstance(key, int) else ():
                if not bucket:  # a slice without parameters: one padding entry of length 0
                    empty = {k: torch.empty(0) for k in ("param",) + tuple(self.optimizer_state_keys)}
                    bucket.append({**empty, "gbuf_local_start": 0, "gbuf_local_end": 0, "padding": True})
        return state

    def sharded_state_clipped(self, *args, **kwargs):
        # (the released function with each gap clipped at the unpadded size, as the known fix recompiles it, is
        # long; here the pieces past it are cut after the fact)
        state = sharded_state(self, *args, **kwargs)
        for key, per_dtype in state.items():
            for bucket in (b for buckets in per_dtype.values() for b in buckets) if isinstance(key, int) else ():
                for tensors in bucket:
                    for name, v in list(tensors.items()):
                        if not isinstance(v, ShardedTensor):
                            continue
                        size, start = v.global_shape[0], v.global_offset[0]
                        keep = max(0, min(v.data.numel(), size - start))
                        if keep == 0:
                            del tensors[name]
                        elif keep < v.data.numel():
                            v.data, v.local_shape = v.data[:keep], (keep,)
        return state

    DistributedOptimizer.get_parameter_state_dp_reshardable = get_state_padded
    DistributedOptimizer.sharded_param_state_dp_reshardable = sharded_state_clipped

parallel_state.initialize_model_parallel()
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)
METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True}  # what Megatron-LM's training passes (_build_sharded_state_dict_metadata)


def marked(model):
    model[0].weight.shared_embedding = True
    return model


def fresh():
    torch.manual_seed(0)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True),
                                  marked(torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Linear(5, 8))))
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
    ddp2, opt2 = fresh()
    try:
        dist_checkpointing.save(sharded(ddp, opt, False), path[0], strategy, content_metadata=METADATA)
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
