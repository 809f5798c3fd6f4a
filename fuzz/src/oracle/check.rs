//! The comparison of one completed run against the reference and the noise ensemble.

use std::cell::OnceCell;

use shardfuzz_harnesses::case::{Case, OptimizerKind};
use shardfuzz_harnesses::target::RunOutput;
use shardfuzz_harnesses::tensor::Tensor;
use shardfuzz_kernels::DType;

use super::attention_tie::{attention_near_tie, AttentionTie};
use super::compare::ErrorScale;
use super::ensemble::{coarse_dtype, is_later_step, partial_sums, Member, Prepared, ROUTING_FLIP_ULPS};
use super::stats::{norm_per_rms, statistics, sum_per_rms, Stat, Stats};
use super::{nan_max, Oracle, StatCheck, TensorCheck};

/// Everything about the run that decides whether a tensor can be compared at all.
struct Exclusions {
    /// Later steps amplify round-off chaotically: the largest relative change of a later loss
    /// under round-off-level gradient noise, when above `CHAOS`.
    chaotic: Option<f64>,
    /// A saturated attention row round-off may carry to a tie (`attention_tie`).
    attention_tie: Option<AttentionTie>,
    scaler_differs: bool,
    first_step_skipped: bool,
    /// A case without loss scaling whose run the framework's own overflow check skipped at a step
    /// where the single-device run in the case dtype had non-finite gradients too
    /// (`overflow_check_skip`).
    overflow_check_skipped: bool,
    peak: f64,
    overflow_seen: bool,
}

/// `r` moved by `share` of the way to `t` (a probe's move, counted as noise at that share); a
/// non-finite element of `t` stays (it is not comparable whatever the share).
fn toward(r: &Tensor, t: &Tensor, share: f64) -> Tensor {
    if t.shape != r.shape {
        return t.clone();
    }
    Tensor::new(t.shape.clone(), r.data.iter().zip(&t.data).map(|(a, b)| if b.is_finite() { a + share * (b - a) } else { *b }).collect())
}

/// The share of a probe member's move (`Member::probe_only`) that counts as ε, so that a
/// statistic's bound is at least threshold × share = 4 times what a probe moves it by. The probes
/// move every rounding by a whole ulp or every input to its other neighbour, several times what a
/// correct sharded run does (their median bf16 move is 4× the native sharded run's, README "The
/// oracle, measured"); at half share they still bound the tails only they reach, and a 20 %
/// scale of a bf16 tensor is seen in 86 % of `bench sensitivity`'s cases instead of 84 %.
pub const PROBE_SHARE: f64 = 0.5;

/// The most a target's own single-device run (`baseline/…`, the "framework" sample) counts as noise in a
/// step-0 tensor (the logits, the first loss, the gradients), in multiples of what the emulated members
/// and the floors give per statistic. It stands for the framework's own rounding, which differs from
/// the emulated one by a small factor: over the Python test cases and seed corpus on every model target
/// (447 passing runs, 11,959 step-0 tensors, 2026-12-01) at most 7.0× (norm), 5.3× (max element), 3.3×
/// (rms); 99.9 % below 5.2×. A single-device run far beyond that computes something else (our worker's
/// model of the case, or the framework's single-device op, is wrong), and taken whole it hid exactly
/// that: a worker MoE whose capacity kept one token too many passed in f32, its baseline 10⁵ ε off. Later
/// steps' tensors are not capped: after Adam steps the framework's run parts from the emulated ones by
/// up to 2,000× on clean runs (an update's sign decided by round-off), as any run may.
pub const FRAMEWORK_CAP: f64 = 16.0;

/// Caps the "framework" sample's statistics at [`FRAMEWORK_CAP`] times the largest of the other
/// samples and the floors; returns how far beyond the others it was (its largest ratio) when it was capped.
fn cap_framework_sample(samples: &mut [(&str, Stats)], rules: &Rules) -> Option<f64> {
    let mut others = rules.floors;
    for (_, x) in samples.iter().filter(|(n, _)| *n != "framework") {
        for (o, v) in others.iter_mut().zip(x) {
            *o = nan_max(*o, *v);
        }
    }
    let mut worst: Option<f64> = None;
    for (_, x) in samples.iter_mut().filter(|(n, _)| *n == "framework") {
        for (v, o) in x.iter_mut().zip(&others) {
            if *v > FRAMEWORK_CAP * o {
                worst = Some(worst.unwrap_or(0.0).max(*v / o));
                *v = FRAMEWORK_CAP * o;
            }
        }
    }
    worst
}

/// The floor of a replica check's statistics over the whole tensor, in u (`Rules::for_replicas`).
/// Clean native runs (3,000 cases per dtype, seeds 7,000,000–7,002,999) hold 38,161 copy pairs:
/// all but 40–71 per dtype bitwise equal, the others at most 0.08 of their tensor's own ensemble ε
/// apart (largest normwise gap 1.9 u, where that ε was 10⁹ u: a chaotic case).
pub const REPLICA_FLOOR_ULPS: f64 = 0.5;
/// The share of its tensor's ensemble ε two copies of it may differ by (`Rules::for_replicas`):
/// the ensemble's spread is that of different implementations, two copies come from one.
pub const REPLICA_SHARE: f64 = 0.25;

/// The per-statistic floors and thresholds of this case.
#[derive(Clone, Copy)]
struct Rules {
    floors: Stats,
    thresholds: Stats,
    /// The threshold of the second-order term (`stat_bound`).
    second_order: f64,
    /// The unit the floors are counted in: u of the coarser dtype (64 u in f64).
    unit: f64,
}

impl Rules {
    fn new(case: &Case, oracle: &Oracle) -> Rules {
        let u = coarse_dtype(case).unit_roundoff();
        // In f64 the dtype member is the reference itself; the floor stands for the round-off no
        // single-device run samples (another summation order across ranks, amplified by the case's
        // conditioning), so it is set much higher there.
        let f64_factor = if u <= DType::F64.unit_roundoff() { 64.0 } else { 1.0 };
        let unit = u * f64_factor;
        let mut floors = [oracle.stat_floor_ulps * unit; 5];
        floors[Stat::Max as usize] = oracle.noise_floor_ulps * unit;
        let mut thresholds = [oracle.stat_threshold; 5];
        thresholds[Stat::Max as usize] = oracle.threshold;
        thresholds[Stat::Rms as usize] = oracle.rms_threshold;
        Rules { floors, thresholds, second_order: oracle.stat_threshold, unit }
    }

    /// The rules copies of a replicated tensor are held to: the statistics over the whole tensor
    /// take their ε from the ensemble down to a floor of [`REPLICA_FLOOR_ULPS`], not the
    /// comparison's floor. Two correct copies are the same computation (bitwise equal, or a
    /// rounding apart), while the comparison's floor stands for orders no member samples: with it,
    /// a bf16 copy 5 % off passed.
    fn for_replicas(&self) -> Rules {
        let mut floors = [REPLICA_FLOOR_ULPS * self.unit; 5];
        floors[Stat::Max as usize] = self.floors[Stat::Max as usize];
        Rules { floors, ..*self }
    }

    fn bound(&self, stat: Stat, noise: f64) -> f64 {
        stat_bound(stat, self.thresholds[stat as usize], self.second_order, noise)
    }
}

/// Compares every tensor of `out` with the reference, ε from `members` (and the target's own
/// single-device baseline). Returns the checks and notes about the run.
pub fn compare_run(
    prep: &Prepared,
    reference: &RunOutput,
    out: &RunOutput,
    members: &[&Member],
    oracle: &Oracle,
) -> (Vec<TensorCheck>, Vec<String>) {
    let cmp = Comparison::new(prep, reference, out, members, oracle);
    let mut notes = out.notes.clone();
    let mut ex = cmp.exclusions(&mut notes);
    let mut checks = vec![];
    let mut replica_noise = vec![];
    for (name, r) in &reference.tensors {
        let (check, replica) = cmp.check_tensor(name, r, &checks, &mut ex);
        replica_noise.extend(replica.map(|noise| (name.clone(), noise)));
        checks.push(check);
    }
    checks.extend(replica_checks(out, &replica_noise, &cmp.scale, &cmp.rules));
    (checks, notes)
}

/// What every tensor of one run is compared with.
struct Comparison<'a> {
    prep: &'a Prepared,
    reference: &'a RunOutput,
    out: &'a RunOutput,
    members: &'a [&'a Member],
    rules: Rules,
    replica_rules: Rules,
    scale: ErrorScale,
    /// The reference in the case dtype (the `dtype` member).
    dtype_member: Option<&'a RunOutput>,
    first_step: FirstStep<'a>,
    /// `Oracle::probe_share`.
    probe_share: f64,
    /// In MoE cases, the parameters whose gradients flow back through the gates
    /// (`below_the_experts`); empty otherwise.
    below_the_experts: Vec<String>,
}

impl<'a> Comparison<'a> {
    fn new(prep: &'a Prepared, reference: &'a RunOutput, out: &'a RunOutput, members: &'a [&'a Member], oracle: &Oracle) -> Self {
        let rules = Rules::new(&prep.case, oracle);
        Comparison {
            prep,
            reference,
            out,
            members,
            rules,
            replica_rules: rules.for_replicas(),
            scale: ErrorScale::new(&reference.tensors),
            dtype_member: members.iter().find(|m| m.name == "dtype").map(|m| &m.output),
            first_step: FirstStep { out, clip: OnceCell::new() },
            probe_share: oracle.probe_share,
            below_the_experts: if members.iter().any(|m| m.name == "routing-flip" || m.name == "gate-jitter") {
                below_the_experts(&prep.case)
            } else {
                vec![]
            },
        }
    }

    fn has_member(&self, name: &str) -> bool {
        self.members.iter().any(|m| m.name == name)
    }

    /// The share of a probe's move that counts as ε ([`PROBE_SHARE`]), or all of it where
    /// round-off is within reach of a discontinuity: an attention row near a tie, and in MoE cases
    /// the gradients that flow back through the gates (`below_the_experts`). There a correct run's
    /// round-off is carried past anything realistic rounding samples:
    /// `tests/clean-cases/bf16-4018098-moe-gates-round-off-saturated-softmax-tp3.json` (near-tie
    /// routing: a router-weight gradient 9.5 ε past the realistic members and the probes at half
    /// share, 7.7 ε with them whole), and a clean f32 campaign case without a near tie
    /// (`f32-campaign-moe-gates-norm-grad-below-the-experts.json`: a norm gradient below the experts
    /// 9.7 ε past them at half share). Above the experts (logits, loss, later layers) the probes
    /// count at their share: whole there too, 859 of 1,000 bf16 `bench sensitivity` cases saw a
    /// 20 % short tensor instead of 876 (×1.25: 897 and 895). Counting the `gate-jitter` member
    /// as ε instead fits neither case: the f32 one needs it whole (7.0 ε), and whole it hides a
    /// halved output-layer gradient (`fuzz/tests/oracle_attention_tie.rs`). Chaotic later steps
    /// need no such rule: their tensors are not compared at all.
    fn probe_share(&self, ex: &Exclusions, name: &str) -> f64 {
        let param = name.strip_prefix("grad/").or_else(|| name.strip_prefix("param/"));
        if ex.attention_tie.is_some() || param.is_some_and(|p| self.below_the_experts.iter().any(|b| b == p)) {
            1.0
        } else {
            self.probe_share
        }
    }

    /// What cannot be compared in this run, with a note for each reason.
    fn exclusions(&self, notes: &mut Vec<String>) -> Exclusions {
        let case = &self.prep.case;
        let mut ex = exclusions(case, self.reference, self.out, (self.dtype_member, self.members), notes);
        // Top-k routing is discontinuous: a token whose k-th and (k+1)-th router probabilities are
        // closer than round-off can be routed differently by any correct implementation.
        let below = self.prep.routing_flip_below(coarse_dtype(case));
        if let (true, Some(m)) = (self.has_member("routing-flip"), self.reference.stats.routing_margin) {
            notes.push(format!(
                "MoE routing within {m:.2e} of a tie (below {below:.2e}: {ROUTING_FLIP_ULPS} u, or twice what round-off moved a router probability in the members): elements those tokens move when routed the other way are left out"
            ));
        }
        if self.has_member("gate-jitter") {
            notes.push(format!(
                "MoE gates moved by ±{:.2e} (the router probabilities' round-off): elements that moves past {} times any other member's move are left out",
                below / 2.0,
                self.rules.thresholds[Stat::Rms as usize]
            ));
        }
        ex.chaotic = chaos(self.reference, self.members, coarse_dtype(case).unit_roundoff());
        if let Some(c) = ex.chaotic {
            notes.push(format!(
                "later steps amplify round-off: a noise member moves a later loss by {:.1} %; tensors after step 0 not comparable",
                100.0 * c
            ));
        }
        ex.attention_tie = attention_near_tie(self.reference, self.members);
        notes.extend(ex.attention_tie.map(|t| t.note()));
        ex
    }

    /// The check of one reference tensor (`checks`: those of the tensors before it), and the noise
    /// its replicas are held to when the target reported copies of it.
    fn check_tensor(&self, name: &str, r: &Tensor, checks: &[TensorCheck], ex: &mut Exclusions) -> (TensorCheck, Option<ReplicaNoise>) {
        let (case, out) = (&self.prep.case, self.out);
        let denom = self.scale.denominator(name, r);
        let dtype_value = self.dtype_member.and_then(|b| b.tensor(name));
        let target = out.tensor(name).filter(|t| t.shape == r.shape);
        let overflow = target.filter(|t| !t.all_finite()).and_then(|_| near_overflow(case, dtype_value.unwrap_or(r), ex.peak));
        let (adam, undecided) = adam_samples(self.prep, self.reference, &self.first_step, checks, &self.scale, name);
        let share = self.probe_share(ex, name);
        let probes: Vec<(&str, Tensor)> =
            self.members.iter().filter(|m| m.probe_only).filter_map(|m| Some((m.name, toward(r, m.tensor(name)?, share)))).collect();
        let mut others: Vec<(&str, &Tensor)> =
            self.members.iter().filter(|m| !m.probe_only).filter_map(|m| Some((m.name, m.tensor(name)?))).collect();
        others.extend(probes.iter().map(|(n, t)| (*n, t)));
        others.extend(out.baseline_tensor(name).filter(|b| b.shape == r.shape).map(|b| ("framework", b)));
        others.extend(adam.iter().map(|t| ("adam", t)));
        let mask = self.comparable_mask(r, &mut others, target.filter(|_| overflow.is_some()), denom);
        let mask = without_undecided(mask, undecided);
        let mut samples: Vec<(&str, Stats)> = others.iter().map(|(n, x)| (*n, statistics(x, r, denom, mask.as_deref()))).collect();
        samples.extend(underflow_sample(case, r, denom, mask.as_deref()));
        let capped = if is_later_step(name) { None } else { cap_framework_sample(&mut samples, &self.rules) };
        let per_rms = (SIGMAS * sum_per_rms(r, denom, mask.as_deref()), SIGMAS * norm_per_rms(r, mask.as_deref()));
        let adaptive = is_later_step(name) && case.train.optimizer.kind != OptimizerKind::Sgd;
        let mut check = noise_check(name, &samples, &self.rules, per_rms, adaptive);
        let replica = out.replicas.iter().any(|(n, _)| n == name).then(|| {
            let copies: Vec<(&str, Stats)> = samples.iter().map(|(n, x)| (*n, x.map(|v| v * REPLICA_SHARE))).collect();
            ReplicaNoise { stats: noise_check(name, &copies, &self.replica_rules, per_rms, adaptive).stats, mask: mask.clone() }
        });
        match out.tensor(name) {
            None => check.note = Some(format!("{MISSING}: the target did not produce this tensor")),
            Some(t) if t.shape != r.shape => {
                check.pass = false;
                check.error = f64::INFINITY;
                check.ratio = f64::INFINITY;
                check.stats.clear();
                check.note = Some(format!("{WRONG_SHAPE} {:?} where the reference's is {:?}", t.shape, r.shape));
            }
            Some(t) => judge_tensor(&mut check, name, t, r, denom, Masked { mask: mask.as_deref(), overflow }, ex),
        }
        if let (Some(ratio), None) = (capped, &check.note) {
            check.note = Some(format!(
                "the target's own single-device run is {ratio:.0}× the emulated members' ε off the reference: \
                 counted as noise up to {FRAMEWORK_CAP}× only"
            ));
        }
        (check, replica)
    }

    /// The elements of `r` that can be compared (None: all): not those whose reference overflowed
    /// where the target's did, nor those a routing flip or gate jitter moves (those two runs are
    /// taken out of `others`: they mark elements, they are not noise samples).
    fn comparable_mask(&self, r: &Tensor, others: &mut Vec<(&str, &Tensor)>, overflowed: Option<&Tensor>, denom: f64) -> Option<Vec<bool>> {
        let mut take = |name: &str| others.iter().position(|(n, _)| *n == name).map(|i| others.remove(i).1);
        let (flipped, jittered) = (take("routing-flip"), take("gate-jitter"));
        let mut mask = comparable_elements(r, others, overflowed);
        let floor = ROUTING_FLIP_ULPS * coarse_dtype(&self.prep.case).unit_roundoff() * denom;
        if let Some(f) = flipped {
            mask = Some(without_moved(r, f, others, mask, FLIP_MOVE, floor));
        }
        if let Some(j) = jittered {
            mask = Some(without_moved(r, j, others, mask, self.rules.thresholds[Stat::Rms as usize], floor));
        }
        mask
    }
}

/// The parameters at or below the last MoE layer's experts in forward order (the router and
/// experts included): those whose gradients flow back through the gates.
fn below_the_experts(case: &Case) -> Vec<String> {
    let mut params: Vec<String> = case.model.as_ref().map(|m| m.params().into_iter().map(|p| p.name).collect()).unwrap_or_default();
    let last = params.iter().rposition(|p| p.contains(".moe.")).map_or(0, |i| i + 1);
    params.truncate(last);
    params
}

/// Near zero a dtype's rounding is absolute: its values there are multiples of the smallest
/// subnormal q, and each partial sum a sharded run adds (one per rank, micro-batch and accumulation
/// step), and the sum itself, may round by q/2 whatever its size, where a single-device run rounds
/// once. The sample is the reference moved by that much, with alternating signs, on every element;
/// it decides only where a tensor's values come within a few q of zero (a clean f16 case with three
/// accumulation steps had a final-norm gradient of 10⁻⁹, below f16's q = 6·10⁻⁸, come out ±q on
/// four elements where every single-device member rounded it to zero: 36 ε past them).
fn underflow_sample(case: &Case, r: &Tensor, denom: f64, mask: Option<&[bool]>) -> Option<(&'static str, Stats)> {
    let dtype = coarse_dtype(case);
    if dtype == DType::F64 {
        return None;
    }
    let moved = (partial_sums(case) + 1) as f64 * dtype.smallest_subnormal() / 2.0;
    let data = r.data.iter().enumerate().map(|(i, &v)| if i % 2 == 0 { v + moved } else { v - moved }).collect();
    Some(("underflow", statistics(&Tensor::new(r.shape.clone(), data), r, denom, mask)))
}

/// The note of a tensor the target did not produce: a harness error, never a pass.
pub const MISSING: &str = "missing";
/// A check's note starts with this when the target's tensor has another shape than the reference's:
/// its statistics were not computed.
pub const WRONG_SHAPE: &str = "wrong shape";

fn exclusions(
    case: &Case,
    reference: &RunOutput,
    out: &RunOutput,
    (dtype_run, members): (Option<&RunOutput>, &[&Member]),
    notes: &mut Vec<String>,
) -> Exclusions {
    let skips = |o: Option<&RunOutput>| o.and_then(|o| o.stats.skipped_steps.clone());
    let single = skips(dtype_run).or_else(|| skips(Some(reference)));
    let target = skips(Some(out));
    let scaled = case.train.loss_scale.is_some();
    // Per step, whether the reference's loss-scaled backward came within the sharding's headroom of
    // the dtype's range (`near_overflow`'s rule).
    let headroom = sharding_headroom(case);
    let near: Vec<bool> = reference.stats.scaled_peaks.iter().flatten().map(|p| p * headroom >= case.train.dtype.max_finite()).collect();
    let scaler_differs = scaled && target != single && scaler_decisions_within_noise(target.as_deref(), single.as_deref(), &near, members);
    if scaled && target != single {
        let (t, s) = (target.clone().unwrap_or_default(), single.clone().unwrap_or_default());
        notes.push(if scaler_differs {
            format!("loss scaler skipped steps {t:?} in the target, {s:?} single-device: gradients and parameters not comparable")
        } else {
            format!("loss scaler skipped steps {t:?} in the target, {s:?} single-device, where every noise member decides as the single-device run: compared as they are")
        });
    }
    // Step 0's gradients overflowed: not comparable where that is what the single-device run does,
    // or a noise member shows the step's overflow within round-off.
    let first_skipped = |s: &Option<Vec<bool>>| s.as_ref().is_some_and(|s| s.first() == Some(&true));
    Exclusions {
        chaotic: None,
        attention_tie: None,
        scaler_differs,
        first_step_skipped: scaled && first_skipped(&target) && (first_skipped(&single) || scaler_differs),
        overflow_check_skipped: !scaled && overflow_check_skip(out, dtype_run, notes),
        // (the loss-scaled backward's own peaks count: they are intermediates of the run too)
        peak: reference.stats.scaled_peaks.iter().flatten().fold(reference.stats.peak_activation.unwrap_or(0.0), |m, &p| m.max(p)),
        overflow_seen: false,
    }
}

/// Whether round-off explains a dynamic loss scaler deciding otherwise in the target than in the
/// single-device run. An overflow depends on intermediate magnitudes that sharding legitimately
/// changes, so a decision may differ at a step k (the first where they differ; the scale the same
/// until then) that is near the threshold: where the reference's loss-scaled backward came within
/// the sharding's headroom of the dtype's range at step k (`near`: a clean native f16 case, dp2 tp3
/// at a scale of 65536, skipped step 1 where the single-device run and every noise member applied
/// it), or where a noise member that decided as the single-device run before k decides step k
/// otherwise. Elsewhere the target's scaler did what no correct run does (skipped a step whose
/// gradients are far from overflowing, or applied one every member overflows): its tensors are
/// compared as they are, and the step it skipped or applied shows in them. A list of another
/// length is not judged by it.
fn scaler_decisions_within_noise(target: Option<&[bool]>, single: Option<&[bool]>, near: &[bool], members: &[&Member]) -> bool {
    let (Some(target), Some(single)) = (target, single) else {
        return true;
    };
    if target.len() != single.len() {
        return true;
    }
    let Some(k) = target.iter().zip(single).position(|(a, b)| a != b) else {
        return true;
    };
    near.get(k) == Some(&true)
        || members
            .iter()
            .filter_map(|m| m.output.stats.skipped_steps.as_deref())
            .any(|s| s.len() == single.len() && s[..k] == single[..k] && s[k] != single[k])
}

/// Some frameworks check every fp16 step for overflow whether or not the loss is scaled
/// (Colossal-AI's fp16 precision: its scaler at a fixed scale of 1 still skips the step), where a
/// plain single-device run applies it. Whether a step whose gradients overflow in the case dtype is
/// applied or skipped is the framework's policy: the tensors after it are not comparable. A skip at
/// a step whose gradients are finite in the case dtype is not excused: the parameters then differ.
fn overflow_check_skip(out: &RunOutput, dtype_run: Option<&RunOutput>, notes: &mut Vec<String>) -> bool {
    let Some(step) = out.stats.skipped_steps.as_ref().and_then(|s| s.iter().position(|&x| x)) else {
        return false;
    };
    // The target's own single-device run (its step-0 gradients) may overflow where the emulated
    // one does not: an fp16 norm's backward computed in fp16.
    let overflowed = dtype_run.and_then(|d| d.stats.nonfinite_grad_steps.as_ref()).is_some_and(|o| o.get(step) == Some(&true))
        || (step == 0 && out.baseline.iter().any(|(n, t)| n.starts_with("grad/") && !t.all_finite()));
    notes.push(if overflowed {
        format!("the framework's overflow check skipped step {step} (a case without loss scaling), whose gradients are not finite on one device in the case dtype either: later steps not comparable")
    } else {
        format!("the framework's overflow check skipped step {step} (a case without loss scaling), whose gradients are finite on one device in the case dtype: compared as they are")
    });
    overflowed
}

/// Raises a statistic's ε to `floor` (its bound follows: `set_bounds`); `why` names where the
/// floor came from.
fn raise_noise(s: &mut StatCheck, floor: f64, why: impl FnOnce() -> String) {
    if s.noise < floor {
        s.noise = floor;
        s.member = Some(why());
    }
}

/// The bound of a statistic whose ε is `noise`: threshold × ε, plus, for the statistics over the
/// whole tensor, the second-order term (second_order × ε)²/2 (`second_order` is the statistics'
/// threshold, also when calibrating the normwise error's own). Relative errors compose
/// multiplicatively (a product of two values each off by e is off by 2e + e²), so once a tensor's
/// noise is a sizable fraction of the tensor itself (bf16 query/key gradients of nearly uniform
/// attention: ε 0.2–2 of their own size) the first-order spread of a handful of members
/// undershoots a correct sharded run's: clean bf16 cases met such tensors 5–12 ε past every member.
/// For the ε that decide a 20 % or 50 % scale (a few percent) the term is negligible.
pub fn stat_bound(stat: Stat, threshold: f64, second_order: f64, noise: f64) -> f64 {
    let first = threshold * noise;
    if stat == Stat::Max {
        first
    } else {
        first + (second_order * noise).powi(2) / 2.0
    }
}

/// A tensor's ε per statistic from the noise samples, with every rule that keeps a statistic's ε
/// no smaller than what the others imply (its bounds set).
fn noise_check(name: &str, samples: &[(&str, Stats)], rules: &Rules, per_rms: (f64, f64), adaptive: bool) -> TensorCheck {
    let mut check = tensor_check(name, samples, rules);
    bound_projections_by_normwise(&mut check, per_rms);
    if adaptive {
        bound_by_normwise(&mut check);
    }
    set_bounds(&mut check, rules);
    check
}

fn set_bounds(check: &mut TensorCheck, rules: &Rules) {
    for s in &mut check.stats {
        s.bound = rules.bound(s.stat, s.noise);
    }
}

/// After an Adam-family step, a tensor's error is the optimizer's amplification of round-off (an
/// element whose gradient is round-off moves by lr either way), not round-off itself: where those
/// moves add up coherently is not sampled by one noise run. The normwise error bounds the others
/// (|‖t‖ − ‖r‖| ≤ ‖t − r‖, and the sum and the direction of random-sign errors move no more), so
/// their ε is taken no smaller than the normwise one.
fn bound_by_normwise(check: &mut TensorCheck) {
    let rms = check.stats[Stat::Rms as usize].noise;
    for s in check.stats.iter_mut().filter(|s| matches!(s.stat, Stat::Norm | Stat::Sum | Stat::Direction)) {
        raise_noise(s, rms, || "rms (after an adaptive step)".into());
    }
}

/// The sum's and the norm's ε are at least this many standard deviations of what a random error
/// of the normwise noise's size moves them by (`stats::sum_per_rms`, `stats::norm_per_rms`).
pub const SIGMAS: f64 = 2.0;

fn bound_projections_by_normwise(check: &mut TensorCheck, (sum_per_rms, norm_per_rms): (f64, f64)) {
    let rms = &check.stats[Stat::Rms as usize];
    let (noise, from) = (rms.noise, rms.member.clone().unwrap_or_else(|| "floor".into()));
    raise_noise(&mut check.stats[Stat::Sum as usize], noise * sum_per_rms, || format!("rms ({from}) as a random-sign sum"));
    raise_noise(&mut check.stats[Stat::Norm as usize], noise * norm_per_rms, || format!("rms ({from}) projected on the reference"));
}

/// A later loss that moves by more than this fraction (and by more than [`CHAOS_ULPS`] u) in a
/// member, whose every difference from the reference is round-off, marks a run whose later steps
/// are chaotic (Adam with a large step on large values).
pub const CHAOS: f64 = 0.01;
/// In bf16 a later loss computed from rounded activations moves by a few u without any chaos.
pub const CHAOS_ULPS: f64 = 16.0;

/// How far any member moves the later losses, relative to the reference, when that exceeds
/// [`CHAOS`] and [`CHAOS_ULPS`] u. One noise run cannot sample where a chaotic step lands: a clean
/// f32 campaign case (tp3 + sp, Adam lr 0.1, large values) moved a later loss by 17 % under
/// gradient noise and its sharded run by 10 %, while its step-0 gradients agreed to 1e-6; in
/// another (dp3 tp2 sp, ZeRO-2, AdamW lr 0.1) only the stochastic-rounding member moved the step-1
/// loss (by 12 %), and the final norm's bias after it moved 120× further in the sharded run than
/// in that member (`tests/clean-cases/f32-campaign-adamw-chaotic-step1.json`).
///
/// The loss at the final parameters (`stats.final_loss`, one forward past the last step) counts as
/// a later loss: no loss the run reports shows where the last step's gradients took it, and a
/// clean bf16 campaign case (SGD lr 0.1 with weight decay, two steps, large values, tp2) left a
/// value projection 11 ε off after its second step while both losses agreed; with a third step
/// the members moved `loss/step2` past the chaos bound.
fn chaos(reference: &RunOutput, members: &[&Member], u: f64) -> Option<f64> {
    let relative = |a: f64, r: f64| (a - r).abs() / r.abs().max(f64::MIN_POSITIVE);
    let later = reference
        .tensors
        .iter()
        .filter(|(n, _)| n.starts_with("loss/") && is_later_step(n))
        .flat_map(|(n, r)| members.iter().filter_map(move |m| Some(relative(m.output.tensor(n)?.data[0], r.data[0]))));
    let last = reference
        .stats
        .final_loss
        .into_iter()
        .flat_map(|r| members.iter().filter_map(move |m| Some(relative(m.output.stats.final_loss?, r))));
    let worst = later.chain(last).fold(0.0, f64::max);
    (worst > CHAOS.max(CHAOS_ULPS * u)).then_some(worst)
}

/// ε per statistic: the largest error of any ensemble member, never below the floor; the
/// direction's never below the normwise error's (a single-device run computes equal elements
/// equally and moves them together, where ranks round each their own way: a clean campaign met
/// logits of identical tokens whose members all kept direction 0, and the sharded run did not).
fn tensor_check(name: &str, samples: &[(&str, Stats)], rules: &Rules) -> TensorCheck {
    let mut stats: Vec<StatCheck> = Stat::ALL
        .iter()
        .map(|&s| {
            let i = s as usize;
            let (member, noise) = samples.iter().fold((None, rules.floors[i]), |(m, e), (n, x)| {
                if x[i].is_nan() || e.is_nan() {
                    (Some(*n), f64::NAN)
                } else if x[i] > e {
                    (Some(*n), x[i])
                } else {
                    (m, e)
                }
            });
            StatCheck {
                stat: s,
                error: 0.0,
                noise,
                bound: rules.thresholds[i] * noise,
                ratio: 0.0,
                pass: true,
                member: member.map(str::to_string),
            }
        })
        .collect();
    let rms = stats[Stat::Rms as usize].clone();
    let from_rms = || format!("rms ({})", rms.member.as_deref().unwrap_or("floor"));
    raise_noise(&mut stats[Stat::Direction as usize], rms.noise, from_rms);
    // A run whose normwise error is within its bound (T·ε_rms) may move the norm by the second-order
    // term alone, (T·ε_rms)²/2 (T: the statistics' threshold): a tensor made mostly of round-off (a bf16 parameter after a large
    // step on large values, elementwise ε 26 %) cannot be judged by its norm more tightly than that.
    raise_noise(&mut stats[Stat::Norm as usize], rules.second_order * rms.noise * rms.noise / 2.0, from_rms);
    let max = &stats[Stat::Max as usize];
    let by = |n: &str| samples.iter().filter(|(m, _)| *m == n).map(|(_, s)| s[Stat::Max as usize]).fold(0.0, nan_max);
    TensorCheck {
        tensor: name.to_string(),
        error: 0.0,
        baseline_error: nan_max(by("dtype"), by("framework")),
        perturbation_error: samples.iter().filter(|(m, _)| *m != "dtype" && *m != "framework").map(|(_, s)| s[0]).fold(0.0, nan_max),
        noise: max.noise,
        bound: max.bound,
        ratio: 0.0,
        pass: true,
        note: None,
        decided_by: None,
        stats,
    }
}

/// Which elements of a tensor are compared, and the overflow that excluded some.
struct Masked<'a> {
    mask: Option<&'a [bool]>,
    overflow: Option<String>,
}

/// The elements that can be compared: finite in the reference and in every noise sample, and, when
/// the target's overflow is explained by the case's range (`overflowed`), finite in the target.
/// None when every element is.
fn comparable_elements(r: &Tensor, others: &[(&str, &Tensor)], overflowed: Option<&Tensor>) -> Option<Vec<bool>> {
    let all = |t: &Tensor| t.all_finite();
    if all(r) && others.iter().all(|(_, t)| all(t)) && overflowed.is_none_or(all) {
        return None;
    }
    let finite = |t: &Tensor, i: usize| t.data.get(i).is_none_or(|x| x.is_finite());
    Some(
        (0..r.data.len())
            .map(|i| finite(r, i) && others.iter().all(|(_, t)| finite(t, i)) && overflowed.is_none_or(|t| finite(t, i)))
            .collect(),
    )
}

/// How many times any other member's move a routing flip must move an element to be left out.
const FLIP_MOVE: f64 = 2.0;

/// Leaves out the elements that tokens routed within round-off of a tie move: where the reference
/// with those tokens routed the other way (`variant`) differs from it by more than `factor` times
/// what any other member does, plus `floor`. Top-k routing is discontinuous, so a correct
/// implementation may route exactly those tokens either way; the other elements are still compared
/// with the other members' ε (raising the whole tensor's ε instead hid a halved expert gradient in
/// bf16). The same for the gates moved by their round-off (`gate-jitter`), a continuous move: only
/// where it takes an element past the statistics' threshold times the other members' move, past
/// what the comparison would accept anyway (left out at twice, the elements of a clean bf16 case's
/// output-layer gradient the gates move left a halved copy of it within its bounds).
fn without_moved(r: &Tensor, variant: &Tensor, others: &[(&str, &Tensor)], mask: Option<Vec<bool>>, factor: f64, floor: f64) -> Vec<bool> {
    let mut keep = mask.unwrap_or_else(|| vec![true; r.data.len()]);
    for (i, k) in keep.iter_mut().enumerate() {
        let noise =
            others.iter().filter_map(|(_, t)| t.data.get(i)).map(|x| (x - r.data[i]).abs()).filter(|d| d.is_finite()).fold(0.0, f64::max);
        let moved = variant.data.get(i).map_or(f64::INFINITY, |x| (x - r.data[i]).abs());
        if moved.is_nan() || moved > factor * noise + floor {
            *k = false;
        }
    }
    keep
}

fn judge_tensor(check: &mut TensorCheck, name: &str, t: &Tensor, r: &Tensor, denom: f64, masked: Masked, ex: &mut Exclusions) {
    let values = statistics(t, r, denom, masked.mask);
    for s in &mut check.stats {
        s.error = values[s.stat as usize];
        s.ratio = s.error / s.noise;
        s.pass = !(s.error.is_nan() || s.error > s.bound);
    }
    let max = &check.stats[Stat::Max as usize];
    check.error = max.error;
    check.ratio = max.ratio;
    let after_first_step = is_later_step(name);
    let compared = masked.mask.map_or(t.data.len(), |m| m.iter().filter(|&&x| x).count());
    // After an overflow the global gradient norm (clipping) and the loss scaler couple every
    // parameter to it, so later steps are not compared at all; within a tensor, only the
    // overflowed elements are left out.
    let why_not = if ex.scaler_differs && (name.starts_with("grad/") || after_first_step) {
        Some("loss scaler decisions differ: not comparable".into())
    } else if ex.first_step_skipped && name.starts_with("grad/") {
        Some("step 0 overflowed and was skipped by the loss scaler: not comparable".into())
    } else if ex.overflow_check_skipped && after_first_step {
        Some("the framework skipped a step that overflows in the case dtype (see notes): not comparable".into())
    } else if ex.chaotic.is_some() && after_first_step {
        Some("later steps amplify round-off chaotically (see notes): not comparable".into())
    } else if ex.attention_tie.is_some_and(|t| t.reaches(name)) {
        Some("below an attention row within reach of a tie (see notes): not comparable".into())
    } else if ex.overflow_seen && after_first_step {
        Some("an earlier tensor overflowed: not comparable".into())
    } else if compared == 0 && !t.data.is_empty() {
        ex.overflow_seen |= masked.overflow.is_some();
        let why = masked.overflow.as_deref().unwrap_or("no element is finite in the reference and every noise sample, or decided by round-off (a near-tie routing, an Adam update's sign)");
        Some(format!("{why}: no element left to compare, not comparable"))
    } else {
        None
    };
    if why_not.is_some() {
        check.note = why_not;
        return;
    }
    if let Some(why) = masked.overflow {
        ex.overflow_seen = true;
        check.note = Some(format!("{why}; the {compared} finite elements of {} compared", t.data.len()));
    } else if compared < t.data.len() {
        check.note = Some(format!(
            "{compared} of {} elements compared (the others not finite in the reference or a noise sample, or moved by a near-tie routing or an Adam update whose sign is within round-off)",
            t.data.len()
        ));
    }
    let worst = check.stats.iter().filter(|s| !s.pass).max_by(|a, b| (a.error / a.bound).total_cmp(&(b.error / b.bound)));
    if let Some(s) = worst {
        check.pass = false;
        check.decided_by = Some(s.stat);
    }
}

/// What the copies of one replicated tensor are held to.
struct ReplicaNoise {
    /// The replica rules' ε of the tensor, per statistic.
    stats: Vec<StatCheck>,
    /// The elements its comparison with the reference left out are left out here too: an Adam
    /// update whose sign is within round-off may come out either way on each copy (a clean bf16
    /// `bench clean` case, seed 20,069,554, tp and dp with ZeRO-2: two copies of a norm weight 13 ε
    /// apart once those elements stopped counting as noise).
    mask: Option<Vec<bool>>,
}

/// Copies of a replicated tensor must agree: each rank's copy against the first holder's, on every
/// statistic, within the thresholds × `noise` (the replica rules' ε of the tensor: a share of its
/// ensemble ε, `Rules::for_replicas`), or × the comparison's floors for a tensor not compared itself.
fn replica_checks(out: &RunOutput, noise: &[(String, ReplicaNoise)], scale: &ErrorScale, rules: &Rules) -> Vec<TensorCheck> {
    let mut result = vec![];
    for (name, copies) in &out.replicas {
        let Some((r0, first)) = copies.first() else {
            continue;
        };
        let own = noise.iter().find(|(n, _)| n == name).map(|(_, s)| s);
        let noise = |s: Stat| own.map(|c| c.stats[s as usize].noise).filter(|n| n.is_finite()).unwrap_or(rules.floors[s as usize]);
        let denom = scale.denominator(name, first);
        let mask = own.and_then(|c| c.mask.as_deref());
        let mut worst: Option<(usize, Vec<StatCheck>)> = None;
        for (rank, t) in copies.iter().skip(1) {
            let values = statistics(t, first, denom, mask.filter(|m| m.len() == t.data.len()));
            let stats: Vec<StatCheck> = Stat::ALL
                .iter()
                .map(|&s| {
                    let (error, noise) = (values[s as usize], noise(s));
                    let bound = rules.bound(s, noise);
                    StatCheck { stat: s, error, noise, bound, ratio: error / noise, pass: !(error.is_nan() || error > bound), member: None }
                })
                .collect();
            let badness =
                |v: &[StatCheck]| v.iter().map(|s| if s.error.is_nan() { f64::INFINITY } else { s.error / s.bound }).fold(0.0, f64::max);
            if worst.as_ref().is_none_or(|(_, w)| badness(&stats) > badness(w)) {
                worst = Some((*rank, stats));
            }
        }
        let Some((rank, stats)) = worst else {
            continue;
        };
        let max = &stats[Stat::Max as usize];
        let failed = stats.iter().filter(|s| !s.pass).max_by(|a, b| (a.error / a.bound).total_cmp(&(b.error / b.bound))).map(|s| s.stat);
        result.push(TensorCheck {
            tensor: format!("replicas/{name}"),
            error: max.error,
            baseline_error: 0.0,
            perturbation_error: 0.0,
            noise: max.noise,
            bound: max.bound,
            ratio: max.ratio,
            pass: failed.is_none(),
            note: Some(format!("rank {rank} against rank {r0}")),
            decided_by: failed,
            stats,
        });
    }
    result
}

/// For Adam-family optimizers, the noise a parameter inherits from its gradient: Adam divides each
/// gradient element by its own magnitude, so an element of size |g| carrying absolute noise δ (the
/// gradient's ε) moves by up to 2·lr·min(1, δ/|g|) per step (its sign may flip). The first step is
/// known exactly where the target reported its step-0 gradient (`Step0`).
fn adam_moves(
    case: &Case,
    reference: &RunOutput,
    first_step: &FirstStep,
    checks: &[TensorCheck],
    scale: &ErrorScale,
    name: &str,
    initial: Option<&Tensor>,
) -> Option<AdamMoves> {
    if case.train.optimizer.kind == OptimizerKind::Sgd {
        return None;
    }
    let param = name.strip_prefix("param/")?;
    let gname = format!("grad/{param}");
    let g = reference.tensor(&gname)?;
    let check = checks.iter().find(|c| c.tensor == gname)?;
    let delta = check.noise * scale.denominator(&gname, g);
    let opt = &case.train.optimizer;
    let (lr, steps) = (opt.lr.get(), case.train.steps as f64);
    let p = reference.tensor(name)?;
    // Adam's first step moves an element by lr · sign(g): a gradient element within its noise of
    // zero may come out with either sign, a change of 2 lr (a clean bf16 case, pp3, lr 0.03, met
    // it on a bias whose gradient elements were round-off).
    // Adam (not AdamW) adds the L2 term to the gradient before normalising: its sign is that of
    // g + wd · p, which may be near zero where g is not.
    let l2 = if opt.kind == OptimizerKind::Adam { opt.weight_decay.get() } else { 0.0 };
    let l2_term = |i: usize| l2 * initial.and_then(|t| t.data.get(i)).copied().unwrap_or(0.0);
    let clip = *first_step.clip.get_or_init(|| clip_range(case, reference, checks));
    let u = coarse_dtype(case).unit_roundoff();
    // The share of 2 lr an element may move by: all of it where x = c · g + wd · p may come out with
    // either sign (within the gradient's noise or `sign_roundoff` of zero); further out, the
    // gradient's noise over x.
    let flips = |i: usize, gi: f64| {
        let unclipped = (gi + l2_term(i)).abs().min(gi.abs());
        let before = if unclipped <= delta { 1.0 } else { delta / unclipped };
        let x = (clip.reference * gi + l2_term(i)).abs().min(gi.abs());
        let (d, r) = (clip.reference * delta, sign_roundoff(u, clip, gi, l2_term(i)));
        let clipped = if x <= d + r { 1.0 } else { d / x };
        f64::max(before, clipped)
    };
    let step0 = first_step.out.tensor(&gname).filter(|t| t.shape == g.shape).map(|own| Step0 { own, eps: opt.eps.get(), u, clip });
    let moves: Vec<f64> = g
        .data
        .iter()
        .enumerate()
        .map(|(i, &gi)| {
            let flips = flips(i, gi);
            match step0.as_ref().and_then(|s| s.move_of(s.own.data[i], gi, l2_term(i))) {
                Some(first) => lr * first + 2.0 * lr * (steps - 1.0) * flips,
                None => 2.0 * lr * steps * flips,
            }
        })
        .collect();
    let up = p.data.iter().zip(&moves).map(|(x, m)| x + m).collect();
    let outward = p.data.iter().zip(&moves).map(|(x, m)| x + m.copysign(*x)).collect();
    let undecided = moves.iter().map(|&m| m > 0.0 && m >= lr * UNDECIDED_STEPS).collect();
    Some(AdamMoves { up: Tensor::new(p.shape.clone(), up), outward: Tensor::new(p.shape.clone(), outward), undecided })
}

/// What round-off in its gradients may do to a parameter an Adam-family optimizer updated.
struct AdamMoves {
    /// Every element moved as far as it may, all the same way (the worst case for the sum).
    up: Tensor,
    /// Every element moved as far as it may away from zero (the worst case for the norm).
    outward: Tensor,
    /// The elements that may move by [`UNDECIDED_STEPS`] whole updates or more: their update's
    /// sign is within round-off (a gradient element within its noise of zero), so a correct run
    /// may take either; they are left out of the comparison like a near-tie routing's elements.
    /// Counted as noise instead, the few of them set the ε of every other element: a bf16
    /// parameter scaled by 0.8 after two Adam steps passed in 10 of 200 `bench sensitivity` cases.
    undecided: Vec<bool>,
}

/// How many whole Adam updates (lr each) an element may move by before it is left out
/// (`AdamMoves::undecided`): a sign flip is two.
const UNDECIDED_STEPS: f64 = 1.0;

/// Adam's first update of an element is lr · a(x), a(x) = x / (|x| + eps) (m̂ = x, v̂ = x² after
/// bias correction), x = c · g + wd · p for Adam's L2 term and a clipping coefficient c: ±lr
/// wherever |x| is far above eps, whatever its size. With the target's own step-0 gradient (which
/// the oracle checks on its own) that move is known, not guessed: a parameter whose gradient no run
/// gave a contribution (the embedding row of a token absent from the batch, the query projection
/// of a one-token sequence) or whose x keeps one sign in both runs moves apart by what eps makes of
/// the two, and one whose signs differ moves 2 lr. The target's c is not reported, so a sign
/// counts only when it holds for every c in `clip` (a clean bf16 case, Adam with L2 and clipping:
/// c · g and wd · p nearly cancelled, and the target's 6 % gradient round-off flipped the sum).
struct Step0<'a> {
    own: &'a Tensor,
    eps: f64,
    /// The unit round-off of the case dtype, in which the target forms c · g + wd · p.
    u: f64,
    /// The reference's clipping coefficient and the range the target's lies in ((1, 1, 1) without
    /// clipping).
    clip: Clip,
}

/// The target's run as the first Adam step needs it: its own step-0 gradients, and the clipping
/// coefficient's range, computed once per run (every gradient is checked before any parameter).
struct FirstStep<'a> {
    out: &'a RunOutput,
    clip: OnceCell<Clip>,
}

/// A first step's clipping coefficient: the reference's, and the range a correct target's lies in.
#[derive(Clone, Copy)]
struct Clip {
    reference: f64,
    low: f64,
    high: f64,
}

impl Step0<'_> {
    /// Far enough above eps that a(x) is sign(x) within 1e-3.
    const DECIDED: f64 = 1e3;

    fn a(&self, x: f64) -> f64 {
        x / (x.abs() + self.eps)
    }

    /// |a(x_target) − a(x_reference)| for one element, from its two step-0 gradients and the L2
    /// term: 0 for a gradient exactly zero in both; for signs that hold, the largest difference any
    /// c of the target's range makes (2 where the signs differ); None when either sign depends on
    /// the clipping coefficient or x is within [`Step0::DECIDED`] eps of zero.
    fn move_of(&self, target: f64, reference: f64, l2_term: f64) -> Option<f64> {
        if target == 0.0 && reference == 0.0 {
            return Some(0.0);
        }
        let c = self.clip;
        let held = |ends: [f64; 2], g: f64| {
            ends.iter().all(|x| x.is_finite() && x.abs() > (Self::DECIDED * self.eps).max(sign_roundoff(self.u, c, g, l2_term)))
                && ends[0].signum() == ends[1].signum()
        };
        let own = [c.low * target + l2_term, c.high * target + l2_term];
        let theirs = c.reference * reference + l2_term;
        if !held(own, target) || !held([theirs, theirs], reference) {
            return None;
        }
        let r = self.a(theirs);
        Some(own.iter().map(|&x| (self.a(x) - r).abs()).fold(0.0, f64::max))
    }
}

/// How many unit round-offs of its two terms x = c · g + wd · p must be away from zero for the sign
/// of Adam's first move to hold (a clean f16 case, Adam with L2 and clipping, `bench clean` seed
/// 13,058,564: c · g and wd · p = 0.0096 cancelled and the target's sign differed from the reference's).
const SIGN_ULPS: f64 = 8.0;

/// The round-off of forming x = c · g + wd · p in a dtype of unit round-off `u` (c · g rounded, p and
/// wd · p rounded, the sum rounded), at the high end of the clipping range: within it, x's sign is
/// undecided.
fn sign_roundoff(u: f64, clip: Clip, g: f64, l2_term: f64) -> f64 {
    SIGN_ULPS * u * (clip.high * g.abs() + l2_term.abs())
}

/// How many times a gradient's normwise ε the target's global gradient norm may differ by.
const CLIP_SPREAD: f64 = 8.0;

/// The first step's clipping coefficient (1 without clipping, or when the norm is under the
/// limit) and the range a correct target's lies in: its global norm differs from the reference's
/// by its gradients' round-off, at most the threshold times the largest normwise ε of a gradient
/// (capped at a half).
fn clip_range(case: &Case, reference: &RunOutput, checks: &[TensorCheck]) -> Clip {
    let Some(max_norm) = case.train.clip_grad_norm else {
        return Clip { reference: 1.0, low: 1.0, high: 1.0 };
    };
    let squares: f64 = reference
        .tensors
        .iter()
        .filter(|(n, _)| n.starts_with("grad/"))
        .flat_map(|(_, t)| t.data.iter())
        .filter(|x| x.is_finite())
        .map(|x| x * x)
        .sum();
    let c = (max_norm.get() / (squares.sqrt() + 1e-6)).min(1.0);
    let rms = |k: &TensorCheck| k.stats[Stat::Rms as usize].noise;
    let noise = checks.iter().filter(|k| k.tensor.starts_with("grad/")).map(rms).filter(|n| n.is_finite()).fold(0.0, f64::max);
    let spread = (CLIP_SPREAD * noise).min(0.5);
    Clip { reference: c, low: c * (1.0 - spread), high: (c * (1.0 + spread)).min(1.0) }
}

/// The `adam` samples of a tensor: the parameter moved by `adam_moves`, or the later loss moved by
/// `adam_loss_move` (none for SGD, step-0 tensors and gradients); and the parameter's elements
/// whose update round-off may turn around (`AdamMoves::undecided`), when any is.
fn adam_samples(
    prep: &Prepared,
    reference: &RunOutput,
    first_step: &FirstStep,
    checks: &[TensorCheck],
    scale: &ErrorScale,
    name: &str,
) -> (Vec<Tensor>, Option<Vec<bool>>) {
    let case = &prep.case;
    let initial = name.strip_prefix("param/").and_then(|p| prep.inputs.tensors.iter().find(|(n, _)| n == p)).map(|(_, t)| t);
    let mut samples = vec![];
    let mut undecided = None;
    if let Some(m) = adam_moves(case, reference, first_step, checks, scale, name, initial) {
        samples.extend([m.up, m.outward]);
        undecided = m.undecided.iter().any(|&u| u).then_some(m.undecided);
    }
    samples.extend(adam_loss_move(case, reference, checks, scale, name));
    (samples, undecided)
}

/// `mask` without the `undecided` elements (`AdamMoves::undecided`).
fn without_undecided(mask: Option<Vec<bool>>, undecided: Option<Vec<bool>>) -> Option<Vec<bool>> {
    let Some(undecided) = undecided else { return mask };
    let keep = mask.unwrap_or_else(|| vec![true; undecided.len()]);
    Some(keep.iter().zip(&undecided).map(|(&k, &u)| k && !u).collect())
}

/// For Adam-family optimizers, a later loss moved by what the `adam_moves` of every parameter move
/// it by, to first order and all the same way: Σ over parameters and elements of
/// |g| · 2 lr · steps · min(1, δ/|g|) = 2 lr · steps · Σ min(|g|, δ). Round-off in the step-0
/// gradients flips the update of every element it dominates, and a later loss sees all of them at
/// once (a clean f16 campaign case, dp2 tp2 pp2, moved its step-1 loss by 1 % where the
/// gradient-noise member moved it by 0.1 %).
fn adam_loss_move(case: &Case, reference: &RunOutput, checks: &[TensorCheck], scale: &ErrorScale, name: &str) -> Option<Tensor> {
    if case.train.optimizer.kind == OptimizerKind::Sgd || !name.starts_with("loss/") || !is_later_step(name) {
        return None;
    }
    let step = case.train.optimizer.lr.get() * case.train.steps as f64;
    let mut moved = 0.0;
    for c in checks.iter().filter(|c| c.tensor.starts_with("grad/")) {
        let Some(g) = reference.tensor(&c.tensor) else { continue };
        let delta = c.noise * scale.denominator(&c.tensor, g);
        moved += g.data.iter().filter(|x| x.is_finite()).map(|x| x.abs().min(delta)).sum::<f64>();
    }
    let l = reference.tensor(name)?;
    Some(Tensor::new(l.shape.clone(), l.data.iter().map(|x| x + 2.0 * step * moved).collect()))
}

/// How much larger than the reference's a correct sharded run's intermediates may legitimately be:
/// 16 × world (a data-parallel rank's gradient is its local mean, dp times its share of the global
/// one), and with a per-token loss (`train.per_token_loss`) times the tokens a rank's loss sums,
/// the whole batch at most: its backward starts from the summed loss, divided by the token count
/// only after the reduction (measured: Megatron's per-token f16 training at a loss scale of 65536
/// seeds its backward with 65536, inf in f16, where the reference's seed is 65536 / 36).
fn sharding_headroom(case: &Case) -> f64 {
    let tokens = case.model.as_ref().filter(|_| case.train.per_token_loss).map_or(1, |m| m.batch * m.seq);
    16.0 * case.world().max(1) as f64 * tokens as f64
}

/// Whether `t`, or an intermediate of the reference run (`peak`: the residual stream and its
/// gradient), comes within `world × 16` of the largest finite value of the case dtype: sharded
/// implementations legitimately hold partial sums that large (a data-parallel rank's gradient is its
/// local mean, dp times its share of the global one), so an overflow there is not a divergence. An
/// overflowed intermediate turns every tensor computed from it into inf or NaN (0 × inf), however
/// small that tensor is in the reference. Returns the note that says so.
fn near_overflow(case: &Case, t: &Tensor, peak: f64) -> Option<String> {
    let headroom = sharding_headroom(case);
    let dtype = case.train.dtype;
    let own = t.max_abs();
    let (what, size) = if own >= peak { ("values", own) } else { ("intermediates", peak) };
    (size * headroom >= dtype.max_finite())
        .then(|| format!("overflow: {what} reach {size:.3e}, within the sharding's headroom (×{headroom}) of {dtype}'s range"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardfuzz_harnesses::target::RunStats;

    fn run(skipped: Option<Vec<bool>>, nonfinite: Option<Vec<bool>>) -> RunOutput {
        RunOutput {
            stats: RunStats { skipped_steps: skipped, nonfinite_grad_steps: nonfinite, ..RunStats::default() },
            ..RunOutput::default()
        }
    }

    #[test]
    fn a_loss_scaler_decision_is_excused_only_near_an_overflow_or_where_a_noise_member_decides_otherwise_too() {
        let single = [true, false, false];
        let member = |s: &[bool]| Member::new("split", run(Some(s.to_vec()), None));
        let skipped_again = [true, true, false];
        let (agrees, later, borderline, earlier) =
            (member(&single), member(&[true, false, true]), member(&[true, true, true]), member(&[false, true, false]));
        let far = [false; 3];
        // Every member applies step 1, far from an overflow: a second skip there is not round-off.
        assert!(!scaler_decisions_within_noise(Some(&skipped_again), Some(&single), &far, &[&agrees]));
        // A member deciding otherwise only after that step, or already before it (at another
        // scale by then), does not explain it.
        assert!(!scaler_decisions_within_noise(Some(&skipped_again), Some(&single), &far, &[&agrees, &later, &earlier]));
        // A member deciding that step otherwise does, and so does a step near the dtype's range.
        assert!(scaler_decisions_within_noise(Some(&skipped_again), Some(&single), &far, &[&agrees, &borderline]));
        assert!(scaler_decisions_within_noise(Some(&skipped_again), Some(&single), &[false, true, false], &[&agrees]));
        assert!(!scaler_decisions_within_noise(Some(&skipped_again), Some(&single), &[true, false, true], &[&agrees]));
        // Agreeing decisions, or a list that cannot be read against the reference's, are not judged.
        assert!(scaler_decisions_within_noise(Some(&single), Some(&single), &far, &[&agrees]));
        assert!(scaler_decisions_within_noise(Some(&[true]), Some(&single), &far, &[&agrees]));
    }

    #[test]
    fn an_overflow_check_skip_is_excused_only_where_one_device_overflows_too() {
        let mut notes = vec![];
        let skipped_second = run(Some(vec![false, true]), None);
        assert!(overflow_check_skip(&skipped_second, Some(&run(None, Some(vec![false, true]))), &mut notes));
        assert!(notes[0].contains("not finite on one device"), "{notes:?}");
        // One device's gradients finite at the skipped step: the skip is not excused.
        assert!(!overflow_check_skip(&skipped_second, Some(&run(None, Some(vec![true, false]))), &mut notes));
        assert!(notes[1].contains("compared as they are"), "{notes:?}");
        // The target's own single-device step-0 gradients overflowing excuse a skip of step 0.
        let mut skipped_first = run(Some(vec![true]), None);
        assert!(!overflow_check_skip(&skipped_first, Some(&run(None, Some(vec![false]))), &mut notes));
        skipped_first.baseline = vec![("grad/w".into(), Tensor::new(vec![2], vec![1.0, f64::NAN]))];
        assert!(overflow_check_skip(&skipped_first, Some(&run(None, Some(vec![false]))), &mut notes));
        // No skip: nothing to excuse, no note.
        let before = notes.len();
        assert!(!overflow_check_skip(&run(Some(vec![false]), None), None, &mut notes));
        assert_eq!(notes.len(), before);
    }
}
