"""PyTorch 2.15: a pipeline stage wrapped in DistributedDataParallel fails its second schedule step with an internal
assert of DDP's reducer.

torch.distributed.pipelining supports stages wrapped in DDP (`_PipelineStageBase.forward_maybe_with_nosync` runs every
micro-batch's forward under `no_sync()`, `backward_maybe_with_nosync` calls `reducer.prepare_for_backward` before the
last micro-batch's backward). The runtime shape inference added since (`PipelineStage` without `input_args` /
`output_args`, "dynamic mode") runs the stage's module once more on the first step, in `_forward_metadata_inference`,
calling `self.submod(...)` directly: DDP's forward outside `no_sync()`. DDP then prepares its reducer for a backward
(`expect_autograd_hooks_`) that never comes (the inference takes input gradients only), so the first micro-batch's
backward under `no_sync()` is reduced after all and the first step records the parameters' gradient-ready order twice
(3 parameters, 6 entries). The next forward rebuilds DDP's buckets from that order:

    RuntimeError: params_.size() == rebuilt_param_indices_.size() INTERNAL ASSERT FAILED at ".../reducer.cpp":2079,
    please report a bug to PyTorch. rebuilt parameter indices size is not same as original model parameters size.
    Original model param size is: 3 versus rebuilt params size of: 6

ScheduleGPipe fails for every micro-batch count; Schedule1F1B where no forward falls between the inference and the last
backward (2 micro-batches over 2 stages). (The first step's gradients are right: averaging an averaged gradient again
leaves it.)

Found by shardfuzz (torch-pp target, its first campaign): pp 2 × dp 2, ZeRO 0 (stages in DDP), 1F1B, 2 micro-batches.

Run: torchrun --nproc_per_node 4 torch-2.15-pipelining-ddp-stage-metadata-inference-assert.py [--fix] [--gpipe]
(CPU, gloo). Prints CRASH (from each failing rank) or OK (rank 0). `--fix` runs the metadata inference's forward under DDP's `no_sync()`, as
every other forward of the stage runs.
"""

import contextlib
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining import stage as stage_module
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
RANK = dist.get_rank()
PP, DP, MICROBATCHES, VOCAB, HIDDEN = 2, 2, 2, 13, 8

if "--fix" in sys.argv:
    original = stage_module.PipelineStage._forward_metadata_inference

    def forward_metadata_inference(self, *args, **kwargs):
        quiet = self.submod.no_sync() if isinstance(self.submod, DDP) else contextlib.nullcontext()
        with quiet:
            return original(self, *args, **kwargs)

    stage_module.PipelineStage._forward_metadata_inference = forward_metadata_inference

mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
pp = RANK // DP
torch.manual_seed(0)
first = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN))
last = nn.Sequential(nn.Linear(HIDDEN, VOCAB))
module = DDP(first if pp == 0 else last, process_group=mesh["dp"].get_group())
stage = PipelineStage(module, pp, PP, torch.device("cpu"), group=mesh.get_group("pp"))
Schedule = ScheduleGPipe if "--gpipe" in sys.argv else Schedule1F1B
schedule = Schedule(stage, MICROBATCHES, loss_fn=lambda out, tgt: F.cross_entropy(out.reshape(-1, VOCAB), tgt.reshape(-1)))
opt = torch.optim.SGD(module.parameters(), lr=0.1)
ids = torch.randint(0, VOCAB, (2 * MICROBATCHES, 4))
targets = torch.randint(0, VOCAB, (2 * MICROBATCHES, 4))
rows = slice(RANK % DP * MICROBATCHES, (RANK % DP + 1) * MICROBATCHES)
failure = None
for step in range(2):
    opt.zero_grad()
    try:
        if pp == 0:
            schedule.step(ids[rows])
        else:
            schedule.step(target=targets[rows], losses=[])
    except RuntimeError as e:
        failure = f"step {step}: {str(e.__cause__ or e).strip().splitlines()[0]}"
        break
    opt.step()
if failure:
    # (A rank whose peer failed waits for it until the process group's timeout, then fails too.)
    print(f"CRASH on rank {RANK}, {failure}", flush=True)
    os._exit(1)
dist.barrier()
if RANK == 0:
    print("OK: two steps of DDP-wrapped pipeline stages", flush=True)
dist.destroy_process_group()
