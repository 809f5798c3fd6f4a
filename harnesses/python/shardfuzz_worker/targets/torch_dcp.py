"""Checkpoints through torch.distributed.checkpoint's state-dict API, as torchtitan writes and reads them (the
torch-fsdp2 and torch-fsdp1 targets' `resume_after`)."""


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
