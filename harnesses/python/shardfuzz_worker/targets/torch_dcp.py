"""Checkpoints through torch.distributed.checkpoint's state-dict API, as torchtitan writes and reads them (the
torch-tp, torch-fsdp2 and torch-fsdp1 targets' `resume_after`)."""

from .torch_common import shared_tempdir
from .torch_model import make_optimizer


def save_checkpoint(model, opt, path):
    """The model's and optimizer's state dicts (DTensor shards) saved with torch.distributed.checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)


def load_checkpoint(model, opt, path):
    """The checkpoint at `path` loaded into a fresh sharded model and its optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def resumed(case, now, rebuild, opt):
    """`train`'s `resume` through torch.distributed.checkpoint, as torchtitan does it: `now["model"]` and `opt`
    saved, a fresh model built by `rebuild()` (which sets `now["model"]` and returns its named trainable parameters)
    and a fresh optimizer over them, loaded from the checkpoint; returns (named parameters, optimizer)."""
    with shared_tempdir() as path:
        save_checkpoint(now["model"], opt, path)
        named = rebuild()
        opt = make_optimizer(case, [p for _, p in named])
        load_checkpoint(now["model"], opt, path)
    return named, opt
