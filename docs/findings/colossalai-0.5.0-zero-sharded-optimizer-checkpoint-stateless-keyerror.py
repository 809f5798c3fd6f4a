# Colossal-AI 0.5.0 (torch 2.5.1): LowLevelZeroPlugin cannot save a sharded optimizer checkpoint for an optimizer that
# keeps no state for some parameter. `booster.save_optimizer(optimizer, path, shard=True)` goes through
# LowLevelZeroCheckpointIO.save_sharded_optimizer to LowLevelZeroOptimizer.state_dict_shard
# (zero/low_level/low_level_optim.py:853-921), which takes `local_states = self.optim.state_dict()["state"]` and reads
# `local_states[param_idx]` for every parameter index (line 884). torch optimizers only list parameters they hold
# state for: plain SGD (no momentum) never does, and no optimizer does before its first step or after a step that
# the fp16 loss scaler skipped. Saving then fails with `KeyError: 0` on every rank. The unsharded path
# (`state_dict`, line 790) skips such parameters (`if param not in self.optim.state: continue`); the sharded one
# does not. The same lines are on ColossalAI's main branch as of 2026-04 (commit 4f9953be).
# Fix (`--fixed`): a parameter without state is saved with an empty one, as torch's own checkpoints have it; the
# script then loads the checkpoint into a fresh model and optimizer and checks that training goes on exactly as
# without the round trip.
# Found by shardfuzz (target colossalai-zero, 2026-11-28, by hand on the first runs of its new case field
# `train.resume_after`: ZeRO-2, dp 2, SGD, checkpointed after step 1 of 3).
# Run: timeout 300 python this.py [--fixed] [--momentum] [--unsharded]  (2 CPU ranks, gloo; `--momentum`: SGD with
# momentum 0.9, which holds state after its first step, and `--unsharded`: shard=False, both OK without the fix).
# Prints CRASH with the exception, or OK / MISMATCH for the resumed run against the uninterrupted one.
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
RESUME_AFTER = 1


def fix():
    """A parameter without optimizer state is saved with an empty one."""
    from colossalai.zero.low_level.low_level_optim import LowLevelZeroOptimizer

    original = LowLevelZeroOptimizer.state_dict_shard

    def state_dict_shard(self, *args, **kwargs):
        inner = self.optim.state_dict

        def with_every_index():
            out = inner()
            count = sum(len(g["params"]) for g in out["param_groups"])
            out["state"] = {i: out["state"].get(i, {}) for i in range(count)}
            return out

        self.optim.state_dict = with_every_index
        try:
            yield from original(self, *args, **kwargs)
        finally:
            del self.optim.state_dict

    LowLevelZeroOptimizer.state_dict_shard = state_dict_shard


def fresh(momentum):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(), torch.nn.Linear(12, 4))
    return m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=momentum)


def train(booster, boosted, optimizer, rank, steps):
    for k in steps:
        torch.manual_seed(100 * k + rank)  # each data-parallel rank its own batch, the same in both runs
        booster.backward(boosted(torch.randn(4, 8)).square().mean(), optimizer)
        optimizer.step()
        optimizer.zero_grad()


def flat(boosted):
    return torch.cat([p.detach().reshape(-1) for p in boosted.unwrap().parameters()])


def run(rank, fixed, momentum, shard, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29581", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    install_shims()
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import LowLevelZeroPlugin

    booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="fp32"))
    uninterrupted, opt = booster.boost(*fresh(momentum))[:2]
    train(booster, uninterrupted, opt, rank, range(STEPS))
    resumed, opt = booster.boost(*fresh(momentum))[:2]
    train(booster, resumed, opt, rank, range(RESUME_AFTER))
    try:
        booster.save_model(resumed, f"{path}/model", shard=shard)
        booster.save_optimizer(opt, f"{path}/optimizer", shard=shard)
    except Exception as e:  # noqa: BLE001 - the finding
        print(f"rank {rank}: CRASH in save_optimizer: {type(e).__name__}: {e}", flush=True)
        return
    dist.barrier()
    resumed, opt = booster.boost(*fresh(momentum))[:2]
    booster.load_model(resumed, f"{path}/model")
    booster.load_optimizer(opt, f"{path}/optimizer")
    train(booster, resumed, opt, rank, range(RESUME_AFTER, STEPS))
    if rank == 0:
        diff = float((flat(resumed) - flat(uninterrupted)).abs().max())
        print(f"resumed after step {RESUME_AFTER} of {STEPS} against uninterrupted: largest parameter difference "
              f"{diff:.3e}: {'MISMATCH' if diff > 1e-6 else 'OK'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    where = tempfile.mkdtemp(prefix="colossalai-ckpt-")
    try:
        mp.spawn(run, args=("--fixed" in sys.argv, 0.9 if "--momentum" in sys.argv else 0.0,
                            "--unsharded" not in sys.argv, where), nprocs=2)
    finally:
        shutil.rmtree(where, ignore_errors=True)
