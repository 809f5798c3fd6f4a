"""Shared by the Colossal-AI targets: the start-up shims it needs on a CPU-only machine with gloo, the process
group, versions. Measured on Colossal-AI 0.5.0 / torch 2.5.1 (../shared/reference/colossalai-on-cpu.md):

  A  colossalai.accelerator's CPU accelerator raises for current_device / synchronize / manual_seed / streams
     and passes a device to torch.get_rng_state: a subclass with CPU no-ops replaces it (its streams wait for
     nothing: CPU work runs in program order).
  B  gloo has no list-form reduce_scatter (sequence parallelism's reduce-scatter) and no list-form all_to_all:
     both are implemented over collectives gloo has, with the same results (sum of every rank's chunk).
  C  torch.cuda.set_device (called by modeling code on any device): a no-op.
  D  LowLevelZeroOptimizer._sanity_checks insists on CUDA parameters: only its dtype check is kept.
  E  Tensor.record_stream on CPU tensors: a no-op.
  G  pipeline/p2p.py reads dist.Backend.HCCL, absent from torch's CPU build: defined.
  H  Tensor.cuda() (the GPT-2 fused qkv checkpoint gather moves its shard to the GPU): on a machine without CUDA,
     the tensor itself.
  I  gloo's all_gather_into_tensor wants the output shaped as the inputs concatenated along dim 0; NCCL takes any
     output of world x the input's elements, which Colossal-AI before 0.4.9 passes (ZeRO's get_param_grad gathers
     a flat partition into [world, n]: "invalid tensor size ... expected (52), got (1, 52)" on 0.4.6): contiguous
     tensors are gathered flat, as NCCL does (the same bytes).
  J  ColoAttention (shardformer's flash attention, which Colossal-AI's Command forwards use in every layout) finds no
     kernel without CUDA: Colossal-AI's own SDPA kernel (FlashAttentionSdpaCudaExtension, which calls torch's
     scaled_dot_product_attention and reports itself unavailable without CUDA) is made available; torch runs it on
     the CPU.

None of them changes what Colossal-AI computes: they stand in for device management and for collectives
gloo lacks.
"""

import contextlib
import datetime
import os

from .torch_common import TorchTarget, _Done, _reduce_scatter_list, shared_tempdir


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
    """Shims A-E and G-I (idempotent; in every rank after the process group exists)."""
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

        real_gather = dist.all_gather_into_tensor

        def all_gather_into_tensor(output, input, group=None, async_op=False):
            if dist.get_backend(group) == "gloo" and output.is_contiguous() and input.is_contiguous():
                return real_gather(output.view(-1), input.view(-1), group=group, async_op=async_op)
            return real_gather(output, input, group=group, async_op=async_op)

        reduce_scatter.shardfuzz_shim = all_to_all.shardfuzz_shim = True
        dist.reduce_scatter, dist.all_to_all = reduce_scatter, all_to_all
        dist.all_gather_into_tensor = all_gather_into_tensor
    torch.Tensor.record_stream = lambda self, stream=None: None
    if not hasattr(dist.Backend, "HCCL"):
        dist.Backend.HCCL = "hccl"
    torch.cuda.set_device = lambda *_a, **_k: None
    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda self, *_a, **_k: self
    _shim_zero_sanity_checks()
    if not torch.cuda.is_available():
        from colossalai.kernel.kernel_loader import FlashAttentionSdpaCudaExtension

        FlashAttentionSdpaCudaExtension.is_available = lambda self: True


def _shim_zero_sanity_checks():
    from colossalai.zero.low_level import low_level_optim

    def sanity_checks(self):  # low_level_optim.py:253 without its device assertion
        for group in self.optim.param_groups:
            for p in group["params"]:
                if not getattr(p, "skip_zero_check", False):
                    assert p.dtype == self._dtype, f"Parameters are expected to have the same dtype `{self._dtype}`, but got `{p.dtype}`"

    low_level_optim.LowLevelZeroOptimizer._sanity_checks = sanity_checks


class ColossalTarget(TorchTarget):
    """A torch target whose ranks run Colossal-AI: imported once before the ranks fork, shimmed in each."""

    def __init__(self):
        super().__init__()
        # Imported once here, before ranks are forked (a missing colossalai makes the target unavailable).
        import colossalai
        import colossalai.shardformer.layer  # noqa: F401
        import colossalai.zero.low_level.low_level_optim  # noqa: F401

        self.coverage_prefixes = (os.path.dirname(colossalai.__file__) + os.sep,)

    def versions(self):
        from importlib.metadata import version

        import torch

        return {"torch": torch.__version__.split("+")[0], "colossalai": version("colossalai"), "backend": "gloo"}

    def init_rank(self, rank, world, timeout_s):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True, warn_only=True)
        # (colossalai.launch would set no timeout: one rank's exception would hang its peers.)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        install_shims()
        from .. import known_fixes

        known_fixes.apply(self.name)


def fp16_scaler(opt):
    """The fp16 mixed-precision mixin of a Colossal-AI optimizer wrapper when it has a dynamic loss scaler
    (`mixed_precision_mixin` of the ZeRO optimizers, `mixed_precision` of the AMP ones), else None."""
    for attr in ("mixed_precision_mixin", "mixed_precision"):
        mixin = getattr(opt, attr, None)
        if mixin is not None and hasattr(mixin, "grad_scaler"):
            return mixin
    return None


def booster_resume(booster, boosted, opt, fresh, gathered=False, into=None):
    """The run checkpointed and resumed as a Colossal-AI user does it: the booster's sharded model and optimizer
    checkpoints saved (`gathered`: its unsharded ones, `shard=False`, gathered into one file each), `fresh()` ->
    (model, optimizer) built anew, boosted by the same booster (or by `into`, another plugin's: the run resumes into
    another layout) and loaded from them; returns the new (boosted model, optimizer)."""
    import torch.distributed as dist

    with shared_tempdir() as path:
        model_path, optimizer_path = (f"{path}/model.pt", f"{path}/optimizer.pt") if gathered else (
            f"{path}/model", f"{path}/optimizer")
        booster.save_model(boosted, model_path, shard=not gathered)
        booster.save_optimizer(opt, optimizer_path, shard=not gathered)
        dist.barrier()
        model, new_opt = fresh()
        into = into or booster
        boosted, opt, *_ = into.boost(model, new_opt)
        into.load_model(boosted, model_path)
        into.load_optimizer(opt, optimizer_path)
    return boosted, opt


def plugin_step(opt):
    """The optimizer's step and zero_grad; whether its fp16 loss scaler skipped the step, None without one. The
    scaler checks every fp16 step for overflow, even at a fixed scale of 1 (a case without loss scaling, whose
    scale cannot go down): its `found_overflow` flag, set by the step's check, says so."""
    mixin = fp16_scaler(opt)
    before = mixin.loss_scale if mixin is not None else None
    opt.step()
    opt.zero_grad()
    if before is None:
        return None
    found = getattr(mixin, "found_overflow", None)
    return bool(found.item() > 0) if found is not None else mixin.loss_scale < before


def unscaled(opt, grad):
    """A gradient read before the step, which still carries the fp16 loss scale (the optimizer divides it out in
    step()), as the user's gradient: divided by the scale (a power of two: exact)."""
    mixin = fp16_scaler(opt)
    return grad if grad is None or mixin is None else grad / mixin.loss_scale


def loss_scaling(case):
    """The plugin arguments of the case's loss scaling: its dynamic scale, halved on the first overflow
    (hysteresis 1) and never grown, as the reference's scaler; without one, a scale of 1 that stays 1."""
    scale = case["train"].get("loss_scale")
    if scale is None:
        return {"initial_scale": 1, "min_scale": 1}
    return {"initial_scale": float(scale), "min_scale": 2.0**-60, "hysteresis": 1, "growth_interval": 2**31 - 1,
            "max_scale": float(scale)}


def unsupported_loss_scale(case, dtype):
    """Colossal-AI's plugins scale the loss in fp16 only."""
    if case["train"].get("loss_scale") is not None and dtype != "f16":
        return "Colossal-AI's plugins scale the loss in fp16 only"
    return None
