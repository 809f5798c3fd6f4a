import os, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.distributed.tensor import DTensor, Partial
from torch.distributed.device_mesh import init_device_mesh
def f(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    x = torch.tensor([[1.0, 4.0], [3.0, 2.0]], dtype=torch.float64)
    holder = torch.tensor([[0, 1], [0, 0]]); local = torch.where(holder == rank, x, x - 10.0)  # each element: one rank holds it
    d = DTensor.from_local(local, mesh, [Partial("max")], run_check=False)
    assert torch.equal(d.full_tensor(), x)
    for name, fn in (("mean", lambda t: t.mean()), ("neg", torch.neg)):
        try:
            r = fn(d)
            full = r.full_tensor()
            if rank == 0:
                print(torch.__version__, name, r.placements, full.tolist(), "expected", fn(x).tolist(), flush=True)
        except Exception as e:
            print(torch.__version__, name, "rank", rank, "raised", type(e).__name__, str(e)[:150], flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(f, nprocs=2)
