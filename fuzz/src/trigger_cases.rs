//! Hand-written cases: one in each injected bug's region, with overrides that each take one
//! condition of the region away (the test suite checks every condition is needed), and the
//! builder of such cases from JSON fragments over a small default model.

use shardfuzz_harnesses::case::Case;

fn overrides(extra: &str) -> serde_json::Map<String, serde_json::Value> {
    let body = extra.trim().trim_start_matches(',');
    serde_json::from_str(&format!("{{{body}}}")).unwrap_or_else(|e| panic!("{e}: {extra}"))
}

/// A case from JSON fragments merged into the default parallel, model and train sections.
pub fn case(parallel: &str, model: &str, train: &str, seed: u64) -> Case {
    let mut v: serde_json::Value = serde_json::from_str(&format!(
        r#"{{"schema": 1, "parallel": {{"dp": 1, "tp": 1, "pp": 1}},
        "model": {{"vocab": 11, "hidden": 8, "ffn": 13, "heads": 2, "kv_heads": 2, "seq": 4, "batch": 6,
                  "layers": ["attention", "mlp", "moe"], "moe": {{"experts": 4, "top_k": 2, "capacity_factor": 1.0}}}},
        "train": {{"steps": 2, "optimizer": {{"kind": "adamw", "lr": 0.01, "weight_decay": 0.1}}, "clip_grad_norm": 0.5, "dtype": "f64"}},
        "data": {{"seed": {seed}}}}}"#
    ))
    .unwrap();
    for (section, extra) in [("parallel", parallel), ("model", model), ("train", train)] {
        for (k, x) in overrides(extra) {
            v[section][k] = x;
        }
    }
    let text = v.to_string();
    Case::from_json(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// A case in each bug's region (parallel, model and train overrides), and overrides that each take
/// away one condition of the region.
pub type BugCase = (&'static str, &'static str, &'static str, &'static str, &'static [(&'static str, &'static str)]);

pub const BUG_CASES: &[BugCase] = &[
    ("row-parallel-bias-every-rank", r#", "tp": 2"#, "", "", &[("parallel", r#""tp": 1"#), ("model", r#""bias": false"#)]),
    (
        "sp-norm-grad-not-reduced",
        r#", "tp": 2, "sequence_parallel": true"#,
        "",
        "",
        &[("parallel", r#""sequence_parallel": false"#), ("model", r#""bias": false"#)],
    ),
    (
        "clip-local-norm",
        r#", "dp": 2, "zero_stage": 2"#,
        "",
        r#", "clip_grad_norm": 0.01"#,
        &[("parallel", r#""zero_stage": 1"#), ("parallel", r#""dp": 1"#), ("train", r#""clip_grad_norm": null"#)],
    ),
    (
        "dp-average-world",
        r#", "dp": 2, "tp": 2, "ep": 2"#,
        r#", "batch": 8"#,
        "",
        &[("parallel", r#""ep": 1"#), ("parallel", r#""tp": 1"#)],
    ),
    ("vocab-pad-unmasked", r#", "tp": 2"#, "", "", &[("parallel", r#""tp": 1"#), ("model", r#""vocab": 12"#)]),
    (
        "zero-pad-in-norm",
        r#", "dp": 3, "zero_stage": 2"#,
        "",
        r#", "clip_grad_norm": 0.01"#,
        &[("parallel", r#""zero_stage": 0"#), ("parallel", r#""dp": 1"#), ("train", r#""clip_grad_norm": null"#)],
    ),
    ("zero-partition-offset", r#", "dp": 3, "zero_stage": 3"#, "", "", &[("parallel", r#""zero_stage": 0"#), ("parallel", r#""dp": 1"#)]),
    ("ring-remainder-lost", r#", "dp": 3"#, "", "", &[("parallel", r#""dp": 2"#)]),
    ("accum-loss-not-divided", "", "", r#", "grad_accumulation": 2"#, &[("train", r#""grad_accumulation": 1"#)]),
    (
        "pipeline-drops-last-microbatch",
        r#", "pp": 2, "microbatches": 2, "pipeline_schedule": "1f1b""#,
        r#", "batch": 5"#,
        "",
        &[("parallel", r#""pipeline_schedule": "gpipe""#), ("parallel", r#""pp": 1"#), ("model", r#""batch": 6"#)],
    ),
    (
        "gqa-kv-not-replicated",
        r#", "tp": 4"#,
        r#", "heads": 4, "kv_heads": 2"#,
        "",
        &[("parallel", r#""tp": 2"#), ("model", r#""kv_heads": 4"#)],
    ),
    ("attn-scale-local-heads", r#", "tp": 2"#, "", "", &[("parallel", r#""tp": 1"#)]),
    ("collective-nonempty-only", r#", "tp": 4"#, r#", "heads": 4, "kv_heads": 4, "ffn": 3"#, "", &[("model", r#""ffn": 4"#)]),
    (
        "empty-shard-indexed",
        r#", "tp": 4"#,
        r#", "heads": 4, "kv_heads": 4, "ffn": 3"#,
        "",
        &[("model", r#""ffn": 4"#), ("model", r#""bias": false"#)],
    ),
    (
        "moe-split-sizes-dropped",
        r#", "dp": 2, "ep": 2"#,
        r#", "batch": 8, "moe": {"experts": 4, "top_k": 2, "capacity_factor": 0.5}"#,
        "",
        &[("parallel", r#""ep": 1"#), ("model", r#""moe": {"experts": 4, "top_k": 2, "capacity_factor": 4.0}"#)],
    ),
    (
        "tied-embedding-grad-not-reduced",
        r#", "pp": 2"#,
        r#", "tied_embeddings": true"#,
        "",
        &[("parallel", r#""pp": 1"#), ("model", r#""tied_embeddings": false"#)],
    ),
    ("loss-mean-per-microbatch", r#", "dp": 2"#, r#", "batch": 5"#, "", &[("model", r#""batch": 6"#)]),
    ("expert-grads-wrong-group", r#", "dp": 2, "ep": 2"#, "", "", &[("parallel", r#""ep": 1"#)]),
    (
        "grads-downcast-before-reduce",
        r#", "dp": 2"#,
        "",
        "",
        &[("parallel", r#""dp": 1"#), ("parallel", r#""zero_stage": 2"#), ("train", r#""reduce_dtype": "bf16""#)],
    ),
    (
        "tied-grads-reduced-after-norm",
        r#", "pp": 2"#,
        r#", "tied_embeddings": true"#,
        r#", "clip_grad_norm": 0.01"#,
        &[
            ("parallel", r#""pp": 1"#),
            ("model", r#""tied_embeddings": false"#),
            ("train", r#""clip_grad_norm": null"#),
            ("parallel", r#""dp": 2, "zero_stage": 2"#),
        ],
    ),
    (
        "aux-loss-local-tokens",
        r#", "tp": 2, "sequence_parallel": true"#,
        r#", "moe": {"experts": 4, "top_k": 2, "capacity_factor": 1.0, "aux_loss": 0.1}"#,
        "",
        &[("parallel", r#""sequence_parallel": false"#), ("model", r#""moe": {"experts": 4, "top_k": 2, "capacity_factor": 1.0}"#)],
    ),
];

/// The fragments with `over` added to `section`.
pub fn with(section: &str, over: &str, p: &str, m: &str, t: &str) -> (String, String, String) {
    let add = |base: &str, s: &str| if section == s { format!("{base}, {over}") } else { base.to_string() };
    (add(p, "parallel"), add(m, "model"), add(t, "train"))
}

/// What an injected bug's trigger case shows in one dtype.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Detection {
    /// The bug changed the run and the oracle flagged it.
    Found,
    /// The bug changed the run and the oracle passed it.
    Missed,
    /// In this dtype the bug leaves every output bit-identical (its region excludes the dtype).
    DoesNotFire,
    /// The clean target did not pass the case in this dtype (rejected, or a false positive).
    CleanNotPass(String),
    /// The bug has no hand-written trigger case (it is measured by campaigns only).
    NoTriggerCase,
}

/// Runs `bug`'s trigger case in `dtype` through the clean and the buggy native target.
pub fn detect_in_dtype(bug: &str, dtype: shardfuzz_kernels::DType) -> Result<Detection, String> {
    use shardfuzz_harnesses::target::registry::{create, TargetOptions};
    let Some((_, p, m, t, _)) = BUG_CASES.iter().find(|c| c.0 == bug) else {
        return Ok(Detection::NoTriggerCase);
    };
    let mut c = case(p, m, t, 5);
    c.train.dtype = dtype;
    c.train.reduce_dtype = None;
    let mut clean = create("native", &TargetOptions::default())?;
    let mut buggy = create("native", &TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 })?;
    Ok(detect(clean.as_mut(), buggy.as_mut(), &c))
}

/// What a fault's region shows in one dtype over random cases: of the cases where the fault
/// changed the run (and the clean target passed), how many the oracle flagged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct RegionDetection {
    pub tries: u64,
    pub fired: u64,
    pub found: u64,
}

/// Random cases (seeded from `seed`) forced to `dtype`, until `want` of them are in `bug`'s region
/// or `tries` were drawn.
pub fn region_detection(bug: &str, dtype: shardfuzz_kernels::DType, tries: u64, want: u64, seed: u64) -> Result<RegionDetection, String> {
    use shardfuzz_harnesses::target::registry::{create, TargetOptions};
    let mut clean = create("native", &TargetOptions::default())?;
    let mut buggy = create("native", &TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 })?;
    let mut r = RegionDetection::default();
    while r.tries < tries && r.fired < want {
        let mut c = crate::generate::random_case(seed.wrapping_mul(0x9e37_79b9).wrapping_add(r.tries));
        r.tries += 1;
        c.train.dtype = dtype;
        c.train.reduce_dtype = None;
        match detect(clean.as_mut(), buggy.as_mut(), &c) {
            Detection::Found => (r.fired, r.found) = (r.fired + 1, r.found + 1),
            Detection::Missed => r.fired += 1,
            _ => {}
        }
    }
    Ok(r)
}

/// Runs `c` through the clean and the buggy target and says what the fault did to it.
fn detect(clean: &mut dyn shardfuzz_harnesses::target::Target, buggy: &mut dyn shardfuzz_harnesses::target::Target, c: &Case) -> Detection {
    use shardfuzz_harnesses::target::Outcome;

    use crate::oracle::{judge_prepared, Oracle, Prepared, VerdictKind};
    let prep = Prepared::new(c);
    let (a, b) = (clean.run(c, &prep.inputs), buggy.run(c, &prep.inputs));
    let oracle = Oracle::default();
    let clean_verdict = judge_prepared("native", Default::default(), &prep, a.clone(), &oracle);
    if clean_verdict.kind != VerdictKind::Pass {
        return Detection::CleanNotPass(clean_verdict.kind.to_string());
    }
    if let (Outcome::Completed(x), Outcome::Completed(y)) = (&a, &b) {
        if x.tensors == y.tensors && x.replicas == y.replicas {
            return Detection::DoesNotFire;
        }
    }
    let v = judge_prepared("native", Default::default(), &prep, b, &oracle);
    if v.kind.is_finding() {
        Detection::Found
    } else {
        Detection::Missed
    }
}
