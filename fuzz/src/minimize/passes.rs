//! The shrink passes: each turns a case into candidates that change one thing towards simpler,
//! simplest first. The driver keeps a candidate only when it is valid, strictly simpler
//! ([`super::Complexity`]) and still fails the same way.

use shardfuzz_harnesses::case::{Case, Distribution, OptimizerKind, Placement, RankOrder, Real, Reduce, MIN_HIDDEN};
use shardfuzz_kernels::DType;

/// A named shrink pass.
pub struct Pass {
    pub name: &'static str,
    pub candidates: fn(&Case) -> Vec<Case>,
}

/// Every pass, in the order the driver runs them: the ones that remove most first.
pub const PASSES: &[Pass] = &[
    Pass { name: "fewer-ranks", candidates: fewer_ranks },
    Pass { name: "drop-strategies", candidates: drop_strategies },
    Pass { name: "fewer-layers", candidates: fewer_layers },
    Pass { name: "fewer-steps", candidates: fewer_steps },
    Pass { name: "smaller-dims", candidates: smaller_dims },
    Pass { name: "smaller-op-shape", candidates: smaller_op_shape },
    Pass { name: "simpler-placements", candidates: simpler_placements },
    Pass { name: "simpler-dtype", candidates: simpler_dtype },
    Pass { name: "simpler-data", candidates: simpler_data },
    Pass { name: "drop-features", candidates: drop_features },
];

/// Every candidate that drops a rank, a strategy, a realisation option, a data or a model feature.
pub(super) fn feature_drops(case: &Case) -> Vec<Case> {
    [fewer_ranks(case), drop_strategies(case), fewer_layers(case), simpler_data(case), drop_features(case)].concat()
}

fn with(case: &Case, f: impl FnOnce(&mut Case)) -> Case {
    let mut c = case.clone();
    f(&mut c);
    c
}

/// Smaller values of `x`, simplest first: 1, 2, then halves and x − 1.
fn smaller(x: u32) -> Vec<u32> {
    let mut v: Vec<u32> = [1, 2, x / 2, x.saturating_sub(1)].into_iter().filter(|&y| y >= 1 && y < x).collect();
    v.dedup();
    v.sort_unstable();
    v.dedup();
    v
}

fn fewer_ranks(case: &Case) -> Vec<Case> {
    if let Some(l) = &case.library_op {
        return fewer_mesh_ranks(case, &l.mesh);
    }
    let mut out = vec![];
    let p = &case.parallel;
    type Get = fn(&mut Case) -> &mut u32;
    let axes: [(u32, Get); 5] = [
        (p.pp, |c| &mut c.parallel.pp),
        (p.cp, |c| &mut c.parallel.cp),
        (p.dp, |c| &mut c.parallel.dp),
        (p.tp, |c| &mut c.parallel.tp),
        (p.ep, |c| &mut c.parallel.ep),
    ];
    for (degree, get) in axes {
        for d in smaller(degree) {
            out.push(with(case, |c| *get(c) = d));
        }
    }
    out
}

/// How many of the optional ways of realising a configuration a case sets (each the same result either way:
/// offloading, buckets, overlap, collectives, layouts, loss and sequence-parallel realisations, sparse
/// gradients, an accumulation dtype): a case without one is simpler, so dropping it is a shrink.
pub fn realisation_options(case: &Case) -> u64 {
    let (p, t) = (&case.parallel, &case.train);
    let set = [
        p.zero_offload,
        !p.vocab_loss.is_default(),
        !p.sequence_parallel_mode.is_default(),
        p.reduce_bucket.is_some(),
        p.overlap_comm.is_some(),
        p.reduce_scatter.is_some(),
        p.grad_predivide.is_some(),
        p.sum_collectives.is_some(),
        p.explicit_grad_divide.is_some(),
        p.contiguous_grads.is_some(),
        p.round_robin_grads.is_some(),
        p.zero_shard_group.is_some(),
        p.static_graph.is_some(),
        p.find_unused.is_some(),
        p.flat_params.is_some(),
        p.param_buckets.is_some(),
        p.reduce_to_owner.is_some(),
        p.overlap_param_gather.is_some(),
        p.sync_every_microbatch.is_some(),
        p.zero_bubble.is_some(),
        p.dual_pipe.is_some(),
        p.ulysses_mpu.is_some(),
        p.cp_all_to_all.is_some(),
        p.tp_overlap_comm.is_some(),
        p.auto_ep.is_some(),
        p.breadth_first.is_some(),
        p.param_shard_dim.is_some(),
        p.persist_below.is_some(),
        p.optimizer_sub_group.is_some(),
        p.reshard_group.is_some(),
        p.prefetch_bucket.is_some(),
        p.vocab_divisible_by.is_some(),
        p.max_live_parameters.is_some(),
        p.max_reuse_distance.is_some(),
        p.framework_checkpoint.is_some(),
        case.model.as_ref().is_some_and(|m| m.sparse_embedding),
        case.model.as_ref().is_some_and(|m| m.activation_checkpointing.is_some()),
        case.model.as_ref().is_some_and(|m| m.hf_model.is_some()),
        case.model.as_ref().is_some_and(|m| m.rotary_base.is_some()),
        case.model.as_ref().is_some_and(|m| m.qk_norm),
        t.grad_accum_dtype.is_some(),
        t.master_dtype.is_some(),
        t.resume_after.is_some(),
        t.checkpoint_layout.is_some(),
        t.resume_parallel.is_some(),
        !t.frozen.is_empty(),
        t.optimizer.no_decay_vectors,
        t.per_token_loss,
        t.local_mean_loss,
        t.compiled,
        t.optimizer.implementation.is_some(),
        t.clip_norm_type.is_some(),
        t.label_smoothing.is_some(),
        case.model.as_ref().and_then(|m| m.moe.as_ref()).is_some_and(|moe| moe.pad_to_capacity),
        case.model.as_ref().and_then(|m| m.moe.as_ref()).is_some_and(|moe| moe.renormalize),
        case.model.as_ref().and_then(|m| m.moe.as_ref()).is_some_and(|moe| moe.shared_ffn.is_some()),
        case.model.as_ref().and_then(|m| m.moe.as_ref()).is_some_and(|moe| moe.shared_gate),
    ];
    set.iter().filter(|&&x| x).count() as u64
}

fn drop_strategies(case: &Case) -> Vec<Case> {
    let p = &case.parallel;
    let mut out = vec![];
    if p.sequence_parallel {
        out.push(with(case, |c| c.parallel.sequence_parallel = false));
    }
    if p.zero_offload {
        out.push(with(case, |c| c.parallel.zero_offload = false));
    }
    if !p.vocab_loss.is_default() {
        out.push(with(case, |c| c.parallel.vocab_loss = Default::default()));
    }
    if p.reduce_bucket.is_some() {
        out.push(with(case, |c| c.parallel.reduce_bucket = None));
    }
    if p.overlap_comm.is_some() {
        out.push(with(case, |c| c.parallel.overlap_comm = None));
    }
    if p.reduce_scatter.is_some() {
        out.push(with(case, |c| c.parallel.reduce_scatter = None));
    }
    if p.grad_predivide.is_some() {
        out.push(with(case, |c| c.parallel.grad_predivide = None));
    }
    if p.contiguous_grads.is_some() {
        out.push(with(case, |c| c.parallel.contiguous_grads = None));
    }
    if p.round_robin_grads.is_some() {
        out.push(with(case, |c| c.parallel.round_robin_grads = None));
    }
    if p.zero_shard_group.is_some() {
        out.push(with(case, |c| c.parallel.zero_shard_group = None));
    }
    if p.static_graph.is_some() {
        out.push(with(case, |c| c.parallel.static_graph = None));
    }
    if p.sum_collectives.is_some() {
        out.push(with(case, |c| c.parallel.sum_collectives = None));
    }
    if p.explicit_grad_divide.is_some() {
        out.push(with(case, |c| c.parallel.explicit_grad_divide = None));
    }
    if p.find_unused.is_some() {
        out.push(with(case, |c| c.parallel.find_unused = None));
    }
    if p.flat_params.is_some() {
        out.push(with(case, |c| c.parallel.flat_params = None));
    }
    if p.param_buckets.is_some() {
        out.push(with(case, |c| c.parallel.param_buckets = None));
    }
    if p.reduce_to_owner.is_some() {
        out.push(with(case, |c| c.parallel.reduce_to_owner = None));
    }
    if p.overlap_param_gather.is_some() {
        out.push(with(case, |c| c.parallel.overlap_param_gather = None));
    }
    if p.sync_every_microbatch.is_some() {
        out.push(with(case, |c| c.parallel.sync_every_microbatch = None));
    }
    if p.zero_bubble.is_some() {
        out.push(with(case, |c| c.parallel.zero_bubble = None));
    }
    if p.dual_pipe.is_some() {
        out.push(with(case, |c| c.parallel.dual_pipe = None));
    }
    if p.ulysses_mpu.is_some() {
        out.push(with(case, |c| c.parallel.ulysses_mpu = None));
    }
    if p.cp_all_to_all.is_some() {
        out.push(with(case, |c| c.parallel.cp_all_to_all = None));
    }
    if p.tp_overlap_comm.is_some() {
        out.push(with(case, |c| c.parallel.tp_overlap_comm = None));
    }
    if p.auto_ep.is_some() {
        out.push(with(case, |c| c.parallel.auto_ep = None));
    }
    if p.breadth_first.is_some() {
        out.push(with(case, |c| c.parallel.breadth_first = None));
    }
    if p.param_shard_dim.is_some() {
        out.push(with(case, |c| c.parallel.param_shard_dim = None));
    }
    if p.persist_below.is_some() {
        out.push(with(case, |c| c.parallel.persist_below = None));
    }
    if p.optimizer_sub_group.is_some() {
        out.push(with(case, |c| c.parallel.optimizer_sub_group = None));
    }
    if p.reshard_group.is_some() {
        out.push(with(case, |c| c.parallel.reshard_group = None));
    }
    if p.vocab_divisible_by.is_some() {
        out.push(with(case, |c| c.parallel.vocab_divisible_by = None));
    }
    if p.prefetch_bucket.is_some() {
        out.push(with(case, |c| c.parallel.prefetch_bucket = None));
    }
    if p.max_live_parameters.is_some() {
        out.push(with(case, |c| c.parallel.max_live_parameters = None));
    }
    if p.max_reuse_distance.is_some() {
        out.push(with(case, |c| c.parallel.max_reuse_distance = None));
    }
    if case.model.as_ref().is_some_and(|m| m.sparse_embedding) {
        out.push(with(case, |c| c.model.as_mut().expect("a model case").sparse_embedding = false));
    }
    if p.framework_checkpoint.is_some() {
        out.push(with(case, |c| c.parallel.framework_checkpoint = None));
    }
    if case.model.as_ref().is_some_and(|m| m.activation_checkpointing.is_some()) {
        out.push(with(case, |c| {
            c.model.as_mut().expect("a model case").activation_checkpointing = None;
            c.parallel.framework_checkpoint = None;
        }));
    }
    if case.model.as_ref().is_some_and(|m| m.hf_model.is_some()) {
        out.push(with(case, |c| c.model.as_mut().expect("a model case").hf_model = None));
    }
    if case.model.as_ref().is_some_and(|m| m.rotary_base.is_some()) {
        out.push(with(case, |c| c.model.as_mut().expect("a model case").rotary_base = None));
    }
    if case.model.as_ref().is_some_and(|m| m.qk_norm) {
        out.push(with(case, |c| c.model.as_mut().expect("a model case").qk_norm = false));
    }
    if case.train.grad_accum_dtype.is_some() {
        out.push(with(case, |c| c.train.grad_accum_dtype = None));
    }
    if case.train.master_dtype.is_some() {
        out.push(with(case, |c| c.train.master_dtype = None));
    }
    if case.train.resume_after.is_some() {
        out.push(with(case, |c| (c.train.resume_after, c.train.checkpoint_layout, c.train.resume_parallel) = (None, None, None)));
    }
    if case.train.checkpoint_layout.is_some() {
        out.push(with(case, |c| c.train.checkpoint_layout = None));
    }
    if let Some(q) = &case.train.resume_parallel {
        out.push(with(case, |c| c.train.resume_parallel = None));
        // (each field the resumed layout changes set back to the saved layout's, one at a time)
        for name in q.differing_fields(&case.parallel) {
            let back = q.with_field_of(&case.parallel, &name);
            out.push(with(case, |c| c.train.resume_parallel = Some(back)));
        }
        let p = &case.parallel;
        if (q.dp, q.tp, q.cp) != (p.dp, p.tp, p.cp) {
            // (the degrees, traded against each other, only set back together)
            let back = q.with_field_of(p, "dp").with_field_of(p, "tp").with_field_of(p, "cp");
            out.push(with(case, |c| c.train.resume_parallel = Some(back)));
        }
    }
    if case.train.optimizer.no_decay_vectors {
        out.push(with(case, |c| c.train.optimizer.no_decay_vectors = false));
    }
    if case.train.optimizer.implementation.is_some() {
        out.push(with(case, |c| c.train.optimizer.implementation = None));
    }
    if case.train.per_token_loss {
        out.push(with(case, |c| c.train.per_token_loss = false));
    }
    if case.train.local_mean_loss {
        out.push(with(case, |c| c.train.local_mean_loss = false));
    }
    if case.train.compiled {
        out.push(with(case, |c| c.train.compiled = false));
    }
    if case.train.label_smoothing.is_some() {
        out.push(with(case, |c| c.train.label_smoothing = None));
    }
    for i in 0..case.train.frozen.len() {
        out.push(with(case, |c| _ = c.train.frozen.remove(i)));
    }
    if !p.sequence_parallel_mode.is_default() {
        out.push(with(case, |c| c.parallel.sequence_parallel_mode = Default::default()));
    }
    for z in 0..p.zero_stage {
        out.push(with(case, |c| c.parallel.zero_stage = z));
    }
    for m in smaller(p.microbatches) {
        out.push(with(case, |c| c.parallel.microbatches = m));
    }
    if p.pipeline_schedule != Default::default() {
        out.push(with(case, |c| {
            c.parallel.pipeline_schedule = Default::default();
            c.parallel.virtual_stages = 1;
        }));
    }
    for v in smaller(p.virtual_stages).into_iter().filter(|&v| v >= 2) {
        out.push(with(case, |c| c.parallel.virtual_stages = v));
    }
    if p.rank_order != RankOrder::default() {
        out.push(with(case, |c| c.parallel.rank_order = RankOrder::default()));
    }
    out
}

fn fewer_layers(case: &Case) -> Vec<Case> {
    let Some(m) = &case.model else { return vec![] };
    let n = m.layers.len();
    // Each block used once, then (from three passes) twice; then the last layer alone, then the first
    // alone, then one layer removed at a time.
    let mut out: Vec<Case> = (1..m.layer_passes).map(|k| with(case, |c| c.model.as_mut().unwrap().layer_passes = k)).collect();
    if n > 1 {
        out.push(with(case, |c| c.model.as_mut().unwrap().layers = vec![m.layers[n - 1]]));
        out.push(with(case, |c| c.model.as_mut().unwrap().layers = vec![m.layers[0]]));
        for i in 0..n {
            out.push(with(case, |c| {
                c.model.as_mut().unwrap().layers.remove(i);
            }));
        }
    }
    out
}

fn fewer_steps(case: &Case) -> Vec<Case> {
    let t = &case.train;
    let mut out = vec![];
    for s in smaller(t.steps) {
        out.push(with(case, |c| c.train.steps = s));
    }
    for a in smaller(t.grad_accumulation) {
        out.push(with(case, |c| c.train.grad_accumulation = a));
    }
    out
}

/// The degrees a size may be divided by in this case, with whether each divides `x`.
fn divisibility(case: &Case, x: u32) -> Vec<bool> {
    let p = &case.parallel;
    [p.tp, p.dp, p.cp, p.pp, p.ep, p.microbatches, p.dp * p.microbatches, 2 * p.cp].iter().map(|&d| d > 1 && x % d == 0).collect()
}

/// Smaller sizes, simplest first: the few smallest in the same divisibility class as `x` (the
/// class the failure may need) and the largest of them (the smallest step), then the plain
/// simplifications (1, 2, halves, x − 1), which may cross into another class.
fn smaller_same_class(case: &Case, x: u32) -> Vec<u32> {
    let class = divisibility(case, x);
    let mut v: Vec<u32> = (1..x).filter(|&y| divisibility(case, y) == class).take(4).collect();
    if let Some(last) = (1..x).rev().find(|&y| divisibility(case, y) == class) {
        v.push(last);
    }
    for y in smaller(x) {
        if !v.contains(&y) {
            v.push(y);
        }
    }
    v
}

fn smaller_dims(case: &Case) -> Vec<Case> {
    let Some(m) = &case.model else { return vec![] };
    type Get = fn(&mut Case) -> &mut u32;
    let dims: [(u32, Get); 6] = [
        (m.hidden, |c| &mut c.model.as_mut().unwrap().hidden),
        (m.ffn, |c| &mut c.model.as_mut().unwrap().ffn),
        (m.vocab, |c| &mut c.model.as_mut().unwrap().vocab),
        (m.seq, |c| &mut c.model.as_mut().unwrap().seq),
        (m.batch, |c| &mut c.model.as_mut().unwrap().batch),
        (m.heads, |c| &mut c.model.as_mut().unwrap().heads),
    ];
    let mut out = vec![];
    for (x, get) in dims {
        for y in smaller_same_class(case, x) {
            out.push(with(case, |c| *get(c) = y));
        }
    }
    // Fewer heads and key/value heads together (grouped-query attention needs kv | heads), and
    // hidden with heads (hidden is heads × head_dim).
    for kv in smaller(m.kv_heads) {
        out.push(with(case, |c| c.model.as_mut().unwrap().kv_heads = kv));
    }
    for h in smaller(m.heads) {
        out.push(with(case, |c| {
            let mm = c.model.as_mut().unwrap();
            mm.hidden = mm.hidden / m.heads * h;
            mm.heads = h;
            mm.kv_heads = mm.kv_heads.min(h);
        }));
    }
    if let Some(moe) = &m.moe {
        for e in smaller(moe.experts) {
            out.push(with(case, |c| c.model.as_mut().unwrap().moe.as_mut().unwrap().experts = e));
        }
        if moe.pad_to_capacity {
            out.push(with(case, |c| c.model.as_mut().unwrap().moe.as_mut().unwrap().pad_to_capacity = false));
        }
        if moe.renormalize {
            out.push(with(case, |c| c.model.as_mut().unwrap().moe.as_mut().unwrap().renormalize = false));
        }
        if moe.shared_ffn.is_some() {
            out.push(with(case, |c| {
                let moe = c.model.as_mut().unwrap().moe.as_mut().unwrap();
                (moe.shared_ffn, moe.shared_gate) = (None, false);
            }));
        }
        if moe.shared_gate {
            out.push(with(case, |c| c.model.as_mut().unwrap().moe.as_mut().unwrap().shared_gate = false));
        }
        for fs in moe.shared_ffn.map(smaller).unwrap_or_default() {
            out.push(with(case, |c| c.model.as_mut().unwrap().moe.as_mut().unwrap().shared_ffn = Some(fs)));
        }
        for k in smaller(moe.top_k) {
            out.push(with(case, |c| c.model.as_mut().unwrap().moe.as_mut().unwrap().top_k = k));
        }
    }
    // Not into degenerate norms (MIN_HIDDEN) where the case was not there already: a divergence that survives there
    // may be round-off no reference can bound.
    out.retain(|c| c.model.as_ref().is_some_and(|mm| mm.hidden >= MIN_HIDDEN.min(m.hidden)));
    out
}

fn smaller_op_shape(case: &Case) -> Vec<Case> {
    let Some(op) = &case.op else { return vec![] };
    let mut out = vec![];
    for (i, &x) in op.shape.iter().enumerate() {
        for y in smaller_same_class(case, x) {
            out.push(with(case, |c| c.op.as_mut().unwrap().shape[i] = y));
        }
    }
    out
}

fn lib(c: &mut Case) -> &mut shardfuzz_harnesses::case::LibraryOp {
    c.library_op.as_mut().expect("a library-op case")
}

/// A library op's mesh with a dimension dropped (its placements with it) or made smaller.
fn fewer_mesh_ranks(case: &Case, mesh: &[u32]) -> Vec<Case> {
    let mut out = vec![];
    if mesh.len() > 1 {
        for m in 0..mesh.len() {
            out.push(with(case, |c| {
                let l = lib(c);
                l.mesh.remove(m);
                l.placements.iter_mut().chain(l.redistribute.iter_mut()).chain(l.sources.iter_mut()).for_each(|p| {
                    if m < p.len() {
                        p.remove(m);
                    }
                });
            }));
        }
    }
    for (m, &d) in mesh.iter().enumerate() {
        for smaller_d in smaller(d) {
            out.push(with(case, |c| lib(c).mesh[m] = smaller_d));
        }
    }
    out
}

/// A library op's placements one step simpler (P(max) → P → S(0) → R), trailing arguments
/// replicated, or the backward pass dropped.
fn simpler_library_placements(case: &Case) -> Vec<Case> {
    let Some(l) = &case.library_op else { return vec![] };
    let mut out = vec![];
    if !l.placements.is_empty() {
        out.push(with(case, |c| {
            lib(c).placements.pop();
        }));
    }
    for i in 0..l.redistribute.len() {
        out.push(with(case, |c| {
            lib(c).redistribute.remove(i);
        }));
    }
    if !l.sources.is_empty() {
        out.push(with(case, |c| lib(c).sources.clear()));
    }
    for (arg, places) in l.sources.iter().enumerate() {
        if l.placements.get(arg) != Some(places) {
            out.push(with(case, |c| {
                let l = lib(c);
                l.sources[arg] = l.placements.get(arg).cloned().unwrap_or_else(|| vec![Placement::Replicate; l.mesh.len()]);
            }));
        }
    }
    for i in 0..l.views.len() {
        out.push(with(case, |c| {
            lib(c).views.remove(i);
        }));
    }
    for i in 0..l.edits.len() {
        out.push(with(case, |c| {
            lib(c).edits.remove(i);
        }));
    }
    if l.warmup.len() > 1 {
        out.push(with(case, |c| lib(c).warmup.clear()));
    }
    if !l.cotangent.is_empty() {
        out.push(with(case, |c| lib(c).cotangent.clear()));
    }
    if l.cotangent_in_dtype {
        out.push(with(case, |c| lib(c).cotangent_in_dtype = false));
    }
    for i in 0..l.warmup.len() {
        out.push(with(case, |c| {
            lib(c).warmup.remove(i);
        }));
    }
    for (arg, places) in l.placements.iter().enumerate() {
        for (m, pl) in places.iter().enumerate() {
            let simpler: &[Placement] = match pl {
                Placement::Partial(Reduce::Sum) => &[Placement::Replicate, Placement::Shard(0)],
                Placement::Partial(_) => &[Placement::Replicate, Placement::PARTIAL],
                Placement::Shard(_) => &[Placement::Replicate],
                Placement::Replicate => &[],
            };
            for s in simpler {
                out.push(with(case, |c| lib(c).placements[arg][m] = *s));
            }
        }
    }
    if l.backward {
        out.push(with(case, |c| lib(c).backward = false));
    }
    out
}

fn simpler_placements(case: &Case) -> Vec<Case> {
    if case.library_op.is_some() {
        return simpler_library_placements(case);
    }
    let Some(op) = &case.op else { return vec![] };
    let mut out = vec![];
    for (name, places) in &op.placements {
        for (m, pl) in places.iter().enumerate() {
            // Partial → Shard → Replicate.
            let simpler: &[Placement] = match pl {
                Placement::Partial(_) => &[Placement::Replicate, Placement::Shard(0)],
                Placement::Shard(_) => &[Placement::Replicate],
                Placement::Replicate => &[],
            };
            for s in simpler {
                out.push(with(case, |c| c.op.as_mut().unwrap().placements.get_mut(name).unwrap()[m] = *s));
            }
        }
    }
    out
}

/// Rank of a dtype in simplicity: f64 first, then f32.
pub fn dtype_rank(d: DType) -> u8 {
    match d {
        DType::F64 => 0,
        DType::F32 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
    }
}

fn simpler_dtype(case: &Case) -> Vec<Case> {
    let mut out = vec![];
    if case.train.reduce_dtype.is_some() {
        out.push(with(case, |c| c.train.reduce_dtype = None));
    }
    for d in [DType::F64, DType::F32] {
        if dtype_rank(d) < dtype_rank(case.train.dtype) {
            out.push(with(case, |c| {
                c.train.dtype = d;
                c.train.reduce_dtype = None;
            }));
            out.push(with(case, |c| c.train.dtype = d));
        }
    }
    out
}

fn simpler_data(case: &Case) -> Vec<Case> {
    let mut out = vec![];
    if case.data.distribution != Distribution::Normal {
        out.push(with(case, |c| c.data.distribution = Distribution::Normal));
    }
    if case.data.ignored.is_some() {
        out.push(with(case, |c| c.data.ignored = None));
    }
    if case.data.class_weights {
        out.push(with(case, |c| c.data.class_weights = false));
    }
    out
}

fn drop_features(case: &Case) -> Vec<Case> {
    let mut out = vec![];
    let t = &case.train;
    if t.clip_grad_norm.is_some() {
        out.push(with(case, |c| (c.train.clip_grad_norm, c.train.clip_norm_type) = (None, None)));
    }
    if t.clip_norm_type.is_some() {
        out.push(with(case, |c| c.train.clip_norm_type = None));
    }
    if t.loss_scale.is_some() {
        out.push(with(case, |c| c.train.loss_scale = None));
    }
    if t.optimizer.kind != OptimizerKind::Sgd {
        out.push(with(case, |c| c.train.optimizer.kind = OptimizerKind::Sgd));
    }
    if t.optimizer.weight_decay.0 != 0.0 {
        out.push(with(case, |c| c.train.optimizer.weight_decay = Real(0.0)));
    }
    if let Some(m) = &case.model {
        if m.bias {
            out.push(with(case, |c| c.model.as_mut().unwrap().bias = false));
        }
        if m.tied_embeddings {
            out.push(with(case, |c| c.model.as_mut().unwrap().tied_embeddings = false));
        }
        if m.moe.is_some() && !m.layers.contains(&shardfuzz_harnesses::case::LayerKind::Moe) {
            out.push(with(case, |c| c.model.as_mut().unwrap().moe = None));
        }
        if m.activation != Default::default() {
            out.push(with(case, |c| c.model.as_mut().unwrap().activation = Default::default()));
        }
    }
    if let Some(op) = &case.op {
        if op.new_shape.is_some() || op.dim.is_some_and(|d| d != 1) {
            out.push(with(case, |c| c.op.as_mut().unwrap().dim = None));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_values_are_ordered_and_below() {
        assert_eq!(smaller(8), vec![1, 2, 4, 7]);
        assert_eq!(smaller(2), vec![1]);
        assert!(smaller(1).is_empty());
    }

    #[test]
    fn dropping_any_strategy_or_realisation_option_is_simpler() {
        use super::super::Complexity;
        use shardfuzz_harnesses::case::{SequenceParallelMode, VocabLoss};

        let mut case = crate::generate::random_case(7);
        let p = &mut case.parallel;
        (p.dp, p.tp, p.zero_stage, p.sequence_parallel, p.zero_offload) = (2, 2, 2, true, true);
        p.sequence_parallel_mode = SequenceParallelMode::ALL.iter().copied().find(|m| !m.is_default()).unwrap();
        p.vocab_loss = VocabLoss::Sharded;
        (p.reduce_bucket, p.overlap_comm, p.reduce_scatter, p.grad_predivide) = (Some(5), Some(true), Some(false), Some(2));
        (p.contiguous_grads, p.round_robin_grads, p.zero_shard_group) = (Some(false), Some(true), Some(1));
        (p.static_graph, p.reduce_to_owner, p.find_unused, p.flat_params) = (Some(true), Some(true), Some(false), Some(true));
        p.param_buckets = Some(true);
        (p.sum_collectives, p.explicit_grad_divide) = (Some(true), Some(true));
        (p.overlap_param_gather, p.sync_every_microbatch, p.param_shard_dim) = (Some(true), Some(false), Some(1));
        (p.zero_bubble, p.dual_pipe, p.breadth_first, p.ulysses_mpu) = (Some(true), Some(true), Some(true), Some(true));
        (p.cp_all_to_all, p.tp_overlap_comm, p.auto_ep) = (Some(true), Some(true), Some(true));
        (p.persist_below, p.optimizer_sub_group, p.reshard_group) = (Some(16), Some(100), Some(1));
        (p.prefetch_bucket, p.max_live_parameters, p.max_reuse_distance) = (Some(0), Some(9), Some(0));
        p.framework_checkpoint = Some(shardfuzz_harnesses::case::FrameworkCheckpoint::Contiguous);
        p.vocab_divisible_by = Some(64);
        case.train.grad_accum_dtype = Some(DType::F32);
        (case.train.dtype, case.train.master_dtype) = (DType::BF16, Some(DType::F32));
        (case.train.steps, case.train.resume_after) = (3, Some(2));
        let m = case.model.as_mut().expect("a model case");
        (m.sparse_embedding, m.activation_checkpointing) = (true, Some(shardfuzz_harnesses::case::Recompute::Reentrant));
        m.hf_model = Some(shardfuzz_harnesses::case::HfModel::Qwen2);
        let before = Complexity::of(&case);
        let candidates = drop_strategies(&case);
        assert!(candidates.len() >= 30, "{} candidates", candidates.len());
        for c in candidates {
            assert!(Complexity::of(&c).strictly_simpler_than(&before), "{:?}", c.parallel);
        }
    }

    #[test]
    fn every_data_simplification_is_simpler() {
        use super::super::Complexity;
        use shardfuzz_harnesses::case::{IgnorePattern, Ignored, Real};

        let mut case = crate::generate::random_case(7);
        case.data.distribution = Distribution::Large;
        case.data.ignored = Some(Ignored { fraction: Real(0.5), pattern: IgnorePattern::ALL[0] });
        case.data.class_weights = true;
        let before = Complexity::of(&case);
        let candidates = simpler_data(&case);
        assert_eq!(candidates.len(), 3);
        for c in candidates {
            assert!(Complexity::of(&c).strictly_simpler_than(&before), "{:?}", c.data);
        }
    }

    #[test]
    fn unfreezing_one_prefix_and_fewer_passes_without_blocks_are_simpler() {
        use super::super::Complexity;

        let mut case = crate::generate::random_case(7);
        case.train.frozen = vec!["lm_head".into(), "final_norm".into()];
        let m = case.model.as_mut().expect("a model case");
        (m.layers, m.layer_passes) = (vec![], 2);
        let before = Complexity::of(&case);
        let candidates = [drop_strategies(&case), fewer_layers(&case)].concat();
        let unfrozen = candidates.iter().find(|c| c.train.frozen.len() == 1).expect("one prefix unfrozen");
        assert!(Complexity::of(unfrozen).strictly_simpler_than(&before));
        let one_pass = candidates.iter().find(|c| c.model.as_ref().unwrap().layer_passes == 1).expect("one pass");
        assert!(Complexity::of(one_pass).strictly_simpler_than(&before));
    }
}
