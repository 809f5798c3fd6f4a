//! Mutators of the training step and the data.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shardfuzz_harnesses::case::{
    Case, CheckpointLayout, ClipNorm, Distribution, IgnorePattern, Ignored, LayerKind, OptimizerImplementation, OptimizerKind, Parallel,
    PipelineSchedule, Real,
};
use shardfuzz_kernels::DType;

pub fn dtype(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let d = *DType::ALL.choose(rng).unwrap_or(&DType::F32);
    let t = &mut c.train;
    let changed = t.dtype != d;
    t.dtype = d;
    t.reduce_dtype = match rng.gen_range(0..3) {
        0 => Some(DType::F32),
        1 => Some(d),
        _ => None,
    };
    if d == DType::F16 && rng.gen_bool(0.5) {
        t.loss_scale = Some(Real(*[256.0, 4096.0, 65536.0].choose(rng).unwrap_or(&1024.0)));
    } else if d != DType::F16 {
        t.loss_scale = None;
    }
    changed
}

/// Gradients reduced in a dtype coarser than the one they are computed in (bf16 or f16 below f32 or f64, the
/// other half-precision dtype below a half-precision compute dtype: a compression of the reduction), or in
/// the target's own dtype again.
pub fn reduce_dtype_below(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let t = &mut c.train;
    let below: Vec<DType> = [DType::BF16, DType::F16].into_iter().filter(|&d| d != t.dtype).collect();
    let choice = if t.reduce_dtype.is_some_and(|r| below.contains(&r)) && rng.gen_bool(0.5) { None } else { below.choose(rng).copied() };
    let changed = t.reduce_dtype != choice;
    t.reduce_dtype = choice;
    changed
}

/// Parameters and optimizer states kept in f32 (mixed precision), in the compute dtype itself (no master copy),
/// or the target's own choice; a compute dtype wider than half precision becomes bf16 first.
pub fn master_dtype(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let t = &mut c.train;
    if !matches!(t.dtype, DType::BF16 | DType::F16) {
        t.dtype = DType::BF16;
        t.loss_scale = None;
        t.reduce_dtype = t.reduce_dtype.filter(|&r| r == DType::F32 || r == DType::BF16);
    }
    t.master_dtype = super::parallel::another(t.master_dtype, &[None, Some(DType::F32), Some(t.dtype)], rng);
    true
}

/// Checkpointed and resumed after another number of steps (0: before the first, a seed checkpoint; at least two
/// steps then, so that a resumed run also steps from a checkpoint with optimizer state), or run uninterrupted.
pub fn resume_after(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let t = &mut c.train;
    t.steps = t.steps.max(2);
    let choices: Vec<Option<u32>> = std::iter::once(None).chain((0..t.steps).map(Some)).collect();
    t.resume_after = super::parallel::another(t.resume_after, &choices, rng);
    if t.resume_after.is_none() {
        (t.checkpoint_layout, t.resume_parallel) = (None, None);
    }
    true
}

/// The resumed run's checkpoint laid out another way (sharded, gathered, universal, or the target's default); a run that does
/// not resume first resumes after a random step.
/// Whether the case resumes after some step, a random one drawn where it did not (which may still draw none).
fn resumes(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    if c.train.resume_after.is_none() {
        resume_after(c, rng);
    }
    c.train.resume_after.is_some()
}

pub fn checkpoint_layout(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    if !resumes(c, rng) {
        return false;
    }
    let t = &mut c.train;
    let choices = [None, Some(CheckpointLayout::Sharded), Some(CheckpointLayout::Gathered), Some(CheckpointLayout::Universal)];
    t.checkpoint_layout = super::parallel::another(t.checkpoint_layout, &choices, rng);
    true
}

/// The parallel-layout mutations a resumed run's layout draws from: those that reshard the model and optimizer
/// state (ZeRO stage, shard and reshard groups, shard dimension, offload, buckets, overlap, sequence parallelism, the
/// order and grouping of ZeRO's flat partitions).
const RESUMED_LAYOUT_MUTATIONS: &[super::MutationFn] = &[
    super::parallel::zero_stage,
    super::parallel::zero_shard_group,
    super::parallel::reshard_group,
    super::parallel::param_shard_dim,
    super::parallel::zero_offload,
    super::parallel::reduce_bucket,
    super::parallel::overlap_comm,
    super::parallel::overlap_param_gather,
    super::parallel::toggle_sequence_parallel,
    super::parallel::round_robin_grads,
    super::parallel::persist_below,
    super::parallel::optimizer_sub_group,
];

/// The run resumes into another parallel layout: one layout mutation applied to the resumed run's layout (the
/// mesh degrees, micro-batches and schedule kept, so the world size and each rank's data are the saved run's), or
/// back into the saved run's own; a run that does not resume first resumes after a random step.
pub fn resume_parallel(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    if !resumes(c, rng) {
        return false;
    }
    if c.train.resume_parallel.is_some() && rng.gen_ratio(1, 4) {
        c.train.resume_parallel = None;
        return true;
    }
    let mut scratch = c.clone();
    scratch.parallel = c.train.resume_parallel.clone().unwrap_or_else(|| c.parallel.clone());
    let start = scratch.parallel.clone();
    let Some(mutate) = RESUMED_LAYOUT_MUTATIONS.choose(rng) else { return false };
    if !mutate(&mut scratch, rng) {
        return false;
    }
    let q = scratch.parallel;
    if !q.same_degrees(&start) {
        return false;
    }
    let next = (q != c.parallel).then_some(q);
    let changed = next != c.train.resume_parallel;
    c.train.resume_parallel = next;
    changed
}

/// The run resumes with its data-, tensor- and context-parallel degrees traded against each other over the same ranks
/// (dp 4 into dp 2 x tp 2, tp 2 into dp 2, dp 2 into cp 2, ...), the rest of its resumed layout kept: what a checkpoint
/// that reshards across degrees is for. A group that no longer divides dp is dropped, the batch grown to give every
/// data-parallel rank its micro-batches; a run that does not resume first resumes after a random step.
pub fn resume_degrees(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    if !resumes(c, rng) {
        return false;
    }
    let q = c.train.resume_parallel.clone().unwrap_or_else(|| c.parallel.clone());
    let ranks = q.dp * q.tp * q.cp;
    let others: Vec<(u32, u32, u32, u32)> = divisors(ranks)
        .flat_map(|dp| divisors(ranks / dp).map(move |tp| (dp, tp, q.pp, ranks / dp / tp)))
        .filter(|&(dp, tp, _, cp)| (dp, tp, cp) != (q.dp, q.tp, q.cp))
        .collect();
    let Some(&degrees) = others.choose(rng) else { return false };
    resume_into_degrees(c, q, degrees);
    true
}

/// The run resumes over another number of pipeline stages, traded against its data- and tensor-parallel degrees over
/// the same ranks (pp 2 into dp 2, dp 2 x tp 2 into pp 2 x tp 2, pp 4 into pp 2 x tp 2, ...; context parallelism, the
/// schedule and its micro-batches kept): what a checkpoint whose blocks keep their global names over any number of
/// stages is for. As `resume_degrees`, groups that no longer divide dp are dropped and the batch grown. A run of one
/// stage has no schedule to keep: where it had the default GPipe, both layouts take 1F1B, the schedule every target
/// that reshards across stages runs.
pub fn resume_stages(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    if !resumes(c, rng) {
        return false;
    }
    let mut q = c.train.resume_parallel.clone().unwrap_or_else(|| c.parallel.clone());
    let ranks = q.dp * q.tp * q.pp;
    let others: Vec<(u32, u32, u32, u32)> = divisors(ranks)
        .filter(|&pp| pp != q.pp)
        .flat_map(|pp| divisors(ranks / pp).map(move |tp| (ranks / pp / tp, tp, pp, q.cp)))
        .collect();
    let Some(&degrees) = others.choose(rng) else { return false };
    if c.parallel.pp == 1 && q.pp == 1 && q.pipeline_schedule == PipelineSchedule::Gpipe {
        c.parallel.pipeline_schedule = PipelineSchedule::OneFOneB;
        q.pipeline_schedule = PipelineSchedule::OneFOneB;
    }
    resume_into_degrees(c, q, degrees);
    true
}

fn divisors(n: u32) -> impl Iterator<Item = u32> {
    (1..=n).filter(move |d| n % d == 0)
}

/// The case resumes into `q` with degrees (dp, tp, pp, cp): the shard and reshard groups that no longer divide dp
/// dropped, sequence parallelism off without tp, the batch grown to give every data-parallel rank its micro-batches.
fn resume_into_degrees(c: &mut Case, mut q: Parallel, (dp, tp, pp, cp): (u32, u32, u32, u32)) {
    (q.dp, q.tp, q.pp, q.cp) = (dp, tp, pp, cp);
    if q.zero_shard_group.is_some_and(|g| dp % g != 0) {
        q.zero_shard_group = None;
    }
    if q.reshard_group.is_some_and(|g| dp % g != 0) {
        q.reshard_group = None;
    }
    if tp == 1 {
        q.sequence_parallel = false;
    }
    if let Some(m) = c.model.as_mut() {
        m.batch = m.batch.max(dp * q.microbatches * c.train.grad_accumulation);
    }
    c.train.resume_parallel = (q != c.parallel).then_some(q);
}

/// Another dtype to accumulate gradients in: f32 (above a reduced-precision compute dtype), the compute dtype
/// itself, or the target's own.
pub fn grad_accum_dtype(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let t = &mut c.train;
    let d = match rng.gen_range(0..3) {
        0 => None,
        1 => Some(t.dtype),
        _ => Some(DType::F32),
    };
    let changed = t.grad_accum_dtype != d;
    t.grad_accum_dtype = d;
    changed
}

pub fn distribution(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let d = *Distribution::ALL.choose(rng).unwrap_or(&Distribution::Normal);
    let changed = c.data.distribution != d;
    c.data.distribution = d;
    changed
}

/// Ignored targets added, changed (share or pattern) or removed (model cases).
pub fn ignored_targets(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    if c.model.is_none() {
        return false;
    }
    let next = if c.data.ignored.is_some() && rng.gen_ratio(1, 3) {
        None
    } else {
        let fraction = *[0.1, 0.25, 0.5, 0.75, 0.9].choose(rng).unwrap_or(&0.5);
        let pattern = *IgnorePattern::ALL.choose(rng).unwrap_or(&IgnorePattern::Scattered);
        Some(Ignored { fraction: Real(fraction), pattern })
    };
    let changed = c.data.ignored != next;
    c.data.ignored = next;
    changed
}

/// A class-weighted loss switched on or off (model cases).
pub fn class_weights(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    if c.model.is_none() {
        return false;
    }
    c.data.class_weights = !c.data.class_weights;
    true
}

pub fn reseed(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    c.data.seed = rng.gen();
    true
}

/// Steps, gradient accumulation, clipping and optimizer.
pub fn training_step(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let t = &mut c.train;
    match rng.gen_range(0..4) {
        0 => {
            t.steps = rng.gen_range(1..=3);
            if t.resume_after.is_some_and(|k| k >= t.steps) {
                (t.resume_after, t.checkpoint_layout, t.resume_parallel) = (None, None, None);
            }
        }
        1 => {
            t.grad_accumulation = rng.gen_range(1..=3);
            if let Some(m) = c.model.as_mut() {
                m.batch = m.batch.max(c.parallel.dp * c.parallel.microbatches * t.grad_accumulation);
            }
        }
        2 => {
            t.clip_grad_norm = if t.clip_grad_norm.is_some() && rng.gen_bool(0.3) {
                None
            } else {
                Some(Real(*[0.01, 0.1, 1.0].choose(rng).unwrap_or(&0.1)))
            };
            if t.clip_grad_norm.is_none() {
                t.clip_norm_type = None;
            }
        }
        _ => {
            t.optimizer.kind = *[OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::Adamw].choose(rng).unwrap_or(&OptimizerKind::Sgd);
            t.optimizer.lr = Real(*[1e-3, 1e-2, 1e-1].choose(rng).unwrap_or(&1e-2));
        }
    }
    true
}

/// Another set of frozen parameters: a module (the embedding, a layer, a layer's attention, MLP, experts or
/// norm, the layer stack, the final norm, the LM head) frozen beside the others, or one of them trained again.
pub fn frozen(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let Some(m) = &c.model else { return false };
    let t = &mut c.train;
    if !t.frozen.is_empty() && rng.gen_bool(0.4) {
        let i = rng.gen_range(0..t.frozen.len());
        t.frozen.remove(i);
        return true;
    }
    let mut modules = vec!["embed".to_string(), "layers".into(), "final_norm".into()];
    if !m.tied_embeddings {
        modules.push("lm_head".into());
    }
    for (i, kind) in m.layers.iter().enumerate() {
        let parts: &[&str] = match kind {
            LayerKind::Attention => &["attn"],
            LayerKind::Mlp => &["mlp"],
            LayerKind::Moe => &["moe"],
            LayerKind::Parallel => &["attn", "mlp"],
        };
        modules.extend([format!("layers.{i}"), format!("layers.{i}.norm")]);
        modules.extend(parts.iter().map(|part| format!("layers.{i}.{part}")));
    }
    modules.retain(|m| !t.frozen.contains(m));
    let Some(pick) = modules.choose(rng) else { return false };
    t.frozen.push(pick.clone());
    true
}

/// The loss normalised by the framework's per-token path (summed losses, the gradients divided by the global
/// token count after their reduction), or by each rank's scaled loss again.
pub fn per_token_loss(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    c.train.per_token_loss = !c.train.per_token_loss;
    true
}

/// Each micro-batch's loss as the mean over its own tokens (the frameworks' default reduction), or as their sum again.
pub fn local_mean_loss(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    c.train.local_mean_loss = !c.train.local_mean_loss;
    true
}

/// The model compiled by the framework's graph compiler, or eager again.
pub fn compiled(c: &mut Case, _rng: &mut ChaCha8Rng) -> bool {
    c.train.compiled = !c.train.compiled;
    true
}

/// Another norm for gradient clipping (l1, l2, inf; clipping switched on where the case had none), or l2 again.
pub fn clip_norm_type(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let t = &mut c.train;
    if t.clip_grad_norm.is_none() {
        t.clip_grad_norm = Some(Real(*[0.01, 0.1, 1.0].choose(rng).unwrap_or(&0.1)));
    }
    let next = match t.clip_norm_type {
        Some(_) if rng.gen_bool(0.25) => None,
        now => [ClipNorm::L1, ClipNorm::Inf].into_iter().filter(|k| Some(*k) != now).collect::<Vec<_>>().choose(rng).copied(),
    };
    t.clip_norm_type = next;
    true
}

/// Another of the framework's optimizer implementations (for-loop, foreach, fused), or the target's default again.
pub fn optimizer_implementation(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let o = &mut c.train.optimizer;
    let next = match o.implementation {
        Some(_) if rng.gen_bool(0.25) => None,
        now => OptimizerImplementation::ALL.iter().copied().filter(|i| Some(*i) != now).collect::<Vec<_>>().choose(rng).copied(),
    };
    let changed = o.implementation != next;
    o.implementation = next;
    changed
}

/// Label smoothing switched on (ε drawn from `generate::LABEL_SMOOTHINGS`), moved to another ε, or off; class weights go,
/// since a weighted smoothed loss is not modelled (model cases).
pub fn label_smoothing(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    if c.model.is_none() {
        return false;
    }
    let next = if c.train.label_smoothing.is_some() && rng.gen_ratio(1, 2) {
        None
    } else {
        Some(Real(*crate::generate::LABEL_SMOOTHINGS.choose(rng).unwrap_or(&0.1)))
    };
    if next.is_some() {
        c.data.class_weights = false;
    }
    let changed = c.train.label_smoothing != next;
    c.train.label_smoothing = next;
    changed
}

/// Weight decay on matrices only (biases and norm weights in a second parameter group without it), or on every
/// parameter again; decay is switched on where the case had none.
pub fn no_decay_vectors(c: &mut Case, rng: &mut ChaCha8Rng) -> bool {
    let o = &mut c.train.optimizer;
    o.no_decay_vectors = !o.no_decay_vectors;
    if o.no_decay_vectors && o.weight_decay.get() == 0.0 {
        o.weight_decay = Real(*[0.01, 0.1].choose(rng).unwrap_or(&0.1));
    }
    true
}
