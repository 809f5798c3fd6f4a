"""Checkpoints through torch.distributed.checkpoint's state-dict API (the torch-tp, torch-fsdp2 and torch-fsdp1 targets'
`resume_after`), in the case's `train.checkpoint_layout`: sharded (the default) as torchtitan writes and reads them,
each rank's shards by `dcp.save` / `dcp.load`; gathered as the state-dict API's full state dicts, gathered to rank 0
(`full_state_dict`, `cpu_offload`), saved there with torch.save, and loaded by rank 0 and broadcast to the others
(`broadcast_from_rank0`), each taking its shards: the recipe of torch's docs for a checkpoint read elsewhere."""

import os

from .base import checkpoint_layout
from .torch_common import shared_tempdir
from .torch_model import make_optimizer


def save_checkpoint(model, opt, path, gathered=False):
    """The model's and optimizer's state dicts (DTensor shards) saved with torch.distributed.checkpoint; `gathered`:
    their full state dicts, saved by rank 0 (`save_full_checkpoint`)."""
    import torch.distributed.checkpoint as dcp

    if gathered:
        return save_full_checkpoint(model, opt, path)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)


def load_checkpoint(model, opt, path, gathered=False, broadcast=True):
    """The checkpoint at `path` loaded into a fresh sharded model and its optimizer (`gathered`: a full one,
    `load_full_checkpoint`, broadcast from rank 0 unless not `broadcast`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if gathered:
        return load_full_checkpoint(model, opt, path, broadcast)

    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def save_full_checkpoint(model, opt, path):
    """The model's and optimizer's full state dicts, gathered to rank 0 on the CPU and saved there with torch.save."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                                   cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save({"model": model_state, "optim": optim_state}, os.path.join(path, "full.pt"))
    dist.barrier()


def load_full_checkpoint(model, opt, path, broadcast=True):
    """The full checkpoint at `path` read by rank 0 and broadcast into a fresh sharded model and its optimizer
    (the other ranks hand in empty state dicts, as `broadcast_from_rank0` asks); without `broadcast`, read by every
    rank (what torch documents for FSDP1: `broadcast_from_rank0` "only supports DTensor, not the legacy
    ShardedTensor")."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = (torch.load(os.path.join(path, "full.pt"), weights_only=False) if dist.get_rank() == 0 or not broadcast
             else {"model": {}, "optim": {}})
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=broadcast))


def resumed(case, now, rebuild, opt):
    """`train`'s `resume` through torch.distributed.checkpoint, as torchtitan does it: `now["model"]` and `opt`
    saved, a fresh model built by `rebuild()` (which sets `now["model"]` and returns its named trainable parameters)
    and a fresh optimizer over them, loaded from the checkpoint; returns (named parameters, optimizer)."""
    gathered = checkpoint_layout(case) == "gathered"
    # (gathered: written and read by rank 0 alone, the save ending in a barrier; a load the others leave early, as
    # torch's set_state_dict lets them, then leaves them waiting in the framework, not in a barrier of ours)
    with shared_tempdir(read_by_rank0_only=gathered) as path:
        save_checkpoint(now["model"], opt, path, gathered)
        named = rebuild()
        opt = make_optimizer(case, [p for _, p in named])
        load_checkpoint(now["model"], opt, path, gathered)
    return named, opt
