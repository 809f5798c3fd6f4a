"""What every target shares: case helpers, op shapes, shard ranges, assembling full tensors from rank pieces."""

import math

import numpy as np

#: Op kinds as the Rust `OpKind` names them; a target implements all of them unless it says otherwise.
OP_KINDS = (
    "matmul", "linear", "sum", "max", "softmax", "layernorm", "embedding", "cross_entropy", "reshape", "transpose",
)


class HarnessError(Exception):
    """Our own worker failed to do its part (a gradient or an output it should have produced is missing):
    neither a pass nor a finding of the framework. The reply is `harness_error`."""


class Target:
    name = ""
    coverage_prefixes = ()
    #: The op kinds this target implements (op cases of another kind are `unsupported`).
    op_kinds = OP_KINDS
    #: Whether its attention turns queries and keys by the case's rotary position embedding (`model.rotary_base`;
    #: others refuse such cases).
    rotates = False
    #: Whether it builds parallel blocks (`model.layers` entries "parallel": attention and an MLP side by side on one
    #: norm's output; others refuse such cases).
    parallel_blocks = False
    #: Whether its attention normalises queries and keys per head as the case asks (`model.qk_norm`; others refuse).
    qk_norms = False
    #: Whether it leaves the case's frozen parameters (`train.frozen`) untrained (others refuse such cases).
    freezes = False
    #: Whether its loss smooths the labels as the case asks (`train.label_smoothing`; others refuse such cases).
    smooths_labels = False
    #: The norms its gradient clipping can bound (`train.clip_norm_type`; others refuse such cases).
    clip_norms = ("l2",)
    #: The layouts of `resume_after`'s checkpoint this target writes (`train.checkpoint_layout`; absent: sharded).
    checkpoint_layouts = ("sharded",)
    #: The parallel fields a resumed run may change (`train.resume_parallel`; cases changing others are refused).
    resumes_into = ()
    #: Whether it builds the optimizer implementation the case names (`train.optimizer.implementation`); for the
    #: others the field is dropped before the run (`as_offered`): the same update, by the target's default.
    optimizer_implementations = False

    def versions(self):
        return {}

    def vocabulary(self):
        """The library ops this target can run ([{name, variant, family}]): empty for most targets."""
        return []

    def before_fork(self):
        """Called before rank processes are forked (state they must not inherit is dropped here)."""

    def unsupported(self, case):
        return None

    def unsupported_op(self, case):
        """Why this target cannot run the op case, decided before running: an op kind it does not implement."""
        kind = case["op"]["kind"]
        if kind not in self.op_kinds:
            return f"{self.name} does not implement op {kind!r}"
        return None

    def world(self, case):
        p = case["parallel"]
        return p.get("dp", 1) * p.get("tp", 1) * p.get("pp", 1) * p.get("cp", 1)

    def init_rank(self, rank, world, timeout_s):
        pass

    def run_rank(self, rank, world, case, inputs):
        raise NotImplementedError

    def combine(self, case, outs):
        return outs[0]

    def run_local(self, case, inputs):
        raise NotImplementedError

    def single_device_seconds(self, case):
        """Seconds the case's op takes on one device in float64 (library-op cases), or None where the target
        cannot run it alone: a hang is no finding when the op alone does not finish in the case's time."""
        return None

    def single_device_refusal(self, case):
        """Why the single-device float64 run refuses this case (an edit made a call invalid), or None: ranks
        that all fail on such a case were asked something the op refuses anyway (a rejection, not a crash)."""
        return None


def grad_or_fail(name, grad):
    """`grad` unless it is None: a gradient the reference expects that the framework never produced is our
    harness's failure to collect it, never a zero to report."""
    if grad is None:
        raise HarnessError(f"no gradient came back for {name}")
    return grad


IGNORE_INDEX = -100
"""The label of a target the loss ignores (`data.ignored`), as torch's losses default to."""


def loss_denominator(inputs):
    """The loss mean's denominator over the whole batch of every rank: the targets the loss counts (all but
    the ignored), each by its class weight when the case has them (torch's weighted mean)."""
    targets = np.asarray(inputs["targets"])
    counted = targets[targets != IGNORE_INDEX]
    weights = inputs.get("class_weights")
    if weights is None or len(weights) == 0:
        return float(len(counted))
    return float(np.asarray(weights, dtype=np.float64)[counted].sum())


def class_weight(inputs, dtype):
    """The case's class weights as torch's cross_entropy takes them (`weight=`), or None."""
    import torch

    weights = inputs.get("class_weights")
    return None if weights is None or len(weights) == 0 else torch.tensor(np.asarray(weights), dtype=dtype)


def chunk_range(n, parts, index):
    """The slice `index` of `parts` holds under torch.chunk splitting (last pieces smaller or empty)."""
    c = -(-n // parts) if parts else n
    start = min(index * c, n)
    return start, min(start + c, n)


def micro_batches(n, count):
    """The non-empty [start, stop) row ranges of `count` accumulation micro-batches over n rows (sizes differing
    by at most one row, as train() takes them)."""
    bounds = np.linspace(0, n, count + 1).round().astype(int)
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(count) if bounds[i + 1] > bounds[i]]


def shard_ranges(shape, places, coord, mesh_shape):
    """Per tensor dim, the (start, stop) a mesh coordinate holds under placement strings `places` (one per
    mesh dim; `S(d)` as torch.chunk splits, nested in mesh-dimension order)."""
    ranges = [(0, n) for n in shape]
    for m, s in enumerate(places):
        if s.startswith("S("):
            d = int(s[2:-1])
            a, b = ranges[d]
            lo, hi = chunk_range(b - a, mesh_shape[m], coord[m])
            ranges[d] = (a + lo, a + hi)
    return ranges


def normalise_placements(places, ndim, mesh_ndim, floating):
    """A library-op case's placement strings for one argument, made valid for it: `S(d)` taken modulo the
    argument's dimensions (a 0-d argument is replicated), missing mesh dims replicated, partial only for
    floating-point arguments (an index or mask split into partial values is not one), and every partial
    dim given the reduction of the first one (nested mixed reductions have no single value)."""
    out = []
    for s in list(places)[:mesh_ndim] + ["R"] * (mesh_ndim - len(places)):
        if s.startswith("S("):
            s = f"S({int(s[2:-1]) % ndim})" if ndim else "R"
        if s.startswith("P") and not floating:
            s = "R"
        out.append(s)
    partials = [s for s in out if s.startswith("P")]
    return [partials[0] if s.startswith("P") else s for s in out]


def parallel(case):
    p = case["parallel"]
    return {k: p.get(k, d) for k, d in (("dp", 1), ("tp", 1), ("pp", 1), ("cp", 1), ("ep", 1))} | {
        "sequence_parallel": p.get("sequence_parallel", False),
        "sequence_parallel_mode": p.get("sequence_parallel_mode", "split_gather"),
        "zero_stage": p.get("zero_stage", 0),
        "zero_offload": p.get("zero_offload", False),
        "microbatches": p.get("microbatches", 1),
        "pipeline_schedule": p.get("pipeline_schedule", "gpipe"),
        "virtual_stages": p.get("virtual_stages", 1),
        "vocab_loss": p.get("vocab_loss", "target_default"),
        "reduce_bucket": p.get("reduce_bucket"),
        "overlap_comm": p.get("overlap_comm"),
        "reduce_scatter": p.get("reduce_scatter"),
        "grad_predivide": p.get("grad_predivide"),
        "sum_collectives": p.get("sum_collectives"),
        "explicit_grad_divide": p.get("explicit_grad_divide"),
        "contiguous_grads": p.get("contiguous_grads"),
        "round_robin_grads": p.get("round_robin_grads"),
        "zero_shard_group": p.get("zero_shard_group"),
        "static_graph": p.get("static_graph"),
        "find_unused": p.get("find_unused"),
        "flat_params": p.get("flat_params"),
        "param_buckets": p.get("param_buckets"),
        "reduce_to_owner": p.get("reduce_to_owner"),
        "overlap_param_gather": p.get("overlap_param_gather"),
        "sync_every_microbatch": p.get("sync_every_microbatch"),
        "zero_bubble": p.get("zero_bubble"),
        "dual_pipe": p.get("dual_pipe"),
        "ulysses_mpu": p.get("ulysses_mpu"),
        "cp_all_to_all": p.get("cp_all_to_all"),
        "tp_overlap_comm": p.get("tp_overlap_comm"),
        "auto_ep": p.get("auto_ep"),
        "breadth_first": p.get("breadth_first"),
        "param_shard_dim": p.get("param_shard_dim"),
        "persist_below": p.get("persist_below"),
        "optimizer_sub_group": p.get("optimizer_sub_group"),
        "reshard_group": p.get("reshard_group"),
        "vocab_divisible_by": p.get("vocab_divisible_by"),
        "prefetch_bucket": p.get("prefetch_bucket"),
        "max_live_parameters": p.get("max_live_parameters"),
        "max_reuse_distance": p.get("max_reuse_distance"),
        "framework_checkpoint": p.get("framework_checkpoint"),
    }


def vocab_padding_feature(prefix, vocab, divisor, tp):
    """The feature of the vocabulary padded to a multiple of `divisor` x `tp` rows (`vocab_divisible_by`): unpadded,
    padded with every rank holding a token, or with the last ranks holding padding rows only."""
    multiple = divisor * tp
    padded = -(-vocab // multiple) * multiple
    per_rank = padded // tp
    kind = "unpadded" if padded == vocab else "padded" if vocab > (tp - 1) * per_rank else "padding-only-shards"
    return f"{prefix}:vocab-{kind}"


def reshard_feature(group, shard_size):
    """The feature of resharding after the forward over groups of `group` ranks (`reshard_group`) out of the
    `shard_size` the states are sharded over: none (whole copies kept), partial, or full."""
    return f"reshard-{'none' if group == 1 else 'full' if group == shard_size else 'partial'}"


def zero_offloaded(case):
    """Whether the case offloads ZeRO's states to the host (`zero_offload`, read only with a ZeRO stage)."""
    p = parallel(case)
    return p["zero_offload"] and p["zero_stage"] > 0


def reduce_bucket(case, default):
    """Elements per data-parallel gradient-reduction bucket (the case's `reduce_bucket`; `default` where the case
    leaves it to the target)."""
    b = parallel(case)["reduce_bucket"]
    return default if b is None else b


def reduction_feature(prefix, case):
    """A coverage feature naming how the case buckets and overlaps the gradient reduction (`reduce_bucket`:
    the target's, a few elements, or a size of its own; `overlap_comm`: the target's, on or off), and where the
    case sets them, its collective (`reduce_scatter`) and pre-division factor (1, dp, or another)."""
    p = parallel(case)
    b, o = p["reduce_bucket"], p["overlap_comm"]
    bucket = "default" if b is None else "tiny" if b <= 8 else "sized"
    overlap = "default" if o is None else "on" if o else "off"
    feature = f"{prefix}:bucket-{bucket}:overlap-{overlap}"
    if p["reduce_scatter"] is not None:
        feature += ":reduce-scatter" if p["reduce_scatter"] else ":all-reduce"
    f = p["grad_predivide"]
    if f is not None:
        feature += ":predivide-" + ("1" if f == 1 else "dp" if f == p["dp"] else "other")
    return feature


def overlap_comm(case, default):
    """Whether the data-parallel gradient reduction overlaps the backward (the case's `overlap_comm`; `default`
    where the case leaves it to the target)."""
    o = parallel(case)["overlap_comm"]
    return default if o is None else o


def overlap_param_gather(case, default):
    """Whether the updated parameter partitions are all-gathered asynchronously after the step, each waited for at
    its next use (the case's `overlap_param_gather`; `default` where the case leaves it to the target)."""
    o = parallel(case)["overlap_param_gather"]
    return default if o is None else o


def param_gather_feature(prefix, case):
    """`prefix:param-gather-overlapped` / `prefix:param-gather-in-step` where the case sets `overlap_param_gather`."""
    if parallel(case)["overlap_param_gather"] is None:
        return []
    return [f"{prefix}:param-gather-{'overlapped' if overlap_param_gather(case, False) else 'in-step'}"]


def is_frozen(case, name):
    """Whether the case freezes the parameter `name` (`train.frozen`: name prefixes at a `.` boundary): it takes no
    gradient and no update."""
    return any(name == f or name.startswith(f + ".") for f in case["train"].get("frozen") or ())


def setup_features(prefix, case):
    """Features of how the model is trained: frozen parameters, activation checkpointing, blocks used several times,
    a rotary position embedding, MoE blocks (their top-k, an auxiliary loss, a capacity that can drop tokens)."""
    m = case.get("model") or {}
    recompute = m.get("activation_checkpointing")
    return ([f"{prefix}:frozen"] if case["train"].get("frozen") else []) + ([f"{prefix}:recompute-{recompute}"] if recompute else []) \
        + ([f"{prefix}:shared-blocks"] if m.get("layer_passes", 1) > 1 else []) \
        + ([f"{prefix}:rotary"] if m.get("rotary_base") is not None else []) + moe_setup_features(prefix, m) \
        + optimizer_features(prefix, case)


def optimizer_features(prefix, case):
    """The optimizer implementation a case asks for (`train.optimizer.implementation`), none for the default."""
    implementation = case["train"]["optimizer"].get("implementation")
    return [f"{prefix}:optimizer-{implementation}"] if implementation else []


def moe_setup_features(prefix, m):
    """Features of the model's MoE blocks (none without): the top-k, an auxiliary loss, a capacity that can drop
    tokens (fewer slots per expert than a sequence's tokens), renormalised gates, a shared expert."""
    case = {"model": m}
    moe = moe_of(case)
    if moe is None:
        return []
    return [f"{prefix}:moe-top{moe['top_k']}"] + ([f"{prefix}:moe-aux-loss"] if moe.get("aux_loss") else []) \
        + ([f"{prefix}:moe-capacity-drop"] if drops_tokens(case) else []) \
        + ([f"{prefix}:moe-renormalized"] if moe.get("renormalize") else []) \
        + ([f"{prefix}:moe-shared-expert"] if moe.get("shared_ffn") else [])


def moe_of(case):
    """The case's MoE settings (None without a `moe` block)."""
    m = case.get("model") or {}
    return m.get("moe") if "moe" in m.get("layers", ()) else None


def case_slots(case):
    """Slots per expert in one sequence, as the case model counts them: ceil(capacity_factor * seq * top_k /
    experts), in the same floating-point order."""
    m, moe = case["model"], moe_of(case)
    return math.ceil(moe["capacity_factor"] * float(m["seq"] * moe["top_k"]) / moe["experts"])


def drops_tokens(case):
    """Whether the case's capacity can drop a token (fewer slots per expert than a sequence's tokens)."""
    return case_slots(case) < case["model"]["seq"]


def unsupported_frozen(target, case):
    """Why `target` cannot run the case's frozen parameters (`train.frozen`), or None: only targets that set
    `freezes` leave them untrained (any other would train them, a different computation)."""
    if case.get("train", {}).get("frozen") and not target.freezes:
        return f"{target.name} trains every parameter (no train.frozen)"
    return None


def rotary_base(case):
    """The case's rotary position embedding base (`model.rotary_base`, a Llama's `rope_theta`), or None without one."""
    return (case.get("model") or {}).get("rotary_base")


def unsupported_rotary(target, case):
    """Why `target` cannot turn the case's queries and keys by position, or None: only targets that set `rotates`
    apply the rotary embedding (any other would attend without positions, a different computation)."""
    if rotary_base(case) is not None and not target.rotates:
        return f"{target.name} has no rotary position embedding (model.rotary_base)"
    return None


def unsupported_parallel_blocks(target, case):
    """Why `target` cannot build the case's parallel blocks, or None: only targets that set `parallel_blocks` do (any
    other would find a layer kind its model does not have)."""
    if "parallel" in (case.get("model") or {}).get("layers", ()) and not target.parallel_blocks:
        return f'{target.name} has no parallel blocks (model.layers "parallel": attention and an MLP on one norm)'
    return None


def unsupported_qk_norm(target, case):
    """Why `target` cannot normalise the case's queries and keys per head, or None: only targets that set `qk_norms`
    do (any other would attend without the norms, a different computation)."""
    if (case.get("model") or {}).get("qk_norm") and not target.qk_norms:
        return f"{target.name} has no query/key norms (model.qk_norm)"
    return None


def unsupported_model_vocabulary(target, case):
    """Why `target` cannot build the case's model as the case words it (a rotary embedding, parallel blocks,
    query/key norms), or None: each refused by name where the target lacks it."""
    return unsupported_rotary(target, case) or unsupported_parallel_blocks(target, case) or unsupported_qk_norm(target, case)


def label_smoothing(case):
    """The case's label smoothing ε (`train.label_smoothing`, torch's definition: 1 - ε on the target plus ε / V on
    each of the V vocabulary entries), 0.0 when absent."""
    return float(case.get("train", {}).get("label_smoothing") or 0.0)


def unsupported_label_smoothing(target, case):
    """Why `target` cannot smooth the case's labels, or None: only targets that set `smooths_labels` compute the
    smoothed loss (any other would compute the plain one, a different computation)."""
    if label_smoothing(case) and not target.smooths_labels:
        return f"{target.name} has no label smoothing (train.label_smoothing)"
    return None


def as_offered(target, case):
    """The case as `target` runs it: without `train.optimizer.implementation` where the target does not choose one
    (its own default implementation computes the same update)."""
    o = (case.get("train") or {}).get("optimizer") or {}
    if "implementation" not in o or target.optimizer_implementations:
        return case
    optimizer = {k: v for k, v in o.items() if k != "implementation"}
    return {**case, "train": {**case["train"], "optimizer": optimizer}}


def clip_norm(case):
    """The norm the case's gradient clipping bounds: "l1", "l2" or "inf" (`train.clip_norm_type`, l2 when absent)."""
    return (case.get("train") or {}).get("clip_norm_type") or "l2"


def unsupported_clip_norm(target, case):
    """Why `target` cannot clip by the case's norm, or None: only the norms in its `clip_norms` (a framework whose
    clipping takes no norm type would bound the L2 norm, a different computation)."""
    if (case.get("train") or {}).get("clip_grad_norm") is not None and clip_norm(case) not in target.clip_norms:
        return f"{target.name} clips by the {' / '.join(target.clip_norms)} norm only (train.clip_norm_type {clip_norm(case)})"
    return None


def resume_after(case):
    """The step count after which the run is checkpointed and resumed into fresh objects (the case's
    `train.resume_after`; 0 before the first step), or None for an uninterrupted run."""
    return case["train"].get("resume_after")


def checkpoint_layout(case):
    """How the case's resume checkpoint is laid out: "sharded" (absent too: the frameworks' default), "gathered" or
    "universal"."""
    return (case.get("train") or {}).get("checkpoint_layout") or "sharded"


def unsupported_checkpoint_layout(target, case):
    """Why `target` cannot write the case's checkpoint layout, or None: only those in its `checkpoint_layouts` (an op
    case has no training, nor a checkpoint)."""
    resumes = (case.get("train") or {}).get("resume_after") is not None
    if resumes and checkpoint_layout(case) not in target.checkpoint_layouts:
        return (f"{target.name} writes {' / '.join(target.checkpoint_layouts)} checkpoints only "
                f"(train.checkpoint_layout {checkpoint_layout(case)})")
    return None


def resumed_case(case):
    """The case as the run resumed from its checkpoint builds it: its `parallel` the case's `train.resume_parallel`
    where it has one (the case itself otherwise)."""
    q = (case.get("train") or {}).get("resume_parallel")
    return case if q is None else {**case, "parallel": q}


def resumed_layout_changes(case):
    """The parallel fields whose values the resumed run's layout changes (`train.resume_parallel`), sorted: each
    compared with its default filled in (parallel()), a field parallel() does not know as written."""
    def layout(c):
        return {**c["parallel"], **parallel(c)}

    saved, resumed = layout(case), layout(resumed_case(case))
    return sorted(k for k in saved.keys() | resumed.keys() if saved.get(k) != resumed.get(k))


def unsupported_resume_parallel(target, case):
    """Why `target` cannot resume the case into its `train.resume_parallel`, or None: only its `resumes_into`
    fields may change, and the resumed layout must be one it runs."""
    if (case.get("train") or {}).get("resume_parallel") is None:
        return None
    changed = [k for k in resumed_layout_changes(case) if k not in target.resumes_into]
    if changed:
        offered = ", ".join(target.resumes_into) or "none"
        return (f"{target.name} resumes into another layout of {offered} only "
                f"(train.resume_parallel changes {', '.join(changed)})")
    why = target.unsupported(resumed_case(case))
    return None if why is None else f"the resumed layout (train.resume_parallel): {why}"


def resume_feature(prefix, case):
    """`prefix:resumed-from-checkpoint` where the case checkpoints and resumes its run,
    `prefix:resumed-from-seed-checkpoint` where it does so before the first step (an optimizer without state), and
    `prefix:resumed-from-LAYOUT-checkpoint` where the checkpoint is gathered to one rank or universal
    (`train.checkpoint_layout`),
    `prefix:resumed-into-another-FIELD` for each parallel field the resumed run's layout changes
    (`train.resume_parallel`)."""
    k = resume_after(case)
    if k is None:
        return []
    return ([f"{prefix}:resumed-from-checkpoint"] + ([f"{prefix}:resumed-from-seed-checkpoint"] if k == 0 else [])
            + ([f"{prefix}:resumed-from-{checkpoint_layout(case)}-checkpoint"] if checkpoint_layout(case) != "sharded"
               else [])
            + [f"{prefix}:resumed-into-another-{field}" for field in resumed_layout_changes(case)])


def sync_every_microbatch(case, default):
    """Whether, with gradient accumulation, the data-parallel gradients are reduced after every micro-batch (or
    accumulated locally and reduced after the last): the case's `sync_every_microbatch`, `default` where the case
    leaves it to the target."""
    s = parallel(case)["sync_every_microbatch"]
    return default if s is None else s


def sync_feature(prefix, case, default):
    """`prefix:sync-every-microbatch` / `prefix:sync-last-microbatch` where the case sets the choice and accumulates."""
    if parallel(case)["sync_every_microbatch"] is None or case["train"].get("grad_accumulation", 1) < 2:
        return []
    return [f"{prefix}:sync-{'every' if sync_every_microbatch(case, default) else 'last'}-microbatch"]


def vocab_sharded_loss(case, default):
    """Whether the loss takes each tensor-parallel rank's vocabulary shard of the logits (the case's
    `vocab_loss`; `default` where the case leaves it to the target)."""
    v = parallel(case)["vocab_loss"]
    return default if v == "target_default" else v == "sharded"


def unsupported_sp_mode(case, name, modes=("split_gather",)):
    """Why target `name` cannot realise the case's sequence-parallel mode (it offers `modes`), or None."""
    p = parallel(case)
    if p["sequence_parallel"] and p["tp"] > 1 and p["sequence_parallel_mode"] not in modes:
        return f"{name} realises sequence parallelism as {' / '.join(modes)} only, not {p['sequence_parallel_mode']}"
    return None


def dtype_name(case):
    return case["train"]["dtype"]


def reduce_dtype_name(case):
    return case["train"].get("reduce_dtype") or case["train"]["dtype"]


def master_dtype_name(case):
    """The dtype the case keeps parameters and optimizer states in (`master_dtype`; absent: the compute dtype)."""
    return case["train"].get("master_dtype") or case["train"]["dtype"]


def assemble(shape, pieces):
    """Full tensor from `(ranges, local)` pieces, `ranges` one (start, stop) per dimension."""
    full = np.zeros(shape, dtype=np.float64)
    for ranges, local in pieces:
        idx = tuple(slice(a, b) for a, b in ranges)
        full[idx] = local
    return full


# ---------------------------------------------------------------------------------------- op shapes


def input_shapes(op):
    """Float inputs and their full shapes, as `OpKind::inputs` names them (in that order)."""
    shape = [int(s) for s in op["shape"]]
    s = lambda i: shape[i] if i < len(shape) else 1  # noqa: E731
    kind = op["kind"]
    table = {
        "matmul": [("a", (s(0), s(1))), ("b", (s(1), s(2)))],
        "linear": [("x", (s(0), s(1))), ("w", (s(1), s(2))), ("bias", (s(2),))],
        "layernorm": [("x", (s(0), s(1))), ("w", (s(1),)), ("bias", (s(1),))],
        "embedding": [("table", (s(1), s(2)))],
        "cross_entropy": [("logits", (s(0), s(1)))],
    }
    return table.get(kind, [("x", (s(0), s(1)))])


def output_shape(op):
    s = [int(d) for d in op["shape"]]
    dim = op_dim(op)
    kind = op["kind"]
    if kind in ("matmul", "linear", "embedding"):
        return (s[0], s[2])
    if kind in ("sum", "max"):
        return (1, s[1]) if dim == 0 else (s[0], 1)
    if kind == "cross_entropy":
        return (s[0], 1)
    if kind == "reshape":
        return tuple(int(d) for d in op.get("new_shape") or s)
    if kind == "transpose":
        return (s[1], s[0])
    return tuple(s)


def op_dim(op):
    """The reduced dim of sum / max / softmax: 0, or 1 for anything else (as ops.rs reads it)."""
    d = op.get("dim")
    return 0 if d is not None and int(d) == 0 else 1


def expected_outputs(case, inputs):
    """Names of the tensors the reference compares, which a completed run must return: an op's output and the
    gradient of every float input; a model's logits, losses, every trained parameter's gradient and every parameter's
    final value."""
    if "library_op" in case:
        # Which outputs and gradients exist depends on the sample; the oracle's reference (sent with
        # them) names them, and a name the sharded run lacks is sent as NaN with a note.
        return []
    if "op" in case:
        return ["out"] + [f"grad/{n}" for n, _ in input_shapes(case["op"])]
    params = [n for n in inputs if n not in ("tokens", "targets", "class_weights")]
    losses = [f"loss/step{k}" for k in range(case["train"]["steps"])]
    grads = [f"grad/{n}" for n in params if not is_frozen(case, n)]
    return ["logits"] + losses + grads + [f"param/{n}" for n in params]
