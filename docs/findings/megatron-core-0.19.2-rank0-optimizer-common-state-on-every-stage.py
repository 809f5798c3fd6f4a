"""megatron-core 0.19.2: megatron's distributed checkpoint keeps an optimizer's non-tensor state (its parameter groups
and its step count) as common state, written by global rank 0 alone and read by every rank, wherever it does not
wrap that state in ShardedObjects per model-parallel group: the non-distributed optimizers (FP32Optimizer,
Float16OptimizerWithFloat16Params) in the default format, and the distributed optimizer in `fully_reshardable`
(Megatron-LM's `--dist-ckpt-optim-fully-reshardable`, the format for resuming into another layout). Each pipeline
stage builds its own optimizers, so every stage resumes with stage 0's. Where stage 0 has no MoE layer (DeepSeek's
`first_k_dense_replace`, megatron's `moe_layer_freq`), its expert-parallel optimizer holds no parameters and has no
step to write (the distributed optimizer's groups carry none; the others write no `common_step`), so a stage that
has experts loads its expert optimizer without one:

- the non-distributed optimizer, default format: torch's Adam `__setstate__` reads each parameter's step:
  KeyError: 'step' (adam.py:128), and the run cannot resume;
- the distributed optimizer, fully_reshardable, with torch's Adam (no Apex or Transformer Engine):
  `DistributedOptimizer.load_state_dict` reads `g["step"]`: KeyError: 'step' (distrib_optimizer.py:1026);
- with Apex or TE (read from the code, not run here: this machine has no GPU), the groups load without a step,
  `ChainedOptimizer._synchronize_steps` aligns only groups that have one, and FusedAdam starts the expert
  parameters' step count again at 1: their bias correction after a resume is that of a fresh run, silently.

The distributed optimizer's default format (dp_reshardable) is not affected: it writes the groups as ShardedObjects
per model-parallel group (shardfuzz's case tests/python-resume/megatron-moe-pp2-dp2-ep2-zero1-dense-first-stage-torch-
dist-resume-after-1-f32.json resumes from it with its known fixes). megatron's MimoOptimizer met the same rank-0
common state for modules on disjoint ranks (NVIDIA/Megatron-LM#4791, #4801, fixed there); ChainedOptimizer across
pipeline stages is not covered by them. Not found reported.

Found by shardfuzz's megatron-tp target (2026-12-06): `train.resume_parallel`, a MoE model on pp 2 x dp 2 x ep 2 with
its attention block on stage 0 and its MoE block on stage 1, resumed with overlapped buckets from a fully reshardable
checkpoint; then campaign 294, the non-distributed optimizer on pp 3 x dp 2 x ep 2 with two dense stages, resumed from
megatron's default checkpoint.

This script: 2 ranks, pp 2; each stage a Linear in megatron's DDP and optimizer (Adam); on stage 1 the weight is an
expert parameter (`allreduce = False`, as megatron's expert layers mark them), so stage 0's expert optimizer is empty.
One step, a distributed checkpoint (`dist_checkpointing.save`), then fresh DDPs and optimizers load it. Default: the
distributed optimizer, fully_reshardable; `--non-distributed`: the non-distributed optimizer, the default format.
The distributed optimizer's other bugs on this path (an empty or unstepped optimizer's `state_dict` asserts; the
loader's `step` copy) have their fixes applied first, writing what the Apex / TE branch writes; the
non-distributed run meets none of them: its crash is megatron's code alone. `--fixed`: before
they are written, the chained optimizer's sub-optimizers without a step take the chain's (as `_synchronize_steps`
aligns the others); the loaded expert step is then checked against the saved one.

Run: torchrun --nproc_per_node 2 megatron-core-0.19.2-rank0-optimizer-common-state-on-every-stage.py
[--non-distributed] [--fixed] (CPU, gloo). Prints CRASH (exit 1), MISMATCH (exit 1) or OK on each rank.
"""

import contextlib
import copy
import os
import queue
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29556")
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
    """megatron-core allocates its buffers on 'cuda', moves tensors there and checks parameters' CUDA type names: the
    CPU instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **kwargs)


torch.cuda.current_device = lambda: "cpu"
torch.cuda.current_stream = lambda *args, **kwargs: NoStream()
torch.cuda.Stream = lambda *args, **kwargs: NoStream()
torch.cuda.stream = lambda _stream: contextlib.nullcontext()
torch.cuda.synchronize = lambda *args, **kwargs: None  # (the checkpoint writer waits for copies to the host)

from megatron.core import dist_checkpointing, parallel_state  # noqa: E402
from megatron.core.dist_checkpointing.strategies import filesystem_async  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer  # noqa: E402
from megatron.core.optimizer.optimizer import ChainedOptimizer  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint  # noqa: E402

# megatron's other bugs on this path first, without Apex / TE (an optimizer before its first step, and an empty one,
# assert one step count among none in `state_dict`, which the fresh optimizer's `sharded_state_dict(is_loading=True)`
# calls; the loader copies into a `step` the checkpoint lacks): their fixes (shardfuzz's known fixes
# megatron-distopt-checkpoint-before-first-step, megatron-distopt-empty-optimizer-state-dict,
# megatron-distopt-legacy-checkpoint-state-copy), an empty optimizer's groups written without a step as the Apex / TE
# branch writes them.
state_dict = DistributedOptimizer.state_dict


def state_dict_of_empty(self):
    inner = self.optimizer
    params = [q for g in inner.param_groups for q in g["params"]]
    if not params:
        return {"optimizer": {"param_groups": [{k: v for k, v in g.items() if k != "params"}
                                               for g in inner.param_groups]}}
    if not inner.state:  # (before the first step: a step over zero gradients at lr 0, its count back to zero)
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
    return state_dict(self)


load_state_dict = DistributedOptimizer.load_state_dict


def load_state_dict_of_empty(self, saved):
    if any(g["params"] for g in self.optimizer.param_groups):
        return load_state_dict(self, saved)


def set_main_param_and_optimizer_states(self, model_param, tensors):
    # (without Apex / TE the loader copies into every tensor of a parameter's state, `step` too, which the checkpoint
    # does not hold, outside no_grad: the tensors the checkpoint has, under no_grad)
    group_index, group_order = self.model_param_group_index_map[model_param]
    main_param = self.optimizer.param_groups[group_index]["params"][group_order]
    destinations = {"param": main_param, **self.optimizer.state[main_param]}
    with torch.no_grad():
        for key, value in tensors.items():
            if isinstance(value, torch.Tensor) and isinstance(destinations.get(key), torch.Tensor):
                destinations[key].copy_(value)


DistributedOptimizer.state_dict, DistributedOptimizer.load_state_dict = state_dict_of_empty, load_state_dict_of_empty
DistributedOptimizer._set_main_param_and_optimizer_states = set_main_param_and_optimizer_states

DISTRIBUTED = "--non-distributed" not in sys.argv

if "--fixed" in sys.argv:
    sharded_state_dict = ChainedOptimizer.sharded_state_dict

    def torch_style(sub):
        # (a sub-optimizer's torch-style dict: its groups, and for the non-distributed ones its state)
        inner = sub.get("optimizer", sub) if isinstance(sub, dict) else None
        return inner if isinstance(inner, dict) and isinstance(inner.get("param_groups"), list) else None

    def with_the_chains_step(self, model_sharded_state_dict, is_loading=False, **kwargs):
        state = sharded_state_dict(self, model_sharded_state_dict, is_loading, **kwargs)
        inners = [i for i in map(torch_style, state.values() if len(self.chained_optimizers) > 1 else [state])
                  if i is not None]
        group_steps = [g["step"] for i in inners for g in i["param_groups"] if "step" in g]
        common = [i["state"]["common_step"] for i in inners if "common_step" in (i.get("state") or {})]
        for inner in inners:
            for g in inner["param_groups"] if group_steps else []:
                g.setdefault("step", group_steps[0])
            if common and isinstance(inner.get("state"), dict) and "common_step" not in inner["state"]:
                inner["state"]["common_step"] = copy.deepcopy(common[0])
        return state

    ChainedOptimizer.sharded_state_dict = with_the_chains_step

# (megatron's writer returns its results through a multiprocessing.Manager queue, whose server start hangs here under
# torchrun; a synchronous save puts and takes them in the rank's own process, where a thread queue serves)
filesystem_async._results_queue = queue.Queue()
parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)
METADATA = {"distrib_optim_sharding_type": "fully_reshardable", "distrib_optim_fully_reshardable_mem_efficient": False,
            "singleton_local_shards": False, "chained_optim_avoid_prefix": True,
            "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}


def built():
    """This stage's Linear (stage 1's weight an expert parameter) in DDP, and its optimizer (a chain: dense, expert),
    distributed unless `--non-distributed`."""
    torch.manual_seed(rank)
    model = torch.nn.Linear(8, 8)
    if rank == 1:
        model.weight.allreduce = False
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=DISTRIBUTED), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.01, use_distributed_optimizer=DISTRIBUTED),
                                 [ddp])
    return model, ddp, opt


def sharded(model, opt, is_loading):
    """The checkpoint's sharded state dict: the stage's parameters under keys of their own, the optimizer's."""
    own = {}
    model._save_to_state_dict(own, "", keep_vars=True)
    model_state = make_sharded_tensors_for_checkpoint(own, f"stage{rank}.", tp_group=parallel_state.get_tensor_model_parallel_group(),
                                                      dp_cp_group=METADATA["dp_cp_group"])
    return {"model": model_state, "optimizer": opt.sharded_state_dict(model_state, is_loading=is_loading,
                                                                     metadata=METADATA)}


def expert_step(opt):
    return [float(s["step"]) for o in opt.chained_optimizers for g in o.optimizer.param_groups if g.get("is_expert_parallel")
            for p in g["params"] for s in [o.optimizer.state[p]]]


with CudaOnCpu(), tempfile.TemporaryDirectory() as local:
    path = [local]
    dist.broadcast_object_list(path, src=0)  # (one directory for both ranks)
    model, ddp, opt = built()
    ddp.zero_grad_buffer()
    ddp(torch.randn(4, 8)).square().sum().backward()
    ddp.finish_grad_sync()
    opt.step()
    saved = expert_step(opt)
    dist_checkpointing.save(sharded(model, opt, is_loading=False), path[0])
    model, ddp, opt = built()
    try:
        loaded = dist_checkpointing.load(sharded(model, opt, is_loading=True), path[0])
        opt.load_state_dict(loaded["optimizer"])
        verdict = ("OK" if expert_step(opt) == saved else
                   f"MISMATCH: the expert parameters' step after loading {expert_step(opt)}, saved {saved}")
    except Exception as e:  # noqa: BLE001
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        verdict = f"CRASH: {type(e).__name__}: {e} (at {os.path.basename(where.filename)}:{where.lineno})"
    dist.barrier()  # (rank 0's directory stays until both have loaded)
print(f"rank {rank} ({'no expert' if rank == 0 else f'expert step {saved}'}): {verdict}", flush=True)
dist.destroy_process_group()
sys.exit(0 if verdict == "OK" else 1)
