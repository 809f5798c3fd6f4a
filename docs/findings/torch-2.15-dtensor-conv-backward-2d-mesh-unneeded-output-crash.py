"""torch 2.15 DTensor: the backward of a convolution on a 2-D mesh crashes when one of its gradients is not needed.

A batch-sharded input (`[Shard(0), Replicate()]` on a 2×2 mesh, data parallel on one dim) and a replicated
weight: the forward runs and is right. The backward, `aten.convolution_backward`, builds its sharding
strategies from the single-dim rule in torch/distributed/tensor/_ops/_conv_ops.py, which writes `None` for an
output the op does not compute: `grad_bias` when the conv has no bias, `grad_input` when the input does not
require grad (a first layer, whose input is data). `expand_to_full_mesh_op_strategy` (_ops/utils.py) then
combines that rule on one mesh dim with a strategy for the other dim that has a placement at the same
position, and raises `AssertionError: aten.convolution_backward.default: strategy position 2 mixes None with
placements across mesh dims: (None, Partial(sum))` (position 0 for `grad_input`). On a 1-D mesh the same
conv trains; with a bias and an input that requires grad it trains on the 2-D mesh too. So a bias-free conv,
or any conv applied to the data, cannot be trained on a 2-D mesh; whatever gradient arrives (`.sum()`, an
explicit grad at the output's placements, through `full_tensor()`) the crash is the same.

torch 2.9.1 and torch 2.5.1 refuse the forward of all four cases, the 1-D mesh included ("Sharding
propagation failed" for aten.convolution with a batch-sharded input): the crash came with the single-dim
conv rule (2.13, the rule pytorch/pytorch#191926 is about). Not found among PyTorch's issues (searched).

Found on 2026-11-28 by a 10-minute shardfuzz campaign on torch-dtensor (`--seed 139`): `conv1d` on a
[1, 2] mesh with the input `Shard(0)` and no bias crashed this way; reduced by hand.

Run:  torchrun --nproc_per_node 4 torch-2.15-dtensor-conv-backward-2d-mesh-unneeded-output-crash.py
Prints OK / CRASH / MISMATCH (the weight gradient against one device's) per case; exits 1 unless all are OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

CASES = [
    # (mesh shape, bias, input requires grad)
    ((2, 2), False, True),
    ((2, 2), True, False),
    ((2, 2), True, True),
    ((4,), False, True),
]


def one_device(x_full, w_full, b_full, g_full):
    w = w_full.clone().requires_grad_()
    torch.nn.functional.conv1d(x_full, w, b_full).backward(g_full)
    return w.grad


def sharded(shape, x_full, w_full, b_full, g_full, input_grad):
    mesh = init_device_mesh("cpu", shape)
    lead = [Shard(0)] + [Replicate()] * (len(shape) - 1)
    x = distribute_tensor(x_full, mesh, lead).requires_grad_(input_grad)
    w = distribute_tensor(w_full, mesh, [Replicate()] * len(shape)).requires_grad_()
    b = None if b_full is None else distribute_tensor(b_full, mesh, [Replicate()] * len(shape)).requires_grad_()
    out = torch.nn.functional.conv1d(x, w, b)
    out.backward(distribute_tensor(g_full, mesh, out.placements))
    return w.grad.full_tensor()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x_full = torch.randn(4, 4, 5, dtype=torch.float64)
    w_full = torch.randn(3, 4, 3, dtype=torch.float64)
    b_full = torch.randn(3, dtype=torch.float64)
    g_full = torch.randn(4, 3, 3, dtype=torch.float64)
    failed = False
    for shape, bias, input_grad in CASES:
        b = b_full if bias else None
        try:
            err = (sharded(shape, x_full, w_full, b, g_full, input_grad) - one_device(x_full, w_full, b, g_full)).abs().max().item()
            verdict = "OK" if err <= 1e-12 else f"MISMATCH (largest difference {err:.3e})"
            failed |= err > 1e-12
        except Exception as e:  # noqa: BLE001 - the crash is what this shows
            verdict = f"CRASH {type(e).__name__}: {str(e)[:150]}"
            failed = True
        if rank == 0:
            print(f"mesh {shape}, bias {bias!s:5}, input requires grad {input_grad!s:5}: {verdict}", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
