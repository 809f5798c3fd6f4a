"""PyTorch 2.15: torch's interleaved zero-bubble schedule fails beside FSDP2 resharding after forward once a pipeline
rank holds three or more stages: a weight-gradient step (`W`) cannot find the parameters its input-gradient step
(`I`) recorded (`KeyError: <AccumulateGrad object ...>` in `stage_backward_weight`; in shardfuzz's case, bf16 with
mixed precision, "The tensor has a non-zero number of elements, but its data is not allocated yet" in the same
call).

`stage_backward_input` records, for the stage's weights, the autograd nodes the weight step will differentiate;
`stage_backward_weight` maps them back to `submod.parameters()` as they are when it runs. With three stages per rank
(pp 2, 6 stages, 4 micro-batches) the W step of stage 3 for micro-batch 1 finds other parameter objects than its I
step saw, although the runtime's own plan (printed by torch on the error) holds no RESHARD of stage 3 between its
I1 and W1: stage 3's FSDP2 parameters were replaced in between, as FSDP2 does when it reshards and unshards. Two
stages per rank, `reshard_after_forward=False`, or plain (non-FSDP) stages are fine; the known FSDP2 zero-bubble fix
(unsharding before the input backward, torch-2.15-pipelining-zero-bubble-fsdp-last-stage-no-grad.py) does not help.

Found by shardfuzz (torch-pp target): pp 2 x dp 2, ZeRO-3, interleaved zero bubble with 3 stages per rank, 4
micro-batches, bf16 with f32 master weights: CRASH at the first step.

Run: torchrun --nproc_per_node 4 torch-2.15-pipelining-interleaved-zero-bubble-fsdp-three-stages-crash.py [--keep]
(CPU, gloo). Raises the KeyError on the ranks of the second pipeline rank (torchrun reports the failure); prints OK
(rank 0) where the step completes. `--keep` keeps the parameters unsharded after forward (OK). V=2 in the environment
holds two stages per rank: no crash, but the other, known bug (NO GRADIENT on the last stage).
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import ScheduleInterleavedZeroBubble
from torch.distributed.pipelining import PipelineStage

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
RANK = dist.get_rank()
PP, DP, MICROBATCHES, VOCAB, HIDDEN = 2, 2, 4, 13, 8
V = int(os.environ.get("V", "3"))  # stages per pipeline rank

mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
pp = RANK // DP
torch.manual_seed(0)
every_stage = [nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN)),
               *[nn.Sequential(nn.Linear(HIDDEN, HIDDEN)) for _ in range(V * PP - 2)],
               nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB))]
mine = [pp + k * PP for k in range(V)]
modules = [every_stage[i] for i in mine]
for module in modules:
    fully_shard(module, mesh=mesh["dp"], reshard_after_forward="--keep" not in sys.argv)
stages = [PipelineStage(m, i, V * PP, torch.device("cpu"), group=mesh.get_group("pp")) for m, i in zip(modules, mine)]
schedule = ScheduleInterleavedZeroBubble(stages, MICROBATCHES, loss_fn=lambda out, tgt: F.cross_entropy(out.reshape(-1, VOCAB), tgt.reshape(-1)))
ids = torch.randint(0, VOCAB, (DP * MICROBATCHES, 4))
targets = torch.randint(0, VOCAB, (DP * MICROBATCHES, 4))
rows = slice(RANK % DP * MICROBATCHES, (RANK % DP + 1) * MICROBATCHES)
first, last = 0 in mine, V * PP - 1 in mine
schedule.step(*([ids[rows]] if first else []), **({"target": targets[rows], "losses": []} if last else {}))
missing = [f"stage {i}: {n}" for m, i in zip(modules, mine) for n, p in m.named_parameters() if p.grad is None]
if missing:
    print(f"NO GRADIENT on rank {RANK} after the step (the optimizer skips these): {', '.join(missing)}", flush=True)
flags = torch.tensor([len(missing)])
dist.all_reduce(flags)
if RANK == 0 and flags.item() == 0:
    print("OK: every parameter of every stage has a gradient", flush=True)
dist.destroy_process_group()
sys.exit(1 if flags.item() else 0)
