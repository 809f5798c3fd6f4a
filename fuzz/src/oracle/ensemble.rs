//! What a case's correct implementations may legitimately differ by, sampled once per case and
//! shared by every target the case goes to.
//!
//! The noise ensemble: single-device runs whose round-off varies the way a correct sharded run's
//! does. Members, cheapest and most telling first:
//!
//! 1. `dtype`: the reference in the case dtype (in the reduce dtype when that is coarser than an f64
//!    compute dtype: any tensor a rank communicates may be rounded to it), and the target's
//!    own single-device run in the case dtype when it sends one (the framework's roundings).
//! 2. `split`: in the case dtype, every matrix product and bias or norm-weight gradient split into
//!    as many partial sums as the case has ranks times micro-batches times accumulation steps (2 to
//!    8: each adds a rounded partial gradient), each rounded to the case dtype (the reduce dtype when that
//!    is coarser: f64 compute with an f32 all-reduce) before they are added:
//!    the rounding of a row-parallel product's or a data-parallel gradient's partial sums before
//!    the all-reduce, which no unsplit run has.
//! 3. `perturbed`: the f64 reference on inputs moved by ±u (how the case's conditioning amplifies
//!    round-off: TTrace's estimate).
//! 4. `reordered`: in the case dtype, every dot product summed in reverse order, on inputs rounded
//!    to their neighbours (another order, another rounding of every input). In f64: every rounding
//!    jittered by a few ulps, since the f64 reference is the baseline itself there. In low
//!    precision a *probe* (below).
//! 5. `stochastic`: in the case dtype, every rounding of the run (storage and accumulation) moved
//!    by one ulp up or down (low precision only). A probe.
//! 6. `gradient-noise`: the f64 reference with absolute noise added to its gradients before each
//!    step (what a sharded reduction puts there; optimizers that normalise each element, Adam,
//!    amplify it, and large steps on large values can make it chaotic), for the tensors of later
//!    steps: per parameter, twice the largest difference the members
//!    before it show on that parameter's step-0 gradient, and never below 4 u of the largest
//!    gradient element. In low precision the members before it include the probes whole, so it
//!    is a probe itself (as ε it counts at their share; the chaos rule reads it whole).
//! 7. `reduce-rounding`: with a reduce dtype coarser than the compute dtype, the reference's step-0
//!    gradients moved by the reduction's rounding of every partial gradient (u·√roundings times
//!    the root-sum-square of the rows' gradients).
//!
//! 8. `routing-flip`: with a top-k router whose margin between a token's k-th and (k+1)-th expert
//!    falls below `ROUTING_FLIP_ULPS` u, the f64 reference with such tokens routed to their best
//!    unchosen expert: top-k routing is discontinuous, and a correct implementation's round-off may
//!    flip any subset of those tokens (with expert capacity, each subset drops other tokens: every
//!    subset of up to four near ties, else each alone, all at once and 16 fixed random subsets;
//!    the member keeps, per element, the run farthest from the reference). The oracle does not take
//!    ε from it: the elements it moves are left out of the comparison (`check::without_moved`).
//! 9. `gate-jitter`: in every MoE case, the f64 reference with the gates (the router probability a
//!    chosen expert's output is weighted by) moved by ± half the flip margin (the router
//!    probabilities' round-off), one group of tokens at a time (eight groups, every sign
//!    combination over a token's first three choices), keeping per element the farthest run.
//!    Where a token's chosen experts' outputs are large, the gates' round-off moves its output far
//!    more than any rounding of it (a clean bf16 case, tp3 with large values: gates of 0.5 / 0.5
//!    against the reference's 0.514 / 0.486, an output moved by 5 %, a saturated softmax whose top
//!    two tokens swapped, router gradients 17 ε past every member). Not an ε either: the elements
//!    it moves past the statistics' threshold times any other member's move are left out.
//!
//! 10. `reversed`: in the case dtype, every dot product summed in reverse order, on the case's own
//!     inputs (low precision only).
//! 11. `rounded-stochastically`: in the case dtype, every rounding stochastic and unbiased (up with
//!     probability (x − below) / spacing): the rounding points a correct implementation may place
//!     elsewhere, each moved by less than a spacing, as such an implementation moves them.
//!
//! Probes (`Member::probe_only`): the two low-precision members that move every rounding by a
//! whole ulp or every input to its other neighbour are wider than what a correct run does (their
//! median bf16 move is 4× the native sharded run's). They find where round-off is amplified, and
//! everything that asks the members how far round-off reaches uses them whole: chaotic later
//! steps, attention rows and routing near a tie, the gradient noise of later steps (itself a probe,
//! being sized from them). As ε they count at a share (`check::PROBE_SHARE`, a half; whole where
//! an attention row is near a tie, and in MoE cases for the gradients that flow back through the
//! gates): `reversed` and `rounded-stochastically` size the rest.
//!
//! The oracle judges with the members computed so far and computes more only when a tensor fails
//! (the fast path): adding a member can only raise ε, so a pass with fewer members is a pass with
//! all of them, and the verdict does not depend on the path.

use std::cell::{Cell, OnceCell};

use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::model::ParamSet;
use shardfuzz_harnesses::reference::{self, Flips, GateJitter, GradientNoise};
use shardfuzz_harnesses::target::RunOutput;
use shardfuzz_harnesses::tensor::Tensor;
use shardfuzz_kernels::{DType, Prec};

/// How many ensemble members exist; `Prepared::members(n)` computes the first `n`.
pub const MEMBERS: usize = 11;

/// Router margins below this many unit round-offs (of the coarse dtype) count as near-ties.
pub const ROUTING_FLIP_ULPS: f64 = 4.0;

/// Up to this many near ties, the `routing-flip` member flips every subset of them; beyond it, all
/// at once, each one alone (the first `MAX_SINGLE_FLIPS`) and `RANDOM_SUBSETS` random subsets.
const ALL_SUBSETS_UP_TO: u32 = 4;
const MAX_SINGLE_FLIPS: u32 = 16;
const RANDOM_SUBSETS: u64 = 16;

/// The proper subsets of `n` near ties the `routing-flip` member flips besides all of them: with
/// expert capacity, which tokens an expert drops depends on exactly which near ties flipped (a
/// clean bf16 case, capacity 0.5 and top-2, moved logits 5 ε past the members when only some of its
/// near ties flipped), so one run flipping all of them does not show every element that can move.
fn flip_subsets(n: u32) -> Vec<u64> {
    if n <= 1 {
        vec![]
    } else if n <= ALL_SUBSETS_UP_TO {
        (1..(1u64 << n) - 1).collect()
    } else {
        let singles = (0..n.min(MAX_SINGLE_FLIPS)).map(|i| 1u64 << i);
        // splitmix64 of the index: fixed, so the member (and the verdict) is deterministic.
        let random = (1..=RANDOM_SUBSETS).map(|i| {
            let mut z = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        });
        singles.chain(random).collect()
    }
}

/// The gate moves the `gate-jitter` member runs (`reference::GateJitter`): the tokens in
/// [`GATE_GROUPS`] groups (fewer when there are fewer tokens), each group with every combination of
/// signs over a token's first three choices.
fn gate_jitters(delta: f64, top_k: usize, tokens: usize) -> impl Iterator<Item = GateJitter> {
    let groups = tokens.clamp(1, GATE_GROUPS);
    let combinations = 1u64 << top_k.clamp(1, 3);
    (0..groups).flat_map(move |group| (0..combinations).map(move |signs| GateJitter { delta, group, groups, signs }))
}

const GATE_GROUPS: usize = 8;

/// Replaces each element of `acc` by `other`'s where `other` lies farther from the reference (or
/// is not finite): the union of the elements the runs moved, which is what the oracle leaves out.
fn keep_farthest(acc: &mut RunOutput, other: &RunOutput, reference: &RunOutput) {
    for (name, t) in &mut acc.tensors {
        let (Some(o), Some(r)) = (other.tensor(name), reference.tensor(name)) else {
            continue;
        };
        if o.shape != t.shape || r.shape != t.shape {
            continue;
        }
        for ((x, y), z) in t.data.iter_mut().zip(&o.data).zip(&r.data) {
            if !y.is_finite() || (y - z).abs() > (*x - z).abs() {
                *x = *y;
            }
        }
    }
}

/// The index of the `gradient-noise` member (it draws on the members before it).
const GRADIENT_NOISE: usize = 5;

/// The members the fast path judges with before it computes the rest.
pub const FAST_MEMBERS: usize = 2;

/// A case made ready for judging: inputs, the f64 reference, and the noise ensemble, computed
/// lazily and at most once.
pub struct Prepared {
    pub case: Case,
    pub inputs: Inputs,
    reference: OnceCell<Result<RunOutput, String>>,
    members: [OnceCell<Option<Member>>; MEMBERS],
    runs: Cell<u32>,
}

/// One sample of legitimate noise: tensors under the reference's names.
pub struct Member {
    pub name: &'static str,
    pub output: RunOutput,
    /// Only for tensors of later steps (parameters, losses after step 0).
    pub later_steps_only: bool,
    /// Only for step-0 gradients.
    pub gradients_only: bool,
    /// A probe, not an ε: moves wider than a correct run's round-off (a whole ulp at every
    /// rounding, inputs moved to their other neighbour), which find where round-off is amplified
    /// (chaotic later steps, attention rows and routing near a tie, the gradient noise the
    /// optimizer sees) without sizing the tolerance of every tensor.
    pub probe_only: bool,
}

impl Member {
    pub(crate) fn new(name: &'static str, output: RunOutput) -> Member {
        Member { name, output, later_steps_only: false, gradients_only: false, probe_only: false }
    }

    /// A noise member the framework computed itself (library-op cases: the worker's `perturbed`
    /// and `reordered` runs of the op).
    pub fn from_framework(name: &str, tensors: &[(String, Tensor)]) -> Member {
        let name = match name {
            "perturbed" => "perturbed",
            "reordered" => "reordered",
            _ => "framework-member",
        };
        Member::new(name, RunOutput { tensors: tensors.to_vec(), ..Default::default() })
    }

    /// This member's value of `tensor`, if it samples that tensor's noise.
    pub fn tensor(&self, tensor: &str) -> Option<&Tensor> {
        if self.later_steps_only && !is_later_step(tensor) || self.gradients_only && !tensor.starts_with("grad/") {
            return None;
        }
        self.output.tensor(tensor)
    }
}

/// Parameters after the last step and losses after the first.
pub fn is_later_step(tensor: &str) -> bool {
    tensor.starts_with("param/") || (tensor.starts_with("loss/") && tensor != "loss/step0")
}

/// The partial sums a sharded run may add for one gradient: one per rank, micro-batch and
/// accumulation step, each rounded.
pub fn partial_sums(case: &Case) -> usize {
    case.world() * case.parallel.microbatches as usize * case.train.grad_accumulation as usize
}

/// The partial sums of the `split` member: [`partial_sums`], 2 to 8.
fn split_parts(case: &Case) -> u8 {
    partial_sums(case).clamp(2, 8) as u8
}

/// The coarser of the compute and reduce dtypes: the round-off a sharded run may inject.
pub fn coarse_dtype(case: &Case) -> DType {
    let (dtype, reduce) = (case.train.dtype, case.train.reduce_dtype());
    if reduce.unit_roundoff() > dtype.unit_roundoff() {
        reduce
    } else {
        dtype
    }
}

impl Prepared {
    pub fn new(case: &Case) -> Prepared {
        let inputs = Inputs::generate(case);
        Prepared::with_inputs(case, inputs)
    }

    pub fn with_inputs(case: &Case, inputs: Inputs) -> Prepared {
        Prepared { case: case.clone(), inputs, reference: OnceCell::new(), members: Default::default(), runs: Cell::new(0) }
    }

    /// The f64 reference (computed on first use), or why it cannot run this case.
    pub fn reference(&self) -> &Result<RunOutput, String> {
        self.reference.get_or_init(|| {
            self.runs.set(self.runs.get() + 1);
            reference::run(&self.case, &self.inputs, DType::F64).map_err(|e| e.to_string())
        })
    }

    /// Reference runs made so far for this case (the f64 reference included).
    pub fn reference_runs(&self) -> u32 {
        self.runs.get()
    }

    /// The first `n` members that apply to this case.
    pub fn members(&self, n: usize) -> Vec<&Member> {
        (0..n.min(MEMBERS)).filter_map(|i| self.members[i].get_or_init(|| self.compute(i)).as_ref()).collect()
    }

    fn compute(&self, i: usize) -> Option<Member> {
        let (case, inputs, dtype) = (&self.case, &self.inputs, self.case.train.dtype);
        let low = dtype != DType::F64;
        let count = |r: Result<RunOutput, reference::ReferenceError>| {
            self.runs.set(self.runs.get() + 1);
            r.ok()
        };
        let coarse = coarse_dtype(case);
        match i {
            // With a reduce dtype coarser than an f64 compute dtype, any tensor a rank communicates
            // may be rounded to it: the whole run in the reduce dtype bounds that.
            0 => (coarse != DType::F64).then(|| count(reference::run(case, inputs, coarse))).flatten().map(|o| Member::new("dtype", o)),
            1 => {
                let parts = split_parts(case);
                count(reference::run_prec(case, inputs, Prec::new(dtype).split_into(parts, coarse))).map(|o| Member::new("split", o))
            }
            2 => count(reference::run(case, &inputs.perturbed(coarse, case.data.seed), DType::F64)).map(|o| Member::new("perturbed", o)),
            3 => {
                let out = if low {
                    count(reference::run_reversed(case, &inputs.perturbed_by(dtype, case.data.seed.wrapping_add(1), 2.0), dtype))
                } else {
                    count(reference::run_jittered(case, inputs, 4))
                };
                out.map(|o| Member { probe_only: low, ..Member::new("reordered", o) })
            }
            4 => low
                .then(|| count(reference::run_prec(case, inputs, Prec::new(dtype).reversed().jittered(1))))
                .flatten()
                .map(|o| Member { probe_only: true, ..Member::new("stochastic", o) }),
            5 => {
                self.gradient_noise(coarse).map(|o| Member { later_steps_only: true, probe_only: low, ..Member::new("gradient-noise", o) })
            }
            6 => self.reduce_rounding(coarse).map(|o| Member { gradients_only: true, ..Member::new("reduce-rounding", o) }),
            7 => self.routing_flip(coarse).map(|o| Member::new("routing-flip", o)),
            8 => self.gate_jitter(coarse).map(|o| Member::new("gate-jitter", o)),
            9 => low.then(|| count(reference::run_reversed(case, inputs, dtype))).flatten().map(|o| Member::new("reversed", o)),
            10 => low
                .then(|| count(reference::run_prec(case, inputs, Prec::new(dtype).stochastic_rounding())))
                .flatten()
                .map(|o| Member::new("rounded-stochastically", o)),
            _ => None,
        }
    }

    /// The `target-gradients` member of a run `out` of two or more steps: the f64 reference whose
    /// first step takes the target's own step-0 gradients (which the oracle checks on their own).
    /// A correct target's later steps follow it; an optimizer bug is not in it. It samples later
    /// steps only, where an adaptive step turns the gradients' legitimate round-off into moves of
    /// lr that no single-device member need reproduce (a clean f32 case, tp2 with Adam lr 0.1 and
    /// large attention weights: the target's step-0 flips moved `loss/step1` by 16 %, every
    /// member's by under 10⁻⁵). None when the target did not report every step-0 gradient.
    pub fn target_gradients_member(&self, out: &RunOutput) -> Option<Member> {
        if self.case.train.steps < 2 {
            return None;
        }
        let gradients: ParamSet = self
            .inputs
            .tensors
            .iter()
            .filter(|(name, _)| !self.case.train.is_frozen(name))
            .map(|(name, _)| Some((name.clone(), out.tensor(&format!("grad/{name}")).filter(|t| t.all_finite())?.clone())))
            .collect::<Option<_>>()?;
        self.runs.set(self.runs.get() + 1);
        let output = reference::run_from_step0_gradients(&self.case, &self.inputs, &gradients).ok()?;
        Some(Member { later_steps_only: true, ..Member::new("target-gradients", output) })
    }

    fn routing_flip(&self, coarse: DType) -> Option<RunOutput> {
        let below = self.routing_flip_below(coarse);
        let margin = self.reference().as_ref().ok()?.stats.routing_margin?;
        if margin >= below {
            return None;
        }
        let all = self.run_flipped(Flips { below, ..Flips::default() })?;
        let subsets = flip_subsets(all.stats.near_ties.unwrap_or(0));
        let runs = subsets.into_iter().filter_map(|only| self.run_flipped(Flips { below, only: Some(only), ..Flips::default() }));
        self.farthest(std::iter::once(all).chain(runs))
    }

    /// The `gate-jitter` member: the reference with the gates of one group of tokens at a time moved
    /// by the router probabilities' round-off (half the flip margin: the largest move of a router
    /// probability the members show, at least 2 u), in every MoE case.
    fn gate_jitter(&self, coarse: DType) -> Option<RunOutput> {
        self.reference().as_ref().ok()?.stats.router_probs.as_ref()?;
        let delta = self.routing_flip_below(coarse) / 2.0;
        let model = self.case.model.as_ref()?;
        let top_k = model.moe.as_ref().map_or(1, |m| m.top_k as usize);
        let tokens = (model.batch * model.seq) as usize;
        self.farthest(
            gate_jitters(delta, top_k, tokens).filter_map(|j| self.run_flipped(Flips { gate_jitter: Some(j), ..Flips::default() })),
        )
    }

    fn run_flipped(&self, flips: Flips) -> Option<RunOutput> {
        self.runs.set(self.runs.get() + 1);
        reference::run_routing_flipped(&self.case, &self.inputs, flips).ok()
    }

    /// Per element, the run farthest from the reference.
    fn farthest(&self, runs: impl Iterator<Item = RunOutput>) -> Option<RunOutput> {
        let reference = self.reference().as_ref().ok()?;
        runs.reduce(|mut acc, o| {
            keep_farthest(&mut acc, &o, reference);
            acc
        })
    }

    /// The router margin below which a correct run may route a token the other way:
    /// [`ROUTING_FLIP_ULPS`] u, or twice the largest change of a step-0 router probability
    /// between the reference and a member computed so far, when round-off moves them further
    /// (an ill-conditioned router input: a clean f16 tp4 campaign case with large values moved
    /// router probabilities by far more than 4 u, flipping tokens the 4 u rule kept).
    pub fn routing_flip_below(&self, coarse: DType) -> f64 {
        let floor = ROUTING_FLIP_ULPS * coarse.unit_roundoff();
        let Some(reference) = self.reference().as_ref().ok().and_then(|r| r.stats.router_probs.as_ref()) else {
            return floor;
        };
        let moved = self
            .members
            .iter()
            .filter_map(|m| m.get()?.as_ref()?.output.stats.router_probs.as_ref())
            .flat_map(|probs| probs.iter().zip(reference).map(|(a, b)| (a - b).abs()))
            .fold(0.0, f64::max);
        floor.max(2.0 * moved)
    }

    fn gradient_noise(&self, coarse: DType) -> Option<RunOutput> {
        let case = &self.case;
        if case.train.steps == 0 {
            return None;
        }
        let absolute = self.measured_gradient_noise();
        self.runs.set(self.runs.get() + 1);
        let noise = GradientNoise { relative: 4.0 * coarse.unit_roundoff(), absolute, seed: case.data.seed };
        reference::run_with_gradient_noise(case, &self.inputs, DType::F64, Some(noise)).ok()
    }

    /// Per parameter, twice the largest absolute difference any earlier member shows on its step-0
    /// gradient: the round-off a correct run's gradients carry into the optimizer, as measured
    /// (a fixed few u of the largest gradient undershot it where a gradient's own round-off is
    /// larger: Adam then flips more elements in a correct run than in the noise sample).
    fn measured_gradient_noise(&self) -> std::collections::BTreeMap<String, f64> {
        let Ok(reference) = self.reference() else {
            return Default::default();
        };
        let earlier = self.members(GRADIENT_NOISE);
        let mut out = std::collections::BTreeMap::new();
        for (name, r) in reference.tensors.iter().filter(|(n, _)| n.starts_with("grad/")) {
            let worst = earlier
                .iter()
                .filter_map(|m| m.tensor(name))
                .flat_map(|t| t.data.iter().zip(&r.data).map(|(a, b)| (a - b).abs()).filter(|d| d.is_finite()))
                .fold(0.0, f64::max);
            out.insert(name["grad/".len()..].to_string(), 2.0 * worst);
        }
        out
    }

    /// A reduction in a coarser dtype than the compute dtype (f64 compute, f32 all-reduce) rounds
    /// every partial gradient. When the partials cancel, that round-off is large against their
    /// sum, and no single-device run has it: up to one rounding of u per rank and micro-step, of
    /// independent signs (they add in quadrature).
    fn reduce_rounding(&self, coarse: DType) -> Option<RunOutput> {
        let case = &self.case;
        if coarse == case.train.dtype {
            return None;
        }
        let reference = self.reference().as_ref().ok()?;
        self.runs.set(self.runs.get() + case.model.as_ref().map_or(1, |m| m.batch));
        let rss: ParamSet = reference::row_gradient_root_sum_squares(case, &self.inputs).ok()?;
        let roundings = (case.world() + case.parallel.microbatches as usize * case.train.grad_accumulation as usize) as f64;
        let shift = roundings.sqrt() * coarse.unit_roundoff();
        let tensors = rss
            .iter()
            .filter_map(|(param, s)| {
                let name = format!("grad/{param}");
                let r = reference.tensor(&name)?;
                Some((name, Tensor::new(r.shape.clone(), r.data.iter().zip(&s.data).map(|(x, s)| x + shift * s).collect())))
            })
            .collect();
        Some(RunOutput { tensors, ..Default::default() })
    }
}
