//! The oracle: runs a case through a target and the f64 reference, and explains the verdict.
//!
//! For every compared tensor it reports the target's relative error against the f64 reference, the
//! error of the single-device run in the case dtype (the noise baseline), a noise estimate from
//! perturbing the inputs by the dtype's unit round-off (as TTrace does), the bound, and the error as a
//! multiple of the noise ε. Replicated tensors must also agree across the ranks that hold them.

mod compare;
mod signature;

pub use compare::{relative_error, ErrorScale};
pub use signature::{config_class, signature, signature_id};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::reference;
use shardfuzz_harnesses::target::{Outcome, RunOutput, StuckRank, Target};
use shardfuzz_harnesses::tensor::Tensor;

/// Prefix of the tensors of a target's own single-device run in the case dtype (a noise baseline).
pub const FRAMEWORK_BASELINE: &str = "baseline/";

/// Settings of the oracle.
#[derive(Debug, Clone, Copy)]
pub struct Oracle {
    /// A tensor diverges when its error exceeds `threshold × ε`.
    pub threshold: f64,
    /// ε is never taken below `noise_floor_ulps × u` (u: the coarser of the compute and reduce
    /// dtypes' unit round-off; 64 times that in f64).
    pub noise_floor_ulps: f64,
}

impl Default for Oracle {
    fn default() -> Self {
        Oracle { threshold: 100.0, noise_floor_ulps: 4.0 }
    }
}

/// The verdict classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Pass,
    Rejected,
    Unsupported,
    Divergent,
    Crash,
    Hang,
}

impl VerdictKind {
    /// Divergent, crash and hang are findings; the rest are not.
    pub fn is_finding(self) -> bool {
        matches!(self, VerdictKind::Divergent | VerdictKind::Crash | VerdictKind::Hang)
    }

    pub fn name(self) -> &'static str {
        match self {
            VerdictKind::Pass => "pass",
            VerdictKind::Rejected => "rejected",
            VerdictKind::Unsupported => "unsupported",
            VerdictKind::Divergent => "divergent",
            VerdictKind::Crash => "crash",
            VerdictKind::Hang => "hang",
        }
    }
}

impl std::fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The comparison of one tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorCheck {
    pub tensor: String,
    /// Relative error of the target against the f64 reference.
    pub error: f64,
    /// Relative error of the single-device run in the case dtype (0 for f64).
    pub baseline_error: f64,
    /// Change of the f64 reference when the inputs are perturbed by the dtype's unit round-off, or
    /// (larger of the two) the error of a second dtype run on inputs one ulp away.
    pub perturbation_error: f64,
    /// ε = max(baseline, perturbation, floor).
    pub noise: f64,
    /// threshold × ε.
    pub bound: f64,
    /// error / ε.
    pub ratio: f64,
    pub pass: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The oracle's verdict on one case and one target, with everything needed to explain it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub target: String,
    pub kind: VerdictKind,
    /// One line: why this verdict.
    pub reason: String,
    pub checks: Vec<TensorCheck>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<StuckRank>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_rank: Option<usize>,
    pub features: Vec<String>,
    pub notes: Vec<String>,
    pub versions: BTreeMap<String, String>,
    pub threshold: f64,
}

impl Verdict {
    /// The first tensor that failed its check, if any.
    pub fn first_divergent(&self) -> Option<&TensorCheck> {
        self.checks.iter().find(|c| !c.pass)
    }

    pub fn signature(&self, case: &Case) -> String {
        signature(self, case)
    }
}

/// Runs `case` through `target` and judges the outcome against the reference.
pub fn evaluate(target: &mut dyn Target, case: &Case, oracle: &Oracle) -> Verdict {
    let inputs = Inputs::generate(case);
    let outcome = target.run(case, &inputs);
    judge(target.name(), target.versions(), case, &inputs, outcome, oracle)
}

/// Judges an outcome a target already produced.
pub fn judge(target: &str, versions: BTreeMap<String, String>, case: &Case, inputs: &Inputs, outcome: Outcome, oracle: &Oracle) -> Verdict {
    let mut v = Verdict {
        target: target.to_string(),
        kind: VerdictKind::Pass,
        reason: String::new(),
        checks: vec![],
        stuck: vec![],
        crash_rank: None,
        features: outcome.features().to_vec(),
        notes: vec![],
        versions,
        threshold: oracle.threshold,
    };
    match outcome {
        Outcome::Unsupported { reason } => {
            v.kind = VerdictKind::Unsupported;
            v.reason = reason;
        }
        Outcome::Rejected { reason, .. } => {
            v.kind = VerdictKind::Rejected;
            v.reason = reason;
        }
        Outcome::Crash { rank, message, .. } => {
            v.kind = VerdictKind::Crash;
            v.crash_rank = rank;
            v.reason = match rank {
                Some(r) => format!("rank {r}: {message}"),
                None => message,
            };
        }
        Outcome::Hang { stuck, detail, .. } => {
            v.kind = VerdictKind::Hang;
            v.reason = detail;
            v.stuck = stuck;
        }
        Outcome::Completed(out) => compare_run(&mut v, case, inputs, out, oracle),
    }
    v
}

/// For Adam-family optimizers, the noise a parameter inherits from its gradient: Adam divides each
/// gradient element by its own magnitude, so an element of size |g| carrying absolute noise δ moves
/// by up to lr·min(1, δ/|g|) per step. Returned relative to the parameter's scale.
fn adam_noise(case: &Case, reference: &RunOutput, checks: &[TensorCheck], scale: &ErrorScale, name: &str) -> Option<f64> {
    use shardfuzz_harnesses::case::OptimizerKind;
    if case.train.optimizer.kind == OptimizerKind::Sgd {
        return None;
    }
    let param = name.strip_prefix("param/")?;
    let gname = format!("grad/{param}");
    let g = reference.tensor(&gname)?;
    let check = checks.iter().find(|c| c.tensor == gname)?;
    let delta = check.noise * scale.denominator(&gname, g);
    let worst = g.data.iter().map(|x| if x.abs() <= delta { 1.0 } else { delta / x.abs() }).fold(0.0, f64::max);
    let p = reference.tensor(name)?;
    Some(case.train.optimizer.lr.get() * case.train.steps as f64 * worst / scale.denominator(name, p))
}

/// The larger of two errors, NaN if either is (`f64::max` would drop the NaN).
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Whether `t`, or an intermediate of the reference run (`peak`: the residual stream and its
/// gradient), comes within `world × 16` of the largest finite value of the case dtype: sharded
/// implementations legitimately hold partial sums that large (a data-parallel rank's gradient is its
/// local mean, dp times its share of the global one), so an overflow there is not a divergence. An
/// overflowed intermediate turns every tensor computed from it into inf or NaN (0 × inf), however
/// small that tensor is in the reference. Returns the note that says so.
fn near_overflow(case: &Case, t: &Tensor, peak: f64) -> Option<String> {
    let headroom = 16.0 * case.world().max(1) as f64;
    let dtype = case.train.dtype;
    let own = t.max_abs();
    let (what, size) = if own >= peak { ("values", own) } else { ("intermediates", peak) };
    (size * headroom >= dtype.max_finite()).then(|| {
        format!("overflow: {what} reach {size:.3e}, within the sharding's headroom (×{headroom}) of {dtype}'s range: not comparable")
    })
}

fn compare_run(v: &mut Verdict, case: &Case, inputs: &Inputs, out: RunOutput, oracle: &Oracle) {
    let dtype = case.train.dtype;
    let reference = match reference::run(case, inputs, shardfuzz_kernels::DType::F64) {
        Ok(r) => r,
        Err(e) => {
            v.kind = VerdictKind::Unsupported;
            v.reason = format!("the f64 reference cannot run this case: {e}");
            return;
        }
    };
    let baseline = if dtype == shardfuzz_kernels::DType::F64 { None } else { reference::run(case, inputs, dtype).ok() };
    // Perturb at the coarser of the compute and reduce precisions: that is the round-off the target
    // may legitimately inject, and the conditioning of the case amplifies it.
    let coarse = if case.train.reduce_dtype().unit_roundoff() > dtype.unit_roundoff() { case.train.reduce_dtype() } else { dtype };
    let u_coarse = coarse.unit_roundoff();
    let perturbed = reference::run(case, &inputs.perturbed(coarse, case.data.seed), shardfuzz_kernels::DType::F64).ok();
    // A second single-device run in the case dtype on neighbouring inputs: its own rounding pattern,
    // underflows and optimizer sign flips, independent of the first baseline's.
    // Summed in reverse order as well, so it also measures what summation order alone changes. In
    // f64, where the baseline is the reference itself, every rounding is jittered by a few ulps
    // instead: that samples the round-off where the math cancels, which input perturbation misses.
    let perturbed_baseline = if dtype == shardfuzz_kernels::DType::F64 {
        reference::run_jittered(case, inputs, oracle.noise_floor_ulps.round().clamp(1.0, 255.0) as u8).ok()
    } else {
        reference::run_reversed(case, &inputs.perturbed_by(dtype, case.data.seed.wrapping_add(1), 2.0), dtype).ok()
    };
    // Round-off enters a sharded run's gradients as absolute noise (partial sums); optimizers that
    // normalise each element (Adam) amplify it on small elements. A reference run with such noise
    // added to its gradients measures what later steps legitimately inherit.
    let gradient_noise = (case.train.optimizer.kind != shardfuzz_harnesses::case::OptimizerKind::Sgd && case.train.steps > 0)
        .then(|| {
            let noise = reference::GradientNoise { relative: oracle.noise_floor_ulps * u_coarse, seed: case.data.seed };
            reference::run_with_gradient_noise(case, inputs, shardfuzz_kernels::DType::F64, Some(noise)).ok()
        })
        .flatten();
    // A reduction in a coarser dtype than the compute dtype (f64 compute, f32 all-reduce) rounds
    // every partial gradient. When the partials cancel, that round-off is large against their sum,
    // and no single-device run has it. Estimate it from the rows' own gradients: up to one rounding
    // of u per rank and per micro-step, of independent signs (they add in quadrature).
    let row_rss = (coarse != dtype).then(|| reference::row_gradient_root_sum_squares(case, inputs).ok()).flatten();
    let roundings = (case.world() + case.parallel.microbatches as usize * case.train.grad_accumulation as usize) as f64;
    v.notes = out.notes.clone();
    // A dynamic loss scaler's skip decisions depend on intermediate magnitudes, which sharding
    // legitimately changes; when the target skipped other steps than the single-device run in the
    // same dtype, gradients and parameters are not comparable (replicas still must agree).
    let skips = |o: Option<&RunOutput>| o.and_then(|o| o.tensor(reference::SKIPPED_STEPS)).map(|t| t.data.clone());
    let scaler_differs =
        case.train.loss_scale.is_some() && skips(Some(&out)) != skips(baseline.as_ref()).or_else(|| skips(Some(&reference)));
    let first_step_skipped = skips(Some(&out)).is_some_and(|s| s.first() == Some(&1.0));
    if scaler_differs {
        v.notes.push(format!(
            "loss scaler skipped steps {:?} in the target, {:?} single-device: gradients and parameters not comparable",
            skips(Some(&out)).unwrap_or_default(),
            skips(baseline.as_ref()).unwrap_or_default()
        ));
    }
    let scale = ErrorScale::new(&reference.tensors);
    // Reductions in a coarser dtype than the compute dtype (f64 compute, f32 all-reduce) add their
    // own round-off, which no single-device run has: the floor takes the coarser of the two.
    let u = u_coarse;
    // The floor stands for round-off no single-device run samples (another summation order across
    // ranks, amplified by the case's conditioning). In f64 the dtype baseline is the reference itself,
    // so it is set much higher there; bugs sit many orders of magnitude above either.
    let floor = oracle.noise_floor_ulps * u * if u <= shardfuzz_kernels::DType::F64.unit_roundoff() { 64.0 } else { 1.0 };
    let err = |t: Option<&Tensor>, r: &Tensor, name: &str| t.map_or(0.0, |t| relative_error(t, r, scale.denominator(name, r)));
    // Top-k routing is discontinuous: a token whose k-th and (k+1)-th router probabilities are
    // closer than round-off can be routed differently by any correct implementation.
    let routing_tie = reference.tensor(reference::ROUTING_MARGIN).map(|t| t.data[0]).filter(|m| *m < 256.0 * u_coarse);
    if let Some(m) = routing_tie {
        v.notes.push(format!("MoE routing within {m:.2e} of a tie (below 256 u): outputs not comparable"));
    }
    let peak = reference.tensor(reference::PEAK_ACTIVATION).map_or(0.0, |t| t.data[0]);
    let mut overflow_seen = false;
    for (name, r) in &reference.tensors {
        if reference::RUN_STATISTICS.contains(&name.as_str()) {
            continue;
        }
        // The framework's own single-device run in the case dtype, when the target sent one
        // (`baseline/<tensor>`): its rounding is the framework's, not our emulation's.
        // `nan_max`, not `f64::max`: a baseline that overflowed to NaN must make the tensor not
        // comparable, not vanish from the noise estimate.
        let base = nan_max(
            err(baseline.as_ref().and_then(|b| b.tensor(name)), r, name),
            err(out.tensor(&format!("{FRAMEWORK_BASELINE}{name}")), r, name),
        );
        let pert = err(perturbed.as_ref().and_then(|p| p.tensor(name)), r, name);
        let base2 = err(perturbed_baseline.as_ref().and_then(|p| p.tensor(name)), r, name);
        let later_step = name.starts_with("param/") || (name.starts_with("loss/") && name != "loss/step0");
        let grad_noise = if later_step { err(gradient_noise.as_ref().and_then(|p| p.tensor(name)), r, name) } else { 0.0 };
        let pert = nan_max(nan_max(pert, base2), grad_noise);
        let adam = adam_noise(case, &reference, &v.checks, &scale, name).unwrap_or(0.0);
        let reduce = name
            .strip_prefix("grad/")
            .and_then(|param| row_rss.as_ref()?.get(param))
            .map(|rss| {
                let shifted = r.data.iter().zip(&rss.data).map(|(x, s)| x + roundings.sqrt() * u_coarse * s).collect();
                err(Some(&Tensor::new(r.shape.clone(), shifted)), r, name)
            })
            .unwrap_or(0.0);
        let noise = base.max(pert).max(floor).max(adam).max(reduce);
        let mut check = TensorCheck {
            tensor: name.clone(),
            error: 0.0,
            baseline_error: base,
            perturbation_error: pert,
            noise,
            bound: oracle.threshold * noise,
            ratio: 0.0,
            pass: true,
            note: None,
        };
        match out.tensor(name) {
            None => check.note = Some("not produced by the target".into()),
            Some(t) if t.shape != r.shape => {
                check.pass = false;
                check.error = f64::INFINITY;
                check.ratio = f64::INFINITY;
                check.note = Some(format!("shape {:?}, reference {:?}", t.shape, r.shape));
            }
            Some(t) => {
                let e = err(Some(t), r, name);
                if adam > base.max(pert).max(floor).max(reduce) {
                    check.note = Some("ε from Adam's amplification of gradient noise".into());
                } else if reduce > base.max(pert).max(floor) {
                    check.note = Some(format!("ε from {} rounding the partial gradients", case.train.reduce_dtype()));
                }
                check.error = e;
                check.ratio = e / noise;
                let after_first_step = name.starts_with("param/") || (name.starts_with("loss/") && name != "loss/step0");
                if routing_tie.is_some() {
                    check.note = Some("MoE routing near a tie: not comparable".into());
                } else if scaler_differs && (name.starts_with("grad/") || after_first_step) {
                    check.note = Some("loss scaler decisions differ: not comparable".into());
                } else if first_step_skipped && name.starts_with("grad/") {
                    check.note = Some("step 0 overflowed and was skipped by the loss scaler: not comparable".into());
                } else if noise > 0.1 {
                    check.note = Some("the case dtype cannot represent this tensor (noise ε above 10 %): not comparable".into());
                } else if overflow_seen && after_first_step {
                    check.note = Some("an earlier tensor overflowed: not comparable".into());
                } else if let Some(why) = (!t.all_finite())
                    .then(|| near_overflow(case, baseline.as_ref().and_then(|b| b.tensor(name)).unwrap_or(r), peak))
                    .flatten()
                {
                    overflow_seen = true;
                    check.note = Some(why);
                } else if !(r.all_finite() && base.is_finite() && pert.is_finite()) {
                    check.note = Some("reference or baseline not finite: not comparable".into());
                } else if e.is_nan() || e > check.bound {
                    check.pass = false;
                }
            }
        }
        v.checks.push(check);
    }
    for (name, copies) in &out.replicas {
        let Some((r0, first)) = copies.first() else {
            continue;
        };
        let noise = v.checks.iter().find(|c| &c.tensor == name).map_or(floor, |c| c.noise);
        let worst = copies
            .iter()
            .skip(1)
            .map(|(rank, t)| (rank, relative_error(t, first, scale.denominator(name, first))))
            .fold((r0, 0.0f64), |a, b| if b.1 > a.1 || b.1.is_nan() { b } else { a });
        let pass = worst.1 <= oracle.threshold * noise;
        v.checks.push(TensorCheck {
            tensor: format!("replicas/{name}"),
            error: worst.1,
            baseline_error: 0.0,
            perturbation_error: 0.0,
            noise,
            bound: oracle.threshold * noise,
            ratio: worst.1 / noise,
            pass,
            note: Some(format!("rank {} against rank {r0}", worst.0)),
        });
    }
    match v.first_divergent().cloned() {
        Some(c) => {
            v.kind = VerdictKind::Divergent;
            v.reason =
                format!("{}: error {:.3e} > bound {:.3e} ({:.1}× the noise ε = {:.3e})", c.tensor, c.error, c.bound, c.ratio, c.noise);
        }
        None => {
            v.kind = VerdictKind::Pass;
            let comparable = |c: &&TensorCheck| c.ratio.is_finite() && !c.note.as_deref().is_some_and(|n| n.contains("not comparable"));
            let worst = v.checks.iter().filter(comparable).map(|c| c.ratio).fold(0.0, f64::max);
            let compared = v.checks.iter().filter(comparable).count();
            v.reason = if compared == v.checks.len() {
                format!("{} tensors within bounds (worst {:.2}× ε)", v.checks.len(), worst)
            } else {
                format!("{compared} of {} tensors comparable, all within bounds (worst {:.2}× ε); see notes", v.checks.len(), worst)
            };
        }
    }
}
