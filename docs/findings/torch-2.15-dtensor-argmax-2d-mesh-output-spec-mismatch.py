"""torch 2.15 DTensor: argmax / argmin over a sharded dim on a 2-D mesh return wrong indices.

x [3, 4, 2] on a 2x2 mesh, placements (Shard(1), Replicate()), argmax(dim=1): some indices are wrong, and
nothing fails. argmin the same. max(dim=1).indices and 1-D meshes are right.

Cause, the pattern of the convolution handler (README): DTensor routes argmax/argmin to its own handler
(`argminmax_handler`, torch/distributed/tensor/_nonlinear_redux.py). The handler runs sharding propagation
only to read the output spec, which here is (Replicate(), Shard(0)): propagation chose to shard the result
over the second mesh dim and asks for the input to be redistributed to match (`needs_redistribute` is
True; this script prints it). The handler never redistributes: it reduces the local tensor it was given,
gathers over the first mesh dim, and wraps the whole [3, 2] result as if it were this rank's Shard(0)
piece, so the result's pieces overlap and the gathered tensor mixes them.

Found by shardfuzz on 2026-11-26 (torch-dtensor, `fuzz --corpus corpus --time 12m --seed 87`: argmax sample
10 on a 2x2 mesh, output narrowed and redistributed, f64; minimized by `shardfuzz report`; reduced by hand).

Run:  torchrun --nproc_per_node 4 torch-2.15-dtensor-argmax-2d-mesh-output-spec-mismatch.py
Prints one line per op (MISMATCH or OK) with the output's placements and local shape, then propagation's
answer; exits 1 unless every one is OK.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

OPS = {
    "argmax(dim=1)": lambda t: t.argmax(1),
    "argmin(dim=1)": lambda t: t.argmin(1),
    "max(dim=1).indices": lambda t: t.max(1).indices,
}


def what_propagation_asks(xd, rank):
    op_info = DTensor._op_dispatcher.unwrap_to_op_info(torch.ops.aten.argmax.default, (xd, 1), {})
    DTensor._op_dispatcher.sharding_propagator.propagate(op_info)
    sharding = op_info.output_sharding
    if rank == 0:
        asked = sharding.redistribute_schema.args_schema[0].placements if sharding.redistribute_schema else None
        print(f"propagation for argmax: output {sharding.output_spec.placements}, needs_redistribute "
              f"{sharding.needs_redistribute}, input asked {asked}")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2))
    torch.manual_seed(0)
    x = torch.randn(3, 4, 2, dtype=torch.float64)
    xd = distribute_tensor(x, mesh, [Shard(1), Replicate()])
    bad = 0
    for name, f in OPS.items():
        y = f(xd)
        got, expected = y.full_tensor(), f(x)
        ok = got.shape == expected.shape and torch.equal(got, expected)
        bad += not ok
        if rank == 0:
            print(f"x [3, 4, 2] (Shard(1), Replicate()) on a 2x2 mesh, {name}: {'OK' if ok else 'MISMATCH'} "
                  f"(output {y.placements}, local {tuple(y.to_local().shape)}): {got.flatten().tolist()}, "
                  f"expected {expected.flatten().tolist()}", flush=True)
    try:
        what_propagation_asks(xd, rank)
    except Exception as e:  # noqa: BLE001 - an older release may answer differently
        if rank == 0:
            print(f"propagation: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
