# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin with ZeRO-2, sequence parallelism
# (split_gather or ring) and gradient accumulation gets the gradients of the sequence-parallel "partial derived"
# parameters (norm weights and biases, row-parallel biases) wrong. HybridParallelZeroOptimizer.backward
# (hybrid_parallel_plugin.py:792-815) calls _sync_sp_grads after every backward, and _sync_sp_grads (:745-790)
# all-reduces over the tensor-parallel group the *working* gradients of those parameters: under ZeRO-2 these are
# the partitioned gradient store's running sums (LowLevelZeroOptimizer._add_grad adds each micro-batch in place), so
# the share of every earlier micro-batch, already all-reduced, is all-reduced again and multiplied by tp. ZeRO-2
# refuses no_sync ("ZERO2 is not compatible with no_sync function, please run gradient accumulation with gradient
# synchronization allowed"), so every accumulating ZeRO-2 + sequence-parallel run takes this path. ZeRO-0 and ZeRO-1
# are right, and so is ZeRO-2 with one micro-batch.
# Fix (`--fixed`): after each sync, take back (tp - 1) times what the gradient held after the previous sync (the
# upstream fix would all-reduce only the new micro-batch's contribution).
# Found by shardfuzz (target colossalai-hybrid, campaign 125, 2026-11-28: a GPT-2 with ZeRO-2, ring sequence
# parallelism and 2 accumulation steps; also a Llama, split_gather, with or without offload).
# Run: timeout 300 python this.py [--fixed]  (2 CPU ranks, gloo). Prints each rank's relative error of the final norm
# weight's update after one SGD step (lr 100, so the update is the gradient, far above bf16's rounding of the weight)
# against one device's, MISMATCH or OK.
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


LR = 100.0
MICRO_BATCHES = [torch.tensor([[3, 7, 1, 4, 9, 2, 5, 8]]), torch.tensor([[2, 9, 5, 8, 6, 11, 0, 3]])]


def fix():
    import ctypes

    from colossalai.booster.plugin.hybrid_parallel_plugin import HybridParallelZeroOptimizer
    from colossalai.shardformer.layer.utils import SeqParallelUtils

    original = HybridParallelZeroOptimizer._sync_sp_grads

    def _sync_sp_grads(self):
        original(self)
        if not self.require_grad_sync:
            return
        tp, synced, now = dist.get_world_size(self.tp_pg), getattr(self, "_synced_sp_grads", {}), {}
        for group_id in range(self.num_param_groups):
            for grad in self.get_working_grads_by_group_id(group_id):
                param = ctypes.cast(self.get_param_id_for_grad(grad), ctypes.py_object).value
                if not SeqParallelUtils.is_sp_partial_derived_param(param):
                    continue
                before = synced.get(id(grad))
                if before is not None and before[0] is grad:
                    grad.sub_(before[1] * (tp - 1))
                now[id(grad)] = (grad, grad.detach().clone())
        self._synced_sp_grads = now

    HybridParallelZeroOptimizer._sync_sp_grads = _sync_sp_grads


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=16, attn_implementation="eager")
    m = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:  # norm weights away from 1, so their gradients are not tiny
                p.uniform_(0.5, 1.5)
    return m.to(torch.bfloat16)


def reference():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for ids in MICRO_BATCHES:
        (m(input_ids=ids, labels=ids).loss / len(MICRO_BATCHES)).backward()
    opt.step()
    return m.model.norm.weight.detach().float()


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29577", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    install_shims()
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    expected = reference()
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, zero_stage=2, precision="bf16", enable_sequence_parallelism=True,
                                  sequence_parallelism_mode="split_gather", parallel_output=False,
                                  overlap_communication=False)
    booster = Booster(plugin=plugin)
    sharded = model()
    boosted, optimizer, *_ = booster.boost(sharded, torch.optim.SGD(sharded.parameters(), lr=LR))
    for ids in MICRO_BATCHES:  # gradient accumulation, synchronised (ZeRO-2 refuses no_sync)
        loss = boosted(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss / len(MICRO_BATCHES)
        booster.backward(loss, optimizer)
    optimizer.step()
    start = model().model.norm.weight.detach().float()
    got = boosted.unwrap().model.norm.weight.detach().float()
    error = ((got - start) - (expected - start)).norm() / (expected - start).norm()
    print(f"rank {rank}: the final norm weight's update, relative error {error:.3f} against one device's: "
          f"{'OK' if error < 0.05 else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
