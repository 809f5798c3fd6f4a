//! Semantic mutators: each one changes a case the way a distributed-training bug hunter would
//! (a degree that does not divide a dimension, kv heads below tp, a padded vocabulary …). Every
//! mutated case is re-validated; a mutation that breaks a structural rule is retried or skipped.

mod model;
mod parallel;
mod train;

use std::borrow::Cow;

use libafl::corpus::Corpus;
use libafl::mutators::{MutationResult, Mutator};
use libafl::state::{HasCorpus, HasRand};
use libafl::Error;
use libafl_bolts::rands::Rand;
use libafl_bolts::Named;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardfuzz_harnesses::case::{Case, Limits};

use crate::input::CaseInput;
use crate::library_ops::{Vocabulary, LIBRARY_MUTATIONS};

/// A named semantic mutation: returns whether it changed the case.
pub type MutationFn = fn(&mut Case, &mut ChaCha8Rng) -> bool;

/// Every semantic mutator, by name.
pub const MUTATIONS: &[(&str, MutationFn)] = &[
    ("degree-divisor", parallel::degree_divisor),
    ("degree-non-divisor", parallel::degree_non_divisor),
    ("microbatches-vs-pipeline", parallel::microbatches_vs_pipeline),
    ("zero-stage", parallel::zero_stage),
    ("sequence-parallel", parallel::toggle_sequence_parallel),
    ("sequence-parallel-mode", parallel::sequence_parallel_mode),
    ("zero-offload", parallel::zero_offload),
    ("vocab-loss", parallel::vocab_loss),
    ("vocab-divisible-by", parallel::vocab_divisible_by),
    ("reduce-bucket", parallel::reduce_bucket),
    ("overlap-comm", parallel::overlap_comm),
    ("reduce-scatter", parallel::reduce_scatter),
    ("grad-predivide", parallel::grad_predivide),
    ("contiguous-grads", parallel::contiguous_grads),
    ("round-robin-grads", parallel::round_robin_grads),
    ("grad-accum-dtype", train::grad_accum_dtype),
    ("zero-shard-group", parallel::zero_shard_group),
    ("static-graph", parallel::static_graph),
    ("sum-collectives", parallel::sum_collectives),
    ("explicit-grad-divide", parallel::explicit_grad_divide),
    ("find-unused", parallel::find_unused),
    ("flat-params", parallel::flat_params),
    ("param-buckets", parallel::param_buckets),
    ("reduce-to-owner", parallel::reduce_to_owner),
    ("overlap-param-gather", parallel::overlap_param_gather),
    ("sync-every-microbatch", parallel::sync_every_microbatch),
    ("zero-bubble", parallel::zero_bubble),
    ("dual-pipe", parallel::dual_pipe),
    ("context-parallel", parallel::context_parallel),
    ("ulysses-mpu", parallel::ulysses_mpu),
    ("cp-all-to-all", parallel::cp_all_to_all),
    ("tp-overlap-comm", parallel::tp_overlap_comm),
    ("auto-ep", parallel::auto_ep),
    ("breadth-first", parallel::breadth_first),
    ("param-shard-dim", parallel::param_shard_dim),
    ("persist-below", parallel::persist_below),
    ("optimizer-sub-group", parallel::optimizer_sub_group),
    ("reshard-group", parallel::reshard_group),
    ("prefetch-bucket", parallel::prefetch_bucket),
    ("max-live-parameters", parallel::max_live_parameters),
    ("max-reuse-distance", parallel::max_reuse_distance),
    ("reduce-dtype-below", train::reduce_dtype_below),
    ("master-dtype", train::master_dtype),
    ("resume-after", train::resume_after),
    ("checkpoint-layout", train::checkpoint_layout),
    ("resume-parallel", train::resume_parallel),
    ("resume-degrees", train::resume_degrees),
    ("resume-stages", train::resume_stages),
    ("frozen", train::frozen),
    ("no-decay-vectors", train::no_decay_vectors),
    ("per-token-loss", train::per_token_loss),
    ("local-mean-loss", train::local_mean_loss),
    ("compiled", train::compiled),
    ("optimizer-implementation", train::optimizer_implementation),
    ("clip-norm-type", train::clip_norm_type),
    ("label-smoothing", train::label_smoothing),
    ("sparse-embedding", parallel::sparse_embedding),
    ("rank-order", parallel::rank_order),
    ("pipeline-schedule", parallel::schedule),
    ("world-size-one", parallel::world_size_one),
    ("expert-parallel", parallel::expert_parallel),
    ("dimension-edge", model::dimension_edge),
    ("kv-heads-below-tp", model::kv_heads_below_tp),
    ("vocab-not-divisible", model::vocab_not_divisible),
    ("add-layer", model::add_layer),
    ("remove-layer", model::remove_layer),
    ("reorder-layers", model::reorder_layers),
    ("architecture", model::architecture),
    ("activation-checkpointing", model::activation_checkpointing),
    ("hf-model", model::hf_model),
    ("rotary", model::rotary),
    ("qk-norm", model::qk_norm),
    ("layer-passes", model::layer_passes),
    ("framework-checkpoint", model::framework_checkpoint),
    ("moe-routing", model::moe_routing),
    ("moe-capacity-drops", model::moe_capacity_drops),
    ("moe-pad-to-capacity", model::moe_pad_to_capacity),
    ("moe-renormalize", model::moe_renormalize),
    ("moe-shared-expert", model::moe_shared_expert),
    ("dtype", train::dtype),
    ("distribution", train::distribution),
    ("ignored-targets", train::ignored_targets),
    ("class-weights", train::class_weights),
    ("training-step", train::training_step),
    ("reseed", train::reseed),
];

/// Grows the batch so every data-parallel rank gets a row in every micro-batch of every
/// accumulation step: a mutation of one of those degrees should not turn a supported case into a
/// refused one (the generator keeps refusals at one case in ten; so does this, by not repairing).
fn keep_batch_supported(c: &mut Case, rng: &mut ChaCha8Rng) {
    let need = c.parallel.dp * c.parallel.microbatches * c.train.grad_accumulation;
    if let Some(m) = c.model.as_mut() {
        if m.batch < need && rng.gen_ratio(9, 10) {
            m.batch = need;
        }
    }
}

/// A load-balancing loss is dropped from a mutated case with a vocabulary of one. There the language-model
/// loss is constant, every gradient is the auxiliary loss's alone, and where that loss is constant too
/// (top_k = experts) the oracle compares round-off with round-off: an open false-positive class
/// (`docs/false-positives/2026-11-26-*-vocab1-*`), which campaigns would otherwise keep finding.
fn keep_aux_loss_judgeable(c: &mut Case) {
    if let Some(m) = c.model.as_mut() {
        if m.vocab < 2 {
            if let Some(moe) = m.moe.as_mut() {
                moe.aux_loss = None;
            }
        }
    }
}

/// A resumed layout (`train.resume_parallel`) is dropped where the saved run's world, degrees (but for dp, tp, cp and
/// pp traded against each other), micro-batches or schedule changed under it (`Parallel::resumable_from`) or the case no
/// longer resumes: a mutation of the saved layout then still gives a valid case.
fn keep_resumed_layout_consistent(c: &mut Case) {
    if c.train.resume_after.is_none() || c.train.resume_parallel.as_ref().is_some_and(|q| !q.resumable_from(&c.parallel)) {
        c.train.resume_parallel = None;
    }
}

/// Applies one random library-op mutation to a copy of `case` until a valid one results.
pub fn mutate_library_case(case: &Case, vocab: &Vocabulary, rng: &mut ChaCha8Rng, limits: &Limits) -> Option<(Case, &'static str)> {
    for _ in 0..8 {
        let (name, f) = LIBRARY_MUTATIONS[rng.gen_range(0..LIBRARY_MUTATIONS.len())];
        let mut c = case.clone();
        if f(&mut c, vocab, rng) && c != *case && c.validate(limits).is_ok() {
            return Some((c, name));
        }
    }
    None
}

/// Mutations towards a configuration only some targets offer, with the case feature they need
/// (`TargetInfo::offers`): a campaign uses them only when one of its targets offers the feature,
/// instead of spending executions on cases every target refuses.
pub const OPTIONAL_MUTATIONS: &[(&str, &str)] = &[
    ("sequence-parallel-mode", "sequence_parallel_mode"),
    ("zero-offload", "zero_offload"),
    ("vocab-loss", "vocab_loss"),
    ("vocab-divisible-by", "vocab_divisible_by"),
    ("reduce-bucket", "reduce_bucket"),
    ("overlap-comm", "overlap_comm"),
    ("reduce-scatter", "reduce_scatter"),
    ("grad-predivide", "grad_predivide"),
    ("contiguous-grads", "contiguous_grads"),
    ("round-robin-grads", "round_robin_grads"),
    ("grad-accum-dtype", "grad_accum_dtype"),
    ("zero-shard-group", "zero_shard_group"),
    ("static-graph", "static_graph"),
    ("sum-collectives", "sum_collectives"),
    ("explicit-grad-divide", "explicit_grad_divide"),
    ("find-unused", "find_unused"),
    ("flat-params", "flat_params"),
    ("param-buckets", "param_buckets"),
    ("reduce-to-owner", "reduce_to_owner"),
    ("overlap-param-gather", "overlap_param_gather"),
    ("sync-every-microbatch", "sync_every_microbatch"),
    ("zero-bubble", "zero_bubble"),
    ("dual-pipe", "dual_pipe"),
    ("context-parallel", "context_parallel"),
    ("ulysses-mpu", "ulysses_mpu"),
    ("cp-all-to-all", "cp_all_to_all"),
    ("tp-overlap-comm", "tp_overlap_comm"),
    ("auto-ep", "auto_ep"),
    ("breadth-first", "breadth_first"),
    ("param-shard-dim", "param_shard_dim"),
    ("persist-below", "persist_below"),
    ("optimizer-sub-group", "optimizer_sub_group"),
    ("reshard-group", "reshard_group"),
    ("prefetch-bucket", "prefetch_bucket"),
    ("max-live-parameters", "max_live_parameters"),
    ("max-reuse-distance", "max_reuse_distance"),
    ("reduce-dtype-below", "reduce_dtype_below"),
    ("master-dtype", "master_dtype"),
    ("sparse-embedding", "sparse_embedding"),
    ("resume-after", "resume_after"),
    ("checkpoint-layout", "checkpoint_layout"),
    ("resume-parallel", "resume_parallel"),
    ("resume-degrees", "resume_degrees"),
    ("resume-stages", "resume_stages"),
    ("frozen", "frozen"),
    ("per-token-loss", "per_token_loss"),
    ("local-mean-loss", "local_mean_loss"),
    ("compiled", "compiled"),
    ("optimizer-implementation", "optimizer_implementation"),
    ("clip-norm-type", "clip_norm_type"),
    ("label-smoothing", "label_smoothing"),
    ("activation-checkpointing", "activation_checkpointing"),
    ("hf-model", "hf_model"),
    ("rotary", "rotary"),
    ("qk-norm", "qk_norm"),
    ("layer-passes", "layer_passes"),
    ("framework-checkpoint", "framework_checkpoint"),
    ("moe-pad-to-capacity", "moe_pad_to_capacity"),
];

/// The mutations a campaign whose targets offer `offered` uses.
pub fn enabled_mutations(offered: &[&str]) -> Vec<(&'static str, MutationFn)> {
    let needs = |name: &str| OPTIONAL_MUTATIONS.iter().find(|(m, _)| *m == name).map(|(_, f)| *f);
    MUTATIONS.iter().copied().filter(|(name, _)| needs(name).is_none_or(|f| offered.contains(&f))).collect()
}

/// Applies one random mutation to a copy of `case` until a valid one results (or gives up); none of
/// the optional mutations.
pub fn mutate_case(case: &Case, rng: &mut ChaCha8Rng, limits: &Limits) -> Option<(Case, &'static str)> {
    mutate_case_with(case, rng, limits, &enabled_mutations(&[]))
}

/// [`mutate_case`] over the given mutations.
pub fn mutate_case_with(
    case: &Case,
    rng: &mut ChaCha8Rng,
    limits: &Limits,
    mutations: &[(&'static str, MutationFn)],
) -> Option<(Case, &'static str)> {
    for _ in 0..8 {
        let (name, f) = mutations[rng.gen_range(0..mutations.len())];
        let mut c = case.clone();
        let mutated = f(&mut c, rng);
        keep_batch_supported(&mut c, rng);
        keep_aux_loss_judgeable(&mut c);
        keep_resumed_layout_consistent(&mut c);
        if mutated && c != *case && c.validate(limits).is_ok() {
            return Some((c, name));
        }
    }
    None
}

/// Crossover: each section of the case (parallel configuration, model, training step, data) from
/// one parent or the other, so what two corpus entries reached separately can meet in one case.
pub fn crossover(a: &Case, b: &Case, rng: &mut ChaCha8Rng, limits: &Limits) -> Option<Case> {
    let mut c = b.clone();
    if rng.gen_bool(0.5) || a.model.is_none() != b.model.is_none() {
        c.parallel = a.parallel.clone();
    }
    if a.model.is_some() && b.model.is_some() && rng.gen_bool(0.5) {
        c.model = a.model.clone();
    }
    if rng.gen_bool(0.5) {
        c.train = a.train.clone();
    }
    if rng.gen_bool(0.5) {
        c.data = a.data.clone();
    }
    keep_batch_supported(&mut c, rng);
    keep_aux_loss_judgeable(&mut c);
    keep_resumed_layout_consistent(&mut c);
    (c != *a && c != *b && c.validate(limits).is_ok()).then_some(c)
}

/// The LibAFL mutator: stacks 1–3 semantic mutations, or (one time in four) a crossover with a
/// corpus entry.
pub struct SemanticMutator {
    limits: Limits,
    /// The campaign targets' library ops (library-op cases mutate over it).
    vocabulary: std::sync::Arc<Vocabulary>,
    /// How often each mutation produced a case that was run.
    pub applied: std::collections::BTreeMap<&'static str, u64>,
    /// The mutations in use (the optional ones only where a campaign target offers their feature).
    mutations: Vec<(&'static str, MutationFn)>,
}

/// The largest world a mutated case may ask for: the generator's bound. Every 3-D layout fits in
/// 8 ranks; without the bound the corpus drifts towards 24–36 simulated ranks, which run 4× slower
/// and find nothing the small ones do not.
pub const MAX_MUTATED_WORLD: u64 = 8;

impl SemanticMutator {
    pub fn new() -> SemanticMutator {
        SemanticMutator {
            limits: Limits { max_world: MAX_MUTATED_WORLD, ..Limits::default() },
            vocabulary: Default::default(),
            applied: Default::default(),
            mutations: enabled_mutations(&[]),
        }
    }

    /// Also the optional mutations whose feature a campaign target offers.
    pub fn with_offered(self, offered: &[&str]) -> SemanticMutator {
        SemanticMutator { mutations: enabled_mutations(offered), ..self }
    }

    pub fn with_vocabulary(self, vocabulary: std::sync::Arc<Vocabulary>) -> SemanticMutator {
        SemanticMutator { vocabulary, ..self }
    }
}

impl Default for SemanticMutator {
    fn default() -> Self {
        Self::new()
    }
}

impl Named for SemanticMutator {
    fn name(&self) -> &Cow<'static, str> {
        static NAME: Cow<'static, str> = Cow::Borrowed("semantic");
        &NAME
    }
}

impl<S> Mutator<CaseInput, S> for SemanticMutator
where
    S: HasRand + HasCorpus<CaseInput>,
{
    fn mutate(&mut self, state: &mut S, input: &mut CaseInput) -> Result<MutationResult, Error> {
        let seed = state.rand_mut().next();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut case = input.0.clone();
        if rng.gen_ratio(1, 4) && state.corpus().count() > 1 {
            let n = state.corpus().count();
            let id = state.corpus().nth(rng.gen_range(0..n));
            let other = state.corpus().cloned_input_for_id(id)?;
            let (a, b) = if rng.gen_bool(0.5) { (&case, &other.0) } else { (&other.0, &case) };
            if let Some(c) = crossover(a, b, &mut rng, &self.limits) {
                *self.applied.entry("crossover").or_default() += 1;
                input.0 = c;
                return Ok(MutationResult::Mutated);
            }
        }
        let stack = rng.gen_range(1..=3);
        let mut changed = false;
        for _ in 0..stack {
            let mutated = if case.library_op.is_some() {
                mutate_library_case(&case, &self.vocabulary, &mut rng, &self.limits)
            } else {
                mutate_case_with(&case, &mut rng, &self.limits, &self.mutations)
            };
            if let Some((c, name)) = mutated {
                case = c;
                changed = true;
                *self.applied.entry(name).or_default() += 1;
            }
        }
        if !changed {
            return Ok(MutationResult::Skipped);
        }
        input.0 = case;
        Ok(MutationResult::Mutated)
    }

    fn post_exec(&mut self, _state: &mut S, _new_corpus_id: Option<libafl::corpus::CorpusId>) -> Result<(), Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::random_case;
    use shardfuzz_harnesses::case::{Parallel, PipelineSchedule};
    use shardfuzz_kernels::DType;

    #[test]
    fn mutations_draw_a_load_balancing_loss_but_never_with_a_vocabulary_of_one() {
        let limits = Limits::default();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let all = enabled_mutations(&[]);
        let (mut with_loss, mut vocab_one) = (0, 0);
        // 600 chains (13 reach a vocabulary of one, 366 a loss); 400 gave 5 once a mutator was added.
        for seed in 0..600 {
            let mut case = random_case(seed);
            for _ in 0..6 {
                let Some((c, _)) = mutate_case_with(&case, &mut rng, &limits, &all) else { break };
                case = c;
                let m = case.model.as_ref();
                let loss = m.and_then(|m| m.moe.as_ref()).and_then(|moe| moe.aux_loss).is_some();
                with_loss += usize::from(loss);
                vocab_one += usize::from(m.is_some_and(|m| m.vocab == 1));
                assert!(!(loss && m.is_some_and(|m| m.vocab < 2)), "an aux loss with a vocabulary of one: {case:?}");
            }
        }
        assert!(with_loss > 50, "only {with_loss} mutated cases carry a load-balancing loss");
        assert!(vocab_one > 5, "only {vocab_one} mutated cases have a vocabulary of one");
    }

    #[test]
    fn every_mutation_keeps_cases_valid_and_most_change_something() {
        let limits = Limits::default();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert!(MUTATIONS.len() >= 15);
        for (name, f) in MUTATIONS {
            let mut changed = 0;
            for seed in 0..200 {
                let base = random_case(seed);
                let mut c = base.clone();
                if f(&mut c, &mut rng) && c.validate(&limits).is_ok() && c != base {
                    changed += 1;
                }
            }
            assert!(changed > 20, "{name} changed only {changed} of 200 cases validly");
        }
        for seed in 0..300 {
            if let Some((c, _)) = mutate_case(&random_case(seed), &mut rng, &limits) {
                c.validate(&limits).unwrap();
            }
        }
    }

    #[test]
    fn a_named_transformers_class_gets_its_math() {
        use shardfuzz_harnesses::case::{Activation, HfModel, LayerKind, NormKind};
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let mut c = random_case(seed);
            if !model::hf_model(&mut c, &mut rng) {
                continue;
            }
            let m = c.model.as_ref().expect("a model case");
            let Some(h) = m.hf_model else { continue };
            seen.insert(h.name());
            assert!(!h.rotary_only() || m.rotary_base.is_some_and(|_| (m.hidden / m.heads) % 2 == 0), "{m:?}");
            if h.gpt2_math() {
                assert!(m.norm == NormKind::Layernorm && m.activation == Activation::Gelu && m.bias && m.kv_heads == m.heads, "{m:?}");
                let parallel = m.layers.iter().all(|k| *k == LayerKind::Parallel);
                assert!(parallel || m.layers.chunks(2).all(|p| p == [LayerKind::Attention, LayerKind::Mlp]), "{m:?}");
            } else if h.parallel_blocks() {
                assert!(m.norm == NormKind::Layernorm && m.activation == Activation::Swiglu && !m.bias, "{m:?}");
                assert!(m.layers.iter().all(|k| *k == LayerKind::Parallel), "{m:?}");
            } else {
                assert!(m.norm == NormKind::Rmsnorm && m.activation == Activation::Swiglu, "{m:?}");
                assert!(!(h == HfModel::Qwen2 && m.bias), "{m:?}");
            }
        }
        assert_eq!(seen.len(), HfModel::ALL.len(), "{seen:?}");
    }

    #[test]
    fn a_rotary_embedding_gets_an_even_head_size() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (mut on, mut off) = (0, 0);
        for seed in 0..200 {
            let mut c = random_case(seed);
            if !model::rotary(&mut c, &mut rng) {
                continue;
            }
            let m = c.model.as_ref().expect("a model case");
            match m.rotary_base {
                Some(b) => {
                    assert!(model::ROTARY_BASES.contains(&b) && (m.hidden / m.heads) % 2 == 0 && m.hidden % m.heads == 0, "{m:?}");
                    on += 1;
                }
                None => off += 1,
            }
            c.validate(&Limits::default()).expect("a valid case");
        }
        assert!(on > 50 && off == 0, "{on} with a rotary embedding, {off} without from cases without one");
    }

    #[test]
    fn optional_mutations_only_where_a_target_offers_their_feature() {
        let names = |m: Vec<(&'static str, MutationFn)>| m.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        let plain = names(enabled_mutations(&[]));
        assert_eq!(plain.len(), MUTATIONS.len() - OPTIONAL_MUTATIONS.len());
        assert!(!plain.contains(&"zero-offload") && !plain.contains(&"sequence-parallel-mode"));
        let offload = names(enabled_mutations(&["zero_offload"]));
        assert!(offload.contains(&"zero-offload") && !offload.contains(&"sequence-parallel-mode"));
        // Every field a target offers has its mutation, and the targets together offer every one.
        let offered: Vec<&str> = shardfuzz_harnesses::target::registry::TARGETS.iter().flat_map(|t| t.offers.iter().copied()).collect();
        for f in &offered {
            assert!(OPTIONAL_MUTATIONS.iter().any(|(_, needs)| needs == f), "no mutation towards offered field {f}");
        }
        assert_eq!(names(enabled_mutations(&offered)).len(), MUTATIONS.len());
    }

    #[test]
    fn reduce_dtype_below_picks_a_coarser_half_precision_dtype_or_none() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (dtype, expected) in [(DType::F32, vec![DType::BF16, DType::F16]), (DType::BF16, vec![DType::F16])] {
            let mut case = random_case(1);
            case.train.dtype = dtype;
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..40 {
                train::reduce_dtype_below(&mut case, &mut rng);
                if let Some(r) = case.train.reduce_dtype {
                    assert!(expected.contains(&r), "{dtype}: reduce dtype {r}");
                }
                seen.insert(case.train.reduce_dtype.map(|r| r.to_string()));
            }
            assert_eq!(seen.len(), expected.len() + 1, "{dtype}: {seen:?}");
        }
    }

    #[test]
    fn a_resumed_layout_keeps_the_degrees_and_is_dropped_when_they_change() {
        let (mut rng, limits) = (ChaCha8Rng::seed_from_u64(11), Limits::default());
        let mut fields = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let mut case = random_case(seed);
            if !train::resume_parallel(&mut case, &mut rng) {
                continue;
            }
            case.validate(&limits).unwrap();
            let Some(q) = case.train.resume_parallel.clone() else { continue };
            assert!(q.same_degrees(&case.parallel) && q != case.parallel, "{q:?}");
            fields.extend(q.differing_fields(&case.parallel));
            let mut other = case.clone();
            other.parallel.tp += 1;
            keep_resumed_layout_consistent(&mut other);
            assert!(other.train.resume_parallel.is_none(), "a resumed layout of another world is dropped");
        }
        for field in ["zero_stage", "zero_shard_group", "param_shard_dim", "reduce_bucket", "sequence_parallel"] {
            assert!(fields.contains(field), "no resumed layout changed {field}: {fields:?}");
        }
    }

    #[test]
    fn resumed_degrees_trade_dp_tp_and_cp_over_the_same_ranks_and_survive_mutations_that_keep_them() {
        let (mut rng, limits) = (ChaCha8Rng::seed_from_u64(12), Limits::default());
        let mut pairs = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let mut case = random_case(seed);
            if !train::resume_degrees(&mut case, &mut rng) || case.validate(&limits).is_err() {
                continue;
            }
            let Some(q) = case.train.resume_parallel.clone() else { continue };
            let p = &case.parallel;
            assert!(q.resumable_from(p) && q.dp * q.tp * q.cp == p.dp * p.tp * p.cp, "{p:?} into {q:?}");
            assert_ne!((q.dp, q.tp, q.cp), (p.dp, p.tp, p.cp));
            assert!(case.model.as_ref().is_none_or(|m| m.batch >= q.dp * q.microbatches * case.train.grad_accumulation));
            pairs.insert(((p.dp, p.tp, p.cp), (q.dp, q.tp, q.cp)));
            let mut kept = case.clone();
            kept.train.steps += 1;
            keep_resumed_layout_consistent(&mut kept);
            assert_eq!(kept.train.resume_parallel.as_ref(), Some(&q), "a resumed layout of other degrees over the same ranks stays");
        }
        assert!(pairs.iter().any(|(p, q)| p.1 == 1 && q.1 > 1), "no dp-only run resumed under tp: {pairs:?}");
        assert!(pairs.iter().any(|(p, q)| p.1 > 1 && q.1 == 1), "no tp run resumed without it: {pairs:?}");
        assert!(pairs.iter().any(|(p, q)| p.2 == 1 && q.2 > 1), "no run resumed under context parallelism: {pairs:?}");
    }

    #[test]
    fn resumed_stages_trade_pp_against_dp_and_tp_over_the_same_ranks() {
        let (mut rng, limits) = (ChaCha8Rng::seed_from_u64(13), Limits::default());
        let mut pairs = std::collections::BTreeSet::new();
        for seed in 0..300 {
            let mut case = random_case(seed);
            if !train::resume_stages(&mut case, &mut rng) || case.validate(&limits).is_err() {
                continue;
            }
            let Some(q) = case.train.resume_parallel.clone() else { continue };
            let p = &case.parallel;
            assert!(q.resumable_from(p) && q.world() == p.world() && q.cp == p.cp, "{p:?} into {q:?}");
            assert_ne!(q.pp, p.pp);
            assert!(case.model.as_ref().is_none_or(|m| m.batch >= q.dp * q.microbatches * case.train.grad_accumulation));
            pairs.insert(((p.dp, p.tp, p.pp), (q.dp, q.tp, q.pp)));
            let mut kept = case.clone();
            kept.train.steps += 1;
            keep_resumed_layout_consistent(&mut kept);
            assert_eq!(kept.train.resume_parallel.as_ref(), Some(&q), "a resumed layout over other stages stays");
        }
        assert!(pairs.iter().any(|(p, q)| p.2 == 1 && q.2 > 1), "no run resumed over pipeline stages: {pairs:?}");
        assert!(pairs.iter().any(|(p, q)| p.2 > 1 && q.2 == 1), "no pipelined run resumed without stages: {pairs:?}");
        assert!(pairs.iter().any(|(p, q)| p.1 != q.1), "no stages traded against tp: {pairs:?}");
        let mut one = random_case(1);
        one.parallel = Parallel { dp: 2, ..Parallel::default() };
        one.train.resume_parallel = None;
        assert!(train::resume_stages(&mut one, &mut rng));
        let q = one.train.resume_parallel.as_ref().expect("resumed over 2 stages");
        assert_eq!(
            (q.pp, q.pipeline_schedule, one.parallel.pipeline_schedule),
            (2, PipelineSchedule::OneFOneB, PipelineSchedule::OneFOneB)
        );
    }

    #[test]
    fn master_dtype_keeps_f32_parameters_under_a_half_precision_compute_dtype() {
        let (mut rng, limits) = (ChaCha8Rng::seed_from_u64(9), Limits::default());
        let mut case = random_case(2);
        case.train.dtype = DType::F32;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            train::master_dtype(&mut case, &mut rng);
            assert!(matches!(case.train.dtype, DType::BF16 | DType::F16), "{}", case.train.dtype);
            let before = case.train.master_dtype;
            assert!(case.train.master_dtype.is_none_or(|m| m == DType::F32 || m == case.train.dtype));
            case.validate(&limits).unwrap();
            seen.insert(case.train.master_dtype.map(|m| m == DType::F32));
            train::master_dtype(&mut case, &mut rng);
            assert_ne!(case.train.master_dtype, before, "another choice each time");
        }
        assert_eq!(seen.len(), 3, "f32 parameters, parameters in the compute dtype and the target's own");
    }

    #[test]
    fn zero3_layout_sizes_sit_around_a_parameter_and_switch_on_zero3() {
        let (mut rng, limits) = (ChaCha8Rng::seed_from_u64(4), Limits::default());
        let mut case = random_case(3);
        let numels: Vec<u32> = case.model.as_ref().unwrap().params().iter().map(|p| p.numel() as u32).collect();
        let (mut persisted, mut grouped) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
        for _ in 0..60 {
            parallel::persist_below(&mut case, &mut rng);
            parallel::optimizer_sub_group(&mut case, &mut rng);
            assert_eq!((case.parallel.zero_stage, case.parallel.dp > 1), (3, true));
            case.validate(&limits).unwrap();
            persisted.insert(case.parallel.persist_below);
            grouped.insert(case.parallel.optimizer_sub_group);
        }
        let near = |v: &Option<u32>| v.is_some_and(|v| numels.iter().any(|&n| v.abs_diff(n) <= 1 && n > 64));
        for seen in [&persisted, &grouped] {
            assert!(seen.contains(&None) && seen.iter().any(near), "{seen:?}");
        }
        assert!(!grouped.contains(&Some(0)), "a sub-group holds at least one element");
        let mut groups = std::collections::BTreeSet::new();
        for _ in 0..40 {
            parallel::reshard_group(&mut case, &mut rng);
            assert_eq!(case.parallel.zero_stage, 3);
            case.validate(&limits).unwrap();
            groups.insert(case.parallel.reshard_group.map(|g| (g, g > 1 && g < case.parallel.dp)));
        }
        assert!(groups.contains(&None) && groups.iter().flatten().any(|&(_, proper)| proper), "{groups:?}");
    }

    #[test]
    fn vocab_divisors_include_no_padding_and_padding_past_the_vocabulary() {
        let (mut rng, limits) = (ChaCha8Rng::seed_from_u64(6), Limits::default());
        let mut case = random_case(3);
        let vocab = case.model.as_ref().unwrap().vocab;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..40 {
            let before = case.parallel.vocab_divisible_by;
            parallel::vocab_divisible_by(&mut case, &mut rng);
            assert!(case.parallel.vocab_divisible_by != before && case.parallel.tp > 1);
            case.validate(&limits).unwrap();
            seen.insert(case.parallel.vocab_divisible_by);
        }
        assert!(seen.contains(&None) && seen.contains(&Some(1)) && seen.contains(&Some(vocab)), "{seen:?}");
    }

    #[test]
    fn zero3_fetch_sizes_sit_around_a_parameter_and_switch_on_zero3() {
        let (mut rng, limits) = (ChaCha8Rng::seed_from_u64(5), Limits::default());
        let mut case = random_case(3);
        let numels: Vec<u32> = case.model.as_ref().unwrap().params().iter().map(|p| p.numel() as u32).collect();
        let mut seen = [(); 3].map(|_| std::collections::BTreeSet::new());
        for _ in 0..60 {
            parallel::prefetch_bucket(&mut case, &mut rng);
            parallel::max_live_parameters(&mut case, &mut rng);
            parallel::max_reuse_distance(&mut case, &mut rng);
            assert_eq!((case.parallel.zero_stage, case.parallel.dp > 1), (3, true));
            case.validate(&limits).unwrap();
            let p = &case.parallel;
            for (s, v) in seen.iter_mut().zip([p.prefetch_bucket, p.max_live_parameters, p.max_reuse_distance]) {
                s.insert(v);
            }
        }
        let near = |v: &Option<u32>| v.is_some_and(|v| numels.iter().any(|&n| v.abs_diff(n) <= 1 && n > 64));
        for s in &seen {
            assert!(s.contains(&None) && s.contains(&Some(0)) && s.iter().any(near), "{s:?}");
        }
    }

    #[test]
    fn crossover_takes_the_parallel_config_of_one_and_the_model_of_the_other() {
        let limits = Limits::default();
        let (a, b) =
            (0..100).map(|s| (random_case(s), random_case(s + 1000))).find(|(a, b)| a.parallel != b.parallel && b.model.is_some()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut mixed = 0;
        // The batch may have grown so every data-parallel rank keeps its rows; the rest is inherited.
        let shape = |c: &Case| c.model.as_ref().map(|m| (m.hidden, m.ffn, m.heads, m.seq, m.layers.clone()));
        for _ in 0..50 {
            if let Some(c) = crossover(&a, &b, &mut rng, &limits) {
                assert!(c.parallel == a.parallel || c.parallel == b.parallel);
                assert!(shape(&c) == shape(&a) || shape(&c) == shape(&b));
                assert!(c.train == a.train || c.train == b.train);
                mixed += usize::from(c.parallel == a.parallel && shape(&c) == shape(&b));
            }
        }
        assert!(mixed > 0, "no crossover took the parallel configuration of one and the model of the other");
    }
}
