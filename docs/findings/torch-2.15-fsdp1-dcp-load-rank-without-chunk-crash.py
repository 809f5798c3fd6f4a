"""torch 2.15: an FSDP1 model and optimizer saved with torch.distributed.checkpoint's `get_state_dict` cannot be loaded
back when a parameter's first dimension splits into fewer torch.chunk pieces than there are ranks (2 rows on 3
ranks; 4 rows on 3 ranks: chunks of 2 and 2): `dcp.load` fails on every rank with "Missing key in checkpoint
state_dict: optim.param_groups." (torch 2.5.1 fails too, differently: "Only single local shard is supported"). The
same model under FSDP2 (`fully_shard`, DTensor shards) saves and loads.

Setup: 3 ranks, FSDP1 (FULL_SHARD, use_orig_params=True) over nn.Sequential(Linear(4, 2), Linear(2, 2)) without
biases, Adam, one step; the torchtitan recipe: `get_state_dict`, `dcp.save`; a fresh model and optimizer,
`get_state_dict`, `dcp.load`, `set_state_dict`. FSDP1's sharded state dict splits each parameter (and each optimizer
state) by `tensor.chunk(world_size, dim=0)` (`_shard_utils._create_chunk_sharded_tensor`), so the 2-row weights give
ranks 0 and 1 a row each and rank 2 a ShardedTensor with no local shard. Widths `4,6,2` and `6,2,6` crash too (one
2-row weight); `6,6,6`, `3,6,6` and `2,3,3` (every weight with a row per rank, whatever the flat parameter's layout)
load.

Root cause (torch/distributed/checkpoint/default_planner.py): DefaultLoadPlanner.set_up_planner flattens the state
dict with `_flatten_sharded_tensors`, which drops a ShardedTensor without local shards (`if len(shards) == 0:
return`). create_local_plan then finds the checkpoint's keys of those tensors missing from rank 2's flattened state
dict (model.0.weight, model.1.weight and their exp_avg / exp_avg_sq) and, by its compatibility rule for checkpoints
saved before torch 2.4, re-flattens the original state dict (the dropped tensors still in it) with the 2.3
traversal, finds the missing keys there and adopts that flattening, under which `optim.param_groups` (a list of dicts
without tensors) is one leaf, a key the 2.4+ checkpoint (`optim.param_groups.0.lr`, ...) does not have. Fix
(`--fixed`): `_flatten_sharded_tensors` keeps a ShardedTensor without local shards (it plans no read: it has no
local chunk), so no key looks missing; the loaded model and optimizer state then equal the saved ones exactly (OK).

Found by shardfuzz's torch-fsdp1 target (2026-12-05) on
`tests/python-resume/dp3-zero3-persistent-sub-groups-adam-accumulation-resume-after-1-f32.json` (dp 3, `resume_after`
1); the same case on 2 ranks passes, and on 3 ranks passes with the fix (known fix
`torch-dcp-load-unheld-sharded-tensor`).

Run: torchrun --nproc_per_node 3 torch-2.15-fsdp1-dcp-load-rank-without-chunk-crash.py [--fixed] [WIDTHS]  (CPU,
gloo; WIDTHS the layers' widths, default 4,2,2). Prints CRASH, MISMATCH (the loaded state differs from the saved one)
or OK on rank 0.
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


def make():
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(a, b, bias=False) for a, b in zip(SIZES[:-1], SIZES[1:])])
    f = FSDP(m, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"), use_orig_params=True)
    return f, torch.optim.Adam(f.parameters(), lr=0.1)


if "--fixed" in sys.argv:
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.checkpoint._traverse import set_element, traverse_state_dict

    drop_unheld = default_planner._flatten_sharded_tensors

    def keep_unheld(state_dict):
        out = drop_unheld(state_dict)
        traverse_state_dict(state_dict, lambda path, v: set_element(out, path, v)
                            if isinstance(v, ShardedTensor) and not v.local_shards() else None)
        return out

    default_planner._flatten_sharded_tensors = keep_unheld
    sys.argv.remove("--fixed")
SIZES = [int(a) for a in (sys.argv[1] if len(sys.argv) > 1 else "4,2,2").split(",")]
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
    with FSDP.summon_full_params(model), FSDP.summon_full_params(fresh):
        same = all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
    for a, b in zip(model.parameters(), fresh.parameters()):
        sa, sb = opt.state[a], fresh_opt.state[b]
        same = same and set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    verdict = "OK" if same else "MISMATCH: the loaded state differs from the saved one"
except BaseException as e:  # dcp raises CheckpointException (a BaseException) carrying every rank's error
    verdict = f"CRASH: {type(e).__name__}: {str(e).strip().splitlines()[-1]}"
dist.barrier()
if RANK == 0:
    print(verdict)
    shutil.rmtree(path[0], ignore_errors=True)
dist.destroy_process_group()
