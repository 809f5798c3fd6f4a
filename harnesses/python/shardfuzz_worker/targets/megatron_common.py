"""What the megatron-core targets share: megatron's CUDA-only calls pointed at the CPU, and its optimizer (with its
parameter scheduler) configured for a case."""

import collections
import contextlib
import copy
import gc
import os

from . import megatron_release
from .base import (IGNORE_INDEX, dtype_name, overlap_param_gather, param_gather_feature, parallel, reduce_bucket,
                   reduce_dtype_name, resumed_case)
from .torch_common import TorchTarget, _Done, _reduce_scatter_list


class MegatronTarget(TorchTarget):
    """A megatron-core target: megatron's modules imported once, before ranks are forked (a missing megatron-core
    makes the target unavailable), its package as the coverage prefix, its version recorded."""

    checkpoint_layouts = ("sharded", "gathered")  # (megatron_checkpoint: torch_dist, or the legacy torch format)

    def __init__(self):
        super().__init__()
        import megatron.core
        import megatron.core.distributed  # noqa: F401
        import megatron.core.optimizer  # noqa: F401
        import megatron.core.parallel_state  # noqa: F401
        import megatron.core.tensor_parallel  # noqa: F401

        self.coverage_prefixes = (os.path.dirname(megatron.core.__file__) + os.sep,)

    def versions(self):
        from importlib.metadata import version

        import torch

        # (megatron.core.package_info appends the git hash of the current directory's repository.)
        return {"torch": torch.__version__.split("+")[0], "megatron-core": version("megatron-core"), "backend": "gloo"}


def cuda_on_cpu():
    """A torch function mode under which megatron-core's CUDA-only calls run on the CPU: factory calls asking for a
    CUDA device get the CPU, `Tensor.cuda()` is the tensor itself, and `Tensor.type()` names the CUDA type of the
    tensor's dtype (what megatron checks parameters against)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                kwargs = {**kwargs, "device": "cpu"}
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
            if func is torch.Tensor.cuda:
                return args[0]
            return func(*args, **kwargs)

    return CudaOnCpu()


def _uneven_collectives():
    """torch.distributed's all_gather and reduce_scatter taking pieces of different sizes, as NCCL does (megatron's
    MoE token dispatcher counts on it between tensor-parallel ranks) and gloo does not: the pieces padded to the
    largest along dim 0 for the all-gather; the reduce-scatter torch_common's (all pieces all-reduced, this rank's
    kept). Equal pieces go to gloo's own collectives."""
    import torch
    import torch.distributed as dist

    all_gather, reduce_scatter = dist.all_gather, dist.reduce_scatter

    def uneven(pieces):
        return len({tuple(t.shape) for t in pieces}) > 1

    def gather(outputs, tensor, group=None, async_op=False):
        if not uneven(outputs):
            return all_gather(outputs, tensor, group=group, async_op=async_op)
        pad = torch.zeros((max(t.shape[0] for t in outputs), *tensor.shape[1:]), dtype=tensor.dtype)
        pad[: tensor.shape[0]] = tensor
        padded = [torch.empty_like(pad) for _ in outputs]
        all_gather(padded, pad, group=group)
        for out, p in zip(outputs, padded):
            out.copy_(p[: out.shape[0]])
        return _Done() if async_op else None

    def scatter(output, inputs, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if not uneven(inputs):
            return reduce_scatter(output, inputs, op=op, group=group, async_op=async_op)
        return _reduce_scatter_list(output, inputs, op, group, async_op)

    return gather, scatter


def patch_cuda():
    """megatron asks torch.cuda for the current device (its buffers) and stream (before a reduction): the CPU, and
    a stream with nothing to wait for."""
    import torch
    import torch.distributed as dist

    if not getattr(dist.all_gather, "uneven", False):
        dist.all_gather, dist.reduce_scatter = _uneven_collectives()
        dist.all_gather.uneven = True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.current_stream = lambda *args, **kwargs: _NoStream()
    torch.cuda.default_stream = lambda *args, **kwargs: _NoStream()  # (0.15.3's overlapped reduction waits on it)
    # (the partial distributed optimizer's side stream for its reductions across instances: the same)
    torch.cuda.Stream = lambda *args, **kwargs: _NoStream()
    torch.cuda.stream = lambda _stream: contextlib.nullcontext()
    torch.cuda.synchronize = lambda *args, **kwargs: None  # (after pipeline sends: done when they return here)
    torch.cuda.Event = lambda *args, **kwargs: _NoEvent()  # (the MoE dispatcher's device-to-host copies' event)


class _NoStream:
    """The current stream megatron waits on before a reduction: on the CPU, work is done when it returns."""

    def wait_event(self, _event):
        pass

    def wait_stream(self, _stream):
        pass

    def synchronize(self):
        pass

    def record_event(self, _event=None):
        return _NoEvent()


class _NoEvent:
    """An event recorded on a _NoStream: already complete."""

    def wait(self, _stream=None):
        pass

    def record(self, _stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


#: The dtype megatron reduces gradients in, per compute dtype, with `grad_reduce_in_fp32` off and on.
REDUCED_IN = {"f32": ("f32", "f32"), "bf16": ("bf16", "f32"), "f16": ("f16", "f32")}

#: How many megatron layouts a rank keeps built. Every group a layout creates holds three gloo threads per member
#: rank for as long as anything refers to it; a campaign kept every layout it met (~260 groups, 780 threads per rank
#: process after 8 minutes, campaign 188) and starved the machine. The least recently used layout beyond these is
#: torn down (its groups destroyed) and built again when a case asks for it.
KEPT_LAYOUTS = 4

_LAYOUTS = {"pristine": None, "current": None, "kept": collections.OrderedDict()}


def unsupported_training(case):
    """Why megatron's DDP and optimizers cannot run the case's training (None: they can)."""
    p = parallel(case)
    if p["zero_stage"] not in (0, 1):
        return "megatron's distributed optimizer shards optimizer state (ZeRO-1); gradients and parameters stay whole"
    dt = dtype_name(case)
    if dt == "f64":
        # Measured: "TypeError: Wrapped parameters must be one of torch.cuda.FloatTensor, torch.cuda.HalfTensor,
        # or torch.cuda.BFloat16Tensor. Received torch.cuda.DoubleTensor" (the distributed optimizer).
        return "megatron-core's optimizers take fp32, fp16 and bf16 parameters only: f64 is not expressed"
    if case["train"].get("loss_scale") is not None and dt == "f32":
        return "megatron's fp32 optimizer has no loss scaler"
    if reduce_dtype_name(case) not in REDUCED_IN[dt]:
        return f"megatron reduces {dt} gradients in {' or '.join(sorted(set(REDUCED_IN[dt])))} only"
    if p["reduce_bucket"] is not None and p["reduce_bucket"] < 1:
        return "megatron's bucket_size must be positive"
    if fp32_accumulating_reduce_scatter(case) and optimizer_instances(case) > 1:
        return "megatron's reduce-scatter with fp32 accumulation does not run with several distributed-optimizer instances"
    if per_token_loss(case) and case.get("data", {}).get("class_weights"):
        return "megatron's per-token loss divides by a count of tokens (num_tokens), not by class weights"
    if per_token_loss(case) and p["sum_collectives"] is False:
        return "megatron's per-token loss sums gradients: it cannot average in the collective (its own assertion)"
    return (megatron_release.unsupported_options("DistributedDataParallelConfig", ddp_settings(case))
            or megatron_release.unsupported_options("OptimizerConfig", optimizer_settings(case)))


def per_token_loss(case):
    """Whether megatron normalises the loss itself (`calculate_per_token_loss`: summed losses, the reduced gradients
    divided by the token count all-reduced over the data-parallel ranks in finalize_model_grads)."""
    return bool(case["train"].get("per_token_loss"))


def counted_tokens(case, inputs, lo, hi):
    """The targets the loss counts (all but the ignored) in the batch rows [lo, hi): megatron's `num_tokens`."""
    import numpy as np

    m = case["model"]
    targets = np.asarray(inputs["targets"]).reshape(m["batch"], m["seq"])[lo:hi]
    return int((targets != IGNORE_INDEX).sum())


def model_parallel(tp, pp=1, vs=1, instances=1, ep=1, etp=None):
    """megatron's parallel state for tensor- and pipeline-parallel degrees `tp`, `pp` (`vs` virtual stages per
    stage) over all ranks (data parallelism: the rest, its distributed optimizer split into `instances`; `ep`
    expert-parallel ranks among the data-parallel ones, experts split over `etp` ranks (None: tp)), as
    `initialize_model_parallel` builds it. Every rank calls it with the same degrees (it creates groups), so every
    rank keeps and evicts the same layouts. The last KEPT_LAYOUTS layouts' groups are kept: switching back restores
    them (megatron's own teardown forgets groups without destroying them, and a campaign alternates between a few
    layouts)."""
    from megatron.core import parallel_state as ps

    layout, kept = (tp, pp, vs, instances, ep, etp), _LAYOUTS["kept"]
    if _LAYOUTS["current"] == layout:
        return
    if _LAYOUTS["pristine"] is None:
        _LAYOUTS["pristine"] = _state_of(ps)
    _LAYOUTS["current"] = None  # (until the layout is in place: megatron may refuse it half-way)
    if layout in kept:
        kept.move_to_end(layout)
        _restore(ps, kept[layout]["state"])
    else:
        _restore(ps, _LAYOUTS["pristine"])
        while len(kept) >= KEPT_LAYOUTS:
            _destroy_groups(ps, kept.popitem(last=False)[1]["groups"])
        kept[layout] = {"groups": _groups_created(ps, lambda: ps.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vs if vs > 1 else None,
            num_distributed_optimizer_instances=instances, expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            # (gloo copies of the groups serve the distributed optimizer's checkpoints only; here they would double
            # the gloo groups, and the optimizer is told not to ask for them.)
            create_gloo_process_groups=False)), "state": _state_of(ps)}
    _LAYOUTS["current"] = layout


def _groups_created(ps, build):
    """The process groups `build` creates that this rank is a member of (megatron_release.new_groups); if it
    raises, those groups are destroyed and megatron's state is pristine again."""
    with megatron_release.new_groups() as created:
        try:
            build()
        except BaseException:
            _destroy_groups(ps, created)
            _restore(ps, _LAYOUTS["pristine"])
            raise
    return created


def _destroy_groups(ps, groups):
    """Destroys `groups` and drops megatron's reference to them: a gloo group's threads end once no one holds it."""
    import torch.distributed as dist

    doomed = {id(g) for g in groups}
    listed = getattr(ps, "_global_process_group_list", None)  # (0.19.2's list of them; 0.13.1 keeps none)
    if listed:
        listed[:] = [g for g in listed if id(g) not in doomed]
    for g in groups:
        dist.destroy_process_group(g)
    gc.collect()


def _state_of(module):
    """The module's globals (megatron's parallel state: groups, ranks, sizes), containers copied."""
    return {k: copy.copy(v) if isinstance(v, (dict, list, set)) else v
            for k, v in vars(module).items() if k.startswith("_") and k[1:2].isupper()}


def _restore(module, state):
    for k, v in state.items():
        setattr(module, k, copy.copy(v) if isinstance(v, (dict, list, set)) else v)


def ddp_settings(case):
    """DistributedDataParallelConfig's arguments for the case: ZeRO 1 the distributed optimizer, `reduce_bucket`
    the bucket size, `overlap_comm` the overlapped reduction, an f32 `reduce_dtype` under bf16 / f16 compute the
    reduction in fp32; under ZeRO 1 `zero_shard_group` the partial distributed optimizer (optimizer_instances) and
    `overlap_param_gather` the parameters' all-gather overlapped with the next forward (param_gather_overlapped), and
    gradients accumulated in the compute dtype but reduced in f32 its all-to-all reduce-scatter
    (fp32_accumulating_reduce_scatter); `sum_collectives` false averaging in the collective (average_in_collective: AVG
    reductions, expert gradients pre-scaled by their data-parallel share) instead of megatron's 1/dp pre-scaling and
    sums."""
    p = parallel(case)
    all_to_all, overlapped_gather = fp32_accumulating_reduce_scatter(case), param_gather_overlapped(case)
    return {"use_distributed_optimizer": p["zero_stage"] == 1,
            "grad_reduce_in_fp32": reduce_dtype_name(case) != dtype_name(case) and not all_to_all,
            "reduce_scatter_with_fp32_accumulation": all_to_all,
            "overlap_grad_reduce": bool(p["overlap_comm"]), "bucket_size": reduce_bucket(case, None),
            "num_distributed_optimizer_instances": optimizer_instances(case),
            # (align_param_gather: Megatron-LM's default, `--no-align-param-gather` unset)
            "overlap_param_gather": overlapped_gather, "align_param_gather": overlapped_gather,
            **({"average_in_collective": True} if p["sum_collectives"] is False else {})}


#: The parallel fields a megatron run resumes into another value of (`train.resume_parallel`): the distributed
#: optimizer's instances, the DDP's buckets and overlap; the model's own layout stays, and so does the optimizer
#: (the distributed and the non-distributed one write different formats: measured, loading one's distributed
#: checkpoint into the other fails on its keys, "optimizer.state.param" against "optimizer.state.fp32_param").
RESUMES_INTO = ("zero_shard_group", "reduce_bucket", "overlap_comm", "overlap_param_gather")

#: What a model built of megatron's tensor-parallel layers (megatron-tp) resumes into besides: other data-, tensor- and
#: pipeline-parallel degrees over the same ranks, sequence parallelism switched, through megatron's distributed
#: checkpoint, whose sharded tensors are resharded on load (its distributed optimizer's state `fully_reshardable`,
#: megatron_checkpoint.optimizer_sharding_type; blocks keep their global names over any number of stages).
RESUMES_INTO_DEGREES = RESUMES_INTO + ("dp", "tp", "pp", "sequence_parallel")


def pipeline_degrees(case):
    """(pp, virtual stages per stage) of megatron's parallel state for the case's layout: virtual stages under the
    interleaved schedule over more than one stage only."""
    p = parallel(case)
    return p["pp"], p["virtual_stages"] if p["pp"] > 1 and p["pipeline_schedule"] == "interleaved" else 1


def resumed_training(case, ep=1, etp=None):
    """Where the case resumes into another layout (`train.resume_parallel`): (relayout(), which switches megatron's
    parallel state to the resumed layout's tensor- and pipeline-parallel degrees and distributed-optimizer instances
    over the expert degrees given, its DDP settings, its optimizer settings); None otherwise."""
    if case["train"].get("resume_parallel") is None:
        return None
    resumed = resumed_case(case)
    tp = parallel(resumed)["tp"]
    return (lambda: model_parallel(tp, *pipeline_degrees(resumed), optimizer_instances(resumed), ep, etp),
            ddp_settings(resumed), optimizer_settings(resumed))


def fp32_accumulating_reduce_scatter(case):
    """Whether megatron reduces the case's gradients with `reduce_scatter_with_fp32_accumulation`: under ZeRO 1, a
    bf16 / f16 case whose gradients accumulate in the compute dtype (`grad_accum_dtype` set to it) and reduce in f32
    (`reduce_dtype`): the buffers stay in the compute dtype, an all-to-all sends each rank the others' pieces of its
    slice, and it sums them in fp32 (`grad_reduce_in_fp32` would accumulate in fp32 too)."""
    dt = dtype_name(case)
    return (parallel(case)["zero_stage"] == 1 and dt != "f32" and reduce_dtype_name(case) == "f32"
            and case["train"].get("grad_accum_dtype") == dt)


def optimizer_instances(case):
    """megatron's `num_distributed_optimizer_instances` for the case: under ZeRO 1 with `zero_shard_group` g, dp / g
    instances, each sharding its optimizer state over g consecutive data-parallel ranks (its gradients reduce-scattered
    within the instance, then all-reduced across instances); otherwise 1."""
    p = parallel(case)
    g = p["zero_shard_group"]
    return p["dp"] // g if p["zero_stage"] == 1 and g else 1


def param_gather_overlapped(case):
    """Whether megatron's distributed optimizer leaves the updated parameters' all-gather to the next forward's
    pre-hooks (`overlap_param_gather`, ZeRO 1 only: without the distributed optimizer megatron reads it as the
    layer-wise optimizer's switch)."""
    p = parallel(case)
    return p["zero_stage"] == 1 and overlap_param_gather(case, False)


def sync_parameters(ddps, settings):
    """What megatron's training loop does before it reads or saves parameters (end of training, evaluation,
    checkpoint): with `overlap_param_gather` the forward pre-hooks disabled and the pending all-gathers forced."""
    if settings["overlap_param_gather"]:
        for d in ddps:
            d.disable_forward_pre_hook(param_sync=True)


def data_parallel_features(prefix, case):
    """Coverage features of the case's distributed-optimizer options: `prefix:instances-N`, the all-to-all
    reduce-scatter, the param-gather mode."""
    n = optimizer_instances(case)
    all_to_all = [f"{prefix}:reduce-scatter-fp32-accumulation"] if fp32_accumulating_reduce_scatter(case) else []
    averaged = [f"{prefix}:average-in-collective"] if parallel(case)["sum_collectives"] is False else []
    return ([f"{prefix}:instances-{n}"] if n > 1 else []) + all_to_all + averaged + (
        param_gather_feature(prefix, case) if parallel(case)["zero_stage"] == 1 else [])


def reduced_grads(ddp, distributed_optimizer):
    """Every trainable parameter's reduced gradient by name, read from megatron's buffers after finish_grad_sync.
    Under the distributed optimizer a rank holds the reduced values of its slice of each bucket only: the slices
    are all-gathered over the optimizer's data-parallel group (into a copy; the buffers stay as megatron left
    them)."""
    import torch
    import torch.distributed as dist

    names = {p: n for n, p in ddp.module.named_parameters()}
    out = {}
    for group in list(ddp.bucket_groups) + list(ddp.expert_parallel_bucket_groups):
        for bucket in group.buckets:
            data = bucket.grad_data
            owners = group.intra_distributed_optimizer_instance_group if distributed_optimizer else None
            if owners is not None and owners.size() > 1:
                whole = torch.empty_like(data)
                mine = data.view(owners.size(), -1)[owners.rank()]
                dist.all_gather_into_tensor(whole, mine.contiguous(), group=owners)
                data = whole
            for param in bucket.params_list:
                start = megatron_release.grad_offset(bucket, param)
                out[names[param]] = data[start:start + param.numel()].view(param.shape).clone()
    return out


def decoupled_weight_decay(o):
    """megatron's `decoupled_weight_decay` for the case's optimizer `o`: off only where it decides something, Adam
    with weight decay (coupled, L2); on (AdamW: the same update without decay) otherwise, which is also what
    releases before the option did (0.13.1's Adam is torch's AdamW)."""
    return not (o["kind"] == "adam" and o.get("weight_decay", 0.0) > 0)


def optimizer_settings(case):
    """OptimizerConfig's arguments for the case's optimizer (but `params_dtype`): Adam (AdamW where the case decays
    decoupled) or SGD without momentum, the case's clipping (0: none), fp32 main parameters under bf16 / f16 and the
    case's loss scaling (loss_scaling_settings)."""
    t = case["train"]
    o, dt = t["optimizer"], dtype_name(case)
    clip = t.get("clip_grad_norm")
    return {"optimizer": "sgd" if o["kind"] == "sgd" else "adam", "lr": o["lr"],
            "weight_decay": o.get("weight_decay", 0.0), "adam_beta1": o.get("beta1", 0.9),
            "adam_beta2": o.get("beta2", 0.999), "adam_eps": o.get("eps", 1e-8),
            "decoupled_weight_decay": decoupled_weight_decay(o), "sgd_momentum": 0.0,
            "clip_grad": float(clip) if clip is not None else 0.0, "bf16": dt == "bf16", "fp16": dt == "f16",
            **loss_scaling_settings(case), "use_distributed_optimizer": parallel(case)["zero_stage"] == 1,
            "overlap_param_gather": param_gather_overlapped(case)}


def loss_scaling_settings(case):
    """OptimizerConfig's loss-scaling arguments. f16 with the case's `loss_scale`: megatron's DynamicGradScaler from
    that scale, halved at every step whose gradients are not finite (hysteresis 1; the step skipped), never grown
    within a case (a growth window of 2^31 steps) nor bounded below (2^-100), as the reference's scaler; f16 without:
    a constant scale of 1 (megatron still skips a step whose gradients overflow). bf16 with a `loss_scale`: megatron's
    constant scaler at that scale (its dynamic scaler is fp16's); the reference's halving differs only after an
    overflow, which bf16's range does not meet at these scales."""
    dt, scale = dtype_name(case), case["train"].get("loss_scale")
    if dt == "f16" and scale is not None:
        return {"loss_scale": None, "initial_loss_scale": float(scale), "min_loss_scale": 2.0**-100,
                "loss_scale_window": 2**31, "hysteresis": 1}
    if dt == "f16":
        return {"loss_scale": 1.0}
    return {"loss_scale": float(scale) if scale is not None and dt == "bf16" else None}


def scales_loss(case):
    """Whether megatron's optimizer holds a loss scaler for the case (and skips a step whose gradients overflow)."""
    return dtype_name(case) == "f16" or (dtype_name(case) == "bf16" and case["train"].get("loss_scale") is not None)


def loss_scale_of(opt):
    """The loss scale the optimizer's gradients are multiplied by now (1 without a scaler)."""
    return float(opt.get_loss_scale())


def megatron_step(opt, schedule, case):
    """megatron's optimizer step, the scheduler stepped after a successful update only (as megatron's training loop
    does); whether the step was skipped (None where megatron holds no loss scaler)."""
    ok, _norm, _zeros = opt.step()
    if ok:
        schedule.step(1)
    return (not ok) if scales_loss(case) else None


def weight_decay_overrides(case):
    """get_megatron_optimizer's `config_overrides`: None keeps megatron's default groups (no decay on biases and
    other vectors: the case's `no_decay_vectors`); an empty table decays every parameter."""
    return None if case["train"]["optimizer"].get("no_decay_vectors") else {}


def constant_schedule(case, opt):
    """megatron's parameter scheduler at the case's constant learning rate and weight decay: it is what sets each
    group's weight decay (times the group's `wd_mult`: 0 for the vectors megatron leaves undecayed), as megatron's
    training loop runs it."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    o = case["train"]["optimizer"]
    lr, wd = o["lr"], o.get("weight_decay", 0.0)
    return OptimizerParamScheduler(opt, init_lr=lr, max_lr=lr, min_lr=lr, lr_warmup_steps=0, lr_decay_steps=1,
                                   lr_decay_style="constant", start_wd=wd, end_wd=wd, wd_incr_steps=1,
                                   wd_incr_style="constant")


def transformer_config(dt, tp=1, sequence_parallel=False, per_token_loss=False, pp=1, vs=1):
    """The TransformerConfig megatron's DDP, schedules and finalize_model_grads read (tensor and sequence
    parallelism, the mixed-precision switches, `calculate_per_token_loss`); the model itself is the case's, so its
    sizes here are placeholders megatron's checks accept."""
    import torch
    from megatron.core.transformer import TransformerConfig

    # (Between pipeline stages megatron sends each tensor's shape first, `variable_seq_lengths`: the placeholder
    # sizes never shape a message, and micro-batches may differ by a row. Its config accepts that only with the
    # all-to-all MoE token dispatcher, which a model without experts never runs.)
    return TransformerConfig(num_layers=pp * vs, hidden_size=8 * tp, num_attention_heads=tp, tensor_model_parallel_size=tp,
                             pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vs if vs > 1 else None,
                             pipeline_dtype=dt, variable_seq_lengths=pp > 1,
                             moe_token_dispatcher_type="alltoall" if pp > 1 else "allgather",
                             sequence_parallel=sequence_parallel, use_cpu_initialization=True, params_dtype=dt,
                             bf16=dt == torch.bfloat16, fp16=dt == torch.float16,
                             calculate_per_token_loss=per_token_loss)


_REDUCE_SCATTER = {}


def fresh_reduce_scatter():
    """megatron's reduce-scatter function as a fresh process has it. A DistributedDataParallel built with
    `reduce_scatter_with_fp32_accumulation` replaces the module-level `dist_reduce_scatter_func` of
    param_and_grad_buffer for good, and every later DDP in the process (with the option off) then reduces through it
    too; with `overlap_grad_reduce` their handle never runs its fp32 sum, so their gradients stay unreduced (measured:
    campaign 181's pool, a case after an all-to-all one, gradients 10^6 x their noise off; alone it passes). A real
    run builds its DDP once per process; cases of a rank pool must not inherit one another's choice."""
    from megatron.core.distributed import param_and_grad_buffer as buffers

    pristine = _REDUCE_SCATTER.setdefault("func", buffers.dist_reduce_scatter_func)
    buffers.dist_reduce_scatter_func = pristine


def megatron_training(case, model, config, ddp_kwargs, optimizer_kwargs, overrides):
    """(DDP chunk, optimizer, scheduler) for `model`, as megatron's training loop sets them up: the DDP and optimizer
    configs' arguments `ddp_kwargs` and `optimizer_kwargs` (params_dtype: the model's), `overrides` its
    config_overrides. `model` a list of virtual-pipeline chunks: a list of DDP chunks, buckets for the first only
    (megatron's get_model: `disable_bucketing` for the others), one optimizer over them all."""
    from megatron.core.distributed import DistributedDataParallel

    chunks = model if isinstance(model, list) else [model]
    dt = next(chunks[0].parameters()).dtype
    fresh_reduce_scatter()
    ddps = [DistributedDataParallel(config, megatron_release.new_config("DistributedDataParallelConfig", **ddp_kwargs), m,
                                    disable_bucketing=i > 0)
            for i, m in enumerate(chunks)]
    opt = megatron_release.new_optimizer(megatron_release.new_config("OptimizerConfig", **optimizer_kwargs, params_dtype=dt),
                                     ddps, overrides)
    return (ddps if isinstance(model, list) else ddps[0]), opt, constant_schedule(case, opt)
