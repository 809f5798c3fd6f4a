//! Mutators of the parallel configuration.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shardfuzz_harnesses::case::{
    Axis, Case, Parallel, PipelineSchedule, SequenceParallelMode, VocabLoss, MAX_GRAD_PREDIVIDE, MAX_REDUCE_BUCKET, MAX_VOCAB_DIVISOR,
};

/// A choice the target makes by default that a case may force either way.
const ON_OFF_OR_TARGETS: [Option<bool>; 3] = [None, Some(false), Some(true)];

/// One of `choices` other than `current`, at random.
pub(super) fn another<T: Copy + PartialEq>(current: T, choices: &[T], rng: &mut ChaCha8Rng) -> T {
    let others: Vec<T> = choices.iter().copied().filter(|x| *x != current).collect();
    *others.choose(rng).expect("a choice besides the current one")
}

/// Tensor parallelism switched on (tp 2) where the case has none, for a mutation towards a tensor-parallel setting.
fn ensure_tensor_parallel(c: &mut Case) {
    if c.parallel.tp == 1 {
        c.parallel.tp = 2;
    }
}

/// Data parallelism switched on (dp 2) where the case has none, for a mutation towards a data-parallel setting.
fn ensure_data_parallel(c: &mut Case) {
    if c.parallel.dp == 1 {
        c.parallel.dp = 2;
    }
}

fn divisors(n: u32) -> Vec<u32> {
    (1..=n.max(1)).filter(|d| n % d == 0).collect()
}

fn relevant_dim(case: &Case, rng: &mut ChaCha8Rng) -> u32 {
    match &case.model {
        Some(m) => *[m.hidden, m.ffn, m.heads, m.vocab, m.seq, m.batch].choose(rng).unwrap_or(&1),
        None => case.op.as_ref().map_or(4, |o| *o.shape.choose(rng).unwrap_or(&4)),
    }
}

fn pick_axis(rng: &mut ChaCha8Rng) -> &'static str {
    ["tp", "tp", "dp", "pp"].choose(rng).copied().unwrap_or("tp")
}

fn set_degree(case: &mut Case, axis: &str, v: u32) -> bool {
    let p = &mut case.parallel;
    let slot = match axis {
        "tp" => &mut p.tp,
        "dp" => &mut p.dp,
        _ => &mut p.pp,
    };
    let changed = *slot != v;
    *slot = v;
    changed
}

/// A degree set to a divisor of a dimension of the case.
pub fn degree_divisor(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let d = relevant_dim(c, rng);
    let small: Vec<u32> = divisors(d).into_iter().filter(|&x| x <= 4).collect();
    let v = *small.choose(rng).unwrap_or(&1);
    let axis = pick_axis(rng);
    set_degree(c, axis, v)
}

/// A degree set to a non-divisor of a dimension of the case.
pub fn degree_non_divisor(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let d = relevant_dim(c, rng);
    let options: Vec<u32> = (2..=4).filter(|x| d % x != 0).collect();
    let Some(&v) = options.choose(rng) else { return false };
    let axis = pick_axis(rng);
    set_degree(c, axis, v)
}

/// Micro-batches below, equal to, or above the pipeline depth.
pub fn microbatches_vs_pipeline(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let pp = c.parallel.pp;
    let v = match rng.gen_range(0..3) {
        0 => pp.saturating_sub(1).max(1),
        1 => pp,
        _ => pp + rng.gen_range(1..=2),
    };
    if c.parallel.pp == 1 && rng.gen_bool(0.5) {
        c.parallel.pp = 2;
    }
    let changed = c.parallel.microbatches != v;
    c.parallel.microbatches = v;
    changed
}

pub fn zero_stage(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let v = rng.gen_range(0..=3);
    ensure_data_parallel(c);
    let changed = c.parallel.zero_stage != v;
    c.parallel.zero_stage = v;
    changed
}

pub fn toggle_sequence_parallel(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    c.parallel.sequence_parallel = !c.parallel.sequence_parallel;
    ensure_tensor_parallel(c);
    true
}

/// Another realisation of sequence parallelism (sequence parallelism switched on with it).
pub fn sequence_parallel_mode(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.sequence_parallel_mode = another(c.parallel.sequence_parallel_mode, &SequenceParallelMode::ALL, rng);
    c.parallel.sequence_parallel = true;
    ensure_tensor_parallel(c);
    true
}

/// ZeRO optimizer states offloaded to the host, or back (a ZeRO stage switched on with it).
pub fn zero_offload(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.zero_offload = !c.parallel.zero_offload;
    ensure_zero(c, rng);
    true
}

/// Another realisation of the loss on a tensor-parallel LM head, or the target's default (tensor parallelism
/// switched on with it).
pub fn vocab_loss(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.vocab_loss = another(c.parallel.vocab_loss, &VocabLoss::ALL, rng);
    ensure_tensor_parallel(c);
    true
}

/// Another multiple the vocabulary is padded to per tensor-parallel rank: none (1), a few rows, one that
/// leaves the last ranks with padding only (at least the vocabulary), a framework default (64, 128), or the
/// target's own (tensor parallelism switched on with it).
pub fn vocab_divisible_by(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let vocab = c.model.as_ref().map_or(64, |m| m.vocab).clamp(1, MAX_VOCAB_DIVISOR);
    let choices = [None, Some(1), Some(2), Some(3), Some(vocab), Some(64), Some(128)];
    c.parallel.vocab_divisible_by = another(c.parallel.vocab_divisible_by, &choices, rng);
    ensure_tensor_parallel(c);
    true
}

/// Another size of the data-parallel gradient-reduction bucket (data parallelism switched on with it):
/// around one parameter's size (a bucket that exactly holds it, or one element short or over), a few
/// elements, or back to the target's own.
pub fn reduce_bucket(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let size = around_a_parameter(c, rng, &[1, 2, 3, 7, 64]).map(|n| n.max(1));
    if size == c.parallel.reduce_bucket {
        return false;
    }
    c.parallel.reduce_bucket = size;
    ensure_data_parallel(c);
    true
}

/// The gradient reduction overlapped with the backward, not overlapped, or the target's own choice
/// (data parallelism switched on with it).
pub fn overlap_comm(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.overlap_comm = another(c.parallel.overlap_comm, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    true
}

/// The gradient reduction as a reduce-scatter, as all-reduces, or the target's own choice (data parallelism
/// switched on with it).
pub fn reduce_scatter(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.reduce_scatter = another(c.parallel.reduce_scatter, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    true
}

/// Another gradient pre-division factor: the boundary values of its arithmetic (1, and the data-parallel
/// degree, where the post-division is 1), another small factor, or none (data parallelism switched on with it).
pub fn grad_predivide(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    ensure_data_parallel(c);
    let dp = c.parallel.dp.min(MAX_GRAD_PREDIVIDE);
    let factor = match rng.gen_range(0..4) {
        0 => None,
        1 => Some(1),
        2 => Some(dp),
        _ => Some(rng.gen_range(1..=8)),
    };
    if factor == c.parallel.grad_predivide {
        return false;
    }
    c.parallel.grad_predivide = factor;
    true
}

/// Gradients in contiguous reduction buffers, kept per parameter, or the target's own choice (data
/// parallelism switched on with it).
pub fn contiguous_grads(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.contiguous_grads = another(c.parallel.contiguous_grads, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    true
}

/// Parameters dealt to the ZeRO partitions round robin, in model order, or the target's own choice (a ZeRO
/// stage and data parallelism switched on with it).
pub fn round_robin_grads(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.round_robin_grads = another(c.parallel.round_robin_grads, &ON_OFF_OR_TARGETS, rng);
    ensure_zero(c, rng);
    true
}

/// Hybrid sharding within groups of another divisor of dp (1: replicated, dp: plain sharding, and the proper
/// divisors between), or none; dp raised to 4 where it has no proper divisor.
pub fn zero_shard_group(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.zero_shard_group = another_group_of_ranks(c, c.parallel.zero_shard_group, rng);
    true
}

/// Another divisor of dp than `current`, or none; dp raised to 4 in most draws where it has no proper divisor,
/// and data parallelism switched on.
fn another_group_of_ranks(c: &mut Case, current: Option<u32>, rng: &mut ChaCha8Rng) -> Option<u32> {
    if c.parallel.dp < 4 && rng.gen_bool(0.75) {
        c.parallel.dp = 4;
    }
    ensure_data_parallel(c);
    let mut choices: Vec<Option<u32>> = divisors(c.parallel.dp).into_iter().map(Some).collect();
    choices.push(None);
    another(current, &choices, rng)
}

/// The same parameters in every step relied on, found out each step, or the target's own choice (data
/// parallelism switched on with it).
pub fn static_graph(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.static_graph = another(c.parallel.static_graph, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    true
}

/// The gradient reduction's collectives as plain sums, averaging themselves, or the target's own choice (data
/// parallelism switched on with it).
pub fn sum_collectives(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.sum_collectives = another(c.parallel.sum_collectives, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    true
}

/// The data-parallel average's divisor handed to the framework, derived by it, or the target's own choice (data
/// parallelism switched on with it).
pub fn explicit_grad_divide(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.explicit_grad_divide = another(c.parallel.explicit_grad_divide, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    true
}

/// The reducer searching each step's graph for parameters without a gradient, expecting one for every parameter,
/// or the target's own choice (data parallelism switched on with it).
pub fn find_unused(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.find_unused = another(c.parallel.find_unused, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    true
}

/// Each wrapped unit's parameters as one flat parameter, the original parameters as views into it, or the target's own
/// choice (data parallelism switched on with it).
pub fn flat_params(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.flat_params = another(c.parallel.flat_params, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    true
}

/// Bucket slices reduced to their owning rank only, the whole bucket all-reduced, or the target's own choice (a
/// ZeRO stage and data parallelism switched on with it).
pub fn reduce_to_owner(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    zero_choice(c, rng, &ON_OFF_OR_TARGETS, |p| &mut p.reduce_to_owner)
}

/// Each rank's optimizer partition packed into one parameter bucket, kept as separate parameters, or the target's own
/// choice (a ZeRO stage and data parallelism switched on with it).
pub fn param_buckets(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    zero_choice(c, rng, &ON_OFF_OR_TARGETS, |p| &mut p.param_buckets)
}

/// Parameter partitions all-gathered asynchronously after the step (waited for at their first use), before the
/// step returns, or the target's own choice (a ZeRO stage and data parallelism switched on with it).
pub fn overlap_param_gather(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    zero_choice(c, rng, &ON_OFF_OR_TARGETS, |p| &mut p.overlap_param_gather)
}

/// Gradients reduced after every accumulated micro-batch, only after the last, or the target's own choice (data
/// parallelism and gradient accumulation switched on with it).
pub fn sync_every_microbatch(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.sync_every_microbatch = another(c.parallel.sync_every_microbatch, &ON_OFF_OR_TARGETS, rng);
    ensure_data_parallel(c);
    if c.train.grad_accumulation == 1 {
        c.train.grad_accumulation = 2;
    }
    true
}

/// Parameters sharded along dimension 1 (where it divides evenly), 0, or the target's own choice (a ZeRO stage and
/// data parallelism switched on with it).
pub fn param_shard_dim(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    zero_choice(c, rng, &[Some(0), Some(1), None], |p| &mut p.param_shard_dim)
}

/// Another of `choices` for the ZeRO setting in `slot`, a ZeRO stage (and data parallelism) switched on with it.
fn zero_choice<T: Copy + PartialEq>(c: &mut Case, rng: &mut ChaCha8Rng, choices: &[T], slot: fn(&mut Parallel) -> &mut T) -> bool {
    let setting = slot(&mut c.parallel);
    *setting = another(*setting, choices, rng);
    ensure_zero(c, rng);
    true
}

/// Another size below which parameters stay whole on every rank (ZeRO-3 switched on with it): around one
/// parameter's size (exactly it, one element short or over, so it persists or not), every parameter, none, or
/// back to the target's own.
pub fn persist_below(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    zero3_size(c, rng, &[0, MAX_REDUCE_BUCKET], |p| &mut p.persist_below)
}

/// Another optimizer sub-group size (ZeRO-3 switched on with it): around one parameter's size, a few elements
/// (a group per parameter), or back to the target's own.
pub fn optimizer_sub_group(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    // (A size one element short of a 1-element parameter would be 0: a sub-group holds at least one.)
    let size = around_a_parameter(c, rng, &[1, 2, 7, 64]).map(|n| n.max(1));
    ensure_zero3(c);
    replace(&mut c.parallel.optimizer_sub_group, size)
}

/// Parameters resharded after the forward over groups of another divisor of dp (the proper ones, and 1 and dp
/// themselves), or none (ZeRO-3 switched on with it; dp raised to 4 where it has no proper divisor).
pub fn reshard_group(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.reshard_group = another_group_of_ranks(c, c.parallel.reshard_group, rng);
    ensure_zero3(c);
    true
}

/// Another prefetch size (ZeRO-3 switched on with it): none ahead (0), one element, around one parameter's
/// size (so that it is prefetched with the one before or not), or back to the target's own.
pub fn prefetch_bucket(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    zero3_size(c, rng, &[0, 1], |p| &mut p.prefetch_bucket)
}

/// Another cap on the gathered parameters alive at once (ZeRO-3 switched on with it): none or one element,
/// around one parameter's size, or back to the target's own.
pub fn max_live_parameters(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    zero3_size(c, rng, &[0, 1], |p| &mut p.max_live_parameters)
}

/// Another distance within which a gathered parameter is kept for its next use (ZeRO-3 switched on with it):
/// 0 (released after every use), around one parameter's size, every use apart, or back to the target's own.
pub fn max_reuse_distance(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    zero3_size(c, rng, &[0, MAX_REDUCE_BUCKET], |p| &mut p.max_reuse_distance)
}

/// A ZeRO-3 size setting drawn around a parameter's size (or one of `fixed`, or none) into `slot`, ZeRO-3 switched
/// on with it; whether the setting changed.
fn zero3_size(c: &mut Case, rng: &mut ChaCha8Rng, fixed: &[u32], slot: fn(&mut Parallel) -> &mut Option<u32>) -> bool {
    let size = around_a_parameter(c, rng, fixed);
    ensure_zero3(c);
    replace(slot(&mut c.parallel), size)
}

/// None, one of `fixed`, or a size within one element of a random parameter's.
fn around_a_parameter(c: &Case, rng: &mut ChaCha8Rng, fixed: &[u32]) -> Option<u32> {
    let numels: Vec<usize> = c.model.as_ref().map(|m| m.params().iter().map(|p| p.numel()).collect()).unwrap_or_default();
    match (rng.gen_range(0..4), numels.choose(rng)) {
        (0, _) => None,
        (1, _) | (_, None) => Some(*fixed.choose(rng).expect("sizes")),
        (_, Some(&n)) => Some((n as i64 + rng.gen_range(-1..=1)).clamp(0, MAX_REDUCE_BUCKET as i64) as u32),
    }
}

fn replace(slot: &mut Option<u32>, value: Option<u32>) -> bool {
    let changed = *slot != value;
    *slot = value;
    changed
}

fn ensure_zero3(c: &mut Case) {
    c.parallel.zero_stage = 3;
    ensure_data_parallel(c);
}

fn ensure_zero(c: &mut Case, rng: &mut ChaCha8Rng) {
    if c.parallel.zero_stage == 0 {
        c.parallel.zero_stage = rng.gen_range(1..=2);
    }
    ensure_data_parallel(c);
}

/// The embedding's gradient as a sparse tensor, or dense again (data parallelism switched on with it; a model
/// case only).
pub fn sparse_embedding(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = c.model.as_mut() else { return false };
    m.sparse_embedding = !m.sparse_embedding;
    ensure_data_parallel(c);
    true
}

pub fn rank_order(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let mut axes = Axis::ALL;
    axes.shuffle(rng);
    let changed = c.parallel.rank_order.0 != axes;
    c.parallel.rank_order.0 = axes;
    changed
}

/// Backward split into input- and weight-gradient parts scheduled into the pipeline's bubbles (zero bubble), not, or the
/// target's own choice; pipeline parallelism switched on with it, under a schedule that holds several stages per rank.
pub fn zero_bubble(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let p = &mut c.parallel;
    p.zero_bubble = another(p.zero_bubble, &ON_OFF_OR_TARGETS, rng);
    p.pp = p.pp.max(2);
    p.microbatches = p.microbatches.max(p.pp);
    if p.pipeline_schedule == PipelineSchedule::Gpipe {
        p.pipeline_schedule = *[PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved].choose(rng).unwrap();
        p.virtual_stages = if p.pipeline_schedule == PipelineSchedule::Interleaved { 2 } else { 1 };
    }
    true
}

/// DeepSeek's DualPipeV under 1F1B, not, or the target's own choice; pipeline parallelism switched on with it, the
/// schedule 1F1B, at least as many micro-batches as its 2 pp stages.
pub fn dual_pipe(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let p = &mut c.parallel;
    p.dual_pipe = another(p.dual_pipe, &ON_OFF_OR_TARGETS, rng);
    p.pp = p.pp.max(2);
    (p.pipeline_schedule, p.virtual_stages) = (PipelineSchedule::OneFOneB, 1);
    p.microbatches = p.microbatches.max(2 * p.pp);
    true
}

/// Context parallelism: a cp degree of 2 to 4 (each rank holds a part of every sequence), or back to none; half the
/// time the sequence is rounded up to a multiple of it (else it stays as it is, which cp may not divide).
pub fn context_parallel(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let cp = if c.parallel.cp > 1 && rng.gen_bool(0.25) { 1 } else { another(c.parallel.cp, &[2, 3, 4], rng) };
    c.parallel.cp = cp;
    if cp > 1 && rng.gen_bool(0.5) {
        sequence_multiple_of_cp(c);
    }
    true
}

/// Context parallelism switched on (cp 2 where it was off) for a mutation of one of its options, the sequence a
/// multiple of cp.
fn context_parallel_on(c: &mut Case) {
    if c.parallel.cp == 1 {
        c.parallel.cp = 2;
    }
    sequence_multiple_of_cp(c);
}

/// The model's sequence rounded up to a multiple of the case's cp.
fn sequence_multiple_of_cp(c: &mut Case) {
    let cp = c.parallel.cp;
    if let Some(m) = c.model.as_mut() {
        m.seq = m.seq.div_ceil(cp) * cp;
    }
}

/// Context parallelism's sequence-parallel groups from the framework's own sequence-parallel unit, from its config's
/// device mesh, or the target's choice; context parallelism switched on with it (cp 2, the sequence a multiple of it).
pub fn ulysses_mpu(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.ulysses_mpu = another(c.parallel.ulysses_mpu, &ON_OFF_OR_TARGETS, rng);
    context_parallel_on(c);
    true
}

/// Ring attention's key/value shards rotated by all-to-all, by all-gather, or the target's own choice; context
/// parallelism switched on with it (cp 2, the sequence a multiple of it).
pub fn cp_all_to_all(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.cp_all_to_all = another(c.parallel.cp_all_to_all, &ON_OFF_OR_TARGETS, rng);
    context_parallel_on(c);
    true
}

/// Column-parallel layers overlapping their input gradient's all-reduce with the weight gradient, not, or the target's
/// own choice; tensor parallelism switched on with it (tp 2 where it was off).
pub fn tp_overlap_comm(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.parallel.tp_overlap_comm = another(c.parallel.tp_overlap_comm, &ON_OFF_OR_TARGETS, rng);
    if c.parallel.tp == 1 {
        c.parallel.tp = 2;
    }
    true
}

/// A rank's interleaved stages run breadth first (looped BFS), depth first, or the target's own choice; pipeline
/// parallelism switched on with it, under the interleaved schedule.
pub fn breadth_first(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let p = &mut c.parallel;
    p.breadth_first = another(p.breadth_first, &ON_OFF_OR_TARGETS, rng);
    p.pp = p.pp.max(2);
    if p.pipeline_schedule != PipelineSchedule::Interleaved {
        (p.pipeline_schedule, p.virtual_stages) = (PipelineSchedule::Interleaved, 2);
    }
    p.microbatches = p.microbatches.max(p.pp);
    true
}

/// Another pipeline schedule; interleaved with 2 to 4 model chunks per rank.
pub fn schedule(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let p = &mut c.parallel;
    p.pipeline_schedule = another(p.pipeline_schedule, &PipelineSchedule::ALL, rng);
    p.virtual_stages = if p.pipeline_schedule == PipelineSchedule::Interleaved { rng.gen_range(2..=4) } else { 1 };
    true
}

/// World size 1: every degree back to 1 (the single-device baseline configuration).
pub fn world_size_one(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    let p = &mut c.parallel;
    let changed = p.world() != 1;
    p.dp = 1;
    p.tp = 1;
    p.pp = 1;
    p.ep = 1;
    changed
}

/// Expert parallelism over the data-parallel group.
pub fn expert_parallel(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    ensure_data_parallel(c);
    let v = *divisors(c.parallel.dp).choose(rng).unwrap_or(&1);
    let changed = c.parallel.ep != v;
    c.parallel.ep = v;
    changed
}

/// The MoE blocks made expert parallel by the framework's replacement of the model's own MoE modules, by its MoE
/// layer, or the target's own choice (a case with MoE blocks only).
pub fn auto_ep(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    if c.model.as_ref().and_then(|m| m.moe.as_ref()).is_none() {
        return false;
    }
    c.parallel.auto_ep = another(c.parallel.auto_ep, &ON_OFF_OR_TARGETS, rng);
    true
}
