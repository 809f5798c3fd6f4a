//! The oracle sees the errors real bugs make, in every dtype: a loosened oracle fails here.

mod common;

use std::collections::BTreeMap;

use shardfuzz_fuzz::generate::random_case;
use shardfuzz_fuzz::oracle::{judge_prepared, Oracle, Prepared, VerdictKind};
use shardfuzz_fuzz::sensitivity::{run_case, Corruption};
use shardfuzz_fuzz::trigger_cases::case;
use shardfuzz_harnesses::target::registry::{create, TargetOptions};
use shardfuzz_harnesses::target::{Outcome, RunOutput};
use shardfuzz_kernels::DType;

/// Detection rate of each corruption over the first `n` clean cases in `dtype`.
fn rates(dtype: DType, n: usize) -> BTreeMap<String, (u32, u32)> {
    let mut t = create("native", &TargetOptions::default()).unwrap();
    let mut counts: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let (mut clean, mut seed) = (0, 7000);
    while clean < n {
        let mut c = random_case(seed);
        seed += 1;
        // The population this test was calibrated on: the generator's cases before ignored targets
        // and class weights, which are drawn last and from their own stream, so clearing them gives
        // those cases exactly. With them, 2 of the 5 bf16 ×0.5 misses of the first 48 cases were
        // cases with 90 % of their targets ignored (gradients of a tenth of the tokens, whose
        // members' round-off is larger); `bench sensitivity` measures the generator as it is.
        c.data.ignored = None;
        c.data.class_weights = false;
        c.train.dtype = dtype;
        c.train.reduce_dtype = None;
        if dtype != DType::F16 {
            c.train.loss_scale = None;
        }
        let Some(r) = run_case(t.as_mut(), &c, &Oracle::default()) else { continue };
        assert!(!r.clean.kind.is_finding(), "false positive, seed {}: {}", seed - 1, r.clean.reason);
        clean += 1;
        for (corruption, d) in r.detected {
            if let Some(d) = d {
                let e = counts.entry(corruption.name()).or_default();
                e.0 += u32::from(d);
                e.1 += 1;
            }
        }
    }
    counts
}

/// Notes in `short` each corruption seen in fewer than `rate` of its cases (all are reported at once).
fn at_least(short: &mut Vec<String>, counts: &BTreeMap<String, (u32, u32)>, c: Corruption, rate: f64, dtype: DType) {
    let (d, n) = counts[&c.name()];
    if n == 0 || f64::from(d) < rate * f64::from(n) {
        short.push(format!("{dtype}: {} detected in {d} of {n} cases, want ≥ {rate}", c.name()));
    }
}

#[test]
fn coarse_corruptions_are_seen_in_every_dtype_and_fine_ones_in_f32_and_f64() {
    let mut short = vec![];
    for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16] {
        let counts = rates(dtype, 48);
        // A tensor zeroed or doubled is seen in every case, a parameter after Adam included: its
        // first step is read off the target's own gradient, not guessed (which once let a zeroed
        // bf16 bias through).
        for c in [Corruption::Scale(2.0), Corruption::Zeroed] {
            at_least(&mut short, &counts, c, 1.0, dtype);
        }
        // A gradient whose own round-off is 10 % of it (a bf16 norm weight under reordered sums)
        // can hide a halving in its noise.
        at_least(&mut short, &counts, Corruption::Scale(0.5), 0.9, dtype);
        // A 20 % scale is 51 bf16 unit round-offs: the statistics over a whole tensor see it in most
        // cases (the oracle before this check saw half of them in bf16).
        let fine = if dtype == DType::BF16 { 0.75 } else { 0.9 };
        for c in [Corruption::Scale(0.8), Corruption::Scale(1.25)] {
            at_least(&mut short, &counts, c, fine, dtype);
        }
        if matches!(dtype, DType::F32 | DType::F64) {
            for c in [Corruption::Scale(0.95), Corruption::Scale(1.05)] {
                at_least(&mut short, &counts, c, 0.9, dtype);
            }
        }
        // Swapping shards of a parameter after Adam whose values hardly differ (norm weights near
        // one) moves it less than Adam's amplification of round-off can: not every swap shows.
        for c in [Corruption::Swapped, Corruption::Shifted] {
            at_least(&mut short, &counts, c, 0.8, dtype);
        }
        // One copy of a replicated parameter 5 % off the others (12.8 bf16 unit round-offs): copies
        // of one run are a rounding apart, not an implementation's ε (the oracle before this check
        // saw none in bf16, its floor alone allowing 6.4 %).
        at_least(&mut short, &counts, Corruption::ReplicaPerturbed, 0.75, dtype);
    }
    assert!(short.is_empty(), "{}", short.join("\n"));
}

/// The issue that started oracle v2: a data-parallel step whose dense gradients come out halved on
/// every rank passed in bf16 (the bound was 156 % relative error).
#[test]
fn gradients_halved_on_every_rank_are_divergent_in_bf16() {
    let c = case(r#", "dp": 3, "tp": 2"#, r#", "layers": ["attention", "mlp"]"#, r#", "dtype": "bf16""#, 11);
    let prep = Prepared::new(&c);
    let mut out = common::native_output(&c, &prep.inputs);
    let clean = common::verdict_prepared(&prep, out.clone());
    assert_eq!(clean.kind, VerdictKind::Pass, "{}", clean.reason);
    for (_, t) in out.tensors.iter_mut().filter(|(n, _)| n.starts_with("grad/")) {
        t.data.iter_mut().for_each(|x| *x *= 0.5);
    }
    let v = common::verdict_prepared(&prep, out);
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
    let first = v.first_divergent().unwrap();
    assert!(first.tensor.starts_with("grad/") && first.decided_by.is_some(), "{first:?}");
}

/// Injected bugs the oracle sees in bf16 on their own trigger cases (`bench bugs --per-dtype`): a
/// halved expert gradient next to tokens routed within round-off of a tie among them, which raising
/// the whole tensor's ε once hid.
#[test]
fn injected_bugs_stay_visible_in_bf16() {
    use shardfuzz_fuzz::trigger_cases::{detect_in_dtype, Detection};
    for bug in [
        "sp-norm-grad-not-reduced",
        "dp-average-world",
        "zero-partition-offset",
        "accum-loss-not-divided",
        "gqa-kv-not-replicated",
        "moe-split-sizes-dropped",
        "tied-embedding-grad-not-reduced",
    ] {
        let d = detect_in_dtype(bug, DType::BF16).unwrap();
        assert!(matches!(d, Detection::Found), "{bug}: {d:?}");
    }
}

/// An optimizer step applied twice to the parameters (a ZeRO partition stepped by two ranks, a
/// learning rate doubled): under Adam every element moves by lr · sign(g) either way, so the old
/// per-element guess (a gradient within its noise of zero may flip: 2 lr) let a bf16 parameter move
/// that far. The target's own step-0 gradient says which signs could flip; here none did.
#[test]
fn an_adam_step_applied_twice_is_divergent_in_every_dtype() {
    for dtype in ["f64", "f32", "bf16", "f16"] {
        let train = format!(r#", "steps": 1, "clip_grad_norm": null, "optimizer": {{"kind": "adam", "lr": 0.01}}, "dtype": "{dtype}""#);
        let c = case(r#", "dp": 2, "tp": 2"#, r#", "layers": ["attention", "mlp"]"#, &train, 5);
        let prep = Prepared::new(&c);
        let mut out = common::native_output(&c, &prep.inputs);
        let clean = common::verdict_prepared(&prep, out.clone());
        assert_eq!(clean.kind, VerdictKind::Pass, "{dtype}: {}", clean.reason);
        for (name, t) in out.tensors.iter_mut().filter(|(n, _)| n.starts_with("param/")) {
            let initial = &prep.inputs.tensors.iter().find(|(n, _)| n == &name["param/".len()..]).unwrap().1;
            t.data.iter_mut().zip(&initial.data).for_each(|(x, p0)| *x = p0 + 2.0 * (*x - p0));
        }
        let v = common::verdict_prepared(&prep, out);
        assert_eq!(v.kind, VerdictKind::Divergent, "{dtype}: {}", v.reason);
        assert!(v.first_divergent().unwrap().tensor.starts_with("param/"), "{dtype}: {}", v.reason);
    }
}

/// The wide members (a whole ulp at every rounding, inputs moved to their other neighbour) are
/// probes, counted as ε at `PROBE_SHARE` of their move, and realistic rounding sizes the rest: a
/// bf16 bias gradient 20 % short, whose bound only the one-ulp `stochastic` probe set (dp2 tp2,
/// `bench sensitivity` seed 42), is divergent now and passed with the probes counted whole.
#[test]
fn a_twenty_percent_short_bf16_gradient_is_seen_once_probes_count_at_their_share() {
    let mut c = random_case(42);
    c.train.dtype = DType::BF16;
    c.train.reduce_dtype = None;
    c.train.loss_scale = None;
    let prep = Prepared::new(&c);
    let mut out = common::native_output(&c, &prep.inputs);
    let judge = |out: RunOutput, oracle: &Oracle| judge_prepared("native", Default::default(), &prep, Outcome::Completed(out), oracle);
    let whole = Oracle { probe_share: 1.0, ..Oracle::default() };
    for oracle in [&Oracle::default(), &whole] {
        let clean = judge(out.clone(), oracle);
        assert_eq!(clean.kind, VerdictKind::Pass, "{}", clean.reason);
    }
    let name = "grad/layers.0.mlp.down.bias";
    out.tensors.iter_mut().filter(|(n, _)| n == name).for_each(|(_, t)| t.data.iter_mut().for_each(|x| *x *= 0.8));
    let v = judge(out.clone(), &Oracle::default());
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
    assert_eq!(v.first_divergent().unwrap().tensor, name, "{}", v.reason);
    let before = judge(out, &whole);
    assert_eq!(before.kind, VerdictKind::Pass, "with the probes counted whole: {}", before.reason);
}

/// Scales `name` of a clean bf16 run of `random_case(seed)` by `factor` and judges it with
/// `oracle` (the clean run must pass with it).
fn bf16_scaled(seed: u64, name: &str, factor: f64, oracle: &Oracle) -> shardfuzz_fuzz::oracle::Verdict {
    let mut c = random_case(seed);
    c.train.dtype = DType::BF16;
    c.train.reduce_dtype = None;
    c.train.loss_scale = None;
    let prep = Prepared::new(&c);
    let mut out = common::native_output(&c, &prep.inputs);
    let judge = |out: RunOutput| judge_prepared("native", Default::default(), &prep, Outcome::Completed(out), oracle);
    let clean = judge(out.clone());
    assert_eq!(clean.kind, VerdictKind::Pass, "seed {seed}: {}", clean.reason);
    assert!(out.tensor(name).is_some(), "seed {seed} has no {name}");
    out.tensors.iter_mut().filter(|(n, _)| n == name).for_each(|(_, t)| t.data.iter_mut().for_each(|x| *x *= factor));
    judge(out)
}

/// `name` of `random_case(seed)` in bf16, 20 % short: divergent (and first) with the default oracle,
/// passing with the probes counted whole.
fn seen_at_the_probes_share_and_hidden_whole(seed: u64, name: &str) {
    let v = bf16_scaled(seed, name, 0.8, &Oracle::default());
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
    assert_eq!(v.first_divergent().unwrap().tensor, name, "{}", v.reason);
    let whole = bf16_scaled(seed, name, 0.8, &Oracle { probe_share: 1.0, ..Oracle::default() });
    assert_eq!(whole.kind, VerdictKind::Pass, "with the probes counted whole: {}", whole.reason);
}

/// A parameter after two Adam steps whose few elements with a gradient within round-off of zero
/// (their update may take either sign: a move of 2 lr) are left out of the comparison instead of
/// setting every element's ε: 20 % short, a bf16 key projection (tp3 with sequence parallelism,
/// `bench sensitivity` seed 40; 2 of its 27 elements undecided) passed before and is divergent now.
#[test]
fn a_bf16_parameter_after_adam_steps_is_compared_without_its_undecided_elements() {
    let name = "param/layers.1.attn.k.weight";
    let v = bf16_scaled(40, name, 0.8, &Oracle::default());
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
    assert_eq!(v.first_divergent().unwrap().tensor, name, "{}", v.reason);
}

/// In MoE cases the probes count whole only for the gradients that flow back through the gates
/// (at or below the last MoE layer's experts), where the gates' round-off reaches further than
/// realistic rounding; above them they count at their share: a bf16 final-norm gradient 20 % short
/// in an MoE case (`bench sensitivity` seed 235) is divergent, and passes with the probes whole (as
/// every tensor of an MoE case was judged before).
#[test]
fn a_twenty_percent_short_bf16_gradient_above_the_experts_is_seen_with_the_probes_at_their_share() {
    seen_at_the_probes_share_and_hidden_whole(235, "grad/final_norm.weight");
}

/// The later steps' `gradient-noise` member is sized from the members before it, the probes
/// whole among them, so in low precision it is a probe too and counts as ε at their share: a bf16
/// query projection 20 % short after an AdamW step (`bench sensitivity` seed 45) is divergent,
/// and passes with the probes counted whole.
#[test]
fn a_bf16_parameter_after_adam_steps_is_seen_with_the_gradient_noise_at_the_probes_share() {
    seen_at_the_probes_share_and_hidden_whole(45, "param/layers.0.attn.q.weight");
}

/// Dropping a micro-batch whose every target is ignored changes no gradient: the corruption does
/// not apply (it counted as a miss, 7 of 924 f64 cases). Seed 81: batch 2 as two micro-batches, 90 %
/// of the targets ignored as padding.
#[test]
fn dropping_a_microbatch_that_contributes_nothing_is_no_corruption() {
    let mut t = create("native", &TargetOptions::default()).unwrap();
    let mut c = random_case(81);
    c.train.dtype = DType::F64;
    c.train.reduce_dtype = None;
    c.train.loss_scale = None;
    let r = run_case(t.as_mut(), &c, &Oracle::default()).unwrap();
    let dropped = r.detected.iter().find(|(c, _)| *c == Corruption::MicrobatchDropped).unwrap().1;
    assert_eq!(dropped, None, "{:?}", r.misses);
    let scaled = r.detected.iter().find(|(c, _)| *c == Corruption::Scale(0.5)).unwrap().1;
    assert_eq!(scaled, Some(true), "{:?}", r.misses);
}
