"""torch-pp: the case's model cut into pipeline stages of consecutive blocks (the embedding on the first, the final norm
and LM head on the last), each a `torch.distributed.pipelining.PipelineStage`, run by torch's own schedules:
`ScheduleGPipe`, `Schedule1F1B`, and for the `interleaved` schedule with v virtual stages `ScheduleInterleaved1F1B`
(stage c of pp x v on pipeline rank c mod pp; `ScheduleLoopedBFS` with the case's `breadth_first`), the zero-bubble
`ScheduleInterleavedZeroBubble` and `ScheduleZBVZeroBubble`, and DeepSeek's `ScheduleDualPipeV` (`dual_pipe`), over
the case's micro-batches (the schedule splits each rank's rows itself). Beside data parallelism (a (pp, dp) mesh, dp
fastest) every stage is wrapped as torchtitan wraps it: under ZeRO 0 in DistributedDataParallel over its data-parallel
peers, under ZeRO 1-3 in FSDP2 (`fully_shard` on each block and the stage, resharding after forward at stage 3, mixed
precision as the case's master / reduce dtypes ask); the schedules drive both themselves (no_sync,
`set_requires_gradient_sync`, their final gradient reduction). With tensor parallelism the mesh is torchtitan's 3-D
(pp, dp, tp), tp fastest: torch-tp's plan (`torch_tp.parallelize`, sequence parallelism and `loss_parallel` included)
applied to the model before it is cut into stages, so a stage boundary passes each tensor-parallel rank's local
activations (sequence shards under sequence parallelism) to the same tensor-parallel rank of the next stage; the
schedule steps under `loss_parallel` where the LM head's output stays vocabulary-sharded, as torchtitan's training
context does.

The loss function is the micro-batch's summed token loss (or with `local_mean_loss` its mean) scaled to the global
token mean, times the micro-batch count where the schedule divides the gradients by it (`scale_grads`, torch's default;
with accumulated steps only FSDP2 stages defer that division to the last, so the others take `scale_grads=False`).
Gradient clipping is torchtitan's: the stage's norm (DTensor norms made full), squared, summed over the pipeline ranks.
With `resume_after` every rank saves its stages and optimizer with torch.distributed.checkpoint under the whole model's
parameter names (the stages keep them), and a fresh pipeline loads them, in the layout of `train.resume_parallel` where
the case gives one: other stages, data- or tensor-parallel ranks, or DDP for FSDP2 (torchtitan's resharding resume)."""

import contextlib
import inspect
import math

import numpy as np

from .base import (chunk_range, dtype_name, grad_or_fail, is_frozen, loss_denominator, master_dtype_name, parallel,
                   reduce_dtype_name, resume_after, resume_feature, resumed_case, setup_features, vocab_sharded_loss,
                   zero_offloaded)
from .torch_common import (TorchTarget, check_compiled, compiled, compiling, mesh, shared_tempdir, torch_dtype,
                           uncompiled_name, unsupported_compiled_blocks)
from .torch_model import (build, checkpointed_block, clip_norm_type, foreach_clip, make_optimizer, model_defaults,
                          to_case_layout, unsupported_layout)
from .torch_tp import loss_context, parallelize, replicas_per_rank, unsupported_tensor_parallel
from .torch_training import dense, full, micro_batch_loss, single_device


class TorchPp(TorchTarget):
    name = "torch-pp"
    freezes = True
    rotates = True
    smooths_labels = True
    clip_norms = ("l1", "l2", "inf")
    optimizer_implementations = True
    # A run resumes over other stages, data- and tensor-parallel ranks or another data-parallel wrapper: the stages keep
    # the whole model's parameter names, and torch.distributed.checkpoint reshards by name (torchtitan's recipe).
    resumes_into = ("pp", "dp", "tp", "zero_stage", "sequence_parallel")

    def __init__(self):
        super().__init__()
        import torch
        import torch.distributed.pipelining as pipelining

        if inspect.signature(pipelining.PipelineStage).parameters["input_args"].default is inspect.Parameter.empty:
            # Measured with torch 2.5.1: PipelineStage requires example inputs there (no runtime shape inference), and
            # its stages are sized by them; this target builds stages as later releases let users build them.
            raise RuntimeError(f"torch {torch.__version__}'s PipelineStage needs example inputs (input_args); torch-pp "
                               "builds stages whose shapes the schedule infers at runtime")
        self.deferred_finalize = "finalize_gradients" in inspect.signature(pipelining.ScheduleGPipe.step).parameters

    def unsupported(self, case):
        why = unsupported_layout(case, ("pp", "dp", "tp"),
                                 "torch-pp runs pipeline stages beside data and tensor parallelism", master_weights=True)
        if why:
            return why
        p, m = parallel(case), model_defaults(case)
        if p["tp"] > 1 and (why := unsupported_tensor_parallel(case)):
            return why
        chunks = p["pp"] * virtual_stages(p)
        if p["pp"] < 2:
            return "torch-pp runs pipeline-parallel cases (pp >= 2)"
        if p["zero_bubble"] and p["pipeline_schedule"] == "gpipe":
            return "torch's zero-bubble schedules are 1F1B-like (ZBV) or interleaved, not GPipe"
        if dual_pipe(p) and p["zero_bubble"] is False:
            return "DualPipeV splits every backward (the case's zero_bubble asks for whole ones)"
        if dual_pipe(p) and p["microbatches"] < 2 * p["pp"]:
            # (ScheduleDualPipeV's own check: "requires at least as many microbatches as stages".)
            return f"DualPipeV needs at least as many micro-batches as its {2 * p['pp']} stages"
        if breadth_first(p) and p["zero_bubble"]:
            return "torch has no zero-bubble breadth-first schedule"
        if why := unsupported_compiled_blocks(case, self.name):
            return why
        if m.get("tied_embeddings"):
            return "pipeline stages share no parameter: a tied LM head sits on another stage than the embedding"
        if m.get("layer_passes", 1) > 1:
            return "a block used by several passes cannot sit on one pipeline stage"
        if m.get("activation_checkpointing") == "reentrant":
            # torch.utils.checkpoint's documented limit: "When use_reentrant=True, torch.utils.checkpoint is
            # incompatible with .grad() or passing an `inputs` parameter to .backward()", which the stages use.
            return "a re-entrant checkpoint refuses the input-only gradients pipeline stages take (use_reentrant=False)"
        if m.get("sparse_embedding"):
            return "torch-pp reduces dense gradients only"
        if len(m["layers"]) < chunks:
            return f"{chunks} pipeline stages need a block each ({len(m['layers'])} blocks)"
        rows = [chunk_range(m["batch"], p["dp"], i) for i in range(p["dp"])]
        per_step = p["microbatches"] * case["train"].get("grad_accumulation", 1)
        if min(hi - lo for lo, hi in rows) < per_step:
            return "a data-parallel rank has fewer rows than micro-batches x grad_accumulation"
        sizes = {size for lo, hi in rows for size in step_sizes(lo, hi, case["train"].get("grad_accumulation", 1))}
        if len(sizes) > 1 or sizes.pop() % p["microbatches"]:
            # Measured (torch 2.15): a stage sizes every micro-batch's receive buffer as its first, so a smaller one
            # arrives padded with stale rows (pytorch/pytorch#126600, "we do not support this"; no error is raised).
            return "torch's pipeline stages take micro-batches of one shape: the rows must split evenly"
        if zero_offloaded(case) or any(p[k] is not None for k in ("zero_shard_group", "reshard_group", "param_shard_dim")):
            return "torch-pp wraps stages in plain FSDP2 (no offload, HSDP, partial resharding or shard dims)"
        mixed = master_dtype_name(case) != dtype_name(case) or reduce_dtype_name(case) != dtype_name(case)
        if mixed and (p["dp"] == 1 or p["zero_stage"] == 0):
            return "mixed precision is FSDP2's (torch-pp: ZeRO 1-3 over dp > 1)"
        if case["train"].get("grad_accumulation", 1) > 1 and fsdp_stages(p) and not self.deferred_finalize:
            return "this torch's schedules reduce FSDP2 gradients on every step() (no finalize_gradients)"
        return unsupported_resume(case)

    def run_rank(self, rank, world, case, inputs):
        import torch

        compiling(case)
        out = resumed_training(case, lambda layout: self.pipeline(rank, world, layout, inputs))
        check_compiled(case)
        out["baseline"] = single_device(case, inputs) if rank == 0 else None
        return out

    def pipeline(self, rank, world, case, inputs):
        """This rank's part of the case's pipeline, in the case's layout."""
        p = parallel(case)
        pp, tp = p["pp"], p["tp"]
        dp = world // (pp * tp)
        stage_mesh = mesh((pp, dp, tp), ("pp", "dp", "tp")) if tp > 1 else mesh((pp, dp), ("pp", "dp"))
        return Pipeline(case, inputs, rank // (dp * tp), rank // tp % dp, stage_mesh, self.deferred_finalize)

    def combine(self, case, outs):
        return combine_stages(case, outs, features(case))


def resumed_training(case, pipeline):
    """The case's training on this rank's stages, `pipeline(layout)` building them in a layout. With `resume_after`,
    torchtitan's resume: every rank saves its stages' shards, and a fresh pipeline, in the layout the run resumes into,
    loads them by the whole model's names and runs the steps after it. Pipeline.train's outputs, with every step's
    loss and the final parameters."""
    import torch

    run = pipeline(case)
    torch.manual_seed(0)
    steps, k = case["train"]["steps"], resume_after(case)
    out = run.train(0, steps if k is None else k)
    if k is not None:
        with shared_tempdir() as path:
            run.save(path)
            run = pipeline(resumed_case(case))
            run.load(path)
        later = run.train(k, steps)
        out = {**out, **later, "losses": out["losses"] + later["losses"]}
    out["params"] = run.final_params()
    return out


def state_dict_options():
    """torchtitan's options for pipelined checkpoints: the optimizer's state dict flattened to one entry per parameter
    name (its state and its group's hyperparameters), since every stage's optimizer has its own parameter groups, which
    torch.distributed.checkpoint would otherwise save once, under one key, for all stages."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def unsupported_resume(case):
    """Why torch-pp cannot checkpoint and resume the case's run (`train.resume_after`), or None."""
    if resume_after(case) is None:
        return None
    if case["train"].get("compiled"):
        return "torch-pp resumes eager stages (train.compiled with resume_after is not expressed)"
    for layout in (case, resumed_case(case)):
        p = parallel(layout)
        if p["tp"] > 1 and p["dp"] > 1 and p["zero_stage"] == 0:
            # (torch.distributed.tensor.parallel.ddp: DTensors rebuilt by a forward pre-hook only)
            return ("DDP's tensor-parallel path holds the parameters as local shards between forwards, so their state "
                    "dict is not the DTensors': torch-pp resumes tensor-parallel stages beside dp > 1 in FSDP2 only")
    return None


def virtual_stages(p):
    """Stages per pipeline rank: the interleaved schedule's virtual stages, two for the V-shaped zero-bubble schedule."""
    if p["pipeline_schedule"] == "interleaved":
        return p["virtual_stages"]
    return 2 if v_shaped(p) else 1


def v_shaped(p):
    """Whether the schedule places two stages per rank in a V (rank r holds stages r and 2 pp - 1 - r): ScheduleZBVZeroBubble
    (zero bubble under 1F1B) or ScheduleDualPipeV."""
    return (bool(p["zero_bubble"]) or dual_pipe(p)) and p["pipeline_schedule"] == "1f1b"


def dual_pipe(p):
    """Whether the schedule is ScheduleDualPipeV (the case's dual_pipe, read under 1F1B)."""
    return bool(p["dual_pipe"]) and p["pipeline_schedule"] == "1f1b"


def breadth_first(p):
    """Whether the schedule is ScheduleLoopedBFS (the case's breadth_first, read under the interleaved schedule)."""
    return bool(p["breadth_first"]) and p["pipeline_schedule"] == "interleaved"


def rank_stages(p, pp_index):
    """The stage indices pipeline rank `pp_index` holds, in order."""
    if v_shaped(p):
        return [pp_index, 2 * p["pp"] - 1 - pp_index]
    n = p["pp"] * virtual_stages(p)
    return [c for c in range(n) if c % p["pp"] == pp_index]


def fsdp_stages(p):
    """Whether the stages are FSDP2 modules (ZeRO 1-3 over dp > 1)."""
    return p["dp"] > 1 and p["zero_stage"] > 0


def scales_grads(case):
    """The schedule's `scale_grads`: torch's default (True), except with accumulated steps on stages that are not
    FSDP2 modules, whose gradients every step() would divide again."""
    p = parallel(case)
    return case["train"].get("grad_accumulation", 1) == 1 or fsdp_stages(p)


def step_sizes(lo, hi, ga):
    """The rows of each of a rank's `ga` schedule steps over its rows lo:hi."""
    bounds = np.linspace(lo, hi, ga + 1).round().astype(int)
    return [int(bounds[i + 1] - bounds[i]) for i in range(ga)]


def stage_layers(n_layers, chunks):
    """The blocks of each of `chunks` stages: consecutive, as even as can be (the first stages one more)."""
    return [list(map(int, a)) for a in np.array_split(np.arange(n_layers), chunks)]


def features(case):
    p = parallel(case)
    v = virtual_stages(p)
    prefix = f"torch-pp:pp{p['pp']}"
    schedule = (p["pipeline_schedule"] + (f"-v{v}" if v > 1 else "") + ("-zero-bubble" if p["zero_bubble"] else "")
                + ("-dual-pipe" if dual_pipe(p) else "") + ("-breadth-first" if breadth_first(p) else ""))
    out = [prefix, f"{prefix}:{schedule}",
           f"{prefix}:mb{min(p['microbatches'], 4)}", f"{prefix}:scale-grads-{int(scales_grads(case))}"]
    if p["dp"] > 1:
        out.append(f"{prefix}:dp{p['dp']}:" + (f"fsdp-zero{p['zero_stage']}" if fsdp_stages(p) else "ddp"))
    if p["tp"] > 1:
        loss = "sharded" if vocab_sharded_loss(case, True) else "gathered"
        out.append(f"{prefix}:tp{p['tp']}:sp{int(p['sequence_parallel'])}:loss-{loss}")
    if case["train"].get("grad_accumulation", 1) > 1:
        out.append(f"{prefix}:accumulated-steps")
    if case["train"].get("clip_grad_norm") is not None:
        out.append(f"{prefix}:clipped")
    if master_dtype_name(case) != dtype_name(case):
        out.append(f"{prefix}:{dtype_name(case)}-computed-from-{master_dtype_name(case)}")
    if reduce_dtype_name(case) != dtype_name(case):
        out.append(f"{prefix}:{dtype_name(case)}-reduced-in-{reduce_dtype_name(case)}")
    if case["train"].get("compiled"):
        out.append(f"{prefix}:compiled-blocks")
    return out + resume_feature(prefix, case) + setup_features(prefix, case)


def stage_module_class():
    import torch.nn as nn

    class StageModule(nn.Module):
        """Blocks `ids` of `model` (parameter names as in the whole model), with the embedding on the first stage and
        the final norm and LM head on the last."""

        def __init__(self, model, ids, first, last):
            super().__init__()
            self.recompute = model.recompute
            if first:
                self.embed = model.embed
            self.layers = nn.ModuleDict({str(i): model.layers[i] for i in ids})
            if last:
                self.final_norm, self.lm_head = model.final_norm, model.lm_head
            self.first, self.last = first, last

        def forward(self, x):
            if self.first:
                x = self.embed(x)
            for layer in self.layers.values():
                x = checkpointed_block(layer, x, self.recompute)
            return self.lm_head(self.final_norm(x)) if self.last else x

    return StageModule


class Pipeline:
    """This rank's stages of the case's pipeline and the schedule that runs them."""

    def __init__(self, case, inputs, pp_index, dp_index, stage_mesh, deferred_finalize):
        import torch
        from torch.distributed.pipelining import PipelineStage

        self.case, self.inputs, self.p = case, inputs, parallel(case)
        self.pp, self.dp, self.dp_index = self.p["pp"], stage_mesh.size(1), dp_index
        self.dp_mesh, self.pp_group = stage_mesh["dp"], stage_mesh.get_group("pp")
        self.tp = stage_mesh.size(2) if stage_mesh.ndim == 3 else 1
        self.deferred_finalize = deferred_finalize and fsdp_stages(self.p)
        model, _ = build(case, inputs, dtype=master_dtype_name(case))
        if self.tp > 1:
            # (The whole model's plan, module names as torch_tp.py gives them; the stages below keep those names.)
            parallelize(model, stage_mesh["tp"], case)
        n = self.pp * virtual_stages(self.p)
        layers = stage_layers(len(case["model"]["layers"]), n)
        Stage = stage_module_class()
        self.indices = rank_stages(self.p, pp_index)
        self.modules = [Stage(model, layers[c], c == 0, c == n - 1) for c in self.indices]
        self.first, self.last = 0 in self.indices, n - 1 in self.indices
        for mod in self.modules:
            # (torchtitan's order: tensor parallel, compile each block, then the data-parallel wrapper)
            for key, layer in mod.layers.items():
                mod.layers[key] = compiled(case, layer)
        wrapped = [self.wrap(mod) for mod in self.modules]
        # (After wrapping: FSDP2 replaces the parameters with sharded ones.)
        self.named = [(uncompiled_name(name), q) for mod in self.modules for name, q in mod.named_parameters()]
        cpu = torch.device("cpu")
        self.stages = [PipelineStage(w, c, n, cpu, group=self.pp_group) for w, c in zip(wrapped, self.indices)]
        self.params = [q for _, q in self.named]
        # (A stage whose parameters are all frozen trains nothing: it has no optimizer.)
        self.opt = make_optimizer(case, self.params) if any(q.requires_grad for q in self.params) else None
        self.schedule = self.make_schedule()

    def wrap(self, module):
        """The stage as the case's data parallelism holds it: itself, in DDP, or in FSDP2."""
        if self.dp == 1:
            return module
        if self.p["zero_stage"] == 0:
            if not any(q.requires_grad for q in module.parameters()):
                # DDP refuses a module with nothing to train ("DistributedDataParallel is not needed when a module
                # doesn't have any parameter that requires a gradient"): such a stage stays as it is.
                return module
            from torch.nn.parallel import DistributedDataParallel as DDP

            if self.tp > 1:
                # DDP's own DDP + TP path: given the data-parallel sub-mesh it holds the tensor-parallel parameters as
                # local tensors between forwards (torch.distributed.tensor.parallel.ddp._pre_dp_module_transform).
                return DDP(module, device_mesh=self.dp_mesh)
            return DDP(module, process_group=self.dp_mesh.get_group())
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mixed = master_dtype_name(self.case) != dtype_name(self.case)
        policy = MixedPrecisionPolicy(param_dtype=torch_dtype(dtype_name(self.case)) if mixed else None,
                                      reduce_dtype=torch_dtype(reduce_dtype_name(self.case)))
        kw = {"mesh": self.dp_mesh, "mp_policy": policy, "reshard_after_forward": self.p["zero_stage"] == 3}
        for layer in module.layers.values():
            fully_shard(layer, **kw)
        return fully_shard(module, **kw)

    def make_schedule(self):
        from torch.distributed import pipelining as pl

        kind = self.p["pipeline_schedule"]
        kw = {"n_microbatches": self.p["microbatches"], "loss_fn": self.loss_fn,
              "scale_grads": scales_grads(self.case)}
        if v_shaped(self.p):
            return (pl.ScheduleDualPipeV if dual_pipe(self.p) else pl.ScheduleZBVZeroBubble)(self.stages, **kw)
        if kind == "interleaved":
            cls = pl.ScheduleInterleavedZeroBubble if self.p["zero_bubble"] else pl.ScheduleInterleaved1F1B
            return (pl.ScheduleLoopedBFS if breadth_first(self.p) else cls)(self.stages, **kw)
        cls = pl.Schedule1F1B if kind == "1f1b" else pl.ScheduleGPipe
        return cls(self.stages[0], **kw)

    def loss_fn(self, logits, target):
        """The loss the schedule runs backward from: the micro-batch's token loss scaled to the global token mean
        (times the micro-batch count the schedule divides by); its summed token loss kept for the reported loss (the
        first step's metadata inference calls this too: step_rows keeps the schedule's last calls only)."""
        l, count = micro_batch_loss(self.case, self.inputs, logits, target)
        self.calls.append(full(l) * count)
        factor = self.dp * (self.p["microbatches"] if scales_grads(self.case) else 1)
        return l * (count * factor / self.global_tokens)

    def step_rows(self, ids, tgt, a, c, finalize):
        """One schedule step over rows a:c; the last stage's logits."""
        args = [ids[a:c]] if self.first else []
        kw = {"target": tgt[a:c], "losses": []} if self.last else {}
        if self.deferred_finalize:
            kw["finalize_gradients"] = finalize
        self.calls = []
        ctx = loss_context(self.case) if self.tp > 1 else None
        with ctx() if ctx else contextlib.nullcontext():
            out = self.schedule.step(*args, **kw)
        if self.last:
            self.loss_sum += sum(self.calls[-self.p["microbatches"]:])
        return out

    def train(self, first, end):
        """Steps first..end-1 of the case's training: their losses as (step, loss) pairs on the last stage's ranks and,
        where step 0 is among them, its rows, logits (the last stage's) and gradients."""
        import torch
        import torch.distributed as dist

        m, t = self.case["model"], self.case["train"]
        b, s = m["batch"], m["seq"]
        ids = torch.tensor(self.inputs["tokens"].astype(np.int64)).view(b, s)
        tgt = torch.tensor(self.inputs["targets"].astype(np.int64)).view(b, s)
        lo, hi = chunk_range(b, self.dp, self.dp_index)
        ga = t.get("grad_accumulation", 1)
        bounds = np.linspace(lo, hi, ga + 1).round().astype(int)
        self.global_tokens = loss_denominator(self.inputs)
        out = {"losses": []}
        for k in range(first, end):
            if self.opt is not None:
                self.opt.zero_grad()
            self.loss_sum = torch.zeros((), dtype=torch.float64)
            rows = [self.step_rows(ids, tgt, int(bounds[i]), int(bounds[i + 1]), i == ga - 1) for i in range(ga)]
            if self.last:
                if self.dp > 1:
                    dist.all_reduce(self.loss_sum, group=self.dp_mesh.get_group())
                out["losses"].append((k, float(self.loss_sum) / self.global_tokens))
            if k == 0:
                no_grad = self.untrained()
                logits = torch.cat([full(r).reshape(-1, r.shape[-1]) for r in rows]).numpy() if self.last else None
                grads = {name: self.reported(name, q, dense(grad_or_fail(name, q.grad))) for name, q in self.named
                         if not is_frozen(self.case, name) and name not in no_grad}
                out.update(rows=(lo * s, hi * s), no_grad=no_grad, logits=logits, grads=grads)
            if t.get("clip_grad_norm") is not None:
                self.clip(t["clip_grad_norm"])
            if self.opt is not None:
                self.opt.step()
        return out

    def final_params(self):
        return {name: self.reported(name, q, q) for name, q in self.named}

    def holder(self):
        """One module holding this rank's stages' parts under the whole model's names (for its state dict)."""
        import torch.nn as nn

        whole = nn.Module()
        whole.layers = nn.ModuleDict()
        for mod in self.modules:
            for part in ("embed", "final_norm", "lm_head"):
                if hasattr(mod, part):
                    setattr(whole, part, getattr(mod, part))
            whole.layers.update(mod.layers)
        return whole

    def save(self, path):
        """This rank's stages and their optimizer saved by torch.distributed.checkpoint (each rank its own shards)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.holder(), self.optimizers(), options=state_dict_options())
        dcp.save({"model": model, "optim": optim}, checkpoint_id=path)

    def load(self, path):
        """The checkpoint at `path` loaded into this (fresh) rank's stages and optimizer, by name."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        holder, optims, options = self.holder(), self.optimizers(), state_dict_options()
        model, optim = get_state_dict(holder, optims, options=options)
        state = {"model": model, "optim": optim}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(holder, optims, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)

    def optimizers(self):
        return [self.opt] if self.opt is not None else []

    def untrained(self):
        """Trainable parameters left without a gradient after the schedule's step, among those this rank's optimizer
        steps (the very objects it holds, so a None here is what the optimizer sees: it skips them, silently). Any
        other missing gradient stays a harness error (grad_or_fail)."""
        held = {id(q) for g in (self.opt.param_groups if self.opt is not None else []) for q in g["params"]}
        return [name for name, q in self.named if q.grad is None and q.requires_grad and id(q) in held]

    def reported(self, name, q, t):
        """What this rank reports of `t` (the parameter q or its gradient): the full tensor, or under tensor parallelism its
        own copy of a tensor replicated over the tensor-parallel ranks (torch-tp's replicas_per_rank)."""
        t = distributed(q, t)
        return replicas_per_rank(name, t) if self.tp > 1 else to_case_layout(name, full(t)).numpy()

    def clip(self, max_norm):
        """torchtitan's clip_grad_norm_ under pipeline parallelism: this rank's gradient norm (a DTensor norm made
        full over the data-parallel ranks) combined over the pipeline ranks (the squares summed for L2, the norms
        summed for L1, their maximum for inf), every stage clipped by it."""
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        grads = [distributed(q, q.grad) for q in self.params if q.grad is not None]
        foreach, p = foreach_clip(self.case), clip_norm_type(self.case)
        norm = torch.nn.utils.get_total_norm(grads, p, foreach=foreach) if grads else torch.zeros(())
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        part = norm.to(torch.float64) ** (2 if p == 2.0 else 1)
        dist.all_reduce(part, op=dist.ReduceOp.MAX if p == math.inf else dist.ReduceOp.SUM, group=self.pp_group)
        total = (part.sqrt() if p == 2.0 else part).to(norm.dtype)
        torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, total, foreach=foreach)


def distributed(q, t):
    """`t` (the parameter q or its gradient) as the DTensor q stands for where DDP's tensor-parallel path holds q as its
    local shard (with the DTensor's spec as `_st_info`), else `t`."""
    info = getattr(q, "_st_info", None)
    if info is None:
        return t
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(t, info.mesh, info.placements, run_check=False, shape=info.shape, stride=info.stride)


def combine_stages(case, outs, feats):
    """Full outputs from the stages' ranks: the loss from the last stage, logits rows stitched from its ranks, each
    parameter and gradient from the first rank holding it with every holder's copy as a replica. A trainable parameter
    the schedule left without a gradient (the optimizer skips it) is a divergence."""
    untrained = [(rank, o["no_grad"]) for rank, o in enumerate(outs) if o.get("no_grad")]
    if untrained:
        where = "; ".join(f"rank {r}: {', '.join(names)}" for r, names in untrained)
        return {"status": "divergent", "reason": "the schedule's step left trainable parameters without a gradient "
                f"(their optimizer skips them; the reference trains them): {where}"}
    m = case["model"]
    # (Each step's loss from the last stage of the layout that ran it: the case's, or the one it resumed into.)
    losses = dict(pair for o in reversed(outs) for pair in o["losses"])
    tensors = {f"loss/step{k}": np.array(v, dtype=np.float64) for k, v in sorted(losses.items())}
    logits = np.zeros((m["batch"] * m["seq"], m["vocab"]))
    for o in outs:
        a, b = o["rows"]
        if o["logits"] is not None and b > a:
            logits[a:b] = o["logits"][:, :m["vocab"]]
    tensors["logits"] = logits
    replicas = {}
    for kind, prefix in (("grads", "grad"), ("params", "param")):
        for rank, o in enumerate(outs):
            for name, v in o[kind].items():
                key = f"{prefix}/{name}"
                tensors.setdefault(key, v)
                replicas.setdefault(key, []).append((rank, v))
    replicas = {k: v for k, v in replicas.items() if len(v) > 1}
    for name, v in (outs[0].get("baseline") or {}).items():
        tensors[f"baseline/{name}"] = v
    return {"tensors": tensors, "replicas": replicas, "features": feats, "stats": {}}


TARGET = TorchPp()
