"""torch DTensor: linalg.pinv with a Partial(sum) `rtol` uses each rank's partial value.

torchrun --nproc_per_node 2 torch-2.15-dtensor-pinv-partial-rtol-kwarg-not-reduced.py   (CPU, gloo)
Exits 1 and prints MISMATCH when the sharded result differs from single-device torch.

The op's sharding strategy (`linalg_pinv_strategy`, torch/distributed/tensor/_ops/_math_ops.py) asks
for atol / rtol Replicate, but both are keyword arguments and `redistribute_local_args`
(_dispatch.py) never reshards keyword arguments ("it's very rare that we need to reshard kwargs so
we intentionally skip it"): each rank thresholds the singular values with its own partial rtol and
the output, placed Replicate, differs from rank to rank (here off by 0.32 on rank 0 and 26.6 on
rank 1). Found by shardfuzz (linalg.pinv OpInfo sample 14, mesh [2], rtol Partial, float64).
torch 2.5.1 refuses the op (no sharding strategy), so the wrong result is new with the strategy.
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
a = torch.randn(2, 5, 5, dtype=torch.float64)
rtol = torch.tensor(0.5, dtype=torch.float64)
expected = torch.linalg.pinv(a, rtol=rtol)

# rtol as Partial(sum): the two ranks hold 0.8 and -0.3, which add up to 0.5.
summand = torch.tensor(0.8 if rank == 0 else -0.3, dtype=torch.float64)
d_rtol = DTensor.from_local(summand, mesh, [Partial()])
d_a = distribute_tensor(a, mesh, [Replicate()])
out = torch.linalg.pinv(d_a, rtol=d_rtol)
got = out.full_tensor()
err = (got - expected).abs().max().item()
local_err = (out.to_local() - expected).abs().max().item() if out.placements[0].is_replicate() else float("nan")
print(f"rank {rank}: output placements {out.placements}, max |sharded - single-device| = {err:.3e}, local copy off by {local_err:.3e}")
dist.barrier()
bad = torch.tensor([1.0 if err > 1e-10 else 0.0])
dist.all_reduce(bad)
if rank == 0:
    print("MISMATCH" if bad.item() else "OK")
dist.destroy_process_group()
sys.exit(1 if bad.item() else 0)
