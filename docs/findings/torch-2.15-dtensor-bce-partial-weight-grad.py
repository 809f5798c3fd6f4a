import os, torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard, Replicate, Partial, distribute_tensor
from torch.distributed.device_mesh import init_device_mesh
def f(rank, red):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    x = torch.rand(4, 6, dtype=torch.float64) * 0.8 + 0.1; y = torch.rand(4, 6, dtype=torch.float64); w = torch.rand(4, 6, dtype=torch.float64)
    xr = x.clone().requires_grad_(); F.binary_cross_entropy(xr, y, weight=w).backward()
    xl = distribute_tensor(x, mesh, [Shard(1)]).to_local().detach().requires_grad_()
    dx = DTensor.from_local(xl, mesh, [Shard(1)], run_check=False)
    dy = distribute_tensor(y, mesh, [Shard(1)])
    # weight as Partial(red): avg -> each rank holds w (avg of equal values is w); sum -> w/2 each
    wl = w.clone() if red == "avg" else w / 2
    dw = DTensor.from_local(wl, mesh, [Partial(red)], run_check=False)
    loss = F.binary_cross_entropy(dx, dy, weight=dw)
    lf = loss.full_tensor(); lf.backward()
    g = DTensor.from_local(xl.grad, mesh, [Shard(1)], run_check=False).full_tensor()
    if rank == 0:
        print(red, "loss err", (lf - F.binary_cross_entropy(x, y, weight=w)).abs().item(), "grad max err", (g - xr.grad).abs().max().item())
    dist.destroy_process_group()
if __name__ == "__main__":
    for red in ["sum", "avg"]:
        mp.spawn(f, args=(red,), nprocs=2)
