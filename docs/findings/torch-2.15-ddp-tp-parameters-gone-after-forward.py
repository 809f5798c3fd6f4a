"""PyTorch 2.15 (and 2.5.1): DistributedDataParallel over a tensor-parallel model loses the model's parameters at its
first forward, and trains frozen ones.

DDP given a `device_mesh` sliced from a larger mesh (its documented DDP + TP path) calls
`torch.distributed.tensor.parallel.ddp._pre_dp_module_transform`: every DTensor parameter is replaced by its local
shard as a new `nn.Parameter`, a forward pre-hook turns them back into DTensors and a forward hook is meant to turn
them into local parameters again. But the pre-hook installs plain DTensors (`DTensor.from_local`, not parameters),
so the post-forward hook's `module.named_parameters()` finds nothing: from the first forward on, `model.parameters()`
is empty. Everything that walks the parameters after that silently does nothing:
- `model.zero_grad()` clears no gradient: they pile up over the steps (shown below: every parameter off after two
  SGD steps);
- `clip_grad_norm_(model.parameters(), ...)` clips nothing, a state dict has no parameters;
- a `torch.distributed.pipelining` stage's `scale_grads` (on by default) divides no gradient by the micro-batch count:
  every gradient of every stage comes out n_microbatches times too large. This is how shardfuzz met it (torch-pp
  target, pipeline stages in DDP with torch's tensor-parallel plan inside: pp 2 x dp 2 x tp 2, two micro-batches,
  every gradient exactly doubled, 8e6 times its f32 noise).
Separately, the transform makes every parameter trainable: `_flatten_tensor` calls `requires_grad_()` on the local
shard and `nn.Parameter` defaults to `requires_grad=True`, so a layer frozen before wrapping (fine-tuning) is trained
(the same mistake pytorch/pytorch PR #171709 fixed in the parallel styles).

Run: torchrun --nproc_per_node 4 torch-2.15-ddp-tp-parameters-gone-after-forward.py [--fix]
(CPU, gloo; a 2 x 2 (dp, tp) mesh). Prints, on rank 0, MISMATCH or OK for each of the two checks; `--fix` replaces
`_pre_dp_module_transform` with one that keeps `requires_grad`, leaves the local parameters registered and shows each
module its own parameters as DTensors during its calls (hooks on the root module alone, torch's design, would leave an
activation checkpoint's recomputation, which calls the blocks again in the backward, with local tensors: "aten.
native_layer_norm.default got mixed torch.Tensor and DTensor"; swapping the registered parameters per call would lose
them where the recomputation stops early, before the post-forward hook). Measured: torch 2.15.0 MISMATCH /
MISMATCH, with --fix OK / OK; torch 2.5.1 the same, except that the frozen check still fails with --fix there: 2.5.1's
ColwiseParallel unfreezes the layer itself (pytorch/pytorch#171523, fixed by #171709).
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
RANK = dist.get_rank()

if "--fix" in sys.argv:
    import functools

    import torch.distributed.tensor.parallel.ddp as ddp_tp

    def show_dtensors(module, _args, local):
        for _, name, t in local:
            object.__setattr__(module, name, ddp_tp._unflatten_tensor(t, t._st_info))

    def hide_dtensors(module, _args, _out, local):
        for _, name, _t in local:
            module.__dict__.pop(name, None)

    def pre_dp_module_transform(module):
        # The local parameters stay registered (requires_grad kept); each module sees its own parameters as DTensors
        # during its every call (an instance attribute over the registered parameter, dropped after the call), so an
        # activation checkpoint's recomputation, which calls the blocks again in the backward, finds them too.
        for sub in module.modules():
            local = []
            for name, q in list(sub.named_parameters(recurse=False)):
                t, spec = ddp_tp._flatten_tensor(q)
                if spec is not None:
                    t = nn.Parameter(t, requires_grad=q.requires_grad)
                    t._st_info = spec
                    local.append((sub, name, t))
            if local:
                ddp_tp._update_module_param(local)
                sub.register_forward_pre_hook(functools.partial(show_dtensors, local=local))
                sub.register_forward_hook(functools.partial(hide_dtensors, local=local))

    ddp_tp._pre_dp_module_transform = pre_dp_module_transform


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def model(frozen):
    torch.manual_seed(0)
    m = MLP()
    if frozen:
        m.up.requires_grad_(False)  # frozen before wrapping, as a fine-tuning script does
    return m


def train(m, x, steps=2):
    params = list(m.parameters())
    opt = torch.optim.SGD([q for q in params if q.requires_grad], lr=0.1)
    for _ in range(steps):
        m.zero_grad()
        m(x).square().mean().backward()
        opt.step()
    return params


def check(frozen, mesh, x):
    reference = train(model(frozen), x)
    tp_model = parallelize_module(model(frozen), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    ddp = DDP(tp_model, device_mesh=mesh["dp"])
    counts = [len(list(ddp.parameters()))]
    sharded = train(ddp, x.chunk(2)[mesh["dp"].get_local_rank()])  # (the data-parallel rank's half of the batch)
    counts.append(len(list(ddp.parameters())))
    bad = []
    for name, ref, q in zip(("up.weight", "up.bias", "down.weight", "down.bias"), reference, sharded):
        info = q._st_info
        full = DTensor.from_local(q.detach(), info.mesh, info.placements, run_check=False, shape=info.shape,
                                  stride=info.stride).full_tensor()
        err = (full - ref).abs().max().item()
        if err > 1e-5:
            bad.append(f"{name} off by {err:.3g}" + (" (frozen)" if frozen and name.startswith("up") else ""))
    what = "up frozen" if frozen else "all trainable"
    trainable = sum(q.requires_grad for q in sharded)
    if RANK == 0:
        print(f"{what}: the DDP module lists {counts[0]} parameters before its first forward, {counts[1]} after; "
              f"{trainable} of them trainable (the reference: {sum(q.requires_grad for q in reference)})")
        print(f"  {what}: " + ("MISMATCH: " + "; ".join(bad) if bad else "OK"))


torch.manual_seed(1)
x = torch.randn(8, 8)
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
check(False, mesh, x)
check(True, mesh, x)
dist.destroy_process_group()
