//! Ignored targets (`data.ignored`) and class weights (`data.class_weights`): the loss is the
//! weighted mean over the counted targets of the whole batch, the sharded native target agrees with the reference under every kind of parallelism that
//! splits the batch, and a loss averaged per micro-batch is caught where ignored targets alone make
//! the micro-batches' counts differ.

use shardfuzz_fuzz::oracle::{evaluate, Oracle, VerdictKind};
use shardfuzz_fuzz::trigger_cases::case;
use shardfuzz_harnesses::case::{Case, IgnorePattern, Ignored};
use shardfuzz_harnesses::inputs::{Inputs, IGNORED};
use shardfuzz_harnesses::reference;
use shardfuzz_harnesses::target::registry::{create, TargetOptions};
use shardfuzz_kernels::DType;

fn ignoring(mut c: Case, fraction: f64, pattern: IgnorePattern) -> Case {
    c.data.ignored = Some(Ignored { fraction: fraction.into(), pattern });
    c
}

fn dense(parallel: &str, seed: u64) -> Case {
    case(parallel, r#", "layers": ["attention", "mlp"], "moe": null"#, "", seed)
}

#[test]
fn ignored_targets_are_marked_from_their_own_stream_and_one_always_counts() {
    let plain = dense("", 5);
    let scattered = Inputs::generate(&ignoring(plain.clone(), 0.5, IgnorePattern::Scattered));
    let base = Inputs::generate(&plain);
    assert_eq!((&scattered.tokens, &scattered.tensors), (&base.tokens, &base.tensors), "only the targets move");
    let ignored = scattered.targets.iter().filter(|&&t| t == IGNORED).count();
    assert!(ignored > 0 && ignored < base.targets.len(), "{ignored} of {}", base.targets.len());
    for (t, b) in scattered.targets.iter().zip(&base.targets) {
        assert!(*t == IGNORED || t == b);
    }
    // Padding ignores a tail of each sequence.
    let padded = Inputs::generate(&ignoring(plain.clone(), 0.5, IgnorePattern::Padding));
    for row in padded.targets.chunks(4) {
        let first = row.iter().position(|&t| t == IGNORED).unwrap_or(row.len());
        assert!(row[first..].iter().all(|&t| t == IGNORED), "{row:?}");
    }
    let all = Inputs::generate(&ignoring(plain, 0.999_999, IgnorePattern::Scattered));
    assert_eq!(all.counted_targets(), 1, "at least one target counts");
}

/// loss/step0 is the (class-weighted) mean of the counted tokens' cross-entropy, computed here from
/// the reference's own logits.
#[test]
fn the_loss_is_the_weighted_mean_over_the_counted_targets() {
    for weighted in [false, true] {
        let mut c = ignoring(dense("", 9), 0.5, IgnorePattern::Scattered);
        c.data.class_weights = weighted;
        check_the_loss_against_the_logits(&c);
    }
}

fn check_the_loss_against_the_logits(c: &Case) {
    let inputs = Inputs::generate(c);
    assert_eq!(inputs.class_weights.is_empty(), !c.data.class_weights);
    let out = reference::run(c, &inputs, DType::F64).unwrap();
    let logits = out.tensor("logits").unwrap();
    let v = logits.shape[1];
    let (mut sum, mut weights) = (0.0, 0.0);
    for (row, &t) in logits.data.chunks(v).zip(&inputs.targets) {
        if t != IGNORED {
            let w = inputs.class_weights.get(t).copied().unwrap_or(1.0);
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            sum += w * (row.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m - row[t]);
            weights += w;
        }
    }
    let want = sum / weights;
    let got = out.tensor("loss/step0").unwrap().data[0];
    assert!((got - want).abs() <= 1e-12 * want.abs(), "{got} vs {want}");
    assert!(inputs.counted_targets() < inputs.targets.len());
}

#[test]
fn the_native_target_agrees_under_every_batch_split() {
    let mut native = create("native", &TargetOptions::default()).unwrap();
    for (parallel, train) in [
        (r#", "dp": 2"#, r#", "grad_accumulation": 3"#),
        (r#", "dp": 2, "zero_stage": 2"#, ""),
        (r#", "pp": 2, "microbatches": 3"#, ""),
        (r#", "tp": 2, "sequence_parallel": true"#, ""),
        (r#", "dp": 2, "pp": 2, "microbatches": 3"#, ""),
    ] {
        for (pattern, weighted) in IgnorePattern::ALL.into_iter().zip([false, true]) {
            let mut c = ignoring(case(parallel, r#", "layers": ["attention", "mlp"], "moe": null"#, train, 3), 0.5, pattern);
            c.data.class_weights = weighted;
            let v = evaluate(native.as_mut(), &c, &Oracle::default());
            assert_eq!(v.kind, VerdictKind::Pass, "{parallel} {train} {pattern:?} weighted {weighted}: {}", v.reason);
        }
    }
}

/// The batch splits evenly (6 rows over dp 2 × 3 accumulation steps), so only the ignored targets
/// make the micro-batches' counts differ: a loss averaged per micro-batch shows there alone.
#[test]
fn a_loss_averaged_per_micro_batch_is_caught_where_only_ignored_targets_make_counts_differ() {
    let mut buggy = create("native", &TargetOptions { inject: vec!["loss-mean-per-microbatch".into()], timeout_ms: 10_000 }).unwrap();
    let even = case(r#", "dp": 2"#, r#", "layers": ["attention", "mlp"], "moe": null"#, r#", "grad_accumulation": 3"#, 3);
    assert_eq!(evaluate(buggy.as_mut(), &even, &Oracle::default()).kind, VerdictKind::Pass, "the fault is silent on even counts");
    let v = evaluate(buggy.as_mut(), &ignoring(even, 0.5, IgnorePattern::Padding), &Oracle::default());
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
}
