"""A training run of the case's model on one rank: the loop the torch-based targets share.

Each data-parallel rank takes its rows of the batch (torch.chunk split, uneven allowed) and scales
its summed token loss (with the case's `local_mean_loss`, each micro-batch's mean times its own count) by dp /
global tokens, so that averaging gradients over the data-parallel ranks
(what DDP, FSDP2 and ZeRO do) yields the gradient of the global token mean, as the reference computes.
"""

import contextlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .base import (chunk_range, class_weight, grad_or_fail, is_frozen, label_smoothing, loss_denominator, resume_after,
                   setup_features)
from .torch_model import clip_norm_type, foreach_clip, make_optimizer, rounds_in_parameter_dtype, to_case_layout
from .torch_moe import set_aux_unit


def full(t):
    """A parameter or gradient as a plain full tensor (DTensors are gathered: every rank must call)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().to(torch.float64, copy=True)


def dense(t):
    """A sparse gradient (an embedding's with `sparse=True`) as the dense tensor it stands for."""
    return t.to_dense() if t.is_sparse else t


def local_mean_count(case, inputs, targets):
    """The micro-batch's own loss denominator where the case's `train.local_mean_loss` averages each micro-batch on its
    own and the micro-batch counts a token; None where its loss stays a sum (a mean would be 0 / 0)."""
    if not case["train"].get("local_mean_loss"):
        return None
    count = loss_denominator({"targets": targets.reshape(-1).numpy(), "class_weights": inputs.get("class_weights")})
    return count if count > 0 else None


def micro_batch_loss(case, inputs, logits, targets):
    """(loss, count): the micro-batch's token loss and what it stands for in units of the summed token loss.
    F.cross_entropy's sum (count 1), or with the case's `train.local_mean_loss` its mean (`reduction="mean"`, the
    frameworks' default, through their own division: a vocab-parallel loss divides in its backward) and the
    micro-batch's own denominator; a micro-batch with no counted token stays a sum (its mean would be 0 / 0)."""
    kw = dict(weight=class_weight(inputs, logits.dtype), label_smoothing=label_smoothing(case))
    flat, tgt = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    count = local_mean_count(case, inputs, tgt)
    if count is not None:
        return F.cross_entropy(flat, tgt, reduction="mean", **kw), count
    return F.cross_entropy(flat, tgt, reduction="sum", **kw), 1.0


def train(case, inputs, model, params, dp_index, dp, *, backward=None, step=None, no_sync=None, clip=None, group=None,
          forward=None, named=None, loss_ctx=None, view=None, grad=None, resume=None, loss_seed=None, finish=None,
          seq=None, vocab=None, scaler=None, optimizer=None):
    """Runs the case's steps. `model` maps ids [b, s] to logits; `params` are the trainable tensors;
    hooks let a framework own backward/step (DeepSpeed's engine) or gradient sync (DDP's no_sync).
    `step()` may return whether the framework's own loss scaler skipped the step.
    `loss_ctx` wraps the loss (torch's loss_parallel); `view(name, t)` turns a parameter or gradient
    into what this rank reports (default: the full tensor); `grad(name, p)` is a parameter's step-0
    gradient (default: p.grad; None is a harness error, never a zero). `resume(opt)` checkpoints the run after the
    case's `resume_after` steps (the model, and `opt`, this loop's optimizer, or the framework's own when `step` is
    given and `opt` is None), reloads it into fresh objects (which `forward`, `backward`, `step` and `no_sync` then
    reach) and returns the new (`named` parameters, optimizer or None), and a `DataPart` where the resumed layout
    splits the data another way (another dp); a target without one runs the case uninterrupted (the same result).
    `loss_seed(l)` is what backward starts from, given the micro-batch's summed token loss (default: l x dp / global
    tokens; a framework that normalises the loss itself takes it unscaled).
    `finish()` runs after the last step, before the final parameters are read (a framework that gathers them lazily).
    `seq` (context parallelism; its framework attends over the whole sequence): `seq.split(ids, targets)` enters what
    the micro-batch's forward and backward run in and gives this rank's tokens of them, `seq.whole(logits)` the
    micro-batch's logits as whole sequences, and the framework divides gradients by `seq.averaged` x dp ranks
    (`SequencePart`: a contiguous part of every sequence).
    `vocab` (a vocabulary-sharded LM head whose framework computes the loss on the shards): `vocab.loss(logits,
    targets)` is the micro-batch's (loss, count) as micro_batch_loss's, `vocab.whole(logits)` the logits gathered.
    `scaler(train_cfg)`: the framework's own dynamic loss scaler for the case (FSDP1's ShardedGradScaler) in place of
    torch.amp's (`loss_scaler`). `optimizer(params)`: the optimizer stepping `params` where a framework wraps its own
    (torch's ZeroRedundancyOptimizer) in place of make_optimizer's.
    Returns local logits rows, losses, step-0 gradients and final parameters (case layout)."""
    view = view or (lambda name, t: to_case_layout(name, full(t)).numpy())
    grad = grad or (lambda name, p: p.grad)
    m, t = case["model"], case["train"]
    b, s = m["batch"], m["seq"]
    ids = torch.tensor(inputs["tokens"].astype(np.int64)).view(b, s)
    tgt = torch.tensor(inputs["targets"].astype(np.int64)).view(b, s)
    global_tokens = loss_denominator(inputs)  # F.cross_entropy's sum leaves the ignored targets out
    part = DataPart(dp_index, dp, group, seq, vocab)
    lo, hi, averaged, chunks = part.split(case)
    opt = None if step is not None else (optimizer or (lambda ps: make_optimizer(case, ps)))(params)
    scaler = (scaler or loss_scaler)(t) if step is None else None
    named = named or []
    losses, logits0, grads0, skipped = [], None, {}, []
    for k in range(t["steps"]):
        if resume is not None and k == resume_after(case):
            named, opt, *relaid = resume(opt)
            params = [p for _, p in named]
            if relaid:  # the resumed layout's data-parallel degree: each rank's data split anew
                part = relaid[0]
                dp, group, seq, vocab = part.dp, part.group, part.seq, part.vocab
                lo, hi, averaged, chunks = part.split(case)
        if opt is not None:
            opt.zero_grad()
        loss_sum = torch.zeros((), dtype=torch.float64)
        rows = []
        for ci, (a, c) in enumerate(chunks):
            last = ci == len(chunks) - 1
            ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
            parts = seq.split(ids[a:c], tgt[a:c]) if seq is not None else contextlib.nullcontext((ids[a:c], tgt[a:c]))
            with ctx, (loss_ctx() if loss_ctx is not None else contextlib.nullcontext()), parts as (mb_ids, mb_tgt):
                logits = (forward or model)(mb_ids)
                if vocab is not None:
                    l, count = vocab.loss(logits, mb_tgt)
                else:
                    l, count = micro_batch_loss(case, inputs, logits, mb_tgt)
                if loss_seed is not None:
                    scaled = loss_seed(l * count)
                elif t.get("loss_scale") is None:
                    scaled = l * (count * averaged / global_tokens)
                else:
                    # Scaled in float32, as under autocast: a float16 loss times 65536 is inf by
                    # itself, where the gradient seed (scale x dp / tokens) is representable.
                    # (A framework that owns backward scales this loss itself.)
                    scaled = l.float()
                    scaled = (scaler.scale(scaled) if scaler is not None else scaled) * (count * averaged / global_tokens)
                if backward is not None:
                    backward(scaled)
                else:
                    scaled.backward()
            loss_sum += full(l) * count
            if k == 0:
                whole = vocab.whole(full(logits)) if vocab is not None else full(logits)
                rows.append((whole if seq is None else seq.whole(whole)).reshape(-1, whole.shape[-1]))
        if dp > 1 or seq is not None:
            dist.all_reduce(loss_sum, group=group)
        losses.append(float(loss_sum) / global_tokens)
        if scaler is not None:
            scaler.unscale_(opt)
        if k == 0:
            logits0, rows0 = torch.cat(rows).numpy() if rows else None, (lo * s, hi * s)
            for name, p in named:
                if not is_frozen(case, name):  # a frozen parameter has no gradient to report
                    grads0[name] = view(name, dense(grad_or_fail(name, grad(name, p))))
        if clip is not None:
            clip()
        elif t.get("clip_grad_norm") is not None:
            torch.nn.utils.clip_grad_norm_(params, t["clip_grad_norm"], clip_norm_type(case), foreach=foreach_clip(case))
        if step is not None:
            # A framework that owns the loss scaler says whether it skipped the step.
            was_skipped = step()
            if was_skipped is not None:
                skipped.append(bool(was_skipped))
        elif scaler is not None:
            skipped.append(scaled_step(scaler, opt))
        else:
            opt.step()
    if finish is not None:
        finish()
    final = {name: view(name, p) for name, p in named}
    return {"rows": rows0, "logits": logits0, "losses": losses, "grads": grads0, "params": final,
            "skipped": skipped if t.get("loss_scale") is not None or skipped else None}


class DataPart:
    """Which rows of the batch a rank trains on: data-parallel index `dp_index` of `dp`, with `train`'s `group`, `seq`
    and `vocab` (a resumed run may bring another)."""

    def __init__(self, dp_index, dp, group=None, seq=None, vocab=None):
        self.dp_index, self.dp, self.group, self.seq, self.vocab = dp_index, dp, group, seq, vocab

    def split(self, case):
        """(lo, hi, averaged, chunks): the rank's rows [lo, hi), the ranks the framework's gradient average divides by,
        and its micro-batches' row ranges; sets the MoE auxiliary loss's unit for them."""
        m, ga = case["model"], case["train"].get("grad_accumulation", 1)
        b, s = m["batch"], m["seq"]
        lo, hi = chunk_range(b, self.dp, self.dp_index)
        averaged = self.dp * (self.seq.averaged if self.seq is not None else 1)
        # Every rank runs exactly `ga` micro-steps (their collectives must pair up across ranks):
        # sizes differ by at most one row; unsupported_model() refuses cases where one would be empty.
        bounds = np.linspace(lo, hi, ga + 1).round().astype(int) if hi > lo else np.full(ga + 1, lo)
        chunks = [(int(bounds[i]), int(bounds[i + 1])) for i in range(ga)]
        # The MoE auxiliary loss (averaged over the batch's sequences) in the units of this loop's loss seed.
        set_aux_unit(self.dp / (b * s))
        return lo, hi, averaged, chunks


class SequencePart:
    """`train`'s `seq` where a rank holds the contiguous torch.chunk part `index` of `parts` of every sequence and its
    framework sums gradients over them (DeepSpeed-Ulysses); the logits are gathered over `group`."""

    averaged = 1

    def __init__(self, index, parts, group):
        self.index, self.parts, self.group = index, parts, group

    @contextlib.contextmanager
    def split(self, ids, tgt):
        s0, s1 = chunk_range(ids.shape[1], self.parts, self.index)
        yield ids[:, s0:s1], tgt[:, s0:s1]

    def whole(self, logits):
        """A rank's logits [rows, its part of the sequence, vocab] with the other parts gathered."""
        parts = [torch.empty(0)] * self.parts
        dist.all_gather_object(parts, logits, group=self.group)
        return torch.cat(parts, dim=1)


class _LowPrecisionGradScaler(torch.amp.GradScaler):
    """torch's dynamic loss scaler, unscaling float16 gradients in place as FSDP's ShardedGradScaler
    does (GradScaler itself refuses them, expecting float32 master weights, which the case model
    does not have)."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)


def loss_scaler(train_cfg):
    """The case's dynamic loss scaler (torch.amp.GradScaler), or None: the initial scale the case
    gives, halved on every step with a non-finite gradient (the step skipped), never grown, as the
    reference's scaler does."""
    scale = train_cfg.get("loss_scale")
    if scale is None:
        return None
    return _LowPrecisionGradScaler("cpu", init_scale=float(scale), growth_factor=2.0, backoff_factor=0.5,
                                   growth_interval=2**31 - 1)


def scaled_step(scaler, opt):
    """The optimizer step through the scaler; whether the scaler skipped it (its scale went down)."""
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    return scaler.get_scale() < before


def skipped_steps_stats(outs):
    """The run's `stats` from each rank's `skipped` list: the skipped steps, or a divergence when
    the ranks' scalers disagreed (one rank stepped where another skipped: their replicas part)."""
    lists = [o.get("skipped") for o in outs]
    if lists[0] is None:
        return {}, None
    if any(x != lists[0] for x in lists):
        per_rank = ", ".join(f"rank {r} {x}" for r, x in enumerate(lists))
        return {}, f"the ranks' loss scalers skipped different steps: {per_rank}"
    return {"skipped_steps": [bool(x) for x in lists[0]]}, None


def combine_dp(case, outs, features):
    """Full outputs from per-rank results: logits rows stitched, replicated tensors from rank 0 with
    every rank's copy as a replica."""
    m = case["model"]
    stats, disagreement = skipped_steps_stats(outs)
    if disagreement:
        return {"status": "divergent", "reason": disagreement}
    tensors = {}
    for k, l in enumerate(outs[0]["losses"]):
        tensors[f"loss/step{k}"] = np.array(l, dtype=np.float64)
    vocab = m["vocab"]
    logits = np.zeros((m["batch"] * m["seq"], vocab))
    for o in outs:
        a, b = o["rows"]
        if b > a:
            logits[a:b] = o["logits"][:, :vocab]
    tensors["logits"] = logits
    replicas = {}
    for kind in ("grads", "params"):
        prefix = "grad" if kind == "grads" else "param"
        for name, v in outs[0][kind].items():
            tensors[f"{prefix}/{name}"] = v
            if len(outs) > 1:
                replicas[f"{prefix}/{name}"] = [(r, o[kind][name]) for r, o in enumerate(outs)]
    for name, v in (outs[0].get("baseline") or {}).items():
        tensors[f"baseline/{name}"] = v
    if any(stats.get("skipped_steps", [])):
        features = features + ["loss-scale:overflow"]  # as the native target names it
    features = features + (setup_features(features[0], case) if features else [])
    return {"tensors": tensors, "replicas": replicas, "features": features, "stats": stats}


def baseline_optimizer(case):
    """The case as the single-device baseline runs it: a for-loop or foreach Adam over its low-precision
    parameters (the sharded run's are in a wider master_dtype) is the fused one (the arithmetic in float32)."""
    o = case["train"]["optimizer"]
    if case["train"]["dtype"] in ("bf16", "f16") and rounds_in_parameter_dtype(o):
        return {**case, "train": {**case["train"], "optimizer": {**o, "implementation": "fused"}}}
    return case


def single_device(case, inputs, attend=None):
    """The case on one device in its dtype with plain PyTorch: the framework's own rounding, which the
    oracle takes as a noise baseline beside its emulated one. In f64 too: where the math cancels, the
    framework's own rounding shows far above the f64 noise floor. `attend`: the attention core whose kernel the
    sharded run computes with (its framework's, e.g. flash attention under context parallelism), else the model's."""
    from .torch_model import build

    model, _ = build(case, inputs)
    if attend is not None:
        for layer in model.layers:
            if hasattr(layer, "attn"):
                layer.attn.attend = attend
    named = list(model.named_parameters())
    out = train(baseline_optimizer(case), inputs, model, [p for _, p in named], 0, 1, named=named)
    tensors = {f"loss/step{k}": np.array(l) for k, l in enumerate(out["losses"])}
    tensors["logits"] = out["logits"]
    tensors.update({f"grad/{n}": g for n, g in out["grads"].items()})
    tensors.update({f"param/{n}": p for n, p in out["params"].items()})
    return tensors
