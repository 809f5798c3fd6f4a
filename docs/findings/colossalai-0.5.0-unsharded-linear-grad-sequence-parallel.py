# Colossal-AI 0.5.0 (torch 2.5.1): Linear1D_Col.from_native_module / Linear1D_Row.from_native_module return the
# native nn.Linear unchanged when it is narrower than the tensor-parallel size (linear.py:303, :500). Under
# split_gather / ring sequence parallelism that layer then runs on this rank's chunk of the sequence, so its
# gradients hold only this rank's tokens; the layer is replicated but nothing marks its parameters
# sp-partial-derived, so the synchronisation HybridParallelPlugin runs (SeqParallelUtils.allreduce_partial_data_grad)
# leaves them partial and the ranks' copies drift apart. (Found by shardfuzz through HybridParallelPlugin on a
# Llama whose MLP is narrower than tp, and through colossalai-tp.) GPT-2's GPT2FusedLinearConv1D_Col / _Row have
# the same early return (qkv_fused_linear.py:338, :537; found by shardfuzz campaign 125, 2026-11-28, on a GPT-2 with
# ffn 1 under tp 2): `--gpt2` runs the same check on a transformers Conv1D.
# Run: python this.py [--gpt2]  (2 CPU ranks, gloo)
import os
import sys
import torch, torch.distributed as dist, torch.multiprocessing as mp


def native_and_parallel(fin, fout, gpt2):
    """A native layer of fin -> fout features and the class that should shard it by columns."""
    if gpt2:
        from colossalai.shardformer.layer import GPT2FusedLinearConv1D_Col
        from transformers.pytorch_utils import Conv1D

        return Conv1D(fout, fin), lambda m, **kw: GPT2FusedLinearConv1D_Col.from_native_module(m, split_sizes=[fout], **kw)
    from colossalai.shardformer.layer import Linear1D_Col

    return torch.nn.Linear(fin, fout), Linear1D_Col.from_native_module


def run(rank, gpt2):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29563")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    from colossalai.shardformer.layer.utils import SeqParallelUtils

    torch.manual_seed(0)
    b, s, fin, fout = 2, 4, 3, 1  # fout < tp: from_native_module keeps the native layer
    native, parallel = native_and_parallel(fin, fout, gpt2)
    lin = native.double()
    x = torch.randn(b, s, fin, dtype=torch.float64)
    w = torch.randn(b, s, fout, dtype=torch.float64)  # the loss: sum(y * w)
    ref = native_and_parallel(fin, fout, gpt2)[0].double(); ref.load_state_dict(lin.state_dict())
    (ref(x) * w).sum().backward()

    layer = parallel(lin, process_group=dist.group.WORLD, seq_parallel_mode="split_gather")
    chunk = slice(rank * s // 2, (rank + 1) * s // 2)  # under sequence parallelism: this rank's sequence chunk
    (layer(x[:, chunk].contiguous()) * w[:, chunk]).sum().backward()
    SeqParallelUtils.allreduce_partial_data_grad(dist.group.WORLD, model=layer)  # what the plugin syncs
    print(f"rank {rank}: {type(layer).__name__} kept; weight grad {layer.weight.grad.flatten().tolist()}\n"
          f"        reference weight grad {ref.weight.grad.flatten().tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--gpt2" in sys.argv,), nprocs=2)
