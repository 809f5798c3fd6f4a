"""colossalai-zero: the case's model trained through Colossal-AI's Booster with LowLevelZeroPlugin (ZeRO stage 1
or 2 from the case, optimizer states on the host with `zero_offload`) over the data-parallel ranks.

The plugin owns the model's precision (`fp32` / `bf16` / `fp16` from the case dtype, fp32 master weights unless the
case's `master_dtype` is the compute dtype itself: `master_weights=False`, each partition stepped in place), the
gradient reduction (bucketed, averaged over the ranks; the case's `reduce_bucket` and `overlap_comm`; the updated
parameters gathered after the step asynchronously with `overlap_param_gather` (`overlap_allgather`); with `zero_shard_group` g, `extra_dp_size=dp/g`: the ranks as a (dp / g, g)
mesh, every collective run in two stages, across the groups and within one), clipping (`max_norm`: the global norm over the
partitions) and the optimizer step (the case's torch optimizer, wrapped in LowLevelZeroOptimizer). Micro-batches
are accumulated by the ZeRO optimizer itself (every backward reduces into its gradient partitions; one step).
fp16 runs with the case's dynamic loss scale (halved on each overflow, the step skipped; never grown, as the
reference's scaler), or without one with a loss scale of 1 that stays 1 (initial_scale=1, min_scale=1); its
overflow check still skips a step whose gradients are not finite, which a plain run applies: the skip is
reported, and the oracle compares nothing after a skipped step that overflows on one device in the case dtype too.

Step-0 gradients are the optimizer's reduced gradients before the step (`get_param_grad`, gathered from the
partitions); final parameters are the working parameters after the last step (the fp32 masters rounded to the
case dtype). As for DeepSpeed, the reference rounds parameters to the case dtype after every step while the
plugin keeps fp32 masters: a difference of the order of one rounding per step.
"""

from .base import (checkpoint_layout, dtype_name, master_dtype_name, overlap_comm, overlap_param_gather,
                   param_gather_feature, parallel, reduce_bucket, reduce_dtype_name, reduction_feature, resume_feature,
                   resumed_case)
from . import colossalai_release
from .colossalai_common import ColossalTarget, booster_resume, loss_scaling, plugin_step, unscaled, unsupported_loss_scale
from .torch_model import build, make_optimizer, to_case_layout, unsupported_layout
from .torch_training import combine_dp, single_device, train

PRECISION = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}


class ColossalZero(ColossalTarget):
    name = "colossalai-zero"
    freezes = True
    checkpoint_layouts = ("sharded", "gathered")  # (the booster's sharded checkpoints, or shard=False)
    smooths_labels = True
    # (A run resumes into another plugin: the booster's checkpoints hold whole tensors, the optimizer's states
    # gathered from their partitions, which another stage, bucket or group split loads.)
    resumes_into = ("zero_stage", "zero_offload", "reduce_bucket", "overlap_comm", "overlap_param_gather",
                    "zero_shard_group")

    def __init__(self):
        super().__init__()
        import colossalai.booster.plugin.low_level_zero_plugin  # noqa: F401

    def unsupported(self, case):
        why = unsupported_layout(case, ("dp",), "colossalai-zero runs ZeRO data parallelism only (no tp/pp/cp/ep)",
                                 offload=True, loss_scaling=True, moe="torch")
        if why:
            return why
        p, dt = parallel(case), dtype_name(case)
        why = unsupported_loss_scale(case, dt)
        if why:
            return why
        if p["zero_stage"] not in (1, 2):
            # LowLevelZeroPlugin asserts `stage in (1, 2)`; stage 3 is Gemini's, which needs CUDA.
            return f"LowLevelZeroPlugin runs ZeRO stages 1 and 2, not {p['zero_stage']} (stage 3 is Gemini: CUDA only)"
        if dt not in PRECISION:
            # Its master weights and gradient partitions are fp32.
            return "LowLevelZeroPlugin keeps fp32 master weights: f64 training is not expressed"
        if master_dtype_name(case) not in (dt, "f32"):
            return f"LowLevelZeroPlugin keeps fp32 master weights or none, not {master_dtype_name(case)} ones"
        rd = reduce_dtype_name(case)
        if rd not in (dt, "f32"):
            return f"gradient reduction in {rd} for {dt} parameters is not expressed by LowLevelZeroPlugin"
        return colossalai_release.unsupported_options("LowLevelZeroPlugin", self.plugin_options(case))

    def plugin(self, case):
        from colossalai.booster.plugin import LowLevelZeroPlugin

        return LowLevelZeroPlugin(**colossalai_release.options("LowLevelZeroPlugin", self.plugin_options(case)))

    def plugin_options(self, case):
        """LowLevelZeroPlugin's keyword arguments for the case (options of newer releases included)."""
        import torch

        p, t, dt = parallel(case), case["train"], dtype_name(case)
        clip = t.get("clip_grad_norm")
        communication = torch.float32 if (reduce_dtype_name(case) == "f32" and dt != "f32") else None
        # Buckets of 2^20 elements (a whole case model) and no overlap unless the case asks for others: the
        # plugin multiplies its bucket size by 2^20 without rounding, so any element count can be given.
        return dict(stage=p["zero_stage"], precision=PRECISION[dt], **loss_scaling(case),
                    max_norm=float(clip) if clip is not None else 0.0, cpu_offload=p["zero_offload"],
                    communication_dtype=communication, overlap_communication=overlap_comm(case, False),
                    reduce_bucket_size_in_m=reduce_bucket(case, 2**20) / 2**20,
                    master_weights=master_weights(case), extra_dp_size=extra_dp_size(case),
                    overlap_allgather=overlap_param_gather(case, False))

    def run_rank(self, rank, world, case, inputs):
        import torch
        from colossalai.booster import Booster

        def fresh():
            model, _ = build(case, inputs)
            return model, make_optimizer(case, list(model.parameters()))

        model, opt = fresh()
        names = [n for n, _ in model.named_parameters()]
        booster = Booster(plugin=self.plugin(case))
        boosted, zero_opt, *_ = booster.boost(model, opt)
        # What the hooks below reach: the booster, its boosted model and optimizer, replaced when the run resumes
        # (by a booster of the resumed layout's plugin where the case resumes into another: `train.resume_parallel`).
        now = {"booster": booster, "boosted": boosted, "opt": zero_opt}

        def trained():
            now["params"] = dict(now["boosted"].unwrap().named_parameters())
            return [(n, now["params"][n]) for n in names]

        def resume(_opt):
            resumed = resumed_case(case)
            into = now["booster"] if resumed is case else Booster(plugin=self.plugin(resumed))
            now["boosted"], now["opt"] = booster_resume(now["booster"], now["boosted"], now["opt"], fresh,
                                                        checkpoint_layout(case) == "gathered", into=into)
            now["booster"] = into
            return trained(), None

        def view(name, t):
            # With overlap_allgather the updated parameters arrive asynchronously, each waited for by the next
            # forward's op hook; reported ones (after the last step) are read after the wait Colossal-AI's own
            # checkpointing does first. Nothing is pending when step 0's gradients are read.
            now["boosted"]._force_wait_all_gather()
            shape = now["params"][name].shape
            return to_case_layout(name, t.detach().to(torch.float64, copy=True).reshape(shape)).numpy()

        named = trained()
        out = train(case, inputs, boosted, [p for _, p in named], rank, world, forward=lambda ids: now["boosted"](ids),
                    backward=lambda loss: now["booster"].backward(loss, now["opt"]), step=lambda: plugin_step(now["opt"]),
                    clip=lambda: None, named=named, view=view, resume=resume,
                    grad=lambda name, p: unscaled(now["opt"], now["opt"].get_param_grad(p)))
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        p = parallel(case)
        offload = ":offload" if p["zero_offload"] else ""
        stage = f"colossalai:dp{len(outs)}:zero{p['zero_stage']}{offload}"
        layout = [] if case["train"].get("master_dtype") is None else [
            f"{stage}:{'master-weights' if master_weights(case) else 'no-master-weights'}"]
        layout += param_gather_feature(stage, case)
        if p["zero_shard_group"] is not None:
            extra = extra_dp_size(case)
            layout.append(f"{stage}:extra-dp-{'none' if extra == 1 else 'all' if extra == len(outs) else 'some'}")
        layout += resume_feature(stage, case)
        return combine_dp(case, outs, [stage, reduction_feature(stage, case), *layout])


def extra_dp_size(case):
    """LowLevelZeroPlugin's `extra_dp_size` for the case's `zero_shard_group` g: the ranks as a (dp / g, g) mesh, the
    optimizer's process group the pair (across the groups, within one); 1 (one flat group) where the case sets none."""
    p = parallel(case)
    return 1 if p["zero_shard_group"] is None else p["dp"] // p["zero_shard_group"]


def master_weights(case):
    """Whether the plugin keeps fp32 master weights: unless the case keeps parameters in the compute dtype itself
    (`master_dtype` equal to `dtype`; absent: the plugin's own choice, masters)."""
    return case["train"].get("master_dtype") != dtype_name(case)


TARGET = ColossalZero()
