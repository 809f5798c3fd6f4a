use super::*;

pub(crate) const MINIMAL: &str = r#"{
  "schema": 1,
  "parallel": {"dp": 1, "tp": 2, "pp": 1},
  "model": {"vocab": 11, "hidden": 8, "ffn": 12, "heads": 2, "kv_heads": 1, "seq": 4, "batch": 2,
            "layers": ["attention", "mlp"]},
  "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "f32"},
  "data": {"seed": 7}
}"#;

#[test]
fn minimal_case_parses_with_defaults_and_round_trips() {
    let c = Case::from_json(MINIMAL).unwrap();
    assert_eq!(c.parallel.rank_order.to_string(), "tp-cp-dp-pp");
    assert_eq!(c.world(), 2);
    let back = Case::from_json(&c.to_json()).unwrap();
    assert_eq!(back, c);
}

fn error_of(text: &str) -> String {
    Case::from_json(text).unwrap_err().to_string()
}

#[test]
fn missing_field_is_named() {
    let t = MINIMAL.replace(r#""hidden": 8, "#, "");
    let e = error_of(&t);
    assert!(e.contains("model") && e.contains("hidden"), "{e}");
}

#[test]
fn zero_and_negative_sizes_are_named() {
    let e = error_of(&MINIMAL.replace(r#""hidden": 8"#, r#""hidden": 0"#));
    assert!(e.contains("model.hidden") && e.contains("at least 1"), "{e}");
    let e = error_of(&MINIMAL.replace(r#""seq": 4"#, r#""seq": -3"#));
    assert!(e.contains("model.seq"), "{e}");
    let e = error_of(&MINIMAL.replace(r#""tp": 2"#, r#""tp": 0"#));
    assert!(e.contains("parallel.tp") && e.contains("at least 1"), "{e}");
}

#[test]
fn every_violation_is_reported() {
    let t = MINIMAL.replace(r#""tp": 2"#, r#""tp": 0"#).replace(r#""batch": 2"#, r#""batch": 0"#);
    let Err(CaseError::Invalid(v)) = Case::from_json(&t) else { panic!("expected invalid") };
    let fields: Vec<_> = v.iter().map(|v| v.field.as_str()).collect();
    assert!(fields.contains(&"parallel.tp") && fields.contains(&"model.batch"), "{fields:?}");
}

#[test]
fn virtual_stages_go_with_the_interleaved_schedule() {
    let with = |schedule: &str, v: u32| {
        MINIMAL.replace(r#""pp": 1"#, &format!(r#""pp": 2, "pipeline_schedule": "{schedule}", "virtual_stages": {v}"#))
    };
    let c = Case::from_json(&with("interleaved", 3)).unwrap();
    assert_eq!((c.parallel.pipeline_schedule, c.parallel.virtual_stages), (PipelineSchedule::Interleaved, 3));
    assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    for (schedule, v, rule) in [("interleaved", 1, "2 to 8"), ("interleaved", 9, "2 to 8"), ("1f1b", 2, "must be 1")] {
        let e = error_of(&with(schedule, v));
        assert!(e.contains("parallel.virtual_stages") && e.contains(rule), "{schedule} {v}: {e}");
    }
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("virtual_stages"), "1 is not written");
}

#[test]
fn gradient_reduction_fields_round_trip_and_are_bounded() {
    let with = |fields: &str| MINIMAL.replace(r#""pp": 1"#, &format!(r#""pp": 1, {fields}"#));
    let c = Case::from_json(&with(r#""reduce_bucket": 7, "overlap_comm": false"#)).unwrap();
    assert_eq!((c.parallel.reduce_bucket, c.parallel.overlap_comm), (Some(7), Some(false)));
    assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    for b in [0, MAX_REDUCE_BUCKET + 1] {
        let e = error_of(&with(&format!(r#""reduce_bucket": {b}"#)));
        assert!(e.contains("parallel.reduce_bucket") && e.contains("must be 1 to"), "{b}: {e}");
    }
    for f in [0, MAX_GRAD_PREDIVIDE + 1] {
        let e = error_of(&with(&format!(r#""grad_predivide": {f}"#)));
        assert!(e.contains("parallel.grad_predivide") && e.contains("must be 1 to"), "{f}: {e}");
    }
    let c = Case::from_json(&with(r#""reduce_scatter": false, "grad_predivide": 2"#)).unwrap();
    assert_eq!((c.parallel.reduce_scatter, c.parallel.grad_predivide), (Some(false), Some(2)));
    for g in [0, 3] {
        let e = error_of(&with(&format!(r#""zero_shard_group": {g}"#)));
        assert!(e.contains("parallel.zero_shard_group") && e.contains("must divide dp"), "{g}: {e}");
    }
    let plain = Case::from_json(MINIMAL).unwrap().to_json();
    let c =
        Case::from_json(&with(r#""contiguous_grads": false, "round_robin_grads": true, "static_graph": true, "reduce_to_owner": true"#))
            .unwrap();
    assert_eq!((c.parallel.contiguous_grads, c.parallel.round_robin_grads), (Some(false), Some(true)));
    assert_eq!((c.parallel.static_graph, c.parallel.reduce_to_owner), (Some(true), Some(true)));
    let c = Case::from_json(&with(r#""persist_below": 0, "optimizer_sub_group": 7, "find_unused": true"#)).unwrap();
    assert_eq!((c.parallel.persist_below, c.parallel.optimizer_sub_group), (Some(0), Some(7)));
    assert_eq!(c.parallel.find_unused, Some(true));
    assert_eq!(Case::from_json(&with(r#""flat_params": true"#)).unwrap().parallel.flat_params, Some(true));
    assert_eq!(Case::from_json(&with(r#""param_buckets": false"#)).unwrap().parallel.param_buckets, Some(false));
    let e = error_of(&with(r#""reshard_group": 3"#));
    assert!(e.contains("parallel.reshard_group") && e.contains("must divide dp"), "{e}");
    let e = error_of(&with(r#""optimizer_sub_group": 0"#));
    assert!(e.contains("parallel.optimizer_sub_group") && e.contains("must be 1 to"), "{e}");
    let e = error_of(&with(r#""persist_below": 4000000000"#));
    assert!(e.contains("parallel.persist_below") && e.contains("must be 0 to"), "{e}");
    let c = Case::from_json(&with(r#""prefetch_bucket": 0, "max_live_parameters": 9, "max_reuse_distance": 0"#)).unwrap();
    assert_eq!((c.parallel.prefetch_bucket, c.parallel.max_live_parameters, c.parallel.max_reuse_distance), (Some(0), Some(9), Some(0)));
    assert_eq!(Case::from_json(&with(r#""vocab_divisible_by": 64"#)).unwrap().parallel.vocab_divisible_by, Some(64));
    for n in [0, 5000] {
        let e = error_of(&with(&format!(r#""vocab_divisible_by": {n}"#)));
        assert!(e.contains("parallel.vocab_divisible_by") && e.contains("must be 1 to 4096"), "{e}");
    }
    let e = error_of(&with(r#""param_shard_dim": 4"#));
    assert!(e.contains("parallel.param_shard_dim") && e.contains("must be 0 to 3"), "{e}");
    for field in ["prefetch_bucket", "max_live_parameters", "max_reuse_distance"] {
        let e = error_of(&with(&format!(r#""{field}": 4000000000"#)));
        assert!(e.contains(&format!("parallel.{field}")) && e.contains("must be 0 to"), "{e}");
    }
    for field in [
        "reduce_bucket",
        "overlap_comm",
        "reduce_scatter",
        "grad_predivide",
        "sum_collectives",
        "explicit_grad_divide",
        "contiguous_grads",
        "round_robin_grads",
        "zero_shard_group",
        "static_graph",
        "reduce_to_owner",
        "overlap_param_gather",
        "sync_every_microbatch",
        "zero_bubble",
        "dual_pipe",
        "ulysses_mpu",
        "cp_all_to_all",
        "tp_overlap_comm",
        "auto_ep",
        "breadth_first",
        "param_shard_dim",
        "persist_below",
        "optimizer_sub_group",
        "reshard_group",
        "find_unused",
        "flat_params",
        "param_buckets",
        "prefetch_bucket",
        "max_live_parameters",
        "max_reuse_distance",
        "vocab_divisible_by",
        "per_token_loss",
        "local_mean_loss",
        "compiled",
        "label_smoothing",
    ] {
        assert!(!plain.contains(field), "absent {field} is not written");
    }
}

#[test]
fn optimizer_implementation_round_trips_and_names_its_values() {
    let with = |v: &str| MINIMAL.replace(r#""lr": 0.1}"#, &format!(r#""lr": 0.1, "implementation": {v}}}"#));
    for (v, want) in [
        ("for_loop", OptimizerImplementation::ForLoop),
        ("foreach", OptimizerImplementation::Foreach),
        ("fused", OptimizerImplementation::Fused),
    ] {
        let c = Case::from_json(&with(&format!("\"{v}\""))).unwrap();
        assert_eq!(c.train.optimizer.implementation, Some(want));
        assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    }
    let e = error_of(&with(r#""apex""#));
    assert!(e.contains("implementation") && e.contains("for_loop"), "{e}");
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("implementation"), "absent is not written");
}

#[test]
fn checkpoint_layout_needs_a_resume_and_names_its_values() {
    let with = |extra: &str| MINIMAL.replace(r#""dtype": "f32"}"#, &format!(r#""dtype": "f32"{extra}}}"#));
    for (v, want) in
        [("sharded", CheckpointLayout::Sharded), ("gathered", CheckpointLayout::Gathered), ("universal", CheckpointLayout::Universal)]
    {
        let c = Case::from_json(&with(&format!(r#", "resume_after": 0, "checkpoint_layout": "{v}""#)));
        let c = c.unwrap();
        assert_eq!(c.train.checkpoint_layout, Some(want));
        assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    }
    let e = error_of(&with(r#", "checkpoint_layout": "gathered""#));
    assert!(e.contains("train.checkpoint_layout") && e.contains("only with train.resume_after"), "{e}");
    let e = error_of(&with(r#", "resume_after": 0, "checkpoint_layout": "torch_dist""#));
    assert!(e.contains("checkpoint_layout") && e.contains("gathered"), "{e}");
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("checkpoint_layout"), "absent is not written");
}

#[test]
fn resume_parallel_needs_a_resume_keeps_the_world_and_is_validated_as_parallel() {
    let with = |extra: &str| {
        MINIMAL.replace(r#""dtype": "f32"}"#, &format!(r#""dtype": "f32", "steps": 2{extra}}}"#)).replace(r#""steps": 1, "#, "")
    };
    let c = Case::from_json(&with(r#", "resume_after": 1, "resume_parallel": {"dp": 2, "tp": 1, "pp": 1, "zero_stage": 3}"#));
    let c = c.unwrap();
    let q = c.train.resume_parallel.clone().unwrap();
    assert_eq!((q.dp, q.tp, q.zero_stage), (2, 1, 3));
    assert_eq!(q.differing_fields(&c.parallel), ["dp", "tp", "zero_stage"]);
    assert_eq!(q.with_field_of(&c.parallel, "zero_stage").zero_stage, 0);
    assert!(!q.same_degrees(&c.parallel));
    assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    let e = error_of(&with(r#", "resume_parallel": {"dp": 1, "tp": 2, "pp": 1}"#));
    assert!(e.contains("train.resume_parallel") && e.contains("only with train.resume_after"), "{e}");
    let e = error_of(&with(r#", "resume_after": 0, "resume_parallel": {"dp": 4, "tp": 2, "pp": 1}"#));
    assert!(e.contains("train.resume_parallel") && e.contains("world size") && e.contains("= 2 "), "{e}");
    let e = error_of(&with(r#", "resume_after": 0, "resume_parallel": {"dp": 1, "tp": 2, "pp": 1, "zero_stage": 5}"#));
    assert!(e.contains("train.resume_parallel.zero_stage") && e.contains("0, 1, 2 or 3"), "{e}");
    let e = error_of(&with(r#", "resume_after": 0, "resume_parallel": {"dp": 2, "tp": 1, "pp": 1, "zero_shard_group": 3}"#));
    assert!(e.contains("train.resume_parallel.zero_shard_group") && e.contains("divide dp = 2"), "{e}");
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("resume_parallel"), "absent is not written");
}

#[test]
fn clip_norm_type_needs_clipping_and_names_its_values() {
    let with = |extra: &str| MINIMAL.replace(r#""dtype": "f32"}"#, &format!(r#""dtype": "f32"{extra}}}"#));
    for (v, want) in [("l1", ClipNorm::L1), ("l2", ClipNorm::L2), ("inf", ClipNorm::Inf)] {
        let c = Case::from_json(&with(&format!(r#", "clip_grad_norm": 1.0, "clip_norm_type": "{v}""#))).unwrap();
        assert_eq!((c.train.clip_norm_type, c.train.clip_norm()), (Some(want), want));
        assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    }
    let e = error_of(&with(r#", "clip_norm_type": "inf""#));
    assert!(e.contains("train.clip_norm_type") && e.contains("only with train.clip_grad_norm"), "{e}");
    let e = error_of(&with(r#", "clip_grad_norm": 1.0, "clip_norm_type": "l3""#));
    assert!(e.contains("clip_norm_type") && e.contains("inf"), "{e}");
    assert_eq!(Case::from_json(MINIMAL).unwrap().train.clip_norm(), ClipNorm::L2);
}

#[test]
fn non_divisible_sizes_are_valid() {
    let t = MINIMAL.replace(r#""ffn": 12"#, r#""ffn": 13"#).replace(r#""tp": 2"#, r#""tp": 3"#);
    Case::from_json(&t).unwrap();
}

#[test]
fn memory_budget_is_enforced() {
    let t = MINIMAL.replace(r#""vocab": 11"#, r#""vocab": 4000000"#);
    let e = error_of(&t);
    assert!(e.contains("MiB") && e.contains("budget"), "{e}");
}

#[test]
fn broken_json_is_an_error() {
    let e = error_of("{\"schema\": 1,");
    assert!(!e.is_empty());
    let e = error_of(&MINIMAL.replace("\"schema\": 1", "\"schema\": 2"));
    assert!(e.contains("schema"), "{e}");
}

#[test]
fn schema_names_every_section() {
    let s = Case::json_schema().to_string();
    for f in ["parallel", "model", "train", "data", "zero_stage", "kv_heads", "distribution"] {
        assert!(s.contains(f), "schema lacks {f}");
    }
}

const LIBRARY: &str = r#"{
  "schema": 1,
  "parallel": {"dp": 1, "tp": 1, "pp": 1},
  "library_op": {"name": "addmm", "sample": 1, "mesh": [2, 3], "placements": [["P(max)", "S(0)"], ["R", "P"]]},
  "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "bf16"},
  "data": {"seed": 7}
}"#;

#[test]
fn a_library_op_case_round_trips_and_its_world_is_its_mesh() {
    let c = Case::from_json(LIBRARY).unwrap();
    assert_eq!(c.world(), 6);
    let l = c.library_op.as_ref().unwrap();
    assert_eq!(l.placements[0][0], Placement::Partial(Reduce::Max));
    assert_eq!(l.placements[1][1], Placement::PARTIAL);
    assert!(l.backward, "backward defaults to true");
    assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    assert!(c.summary().contains("addmm sample 1 [P(max)/S(0), R/P]"), "{}", c.summary());
}

#[test]
fn library_op_rules_name_their_field() {
    let e = error_of(&LIBRARY.replace("[2, 3]", "[2, 2, 2, 2]"));
    assert!(e.contains("library_op.mesh: must have 1 to 3 dimensions"), "{e}");
    let e = error_of(&LIBRARY.replace("[2, 3]", "[3, 3]"));
    assert!(e.contains("library_op.mesh") && e.contains("more than 8"), "{e}");
    let e = error_of(&LIBRARY.replace(r#"["R", "P"]"#, r#"["R"]"#));
    assert!(e.contains("library_op.placements[1]: must give one placement per mesh dimension"), "{e}");
    let e = error_of(&LIBRARY.replace("P(max)", "P(mean)"));
    assert!(e.contains("P(sum|avg|max|min)"), "{e}");
    let chain = |c: &str| LIBRARY.replace(r#""mesh": [2, 3]"#, &format!(r#""mesh": [2, 3], "redistribute": {c}"#));
    let ok = Case::from_json(&chain(r#"[["S(1)", "R"], ["R", "S(0)"]]"#)).unwrap();
    assert_eq!(ok.library_op.as_ref().unwrap().redistribute[1], vec![Placement::Replicate, Placement::Shard(0)]);
    assert_eq!(Case::from_json(&ok.to_json()).unwrap(), ok);
    let e = error_of(&chain(r#"[["R", "P"]]"#));
    assert!(e.contains("library_op.redistribute[0]: must be Shard or Replicate"), "{e}");
    let e = error_of(&chain(r#"[["R"]]"#));
    assert!(e.contains("library_op.redistribute[0]: must give one placement per mesh dimension"), "{e}");
    let e = error_of(&chain(&format!("[{}]", [r#"["R", "R"]"#; 5].join(", "))));
    assert!(e.contains("library_op.redistribute: must hold at most 4"), "{e}");
    let edits = |e: &str| LIBRARY.replace(r#""mesh": [2, 3]"#, &format!(r#""mesh": [2, 3], "edits": {e}"#));
    let ok = Case::from_json(&edits(r#"[{"arg": 1, "edit": "negate"}, {"arg": 0, "edit": "beyond"}]"#)).unwrap();
    assert_eq!(ok.library_op.as_ref().unwrap().edits[0], SampleEdit { arg: 1, edit: Edit::Negate });
    assert!(ok.summary().contains("| arg 1 negate | arg 0 beyond"), "{}", ok.summary());
    assert_eq!(Case::from_json(&ok.to_json()).unwrap(), ok);
    let e = error_of(&edits(r#"[{"arg": 1, "edit": "halve"}]"#));
    assert!(e.contains("unknown variant `halve`"), "{e}");
    let e = error_of(&edits(&format!("[{}]", [r#"{"arg": 0, "edit": "zero"}"#; 5].join(", "))));
    assert!(e.contains("library_op.edits: must hold at most 4"), "{e}");
    let warmup = |e: &str| LIBRARY.replace(r#""mesh": [2, 3]"#, &format!(r#""mesh": [2, 3], "warmup": {e}"#));
    let ok = Case::from_json(&warmup(r#"[{"arg": 2, "edit": "increment"}, {"arg": 0, "edit": "empty"}]"#)).unwrap();
    assert_eq!(ok.library_op.as_ref().unwrap().warmup[1], SampleEdit { arg: 0, edit: Edit::Empty });
    assert!(ok.summary().contains("| after a warm-up call (arg 2 increment, arg 0 empty)"), "{}", ok.summary());
    assert_eq!(Case::from_json(&ok.to_json()).unwrap(), ok);
    let e = error_of(&warmup(&format!("[{}]", [r#"{"arg": 0, "edit": "zero"}"#; 5].join(", "))));
    assert!(e.contains("library_op.warmup: must hold at most 4"), "{e}");
    let cotangent = |e: &str| LIBRARY.replace(r#""mesh": [2, 3]"#, &format!(r#""mesh": [2, 3], {e}"#));
    let ok = Case::from_json(&cotangent(r#""cotangent": ["S(1)", "P(avg)"], "cotangent_in_dtype": true"#)).unwrap();
    let l = ok.library_op.as_ref().unwrap();
    assert_eq!(l.cotangent, vec![Placement::Shard(1), Placement::Partial(Reduce::Avg)]);
    assert!(l.cotangent_in_dtype);
    assert!(ok.summary().contains("| cotangent S(1)/P(avg) | cotangent in the case dtype"), "{}", ok.summary());
    assert_eq!(Case::from_json(&ok.to_json()).unwrap(), ok);
    let e = error_of(&cotangent(r#""cotangent": ["S(0)"]"#));
    assert!(e.contains("library_op.cotangent: must give one placement per mesh dimension (2, got 1), or none"), "{e}");
    let e = error_of(&cotangent(r#""cotangent": ["P(max)", "R"]"#));
    assert!(e.contains("library_op.cotangent: a gradient is partial by sum or average only"), "{e}");
    let sources = |e: &str| LIBRARY.replace(r#""mesh": [2, 3]"#, &format!(r#""mesh": [2, 3], "sources": {e}"#));
    let ok = Case::from_json(&sources(r#"[["P(avg)", "S(0)"]]"#)).unwrap();
    assert_eq!(ok.library_op.as_ref().unwrap().sources[0], vec![Placement::Partial(Reduce::Avg), Placement::Shard(0)]);
    assert!(ok.summary().contains("from [P(avg)/S(0)]"), "{}", ok.summary());
    assert_eq!(Case::from_json(&ok.to_json()).unwrap(), ok);
    let e = error_of(&sources(r#"[["R", "R"], ["R"]]"#));
    assert!(e.contains("library_op.sources[1]: must give one placement per mesh dimension"), "{e}");
    let views = |e: &str| LIBRARY.replace(r#""mesh": [2, 3]"#, &format!(r#""mesh": [2, 3], "views": {e}"#));
    let ok = Case::from_json(&views(r#"["transpose", "narrow"]"#)).unwrap();
    assert_eq!(ok.library_op.as_ref().unwrap().views, vec![View::Transpose, View::Narrow]);
    assert!(ok.summary().contains("→ transpose → narrow"), "{}", ok.summary());
    assert_eq!(Case::from_json(&ok.to_json()).unwrap(), ok);
    let e = error_of(&views(&format!("[{}]", [r#""flatten""#; 5].join(", "))));
    assert!(e.contains("library_op.views: must hold at most 4"), "{e}");
    let both = LIBRARY.replace(r#""library_op""#, r#""op": {"kind": "sum", "shape": [2, 2]}, "library_op""#);
    assert!(error_of(&both).contains("exactly one of `model`, `op` and `library_op`"));
}

#[test]
fn builtin_op_cases_take_partial_sums_only() {
    let t = r#"{"schema": 1, "parallel": {"dp": 1, "tp": 2, "pp": 1},
      "op": {"kind": "sum", "shape": [4, 4], "placements": {"x": ["R", "P(avg)"]}},
      "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "f32"}, "data": {"seed": 1}}"#;
    assert!(error_of(t).contains("partial sums (\"P\") only"), "{}", error_of(t));
}

#[test]
fn an_ignored_share_must_leave_targets_and_round_trips() {
    let with = |ignored: &str| MINIMAL.replace(r#""seed": 7"#, &format!(r#""seed": 7, "ignored": {ignored}"#));
    let c = Case::from_json(&with(r#"{"fraction": 0.25, "pattern": "padding"}"#)).unwrap();
    assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    for bad in [r#"{"fraction": 1.0}"#, r#"{"fraction": -0.1}"#] {
        let e = error_of(&with(bad));
        assert!(e.contains("data.ignored.fraction") && e.contains("< 1"), "{bad}: {e}");
    }
}

#[test]
fn master_dtype_is_the_compute_dtype_or_a_wider_float() {
    let with =
        |dtype: &str, master: &str| MINIMAL.replace(r#""dtype": "f32""#, &format!(r#""dtype": "{dtype}", "master_dtype": "{master}""#));
    for (dtype, master) in [("bf16", "f32"), ("f16", "f32"), ("bf16", "f64"), ("f32", "f32"), ("bf16", "bf16")] {
        let c = Case::from_json(&with(dtype, master)).unwrap();
        assert_eq!(c.train.master_dtype.map(|m| m.to_string()).as_deref(), Some(master));
    }
    for (dtype, master) in [("f16", "bf16"), ("bf16", "f16"), ("f64", "f32")] {
        let e = error_of(&with(dtype, master));
        assert!(e.contains("train.master_dtype") && e.contains("compute dtype or a wider one"), "{dtype} {master}: {e}");
    }
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("master_dtype"), "absent is not written");
}

#[test]
fn resume_after_is_a_step_before_the_last() {
    let with = |steps: u32, k: u32| MINIMAL.replace(r#""steps": 1"#, &format!(r#""steps": {steps}, "resume_after": {k}"#));
    let c = Case::from_json(&with(3, 2)).unwrap();
    assert_eq!(c.train.resume_after, Some(2));
    assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    let seed_checkpoint = Case::from_json(&with(1, 0)).unwrap();
    assert_eq!(seed_checkpoint.train.resume_after, Some(0), "0: checkpointed before the first step");
    for (steps, k) in [(3, 3), (1, 1), (2, 5)] {
        let e = error_of(&with(steps, k));
        assert!(e.contains("train.resume_after") && e.contains("less than train.steps"), "{steps} {k}: {e}");
    }
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("resume_after"), "absent is not written");
}

#[test]
fn frozen_names_parameters_at_a_module_boundary_and_leaves_one_to_train() {
    let with = |frozen: &str| MINIMAL.replace(r#""dtype": "f32""#, &format!(r#""dtype": "f32", "frozen": {frozen}"#));
    let c = Case::from_json(&with(r#"["embed", "layers.0.attn"]"#)).unwrap();
    assert!(c.train.is_frozen("embed.weight") && c.train.is_frozen("layers.0.attn.q.weight"));
    assert!(!c.train.is_frozen("layers.0.norm.weight") && !c.train.is_frozen("layers.1.mlp.up.weight"));
    assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    // A prefix must stop at a `.`: "layers.1" is not "layers.10", "emb" is no module.
    assert!(!Case::from_json(&with(r#"["layers.1"]"#)).unwrap().train.is_frozen("layers.10.mlp.up.weight"));
    let e = error_of(&with(r#"["embed", "emb"]"#));
    assert!(e.contains("train.frozen[1]") && e.contains("must name a parameter") && !e.contains("frozen[0]"), "{e}");
    let e = error_of(&with(r#"["embed", "layers", "final_norm", "lm_head"]"#));
    assert!(e.contains("train.frozen") && e.contains("at least one parameter to train"), "{e}");
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("frozen"), "absent is not written");
}

#[test]
fn activation_checkpointing_names_its_implementation() {
    let with = |v: &str| MINIMAL.replace(r#""batch": 2,"#, &format!(r#""batch": 2, "activation_checkpointing": {v},"#));
    for r in Recompute::ALL {
        let c = Case::from_json(&with(&format!("{:?}", r.name()))).unwrap();
        assert_eq!(c.model.as_ref().unwrap().activation_checkpointing, Some(r));
        assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    }
    let e = error_of(&with(r#""selective""#));
    assert!(e.contains("model.activation_checkpointing") && e.contains("non_reentrant"), "{e}");
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("activation_checkpointing"), "absent is not written");
}

#[test]
fn layer_passes_runs_the_stack_again_with_the_same_blocks() {
    let with = |v: u32| MINIMAL.replace(r#""batch": 2,"#, &format!(r#""batch": 2, "layer_passes": {v},"#));
    let c = Case::from_json(&with(3)).unwrap();
    let m = c.model.as_ref().unwrap();
    let order: Vec<usize> = m.block_sequence().iter().map(|(i, _)| *i).collect();
    let n = m.layers.len();
    assert_eq!(order, (0..3).flat_map(|_| 0..n).collect::<Vec<_>>());
    assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    assert_eq!(m.params(), Case::from_json(MINIMAL).unwrap().model.unwrap().params(), "the passes share parameters");
    for bad in [0, crate::case::MAX_LAYER_PASSES + 1] {
        let e = error_of(&with(bad));
        assert!(e.contains("model.layer_passes") && e.contains("between 1 and"), "{e}");
    }
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("layer_passes"), "one pass is not written");
}

#[test]
fn framework_checkpoint_needs_checkpointed_blocks() {
    use crate::case::FrameworkCheckpoint;
    let with = |fc: &str, recompute: &str| {
        MINIMAL
            .replace(r#""pp": 1"#, &format!(r#""pp": 1, "framework_checkpoint": "{fc}""#))
            .replace(r#""batch": 2,"#, &format!(r#""batch": 2, {recompute}"#))
    };
    for f in FrameworkCheckpoint::ALL {
        let c = Case::from_json(&with(f.name(), r#""activation_checkpointing": "reentrant","#)).unwrap();
        assert_eq!(c.parallel.framework_checkpoint, Some(f));
        assert_eq!(Case::from_json(&c.to_json()).unwrap(), c);
    }
    let e = error_of(&with("cpu", ""));
    assert!(e.contains("parallel.framework_checkpoint") && e.contains("needs model.activation_checkpointing"), "{e}");
    assert!(Case::from_json(&with("disk", r#""activation_checkpointing": "reentrant","#)).is_err());
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("framework_checkpoint"), "absent is not written");
}

#[test]
fn hf_model_names_a_transformers_class() {
    let with = |v: &str| MINIMAL.replace(r#""batch": 2,"#, &format!(r#""batch": 2, "hf_model": {v},"#));
    for h in HfModel::ALL {
        let c = Case::from_json(&with(&format!("\"{}\"", h.name()))).unwrap();
        assert_eq!(c.model.as_ref().unwrap().hf_model, Some(h));
        assert!(c.to_json().contains(&format!("\"hf_model\": \"{}\"", h.name())));
    }
    let e = error_of(&with(r#""gemma""#));
    assert!(e.contains("model.hf_model") && e.contains("qwen2"), "{e}");
    assert!(!Case::from_json(MINIMAL).unwrap().to_json().contains("hf_model"), "absent is not written");
}
