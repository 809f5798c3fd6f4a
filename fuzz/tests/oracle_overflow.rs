//! The oracle on low-precision overflows: an overflow the sharding legitimately causes is not
//! comparable, and a NaN no overflow explains is still divergent.

mod common;

use common::{native_output, verdict};
use shardfuzz_fuzz::oracle::VerdictKind;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;

/// Found by a clean 10-minute campaign. An all-zero embedding row (the `integers` data) stays zero
/// through an MLP without bias, so every RMSNorm divides it by √ε: the residual-stream gradient of
/// that token grows to 1.4e6 in the reference. The single-device f16 run overflows only in the
/// embedding gradient; each data-parallel rank, whose gradient is its local mean (3× its share),
/// overflows one block earlier, and 0 × inf makes that block's weight gradients NaN although they
/// are small in the reference.
fn zero_row_case(distribution: &str) -> Case {
    Case::from_json(&format!(
        r#"{{"schema": 1, "name": "f16-zero-row-dp3-pp2-zero3",
            "parallel": {{"dp": 3, "tp": 1, "pp": 2, "cp": 1, "ep": 1, "sequence_parallel": true, "zero_stage": 3, "microbatches": 2, "pipeline_schedule": "gpipe", "rank_order": "tp-cp-dp-pp"}},
            "model": {{"vocab": 14, "hidden": 4, "ffn": 1, "heads": 2, "kv_heads": 1, "seq": 1, "batch": 9, "layers": ["mlp", "attention", "moe"], "norm": "rmsnorm", "activation": "gelu", "bias": false, "tied_embeddings": true, "moe": {{"experts": 1, "top_k": 1, "capacity_factor": 2.0}}}},
            "train": {{"steps": 1, "optimizer": {{"kind": "adam", "lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}}, "clip_grad_norm": 0.5, "grad_accumulation": 1, "dtype": "f16"}},
            "data": {{"seed": 2297073790880656406, "distribution": "{distribution}"}}}}"#
    ))
    .unwrap()
}

const GRAD: &str = "grad/layers.0.norm.weight";

#[test]
fn a_nan_from_an_intermediate_within_the_shardings_headroom_is_not_a_divergence() {
    let case = zero_row_case("integers");
    let inputs = Inputs::generate(&case);
    let out = native_output(&case, &inputs);
    assert!(!out.tensor(GRAD).unwrap().all_finite(), "the case no longer overflows in the target: pick another");
    let v = verdict(&case, &inputs, out);
    assert_eq!(v.kind, VerdictKind::Pass, "{}", v.reason);
    let check = v.checks.iter().find(|c| c.tensor == GRAD).unwrap();
    let note = check.note.as_deref().unwrap_or_default();
    assert!(note.contains("intermediates reach") && note.contains("not comparable"), "{note}");
}

#[test]
fn a_nan_no_overflow_explains_is_still_divergent() {
    let case = zero_row_case("normal");
    let inputs = Inputs::generate(&case);
    let mut out = native_output(&case, &inputs);
    assert_eq!(verdict(&case, &inputs, out.clone()).kind, VerdictKind::Pass, "the untouched run must pass");
    let grad = out.tensors.iter_mut().find(|(n, _)| n == GRAD).unwrap();
    grad.1.data[0] = f64::NAN;
    let v = verdict(&case, &inputs, out);
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
    assert!(v.reason.starts_with(GRAD), "{}", v.reason);
}
