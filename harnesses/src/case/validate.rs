//! Structural validation of a case. Every violated rule is reported, each naming its field.

use shardfuzz_kernels::DType;

use super::{
    Case, LayerKind, LibraryOp, Model, OpCase, OpKind, Parallel, PipelineSchedule, Placement, Reduce, Train, MAX_MESH_DIMS, MAX_MESH_RANKS,
    MAX_SAMPLE_EDITS, MAX_VIEWS,
};

/// Bounds a case must respect.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most ranks a case may ask for.
    pub max_world: u64,
    /// Most bytes of tensors a case may need (estimate over reference, baseline and sharded runs).
    pub memory_budget: u64,
    pub max_steps: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_world: 64, memory_budget: 64 << 20, max_steps: 64 }
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub rule: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

#[derive(Default)]
struct Report(Vec<Violation>);

impl Report {
    fn fail(&mut self, field: impl Into<String>, rule: impl Into<String>) {
        self.0.push(Violation { field: field.into(), rule: rule.into() });
    }
    fn at_least_one(&mut self, field: &str, v: u64) {
        if v < 1 {
            self.fail(field, format!("must be at least 1 (got {v})"));
        }
    }
    fn finite_at_least(&mut self, field: &str, v: f64, min: f64, strict: bool) {
        let ok = v.is_finite() && if strict { v > min } else { v >= min };
        if !ok {
            let op = if strict { ">" } else { "≥" };
            self.fail(field, format!("must be finite and {op} {min} (got {v})"));
        }
    }
}

impl Case {
    /// Checks every structural rule and returns all violations.
    pub fn validate(&self, limits: &Limits) -> Result<(), Vec<Violation>> {
        let mut r = Report::default();
        if self.schema != super::SCHEMA_VERSION {
            r.fail("schema", format!("must be {} (got {})", super::SCHEMA_VERSION, self.schema));
        }
        let checkpointed = self.model.as_ref().is_some_and(|m| m.activation_checkpointing.is_some());
        validate_parallel(&self.parallel, "parallel", checkpointed, limits, &mut r);
        if let Some(q) = &self.train.resume_parallel {
            validate_parallel(q, "train.resume_parallel", checkpointed, limits, &mut r);
            if self.train.resume_after.is_none() {
                r.fail("train.resume_parallel", "only with train.resume_after (the checkpoint it resumes from)");
            }
            if q.world() != self.parallel.world() {
                r.fail(
                    "train.resume_parallel",
                    format!("must keep the world size dp*tp*pp*cp = {} of `parallel` (got {})", self.parallel.world(), q.world()),
                );
            }
        }
        match (&self.model, &self.op, &self.library_op) {
            (Some(m), None, None) => validate_model(m, &mut r),
            (None, Some(o), None) => validate_op(o, &mut r),
            (None, None, Some(l)) => validate_library_op(l, &mut r),
            _ => r.fail("model", "exactly one of `model`, `op` and `library_op` must be present"),
        }
        validate_train(&self.train, limits, &mut r);
        validate_frozen(self, &mut r);
        if let Some(ig) = &self.data.ignored {
            let f = ig.fraction.get();
            if !(f.is_finite() && (0.0..1.0).contains(&f)) {
                r.fail("data.ignored.fraction", format!("must be finite, ≥ 0 and < 1 (got {f})"));
            }
            if self.model.is_none() {
                r.fail("data.ignored", "only model cases have targets to ignore");
            }
        }
        if self.data.class_weights && self.model.is_none() {
            r.fail("data.class_weights", "only model cases have a loss to weight");
        }
        if self.train.label_smoothing.is_some() {
            if self.model.is_none() {
                r.fail("train.label_smoothing", "only model cases have a loss to smooth");
            } else if self.data.class_weights {
                r.fail("train.label_smoothing", "not with data.class_weights (a weighted smoothed loss is not modelled)");
            }
        }
        if r.0.is_empty() {
            let bytes = self.estimated_bytes();
            if bytes > limits.memory_budget {
                r.fail(
                    if self.model.is_some() { "model" } else { "op.shape" },
                    format!(
                        "tensors need about {:.1} MiB, over the memory budget of {:.1} MiB",
                        bytes as f64 / (1 << 20) as f64,
                        limits.memory_budget as f64 / (1 << 20) as f64
                    ),
                );
            }
        }
        if r.0.is_empty() {
            Ok(())
        } else {
            Err(r.0)
        }
    }

    /// Rough upper estimate of the tensor bytes of one run of this case (every target and copy).
    pub fn estimated_bytes(&self) -> u64 {
        let elems: u64 = if let Some(m) = &self.model {
            let params: u64 = m.params().iter().map(|p| p.numel() as u64).sum();
            let t = m.tokens() as u64;
            let (h, f, v) = (m.hidden as u64, m.ffn as u64, m.vocab as u64);
            let experts = m.moe.as_ref().map_or(1, |c| c.experts as u64);
            let shared = m.moe.as_ref().and_then(|c| c.shared_ffn).unwrap_or(0) as u64;
            let per_layer = t * (12 * h + 4 * f * experts.min(4) + 4 * shared) + t * m.seq as u64 * m.heads as u64 * 2;
            let acts = per_layer * m.block_sequence().len() as u64 + t * (4 * h + 3 * v);
            // param, grad, two optimizer states, initial copy; activations kept for backward.
            params * 5 + acts * 2
        } else if let Some(o) = &self.op {
            let s: Vec<u64> = o.shape.iter().map(|&d| d as u64).collect();
            let n: u64 = match o.kind {
                OpKind::Matmul | OpKind::Linear => s[0] * s[1] + s[1] * s[2] + s[0] * s[2],
                OpKind::Embedding => s[1] * s[2] + s[0] * s[2],
                _ => s.iter().product(),
            };
            n * 4
        } else {
            0
        };
        // reference, perturbed reference, dtype baseline, sharded target (+ per-rank copies)
        elems * 8 * (3 + self.parallel.world().min(8))
    }
}

/// The rules of a parallel layout (`parallel`, or `train.resume_parallel`: `prefix` names it); `checkpointed`: the
/// model has activation checkpointing for `framework_checkpoint` to run.
fn validate_parallel(p: &Parallel, prefix: &str, checkpointed: bool, limits: &Limits, r: &mut Report) {
    for (name, v) in [("dp", p.dp), ("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep), ("microbatches", p.microbatches)] {
        r.at_least_one(&format!("{prefix}.{name}"), v as u64);
    }
    match (p.pipeline_schedule, p.virtual_stages) {
        (PipelineSchedule::Interleaved, v) if !(2..=8).contains(&v) => {
            r.fail(format!("{prefix}.virtual_stages"), format!("must be 2 to 8 under the interleaved schedule (got {v})"))
        }
        (s, v) if s != PipelineSchedule::Interleaved && v != 1 => {
            r.fail(format!("{prefix}.virtual_stages"), format!("must be 1 unless pipeline_schedule is interleaved (got {v})"))
        }
        _ => {}
    }
    if let Some(b) = p.reduce_bucket {
        if !(1..=MAX_REDUCE_BUCKET).contains(&b) {
            r.fail(format!("{prefix}.reduce_bucket"), format!("must be 1 to {MAX_REDUCE_BUCKET} elements (got {b})"));
        }
    }
    if let Some(b) = p.persist_below {
        if b > MAX_REDUCE_BUCKET {
            r.fail(format!("{prefix}.persist_below"), format!("must be 0 to {MAX_REDUCE_BUCKET} elements (got {b})"));
        }
    }
    if let Some(d) = p.param_shard_dim.filter(|&d| d > 3) {
        r.fail(format!("{prefix}.param_shard_dim"), format!("must be 0 to 3 (got {d})"));
    }
    if let Some(n) = p.vocab_divisible_by.filter(|n| !(1..=MAX_VOCAB_DIVISOR).contains(n)) {
        r.fail(format!("{prefix}.vocab_divisible_by"), format!("must be 1 to {MAX_VOCAB_DIVISOR} (got {n})"));
    }
    for (field, value) in [
        ("prefetch_bucket", p.prefetch_bucket),
        ("max_live_parameters", p.max_live_parameters),
        ("max_reuse_distance", p.max_reuse_distance),
    ] {
        if let Some(n) = value.filter(|&n| n > MAX_REDUCE_BUCKET) {
            r.fail(format!("{prefix}.{field}"), format!("must be 0 to {MAX_REDUCE_BUCKET} elements (got {n})"));
        }
    }
    if let Some(g) = p.optimizer_sub_group {
        if !(1..=MAX_REDUCE_BUCKET).contains(&g) {
            r.fail(format!("{prefix}.optimizer_sub_group"), format!("must be 1 to {MAX_REDUCE_BUCKET} elements (got {g})"));
        }
    }
    if let Some(f) = p.grad_predivide {
        if !(1..=MAX_GRAD_PREDIVIDE).contains(&f) {
            r.fail(format!("{prefix}.grad_predivide"), format!("must be 1 to {MAX_GRAD_PREDIVIDE} (got {f})"));
        }
    }
    if let Some(g) = p.zero_shard_group {
        if g == 0 || p.dp % g != 0 {
            r.fail(format!("{prefix}.zero_shard_group"), format!("must divide dp = {} (got {g})", p.dp));
        }
    }
    if let Some(g) = p.reshard_group {
        if g == 0 || p.dp % g != 0 {
            r.fail(format!("{prefix}.reshard_group"), format!("must divide dp = {} (got {g})", p.dp));
        }
    }
    if let Some(f) = p.framework_checkpoint {
        if !checkpointed {
            r.fail(
                format!("{prefix}.framework_checkpoint"),
                format!("needs model.activation_checkpointing: the blocks it checkpoints (got \"{}\")", f.name()),
            );
        }
    }
    if p.zero_stage > 3 {
        r.fail(format!("{prefix}.zero_stage"), format!("must be 0, 1, 2 or 3 (got {})", p.zero_stage));
    }
    if p.world() > limits.max_world {
        r.fail(prefix, format!("world dp*tp*pp*cp = {} exceeds the maximum of {} ranks", p.world(), limits.max_world));
    }
}

fn validate_model(m: &Model, r: &mut Report) {
    for (name, v) in [
        ("vocab", m.vocab),
        ("hidden", m.hidden),
        ("ffn", m.ffn),
        ("heads", m.heads),
        ("kv_heads", m.kv_heads),
        ("seq", m.seq),
        ("batch", m.batch),
    ] {
        r.at_least_one(&format!("model.{name}"), v as u64);
    }
    if m.heads >= 1 && m.hidden >= 1 && m.hidden % m.heads != 0 {
        r.fail(
            "model.hidden",
            format!("must be a multiple of model.heads so heads have equal size (hidden {} heads {})", m.hidden, m.heads),
        );
    }
    if m.heads >= 1 && m.kv_heads >= 1 && m.heads % m.kv_heads != 0 {
        r.fail(
            "model.kv_heads",
            format!("must divide model.heads for grouped-query attention (heads {} kv_heads {})", m.heads, m.kv_heads),
        );
    }
    if let Some(base) = m.rotary_base {
        if base < 2 {
            r.fail("model.rotary_base", format!("must be at least 2 (got {base})"));
        }
        if m.heads >= 1 && m.hidden % m.heads == 0 && (m.hidden / m.heads) % 2 != 0 {
            let d = m.hidden / m.heads;
            r.fail("model.rotary_base", format!("needs an even head size hidden / heads to turn pairs (got {d})"));
        }
    }
    if m.layer_passes < 1 || m.layer_passes > super::model::MAX_LAYER_PASSES {
        let max = super::model::MAX_LAYER_PASSES;
        r.fail("model.layer_passes", format!("must be between 1 and {max} (got {})", m.layer_passes));
    }
    let has_moe = m.layers.contains(&LayerKind::Moe);
    match (&m.moe, has_moe) {
        (None, true) => r.fail("model.moe", "must be present when model.layers contains \"moe\""),
        (Some(c), _) => {
            r.at_least_one("model.moe.experts", c.experts as u64);
            if c.top_k < 1 || c.top_k > c.experts {
                r.fail("model.moe.top_k", format!("must be between 1 and model.moe.experts = {} (got {})", c.experts, c.top_k));
            }
            r.finite_at_least("model.moe.capacity_factor", c.capacity_factor.get(), 0.0, true);
            if let Some(a) = c.aux_loss {
                r.finite_at_least("model.moe.aux_loss", a.get(), 0.0, false);
            }
            match c.shared_ffn {
                Some(fs) => r.at_least_one("model.moe.shared_ffn", fs as u64),
                None if c.shared_gate => r.fail("model.moe.shared_gate", "needs model.moe.shared_ffn (a shared expert to gate)"),
                None => {}
            }
        }
        (None, false) => {}
    }
}

fn validate_op(o: &OpCase, r: &mut Report) {
    let want = o.kind.shape_len();
    if o.shape.len() != want {
        r.fail("op.shape", format!("{:?} takes {want} sizes {} (got {})", o.kind, o.kind.shape_help(), o.shape.len()));
        return;
    }
    for (i, &d) in o.shape.iter().enumerate() {
        r.at_least_one(&format!("op.shape[{i}]"), d as u64);
    }
    if let Some(dim) = o.dim {
        if dim > 1 {
            r.fail("op.dim", format!("must be 0 or 1 (got {dim})"));
        }
    }
    match (o.kind, &o.new_shape) {
        (OpKind::Reshape, None) => r.fail("op.new_shape", "is required for reshape"),
        (OpKind::Reshape, Some(ns)) => {
            let a: u64 = o.shape.iter().map(|&d| d as u64).product();
            let b: u64 = ns.iter().map(|&d| d as u64).product();
            if ns.len() != 2 || a != b {
                r.fail("op.new_shape", format!("must be two sizes with the same number of elements as op.shape ({a}), got {ns:?}"));
            }
        }
        _ => {}
    }
    let shape: Vec<usize> = o.shape.iter().map(|&d| d as usize).collect();
    let inputs = o.kind.inputs(&shape);
    for (name, places) in &o.placements {
        let field = format!("op.placements.{name}");
        let Some((_, ishape)) = inputs.iter().find(|(n, _)| n == name) else {
            let names: Vec<_> = inputs.iter().map(|(n, _)| *n).collect();
            r.fail(field, format!("is not an input of {:?} (inputs: {})", o.kind, names.join(", ")));
            continue;
        };
        if places.len() != 2 {
            r.fail(field.clone(), format!("must give one placement per mesh dimension [dp, tp] (got {})", places.len()));
        }
        for pl in places {
            match pl {
                Placement::Shard(d) if *d >= ishape.len() => {
                    r.fail(&field, format!("S({d}) names a dimension the {}-d input does not have", ishape.len()))
                }
                Placement::Partial(red) if *red != Reduce::Sum => {
                    r.fail(&field, format!("{pl}: built-in op cases take partial sums (\"P\") only; other reductions are for library_op"))
                }
                _ => {}
            }
        }
    }
}

fn validate_library_op(l: &LibraryOp, r: &mut Report) {
    if l.name.trim().is_empty() {
        r.fail("library_op.name", "must name an op of the target's vocabulary (`shardfuzz targets --ops`)");
    }
    if l.mesh.is_empty() || l.mesh.len() > MAX_MESH_DIMS {
        r.fail("library_op.mesh", format!("must have 1 to {MAX_MESH_DIMS} dimensions (got {})", l.mesh.len()));
    }
    for (i, &d) in l.mesh.iter().enumerate() {
        r.at_least_one(&format!("library_op.mesh[{i}]"), d as u64);
    }
    if l.world() > MAX_MESH_RANKS {
        r.fail("library_op.mesh", format!("{:?} has {} ranks, more than {MAX_MESH_RANKS}", l.mesh, l.world()));
    }
    if !l.cotangent.is_empty() && l.cotangent.len() != l.mesh.len() {
        r.fail(
            "library_op.cotangent",
            format!("must give one placement per mesh dimension ({}, got {}), or none", l.mesh.len(), l.cotangent.len()),
        );
    }
    if l.cotangent.iter().any(|p| matches!(p, Placement::Partial(Reduce::Max | Reduce::Min))) {
        r.fail("library_op.cotangent", "a gradient is partial by sum or average only (P or P(avg)), never by max or min");
    }
    for (name, lists) in [("placements", &l.placements), ("sources", &l.sources), ("redistribute", &l.redistribute)] {
        for (i, places) in lists.iter().enumerate() {
            if places.len() != l.mesh.len() {
                r.fail(
                    format!("library_op.{name}[{i}]"),
                    format!("must give one placement per mesh dimension ({}, got {})", l.mesh.len(), places.len()),
                );
            }
        }
    }
    if l.redistribute.len() > MAX_REDISTRIBUTIONS {
        r.fail(
            "library_op.redistribute",
            format!("must hold at most {MAX_REDISTRIBUTIONS} redistributions (got {})", l.redistribute.len()),
        );
    }
    if l.views.len() > MAX_VIEWS {
        r.fail("library_op.views", format!("must hold at most {MAX_VIEWS} views (got {})", l.views.len()));
    }
    if l.warmup.len() > MAX_SAMPLE_EDITS {
        r.fail("library_op.warmup", format!("must hold at most {MAX_SAMPLE_EDITS} sample edits (got {})", l.warmup.len()));
    }
    if l.edits.len() > MAX_SAMPLE_EDITS {
        r.fail("library_op.edits", format!("must hold at most {MAX_SAMPLE_EDITS} sample edits (got {})", l.edits.len()));
    }
    for (i, places) in l.redistribute.iter().enumerate() {
        if places.iter().any(|p| matches!(p, Placement::Partial(_))) {
            r.fail(
                format!("library_op.redistribute[{i}]"),
                "must be Shard or Replicate (an output is redistributed to a placement it can be gathered from)",
            );
        }
    }
}

/// The longest chain of output redistributions a library-op case may ask for.
pub const MAX_REDISTRIBUTIONS: usize = 4;

/// The largest gradient-reduction bucket a case may ask for (2^26 elements: larger than any case model,
/// small enough for every framework's size arithmetic).
pub const MAX_REDUCE_BUCKET: u32 = 1 << 26;

/// The largest gradient pre-division factor a case may ask for.
pub const MAX_GRAD_PREDIVIDE: u32 = 64;
/// Largest `parallel.vocab_divisible_by` (Megatron's default is 128).
pub const MAX_VOCAB_DIVISOR: u32 = 4096;

/// `train.frozen` names parameters of the model, and leaves at least one to train.
fn validate_frozen(c: &Case, r: &mut Report) {
    let t = &c.train;
    if t.frozen.is_empty() {
        return;
    }
    let Some(m) = &c.model else {
        return r.fail("train.frozen", "only model cases have parameters to freeze");
    };
    let names: Vec<String> = m.params().into_iter().map(|p| p.name).collect();
    for (i, f) in t.frozen.iter().enumerate() {
        if !names.iter().any(|n| super::train::freezes(f, n)) {
            r.fail(format!("train.frozen[{i}]"), format!("must name a parameter of the model or a module above one (got {f:?})"));
        }
    }
    if names.iter().all(|n| t.is_frozen(n)) {
        r.fail("train.frozen", "must leave at least one parameter to train (it freezes every one)");
    }
}

fn validate_train(t: &Train, limits: &Limits, r: &mut Report) {
    r.at_least_one("train.steps", t.steps as u64);
    if t.steps > limits.max_steps {
        r.fail("train.steps", format!("must be at most {} (got {})", limits.max_steps, t.steps));
    }
    r.at_least_one("train.grad_accumulation", t.grad_accumulation as u64);
    let o = &t.optimizer;
    r.finite_at_least("train.optimizer.lr", o.lr.get(), 0.0, false);
    r.finite_at_least("train.optimizer.eps", o.eps.get(), 0.0, true);
    r.finite_at_least("train.optimizer.weight_decay", o.weight_decay.get(), 0.0, false);
    for (name, b) in [("beta1", o.beta1.get()), ("beta2", o.beta2.get())] {
        if !(0.0..1.0).contains(&b) {
            r.fail(format!("train.optimizer.{name}"), format!("must be in [0, 1) (got {b})"));
        }
    }
    if let Some(c) = t.clip_grad_norm {
        r.finite_at_least("train.clip_grad_norm", c.get(), 0.0, true);
    }
    if t.clip_norm_type.is_some() && t.clip_grad_norm.is_none() {
        r.fail("train.clip_norm_type", "only with train.clip_grad_norm (the norm that clipping bounds)");
    }
    if let Some(s) = t.loss_scale {
        r.finite_at_least("train.loss_scale", s.get(), 0.0, true);
    }
    if let Some(e) = t.label_smoothing {
        let e = e.get();
        if !(e > 0.0 && e < 1.0) {
            r.fail("train.label_smoothing", format!("must be greater than 0 and less than 1 (got {e})"));
        }
    }
    if let Some(k) = t.resume_after {
        if k >= t.steps {
            r.fail("train.resume_after", format!("must be less than train.steps ({}) (got {k})", t.steps));
        }
    }
    if t.checkpoint_layout.is_some() && t.resume_after.is_none() {
        r.fail("train.checkpoint_layout", "only with train.resume_after (the checkpoint it lays out)");
    }
    if let Some(m) = t.master_dtype {
        let wider = matches!(m, DType::F32 | DType::F64) && m.unit_roundoff() < t.dtype.unit_roundoff();
        if m != t.dtype && !wider {
            r.fail("train.master_dtype", format!("must be the compute dtype or a wider one, f32 or f64 (got {m} for {})", t.dtype));
        }
    }
}
