import os, torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.device_mesh import init_device_mesh
def f(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    # reference
    xr = x.clone().requires_grad_(); yr = F.conv2d(xr, w); yr.sum().backward()
    # sharded: x replicated, w partial (each rank holds w/2)
    xl = x.clone().requires_grad_()
    dx = DTensor.from_local(xl, mesh, [Replicate()], run_check=False)
    dw = DTensor.from_local(w / 2, mesh, [Partial()], run_check=False)
    y = F.conv2d(dx, dw)
    print(rank, "out placements", y.placements, "fwd err", (y.full_tensor() - yr).abs().max().item())
    y.full_tensor().sum().backward()
    print(rank, "grad_x err", (xl.grad - xr.grad).abs().max().item(), "ratio", (xl.grad / xr.grad).flatten()[:3].tolist())
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(f, nprocs=2)
