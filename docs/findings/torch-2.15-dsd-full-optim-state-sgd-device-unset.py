"""torch 2.15: torch.distributed.checkpoint's `set_state_dict` (and `set_optimizer_state_dict`) with
`full_state_dict=True` cannot load the state of an optimizer that holds no tensor state, such as SGD without momentum.

`_load_optim_state_dict` (state_dict.py:1138-1157) takes the device to distribute the full state to from the live
optimizer's state tensors of at least one dimension; SGD without momentum has none, and it raises "Expected device to
be set" (the model's path, `_load_model_state_dict`, falls back to the process group's default device). Past that,
the empty state flattens to nothing (`_flatten_state_dict`), the unflattened state dict comes back without its
"state" key, and `Optimizer.load_state_dict` fails: KeyError: 'state'.

Found by shardfuzz's torch-fsdp2 target (campaign 290, 2026-12-06, the day it learned full-state-dict checkpoints,
`train.checkpoint_layout` gathered): 46 crashes, every SGD case resuming from a gathered checkpoint; with both fixed
they pass.

This script: 2 ranks, a two-layer model under FSDP2 (`fully_shard`) on the CPU, one SGD step, the full state dicts
gathered to rank 0 and saved there, a fresh model and optimizer loading them on every rank with
`set_state_dict(..., full_state_dict=True)`. `--fixed`: the device falls back to the process group's and the state key
is kept (OK).

Run: torchrun --nproc_per_node 2 torch-2.15-dsd-full-optim-state-sgd-device-unset.py [--fixed] (CPU, gloo). Prints
CRASH (exit 1) or OK / MISMATCH.
"""

import datetime
import io
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

if "--fixed" in sys.argv:
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(state_dict._load_optim_state_dict))
    unflatten = "optim_state_dict = _unflatten_state_dict(\n                flatten_local_osd, local_osd_mapping\n            )"
    for old, new in (('raise AssertionError("Expected device to be set")',
                      "device = dist.distributed_c10d._get_pg_default_device()"),
                     (unflatten, unflatten + "\n            optim_state_dict.setdefault(_STATE, {})")):
        assert source.count(old) == 1
        source = source.replace(old, new)
    namespace = {}
    exec(compile(source, inspect.getsourcefile(state_dict), "exec"), state_dict.__dict__, namespace)
    state_dict._load_optim_state_dict = namespace["_load_optim_state_dict"]

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))


def fresh():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def step(model, opt, iteration):
    opt.zero_grad()
    torch.manual_seed(100 + 10 * iteration + rank)
    model(torch.randn(4, 8)).square().sum().backward()
    opt.step()


model, opt = fresh()
step(model, opt, 0)
full_model, full_optim = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if rank == 0:  # (written and read back, as a checkpoint is: the loaded state shares no tensor with the live one)
    saved = io.BytesIO()
    torch.save({"model": full_model, "optim": full_optim}, saved)
    saved.seek(0)
    full = torch.load(saved, weights_only=False)
    full_model, full_optim = full["model"], full["optim"]
model2, opt2 = fresh()
try:  # (every rank reads rank 0's checkpoint; with broadcast_from_rank0 set_state_dict meets another bug)
    full = [{"model": full_model, "optim": full_optim} if rank == 0 else None]
    dist.broadcast_object_list(full)
    state_dict.set_state_dict(model2, opt2, model_state_dict=full[0]["model"], optim_state_dict=full[0]["optim"],
                              options=StateDictOptions(full_state_dict=True))
except (AssertionError, KeyError) as e:
    where = traceback.extract_tb(e.__traceback__)[-1]
    print(f"rank {rank}: CRASH: {type(e).__name__}: {e} (at {where.name}: {where.line})", flush=True)
    sys.exit(1)
step(model, opt, 1)
step(model2, opt2, 1)
error = max((a.full_tensor() - b.full_tensor()).abs().max().item() for a, b in zip(model.parameters(),
                                                                                   model2.parameters()))
print(f"rank {rank}: the resumed run's parameters after step 2 differ by up to {error:.3g}: "
      f"{'OK' if error == 0 else 'MISMATCH'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if error == 0 else 1)
