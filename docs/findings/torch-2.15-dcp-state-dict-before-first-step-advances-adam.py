"""torch 2.15 (and 2.5.1): `torch.distributed.checkpoint.state_dict.get_state_dict` called before an optimizer's first
step (a seed checkpoint: the initialised model and a fresh optimizer saved, then training starts or resumes from it)
advances Adam's step count: the first real update is bias-corrected as step 2 and comes out ~26 % too small, in the
live run and in a run resumed from the checkpoint.

`_init_optim_state` (torch/distributed/checkpoint/state_dict.py) materialises the lazy optimizer state with one
`optim.step()` over zero gradients at a learning rate of 0, on the caller's optimizer. The parameters do not move, but
Adam / AdamW count the step (`state["step"]` becomes 1), and Adam's coupled weight decay fills its moments. Reported
upstream as pytorch/pytorch#164929 (open); torchtitan (#4382) and Megatron-LM (#5976) reset the step counts in their
own copies of this materialisation.

Setup: one process, an nn.Linear and Adam (lr 0.1). Uninterrupted: one backward and one step. Seed checkpoint: the
same, after `get_state_dict` + `dcp.save` on the fresh model and optimizer and `dcp.load` + `set_state_dict` into a
fresh model and optimizer (torchtitan's resume), which then take the step. Live: `get_state_dict` alone, then the step.
`--fixed` makes the materialisation inert (step counts back to zero, weight decay off while it runs).

Found by shardfuzz's torch-fsdp2 and torch-fsdp1 targets (2026-12-06, the case field `train.resume_after` 0, a seed
checkpoint): every parameter after step 1 divergent, the loss of step 1 38,358 times its noise.

Run: python torch-2.15-dcp-state-dict-before-first-step-advances-adam.py [--fixed]  (CPU, one process).
Prints MISMATCH (exit 1) or OK.
"""

import sys
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import state_dict as state_dict_module
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def inert_init_optim_state(optim):
    """The fix: `_init_optim_state` with its zero-gradient step's side effects undone."""
    if optim.state or any(p.grad is not None for g in optim.param_groups for p in g["params"]):
        return
    for group in optim.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p) if p.requires_grad else None
    kept = [{k: g[k] for k in ("lr", "weight_decay") if k in g} for g in optim.param_groups]
    for group in optim.param_groups:
        group["lr"], group["weight_decay"] = 0.0, 0.0
    optim.step()
    for group, k in zip(optim.param_groups, kept):
        group.update(k)
    for s in optim.state.values():
        if "step" in s:
            s["step"] = torch.zeros_like(s["step"]) if isinstance(s["step"], torch.Tensor) else 0
    optim.zero_grad(set_to_none=True)


def fresh():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def step(model, opt):
    model(torch.arange(8.0).view(2, 4)).square().sum().backward()
    opt.step()
    return model.weight.detach().clone()


def seed_checkpoint_resumed():
    model, opt = fresh()
    with tempfile.TemporaryDirectory() as path:
        m, o = get_state_dict(model, opt)
        dcp.save({"model": m, "optim": o}, checkpoint_id=path)
        model, opt = fresh()
        m, o = get_state_dict(model, opt)
        state = {"model": m, "optim": o}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return step(model, opt)


def live():
    model, opt = fresh()
    get_state_dict(model, opt)
    return step(model, opt)


if "--fixed" in sys.argv:
    state_dict_module._init_optim_state = inert_init_optim_state
want = step(*fresh())
bad = False
for name, got in (("seed checkpoint, resumed", seed_checkpoint_resumed()), ("live run", live())):
    diff = (got - want).abs().max().item()
    moved = (got - fresh()[0].weight.detach()).abs().max().item()
    print(f"{name}: largest difference from the uninterrupted step {diff:.3e} (the step itself moved {moved:.3e})")
    bad |= diff > 1e-6
print("MISMATCH" if bad else "OK")
sys.exit(1 if bad else 0)
