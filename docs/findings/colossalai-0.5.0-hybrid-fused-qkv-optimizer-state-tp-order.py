# Colossal-AI 0.5.0 (torch 2.5.1): HybridParallelPlugin's checkpoint writes a fused column-parallel parameter's
# optimizer states in its shards' order, so a run resumed under another tensor-parallel degree steps every fused
# column with another column's Adam moments, silently.
# GPT-2's attention projection `c_attn` is one fused [q | k | v] Conv1D; shardformer replaces it with
# GPT2FusedLinearConv1D_Col, rank r holding [q_r | k_r | v_r], a customized distributed tensor with its own
# `gather_fn` / `shard_fn`. HybridParallelCheckpointIO gathers the weight with that gather_fn (the saved model is
# right), but `gather_from_sharded_optimizer_state` (checkpoint_io/hybrid_parallel_checkpoint_io.py:1061-1065)
# concatenates the parameter's optimizer states over the tp group: the saved exp_avg / exp_avg_sq of c_attn run
# [q_0 k_0 v_0 | q_1 k_1 v_1]. `shard_from_complete_optimizer_state` (:1110-1126) cuts loaded states into equal
# slices, which undoes it for the same tp degree only: under tp 1 (or 4) each q, k, v column gets another's moments.
# (The same holds for every fused column-parallel layer whose shards interleave: the GPT-2-style fused linear layers
# of shardformer's policies.) Not found reported; ColossalAI#817 (2022) was the same fused split in the legacy
# Linear_Col's weights.
# Fix (`--fixed`): the states are gathered with the parameter's gather_fn, as its weight is, and on load put in the
# shards' order (the parameter's shard_fn on each rank) before the equal slicing.
# Found by shardfuzz (target colossalai-hybrid, 2026-12-06, the new vocabulary: a run resumed into other data- and
# tensor-parallel degrees): GPT-2 tp 2 resumed as dp 2 and back, Adam, f32: the loss after the first resumed step off by
# 1,811x and 2,092x its noise; with c_attn's q, k, v frozen the same resumes pass.
# Run: timeout 300 python this.py [--fixed]  (2 CPU ranks, gloo, a one-layer GPT-2 over tp 2, one Adam step,
# save_optimizer (sharded), then the checkpoint loaded by a tp 1 (dp 2) plugin): prints, per rank, whether the loaded
# exp_avg of c_attn equals the one the tp 2 run held (gathered with the layer's own gather_fn): MISMATCH or OK.
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
    """The states of a parameter with a gather_fn are gathered with it; on load they are put in the shards' order."""
    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as io

    cls = io.HybridParallelCheckpointIO
    original_gather = cls.gather_from_sharded_optimizer_state
    original_load = cls.load_states_into_optimizer

    def gather(state, param, original_shape, dp_group, tp_group, use_zero, inplace, device=torch.device("cpu"),
               pinned_state_dicts=None):
        if getattr(param, "gather_fn", None) is None or dist.get_world_size(tp_group) == 1:
            return original_gather(state, param, original_shape, dp_group, tp_group, use_zero, inplace, device,
                                   pinned_state_dicts)
        assert not use_zero  # (this script's plugin: ZeRO's own gather first otherwise)
        return {k: (param.gather_fn(v).detach().clone().to(device) if isinstance(v, torch.Tensor) and k != "step"
                    else v) for k, v in state.items()}

    def load_states_into_optimizer(self, optimizer, state_dict, id_map):
        id_map_params = {int(k): p for k, p in id_map.items()}
        working = optimizer.get_master_to_working_map()
        for k, state in state_dict.items():
            param = id_map_params.get(int(k))
            param = working[id(param)] if working is not None and param is not None else param
            if param is not None and getattr(param, "shard_fn", None) is not None and self.tp_size > 1:
                for key, v in list(state.items()):
                    if isinstance(v, torch.Tensor) and key != "step":
                        mine = param.shard_fn(v).contiguous()
                        pieces = [torch.empty_like(mine) for _ in range(self.tp_size)]
                        dist.all_gather(pieces, mine, group=self.tp_group)
                        state[key] = torch.cat(pieces, dim=-1)
        return original_load(self, optimizer, state_dict, id_map)

    cls.gather_from_sharded_optimizer_state = staticmethod(gather)
    cls.load_states_into_optimizer = load_states_into_optimizer


def fused_states(optimizer, model):
    """c_attn.weight's Adam states on this rank, whole ([in, 3 x hidden], in [q | k | v] order)."""
    p = dict(model.unwrap().named_parameters())["transformer.h.0.attn.c_attn.weight"]
    state = optimizer.optim.state[p]
    return {k: (p.gather_fn(state[k]) if getattr(p, "gather_fn", None) is not None else state[k]).clone()
            for k in ("exp_avg", "exp_avg_sq")}


def boosted(tp, vocab):
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    booster = Booster(plugin=HybridParallelPlugin(tp_size=tp, pp_size=1, precision="fp32"))
    return booster, *booster.boost(model, torch.optim.Adam(model.parameters(), lr=1e-3))[:2]


def run(rank, world, fixed, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29587", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    install_shims()
    if fixed:
        fix()
    vocab = 64
    booster, model, optimizer = boosted(2, vocab)
    ids = torch.randint(0, vocab, (2, 4), generator=torch.Generator().manual_seed(1))
    # (Any loss: the point is the Adam states. The GPT-2 blocks alone: the LM head's forward without labels meets
    # another Colossal-AI bug, colossalai-0.5.0-gpt2-pipeline-forward-without-labels-crash.py.)
    hidden = model.unwrap().transformer(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    booster.backward(hidden.square().mean(), optimizer)
    optimizer.step()
    held = fused_states(optimizer, model)
    booster.save_optimizer(optimizer, f"{path}/optimizer", shard=True)
    dist.barrier()
    booster1, model1, optimizer1 = boosted(1, vocab)  # the same two ranks as dp 2, tp 1
    booster1.load_optimizer(optimizer1, f"{path}/optimizer")
    loaded = fused_states(optimizer1, model1)
    for k in held:
        wrong = (held[k] != loaded[k]).any(dim=0)
        print(f"rank {rank}: c_attn.weight {k} loaded under tp 1: {int(wrong.sum())} of {wrong.numel()} columns differ "
              f"from the tp 2 run's: {'MISMATCH' if wrong.any() else 'OK'}", flush=True)


if __name__ == "__main__":
    where = tempfile.mkdtemp(prefix="colossalai-ckpt-")
    try:
        mp.spawn(run, args=(2, "--fixed" in sys.argv, where), nprocs=2)
    finally:
        shutil.rmtree(where, ignore_errors=True)
