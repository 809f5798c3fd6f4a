# Colossal-AI 0.5.0 (torch 2.5.1): Linear1D_Col.from_native_module / Linear1D_Row.from_native_module return the
# native nn.Linear unchanged when it is narrower than the tensor-parallel size (linear.py:303, :500). Under
# split_gather / ring sequence parallelism that layer then runs on this rank's chunk of the sequence, so its
# gradients hold only this rank's tokens; the layer is replicated but nothing marks its parameters
# sp-partial-derived, so the synchronisation HybridParallelPlugin runs (SeqParallelUtils.allreduce_partial_data_grad)
# leaves them partial and the ranks' copies drift apart. (Found by shardfuzz through HybridParallelPlugin on a
# Llama whose MLP is narrower than tp, and through colossalai-tp.) Run: python this.py  (2 CPU ranks, gloo)
import os
import torch, torch.distributed as dist, torch.multiprocessing as mp


def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29563")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    from colossalai.shardformer.layer import Linear1D_Col
    from colossalai.shardformer.layer.utils import SeqParallelUtils

    torch.manual_seed(0)
    b, s, fin, fout = 2, 4, 3, 1  # fout < tp: from_native_module keeps the native layer
    lin = torch.nn.Linear(fin, fout).double()
    x = torch.randn(b, s, fin, dtype=torch.float64)
    w = torch.randn(b, s, fout, dtype=torch.float64)  # the loss: sum(y * w)
    ref = torch.nn.Linear(fin, fout).double(); ref.load_state_dict(lin.state_dict())
    (ref(x) * w).sum().backward()

    layer = Linear1D_Col.from_native_module(lin, process_group=dist.group.WORLD, seq_parallel_mode="split_gather")
    chunk = slice(rank * s // 2, (rank + 1) * s // 2)  # under sequence parallelism: this rank's sequence chunk
    (layer(x[:, chunk]) * w[:, chunk]).sum().backward()
    SeqParallelUtils.allreduce_partial_data_grad(dist.group.WORLD, model=layer)  # what the plugin syncs
    print(f"rank {rank}: {type(layer).__name__} kept; weight grad {layer.weight.grad.flatten().tolist()}\n"
          f"        reference weight grad {ref.weight.grad.flatten().tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
