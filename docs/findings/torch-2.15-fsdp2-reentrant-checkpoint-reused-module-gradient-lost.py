"""torch 2.15: FSDP2 silently drops a gradient of a module that runs twice under re-entrant activation checkpointing.

A `fully_shard`ed module applied twice per step (shared layers, as ALBERT or a universal transformer use them),
each call under `torch.utils.checkpoint(..., use_reentrant=True)`: the backward recomputes the module twice, in
two nested backward passes. The first nested pass reduces the module's gradient and reshards it; the second
recomputation finds the module's FSDPState still in PRE_BACKWARD, where `FSDPState._pre_forward` unshards the
parameters again but returns before registering the post-backward hook (`_register_post_backward_hook`). That
use's gradient lands on the unsharded parameters, is never reduce-scattered, and after backward the module still
holds unsharded plain Parameters. No error; the gradient is the first use's alone. use_reentrant=False, or one
use per step, give the right gradient.

Found by shardfuzz (torch-fsdp2 target, `model.layer_passes` 2 with `activation_checkpointing` reentrant; minimized
to one rank, one MLP block, float64).

Run: torchrun --nproc_per_node 2 torch-2.15-fsdp2-reentrant-checkpoint-reused-module-gradient-lost.py [--fixed]
(CPU, gloo; `--fixed` registers the post-backward hook in that branch too). Prints MISMATCH or OK.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint


class Shared(nn.Module):
    """`lin` applied twice, each use checkpointed."""

    def __init__(self, use_reentrant):
        super().__init__()
        self.lin, self.head, self.use_reentrant = nn.Linear(4, 4), nn.Linear(4, 1), use_reentrant

    def forward(self, x):
        for _ in range(2):
            x = torch.tanh(checkpoint(self.lin, x, use_reentrant=self.use_reentrant))
        return self.head(x).sum()


def fix():
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    original = FSDPState._pre_forward

    def _pre_forward(self, module, args, kwargs):
        if self._training_state != TrainingState.PRE_BACKWARD:
            return original(self, module, args, kwargs)
        resharded = [g for g in self._fsdp_param_groups if not g.is_unsharded]
        args, kwargs = original(self, module, args, kwargs)
        for group in resharded:
            args, kwargs = group._register_post_backward_hook(args, kwargs)
        return args, kwargs

    FSDPState._pre_forward = _pre_forward


def main():
    dist.init_process_group("gloo")
    if "--fixed" in sys.argv:
        fix()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    ok = True
    for use_reentrant in (False, True):
        torch.manual_seed(1)
        plain = Shared(use_reentrant)
        torch.manual_seed(1)
        sharded = Shared(use_reentrant)
        fully_shard(sharded.lin)
        fully_shard(sharded)
        plain(x).backward()
        sharded(x).backward()
        w = sharded.lin.weight
        grad = w.grad.full_tensor() if hasattr(w.grad, "full_tensor") else w.grad
        diff = (grad - plain.lin.weight.grad).abs().max().item()
        ok &= diff < 1e-6
        if dist.get_rank() == 0:
            print(f"use_reentrant={use_reentrant}: lin.weight is a {type(w).__name__} after backward; max |FSDP2 grad -"
                  f" single-device grad| = {diff:.3e} (gradient norm {plain.lin.weight.grad.norm().item():.3e})")
    if dist.get_rank() == 0:
        print(f"torch {torch.__version__}: {'OK' if ok else 'MISMATCH'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
