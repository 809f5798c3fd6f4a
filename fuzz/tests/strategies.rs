//! The native target against the reference, strategy by strategy and dtype by dtype, and every
//! injected bug against a case in its region (and outside it).

use shardfuzz_fuzz::oracle::{evaluate, Oracle, VerdictKind};
use shardfuzz_fuzz::trigger_cases::{case, with, BUG_CASES};
use shardfuzz_harnesses::target::registry::{create, TargetOptions};

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
