"""torch 2.15: FSDP1 with parameter mixed precision loses gradient of a unit used several times per step under
re-entrant activation checkpointing: the unit's gradient comes out as if only some of its uses had happened, silently.

Setup: 2 ranks (gloo, CPU); one residual block Linear(8, 8) -> tanh -> Linear(8, 8) in its own FSDP unit inside a
root unit, applied PASSES (3) times per forward, each call under torch.utils.checkpoint(use_reentrant=True) (shared
blocks / weight-tied layers); FSDP1 (use_orig_params=True, FULL_SHARD or NO_SHARD) with
`MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` over a float32 model; one backward of a sum
loss on each rank's rows. The reference is one process running the same computation the way mixed precision defines
it: the parameters cast to bfloat16, the forward and backward in bfloat16 on each rank's rows, the gradients summed
over the uses in float32 and averaged over the ranks. Measured: the block's gradients are off by 60-70 % of their norm
(close to what dropping two of the three uses gives); with `--no-mixed-precision` (FSDP1 in float32 against the
float32 reference), with non-re-entrant checkpointing (`--non-reentrant`) or with a single use (`--passes 1`) they
agree to round-off. Found by shardfuzz's torch-fsdp1 target (2026-12-05, a 10-minute campaign, seed 268, with the
three other FSDP1 bugs' fixes on): four divergent signatures, each a block's gradients under re-entrant checkpointing,
`layer_passes` 2-3 and a `master_dtype` above the compute dtype (f16 and bf16; FULL_SHARD, SHARD_GRAD_OP, NO_SHARD).
torch-fsdp2 loses a use's gradient of such a module too, without mixed precision (shardfuzz's
torch-fsdp2-reentrant-reused-module). Also in torch 2.5.1 (MISMATCH, 0.6980).

Why: `_register_post_backward_hook` hooks the flat parameter's AccumulateGrad node once, in the first forward run with
gradients enabled, and counts on later forwards reaching the same node, except under parameter mixed precision, where
(its own NOTE) every forward gets a new node (each unshard swaps `.data` between the float32 shard and the bfloat16
copy, and a dtype change resets the tensor's grad accumulator); there it relies on the first forward's use being the
last to receive its gradient. Under re-entrant checkpointing the forward itself runs without gradients and the first
forward with them is the backward's first recomputation, that of the *last* use: its hook reduces that use's gradient,
and the earlier uses, recomputed afterwards with nodes of their own, are never reduced (a counter on
`_post_backward_hook`: one call with bfloat16 parameters, three in float32). `--fixed`: a forward run inside a backward
hooks its own node too when it is not the registered one (shardfuzz's known fix
`torch-fsdp1-mixed-precision-reentrant-hook`): OK, 0.0024 (bfloat16 round-off: each use's gradient is now reduced in
float32 and accumulated, where the reference adds the uses' bfloat16 gradients first; torch 2.5.1 the same).

Run: torchrun --nproc_per_node 2 torch-2.15-fsdp1-mixed-precision-reentrant-reused-unit-gradient.py
[--no-mixed-precision] [--non-reentrant] [--passes N] [--no-shard] [--fixed]   Prints MISMATCH or OK on rank 0.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy

ap = argparse.ArgumentParser()
ap.add_argument("--no-mixed-precision", action="store_true")
ap.add_argument("--non-reentrant", action="store_true")
ap.add_argument("--passes", type=int, default=3)
ap.add_argument("--no-shard", action="store_true")
ap.add_argument("--fixed", action="store_true")
args = ap.parse_args()
if args.fixed:
    import functools

    from torch.distributed.fsdp import _runtime_utils

    released = _runtime_utils._register_post_backward_hook

    def _register_post_backward_hook(state, handle):
        released(state, handle)
        if handle is None or not torch.is_grad_enabled() or torch._C._current_graph_task_id() == -1:
            return  # (only a forward run inside a backward: a re-entrant recomputation)
        flat_param = handle.flat_param
        registered = getattr(flat_param, "_post_backward_hook_state", None)
        if registered is None or not flat_param.requires_grad:
            return
        acc_grad = flat_param.expand_as(flat_param).grad_fn.next_functions[0][0]
        if acc_grad is not registered[0]:
            acc_grad.register_hook(functools.partial(_runtime_utils._post_backward_hook, state, handle))

    _runtime_utils._register_post_backward_hook = _register_post_backward_hook
dist.init_process_group("gloo")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
LOW = torch.float32 if args.no_mixed_precision else torch.bfloat16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(4, 8), Block(), nn.Linear(8, 2)

    def forward(self, x):
        x = self.inp(x)
        for _ in range(args.passes):  # one module, several uses per step
            x = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=not args.non_reentrant)
        return self.out(x)


def model():
    torch.manual_seed(0)
    return Model()


X = torch.randn(WORLD, 3, 4, generator=torch.Generator().manual_seed(1))


def reference():
    """One process: per rank, the bf16 (LOW) copy's gradients of that rank's sum loss; float32 mean over ranks."""
    total = None
    for r in range(WORLD):
        m = model().to(LOW)
        m(X[r].to(LOW)).float().sum().backward()
        g = {n: p.grad.float() for n, p in m.named_parameters()}
        total = g if total is None else {n: total[n] + g[n] for n in g}
    return {n: t / WORLD for n, t in total.items()}


m = model()
strategy = ShardingStrategy.NO_SHARD if args.no_shard else ShardingStrategy.FULL_SHARD
mp = None if args.no_mixed_precision else MixedPrecision(param_dtype=LOW, reduce_dtype=torch.float32)
kw = dict(sharding_strategy=strategy, device_id=torch.device("cpu"), use_orig_params=True, mixed_precision=mp)
m.block = FSDP(m.block, **kw)
fsdp = FSDP(m, **kw)
fsdp(X[RANK]).float().sum().backward()
with FSDP.summon_full_params(fsdp, writeback=False, with_grads=True):
    got = {n.replace("_fsdp_wrapped_module.", ""): p.grad.float().clone() for n, p in fsdp.named_parameters()}
if RANK == 0:
    want = reference()
    worst = max((got[n] - want[n]).norm() / want[n].norm() for n in want)
    rows = [f"  {n}: |got - want| / |want| = {float((got[n] - want[n]).norm() / want[n].norm()):.4f}" for n in want]
    tol = 1e-5 if args.no_mixed_precision else 0.05  # bf16 round-off of a few ops: a few percent at most
    print("\n".join(rows))
    print(("OK" if worst < tol else "MISMATCH") + f": worst relative gradient error {float(worst):.4f} (tolerance {tol})")
dist.destroy_process_group()
