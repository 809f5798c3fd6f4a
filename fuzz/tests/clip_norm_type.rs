//! Gradient clipping by another norm (`train.clip_norm_type`, torch's `norm_type`): the reference clips by the L1 or
//! infinity norm of all gradients at once, the sharded native target combines its ranks' parts by a sum or a maximum
//! and passes, and a framework that clips by the wrong norm or by its own partition's norm diverges.

use std::collections::BTreeMap;

use shardfuzz_fuzz::oracle::{evaluate, judge, Oracle, VerdictKind};
use shardfuzz_fuzz::trigger_cases::case;
use shardfuzz_harnesses::case::{Case, ClipNorm};
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::reference;
use shardfuzz_harnesses::target::registry::{create, TargetOptions};
use shardfuzz_harnesses::target::Outcome;
use shardfuzz_kernels::DType;

fn clipped(parallel: &str, dtype: &str, kind: &str) -> Case {
    let train = format!(
        r#", "steps": 2, "optimizer": {{"kind": "sgd", "lr": 1.0}}, "clip_grad_norm": 0.05, "clip_norm_type": "{kind}", "dtype": "{dtype}""#
    );
    case(parallel, r#", "layers": ["attention", "mlp"], "moe": null"#, &train, 5)
}

#[test]
fn the_reference_clips_by_the_l1_or_the_largest_gradient() {
    for (kind, name) in [(ClipNorm::L1, "l1"), (ClipNorm::Inf, "inf")] {
        let c = clipped("", "f64", name);
        assert_eq!(c.train.clip_norm(), kind);
        let inputs = Inputs::generate(&c);
        let mut one_step = c.clone();
        one_step.train.steps = 1;
        let out = reference::run(&one_step, &inputs, DType::F64).unwrap();
        let grads: Vec<f64> = inputs.tensors.iter().flat_map(|(n, _)| out.tensor(&format!("grad/{n}")).unwrap().data.clone()).collect();
        let norm = match kind {
            ClipNorm::L1 => grads.iter().map(|g| g.abs()).sum::<f64>(),
            _ => grads.iter().fold(0.0_f64, |m, g| m.max(g.abs())),
        };
        let coef = 0.05 / (norm + 1e-6);
        assert!(coef < 0.5, "{name}: the case clips ({coef})");
        for (n, w0) in &inputs.tensors {
            let (g, w1) = (out.tensor(&format!("grad/{n}")).unwrap(), out.tensor(&format!("param/{n}")).unwrap());
            for ((w0, g), w1) in w0.data.iter().zip(&g.data).zip(&w1.data) {
                let expected = w0 - coef * g;
                assert!((w1 - expected).abs() <= 1e-12 * (1.0 + expected.abs()), "{name} {n}: {w1} vs {expected}");
            }
        }
    }
}

#[test]
fn the_sharded_native_target_combines_the_norm_across_ranks_and_passes() {
    let mut native = create("native", &TargetOptions::default()).unwrap();
    for parallel in [r#""dp": 2, "tp": 2, "zero_stage": 2"#, r#""tp": 2, "pp": 2, "sequence_parallel": true"#] {
        for dtype in ["f32", "bf16"] {
            for kind in ["l1", "inf"] {
                let c = clipped(parallel, dtype, kind);
                let v = evaluate(native.as_mut(), &c, &Oracle::default());
                assert_eq!(v.kind, VerdictKind::Pass, "{parallel} {dtype} {kind}: {}", v.reason);
                assert!(v.features.iter().any(|f| f == &format!("path:clip:{kind}")), "{:?}", v.features);
                assert!(v.features.iter().any(|f| f.ends_with("clip:active")), "the case clips: {:?}", v.features);
            }
        }
    }
}

#[test]
fn clipping_by_the_wrong_norm_or_by_the_local_partition_is_divergent() {
    for dtype in ["f32", "bf16"] {
        // A framework that ignores norm_type and clips by the L2 norm.
        let inf = clipped(r#""dp": 2"#, dtype, "inf");
        let inputs = Inputs::generate(&inf);
        let mut l2 = inf.clone();
        l2.train.clip_norm_type = None;
        let wrong = reference::run(&l2, &inputs, dtype.parse().unwrap()).unwrap();
        let v = judge("clip-test", BTreeMap::new(), &inf, &inputs, Outcome::Completed(wrong), &Oracle::default());
        assert_eq!(v.kind, VerdictKind::Divergent, "{dtype}: inf clipped as l2: {}", v.reason);
        // ZeRO-2's partitions each clipped by their own largest gradient (the injected clip-local-norm fault).
        let mut local = create("native", &TargetOptions { inject: vec!["clip-local-norm".into()], timeout_ms: 10_000 }).unwrap();
        let v = evaluate(local.as_mut(), &clipped(r#""dp": 2, "zero_stage": 2"#, dtype, "inf"), &Oracle::default());
        assert_eq!(v.kind, VerdictKind::Divergent, "{dtype}: local inf norm: {}", v.reason);
    }
}
