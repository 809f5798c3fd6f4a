"""megatron-core 0.19.2: the distributed optimizer's `fully_reshardable` checkpoint (the format Megatron-LM writes with
`--dist-ckpt-optim-fully-reshardable`, the one for resuming under other tensor-, pipeline- or data-parallel degrees)
misplaces the state of every parameter after a gradient buffer's first padded bucket.

`get_parameter_state_dp_zero` (distrib_optimizer.py:1262-1410) gathers each buffer's optimizer state into one tensor,
its buckets one after another with each bucket's end padding stripped ("gets rid of the padding between buckets");
`sharded_param_state_fully_reshardable` (:1690-1826) then slices every parameter's state out of that tensor, saving
and loading, at the parameter's `param_index_map` offsets, which count the padding. A parameter in a later bucket is
written from the wrong offset (its tail past the end zero-filled with the warning "param range exceeds unpadded buffer
... It will be padded with zeros which can lead to data corruption", a TODO that calls it a bug), and read back to the
offset the loading layout gives it, so the loaded weights and Adam moments are shifted and partly zero. A run resumed
under other degrees trains from them; even a resume in the same layout loses the head of each such parameter.

Found by shardfuzz's megatron-tp target (2026-12-06) with its new vocabulary, a run resumed under other data- and
tensor-parallel degrees: a tied embedding over two pipeline stages (the shared embedding's own bucket) resumed from
dp 2 into tp 2 trains from an embedding whose first tensor-parallel half holds the second half's rows and whose second
half is zero (loss 0.36 off after the resume, f32); small buckets (bucket_size 7) fail alike. Fixed upstream by
NVIDIA/Megatron-LM#5077 (merged 2026-05-31: "every parameter past the first bucket is read from the wrong offset"),
which is not in the 0.19.2 release (the latest on PyPI, 2026-12-06).

This script: 2 ranks, Linear(8, 5) and Linear(5, 8) in DDP with the distributed optimizer (Adam), the first weight
marked `shared_embedding` as megatron marks a tied embedding over pipeline stages (a bucket of its own, after the
others' padded bucket), two steps, the fully reshardable distributed checkpoint as
Megatron-LM writes it, a fresh model in the same layout loading it; the loaded main parameters and Adam moments
compared with the saved ones. `--fixed`: the padding stripped before each parameter's bucket subtracted from its
offsets (the upstream fix).

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-distopt-fully-reshardable-bucket-padding.py [--fixed] (CPU,
gloo). Prints OK or MISMATCH (exit 1), per rank.
"""

import contextlib
import inspect
import logging
import os
import queue
import sys
import tempfile
import textwrap

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29563")
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
        if func is torch.Tensor.cuda:  # (the fully reshardable format gathers over NCCL: here gloo, on the CPU)
            return args[0]
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
logging.getLogger("megatron.core.optimizer.distrib_optimizer").setLevel(logging.ERROR)  # (the zero-padding warning)

FIXED = "--fixed" in sys.argv
# (The fresh optimizer's state materialised, and the copies into it under no_grad without `step`: the torch_dist load's
# other bugs without Apex / TE, megatron-core-0.19.2-distopt-torch-dist-resume-without-te.py, out of the way.)


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
    # NVIDIA/Megatron-LM#5077's fix: each parameter's offsets less the end padding stripped before its bucket.
    source = textwrap.dedent(inspect.getsource(DistributedOptimizer.sharded_param_state_fully_reshardable))
    old = "                    state_ten = world_tensors[state_key][param_world_start:param_world_end]\n"
    new = ("                    _stripped = sum(b.grad_data.numel() - b.numel_unpadded\n"
           "                                    for b in buffer.buckets[:buffer.param_index_map[model_param][2]])\n"
           "                    state_ten = world_tensors[state_key][param_world_start - _stripped:"
           "param_world_end - _stripped]\n")
    assert source.count(old) == 1, "the released code has changed"
    module = sys.modules[DistributedOptimizer.__module__]
    namespace = {}
    exec(compile(source.replace(old, new), module.__file__, "exec"), module.__dict__, namespace)
    DistributedOptimizer.sharded_param_state_fully_reshardable = namespace["sharded_param_state_fully_reshardable"]

parallel_state.initialize_model_parallel()
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)
# What Megatron-LM's training passes with --dist-ckpt-optim-fully-reshardable (_build_sharded_state_dict_metadata).
METADATA = {"distrib_optim_sharding_type": "fully_reshardable", "distrib_optim_fully_reshardable_mem_efficient": False,
            "singleton_local_shards": False, "chained_optim_avoid_prefix": True}


def marked(model):
    """The first weight marked as megatron marks a tied embedding split over pipeline stages: a bucket of its own."""
    model[0].weight.shared_embedding = True
    return model


def fresh():
    torch.manual_seed(0)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True),
                                  marked(torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Linear(5, 8))))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.01, use_distributed_optimizer=True), [ddp])
    return ddp, getattr(opt, "chained_optimizers", [opt])[0]


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


def states(ddp, opt):
    """This rank's main parameters and Adam moments, per model parameter (its shard of each)."""
    out = {}
    for name, p in ddp.module.named_parameters():
        if p in opt.model_param_group_index_map:
            for key, v in opt._get_main_param_and_optimizer_states(p).items():
                out[f"{name} {key}"] = v.detach().clone()
    return out


with CudaOnCpu():
    ddp, opt = fresh()
    step(ddp, opt, 0)
    step(ddp, opt, 1)
    buckets = [(b.numel_unpadded, b.grad_data.numel()) for b in ddp.buffers[0].buckets]
    path = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(path)
    strategy = FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(),
                                                parallel_state.get_data_parallel_group(with_context_parallel=True))
    dist_checkpointing.save(sharded(ddp, opt, False), path[0], strategy, content_metadata=METADATA)
    ddp2, opt2 = fresh()
    opt2._init_optimizer_states_with_dummy_values()
    state = dist_checkpointing.load(sharded(ddp2, opt2, True), path[0])
    ddp2.module.load_state_dict(state["model"])
    opt2.load_state_dict(state["optimizer"])
    saved, loaded = states(ddp, opt), states(ddp2, opt2)
    wrong = [k for k in saved if not torch.equal(saved[k], loaded[k])]
    if rank == 0:
        print(f"buckets (unpadded, padded elements): {buckets}", flush=True)
    for k in wrong:
        s, l = saved[k], loaded[k]
        print(f"rank {rank}: {k}: saved {s.numel()} values, {int((s != l).sum())} loaded wrong"
              f" ({int((l == 0).sum())} of them zero)", flush=True)
    print(f"rank {rank}: {len(wrong)} of {len(saved)} loaded state tensors differ from the saved: "
          f"{'MISMATCH' if wrong else 'OK'}", flush=True)
dist.destroy_process_group()
sys.exit(1 if wrong else 0)
