"""deepspeed-pp: the case's model as a DeepSpeed `PipelineModule` (the embedding, each block, the final norm and the
LM head one layer each, partitioned `type:Block` so every stage holds blocks, the embedding on the first and the head
on the last), trained by DeepSpeed's pipeline engine (`engine.train_batch`) over pp x dp ranks (DeepSpeed's
PipeDataParallelTopology: data-parallel ranks fastest): its 1F1B `TrainSchedule`, or with the case's `dual_pipe` its
`DualPipeVModule` / `DualPipeVEngine` (two stages per pipeline rank in a V, rank 0 both first and loss stage).

A tied LM head is DeepSpeed's `TiedLayerSpec`: one embedding module built on the first and the last stage (on one
rank under DualPipeV), its gradient summed over the stages that hold it (`_exec_reduce_tied_grads`). ZeRO stage 0 or
1 (DeepSpeed refuses 2 and 3 beside a pipeline); bf16 runs DeepSpeed's BF16_Optimizer where DeepSpeed picks it
(ZeRO 0, or ZeRO 1 with fp32 gradient accumulation) and its ZeRO-1 optimizer otherwise. Activation checkpointing is
the pipeline's own (`pipeline.activation_checkpoint_interval` 1 over the blocks, `use_reentrant` as the case says,
DeepSpeed's checkpoint configured as the case's `framework_checkpoint` asks).

One optimizer step is one `train_batch` over the rank's rows cut into micro-batch x grad_accumulation equal
micro-batches (DeepSpeed's `gradient_accumulation_steps`). The engine divides each micro-batch's loss by that count
and averages gradients and the reported loss over the data-parallel ranks, so the loss function returns the
micro-batch's summed token loss (in float32, as Megatron-DeepSpeed computes it) scaled by count x dp / global tokens:
the engine's own reported loss is then the global token mean. Step-0 gradients are read when the schedule reaches its
optimizer step (after its tied and data-parallel reductions, before clipping) with `safe_get_full_grad`; final
parameters are DeepSpeed's fp32 master copies rounded to the case dtype, as deepspeed-zero reports them."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np  # noqa: E402

from .base import (chunk_range, dtype_name, is_frozen, loss_denominator, parallel, reduce_dtype_name,  # noqa: E402
                   resume_after, resume_feature, resumed_case, setup_features)
from .deepspeed_zero import DeepSpeedZero, configure_deepspeed_checkpointing, unsupported_data_types  # noqa: E402
from .torch_common import shared_tempdir, torch_dtype  # noqa: E402
from . import deepspeed_checkpoint  # noqa: E402
from .torch_model import build, make_optimizer, model_defaults, to_case_layout, unsupported_layout  # noqa: E402
from .torch_pp import combine_stages  # noqa: E402
from .torch_training import micro_batch_loss, single_device  # noqa: E402


class DeepSpeedPp(DeepSpeedZero):
    name = "deepspeed-pp"
    freezes = True
    smooths_labels = True
    # (DeepSpeedZero's checkpoint layouts, written by deepspeed_checkpoint too.) A run resumes over another number of
    # stages and data-parallel ranks (`train.resume_parallel`): the pipeline's layer files name each layer by its
    # global index, DeepSpeed's universal checkpoint each parameter (PipelineRun builds the resumed layout's engine).
    resumes_into = ("dp", "pp")

    def __init__(self):
        super().__init__()
        import importlib.util

        self.has_dual_pipe = importlib.util.find_spec("deepspeed.runtime.pipe.dualpipev") is not None

    def init_rank(self, rank, world, timeout_s):
        # PipelineModule reads the launcher's LOCAL_RANK (one host here).
        os.environ["LOCAL_RANK"] = str(rank)
        super().init_rank(rank, world, timeout_s)
        reuse_process_groups()

    def unsupported(self, case):
        why = (unsupported_layout(case, ("pp", "dp"), "deepspeed-pp runs pipeline stages beside data parallelism "
                                  "(no tp/cp/ep)") or unsupported_schedule(case))
        if why:
            return why
        why = deepspeed_checkpoint.unsupported_checkpoint(case) or unsupported_stage_change(case)
        if why:
            return why
        p, m = parallel(case), model_defaults(case)
        if dual_pipe(p) and not self.has_dual_pipe:
            return "this DeepSpeed has no DualPipeV (deepspeed.runtime.pipe.dualpipev)"
        if dtype_name(case) != "f32" and older_than_0_19():
            # Measured on 0.17.6: every gradient read 2^16 times the reference's, the parameters right.
            return ("deepspeed-pp reads a 16-bit pipeline's gradients as DeepSpeed 0.19 keeps them; older releases keep "
                    "them loss-scaled at the optimizer step (16-bit cases are not expressed there)")
        if p["zero_stage"] > 1:
            return "DeepSpeed's pipeline engine runs ZeRO 0-1 (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\")"
        if m.get("layer_passes", 1) > 1:
            return "a block used by several passes cannot sit on one pipeline stage"
        if m.get("sparse_embedding"):
            return "deepspeed-pp reduces dense gradients only"
        if m.get("activation_checkpointing") == "reentrant" and is_frozen(case, "embed.weight"):
            # torch's documented limit of a re-entrant checkpoint ("None of the inputs have requires_grad=True"):
            # the first block's input comes from a frozen embedding and its parameters would get no gradient.
            return "a re-entrant checkpoint after a frozen embedding gives the first block no gradient"
        stages = p["pp"] * (2 if dual_pipe(p) else 1)
        if len(m["layers"]) < stages:
            return f"{stages} pipeline stages need a block each ({len(m['layers'])} blocks)"
        gas = micro_batch_count(case)
        rows = [hi - lo for lo, hi in (chunk_range(m["batch"], p["dp"], i) for i in range(p["dp"]))]
        if any(r < gas for r in rows):
            return "a data-parallel rank has fewer rows than micro-batches x grad_accumulation"
        if dual_pipe(p) and any(r % gas for r in rows):
            # DualPipeV exchanges activation shapes once ("does not support dynamic_shape").
            return "DualPipeV takes equal micro-batches: a rank's rows must split into micro-batches x grad_accumulation"
        if (rank := untrainable_rank(case)) is not None:
            # (DeepSpeed's pipeline engine wants an optimizer on every rank; torch's refuses an empty parameter list.)
            return f"pipeline rank {rank} holds only frozen parameters: it has nothing for its optimizer"
        if why := unsupported_data_types(case):
            return why
        if reduce_dtype_name(case) != dtype_name(case):
            return "deepspeed-pp reduces gradients in the case dtype"
        return None

    def config(self, case, world):
        p = parallel(case)
        cfg = super().config(case, world)
        gas = micro_batch_count(case)
        cfg.update(gradient_accumulation_steps=gas)
        recompute = case["model"].get("activation_checkpointing")
        cfg["pipeline"] = {"activation_checkpoint_interval": 1 if recompute else 0,
                           "use_reentrant": recompute != "non_reentrant"}
        cfg["zero_optimization"] = {"stage": p["zero_stage"], "reduce_bucket_size": cfg["zero_optimization"]["reduce_bucket_size"],
                                    "allgather_bucket_size": cfg["zero_optimization"]["allgather_bucket_size"]}
        return cfg

    def run_rank(self, rank, world, case, inputs):
        import torch

        torch.manual_seed(0)
        out = PipelineRun(self, case, inputs, world).train()
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def combine(self, case, outs):
        return combine_stages(case, outs, features(case))


def unsupported_stage_change(case):
    """Why the run cannot resume over its resumed layout's pipeline stages (None: it can, or keeps them): DeepSpeed's
    own checkpoint keeps each stage's optimizer state in files per stage; another number of stages reads them through
    the universal checkpoint, which stores each parameter's (measured on 0.19.8, pp 2 x dp 2 into pp 4 from its own
    checkpoint: ZeRO 1 refuses, "Automatic adjustment of ZeRO's optimizer state partitioning with a new world size is
    not currently supported"; without ZeRO torch's load_state_dict, "loaded state dict contains a parameter group that
    doesn't match the size of optimizer's group")."""
    if (resume_after(case) is None or deepspeed_checkpoint.universal(case)
            or parallel(resumed_case(case))["pp"] == parallel(case)["pp"]):
        return None
    return ("DeepSpeed's own pipeline checkpoint keeps each stage's optimizer state: another number of stages needs "
            "the universal checkpoint (train.checkpoint_layout universal)")


def dual_pipe(p):
    return bool(p["dual_pipe"])


def micro_batch_count(case):
    """Micro-batches per optimizer step (DeepSpeed's gradient_accumulation_steps): the case's pipeline micro-batches
    times its accumulated steps, one train_batch."""
    return parallel(case)["microbatches"] * case["train"].get("grad_accumulation", 1)


def uneven_micro_batches(case, dp):
    """Whether some rank's rows split into micro-batches of different sizes: the PipelineModule then asks for
    `dynamic_shape` (the engine sends each micro-batch's shapes ahead of it)."""
    gas, batch = micro_batch_count(case), case["model"]["batch"]
    return any((hi - lo) % gas for lo, hi in (chunk_range(batch, dp, i) for i in range(dp)))


def unsupported_schedule(case):
    p = parallel(case)
    if p["pp"] < 2:
        return "deepspeed-pp runs pipeline-parallel cases (pp >= 2)"
    if p["pipeline_schedule"] != "1f1b":
        return "DeepSpeed's pipeline engine runs its 1F1B TrainSchedule (and DualPipeV): no GPipe or interleaved schedule"
    if p["zero_bubble"]:
        return "DeepSpeed's DualPipeV keeps weight gradients inside the backward: no zero-bubble schedule"
    if dual_pipe(p) and micro_batch_count(case) < 2 * p["pp"]:
        return f"DualPipeV needs at least 2 x {p['pp']} micro-batches"
    return None


def stage_parts(case):
    """The first layer index of each stage and the end, as PipelineModule's `type:Block` partition cuts the layers
    [embedding, blocks..., final norm, head] (two stages per pipeline rank under DualPipeV)."""
    from deepspeed.runtime.utils import partition_balanced

    p, n = parallel(case), len(case["model"]["layers"])
    stages = p["pp"] * (2 if dual_pipe(p) else 1)
    return partition_balanced(weights=[0] + [1] * n + [0, 0], num_parts=stages)


def untrainable_rank(case):
    """A pipeline rank all of whose parameters the case freezes (None: every rank trains something)."""
    import torch

    from .torch_model import Model

    with torch.device("meta"):
        names = [n for n, _ in Model(model_defaults(case)).named_parameters()]
    p, parts = parallel(case), stage_parts(case)
    n = len(case["model"]["layers"])
    prefixes = ["embed", *(f"layers.{i}" for i in range(n)), "final_norm", "embed" if model_defaults(case).get(
        "tied_embeddings") else "lm_head"]
    stages = len(parts) - 1
    for rank in range(p["pp"]):
        held = [rank, stages - 1 - rank] if dual_pipe(p) else [rank]
        layers = {prefixes[i] for s in held for i in range(parts[s], parts[s + 1])}
        if not any(name.startswith(pre + ".") and not is_frozen(case, name) for name in names for pre in layers):
            return rank
    return None


#: The process groups made so far, by (position among the calls of a case, ranks, options), and the calls of the case
#: being built.
_GROUPS, _CALLS = {}, [0]


def reuse_process_groups():
    """Every PipelineModule asks torch for its grid's process groups again (a world group and one per pipeline, per
    data-parallel replica, per slice): in a rank pool that runs case after case, the n-th call of a case gets the group
    the n-th call of an earlier case made for the same ranks. Groups of equal ranks stay distinct (the pipeline groups
    and the model-parallel ones coincide without tensor parallelism): collectives in one must never pair with another's.
    Every rank makes the same calls in the same order, as new_group requires."""
    import torch.distributed as dist

    original = dist.new_group

    def new_group(ranks=None, *args, **kwargs):
        key = (_CALLS[0], tuple(ranks) if ranks is not None else None, args, tuple(sorted(kwargs.items(), key=str)))
        _CALLS[0] += 1
        if key not in _GROUPS:
            _GROUPS[key] = original(ranks, *args, **kwargs)
        return _GROUPS[key]

    dist.new_group = new_group


def configure_checkpointing(case):
    """DeepSpeed's activation-checkpointing settings for this case, as its `framework_checkpoint` asks (set by every
    case, so none leaks into the next). Contiguous buffers hold every checkpoint taken between two backwards: a stage
    may run several micro-batches' forwards first, so they are sized for every block of every micro-batch."""
    configure_deepspeed_checkpointing(case["parallel"].get("framework_checkpoint"),
                                      len(case["model"]["layers"]) * micro_batch_count(case))


def pipeline_layers(case, inputs):
    """The layers of the PipelineModule and the case name of each layer index's parameters (None: a tied layer)."""
    import torch.nn as nn
    from deepspeed.pipe import TiedLayerSpec

    model, dt = build(case, inputs)
    n = len(model.layers)
    prefixes = ["embed", *(f"layers.{i}" for i in range(n)), "final_norm", "lm_head"]
    if not model.tied:
        return [model.embed, *model.layers, model.final_norm, model.lm_head], prefixes
    weight, trained = model.embed.weight.detach().clone(), model.embed.weight.requires_grad

    class TiedEmbedding(nn.Embedding):
        """The case's embedding, built by DeepSpeed wherever the tied layer sits."""

        def __init__(self):
            super().__init__(weight.shape[0], weight.shape[1], dtype=dt)
            self.weight.data.copy_(weight)
            self.weight.requires_grad_(trained)

    head = TiedLayerSpec("embed", TiedEmbedding, forward_fn=lambda module, x: x @ module.weight.t(),
                         tied_weight_attr="weight")
    return [TiedLayerSpec("embed", TiedEmbedding), *model.layers, model.final_norm, head], prefixes[:-1]


def case_name(ds_name, prefixes):
    """The case's name of the PipelineModule parameter `ds_name` ("3.mlp.up.weight", "tied_modules.embed.weight")."""
    head, _, rest = ds_name.partition(".")
    if head == "tied_modules":
        return "embed." + rest.partition(".")[2]
    return f"{prefixes[int(head)]}.{rest}"


class PipelineRun:
    """This rank's part of the case's pipeline: the engine, and what it reports of the run."""

    def __init__(self, target, case, inputs, world):
        self.case, self.inputs = case, inputs
        self.target, self.world = target, world
        self.global_tokens = loss_denominator(inputs)
        self.logits, self.grads, self.no_grad = [], None, []
        self.build()

    def build(self, resumed=False):
        """A fresh PipelineModule and engine over the case's initial parameters (`self.named`, `self.engine`) in the
        case's layout (`self.p`, `self.dp`); `resumed`: the engine that loads the case's checkpoint, in the layout the
        run resumes into (a universal checkpoint needs its config to say so)."""
        import deepspeed
        from deepspeed.pipe import PipelineModule

        layout = resumed_case(self.case) if resumed else self.case
        self.p = parallel(layout)
        self.dp = self.world // self.p["pp"]
        configure_checkpointing(self.case)
        _CALLS[0] = 0
        layers, self.prefixes = pipeline_layers(self.case, self.inputs)
        if dual_pipe(self.p):
            from deepspeed.runtime.pipe.dualpipev import DualPipeVModule as cls
        else:
            cls = PipelineModule
        module = cls(layers=layers, num_stages=self.p["pp"], loss_fn=self.loss_fn, partition_method="type:Block",
                     checkpointable_layers=["Block"], dynamic_shape=uneven_micro_batches(layout, self.dp))
        self.named = [(case_name(n, self.prefixes), q) for n, q in module.named_parameters()]
        opt = make_optimizer(self.case, [q for _, q in self.named])
        lo, hi = chunk_range(self.case["model"]["batch"], self.dp, module._grid.get_data_parallel_id())
        self.rows = (lo, hi)
        cfg = self.target.config(layout, self.world)
        if resumed:
            cfg = deepspeed_checkpoint.load_config(cfg, self.case)
        cfg["train_micro_batch_size_per_gpu"] = max(1, (hi - lo) // cfg["gradient_accumulation_steps"])
        cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * self.dp
        self.engine = deepspeed.initialize(model=module, optimizer=opt, config=cfg)[0]
        self.capture_step_grads()

    def resume(self):
        """DeepSpeed's own checkpoint of the run (each stage's layer files, the optimizer's states or ZeRO-1
        partitions), or the universal checkpoint converted from it, loaded into a fresh module and engine, which run
        the remaining steps."""
        with shared_tempdir() as path:
            tag = deepspeed_checkpoint.save(self.engine, path, self.case)
            old = self.engine
            self.build(resumed=True)
            self.engine.load_checkpoint(path, tag=tag)
            old.destroy()

    def loss_fn(self, logits, target):
        """The micro-batch's summed token loss scaled so that the engine's mean over micro-batches and data-parallel
        ranks is the global token mean (and its gradients the global mean's)."""
        l, count = micro_batch_loss(self.case, self.inputs, logits, target)
        if self.grads is None:
            self.logits.append(logits.detach())
        factor = count * self.dp * micro_batch_count(self.case) / self.global_tokens
        return l.float() * factor

    def capture_step_grads(self):
        """Reads the first step's gradients where the schedule's optimizer step begins (the engine maps schedule
        instructions to methods through `_INSTRUCTION_MAP`: this engine's copy wraps the step)."""
        from deepspeed.runtime.pipe import schedule
        from deepspeed.utils import safe_get_full_grad

        instructions = dict(type(self.engine)._INSTRUCTION_MAP)
        step = instructions[schedule.OptimizerStep]

        def read_then_step(engine, *args, **kwargs):
            if self.grads is None:
                self.grads, self.no_grad = {}, []
                for name, q in self.named:
                    if not q.requires_grad:
                        continue
                    g = safe_get_full_grad(q)
                    if g is None:
                        self.no_grad.append(name)
                    else:
                        self.grads[name] = self.view(name, g)
            return step(engine, *args, **kwargs)

        instructions[schedule.OptimizerStep] = read_then_step
        self.engine._INSTRUCTION_MAP = instructions

    def view(self, name, t):
        import torch

        return to_case_layout(name, t.detach().to(torch_dtype(dtype_name(self.case))).to(torch.float64)).numpy()

    def train(self):
        import torch
        from deepspeed.utils import safe_get_full_fp32_param

        m = self.case["model"]
        b, s = m["batch"], m["seq"]
        ids = torch.tensor(self.inputs["tokens"].astype(np.int64)).view(b, s)
        tgt = torch.tensor(self.inputs["targets"].astype(np.int64)).view(b, s)
        losses = []
        for k in range(self.case["train"]["steps"]):
            if k == resume_after(self.case):
                self.resume()
            if k == 0:
                first = self.rows  # (the logits' rows: the first step's layout)
            lo, hi = self.rows
            bounds = np.linspace(lo, hi, micro_batch_count(self.case) + 1).round().astype(int)
            batches = [(ids[a:b], tgt[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
            losses.append(float(self.engine.train_batch(iter(batches))))
        loss_stage = bool(self.logits)  # (the first step's loss stage: a run may resume over other stages)
        final = {}
        for name, q in self.named:
            v = safe_get_full_fp32_param(q)
            final[name] = self.view(name, q if v is None else v)
        self.engine.destroy()
        logits = torch.cat([x.reshape(-1, x.shape[-1]) for x in self.logits]).to(torch.float64).numpy() if loss_stage else None
        # (Every rank's train_batch returns the step's loss: the first step's loss stage reports them, by step.)
        return {"rows": (first[0] * s, first[1] * s), "logits": logits, "losses": list(enumerate(losses)) if loss_stage else [],
                "grads": self.grads or {}, "params": final, "no_grad": self.no_grad}


def older_than_0_19():
    import deepspeed

    return tuple(int(x) for x in deepspeed.__version__.split(".")[:2]) < (0, 19)


def features(case):
    p, m = parallel(case), model_defaults(case)
    prefix = f"deepspeed-pp:pp{p['pp']}"
    out = [prefix, f"{prefix}:{'dual-pipe' if dual_pipe(p) else '1f1b'}", f"{prefix}:mb{min(micro_batch_count(case), 8)}"]
    if p["dp"] > 1:
        out.append(f"{prefix}:dp{p['dp']}:zero{p['zero_stage']}")
    if uneven_micro_batches(case, p["dp"]):
        out.append(f"{prefix}:dynamic-shape")
    out.append(f"{prefix}:{optimizer_path(case)}")
    if m.get("tied_embeddings"):
        out.append(f"{prefix}:tied-embedding")
    if case["train"].get("clip_grad_norm") is not None:
        out.append(f"{prefix}:clipped")
    if p["framework_checkpoint"] is not None and m.get("activation_checkpointing"):
        out.append(f"{prefix}:checkpoint-{p['framework_checkpoint']}")
    return out + setup_features(prefix, case) + resume_feature(prefix, case)


def optimizer_path(case):
    """Which of DeepSpeed's optimizer wrappers the engine picks for the case (engine._do_optimizer_sanity_check)."""
    dt, zero = dtype_name(case), parallel(case)["zero_stage"]
    acc = case["train"].get("grad_accum_dtype") or dt
    if zero == 1:
        return "bf16-optimizer" if dt == "bf16" and acc == "f32" else "zero1-optimizer"
    return "bf16-optimizer" if dt == "bf16" else "fp32"


TARGET = DeepSpeedPp()
