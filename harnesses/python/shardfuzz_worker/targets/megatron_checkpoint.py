"""megatron's checkpoints, as the megatron targets' `resume_after` writes and reads them, in the case's
`train.checkpoint_layout`:

- sharded (the default): megatron's distributed checkpoint (`--ckpt-format torch_dist`, Megatron-LM's default), the
  sharded state dicts of the unwrapped models and of the optimizer built on them (the distributed optimizer's state
  `dp_reshardable`, Megatron-LM's default, or `fully_reshardable` for a run resuming into another layout:
  optimizer_sharding_type) written by `dist_checkpointing.save` in parallel and read by `dist_checkpointing.load`;
- gathered: megatron's legacy checkpoint (`--ckpt-format torch`, Megatron-LM's training/checkpointing.py): one
  directory per model-parallel rank (tensor, pipeline and expert rank), the distributed optimizer's parameter state
  gathered to data-parallel rank 0 of each optimizer (`save_parameter_state`), the models' (one per virtual chunk),
  optimizer's and scheduler's state dicts from the model-parallel rank's first data-parallel rank.

Either is loaded into fresh objects in megatron's order."""

import os

from .base import checkpoint_layout, resumed_layout_changes
from . import megatron_release
from .megatron_common import sync_parameters

#: This module's functions, in the order a standalone repro script embeds them.
FUNCTIONS = ("save_checkpoint", "optimizer_sharding_type", "reshards_beyond_data_parallel", "load_checkpoint",
             "model_parallel_dir", "save_legacy_checkpoint", "load_legacy_checkpoint", "gloo_copies_of_data_parallel_groups", "distributed_metadata",
             "model_sharded_state_dict", "tied_output_weight", "sharded_state", "save_distributed_checkpoint", "load_distributed_checkpoint",
             "in_process_write_results")


def save_checkpoint(case, path, ddps, opt, schedule, settings):
    """The case's checkpoint of `ddps`, `opt` and `schedule` under `path`, in its layout."""
    if checkpoint_layout(case) == "sharded":
        save_distributed_checkpoint(path, ddps, opt, schedule, settings, optimizer_sharding_type(case))
    else:
        save_legacy_checkpoint(path, ddps, opt, schedule, settings)


def optimizer_sharding_type(case):
    """The distributed optimizer's state format in the case's distributed checkpoint, as a Megatron-LM user picks it:
    `dp_reshardable` (the default, the optimizer's bucket layout, which "allows checkpoint resharding only in DP
    dimension") unless the run resumes into a layout that changes more than the distributed optimizer's instances
    (`train.resume_parallel`: its buckets, overlap, the distributed optimizer switched on or off), which asks for
    `fully_reshardable` (`--dist-ckpt-optim-fully-reshardable`: the state in the model's parameter space)."""
    return "fully_reshardable" if reshards_beyond_data_parallel(case) else "dp_reshardable"


def reshards_beyond_data_parallel(case):
    """Whether the case resumes into a layout (`train.resume_parallel`) that changes more than the distributed
    optimizer's instances (`zero_shard_group`, the data-parallel split of its state)."""
    return any(c != "zero_shard_group" for c in resumed_layout_changes(case))


def unsupported_resumed_layout(case):
    """Why megatron cannot resume the case into its `train.resume_parallel`, or None: its legacy checkpoint (the
    `gathered` layout) holds the distributed optimizer's state in its bucket layout, gathered per bucket, so only
    the data-parallel split of it (the optimizer's instances) may change; megatron's load asserts so."""
    if checkpoint_layout(case) == "gathered" and reshards_beyond_data_parallel(case):
        return ("megatron's legacy checkpoint (train.checkpoint_layout gathered) keeps the distributed optimizer's "
                "bucket layout: a run resumes from it into other optimizer instances (zero_shard_group) only")
    return None


def load_checkpoint(case, path, ddps, opt, schedule, settings):
    """The case's checkpoint under `path` loaded into fresh `ddps`, `opt` and `schedule`, in its layout."""
    load = load_distributed_checkpoint if checkpoint_layout(case) == "sharded" else load_legacy_checkpoint
    load(path, ddps, opt, schedule, settings)


def model_parallel_dir(path):
    """This rank's directory of the checkpoint at `path` (megatron's `mp_rank_TT_PPP[_EEE]`), made if missing."""
    from megatron.core import parallel_state as ps

    name = (f"mp_rank_{ps.get_tensor_model_parallel_rank():02d}_{ps.get_pipeline_model_parallel_rank():03d}"
            f"_{ps.get_expert_model_parallel_rank():03d}")
    d = os.path.join(path, name)
    os.makedirs(d, exist_ok=True)
    return d


def save_legacy_checkpoint(path, ddps, opt, schedule, settings):
    """The checkpoint of `ddps`' models, `opt` and `schedule` under `path`: the parameters synced first (the forced
    all-gather of `overlap_param_gather`), the distributed optimizer's parameter state (`settings`: the DDP
    config's), then the state dicts, written by the ranks whose data-parallel or expert-data-parallel rank is 0
    (Megatron-LM's rule since it found that the expert-data-parallel rank alone misses a tensor-parallel rank's
    directory where tp > ep x etp; campaign 289 met that: tp 2, a MoE layer at etp 1)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    d = model_parallel_dir(path)
    sync_parameters(ddps, settings)
    if settings["use_distributed_optimizer"]:
        gloo_copies_of_data_parallel_groups(opt)
        opt.save_parameter_state(os.path.join(d, "distrib_optim.pt"))
    if ps.get_data_parallel_rank() == 0 or ps.get_expert_data_parallel_rank() == 0:
        state = {f"model{i}": ddp.module.state_dict() for i, ddp in enumerate(ddps)}
        torch.save(state | {"optimizer": opt.state_dict(), "opt_param_scheduler": schedule.state_dict()},
                   os.path.join(d, "model_optim_rng.pt"))
    dist.barrier()


def load_legacy_checkpoint(path, ddps, opt, schedule, settings):
    """The checkpoint under `path` loaded into fresh `ddps`, `opt`, `schedule` in megatron's order: the models, the
    optimizer's state dict, the distributed optimizer's parameter state (read on data-parallel rank 0 and
    scattered), the scheduler."""
    import torch

    d = model_parallel_dir(path)
    state = torch.load(os.path.join(d, "model_optim_rng.pt"), weights_only=False)
    for i, ddp in enumerate(ddps):
        ddp.module.load_state_dict(state[f"model{i}"])
    opt.load_state_dict(state["optimizer"])
    if settings["use_distributed_optimizer"]:
        gloo_copies_of_data_parallel_groups(opt)
        opt.load_parameter_state(os.path.join(d, "distrib_optim.pt"))
    schedule.load_state_dict(state["opt_param_scheduler"])


def gloo_copies_of_data_parallel_groups(opt):
    """The legacy format gathers and scatters the distributed optimizer's state over gloo copies of its
    data-parallel groups (`data_parallel_group_gloo`), which megatron_common does not create (every group here is a
    gloo group already): each optimizer's data-parallel group itself serves as its gloo copy."""
    for o in getattr(opt, "chained_optimizers", [opt]):
        if hasattr(o, "data_parallel_group_gloo") and o.data_parallel_group_gloo is None:
            o.data_parallel_group_gloo = o.data_parallel_group


def distributed_metadata(sharding_type="dp_reshardable"):
    """The sharded state dict metadata Megatron-LM's training passes with its default distributed checkpoint
    (`--ckpt-format torch_dist`, `_build_sharded_state_dict_metadata`): the distributed optimizer's state in
    `sharding_type` (by default its bucket layout, `dp_reshardable`; `fully_reshardable` without the memory-efficient
    variant, Megatron-LM's defaults for `--dist-ckpt-optim-fully-reshardable`)."""
    from megatron.core import parallel_state as ps

    extra = {"distrib_optim_fully_reshardable_mem_efficient": False} if sharding_type == "fully_reshardable" else {}
    return {"distrib_optim_sharding_type": sharding_type, **extra, "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True, "dp_cp_group": ps.get_data_parallel_group(with_context_parallel=True)}


def model_sharded_state_dict(module, metadata, prefix=""):
    """`module`'s sharded state dict (the unwrapped model's, as Megatron-LM takes it): a megatron module's own (its
    tensor-parallel layers shard their weights), any other's tensors replicated (megatron's default for modules that
    are not megatron's, `make_sharded_tensors_for_checkpoint` without a tensor-parallel axis), its children's alike.
    Block names are the case's global ones (`layers.{i}`), so pipeline stages do not collide."""
    from megatron.core import parallel_state as ps

    if hasattr(module, "sharded_state_dict"):
        return module.sharded_state_dict(prefix=prefix, metadata=metadata)
    own = {}
    module._save_to_state_dict(own, "", keep_vars=True)
    state = megatron_release.replicated_sharded_tensors(own, prefix, ps.get_tensor_model_parallel_group(),
                                                        metadata["dp_cp_group"])
    for name, child in module.named_children():
        state.update(model_sharded_state_dict(child, metadata, f"{prefix}{name}."))
    return state


def tied_output_weight(module, state):
    """`module`'s sharded state dict `state` with a tied LM head's copy on the last stage checkpointed as megatron's
    GPTModel checkpoints it (LanguageModule.tie_embeddings_and_output_weights_state_dict): a replica of the first
    stage's embedding, under its key (`embed.weight`), so that a checkpoint loads into any number of stages."""
    from megatron.core import parallel_state as ps
    from megatron.core.utils import make_tp_sharded_tensor_for_checkpoint

    if getattr(module, "tied", False) and getattr(module, "post_process", False) and not module.pre_process:
        replica = (1, 0, ps.get_data_parallel_rank(with_context_parallel=True))  # (1: a copy of the first stage's)
        state["lm_head.weight"] = make_tp_sharded_tensor_for_checkpoint(module.lm_head.weight, "embed.weight",
                                                                        replica_id=replica, allow_shape_mismatch=True)
    return state


def sharded_state(ddps, opt, schedule, metadata, is_loading):
    """Megatron-LM's `generate_state_dict` for `torch_dist`: each model chunk's sharded state dict (`model`, or
    `model{i}` with virtual chunks; a tied LM head's copy as the embedding's replica), the optimizer's built on them,
    the scheduler's."""
    state = {}
    for i, ddp in enumerate(ddps):
        state["model" if len(ddps) == 1 else f"model{i}"] = tied_output_weight(
            ddp.module, model_sharded_state_dict(ddp.module, metadata))
    state["optimizer"] = opt.sharded_state_dict(state, is_loading=is_loading, metadata=metadata)
    state["opt_param_scheduler"] = schedule.state_dict()
    return state


def save_distributed_checkpoint(path, ddps, opt, schedule, settings, sharding_type="dp_reshardable"):
    """megatron's distributed checkpoint of `ddps`, `opt` and `schedule` under `path`, as Megatron-LM's
    `save_checkpoint` writes it by default: the parameters synced first, then `dist_checkpointing.save` with the
    torch_dist strategy, fully parallel over the data-parallel (with context) group."""
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    sync_parameters(ddps, settings)
    in_process_write_results()
    metadata = distributed_metadata(sharding_type)
    state = sharded_state(ddps, opt, schedule, metadata, is_loading=False)
    strategy = FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(),
                                                ps.get_data_parallel_group(with_context_parallel=True))
    content = {k: v for k, v in metadata.items() if k != "dp_cp_group"}
    with megatron_release.in_process_checkpoint_writer():
        dist_checkpointing.save(state, path, strategy, content_metadata=content)


def load_distributed_checkpoint(path, ddps, opt, schedule, settings):
    """The distributed checkpoint under `path` loaded into fresh `ddps`, `opt`, `schedule` as Megatron-LM's
    `load_checkpoint` does: the sharded state dict generated for loading from the checkpoint's content metadata,
    `dist_checkpointing.load`, then the models (strict), the optimizer, the scheduler."""
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    metadata = dict(dist_checkpointing.load_content_metadata(path) or {})
    metadata["dp_cp_group"] = ps.get_data_parallel_group(with_context_parallel=True)
    state = dist_checkpointing.load(sharded_state(ddps, opt, schedule, metadata, is_loading=True), path)
    for i, ddp in enumerate(ddps):
        ddp.load_state_dict(state["model" if len(ddps) == 1 else f"model{i}"], strict=True)
    opt.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["opt_param_scheduler"])


def in_process_write_results():
    """megatron's writer hands its results back through one queue per process, a `multiprocessing.Manager` queue (a
    server process) made on the first save, which a daemonic rank may not start and which a killed rank would leave
    behind. A synchronous save puts and takes them in the rank's own process, where a thread queue serves."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()
