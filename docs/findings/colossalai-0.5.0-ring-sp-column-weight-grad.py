# Colossal-AI 0.5.0 (torch 2.5.1): with sequence parallelism in "ring" mode, Linear1D_Col's weight gradient is
# wrong. _ring_as_gather (shardformer/layer/_operation.py:418) records the gathered input for backward as
# `input_tensors.append(send_tensors)` in its final round, while that round computes with `recv_tensors`: the
# saved "gathered" input repeats this rank's own chunk instead of holding its peer's, so
# ctx.gathered_input, and with it grad_weight = grad_output^T @ gathered_input, is wrong. The forward output
# is right ("split_gather" mode, which gathers with an all_gather, is right too).
# Found by shardfuzz (target colossalai-tp). Run: python this.py  (2 CPU ranks, gloo)
import os
import torch, torch.distributed as dist, torch.multiprocessing as mp


def gloo_reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
    # gloo has no list-form reduce_scatter (NCCL has): the same sum, over an all_reduce.
    flat = torch.cat([t.reshape(-1) for t in input_list]); dist.all_reduce(flat, op=op, group=group)
    start = sum(t.numel() for t in input_list[: dist.get_rank(group)])
    output.copy_(flat[start:start + output.numel()].view_as(output))

    class Done:
        def wait(self):
            pass
    return Done() if async_op else None


def run(rank, mode):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29562")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.reduce_scatter = gloo_reduce_scatter
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    from colossalai.shardformer.layer import Linear1D_Col

    torch.manual_seed(0)
    b, s, fin, fout = 2, 4, 3, 6
    lin = torch.nn.Linear(fin, fout).double()
    x = torch.randn(b, s, fin, dtype=torch.float64)
    w = torch.randn(b, s, fout, dtype=torch.float64)  # the loss: sum(y * w)
    ref = torch.nn.Linear(fin, fout).double(); ref.load_state_dict(lin.state_dict())
    (ref(x) * w).sum().backward()

    col = Linear1D_Col.from_native_module(lin, process_group=dist.group.WORLD, seq_parallel_mode=mode, seq_parallel_dim=1)
    x_local = x[:, rank * s // 2:(rank + 1) * s // 2]  # this rank's sequence chunk
    y = col(x_local)  # [b, s, fout / 2]: the sequence gathered, this rank's output features
    cols = slice(rank * fout // 2, (rank + 1) * fout // 2)
    (y * w[..., cols]).sum().backward()
    print(f"{mode:>12} rank {rank}: forward ok {torch.allclose(y, ref(x)[..., cols])}, weight grad max error "
          f"{(col.weight.grad - ref.weight.grad[cols]).abs().max().item():.3e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    for mode in ("split_gather", "ring"):
        mp.spawn(run, args=(mode,), nprocs=2)
