"""PyTorch 2.15: torch's interleaved zero-bubble schedule fails beside FSDP2 resharding after forward once a pipeline
rank holds three or more stages: a weight-gradient step (`W`) cannot find the parameters its input-gradient step
(`I`) recorded (`KeyError: <AccumulateGrad object ...>` in `stage_backward_weight`; in shardfuzz's case, bf16 with
mixed precision, "The tensor has a non-zero number of elements, but its data is not allocated yet" in the same
call).

`stage_backward_input` records, for the stage's weights, the autograd nodes the weight step will differentiate;
`stage_backward_weight` maps them back to `submod.parameters()` as they are when it runs. With three stages per rank
(pp 2, 6 stages, 4 micro-batches) the runtime's plan (torch prints it on the error) puts a forward of the same stage
between its input and weight steps: 3I1, 3W0, 3F2, ..., 3W1. The plan holds no RESHARD of stage 3 there, but FSDP2
reshards the stage itself after that forward (`reshard_after_forward=True`), so 3W1 finds the sharded parameters, not
the unsharded ones 3I1 recorded. Two stages per rank, `reshard_after_forward=False`, or plain (non-FSDP) stages are
fine; the known FSDP2 zero-bubble fix (unsharding before the input backward,
torch-2.15-pipelining-zero-bubble-fsdp-last-stage-no-grad.py) does not help alone.

Found by shardfuzz (torch-pp target): pp 2 x dp 2, ZeRO-3, interleaved zero bubble with 3 stages per rank, 4
micro-batches, bf16 with f32 master weights: CRASH at the first step.

Run: torchrun --nproc_per_node 4 torch-2.15-pipelining-interleaved-zero-bubble-fsdp-three-stages-crash.py [--fix] [--keep]
(CPU, gloo). Raises the KeyError on the ranks of the second pipeline rank (torchrun reports the failure); prints OK
(rank 0) where the step completes. `--fix` unshards the stage's FSDP2 modules before its weight step (FSDP2 unshards
into the same parameter objects), and before its input step for the known bug of that one: OK. `--keep` keeps the
parameters unsharded after forward (OK). V=2 in the environment holds two stages per rank: no crash, but the known
bug of the input step (NO GRADIENT on the last stage) without `--fix`.
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

if "--fix" in sys.argv:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.pipelining import stage as stage_module

    original = stage_module._PipelineStageBase.backward_maybe_with_nosync

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
        if backward_type in ("input", "weight"):
            for module in self.submod.modules():
                if isinstance(module, FSDPModule):
                    module.unshard()
        return original(self, backward_type, bwd_kwargs, last_backward)

    stage_module._PipelineStageBase.backward_maybe_with_nosync = backward_maybe_with_nosync

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
