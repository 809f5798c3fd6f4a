# Colossal-AI 0.5.0 (torch 2.5.1): under sequence parallelism (split_gather / ring) Linear1D_Row adds its bias
# to the reduce-scattered output, i.e. to this rank's chunk of the sequence only, so each rank's bias gradient
# holds its own tokens' contribution. The bias is replicated, but nothing marks it sp-partial-derived: the
# synchronisation HybridParallelPlugin runs (SeqParallelUtils.allreduce_partial_data_grad) reduces only the
# marked norms, so the bias gradient stays partial and the ranks' bias copies drift apart after a step.
# Shardformer's policies use row-parallel linears with bias under these modes (e.g. GPT-2's c_proj).
# Found by shardfuzz (target colossalai-tp). Run: python this.py  (2 CPU ranks, gloo)
import os
import torch, torch.distributed as dist, torch.multiprocessing as mp


def gloo_reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
    # gloo has no list-form reduce_scatter (NCCL has): the same sum, over an all_reduce.
    flat = torch.cat([t.reshape(-1) for t in input_list]); dist.all_reduce(flat, op=op, group=group)
    start = sum(t.numel() for t in input_list[: dist.get_rank(group)])
    output.copy_(flat[start:start + output.numel()].view_as(output))


def run(rank, mode):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.reduce_scatter = gloo_reduce_scatter
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    from colossalai.shardformer.layer import Linear1D_Row
    from colossalai.shardformer.layer.utils import SeqParallelUtils

    torch.manual_seed(0)
    b, s, fin, fout = 2, 4, 6, 3
    lin = torch.nn.Linear(fin, fout).double()
    x = torch.randn(b, s, fin, dtype=torch.float64)
    w = torch.randn(b, s, fout, dtype=torch.float64)  # the loss: sum(y * w)
    ref = torch.nn.Linear(fin, fout).double(); ref.load_state_dict(lin.state_dict())
    (ref(x) * w).sum().backward()

    row = Linear1D_Row.from_native_module(lin, process_group=dist.group.WORLD, parallel_input=True,
                                          seq_parallel_mode=mode, seq_parallel_dim=1)
    x_local = x[..., rank * fin // 2:(rank + 1) * fin // 2]  # the input-feature shard, full sequence
    y_local = row(x_local)  # [b, s / 2, fout]: this rank's sequence chunk
    (y_local * w[:, rank * s // 2:(rank + 1) * s // 2]).sum().backward()
    SeqParallelUtils.allreduce_partial_data_grad(dist.group.WORLD, model=row)  # what the plugin syncs
    print(f"{mode} rank {rank}: bias grad {row.bias.grad.tolist()}\n"
          f"{' ' * len(mode)}  reference   {ref.bias.grad.tolist()}  weight grad ok: "
          f"{torch.allclose(row.weight.grad, ref.weight.grad[:, rank * fin // 2:(rank + 1) * fin // 2])}")
    dist.destroy_process_group()


if __name__ == "__main__":
    for mode in ("split_gather", "ring"):
        mp.spawn(run, args=(mode,), nprocs=2)
