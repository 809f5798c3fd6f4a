"""torch 2.15: FSDP1's full optimizer state dict of a model on the CPU gives every state tensor of a parameter the
values of the last one gathered: Adam's `exp_avg` comes out as its `exp_avg_sq`, and a run resumed from it diverges,
silently.

`_allgather_orig_param_states` (torch/distributed/fsdp/_optim_utils.py:1551-1672) all-gathers each state of a flat
parameter (`exp_avg`, then `exp_avg_sq`) into one buffer, `gathered_tensor`, reused for every state, and
`_unflatten_orig_param_states` keeps views of it: without offloading it copies them (`value.detach().clone()`,
:1501-1503), offloading it takes `value.cpu()` (:1505-1507), which is no copy when the buffer is already on the CPU
(FSDP1 with `device_id=torch.device("cpu")`), so the next state's all-gather overwrites the previous state's views.
Offloading is the default of the full optimizer state dict (`FullOptimStateDictConfig(offload_to_cpu=True)`), and of
torch.distributed.checkpoint's `get_state_dict(..., StateDictOptions(full_state_dict=True, cpu_offload=True))`, the
documented way to write one file from a sharded model. On a GPU the `.cpu()` copies and nothing is lost.

Found by shardfuzz's torch-fsdp1 target (2026-12-06, the day it learned full-state-dict checkpoints:
`train.checkpoint_layout` gathered): dp 2 to 4, ZeRO-3 (FULL_SHARD and HYBRID_SHARD), Adam, resumed after step 1:
`loss/step2` 28,332 times its noise; SGD passes; with the copy made it passes.

This script: 2 ranks, a two-layer model under FSDP1 on the CPU, one Adam step, the full optimizer state dict by
`get_state_dict(full_state_dict=True, cpu_offload=True)` against the same without offloading (copied: correct).
`--fixed`: the offloaded states copied (OK).

Run: torchrun --nproc_per_node 2 torch-2.15-fsdp1-cpu-full-optim-state-dict-moments-aliased.py [--fixed] (CPU,
gloo). Prints MISMATCH (exit 1) or OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import _optim_utils

if "--fixed" in sys.argv:
    unflatten = _optim_utils._unflatten_orig_param_states

    def unflatten_copied(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload):
        unflatten(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload)
        if cpu_offload and not shard_state:
            for states in output_states.values():
                if torch.is_tensor(states.get(state_name)) and states[state_name].dim() > 0:
                    states[state_name] = states[state_name].clone()

    _optim_utils._unflatten_orig_param_states = unflatten_copied

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = FSDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)), use_orig_params=True,
             device_id=torch.device("cpu"))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
torch.manual_seed(100 + rank)
model(torch.randn(4, 8)).square().sum().backward()
opt.step()

# (Offloaded, the full state dict is rank 0's only.)
_, offloaded = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
_, copied = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
error = [0.0]
if rank == 0:
    for name, state in copied["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            error[0] = max(error[0], (offloaded["state"][name][key] - state[key]).abs().max().item())
    first = next(iter(copied["state"]))
    print(f"{first}: exp_avg {copied['state'][first]['exp_avg'].flatten()[:2].tolist()}, offloaded "
          f"{offloaded['state'][first]['exp_avg'].flatten()[:2].tolist()} (its exp_avg_sq "
          f"{copied['state'][first]['exp_avg_sq'].flatten()[:2].tolist()})", flush=True)
dist.broadcast_object_list(error)
error = error[0]
if rank == 0:
    print(f"the offloaded full optimizer state dict differs by up to {error:.3g}: {'OK' if error == 0 else 'MISMATCH'}",
          flush=True)
dist.destroy_process_group()
sys.exit(0 if error == 0 else 1)
