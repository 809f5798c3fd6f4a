# Colossal-AI 0.5.0 (torch 2.5.1): HybridParallelPlugin cannot save a checkpoint of a model whose vocabulary it padded
# (shardformer pads the embedding and LM head to `make_vocab_size_divisible_by` x tp, 64 x tp by default), in two ways:
# 1. Without tensor parallelism (tp 1, or sequence parallelism's all_to_all, where the vocabulary is not split) the
#    padded parameters are PaddingEmbedding / PaddingLMHead weights. HybridParallelCheckpointIO._model_sharder
#    (checkpoint_io/hybrid_parallel_checkpoint_io.py:112-115) saves `gather_distributed_param(param)`, which for such a
#    parameter is `param.detach()`, and unpads it with `to_unpadded_tensor`. The padded tensor's hijacked `detach`
#    (tensor/padded_tensor/api.py:17-22) copies the padding attributes onto the copy but not the saved original
#    methods, so `_hijack_back_detach_and_clone` raises `AttributeError: 'Tensor' object has no attribute
#    '_unpad_detach'` on the ranks that save (data-parallel rank 0 of each pipeline stage): `booster.save_model(...,
#    shard=True)` fails for any such model whose vocabulary is not a multiple of the padding (GPT-2's 50257).
# 2. With tensor parallelism, `gather_from_sharded_optimizer_state` (:1061) finds the dimension to gather a
#    vocabulary-parallel parameter's optimizer states along with `search_tp_partition_dim(shard shape, shape before
#    sharding, tp)` (checkpoint_io/utils.py:107-132), which asserts that the unpadded vocabulary is tp times the padded
#    shard: with a vocabulary longer than one shard that padding changed (130 over tp 2, padded to 256; GPT-2's 50257
#    over tp 2, padded to 50304) `booster.save_optimizer(..., shard=True)` fails on every rank with "The parameter
#    isn't evenly distributed among tensor parallel group".
# The same lines are on ColossalAI's main branch as of 2026-04 (commit 4f9953be).
# Fix (`--fixed`): 1. a detached copy is unpadded by slicing it; 2. the padded vocabulary's dimension is the partition
# dimension (the gathered states are unpadded by the code that follows).
# Found by shardfuzz (target colossalai-hybrid, 2026-11-28, on the first runs of its new case field
# `train.resume_after`: dp 2 / pp 2 with tp 1, and dp 2 x tp 2 with a vocabulary of 17 padded to 18).
# Run: timeout 300 python this.py [--fixed] [--optimizer] [--vocab=N]  (2 CPU ranks, gloo, a one-layer Llama, one
# Adam step): without --optimizer, dp 2 (tp 1) and save_model (vocabulary 13: CRASH; --vocab=64: OK); with
# --optimizer, tp 2 and save_optimizer (vocabulary 130: CRASH; --vocab=256: OK). Prints CRASH or OK per rank.
import contextlib
import datetime
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The CPU start-up shims below are shardfuzz's (harnesses/python/shardfuzz_worker/targets/colossalai_common.py):
# they stand in for device management, list-form reduce_scatter / all_to_all on gloo and ZeRO's CUDA check, and do
# not change what Colossal-AI computes.
# ------------------- Colossal-AI on CPU with gloo (the worker's start-up shims)

# from shardfuzz_worker/targets/colossalai_common.py
class _Done:
    """The handle of a collective that already completed (the shims run synchronously)."""

    def wait(self, *_args, **_kwargs):
        return True

    def is_completed(self):
        return True


class _CpuStream:
    """A stream on the CPU: work runs in program order, so waiting on another stream or an event has nothing to
    wait for (ZeRO's `overlap_communication` reduces on a stream of its own)."""

    def wait_stream(self, _stream):
        pass

    def wait_event(self, _event):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


def _cpu_accelerator():
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator
    import torch

    class ShardfuzzCpuAccelerator(CpuAccelerator):
        def current_device(self):
            return 0

        def set_device(self, device=None):
            pass

        def get_device_name(self, device=None):
            return "cpu"

        def synchronize(self, device=None):
            pass

        def device_count(self):
            return 1

        def get_rng_state(self, device=None):
            return torch.get_rng_state()

        def set_rng_state(self, new_state, device=None):
            torch.set_rng_state(new_state)

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def empty_cache(self):
            pass

        def memory_allocated(self, device=None):
            return 0

        def max_memory_allocated(self, device=None):
            return 0

        def reset_peak_memory_stats(self, device=None):
            pass

        def Stream(self, device=None, priority=0, **kwargs):  # noqa: N802 (the accelerator API's name)
            return _CpuStream()

        def current_stream(self, device=None):
            return _CpuStream()

        def default_stream(self, device=None):
            return _CpuStream()

        def stream(self, stream_):
            return contextlib.nullcontext()

    return ShardfuzzCpuAccelerator()


def _reduce_scatter_list(output, input_list, op=None, group=None, async_op=False):
    """List-form reduce_scatter over an all_reduce of the concatenated chunks (gloo has no reduce_scatter)."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([t.reshape(-1) for t in input_list])
    dist.all_reduce(flat, op=op if op is not None else dist.ReduceOp.SUM, group=group)
    rank = dist.get_rank(group)
    start = sum(t.numel() for t in input_list[:rank])
    output.copy_(flat[start:start + input_list[rank].numel()].view_as(output))
    return _Done() if async_op else None


def _all_to_all_list(output_list, input_list, group=None, async_op=False):
    """List-form all_to_all over all_to_all_single (gloo implements only the single-tensor form)."""
    import torch
    import torch.distributed as dist

    flat_in = torch.cat([t.reshape(-1) for t in input_list])
    flat_out = torch.empty(sum(t.numel() for t in output_list), dtype=flat_in.dtype)
    dist.all_to_all_single(flat_out, flat_in, output_split_sizes=[t.numel() for t in output_list],
                           input_split_sizes=[t.numel() for t in input_list], group=group)
    start = 0
    for t in output_list:
        t.copy_(flat_out[start:start + t.numel()].view_as(t))
        start += t.numel()
    return _Done() if async_op else None


def install_shims():
    """Shims A-E, G and H (idempotent; in every rank after the process group exists)."""
    import torch
    import torch.distributed as dist
    from colossalai.accelerator import api

    api._ACCELERATOR = _cpu_accelerator()
    real_rs, real_a2a = dist.reduce_scatter, dist.all_to_all
    if not getattr(real_rs, "shardfuzz_shim", False):
        def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
            if dist.get_backend(group) == "gloo":
                return _reduce_scatter_list(output, input_list, op, group, async_op)
            return real_rs(output, input_list, op=op, group=group, async_op=async_op)

        def all_to_all(output_list, input_list, group=None, async_op=False):
            if dist.get_backend(group) == "gloo":
                return _all_to_all_list(output_list, input_list, group, async_op)
            return real_a2a(output_list, input_list, group=group, async_op=async_op)

        reduce_scatter.shardfuzz_shim = all_to_all.shardfuzz_shim = True
        dist.reduce_scatter, dist.all_to_all = reduce_scatter, all_to_all
    torch.Tensor.record_stream = lambda self, stream=None: None
    if not hasattr(dist.Backend, "HCCL"):
        dist.Backend.HCCL = "hccl"
    torch.cuda.set_device = lambda *_a, **_k: None
    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda self, *_a, **_k: self
    _shim_zero_sanity_checks()


def _shim_zero_sanity_checks():
    from colossalai.zero.low_level import low_level_optim

    def sanity_checks(self):  # low_level_optim.py:253 without its device assertion
        for group in self.optim.param_groups:
            for p in group["params"]:
                if not getattr(p, "skip_zero_check", False):
                    assert p.dtype == self._dtype, f"Parameters are expected to have the same dtype `{self._dtype}`, but got `{p.dtype}`"

    low_level_optim.LowLevelZeroOptimizer._sanity_checks = sanity_checks



# ------------------- the finding
def fix():
    """1. A detached copy of a padded parameter is unpadded by slicing it. 2. A padded vocabulary's dimension is the
    tensor-parallel partition dimension."""
    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as io

    original = io.to_unpadded_tensor
    original_search = io.search_tp_partition_dim

    def to_unpadded_tensor(ptensor):
        if io.is_padded_tensor(ptensor) and not hasattr(ptensor, "_unpad_detach"):
            keep = [slice(None)] * ptensor.dim()
            keep[ptensor._padding_dim] = slice(None, ptensor._origin_length)
            return ptensor.data[tuple(keep)]
        return original(ptensor)

    def search_tp_partition_dim(current_shape, original_shape, tp_size):
        for dim, length in enumerate(original_shape):
            if length > current_shape[dim]:
                if tp_size * current_shape[dim] > length:
                    return dim
                break
        return original_search(current_shape, original_shape, tp_size)

    io.to_unpadded_tensor = to_unpadded_tensor
    io.search_tp_partition_dim = search_tp_partition_dim


def run(rank, world, fixed, tp, vocab, what, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29583", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    install_shims()
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    booster = Booster(plugin=HybridParallelPlugin(tp_size=tp, pp_size=1, precision="fp32"))
    boosted, optimizer, *_ = booster.boost(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    ids = torch.randint(0, vocab, (2, 4), generator=torch.Generator().manual_seed(rank))
    booster.backward(boosted(input_ids=ids, labels=ids).loss, optimizer)
    optimizer.step()
    optimizer.zero_grad()
    try:
        if what == "model":
            booster.save_model(boosted, f"{path}/model", shard=True)
        else:
            booster.save_optimizer(optimizer, f"{path}/optimizer", shard=True)
        print(f"rank {rank}: save_{what} OK", flush=True)
    except Exception as e:  # noqa: BLE001 - the finding
        print(f"rank {rank}: CRASH in save_{what}: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    optimizer = "--optimizer" in sys.argv
    tp = 2 if optimizer else 1
    vocab = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--vocab=")), 130 if optimizer else 13)
    where = tempfile.mkdtemp(prefix="colossalai-ckpt-")
    try:
        mp.spawn(run, args=(2, "--fixed" in sys.argv, tp, vocab, "optimizer" if optimizer else "model",
                            where), nprocs=2)
    finally:
        shutil.rmtree(where, ignore_errors=True)
