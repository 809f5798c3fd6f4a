"""torch 2.15: a checkpoint written through torch.distributed.checkpoint's `get_state_dict` while the optimizer has not
stepped yet but the parameters hold gradients (fp16 training whose first step the loss scaler skipped, as GradScaler
does on an overflow) cannot be loaded into a fresh model and optimizer: `dcp.load` raises "Missing key in checkpoint
state_dict: optim.state.<param>.step".

`_init_optim_state` (torch/distributed/checkpoint/state_dict.py) initialises an empty optimizer state with a zero-grad
step so that the state dict is complete, but returns early as soon as any parameter holds a gradient. On the saving
side the skipped step left gradients and an empty state: nothing is initialised and the checkpoint holds no
optimizer state. On the loading side the fresh optimizer has no gradients: its state is initialised, and the load plan
asks for every state key, which the checkpoint lacks.

Setup: one process, an nn.Linear and Adam, one backward, no optimizer step, the torchtitan recipe (`get_state_dict`,
`dcp.save`; a fresh model and optimizer, `get_state_dict`, `dcp.load`, `set_state_dict`). `--fixed` saves as the
loading side builds its template: the gradients set aside while `get_state_dict` initialises the state, then put
back.

Found by shardfuzz's torch-fsdp2 target (2026-12-01, `resume_after` 1 in an f16 case with a loss scale of 65536: its
first step overflowed and was skipped), as a crash in 3 signatures.

Run: python torch-2.15-dcp-checkpoint-before-first-optimizer-step-unloadable.py [--fixed]  (CPU, one process).
Prints CRASH (exit 1) or OK.
"""

import sys
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def fresh():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def saved_state(model, opt):
    if "--fixed" not in sys.argv:
        return get_state_dict(model, opt)
    grads = [p.grad for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    state = get_state_dict(model, opt)
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    return state


model, opt = fresh()
model(torch.ones(2, 4)).sum().backward()  # the step that follows is skipped (a loss scaler's overflow): no opt.step()
with tempfile.TemporaryDirectory() as path:
    model_state, optim_state = saved_state(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    model2, opt2 = fresh()
    model_state2, optim_state2 = get_state_dict(model2, opt2)
    state = {"model": model_state2, "optim": optim_state2}
    try:
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    except (Exception, CheckpointException) as e:  # (CheckpointException is a BaseException)
        print(f"CRASH: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
        sys.exit(1)
print("OK")
