"""PyTorch 2.15: tensor parallelism's `SequenceParallel` style makes a frozen norm trainable again.

`SequenceParallel._replicate_module_fn` replaces each parameter of the norm it parallelizes with
`nn.Parameter(DTensor.from_local(param, ...))`, and `nn.Parameter` defaults to `requires_grad=True`: a norm the
user froze before `parallelize_module` (fine-tuning, LoRA) comes back trainable, takes gradients and is updated by
an optimizer built from the trainable parameters afterwards. pytorch/pytorch issue #171523 reported this for
`distribute_module`, `ColwiseParallel` and `RowwiseParallel`, and PR #171709 passed `requires_grad=param.requires_grad`
in those (torch 2.5.1 still unfreezes all of them); `SequenceParallel` was left out and still unfreezes in 2.15.
Downstream trainers carry their own `SequenceParallel` subclass to work around it.

Found by shardfuzz (torch-tp and torch-fsdp2 targets) on their first cases with a frozen norm under sequence
parallelism: tp 2, the first block's LayerNorm frozen, AdamW, f32: the frozen norm's weight and bias move by up to
0.06 after one step where the single-device reference keeps them, and the second step's loss and every parameter
the norm feeds diverge (thousands of times their noise). The same case without sequence parallelism passes on 2.15
(its norms go through `distribute_module`, fixed by #171709); with a frozen attention block instead it passes on 2.15
and diverges on 2.5.1 (the part #171709 fixed).

Run: torchrun --nproc_per_node 2 torch-2.15-tp-sequence-parallel-unfreezes-frozen-norm.py [--fix]
(CPU, gloo). Prints MISMATCH or OK on rank 0; `--fix` patches `_replicate_module_fn` to keep `requires_grad`.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel, parallelize_module

dist.init_process_group("gloo")
RANK = dist.get_rank()

if "--fix" in sys.argv:
    def replicate_keeping_requires_grad(self, name, module, device_mesh):
        for p_name, param in module.named_parameters():
            module.register_parameter(p_name, nn.Parameter(
                DTensor.from_local(param, device_mesh, [Replicate()], run_check=False),
                requires_grad=param.requires_grad))

    SequenceParallel._replicate_module_fn = replicate_keeping_requires_grad


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 8)

    def forward(self, x):
        return self.up(self.norm(x))


def model():
    torch.manual_seed(0)
    m = Block()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
        m.norm.bias.uniform_(-0.5, 0.5)
    m.norm.requires_grad_(False)  # frozen before parallelizing, as a fine-tuning script does
    return m


def train(m, x):
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)
    out = m(x)
    if isinstance(out, DTensor):
        out = out.full_tensor()
    out.square().sum().backward()
    opt.step()


torch.manual_seed(1)
x = torch.randn(2, 4, 8)
reference = model()
train(reference, x)

mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
sharded = parallelize_module(model(), mesh, {"norm": SequenceParallel(), "up": ColwiseParallel(use_local_output=False)})
train(sharded, x)

if RANK == 0:
    weight = sharded.norm.weight.full_tensor()
    trainable = sharded.norm.weight.requires_grad
    moved = (weight - reference.norm.weight).abs().max().item()
    if trainable or moved > 0:
        print(f"MISMATCH: the frozen norm has requires_grad={trainable} after parallelize_module and moved by {moved:.3g} "
              "(the reference keeps it)")
    else:
        print("OK: the frozen norm stays frozen")
dist.destroy_process_group()
