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

/// A case in each bug's region; every bug must turn it into a finding, and the clean target passes.
const BUG_CASES: &[(&str, &str, &str, &str)] = &[
    ("row-parallel-bias-every-rank", r#", "tp": 2"#, "", ""),
    ("sp-norm-grad-not-reduced", r#", "tp": 2, "sequence_parallel": true"#, "", ""),
    ("clip-local-norm", r#", "tp": 2"#, "", r#", "clip_grad_norm": 0.01"#),
    ("dp-average-world", r#", "dp": 2, "tp": 2"#, r#", "batch": 4"#, ""),
    ("vocab-pad-unmasked", r#", "tp": 2"#, "", ""),
    ("zero-pad-in-norm", r#", "dp": 3, "zero_stage": 2"#, "", r#", "clip_grad_norm": 0.01"#),
    ("zero-partition-offset", r#", "dp": 3, "zero_stage": 1"#, "", ""),
    ("ring-remainder-lost", r#", "dp": 3"#, "", ""),
    ("accum-loss-not-divided", "", "", r#", "grad_accumulation": 2"#),
    ("pipeline-drops-last-microbatch", r#", "pp": 2, "microbatches": 4"#, "", ""),
    ("gqa-kv-not-replicated", r#", "tp": 4"#, r#", "heads": 4, "kv_heads": 2"#, ""),
    ("attn-scale-local-heads", r#", "tp": 2"#, "", ""),
    ("collective-nonempty-only", r#", "tp": 4"#, r#", "heads": 4, "kv_heads": 4, "ffn": 3"#, ""),
    ("empty-shard-indexed", r#", "tp": 4"#, r#", "heads": 4, "kv_heads": 4, "ffn": 3"#, ""),
    ("moe-split-sizes-dropped", r#", "dp": 2, "ep": 2"#, r#", "moe": {"experts": 2, "top_k": 1, "capacity_factor": 0.5}"#, ""),
    ("tied-embedding-grad-not-reduced", r#", "pp": 2"#, r#", "tied_embeddings": true"#, ""),
];

#[test]
fn every_injected_bug_is_found_in_its_region_and_only_there() {
    let mut clean = create("native", &TargetOptions::default()).unwrap();
    let single = case("", "", r#", "dtype": "f64""#, 5);
    for (bug, p, m, t) in BUG_CASES {
        let c = case(p, m, &format!(r#", "dtype": "f64" {t}"#), 5);
        let mut buggy = create("native", &TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 }).unwrap();
        let v = evaluate(buggy.as_mut(), &c, &Oracle::default());
        assert!(v.kind.is_finding(), "{bug} not found: {}", v.reason);
        assert_eq!(evaluate(clean.as_mut(), &c, &Oracle::default()).kind, VerdictKind::Pass, "{bug}: clean target fails the case");
        let v = evaluate(buggy.as_mut(), &single, &Oracle::default());
        assert_eq!(v.kind, VerdictKind::Pass, "{bug} fires outside its region (single device): {}", v.reason);
    }
}

#[test]
fn a_hang_names_the_stuck_ranks_and_a_crash_names_the_rank() {
    let c = case(r#", "tp": 4"#, r#", "heads": 4, "kv_heads": 4, "ffn": 3"#, r#", "dtype": "f64""#, 1);
    let mut t = create("native", &TargetOptions { inject: vec!["collective-nonempty-only".into()], timeout_ms: 10_000 }).unwrap();
    let v = evaluate(t.as_mut(), &c, &Oracle::default());
    assert!(matches!(v.kind, VerdictKind::Hang | VerdictKind::Crash | VerdictKind::Divergent), "{v:?}");
    if v.kind == VerdictKind::Hang {
        assert!(!v.stuck.is_empty() && v.stuck.iter().all(|s| s.group.starts_with("tp")), "{:?}", v.stuck);
    }
    let mut t = create("native", &TargetOptions { inject: vec!["empty-shard-indexed".into()], timeout_ms: 10_000 }).unwrap();
    let v = evaluate(t.as_mut(), &c, &Oracle::default());
    assert_eq!(v.kind, VerdictKind::Crash);
    assert_eq!(v.crash_rank, Some(3), "{}", v.reason);
    assert!(v.reason.contains("index out of bounds"), "{}", v.reason);
}
