"""torch 2.5.1 DTensor: the width-sharded convolution with halo exchange returns no input gradient.

conv2d with the input sharded on its width (Shard(3)), padding 1, stride 1 and a bias: the layout
DTensor's tensor-parallel convolution (torch/distributed/tensor/_tp_conv.py) exchanges halos for. In torch
2.5.1 the forward is right, but after backward the input's `.grad` is None: no gradient reaches the
layers before the convolution, and nothing fails. The weight and bias gradients are right. Without a bias
the same call is refused ("Sharding propagation failed").

In torch 2.15 this layout no longer reaches the halo exchange at all: sharding propagation asks for the
input to be replicated, the handler ignores that, and the forward is silently wrong (see
torch-2.15-dtensor-conv-spatial-shard-input-wrong.py).

Found on 2026-11-26 by hand, checking the width layouts of the convolution handler after shardfuzz's
conv findings (README, DTensor bugs); not by a campaign.

Run:  torchrun --nproc_per_node 2 torch-2.5.1-dtensor-conv-halo-input-grad-none.py
Prints the forward check and each gradient (OK, MISMATCH or None); exits 1 unless all are OK.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64)
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    expected = F.conv2d(*ref, padding=1)
    expected.pow(2).sum().backward()
    xd = distribute_tensor(x, mesh, [Shard(3)]).requires_grad_()
    wd = distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
    bd = distribute_tensor(b, mesh, [Replicate()]).requires_grad_()
    lines, bad = [], 0
    try:
        y = F.conv2d(xd, wd, bd, padding=1)
        got = y.full_tensor()
        ok = got.shape == expected.shape and torch.allclose(got, expected)
        lines.append(f"forward: {'OK' if ok else 'MISMATCH'} ({y.placements})")
        bad += not ok
        y.pow(2).sum().backward()
        for name, t, r in zip(("input", "weight", "bias"), (xd, wd, bd), ref):
            if t.grad is None:
                outcome = "None"
            else:
                outcome = "OK" if torch.allclose(t.grad.full_tensor(), r.grad) else "MISMATCH"
            bad += outcome != "OK"
            lines.append(f"{name} gradient: {outcome}")
    except RuntimeError as e:
        lines.append("CRASH or refusal: " + str(e).splitlines()[0][:100])
        bad += 1
    if rank == 0:
        print(f"torch {torch.__version__}, conv2d input [2, 3, 4, 8] Shard(3), padding 1, bias:")
        print("\n".join("  " + line for line in lines))
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
