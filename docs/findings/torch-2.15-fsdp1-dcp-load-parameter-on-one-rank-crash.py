"""torch 2.15: an FSDP1 model and optimizer saved with torch.distributed.checkpoint's `get_state_dict` cannot be loaded
back when a parameter's elements all lie in one rank's shard of the flat parameter: `dcp.load` fails on every rank
with "Missing key in checkpoint state_dict: optim.param_groups." (torch 2.5.1 fails too, differently: "Only single
local shard is supported"). The same model under FSDP2 (`fully_shard`) saves and loads.

Setup: 3 ranks, FSDP1 (FULL_SHARD, use_orig_params=True) over nn.Sequential(Linear(4, 2), Linear(2, 2)) without
biases, Adam, one step; the torchtitan recipe: `get_state_dict`, `dcp.save`; a fresh model and optimizer,
`get_state_dict`, `dcp.load`, `set_state_dict`. The flat parameter's 12 elements split 4 / 4 / 4: ranks 0 and 1 hold
the first weight, rank 2 the whole second weight. With `6,6,6` as argument (each weight on two ranks) it loads. A
clue, not a root cause: the failing rank is the one whose sharded optimizer state of a parameter has no local shard
(rank 2 here: nothing of the first weight), and the load plan it builds holds `optim.param_groups` as one leaf (a list
of dicts, wrapped around create_default_local_load_plan), where the checkpoint's metadata and the other ranks have it
flattened (`optim.param_groups.0.lr`, ...); `_flatten_sharded_tensors` drops a ShardedTensor without local shards
(`if len(shards) == 0: return`), which may leave the rank's state dict flattened by other rules.

Found by shardfuzz's torch-fsdp1 target (2026-12-05) on
`tests/python-resume/dp3-zero3-persistent-sub-groups-adam-accumulation-resume-after-1-f32.json` (dp 3, `resume_after`
1); the same case on 2 ranks passes.

Run: torchrun --nproc_per_node 3 torch-2.15-fsdp1-dcp-load-parameter-on-one-rank-crash.py [SIZES]  (CPU, gloo;
SIZES the layers' widths, default 4,2,2). Prints CRASH or OK on rank 0.
"""

import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

dist.init_process_group("gloo")
RANK = dist.get_rank()
SIZES = [int(a) for a in (sys.argv[1] if len(sys.argv) > 1 else "4,2,2").split(",")]


def make():
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(a, b, bias=False) for a, b in zip(SIZES[:-1], SIZES[1:])])
    f = FSDP(m, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"), use_orig_params=True)
    return f, torch.optim.Adam(f.parameters(), lr=0.1)


model, opt = make()
model(torch.ones(2, SIZES[0])).sum().backward()
opt.step()
path = [tempfile.mkdtemp() if RANK == 0 else None]
dist.broadcast_object_list(path)
try:
    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path[0])
    fresh, fresh_opt = make()
    model_state, optim_state = get_state_dict(fresh, fresh_opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path[0])
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    verdict = "OK"
except BaseException as e:  # dcp raises CheckpointException (a BaseException) carrying every rank's error
    verdict = f"CRASH: {type(e).__name__}: {str(e).strip().splitlines()[-1]}"
dist.barrier()
if RANK == 0:
    print(verdict)
    shutil.rmtree(path[0], ignore_errors=True)
dist.destroy_process_group()
