"""PyTorch 2.15: under torch's zero-bubble pipeline schedules, the last stage's FSDP2 parameters get no gradient when
they are resharded after forward (`fully_shard(..., reshard_after_forward=True)`, torchtitan's "always" policy).

A zero-bubble schedule (`ScheduleZBVZeroBubble`, `ScheduleInterleavedZeroBubble`) splits each backward in two:
`stage_backward_input` computes the input gradients and records, for each of the stage's weights, the autograd nodes
`stage_backward_weight` will differentiate later. It reads the weights from `submod.parameters()` before its autograd
call. On the last stage the loss backward follows the forward at once, so FSDP2's pre-backward unshard has not run
and `parameters()` are still the resharded DTensors, which are not in the graph: no parameter group is recorded, the
weight backward has nothing to do, and every parameter of the last stage ends the step with `.grad = None`. FSDP2
reduces nothing and the optimizer silently skips them: the last stage never trains. (The other stages' input
backward starts from received gradients after FSDP2 has unsharded their parameters; `ScheduleInterleaved1F1B` and
`reshard_after_forward=False` are fine.)

Found by shardfuzz (torch-pp target, the case field `zero_bubble`): pp 2 × dp 2, ZeRO-3 (stages in FSDP2, resharded
after forward), interleaved zero bubble and ZBV: "the schedule's step left trainable parameters without a gradient".

Run: torchrun --nproc_per_node 4 torch-2.15-pipelining-zero-bubble-fsdp-last-stage-no-grad.py [--fix] [--interleaved]
(CPU, gloo). Prints NO GRADIENT (each rank holding the last stage) or OK (rank 0). `--fix` unshards the stage's FSDP2
modules before its input-gradient backward, as FSDP2's pre-backward hook would.
"""

import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.pipelining import ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import stage as stage_module

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
RANK = dist.get_rank()
PP, DP, MICROBATCHES, VOCAB, HIDDEN = 2, 2, 2, 13, 8

if "--fix" in sys.argv:
    original = stage_module._PipelineStageBase.backward_maybe_with_nosync

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
        if backward_type == "input":
            for module in self.submod.modules():
                if isinstance(module, FSDPModule):
                    module.unshard()
        return original(self, backward_type, bwd_kwargs, last_backward)

    stage_module._PipelineStageBase.backward_maybe_with_nosync = backward_maybe_with_nosync

mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
pp = RANK // DP
torch.manual_seed(0)
every_stage = [nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN)),
               nn.Sequential(nn.Linear(HIDDEN, HIDDEN)), nn.Sequential(nn.Linear(HIDDEN, HIDDEN)),
               nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB))]
interleaved = "--interleaved" in sys.argv
mine = [pp, pp + PP] if interleaved else [pp, 2 * PP - 1 - pp]  # ZBV places stages in a V
modules = [every_stage[i] for i in mine]
for module in modules:
    fully_shard(module, mesh=mesh["dp"], reshard_after_forward=True)
stages = [PipelineStage(m, i, 2 * PP, torch.device("cpu"), group=mesh.get_group("pp")) for m, i in zip(modules, mine)]
Schedule = ScheduleInterleavedZeroBubble if interleaved else ScheduleZBVZeroBubble
schedule = Schedule(stages, MICROBATCHES, loss_fn=lambda out, tgt: F.cross_entropy(out.reshape(-1, VOCAB), tgt.reshape(-1)))
ids = torch.randint(0, VOCAB, (DP * MICROBATCHES, 4))
targets = torch.randint(0, VOCAB, (DP * MICROBATCHES, 4))
rows = slice(RANK % DP * MICROBATCHES, (RANK % DP + 1) * MICROBATCHES)
first, last = 0 in mine, 2 * PP - 1 in mine
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
