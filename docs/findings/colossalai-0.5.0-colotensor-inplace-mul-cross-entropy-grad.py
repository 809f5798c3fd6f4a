# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin with ZeRO and `overlap_allgather=True`
# (or `use_fp8=True`) and tensor parallelism with the vocabulary-parallel loss (`parallel_output=True`, the default)
# gets every gradient wrong by the loss's scale. With overlap_allgather the plugin turns each parameter into a
# ColoParameter (hybrid_parallel_plugin.py:123-129), so every tensor computed from one is a ColoTensor, and
# ColoTensor.__torch_function__ runs `add_`, `sub_`, `mul_` and `div_` out of place (tensor/colo_tensor.py:6-11,
# INPALCE_MAPPING, applied at :84-85). DistCrossEntropy.backward (shardformer/layer/loss.py:136) scales the gradient by
# the incoming one with `grad_logits.mul_(grad_output.unsqueeze(dim=-1))` and drops the result, relying on the
# in-place update: the scaling never happens, so the loss's gradient is taken as 1 instead of 1 / (the count of
# labels the mean divides by) times the plugin's scale. The loss itself is right; every gradient comes out times
# that count (14 here: 2 rows of 8 tokens, shifted). Without overlap_allgather, or with the loss on gathered logits,
# it is right. ColossalAI's main branch (commit 4f9953be, 2026-04) has the same two lines.
# Fix (`--fixed`): run the loss's function on a plain-tensor view of its input (or use the result of mul_).
# Found by shardfuzz (target colossalai-hybrid, campaign 130, 2026-11-28: dp 2 x tp 2 x pp 2, ZeRO-1, bf16, the
# model's own labels with 75 % ignored, `overlap_param_gather`: lm_head's gradient 64x its noise; passes without
# the overlap, with the loss on gathered logits, or with the fix).
# Run: timeout 300 python this.py [--fixed] [--no-overlap]  (4 CPU ranks, gloo: dp 2 x tp 2). Prints each rank's
# relative error of its lm_head gradient shard against one device's: MISMATCH, or OK.
import contextlib
import datetime
import os
import sys

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
    """Shims A-E and G (idempotent; in every rank after the process group exists)."""
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
IDS = torch.tensor([[3, 7, 1, 4, 9, 2, 5, 8], [2, 9, 5, 8, 6, 11, 0, 3], [1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5, 4, 3, 2]])
VOCAB = 128  # two tensor-parallel shards of 64 rows (the plugin pads to a multiple of 64 x tp)


def fix():
    from colossalai.shardformer import layer
    from colossalai.shardformer.layer import loss

    original = loss.cross_entropy_1d

    def cross_entropy_1d(vocab_logits, labels, *args, **kwargs):
        with torch._C.DisableTorchFunction():
            plain = vocab_logits.as_subclass(torch.Tensor)
        return original(plain, labels, *args, **kwargs)

    loss.cross_entropy_1d = layer.cross_entropy_1d = cross_entropy_1d


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=16, attn_implementation="eager")
    return LlamaForCausalLM(config)


def run(rank, fixed, overlap):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29582", RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=60))
    install_shims()
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    reference = model()  # one device, the whole batch, in fp32
    reference(input_ids=IDS, labels=IDS).loss.backward()
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, zero_stage=1, precision="bf16", parallel_output=True,
                                  overlap_allgather=overlap)
    booster = Booster(plugin=plugin)
    m = model()
    boosted, optimizer, *_ = booster.boost(m, torch.optim.SGD(m.parameters(), lr=0.1))
    dp, tp = plugin.dp_group.rank(), plugin.tp_group.rank()
    rows = IDS[2 * dp: 2 * dp + 2]  # each data-parallel rank its half of the batch
    out = boosted(input_ids=rows, attention_mask=torch.ones_like(rows), labels=rows)
    booster.backward(out.loss, optimizer)
    got = optimizer.get_param_grad(boosted.unwrap().lm_head.weight).float()
    want = reference.lm_head.weight.grad[64 * tp: 64 * tp + 64]
    error = float((got - want).norm() / want.norm())
    print(f"rank {rank} (dp {dp}, tp {tp}): loss {float(out.loss):.4f}; lm_head gradient shard, relative error "
          f"{error:.3f} against one device's (norms {float(got.norm()):.4f} and {float(want.norm()):.4f}): "
          f"{'OK' if error < 0.05 else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv, "--no-overlap" not in sys.argv), nprocs=4)
