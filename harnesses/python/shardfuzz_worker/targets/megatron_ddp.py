"""megatron-ddp: the case's model wrapped in megatron-core's DistributedDataParallel over the data-parallel ranks and
trained by megatron-core's own optimizer (`get_megatron_optimizer`), on the CPU with gloo.

  zero_stage 0   DDP: one contiguous gradient buffer per dtype, all-reduced after the last micro-batch
  zero_stage 1   the distributed optimizer (`use_distributed_optimizer`): gradients reduce-scattered to the rank
                 that owns their slice of the buffer, fp32 main parameters and optimizer state for that slice only,
                 parameters all-gathered after the step
  reduce_bucket  `bucket_size` (elements per bucket; absent: megatron's own choice)
  overlap_comm   `overlap_grad_reduce` (a bucket's collective starts as soon as its last gradient is ready)
  reduce_dtype   f32 under bf16 / f16 compute: `grad_reduce_in_fp32` (gradients accumulated and reduced in fp32); under
                 ZeRO 1 with `grad_accum_dtype` the compute dtype, `reduce_scatter_with_fp32_accumulation` (gradients
                 kept in the compute dtype, sent by an all-to-all, each rank's slice summed in fp32)
  per_token_loss `calculate_per_token_loss`: each rank backpropagates its summed token loss, the gradients are summed
                 (no 1/dp) and finalize_model_grads divides them by the token count all-reduced over the ranks
  zero_shard_group  under ZeRO 1, g: the partial distributed optimizer (`num_distributed_optimizer_instances` dp / g:
                 optimizer state sharded over g consecutive ranks, gradients reduce-scattered within an instance and
                 all-reduced across instances)
  sum_collectives  false: `average_in_collective` (AVG collectives instead of megatron's 1/dp pre-scaling and sums)
  overlap_param_gather  under ZeRO 1: the updated parameters' all-gather left to the next forward's pre-hooks; the
                 final parameters read after megatron's forced sync (`disable_forward_pre_hook`), as its training loop
                 does before it saves or evaluates

Gradients are averaged in megatron's way (each bucket scaled by 1/dp before a sum; per-token: see above). Micro-batches run under the
DDP's `no_sync`, `finalize_model_grads` (`finish_grad_sync` and what follows it) after the last, as megatron's
training loop does. bf16 and f16 training keep fp32 main parameters (megatron's mixed-precision optimizer): the
reference rounds the parameters to the case dtype after every step, which differs by the order of one rounding per
step. f16 with the case's `loss_scale` runs megatron's DynamicGradScaler from that scale (the fp32 loss times the
scale before backward, the gradients unscaled and checked for overflow in megatron's step over its model- and
data-parallel groups, a step with a non-finite gradient skipped and the scale halved: the skipped steps are
reported); f16 without one a constant scale of 1 (megatron still skips an overflowing step). Clipping is the optimizer's (`clip_grad`, its own global norm); learning rate and weight decay are set
by megatron's parameter scheduler, constant, as its training loop runs it; weight decay follows the case: megatron's
default leaves biases and other vectors undecayed (the case's `no_decay_vectors`), an empty override table decays
every parameter.

Step-0 gradients are megatron's reduced gradients (`main_grad`; under the distributed optimizer each rank's reduced
slice of the buffer, all-gathered for the report); final parameters are the model's. `resume_after` saves megatron's
checkpoint (megatron_checkpoint: by default its distributed checkpoint, `--ckpt-format torch_dist`; with
`train.checkpoint_layout` gathered its legacy one, `--ckpt-format torch`, the distributed optimizer's parameter state
gathered to data-parallel rank 0) and loads it into a fresh model, DDP, optimizer and scheduler in megatron's order.

megatron-core asks for CUDA in its optimizers and buffers (`device='cuda'`, `param.type() ==
'torch.cuda.FloatTensor'`, `torch.cuda.current_stream()`): megatron_common points those at the CPU.
"""

from .base import (chunk_range, dtype_name, loss_denominator, parallel, reduce_dtype_name, reduction_feature,
                   resume_feature)
from .megatron_common import (MegatronTarget, counted_tokens, cuda_on_cpu, data_parallel_features, ddp_settings,
                              loss_scale_of, megatron_step, megatron_training, model_parallel, optimizer_instances,
                              optimizer_settings, patch_cuda, per_token_loss, reduced_grads, RESUMES_INTO,
                              resumed_training, scales_loss,
                              sync_parameters, transformer_config, unsupported_training, weight_decay_overrides)
from .megatron_checkpoint import load_checkpoint, save_checkpoint, unsupported_resumed_layout
from .torch_common import shared_tempdir
from .torch_model import build, unsupported_layout
from .torch_training import combine_dp, single_device, train


class MegatronDdp(MegatronTarget):
    name = "megatron-ddp"
    freezes = True
    resumes_into = RESUMES_INTO
    smooths_labels = True

    def unsupported(self, case):
        why = unsupported_layout(case, ("dp",), "megatron-ddp runs data parallelism only (no tp/pp/cp/ep)",
                                 loss_scaling=True, fp32_optimizer_state=True)
        if why:
            return why
        if case["model"].get("sparse_embedding"):
            return "megatron's gradient buffers are dense: no sparse embedding gradient"
        return unsupported_training(case) or unsupported_resumed_layout(case)

    def init_rank(self, rank, world, timeout_s):
        super().init_rank(rank, world, timeout_s)
        patch_cuda()

    def run_rank(self, rank, world, case, inputs):
        model_parallel(1, instances=optimizer_instances(case))
        with cuda_on_cpu():
            out = train_dp(case, inputs, lambda: build(case, inputs)[0], rank, world, ddp_settings(case),
                           optimizer_settings(case), weight_decay_overrides(case), resumed_training(case))
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        p = parallel(case)
        prefix = f"megatron:dp{len(outs)}:{'distributed-optimizer' if p['zero_stage'] else 'ddp'}"
        features = [prefix, reduction_feature(prefix, case)]
        if reduce_dtype_name(case) != dtype_name(case):
            features.append(f"{prefix}:{dtype_name(case)}-reduced-in-{reduce_dtype_name(case)}")
        if per_token_loss(case):
            features.append(f"{prefix}:per-token-loss")
        return combine_dp(case, outs, features + data_parallel_features(prefix, case) + resume_feature(prefix, case))


def train_dp(case, inputs, fresh_model, rank, world, ddp_kwargs, optimizer_kwargs, overrides, resumed=None):
    """The case's training of `fresh_model()` (a new model at the case's initial parameters: the one trained, and the
    one a resumed run loads its checkpoint into) on this data-parallel rank, as megatron's loop runs it: megatron's DDP and
    optimizer from their configs' arguments (megatron_common.megatron_training), no_sync on every micro-batch but the last,
    finalize_model_grads after it, the scheduler stepped with the optimizer; with `overlap_param_gather` megatron's
    forced parameter sync before the final parameters are read. Step-0 gradients from megatron's buffers
    (reduced_grads). `resumed`: where the run resumes into another layout (`train.resume_parallel`), (relayout(), its
    ddp_kwargs, optimizer_kwargs): relayout() switches megatron's parallel state to it before the fresh objects are
    built."""
    import torch
    from megatron.core.distributed import finalize_model_grads

    per_token = per_token_loss(case)
    model = fresh_model()
    config = transformer_config(next(model.parameters()).dtype, per_token_loss=per_token)
    ddp, opt, schedule = megatron_training(case, model, config, ddp_kwargs, optimizer_kwargs, overrides)
    # (what the hooks below reach, replaced when the run resumes)
    now = {"ddp": ddp, "opt": opt, "schedule": schedule, "settings": ddp_kwargs}
    named = list(model.named_parameters())

    def resume(_opt):
        # megatron's checkpoint, saved and loaded into a fresh model, DDP, optimizer and scheduler (in the resumed
        # layout where the case has one).
        with shared_tempdir() as path:
            save_checkpoint(case, path, [now["ddp"]], now["opt"], now["schedule"], now["settings"])
            settings, opt_settings = ddp_kwargs, optimizer_kwargs
            if resumed is not None:
                relayout, settings, opt_settings = resumed
                relayout()
            fresh = fresh_model()
            now["ddp"], now["opt"], now["schedule"] = megatron_training(case, fresh, config, settings, opt_settings,
                                                                        overrides)
            now["settings"] = settings
            load_checkpoint(case, path, [now["ddp"]], now["opt"], now["schedule"], settings)
        return list(fresh.named_parameters()), None

    ga = case["train"].get("grad_accumulation", 1)
    state = {"micro": 0, "grads": None}
    # Per-token: each rank's summed loss unscaled, and its count of loss tokens for megatron to all-reduce.
    tokens = counted_tokens(case, inputs, *chunk_range(case["model"]["batch"], world, rank)) if per_token else None

    def backward(loss):
        if state["micro"] % ga == 0:
            now["ddp"].zero_grad_buffer()
            now["opt"].zero_grad()
        loss.backward()
        state["micro"] += 1
        if state["micro"] % ga == 0:
            # megatron's own step: finish_grad_sync and what follows it (per-token: the division by all tokens)
            finalize_model_grads([now["ddp"]], None if tokens is None else torch.tensor(tokens, dtype=torch.int))

    def grad(name, _p):
        if state["grads"] is None:
            # (megatron's buffers hold the gradients of the scaled loss: its optimizer unscales them in its step)
            scale = loss_scale_of(now["opt"])
            state["grads"] = {n: g / scale for n, g in
                              reduced_grads(now["ddp"], now["settings"]["use_distributed_optimizer"]).items()}
        return state["grads"][name]

    scaled = scales_loss(case)
    share = world / loss_denominator(inputs)

    def loss_seed(loss):
        # What backward starts from, as megatron's training loop makes it: per-token the summed loss, otherwise its
        # share (dp / global tokens); where megatron holds a loss scaler, in fp32 times the optimizer's loss scale.
        if scaled:
            loss = loss.float()
        seed = loss if per_token else loss * share
        return now["opt"].scale_loss(seed) if scaled else seed

    return train(case, inputs, ddp, [p for _, p in named], rank, world, backward=backward,
                 step=lambda: megatron_step(now["opt"], now["schedule"], case), clip=lambda: None,
                 no_sync=lambda: now["ddp"].no_sync(), named=named, grad=grad, forward=lambda ids: now["ddp"](ids),
                 loss_seed=loss_seed, finish=lambda: sync_parameters([now["ddp"]], now["settings"]), resume=resume)


TARGET = MegatronDdp()
