//! The native target against the reference, strategy by strategy and dtype by dtype, and every
//! injected bug against a case in its region (and outside it).

use shardfuzz_fuzz::oracle::{evaluate, Oracle, VerdictKind};
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::registry::{create, TargetOptions};

fn overrides(extra: &str) -> serde_json::Map<String, serde_json::Value> {
    let body = extra.trim().trim_start_matches(',');
    serde_json::from_str(&format!("{{{body}}}")).unwrap_or_else(|e| panic!("{e}: {extra}"))
}

fn case(parallel: &str, model: &str, train: &str, seed: u64) -> Case {
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

const STRATEGIES: &[(&str, &str, &str)] = &[
    ("tensor parallel, uneven ffn and vocab", r#", "tp": 2"#, ""),
    ("tensor parallel 4, empty ffn shard, replicated kv", r#", "tp": 4"#, r#", "heads": 4, "kv_heads": 2, "ffn": 3"#),
    (
        "sequence parallel, uneven sequence",
        r#", "tp": 3, "sequence_parallel": true"#,
        r#", "heads": 3, "kv_heads": 3, "hidden": 9, "seq": 5"#,
    ),
    ("data parallel, uneven batch", r#", "dp": 4"#, r#", "batch": 9"#),
    ("ZeRO-1", r#", "dp": 2, "zero_stage": 1"#, ""),
    ("ZeRO-2 with padding", r#", "dp": 3, "zero_stage": 2"#, ""),
    ("ZeRO-3 with tensor parallel", r#", "dp": 2, "tp": 2, "zero_stage": 3"#, ""),
    ("pipeline GPipe", r#", "pp": 3, "microbatches": 2"#, ""),
    ("pipeline 1F1B, tied embeddings", r#", "pp": 2, "microbatches": 3, "pipeline_schedule": "1f1b""#, r#", "tied_embeddings": true"#),
    ("expert parallel", r#", "dp": 2, "ep": 2"#, ""),
    ("everything", r#", "dp": 2, "tp": 2, "pp": 2, "ep": 2, "sequence_parallel": true, "microbatches": 2"#, r#", "batch": 8"#),
];

#[test]
fn every_strategy_matches_the_reference_in_every_dtype() {
    let mut t = create("native", &TargetOptions::default()).unwrap();
    for (what, p, m) in STRATEGIES {
        for dtype in ["f64", "f32", "bf16"] {
            for accumulation in [1, 2] {
                let c = case(p, m, &format!(r#", "dtype": "{dtype}", "grad_accumulation": {accumulation}"#), 3);
                let v = evaluate(t.as_mut(), &c, &Oracle::default());
                assert_eq!(v.kind, VerdictKind::Pass, "{what} {dtype} accumulation {accumulation}: {}", v.reason);
            }
        }
    }
}

#[test]
fn a_moe_layer_reports_dropped_tokens_exactly_when_an_expert_is_full() {
    // Two experts, top-2: each expert receives every token of a sequence (4 per sequence), and its
    // capacity is ceil(capacity_factor × 4), whatever the router's logits.
    let mut t = create("native", &TargetOptions::default()).unwrap();
    let mut drops = |capacity_factor: f64| {
        let moe = format!(r#", "layers": ["moe"], "moe": {{"experts": 2, "top_k": 2, "capacity_factor": {capacity_factor}}}"#);
        let v = evaluate(t.as_mut(), &case(r#", "dp": 2, "ep": 2"#, &moe, "", 3), &Oracle::default());
        assert_eq!(v.kind, VerdictKind::Pass, "capacity factor {capacity_factor}: {}", v.reason);
        v.features.iter().any(|f| f == "path:moe:drops")
    };
    assert!(drops(0.5), "capacity 2 of 4 tokens: the path must be reported");
    assert!(drops(0.75));
    assert!(!drops(1.0), "capacity 4 of 4 tokens: nothing is dropped");
    assert!(!drops(2.0));
}

#[test]
fn a_reduction_coarser_than_the_compute_dtype_still_shows_a_lost_remainder() {
    // f64 compute with an f32 reduction widens ε by the reduction's round-off of the partial
    // gradients; a ring all-reduce that drops its remainder chunk must still stand far above it.
    let train = r#", "dtype": "f64", "reduce_dtype": "f32", "grad_accumulation": 2"#;
    let c = case(r#", "dp": 3, "microbatches": 2"#, r#", "batch": 12"#, train, 3);
    let opts = TargetOptions { inject: vec!["ring-remainder-lost".into()], ..TargetOptions::default() };
    let v = evaluate(create("native", &opts).unwrap().as_mut(), &c, &Oracle::default());
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
    let clean = evaluate(create("native", &TargetOptions::default()).unwrap().as_mut(), &c, &Oracle::default());
    assert_eq!(clean.kind, VerdictKind::Pass, "{}", clean.reason);
}

/// A case in each bug's region (parallel, model and train overrides), and overrides that each take
/// away one condition of the region.
type BugCase = (&'static str, &'static str, &'static str, &'static str, &'static [(&'static str, &'static str)]);

const BUG_CASES: &[BugCase] = &[
    (
        "row-parallel-bias-every-rank",
        r#", "tp": 2, "sequence_parallel": true, "microbatches": 2"#,
        r#", "seq": 5"#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""sequence_parallel": false"#),
            ("parallel", r#""microbatches": 1"#),
            ("model", r#""seq": 4"#),
            ("train", r#""dtype": "f64""#),
            ("train", r#""grad_accumulation": 1"#),
        ],
    ),
    (
        "sp-norm-grad-not-reduced",
        r#", "tp": 2, "sequence_parallel": true, "pp": 2"#,
        r#", "seq": 5"#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""sequence_parallel": false"#),
            ("parallel", r#""pp": 1"#),
            ("model", r#""seq": 4"#),
            ("train", r#""grad_accumulation": 1"#),
            ("train", r#""dtype": "f64""#),
        ],
    ),
    (
        "clip-local-norm",
        r#", "dp": 2, "tp": 2, "zero_stage": 2, "microbatches": 2"#,
        r#", "batch": 8"#,
        r#", "clip_grad_norm": 0.01, "grad_accumulation": 2"#,
        &[
            ("parallel", r#""zero_stage": 1"#),
            ("parallel", r#""tp": 1"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""grad_accumulation": 1"#),
            ("parallel", r#""zero_stage": 3"#),
        ],
    ),
    (
        "dp-average-world",
        r#", "dp": 2, "tp": 2, "ep": 2, "microbatches": 2"#,
        r#", "batch": 8"#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""ep": 1"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""grad_accumulation": 1"#),
            ("train", r#""dtype": "f64""#),
        ],
    ),
    (
        "vocab-pad-unmasked",
        r#", "tp": 2, "sequence_parallel": true, "microbatches": 2"#,
        r#", "norm": "rmsnorm""#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""sequence_parallel": false"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""grad_accumulation": 1"#),
            ("model", r#""vocab": 12"#),
            ("model", r#""norm": "layernorm""#),
        ],
    ),
    (
        "zero-pad-in-norm",
        r#", "dp": 3, "tp": 2, "zero_stage": 2, "microbatches": 2"#,
        r#", "norm": "rmsnorm""#,
        r#", "clip_grad_norm": 0.01"#,
        &[
            ("parallel", r#""tp": 1"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""steps": 1"#),
            ("model", r#""norm": "layernorm""#),
        ],
    ),
    (
        "zero-partition-offset",
        r#", "dp": 3, "tp": 2, "zero_stage": 3, "microbatches": 2"#,
        r#", "batch": 12"#,
        r#", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""zero_stage": 2"#),
            ("parallel", r#""microbatches": 1"#),
            ("parallel", r#""dp": 2"#),
            ("parallel", r#""tp": 1"#),
            ("train", r#""grad_accumulation": 1"#),
        ],
    ),
    (
        "ring-remainder-lost",
        r#", "dp": 3, "microbatches": 2"#,
        r#", "batch": 12"#,
        r#", "dtype": "f32", "reduce_dtype": "f64", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""dp": 2"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""grad_accumulation": 1"#),
            ("train", r#""reduce_dtype": "f32""#),
        ],
    ),
    (
        "accum-loss-not-divided",
        r#", "pp": 2, "tp": 2, "microbatches": 2"#,
        r#", "norm": "rmsnorm""#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""pp": 1"#),
            ("parallel", r#""tp": 1"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""dtype": "f64""#),
            ("model", r#""norm": "layernorm""#),
        ],
    ),
    (
        "pipeline-drops-last-microbatch",
        r#", "pp": 2, "tp": 2, "microbatches": 2, "pipeline_schedule": "1f1b""#,
        r#", "activation": "swiglu", "norm": "rmsnorm""#,
        r#", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""pipeline_schedule": "gpipe""#),
            ("model", r#""norm": "layernorm""#),
            ("parallel", r#""tp": 1"#),
            ("train", r#""grad_accumulation": 1"#),
            ("model", r#""batch": 8"#),
            ("model", r#""activation": "gelu""#),
        ],
    ),
    (
        "gqa-kv-not-replicated",
        r#", "tp": 4, "sequence_parallel": true, "microbatches": 2"#,
        r#", "heads": 4, "kv_heads": 2"#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""sequence_parallel": false"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""dtype": "f64""#),
            ("train", r#""grad_accumulation": 1"#),
            ("model", r#""kv_heads": 4"#),
        ],
    ),
    (
        "attn-scale-local-heads",
        r#", "tp": 2, "sequence_parallel": true, "microbatches": 2"#,
        r#", "heads": 4, "kv_heads": 2"#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""sequence_parallel": false"#),
            ("model", r#""kv_heads": 4"#),
            ("model", r#""bias": false"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""grad_accumulation": 1"#),
        ],
    ),
    (
        "collective-nonempty-only",
        r#", "tp": 4, "sequence_parallel": true, "microbatches": 2"#,
        r#", "heads": 4, "kv_heads": 4, "ffn": 3"#,
        r#", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""sequence_parallel": false"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""grad_accumulation": 1"#),
            ("model", r#""ffn": 4"#),
        ],
    ),
    (
        "empty-shard-indexed",
        r#", "tp": 4, "microbatches": 2"#,
        r#", "heads": 4, "kv_heads": 4, "ffn": 3, "activation": "swiglu""#,
        r#", "dtype": "f32""#,
        &[
            ("model", r#""activation": "gelu""#),
            ("train", r#""dtype": "f64""#),
            ("model", r#""ffn": 4"#),
            ("parallel", r#""microbatches": 1"#),
        ],
    ),
    (
        "moe-split-sizes-dropped",
        r#", "dp": 2, "ep": 2, "microbatches": 2"#,
        r#", "batch": 8, "moe": {"experts": 4, "top_k": 2, "capacity_factor": 0.5}"#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""ep": 1"#),
            ("parallel", r#""microbatches": 1"#),
            ("train", r#""grad_accumulation": 1"#),
            ("train", r#""dtype": "f64""#),
        ],
    ),
    (
        "tied-embedding-grad-not-reduced",
        r#", "pp": 2, "dp": 2, "zero_stage": 1"#,
        r#", "tied_embeddings": true"#,
        r#", "dtype": "f32", "grad_accumulation": 2"#,
        &[
            ("parallel", r#""zero_stage": 0"#),
            ("train", r#""dtype": "f64""#),
            ("train", r#""grad_accumulation": 1"#),
            ("model", r#""tied_embeddings": false"#),
        ],
    ),
];

fn with(section: &str, over: &str, p: &str, m: &str, t: &str) -> (String, String, String) {
    let add = |base: &str, s: &str| if section == s { format!("{base}, {over}") } else { base.to_string() };
    (add(p, "parallel"), add(m, "model"), add(t, "train"))
}

#[test]
fn every_injected_bug_is_found_in_its_region_and_every_condition_of_the_region_is_needed() {
    let mut clean = create("native", &TargetOptions::default()).unwrap();
    for (bug, p, m, t, breakers) in BUG_CASES {
        let c = case(p, m, t, 5);
        let mut buggy = create("native", &TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 }).unwrap();
        let v = evaluate(buggy.as_mut(), &c, &Oracle::default());
        assert!(v.kind.is_finding(), "{bug} not found: {}", v.reason);
        assert_eq!(evaluate(clean.as_mut(), &c, &Oracle::default()).kind, VerdictKind::Pass, "{bug}: clean target fails the case");
        for (section, over) in *breakers {
            let (p2, m2, t2) = with(section, over, p, m, t);
            let c = case(&p2, &m2, &t2, 5);
            let v = evaluate(buggy.as_mut(), &c, &Oracle::default());
            assert_eq!(v.kind, VerdictKind::Pass, "{bug} fires without its condition {section}.{over}: {}", v.reason);
        }
    }
}

#[test]
fn a_hang_names_the_stuck_ranks_and_a_crash_names_the_rank() {
    let c = case(
        r#", "tp": 4, "sequence_parallel": true, "microbatches": 2"#,
        r#", "heads": 4, "kv_heads": 4, "ffn": 3"#,
        r#", "grad_accumulation": 2"#,
        1,
    );
    let mut t = create("native", &TargetOptions { inject: vec!["collective-nonempty-only".into()], timeout_ms: 10_000 }).unwrap();
    let v = evaluate(t.as_mut(), &c, &Oracle::default());
    assert!(matches!(v.kind, VerdictKind::Hang | VerdictKind::Crash | VerdictKind::Divergent), "{v:?}");
    if v.kind == VerdictKind::Hang {
        assert!(!v.stuck.is_empty() && v.stuck.iter().all(|s| s.group.starts_with("tp")), "{:?}", v.stuck);
    }
    let c = case(
        r#", "tp": 4, "microbatches": 2"#,
        r#", "heads": 4, "kv_heads": 4, "ffn": 3, "activation": "swiglu""#,
        r#", "dtype": "f32""#,
        1,
    );
    let mut t = create("native", &TargetOptions { inject: vec!["empty-shard-indexed".into()], timeout_ms: 10_000 }).unwrap();
    let v = evaluate(t.as_mut(), &c, &Oracle::default());
    assert_eq!(v.kind, VerdictKind::Crash);
    assert_eq!(v.crash_rank, Some(3), "{}", v.reason);
    assert!(v.reason.contains("index out of bounds"), "{}", v.reason);
}
