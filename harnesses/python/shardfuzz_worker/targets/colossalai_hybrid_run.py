"""colossalai-hybrid's training on one rank, its single-device baseline, and the assembly of the ranks' shards
(see colossalai_hybrid.py)."""

import contextlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .base import (IGNORE_INDEX, checkpoint_layout, chunk_range, class_weight, grad_or_fail, is_frozen,
                   loss_denominator, micro_batches, resume_after, setup_features)
from .colossalai_common import booster_resume, plugin_step, unscaled
from .colossalai_family import build, case_tensors, shardformer_loss
from .colossalai_mixtral import EXPERT, RoutingWatch, split, unsteppable_unused_experts
from .megatron_model import shard_dim
from .torch_common import torch_dtype
from .torch_model import make_optimizer, model_defaults
from .torch_training import loss_scaler, scaled_step, skipped_steps_stats


class Place:
    """Where this rank sits in the plugin's mesh."""

    def __init__(self, plugin):
        sm = plugin.stage_manager
        # (Under all_to_all the plugin's dp_size counts the sequence-parallel ranks too, over which it averages
        # gradients; the data is split over dp_group only.)
        self.dp, self.dp_rank = plugin.dp_group.size(), dist.get_rank(plugin.dp_group)
        self.tp_rank = dist.get_rank(plugin.tp_group)
        self.sp_rank = dist.get_rank(plugin.sp_group) if plugin.sp_size > 1 else 0
        self.stage = sm.stage if sm is not None else 0
        self.last = sm is None or sm.is_last_stage(ignore_chunk=True)
        self.pipelined = sm is not None


def local_view(t):
    return t.detach().to(torch.float64, copy=True).contiguous().numpy()


def reported_name(m, name):
    # Under pipeline parallelism the last stage holds its own copy of a tied embedding as lm_head.
    return "embed.weight" if (name == "lm_head.weight" and m.get("tied_embeddings")) else name


def named_parameters(model, m):
    """The model's (name, parameter) pairs. Without tied embeddings a parameter held under two names is listed under
    both: a framework that binds one module's weight to another's (Colossal-AI's OPT policy under tp) shows as the
    wrong values under the second name, not as a tensor it did not return."""
    return list(model.named_parameters(remove_duplicate=bool(m.get("tied_embeddings"))))


def case_views(m, named):
    """[(reported case name, model parameter name, parameter, tensor-of-it -> the case tensor)] of the model's trained
    parameters (a fused one yields several case tensors)."""
    out = []
    for hf, p in named:
        for i, (name, _) in enumerate(case_tensors(hf, p.detach(), m)):
            out.append((reported_name(m, name), hf, p, lambda t, hf=hf, i=i: case_tensors(hf, t, m)[i][1]))
    return out


def checkpointed(model, m):
    """`model` with transformers' gradient checkpointing of every decoder layer where the case asks for activation
    checkpointing (`model.activation_checkpointing`), as a user enables it before boosting; Colossal-AI's
    shardformer forwards honour the flag."""
    recompute = m.get("activation_checkpointing")
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": recompute == "reentrant"})
    return model


def input_grads(model, m):
    """`model` (boosted: its unwrapped module) whose input embeddings' output requires a gradient under re-entrant
    checkpointing (transformers' `enable_input_require_grads`), else the layers of a checkpoint whose input needs
    none (after a frozen embedding) get no gradient. Registered after boosting: shardformer replaces the embedding
    module under tensor parallelism, and a hook on the original is lost with it. A pipeline stage without the
    embedding receives its input from the previous stage."""
    if m.get("activation_checkpointing") == "reentrant" and model.get_input_embeddings() is not None:
        model.enable_input_require_grads()
    return model


def frozen_model(model, case):
    """`model` with requires_grad=False on each parameter whose case tensors the case freezes (`train.frozen`), as a
    user freezes them before boosting."""
    for name, p in model.named_parameters():
        names = [n for n, _ in case_tensors(name, p.detach(), case["model"])]
        if names and all(is_frozen(case, n) for n in names):
            p.requires_grad_(False)
    return model


class _Gather(torch.autograd.Function):
    """All-gather of the ranks' pieces along `dim` (any sizes, empty ones too), concatenated in rank order; the
    backward takes this rank's slice times `grad_scale`, as Colossal-AI's gather_forward_split_backward does:
    every rank computes the same loss from the gathered tensor, so no gradient is summed over ranks."""

    @staticmethod
    def forward(ctx, t, dim, group, grad_scale):
        n = dist.get_world_size(group)
        sizes = [torch.zeros((), dtype=torch.int64) for _ in range(n)]
        dist.all_gather(sizes, torch.tensor(t.shape[dim], dtype=torch.int64), group=group)
        sizes = [int(x) for x in sizes]
        widest = max(sizes)
        pad = [0, 0] * (t.dim() - 1 - dim) + [0, widest - t.shape[dim]]
        padded = F.pad(t, pad).contiguous()
        pieces = [torch.empty_like(padded) for _ in range(n)]
        dist.all_gather(pieces, padded, group=group)
        rank = dist.get_rank(group)
        ctx.dim, ctx.start, ctx.size, ctx.scale = dim, sum(sizes[:rank]), sizes[rank], grad_scale
        return torch.cat([p.narrow(dim, 0, k) for p, k in zip(pieces, sizes)], dim=dim)

    @staticmethod
    def backward(ctx, g):
        return g.narrow(ctx.dim, ctx.start, ctx.size) * ctx.scale, None, None, None


def gather(logits, plugin, seq):
    """The logits over the whole sequence (`seq` positions) and vocabulary. With parallel_output=True each
    tensor-parallel rank holds the valid columns of its vocabulary shard (their concatenation in rank order is the
    vocabulary) and, under all_to_all, each sequence-parallel rank its part of the sequence where the model's forward
    leaves it split (Llama's does; Qwen2's gathers the sequence itself, `force_sp_output_gather`). The sequence's
    gradient is scaled by the sequence-parallel size, to offset the plugin's averaging over dp x sp (as Colossal-AI's
    gather_sp_output does)."""
    sc = plugin.shard_config
    if not sc.parallel_output:
        return logits
    if plugin.sp_size > 1 and sc.sequence_parallelism_mode == "all_to_all" and logits.shape[-2] < seq:
        logits = _Gather.apply(logits, logits.dim() - 2, plugin.sp_group, plugin.sp_size)
    if sc.enable_tensor_parallelism and dist.get_world_size(plugin.tp_group) > 1:
        logits = _Gather.apply(logits, logits.dim() - 1, plugin.tp_group, 1)
    return logits


def full_vocabulary(logits, m):
    """Whether the model returned logits over the whole vocabulary (with parallel_output=False it should)."""
    return logits.shape[-1] >= m["vocab"]


def criterion_loss(logits, target, m, weight):
    """Our criterion on the model's logits: the summed token loss; on logits narrower than the vocabulary (a rank's
    vocabulary shard), a zero loss on the graph, so every rank's schedule still runs its backward (the narrow logits
    are reported as such)."""
    if not full_vocabulary(logits, m):
        return logits.sum() * 0.0
    return F.cross_entropy(logits.flatten(0, -2), target.reshape(-1), reduction="sum",
                           weight=None if weight is None else weight.to(logits.dtype))


def batches(case, inputs, place):
    m = model_defaults(case)
    b, s = m["batch"], m["seq"]
    ids = torch.tensor(inputs["tokens"].astype(np.int64)).view(b, s)
    tgt = torch.tensor(inputs["targets"].astype(np.int64)).view(b, s)
    lo, hi = chunk_range(b, place.dp, place.dp_rank)
    return ids[lo:hi], tgt[lo:hi], (lo * s, hi * s)


def model_labels(case, inputs, plugin):
    """The `labels` through which the model's own loss computes the case's, or None.

    A causal LM's labels are its inputs: the model shifts them, so position t's loss takes labels[t + 1] and the
    last position has none. The case's loss is that loss when every sequence's last target is ignored and no
    class weights apply. It is taken where shardformer replaces the model's forward (`shardformer_loss`: for Llama
    under tensor, sequence or pipeline parallelism, for GPT-2 under pipeline parallelism or with parallel_output),
    whose loss is its `dist_cross_entropy`; elsewhere the model's forward is transformers' own, and under gradient
    accumulation the division among steps would be our loop's, not the framework's."""
    m, t = model_defaults(case), case["train"]
    b, s = m["batch"], m["seq"]
    tgt = np.asarray(inputs["targets"], dtype=np.int64).reshape(b, s)
    weighted = inputs.get("class_weights") is not None and len(inputs["class_weights"]) > 0
    if not shardformer_loss(m, plugin) or t.get("grad_accumulation", 1) > 1 or s < 2 or weighted or not (tgt[:, -1] == IGNORE_INDEX).all():
        return None
    labels = np.full((b, s), IGNORE_INDEX, dtype=np.int64)
    labels[:, 1:] = tgt[:, :-1]
    return torch.tensor(labels)


class Layout:
    """A plugin's layout of the run on this rank: its booster, this rank's place and rows of the batch, the loss's
    scale, the labels of the model's own loss (or None) and the step function that runs them. `case`: the case as
    laid out (its `train.resume_parallel` once the run resumes into another layout)."""

    def __init__(self, plugin, case, inputs):
        from colossalai.booster import Booster

        self.case, self.booster = case, Booster(plugin=plugin)
        self.place = Place(plugin)
        self.ids, self.tgt, self.rows = batches(case, inputs, self.place)
        self.scale = self.place.dp / loss_denominator(inputs)
        self.labels = model_labels(case, inputs, plugin)
        if self.labels is not None:
            self.tgt = self.labels[self.rows[0] // self.ids.shape[1]: self.rows[1] // self.ids.shape[1]]
            self.step_fn = model_loss_pipeline_step if self.place.pipelined else model_loss_plain_step
        else:
            self.step_fn = pipeline_step if self.place.pipelined else plain_step

    def step(self, boosted, zopt, keep_logits, weight):
        return self.step_fn(self.booster, boosted, zopt, self.ids, self.tgt, self.scale, self.case, keep_logits, weight)

    def reports_loss(self):
        """Whether this rank reports its data-parallel replica's loss (the last stage's tensor- and sequence-parallel
        rank 0)."""
        return self.place.last and self.place.tp_rank == 0 and self.place.sp_rank == 0

    def where(self):
        p = self.place
        return (p.dp_rank, p.stage, p.tp_rank, p.last, p.sp_rank)


def routing_watch(model, case):
    """A RoutingWatch where an expert routed no token could be stepped differently from the reference (the case's
    optimizer moves a parameter whose gradient is zero), else None."""
    if "moe" not in case["model"]["layers"] or unsteppable_unused_experts(case) is None:
        return None
    return RoutingWatch(model)


def run(plugin, case, inputs, dt, relayout=None):
    """The case's training on this rank under `plugin`; `relayout()` -> (the plugin of the layout the run resumes
    into, the case as laid out then), where the case resumes into another (`train.resume_parallel`)."""
    m, t = model_defaults(case), case["train"]

    def fresh():
        model = checkpointed(frozen_model(build(m, inputs, dt), case), m)
        return model, make_optimizer(case, list(model.parameters()))

    now = Layout(plugin, case, inputs)
    boosted, zopt, *_ = now.booster.boost(*fresh())
    input_grads(boosted.unwrap(), m)
    losses, reports, first, skipped = [], [], {}, []

    def model_views():
        # Every parameter's final value is reported; a frozen one's gradient is not (it has none).
        return case_views(m, named_parameters(boosted.unwrap(), m))

    views = model_views()
    watch, idle = routing_watch(boosted.unwrap(), case), False
    for k in range(t["steps"]):
        if k == resume_after(case):
            later = now if relayout is None else Layout(*relayout(), inputs)
            boosted, zopt = booster_resume(now.booster, boosted, zopt, fresh, checkpoint_layout(case) == "gathered",
                                           into=later.booster)
            now = later
            input_grads(boosted.unwrap(), m)
            views = model_views()
            watch = routing_watch(boosted.unwrap(), case)
        raw, logits = now.step(boosted, zopt, k == 0, class_weight(inputs, dt))
        idle = (watch is not None and watch.idle()) or idle
        losses.append(raw)
        reports.append(now.reports_loss())
        if k == 0:
            first = first_step(case, now, zopt, views, logits)
        was_skipped = plugin_step(zopt)
        if was_skipped is not None:
            skipped.append(was_skipped)
    # With ZeRO's overlap_allgather the updated parameters arrive asynchronously (each waited for by the next
    # forward's op hook): read after the wait Colossal-AI's own checkpointing does first.
    boosted._force_wait_all_gather()
    return first | {
        "place": now.where(), "losses": losses, "reports": reports, "denominator": loss_denominator(inputs),
        "params": {n: local_view(view(p)) for n, _, p, view in views}, "sharded": sharded_flags(views),
        "model_loss": now.labels is not None, "idle_experts": idle,
        # Without loss scaling too where the framework checks for overflow (plugin_step: not None).
        "skipped": skipped if t.get("loss_scale") is not None or skipped else None,
    }


def first_step(case, now, zopt, views, logits):
    """What the first step leaves to compare, in its layout (`now`): this rank's rows, logits, reduced gradients
    (`first_place` its place then, `first_sharded` which of them are distributed tensors), and the parameters this
    rank holds and trains whose backward gave them no gradient (`ungraded`: they will not train, the optimizer skips
    them; combine says so)."""
    grad = getattr(zopt, "get_param_grad", None)
    grads, ungraded = {}, []
    for name, hf, p, view in views:
        if is_frozen(case, name):
            continue
        g = grad(p) if grad is not None else p.grad
        if g is None and p.requires_grad:
            if EXPERT not in name:
                ungraded.append(name)
                continue
            g = torch.zeros_like(p)  # (an expert routed no token: its gradient is zero, as the reference's)
        grads[name] = local_view(view(grad_or_fail(hf, unscaled(zopt, g))))
    return {"first_place": now.where(), "rows": now.rows, "logits": logits, "grads": grads,
            "first_sharded": sharded_flags(views), "ungraded": ungraded}


def sharded_flags(views):
    from colossalai.tensor.d_tensor import is_customized_distributed_tensor, is_distributed_tensor

    return {n: is_distributed_tensor(p) or is_customized_distributed_tensor(p) for n, _, p, _ in views}


def as_scaled_loss(case, loss):
    """The loss the plugin's fp16 scaler multiplies: float32 under loss scaling, as under autocast (an fp16 loss
    times 65536 is inf by itself, where the gradient seed is representable), else as it is."""
    return loss.float() if case["train"].get("loss_scale") is not None else loss


def plain_step(booster, boosted, zopt, ids, tgt, scale, case, keep_logits, weight=None):
    """Forward and backward of this rank's rows, in the case's accumulation micro-batches; returns the summed
    token loss and (if asked) the logits."""
    chunks = micro_batches(ids.shape[0], case["train"].get("grad_accumulation", 1))
    raw, rows = 0.0, []
    for i, (a, c) in enumerate(chunks):
        # Colossal-AI's accumulation idiom: no_sync for all but the last micro-batch, except under ZeRO-2,
        # which refuses no_sync ("run gradient accumulation with gradient synchronization allowed").
        quiet = i < len(chunks) - 1 and case["parallel"].get("zero_stage", 0) != 2
        with booster.no_sync(boosted, zopt) if quiet else contextlib.nullcontext():
            out = boosted(input_ids=ids[a:c], attention_mask=torch.ones_like(ids[a:c]))
            logits = gather(out.logits, booster.plugin, ids.shape[1])
            l = criterion_loss(logits, tgt[a:c], model_defaults(case), weight)
            booster.backward(as_scaled_loss(case, l) * scale, zopt)
        raw += float(l.detach().to(torch.float64))
        if keep_logits:
            rows.append(logits.detach().flatten(0, -2).to(torch.float64))
    return raw, (torch.cat(rows).numpy() if keep_logits else None)


def pipeline_step(booster, boosted, zopt, ids, tgt, scale, case, keep_logits, weight=None):
    """One 1F1B step over the case's micro-batches (the schedule divides each micro-batch loss by their count,
    which the criterion multiplies back); the summed token loss and logits on the last stage, else None."""
    micro = case["parallel"].get("microbatches", 1)
    size = ids.shape[0] // micro if micro else ids.shape[0]
    seen = {"i": 0}

    def criterion(outputs, micro_batch):
        i = seen["i"]
        seen["i"] += 1
        l = criterion_loss(gather(outputs.logits, booster.plugin, ids.shape[1]), tgt[i * size:(i + 1) * size],
                           model_defaults(case), weight)
        return as_scaled_loss(case, l) * (scale * micro)

    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ret = booster.execute_pipeline(iter([batch]), boosted, criterion, zopt, return_loss=True, return_outputs=keep_logits)
    return pipeline_result(ret, scale, keep_logits, booster.plugin, ids.shape[1])


def reported_logits(logits, plugin, seq):
    """The step's logits as reported: rows of the whole vocabulary."""
    with torch.no_grad():
        return gather(logits.detach(), plugin, seq).flatten(0, -2).to(torch.float64).numpy()


def pipeline_result(ret, scale, keep_logits, plugin, seq):
    """execute_pipeline's loss in the criterion path's units and the logits (on the last stage; else None)."""
    if ret.get("loss") is None:
        return None, None
    raw = float(ret["loss"].detach().to(torch.float64)) / scale
    logits = reported_logits(ret["outputs"]["logits"], plugin, seq) if keep_logits else None
    return raw, logits


def model_loss_plain_step(booster, boosted, zopt, ids, labels, scale, case, keep_logits, weight=None):
    """Forward and backward with the model's own loss (`labels`), as returned; the loss in the criterion path's
    units (this rank's share of the summed token loss: the plugin averages ranks' gradients over dp)."""
    out = boosted(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
    booster.backward(as_scaled_loss(case, out.loss), zopt)
    raw = float(out.loss.detach().to(torch.float64)) / scale
    logits = reported_logits(out.logits, booster.plugin, ids.shape[1]) if keep_logits else None
    return raw, logits


def model_loss_pipeline_step(booster, boosted, zopt, ids, labels, scale, case, keep_logits, weight=None):
    """One pipeline step whose criterion is the model's own loss, as Colossal-AI's examples write it."""
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    ret = booster.execute_pipeline(iter([batch]), boosted, lambda outputs, _: as_scaled_loss(case, outputs.loss), zopt,
                                   return_loss=True, return_outputs=keep_logits)
    return pipeline_result(ret, scale, keep_logits, booster.plugin, ids.shape[1])


def single_device(case, inputs, dt=None):
    """The same model, plain transformers on one device in `dt` (default: the case dtype, the oracle's noise
    baseline; a repro's reference runs it in float64)."""
    m, t = model_defaults(case), case["train"]
    dt = dt or torch_dtype(t["dtype"])
    model = input_grads(checkpointed(frozen_model(build(m, inputs, dt), case), m), m)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = make_optimizer(case, [p for _, p in trained])
    views = case_views(m, named_parameters(model, m))
    b, s = m["batch"], m["seq"]
    ids = torch.tensor(inputs["tokens"].astype(np.int64)).view(b, s)
    tgt = torch.tensor(inputs["targets"].astype(np.int64)).view(b, s)
    out = {}
    scaler = loss_scaler(t)
    denominator = loss_denominator(inputs)
    for k in range(t["steps"]):
        opt.zero_grad()
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        l = F.cross_entropy(logits.flatten(0, -2), tgt.reshape(-1), reduction="sum",
                            weight=class_weight(inputs, logits.dtype))
        ((scaler.scale(l.float()) if scaler is not None else l) / denominator).backward()
        if scaler is not None:
            scaler.unscale_(opt)
        out[f"loss/step{k}"] = np.array(float(l.detach().to(torch.float64)) / denominator)
        if k == 0:
            out["logits"] = logits.detach().flatten(0, -2).to(torch.float64).numpy()
            for name, _, p, view in views:
                if not is_frozen(case, name):
                    out[f"grad/{name}"] = local_view(view(p.grad))
        if t.get("clip_grad_norm") is not None:
            torch.nn.utils.clip_grad_norm_([p for _, p in trained], t["clip_grad_norm"], foreach=False)
        if scaler is not None:
            scaled_step(scaler, opt)
        else:
            opt.step()
    for name, _, p, view in views:
        out[f"param/{name}"] = local_view(view(p))
    stack_experts(out, {})
    return out


def tensor_parallel_axis(name):
    """The case-layout axis a tensor-parallel rank's shard of `name` splits, or None. An expert's part is sharded as the
    dense MLP's projection of the same role; Mixtral's router as a column-parallel linear (Linear1D_Col, experts
    sharded: case [hidden, experts])."""
    case, expert = split(name)
    if expert is not None:
        return shard_dim(case.replace(".moe.", ".mlp."))
    return 1 if name.endswith(".moe.router.weight") else shard_dim(name)


def assemble(case, name, pieces):
    """Full tensors from one kind's per-rank pieces of `name`: [(rank, place, local, sharded)] -> the copies,
    one per (dp rank, stage), each concatenated over its tensor-parallel ranks (cut to the case's vocabulary)."""
    m = case["model"]
    groups = {}
    for rank, place, local, sharded in pieces:
        groups.setdefault((place[0], place[1]), []).append((place[2], rank, local, sharded))
    copies = []
    vocab_rows = m["vocab"] if name in ("embed.weight", "lm_head.weight") else None  # (padded by Colossal-AI)
    for key in sorted(groups):
        members = sorted(groups[key])
        axis = tensor_parallel_axis(name)
        if members[0][3] and axis is not None:
            copies.append((members[0][1], np.concatenate([x[2] for x in members], axis=axis)[:vocab_rows]))
        else:
            copies.extend((r, local[:vocab_rows]) for _, r, local, _ in members)
    return copies


def stack_experts(tensors, replicas):
    """The experts' parts (`<name>#e<k>`, colossalai_mixtral) stacked into the case's [experts, in, out] tensors, in
    place: the first copy of each part, and the parts' replicas stacked where every part has the same number."""
    parts, copies = {}, {}
    for key in [k for k in tensors if EXPERT in k]:
        name, e = split(key)
        parts.setdefault(name, {})[e] = tensors.pop(key)
        copies.setdefault(name, {})[e] = replicas.pop(key, None)
    for name, by_expert in parts.items():
        tensors[name] = np.stack([by_expert[e] for e in sorted(by_expert)])
        kept = [copies[name][e] for e in sorted(by_expert)]
        if all(k is not None for k in kept) and len({len(k) for k in kept}) == 1:
            replicas[name] = [(kept[0][i][0], np.stack([k[i][1] for k in kept])) for i in range(len(kept[0]))]


def combine(case, outs, features):
    m = case["model"]
    ungraded = next(((r, o["ungraded"]) for r, o in enumerate(outs) if o.get("ungraded")), None)
    if ungraded is not None:
        r, names = ungraded
        return {"status": "divergent", "reason": f"grad/{names[0]}: no gradient reached it on rank {r}, which holds and"
                f" trains it (requires_grad=True): it does not train ({len(names)} parameter(s) so on that rank)"}
    tensors, replicas = {}, {}
    # (The first step's gradients as the ranks were laid out then, the final parameters as at the end: a run may
    # resume into another layout.)
    for kind, prefix, place, sharded in (("grads", "grad", "first_place", "first_sharded"),
                                         ("params", "param", "place", "sharded")):
        names = sorted({n for o in outs for n in o[kind]})
        for name in names:
            pieces = [(r, o[place], o[kind][name], o[sharded][name]) for r, o in enumerate(outs) if name in o[kind]]
            copies = assemble(case, name, pieces)
            tensors[f"{prefix}/{name}"] = copies[0][1]
            if len(copies) > 1:
                replicas[f"{prefix}/{name}"] = copies
    narrow = next(((r, o["logits"].shape[-1]) for r, o in enumerate(outs) if o["logits"] is not None
                   and not full_vocabulary(o["logits"], m)), None)
    if narrow is not None:
        return {"status": "divergent", "reason": f"logits: rank {narrow[0]} got {narrow[1]} columns for a vocabulary of"
                f" {m['vocab']} (HybridParallelPlugin with parallel_output=False: whole-vocabulary logits)"}
    # Each step's loss from one rank per dp rank on the last stage (tensor- and sequence-parallel rank 0) of the
    # step's layout; the first step's logits from those of the first layout.
    steps = len(outs[0]["losses"])
    total = m["batch"] * m["seq"]
    for k in range(steps):
        tensors[f"loss/step{k}"] = np.array(sum(o["losses"][k] for o in outs if o["reports"][k]) / outs[0]["denominator"])
    last = [o for o in outs if o["reports"][0]]
    logits = np.zeros((total, m["vocab"]))
    for o in last:
        a, b = o["rows"]
        if b > a:
            logits[a:b] = o["logits"][:, : m["vocab"]]
    tensors["logits"] = logits
    for name, v in (outs[0].get("baseline") or {}).items():
        tensors[f"baseline/{name}"] = v
    stack_experts(tensors, replicas)
    stats, disagreement = skipped_steps_stats(outs)
    if disagreement:
        return {"status": "divergent", "reason": disagreement}
    if any(stats.get("skipped_steps", [])):
        features = features + ["loss-scale:overflow"]
    features = features + (setup_features(features[0], case) if features else [])
    return {"tensors": tensors, "replicas": replicas, "features": features, "stats": stats}

