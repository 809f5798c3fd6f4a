"""torch 2.15: FSDP1 (use_orig_params=True) loses the parameters of a frozen unit that runs more than once per step under
re-entrant activation checkpointing: after the first backward they are no longer registered on their modules, so
`model.parameters()`, `model.state_dict()` and `summon_full_params` no longer contain them.

In the backward, the re-entrant checkpoint recomputes the unit's forward; FSDP's pre-forward then takes the
BACKWARD_PRE branch of `FlatParamHandle._use_unsharded_views(as_params=False)`, which sets each view on its module
as a plain tensor (removing it from `module._parameters`) and leaves it to the post-backward hook to register the
parameters again (`_use_sharded_views`). A frozen unit produces no gradient, so no post-backward hook runs, and the
backward's final callback, `_catch_all_reshard`, sees the flat parameter already on its local shard (under NO_SHARD it
always is) and returns without restoring the views. A unit run once per step is not affected; neither is a trainable
one. A checkpoint saved afterwards through torch.distributed.checkpoint fails ("FSDP assumes ... is in the state_dict
but the state_dict only has ...").

Setup: one process is enough (1 rank, gloo); nn.Linear(4, 8), two frozen residual Linear(8, 8) blocks each in its
own FSDP unit, nn.Linear(8, 3); the blocks run twice per forward, each call under
torch.utils.checkpoint(use_reentrant=True); one backward. `--fixed`: the catch-all also restores the views of a
handle whose parameters are no longer registered (shardfuzz's known fix `torch-fsdp1-frozen-recomputed-unit-views`).

Found by shardfuzz's torch-fsdp1 target (2026-12-05, a 8-minute campaign, seed 267): first as a harness error (its
worker read the parameters by name inside summon_full_params; it now reports the loss as a divergence), and as the
state-dict crash above on a case that resumes from a checkpoint; both cases have every block frozen, re-entrant
checkpointing and `layer_passes` 2-3.

Run: torchrun --nproc_per_node 1 torch-2.15-fsdp1-frozen-recomputed-unit-parameters-unregistered.py [--fixed]
[NO_SHARD|FULL_SHARD|SHARD_GRAD_OP]  (CPU, gloo). Prints MISMATCH or OK.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

dist.init_process_group("gloo")
STRATEGY = next((a for a in sys.argv[1:] if not a.startswith("--")), "NO_SHARD")
PASSES = 2

if "--fixed" in sys.argv:
    from torch.distributed.fsdp import _runtime_utils

    released = _runtime_utils._catch_all_reshard

    def _catch_all_reshard(state):
        released(state)
        handle = state._handle
        if handle is not None and handle._use_orig_params and any(
                name not in module._parameters for name, module, _ in handle.flat_param._param_infos):
            handle._use_sharded_views()

    _runtime_utils._catch_all_reshard = _catch_all_reshard


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.linear(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(4, 8), nn.Linear(8, 3)
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        x = self.inp(x)
        for block in list(self.blocks) * PASSES:  # shared blocks: each unit runs PASSES times
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)
        return self.out(x)


torch.manual_seed(0)
model = Model()
model.blocks.requires_grad_(False)  # fine-tuning: the blocks frozen
kw = dict(sharding_strategy=getattr(ShardingStrategy, STRATEGY), device_id=torch.device("cpu"), use_orig_params=True)
for i, block in enumerate(model.blocks):
    model.blocks[i] = FSDP(block, **kw)
fsdp = FSDP(model, **kw)
before = [n for n, _ in fsdp.named_parameters()]
fsdp(torch.randn(4, 4, generator=torch.Generator().manual_seed(1))).square().sum().backward()
after = [n for n, _ in fsdp.named_parameters()]
lost = [n.replace("_fsdp_wrapped_module.", "") for n in before if n not in after]
print(f"{STRATEGY}: {len(before)} parameters registered before the backward, {len(after)} after")
print(f"MISMATCH: no longer registered: {lost}" if lost else "OK: every parameter still registered")
dist.destroy_process_group()
