# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin with pipeline parallelism and sequence
# parallelism (`split_gather` and `all_to_all` seen; `ring` takes the same path; without flash attention) crashes on
# every later pipeline stage. LlamaPipelineForwards.llama_model_forward (shardformer/modeling/llama.py:101-146) makes
# cache_position span the whole sequence on a later stage (seq_length *= sp_size, :101-102, since the attention
# gathers the sequence) but then builds the causal mask with `self._update_causal_mask(attention_mask, hidden_states,
# cache_position, ...)` from the hidden states it received from the previous stage, which hold this rank's chunk of
# the sequence. transformers' _prepare_4d_causal_attention_mask_with_cache_position then fails:
# "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 0"
# (modeling_llama.py:714; this script: sequence 8, sp 2). The first stage builds the mask before it splits the sequence, and is right.
# ColossalAI's main branch (commit 4f9953be, 2026-04) has the same code.
# Fix (`--fixed`): build the mask for the whole sequence (a stand-in of cache_position's length for the shape); the
# loss then matches one device's.
# Found by shardfuzz (target colossalai-hybrid, campaigns of 2026-11-25 to 2026-11-28: pp 2 and 3 cases with
# split_gather or all_to_all; the same cases without sequence parallelism pass).
# Run: timeout 300 python this.py [--fixed] [--all-to-all]  (4 CPU ranks, gloo: tp 2 x pp 2, or sp 2 x pp 2). Prints the last stage's loss against
# one device's: the crash, or with --fixed OK.
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
MICRO = 2
IDS = torch.tensor([[3, 7, 1, 4, 9, 2, 5, 8], [2, 9, 5, 8, 6, 11, 0, 3]])


def fix():
    from transformers.models.llama.modeling_llama import LlamaModel

    original = LlamaModel._update_causal_mask

    def _update_causal_mask(self, attention_mask, input_tensor, cache_position, *args, **kwargs):
        if cache_position is not None and input_tensor.dim() == 3 and input_tensor.shape[1] != cache_position.shape[0]:
            input_tensor = input_tensor.new_empty(input_tensor.shape[0], cache_position.shape[0], input_tensor.shape[2])
        return original(self, attention_mask, input_tensor, cache_position, *args, **kwargs)

    LlamaModel._update_causal_mask = _update_causal_mask


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=16, attn_implementation="eager")
    return LlamaForCausalLM(config)


def run(rank, fixed, mode):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29579", RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=60))
    install_shims()
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    expected = model()(input_ids=IDS, labels=IDS).loss  # one device, the whole batch
    # all_to_all is DeepSpeed-Ulysses: a sequence-parallel group of its own, no tensor parallelism. Its logits stay
    # sequence-parallel (parallel_output=True: with whole-sequence logits a known, separate bug leaves the labels
    # of all but the last sequence-parallel rank unshifted); split_gather gathers them (parallel_output=False).
    ulysses = mode == "all_to_all"
    plugin = HybridParallelPlugin(tp_size=1 if ulysses else 2, sp_size=2 if ulysses else None, pp_size=2,
                                  num_microbatches=MICRO, precision="fp32", enable_sequence_parallelism=True,
                                  sequence_parallelism_mode=mode, parallel_output=ulysses)
    booster = Booster(plugin=plugin)
    m = model()
    boosted, optimizer, *_ = booster.boost(m, torch.optim.SGD(m.parameters(), lr=0.1))
    batch = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS), "labels": IDS}
    try:
        out = booster.execute_pipeline(iter([batch]), boosted, lambda outputs, _: outputs.loss, optimizer, return_loss=True)
    except RuntimeError as e:
        print(f"rank {rank} (stage {plugin.stage_manager.stage}): {type(e).__name__}: {e}", flush=True)
        os._exit(1)  # the other stages wait for this one's activations: end them all
    if plugin.stage_manager.is_last_stage():
        ok = torch.allclose(out["loss"], expected, rtol=1e-5, atol=1e-6)
        print(f"rank {rank}: loss {float(out['loss']):.6f}, one device {float(expected):.6f}: {'OK' if ok else 'MISMATCH'}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode = "all_to_all" if "--all-to-all" in sys.argv else "split_gather"
    mp.spawn(run, args=("--fixed" in sys.argv, mode), nprocs=4)
