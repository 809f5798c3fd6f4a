"""torch 2.15 DTensor: a convolution whose input is sharded on a spatial dim returns a wrong result marked Replicate.

conv1d/2d/3d and conv_transpose1d/2d/3d, input [N, C, *spatial] sharded on any spatial dim (height, depth,
and width too when the width rule does not apply: padding, or a stride other than the kernel), weight
replicated. Each rank convolves its own spatial piece and the result is wrapped as `Replicate`: the global
shape is wrong ([1, 3, 2, 6] for a [1, 3, 6, 6] output), the values differ between ranks, and nothing
fails. torch 2.5.1 refuses every one of these cleanly ("Sharding propagation failed").

Cause: DTensor routes aten.convolution to its own handler (torch/distributed/tensor/_tp_conv.py,
`convolution_handler`). Sharding propagation answers correctly: the input must be redistributed to
Replicate (`needs_redistribute` is True; this script prints it). The handler never applies that
redistribution: it runs the local convolution on `op_info.local_args`, the arguments as they came, and
wraps the result with the output spec. The same skipped redistribution explains the README's other conv
rows: a Partial weight or input convolved unreduced (wrong), a sharded weight convolved piecewise (crash).

Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --corpus corpus --time 12m --seed 85`: an
unbatched conv_transpose2d input sharded on its height, output shape [4, 4, 6] where [4, 6, 6] is right;
minimized by `shardfuzz report`; reduced by hand to this).

Run:  torchrun --nproc_per_node 2 torch-2.15-dtensor-conv-spatial-shard-input-wrong.py
Prints one line per op, sharded dim and padding (MISMATCH, CRASH, refused or OK); exits 1 unless every
one is OK or a clean refusal.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

CASES = [("conv1d", F.conv1d, (1, 2, 8), (3, 2, 3)),
         ("conv2d", F.conv2d, (1, 2, 8, 8), (3, 2, 3, 3)),
         ("conv3d", F.conv3d, (1, 2, 8, 8, 8), (3, 2, 3, 3, 3)),
         ("conv_transpose1d", F.conv_transpose1d, (1, 2, 8), (2, 3, 3)),
         ("conv_transpose2d", F.conv_transpose2d, (1, 2, 8, 8), (2, 3, 3, 3)),
         ("conv_transpose3d", F.conv_transpose3d, (1, 2, 8, 8, 8), (2, 3, 3, 3, 3))]


def what_propagation_asks(mesh, rank):
    """Sharding propagation's answer for a height-sharded conv2d input, as the handler receives it."""
    x = distribute_tensor(torch.randn(1, 2, 8, 8), mesh, [Shard(2)])
    w = distribute_tensor(torch.randn(3, 2, 3, 3), mesh, [Replicate()])
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    op_info = DTensor._op_dispatcher.unwrap_to_op_info(torch.ops.aten.convolution.default, args, {})
    DTensor._op_dispatcher.sharding_propagator.propagate(op_info)
    sharding = op_info.output_sharding
    if rank == 0:
        asked = [a.placements for a in sharding.redistribute_schema.args_schema[:2]]
        print(f"propagation: output {sharding.output_spec.placements}, needs_redistribute "
              f"{sharding.needs_redistribute}, inputs asked {asked}; the handler convolves the local "
              f"input {tuple(op_info.local_args[0].shape)}")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    bad = 0
    for name, op, x_shape, w_shape in CASES:
        for d in range(2, len(x_shape)):
            for padding in (0, 1):
                x = torch.randn(*x_shape, dtype=torch.float64)
                w = torch.randn(*w_shape, dtype=torch.float64)
                expected = op(x, w, padding=padding)
                try:
                    y = op(distribute_tensor(x, mesh, [Shard(d)]), distribute_tensor(w, mesh, [Replicate()]),
                           padding=padding)
                    got = y.full_tensor()
                    ok = got.shape == expected.shape and torch.allclose(got, expected)
                    outcome = "OK" if ok else (f"MISMATCH: {tuple(got.shape)} marked {y.placements}, "
                                               f"expected {tuple(expected.shape)}")
                except RuntimeError as e:
                    ok = "Sharding propagation failed" in str(e)
                    outcome = ("refused: " if ok else "CRASH: ") + str(e).splitlines()[0][:100]
                bad += not ok
                if rank == 0:
                    print(f"{name:17} input Shard({d}) padding {padding}: {outcome}", flush=True)
    try:
        what_propagation_asks(mesh, rank)
    except Exception as e:  # torch 2.5.1 refuses in propagation itself
        if rank == 0:
            print(f"propagation: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
