"""megatron's legacy checkpoint (`--ckpt-format torch`, Megatron-LM's training/checkpointing.py), as the megatron
targets' `resume_after` writes and reads it: one directory per model-parallel rank (tensor, pipeline and expert
rank), the distributed optimizer's parameter state gathered to data-parallel rank 0 of each optimizer
(`save_parameter_state`), the models' (one per virtual chunk), optimizer's and scheduler's state dicts from the
model-parallel rank's first data-parallel rank; loaded into fresh objects in megatron's order."""

import os

from .megatron_common import sync_parameters


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
    config's), then the state dicts, written by the rank whose expert-data-parallel rank is 0 (megatron's rule)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    d = model_parallel_dir(path)
    sync_parameters(ddps, settings)
    if settings["use_distributed_optimizer"]:
        gloo_copies_of_data_parallel_groups(opt)
        opt.save_parameter_state(os.path.join(d, "distrib_optim.pt"))
    if ps.get_expert_data_parallel_rank() == 0:
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
