"""torch 2.15 DTensor: rrelu in training mode on a Partial (pending-sum) input gives a wrong input gradient
(uninitialized memory: NaN or huge values), while its output is right.

rrelu(training=True) creates a `noise` tensor like its input (here Partial too), which the forward kernel
`aten.rrelu_with_noise` writes in place and the backward multiplies the output gradient by. DTensor registers
that op as an ordinary pointwise op (`_extra_pointwise_ops` in `_ops/_pointwise_ops.py`), so, like any
non-linear op on a Partial input, its arguments are redistributed to Replicate first: the kernel writes the
noise into the redistributed copy, and the `noise` autograd saved stays unwritten (our reading of the code;
a Shard(0) input, which needs no redistribution, gives the right gradient). torch 2.5.1 refuses the op (no
sharding strategy). lower == upper makes the noise deterministic
(0.25 on negative elements, 1 elsewhere), so the single-device gradient is known exactly. Found by shardfuzz
on 2026-11-26 (torch-dtensor, OpInfo nn.functional.rrelu sample 2 with the edit `increment` making
lower == upper == 1, a [3, 2] mesh with the input Partial(avg); reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-rrelu-training-partial-input-grad.py
Prints MISMATCH (exit 1) when the sharded gradient differs from one device, OK (exit 0) otherwise.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    full = torch.tensor([-2.0, 3.0, -1.0, 0.5, -0.25, 4.0], dtype=torch.float64)
    # Uneven summands of `full`, one per rank.
    parts = [0.3 * full + 1.0, 0.7 * full - 1.0]
    x = DTensor.from_local(parts[rank], mesh, [Partial()]).detach().requires_grad_()
    y = F.rrelu(x, lower=0.25, upper=0.25, training=True)
    y.backward(DTensor.from_local(torch.ones(6, dtype=torch.float64), mesh, [Replicate()]))
    got_y, got_g = y.full_tensor(), x.grad.full_tensor()

    ref = full.clone().requires_grad_()
    want_y = F.rrelu(ref, lower=0.25, upper=0.25, training=True)
    want_y.backward(torch.ones(6, dtype=torch.float64))
    ok = torch.allclose(got_y, want_y.detach()) and torch.allclose(got_g, ref.grad)
    if rank == 0:
        print("output   sharded", got_y.tolist(), "\n         single ", want_y.detach().tolist())
        print("gradient sharded", got_g.tolist(), "\n         single ", ref.grad.tolist())
        print("OK" if ok else "MISMATCH")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
