"""DeepSpeed 0.19.8: ZeRO-3 overwrites the gradient of a parameter used twice under re-entrant checkpointing.

A module applied twice per step (shared layers), each call under `torch.utils.checkpoint(..., use_reentrant=True)`:
the backward runs in phases, one nested backward per checkpoint, and ZeRO-3 reduces a parameter's gradient in each
phase that uses it. stage3.py gives every phase of a backward "copy semantics" (`partition_grads` copies the
reduced partition over the gradient buffer while `micro_step_id == 0`; the comments at
`independent_gradient_partition_epilogue` and `clear_backward_seen_flag` say so), which is right only if each
parameter is reduced once per backward. Reduced twice, the second copy replaces the first phase's gradient:
silently when the two reductions fall in different buckets (`reduce_bucket_size` below the phase's gradients, as
in any model larger than a bucket); in one bucket `__reduce_and_partition_ipg_grads` asserts that the bucket's
ds_ids are distinct. use_reentrant=False, or one use per step, give the right gradient.

Found by shardfuzz (deepspeed-zero target, `model.layer_passes` 2 with `activation_checkpointing` reentrant, ZeRO-3;
minimized to one rank).

Run: torchrun --nproc_per_node 2 deepspeed-0.19.8-zero3-reentrant-checkpoint-reused-param-gradient-overwritten.py
[--fixed] (CPU, gloo; `--fixed` adds what an earlier phase wrote before the copy). Prints MISMATCH or OK.
"""

import importlib
import os
import sys

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
import deepspeed  # noqa: E402

# The shared-memory allreduce is a JIT-built extension DeepSpeed only needs for inference.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


class Shared(nn.Module):
    """`lin` applied twice, each use checkpointed."""

    def __init__(self, use_reentrant):
        super().__init__()
        self.lin, self.head, self.use_reentrant = nn.Linear(8, 8), nn.Linear(8, 1), use_reentrant

    def forward(self, x):
        for _ in range(2):
            x = torch.tanh(checkpoint(self.lin, x, use_reentrant=self.use_reentrant))
        return self.head(x).sum()


def fix():
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    partition_grads, clear_backward_seen_flag = Stage3.partition_grads, Stage3.clear_backward_seen_flag

    def written(self):
        return self.__dict__.setdefault("_reduced_this_backward", set())

    def partition(self, params, grads):
        if self.micro_step_id == 0:
            buffers = self._DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition
            grads = [g + buffers[p.ds_id].narrow(0, 0, g.numel()).view(g.shape).to(g.dtype) if p.ds_id in written(self) else g
                     for p, g in zip(params, grads)]
        written(self).update(p.ds_id for p in params)
        return partition_grads(self, params, grads)

    def clear_seen(self):
        written(self).clear()
        return clear_backward_seen_flag(self)

    Stage3.partition_grads, Stage3.clear_backward_seen_flag = partition, clear_seen


def main():
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    if "--fixed" in sys.argv:
        fix()
    # A bucket smaller than a phase's gradients: each use of `lin` is reduced in a bucket of its own.
    config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 10}}
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    ok = True
    for use_reentrant in (False, True):
        torch.manual_seed(1)
        plain = Shared(use_reentrant)
        plain(x).backward()
        torch.manual_seed(1)
        model = Shared(use_reentrant)
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), config=config)
        engine.backward(engine(x))
        grad = deepspeed.utils.safe_get_full_grad(engine.module.lin.weight)
        diff = (grad - plain.lin.weight.grad).abs().max().item()
        ok &= diff < 1e-6
        if torch.distributed.get_rank() == 0:
            print(f"use_reentrant={use_reentrant}: max |ZeRO-3 grad - single-device grad| = {diff:.3e}"
                  f" (gradient norm {plain.lin.weight.grad.norm().item():.3e})", flush=True)
    if torch.distributed.get_rank() == 0:
        print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}: {'OK' if ok else 'MISMATCH'}")


if __name__ == "__main__":
    main()
