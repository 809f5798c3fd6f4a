import os, torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard, Replicate, distribute_tensor
from torch.distributed.device_mesh import init_device_mesh
def f(rank, mesh_shape, pl):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29551")
    dist.init_process_group("gloo", rank=rank, world_size=4)
    mesh = init_device_mesh("cpu", mesh_shape)
    torch.manual_seed(0)
    x = torch.randn(5, 5, dtype=torch.float64); y = torch.randn(5, 5, dtype=torch.float64)
    xr = x.clone().requires_grad_(); F.mse_loss(xr, y).backward()
    xl = distribute_tensor(x, mesh, pl).to_local().detach().requires_grad_()
    dx = DTensor.from_local(xl, mesh, pl, run_check=False, shape=x.shape, stride=x.stride())
    dy = distribute_tensor(y, mesh, [Replicate()] * len(mesh_shape))
    loss = F.mse_loss(dx, dy)
    lf = loss.full_tensor()
    lf.backward()
    full_grad = DTensor.from_local(xl.grad, mesh, pl, run_check=False, shape=x.shape, stride=x.stride()).full_tensor()
    if rank == 0:
        print(mesh_shape, pl, "loss err", (lf - F.mse_loss(x, y)).abs().item(), "grad ratio", (full_grad / xr.grad).flatten()[:4].tolist())
    dist.destroy_process_group()
if __name__ == "__main__":
    import sys
    for ms, pl in [((1, 2, 2), [Shard(0), Replicate(), Replicate()]), ((4,), [Shard(0)]), ((2, 2), [Shard(0), Replicate()])]:
        mp.spawn(f, args=(ms, pl), nprocs=4)
