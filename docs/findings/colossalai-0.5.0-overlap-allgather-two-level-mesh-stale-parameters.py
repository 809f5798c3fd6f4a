# Colossal-AI 0.5.0 (torch 2.5.1): LowLevelZeroPlugin with `overlap_allgather=True` on a two-level data-parallel mesh
# (`extra_dp_size` > 1) leaves the ranks' working parameters different after an optimizer step. After the step the ZeRO
# optimizer gathers each updated parameter with `all_gather_into_flat_tensor_nd(..., async_op=True)`
# (low_level_optim.py:610). On a tuple of process groups that function (zero/low_level/_utils.py:215-235) runs one
# all-gather per mesh level and issues the outer one, whose input is the inner one's output, without waiting for the
# inner one, and returns only the outer one's handle (all that ZeroOpHook / _force_wait_all_gather then wait for). So
# the outer gather may send partitions that the inner one has not written yet: with gloo's asynchronous work (a thread
# per process group) it does, and on NCCL each process group runs on its own stream, which is not ordered after the
# other group's. Replicas of the same parameter then differ (stale values from before the step), and training goes on
# from different weights on different ranks. A flat group (extra_dp_size=1) or overlap_allgather=False is right.
# The same code is on ColossalAI's main branch as of 2026-04 (commit 4f9953be).
# Fix (`--fixed`): wait for each level's gather before issuing the next (the last one stays asynchronous).
# Found by shardfuzz (target colossalai-zero, 2026-11-28: ZeRO-1, dp 4, extra_dp_size 2, bf16, 2 Adam steps: the
# replicas of biases 14-29x their noise apart; the same case passes with a flat group or without overlap).
# Run: timeout 300 python this.py [--fixed] [--flat] [--no-overlap]  (4 CPU ranks, gloo; `--flat`: extra_dp_size=1,
# `--no-overlap`: overlap_allgather=False, both OK without the fix). Trains a small MLP 3 SGD steps in fp32, waits for
# the gathers as Colossal-AI's checkpointing does, and prints how many parameter elements of ranks 1-3 differ from
# rank 0's: MISMATCH or OK (correct ZeRO replicas are bit-identical).
import contextlib
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The CPU start-up shims below are shardfuzz's (harnesses/python/shardfuzz_worker/targets/colossalai_common.py):
# they stand in for device management, list-form reduce_scatter / all_to_all on gloo and ZeRO's CUDA check, and do
# not change what Colossal-AI computes (all_gather_into_tensor is gloo's own, asynchronous as asked).
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
STEPS = 3
LR = 0.1


def fix():
    """Wait for each level's all-gather before issuing the next (the last one stays asynchronous)."""
    import numpy as np
    from colossalai.zero.low_level import _utils, low_level_optim

    original = _utils.all_gather_into_flat_tensor_nd

    def all_gather_into_flat_tensor_nd(output_tensor, input_tensor, group, async_op=False):
        if not async_op or isinstance(group, dist.ProcessGroup):
            return original(output_tensor, input_tensor, group, async_op)
        sizes, ranks = [dist.get_world_size(pg) for pg in group], [dist.get_rank(pg) for pg in group]
        handle = None
        for i, pg in list(enumerate(group))[::-1]:
            if handle is not None:
                handle.wait()
            out = output_tensor
            if i > 0:
                out = output_tensor.chunk(int(np.prod(sizes[:i])))[int(np.ravel_multi_index(ranks[:i], sizes[:i]))]
            handle = dist.all_gather_into_tensor(out, input_tensor, group=pg, async_op=True)
            input_tensor = out
        return handle

    _utils.all_gather_into_flat_tensor_nd = low_level_optim.all_gather_into_flat_tensor_nd = all_gather_into_flat_tensor_nd


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(), torch.nn.Linear(12, 8), torch.nn.GELU(),
                               torch.nn.Linear(8, 4))


def run(rank, fixed, extra_dp_size, overlap):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29578", RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=60))
    install_shims()
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import LowLevelZeroPlugin

    plugin = LowLevelZeroPlugin(stage=1, precision="fp32", extra_dp_size=extra_dp_size, overlap_allgather=overlap)
    booster = Booster(plugin=plugin)
    m = model()
    boosted, optimizer, *_ = booster.boost(m, torch.optim.SGD(m.parameters(), lr=LR))
    torch.manual_seed(1 + rank)  # each data-parallel rank its own batch
    for _ in range(STEPS):
        loss = boosted(torch.randn(4, 8)).square().mean()
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
    boosted._force_wait_all_gather()  # what Colossal-AI's own checkpointing waits for before reading parameters
    mine = torch.cat([p.detach().reshape(-1) for p in boosted.unwrap().parameters()])
    everyone = [torch.empty_like(mine) for _ in range(4)]
    dist.all_gather(everyone, mine)
    if rank == 0:
        for r in range(1, 4):
            diff = (everyone[r] - everyone[0]).abs()
            print(f"rank {r} against rank 0: {int((diff > 0).sum())} of {diff.numel()} parameter elements differ "
                  f"(largest {float(diff.max()):.3e}): {'MISMATCH' if diff.max() > 0 else 'OK'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv, 1 if "--flat" in sys.argv else 2, "--no-overlap" not in sys.argv), nprocs=4)
