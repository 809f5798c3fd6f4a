"""torch 2.15: torch.distributed.checkpoint's `set_state_dict` with `broadcast_from_rank0` hangs when the ranks other
than 0 hand in empty state dicts, which is what that option asks of them.

`StateDictOptions.broadcast_from_rank0` is documented as: "rank0 should receive a full state_dict and will broadcast
the tensors in the state_dict/optim_state_dict one by one to other ranks. Other ranks will receive the tensors and
shard according to the local shards in the model and optimizer." `set_state_dict` (state_dict.py:1525-1542) decides
`optim_only=not model_state_dict` on each rank: rank 0, holding the model's full state dict, loads the model
(`_load_model_state_dict` broadcasts its tensors one by one); the others, handed `{}`, are optimizer-only, skip the
model and leave rank 0 alone in its broadcast (it then times out, or the job hangs). `set_model_state_dict` and
`set_optimizer_state_dict` called separately (torchtune's way) do not decide from the dicts and load.

Found by shardfuzz's torch-tp, torch-fsdp2 and torch-fsdp1 targets (2026-12-06, the day they learned full-state-dict
checkpoints, `train.checkpoint_layout` gathered): every case hangs in the load; with rank 0's decision followed by
every rank they pass.

This script: 2 ranks, a two-layer model under FSDP2 (`fully_shard`) on the CPU, one Adam step, the full state dicts
gathered to rank 0 (`full_state_dict=True, cpu_offload=True`) and saved there, a fresh model and optimizer loading them with
`set_state_dict(..., broadcast_from_rank0=True)`, rank 1 handing in empty dicts. `--fixed`: every rank follows rank 0's
decision (OK).

Run: torchrun --nproc_per_node 2 torch-2.15-dsd-set-state-dict-broadcast-from-rank0-hang.py [--fixed] (CPU, gloo; the
process group times out after 30 s). Prints HANG (exit 1) or OK / MISMATCH.
"""

import datetime
import io
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

if "--fixed" in sys.argv:
    set_state_dict = state_dict.set_state_dict

    def set_state_dict_as_rank0(model, optimizers, *, model_state_dict, optim_state_dict, options=None):
        if options is not None and options.broadcast_from_rank0:
            loads_model = [bool(model_state_dict)]
            dist.broadcast_object_list(loads_model, src=0)
            if loads_model[0] and not model_state_dict:
                state_dict.set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
                return state_dict.set_model_state_dict(model, model_state_dict, options=options)
        return set_state_dict(model, optimizers, model_state_dict=model_state_dict, optim_state_dict=optim_state_dict,
                              options=options)

    state_dict.set_state_dict = set_state_dict_as_rank0

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))


def fresh():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


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
try:
    state_dict.set_state_dict(model2, opt2, model_state_dict=full_model if rank == 0 else {},
                              optim_state_dict=full_optim if rank == 0 else {},
                              options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
except RuntimeError as e:  # gloo's timeout
    print(f"rank {rank}: HANG: set_state_dict did not finish ({str(e).splitlines()[0][:120]})", flush=True)
    sys.exit(1)
step(model, opt, 1)
step(model2, opt2, 1)
error = max((a.full_tensor() - b.full_tensor()).abs().max().item() for a, b in zip(model.parameters(),
                                                                                   model2.parameters()))
print(f"rank {rank}: the resumed run's parameters after step 2 differ by up to {error:.3g}: "
      f"{'OK' if error == 0 else 'MISMATCH'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if error == 0 else 1)
