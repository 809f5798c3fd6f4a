"""torch 2.5.1 to 2.15: FSDP1's `ShardedGradScaler` cannot step a fused optimizer once its gradients were unscaled, the
standard recipe before gradient clipping (`scaler.unscale_(opt)`, clip, `scaler.step(opt)`): with
`torch.optim.Adam(..., fused=True)` (AdamW alike; the fused SGD, which keeps no step count, runs) the step raises

    RuntimeError: output with shape [] doesn't match the broadcast shape [1]        (torch/optim/adam.py, _fused_adam)

on every rank, after the fused kernel has already updated the parameters. `torch.amp.GradScaler` runs the same recipe
(one device), and the for-loop / foreach optimizers run under ShardedGradScaler.

Root cause: `ShardedGradScaler.unscale_` records the overflow flag as `torch.full((1,), 0.0)`, a one-element vector,
where `torch.amp.GradScaler.unscale_` uses `torch.full((), 0.0)`, a scalar. For an optimizer that takes the scaler's
tensors itself (`_step_supports_amp_scaling`: the fused ones) `GradScaler.step` hands it the sum of the recorded
flags as `found_inf`, and the fused Adam ends with `torch._foreach_sub_(state_steps, [found_inf] * n)`: the scalar
step counts cannot take the [1]-shaped flag in place. (Without `unscale_` first, `GradScaler.step` re-checks with a
scalar flag of its own and the step runs.) Fix (`--fixed`): ShardedGradScaler's flags as scalars; the parameters then
equal one device's under `torch.amp.GradScaler`.

Possibly the cause of the open pytorch/pytorch#140514 ("Error with fused AdamW" under FSDP, where the maintainers
note that `found_inf` should have shape ()).

Found by shardfuzz's torch-fsdp1 target (2026-12-06, campaign 280) on a case with the new case field
`train.optimizer.implementation` "fused" and dynamic loss scaling
(`tests/python-optimizer/dp2-fsdp1-sharded-scaler-fused-adam-clip-f16-master-f32.json`); with the fix (known fix
`torch-fsdp1-sharded-scaler-scalar-found-inf`) it passes.

Run: torchrun --nproc_per_node 2 torch-2.15-fsdp1-sharded-grad-scaler-fused-optimizer-crash.py [--fixed] [--no-unscale]
(CPU, gloo). Prints CRASH, MISMATCH or OK on rank 0.
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

dist.init_process_group("gloo")
RANK = dist.get_rank()
UNSCALE = "--no-unscale" not in sys.argv

if "--fixed" in sys.argv:
    unscale = ShardedGradScaler.unscale_

    def unscale_(self, optimizer):
        unscale(self, optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        state["found_inf_per_device"] = {d: t.reshape(()) for d, t in state["found_inf_per_device"].items()}

    ShardedGradScaler.unscale_ = unscale_

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
ref = copy.deepcopy(model)
x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))  # every rank the same batch


def step(module, opt, scaler):
    opt.zero_grad()
    scaler.scale(module(x).square().sum()).backward()
    if UNSCALE:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1e9)  # (a no-op clip: the recipe's place for it)
    scaler.step(opt)
    scaler.update()


try:
    sharded = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    opt = torch.optim.Adam(sharded.parameters(), lr=0.01, fused=True)
    step(sharded, opt, ShardedGradScaler("cpu", init_scale=1024.0))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01, fused=True)
    step(ref, ref_opt, torch.amp.GradScaler("cpu", init_scale=1024.0))
    with FSDP.summon_full_params(sharded):
        same = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(sharded.parameters(), ref.parameters()))
    verdict = "OK" if same else "MISMATCH: the parameters differ from one device's under torch.amp.GradScaler"
except Exception as e:
    verdict = f"CRASH: {type(e).__name__}: {str(e).splitlines()[0]}"
if RANK == 0:
    print(verdict)
dist.destroy_process_group()
