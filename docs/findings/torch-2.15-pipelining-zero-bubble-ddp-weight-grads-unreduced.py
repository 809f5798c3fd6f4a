"""PyTorch 2.15: under torch's zero-bubble pipeline schedules, a stage wrapped in DistributedDataParallel never reduces
its weight gradients over the data-parallel ranks: every replica steps with its own local gradient.

A zero-bubble schedule (`ScheduleZBVZeroBubble`, `ScheduleInterleavedZeroBubble`) splits each backward in two; the
weight part, `stage_backward_weight`, computes the weight gradients with `torch.autograd.grad` and adds them to
`.grad` itself. DDP all-reduces a gradient when its accumulation hook fires in an autograd backward, which never
happens here; `backward_maybe_with_nosync` still calls `reducer.prepare_for_backward` before the last weight backward
(pytorch/pytorch#134052 made the split backward go through it, and called FSDP's post-backward by hand, but nothing
does DDP's reduction). The replicas' gradients differ after the step (a stage whose backward is not split, the first,
is reduced as usual), and their parameters part.

Found by shardfuzz (torch-pp target, the case field `zero_bubble`): pp 2 × dp 2, ZeRO 0 (stages in DDP), ZBV:
`grad/lm_head.weight` and every gradient of stages 1 to 3 off by up to 2.2e6 ε in f32.

Run: torchrun --nproc_per_node 4 torch-2.15-pipelining-zero-bubble-ddp-weight-grads-unreduced.py [--fix] [--interleaved]
(CPU, gloo). Prints MISMATCH (rank 0: each parameter whose gradient differs between the two data-parallel replicas)
or OK. `--fix` averages a DDP stage's gradients over its process group after its last weight backward.
"""

import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble
from torch.distributed.pipelining import stage as stage_module
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
RANK = dist.get_rank()
PP, DP, MICROBATCHES, VOCAB, HIDDEN = 2, 2, 2, 13, 8

if "--fix" in sys.argv:
    original = stage_module._PipelineStageBase.backward_maybe_with_nosync

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
        result = original(self, backward_type, bwd_kwargs, last_backward)
        if isinstance(self.submod, DDP) and backward_type == "weight" and last_backward:
            for p in self.submod.module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.submod.process_group)
                    p.grad.div_(dist.get_world_size(self.submod.process_group))
        return result

    stage_module._PipelineStageBase.backward_maybe_with_nosync = backward_maybe_with_nosync

mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
pp = RANK // DP
torch.manual_seed(0)
every_stage = [nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN)),
               nn.Sequential(nn.Linear(HIDDEN, HIDDEN)), nn.Sequential(nn.Linear(HIDDEN, HIDDEN)),
               nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB))]
interleaved = "--interleaved" in sys.argv
mine = [pp, pp + PP] if interleaved else [pp, 2 * PP - 1 - pp]  # ZBV places stages in a V
modules = [DDP(every_stage[i], process_group=mesh["dp"].get_group()) for i in mine]
stages = [PipelineStage(m, i, 2 * PP, torch.device("cpu"), group=mesh.get_group("pp")) for m, i in zip(modules, mine)]
Schedule = ScheduleInterleavedZeroBubble if interleaved else ScheduleZBVZeroBubble
schedule = Schedule(stages, MICROBATCHES, loss_fn=lambda out, tgt: F.cross_entropy(out.reshape(-1, VOCAB), tgt.reshape(-1)))
ids = torch.randint(0, VOCAB, (DP * MICROBATCHES, 4))
targets = torch.randint(0, VOCAB, (DP * MICROBATCHES, 4))
rows = slice(RANK % DP * MICROBATCHES, (RANK % DP + 1) * MICROBATCHES)
first, last = 0 in mine, 2 * PP - 1 in mine
schedule.step(*([ids[rows]] if first else []), **({"target": targets[rows], "losses": []} if last else {}))
grads = {f"stage {i}: {n}": p.grad.clone() for m, i in zip(modules, mine) for n, p in m.module.named_parameters()}
replicas = [None] * dist.get_world_size()
dist.all_gather_object(replicas, grads)
if RANK == 0:
    differ = []
    for r in range(0, dist.get_world_size(), DP):  # each pipeline rank's data-parallel replicas
        for name, g in replicas[r].items():
            worst = max(float((replicas[r + d][name] - g).abs().max()) for d in range(1, DP))
            if worst > 1e-6 * max(1.0, float(g.abs().max())):
                differ.append(f"{name} (pipeline rank {r // DP}): replicas differ by {worst:.3g}")
    print("MISMATCH: gradients not reduced over the data-parallel replicas\n  " + "\n  ".join(differ) if differ
          else "OK: every stage's gradients agree across the data-parallel replicas", flush=True)
    code = 1 if differ else 0
else:
    code = 0
dist.destroy_process_group()
sys.exit(code)
