//! The likely root-cause class of a finding (the classes of `bug-taxonomy.md`), from what the
//! verdict and the localization show. A hint with its evidence, never a diagnosis.

use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::tensor::Tensor;

use crate::localize::Localization;
use crate::oracle::{Verdict, VerdictKind};

/// Whether some dimension is not divisible by the degree that shards it.
fn uneven(case: &Case) -> Vec<String> {
    let p = &case.parallel;
    let mut out = vec![];
    if let Some(m) = &case.model {
        for (w, x) in [("hidden", m.hidden), ("ffn", m.ffn), ("vocab", m.vocab), ("heads", m.heads), ("kv_heads", m.kv_heads)] {
            if p.tp > 1 && x % p.tp != 0 {
                out.push(format!("{w}={x} % tp={}", p.tp));
            }
        }
        if p.sequence_parallel && p.tp > 1 && m.seq % p.tp != 0 {
            out.push(format!("seq={} % tp={}", m.seq, p.tp));
        }
        if p.dp > 1 && m.batch % p.dp != 0 {
            out.push(format!("batch={} % dp={}", m.batch, p.dp));
        }
    }
    if let Some(op) = &case.op {
        for places in op.placements.values() {
            for (m, pl) in places.iter().enumerate() {
                let degree = if m == 0 { p.dp } else { p.tp };
                if let shardfuzz_harnesses::case::Placement::Shard(d) = pl {
                    let n = op.kind.inputs(&op.shape.iter().map(|&x| x as usize).collect::<Vec<_>>());
                    if n.iter().any(|(_, s)| s.get(*d).is_some_and(|&x| x % degree as usize != 0)) {
                        out.push(format!("a Shard({d}) dimension % {degree}"));
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// ‖t‖ / ‖r‖ and the direction error of a tensor against its reference.
pub fn scale_and_direction(t: &Tensor, r: &Tensor) -> (f64, f64) {
    let norm = |x: &Tensor| x.data.iter().map(|v| v * v).sum::<f64>().sqrt();
    let (tn, rn) = (norm(t), norm(r));
    if tn == 0.0 || rn == 0.0 {
        return (tn / rn.max(f64::MIN_POSITIVE), 1.0);
    }
    let dir: f64 = t.data.iter().zip(&r.data).map(|(a, b)| (a / tn - b / rn).powi(2)).sum::<f64>().sqrt();
    (tn / rn, dir)
}

/// The simple ratios of the case's degrees (k, 1/k, a/b) that `scale` is within 2 % of, in words.
fn simple_factor(case: &Case, scale: f64) -> Option<String> {
    let p = &case.parallel;
    let named: Vec<(&str, f64)> = [
        ("dp", p.dp),
        ("tp", p.tp),
        ("pp", p.pp),
        ("cp", p.cp),
        ("ep", p.ep),
        ("micro-batches", p.microbatches),
        ("world", p.world() as u32),
    ]
    .iter()
    .filter(|(_, k)| *k > 1)
    .map(|(n, k)| (*n, *k as f64))
    .collect();
    let mut forms: Vec<(String, f64)> = vec![];
    for &(a, x) in &named {
        forms.push((a.to_string(), x));
        forms.push((format!("1/{a}"), 1.0 / x));
        for &(b, y) in &named {
            if a != b {
                forms.push((format!("{a}/{b}"), x / y));
            }
        }
    }
    let hits: Vec<String> = forms.into_iter().filter(|(_, f)| (scale / f - 1.0).abs() < 0.02).map(|(n, _)| n).collect();
    (!hits.is_empty()).then(|| format!("{scale:.4}× the reference, ≈ {}", hits.join(" = ")))
}

/// The likely class and the evidence for it.
pub fn likely_cause(case: &Case, v: &Verdict, loc: Option<&Localization>, scale_dir: Option<(f64, f64)>) -> (String, Vec<String>) {
    let mut evidence = vec![];
    let uneven = uneven(case);
    if !uneven.is_empty() {
        evidence.push(format!("uneven sharding in the case: {}", uneven.join(", ")));
    }
    let class = match v.kind {
        VerdictKind::Crash if !uneven.is_empty() => "missing precondition check or uneven-sharding error (allocation strategy)",
        VerdictKind::Crash => "incorrect implementation (a crash on a valid configuration)",
        VerdictKind::Hang => hang_class(v, &mut evidence),
        _ => divergence_class(case, loc, scale_dir, !uneven.is_empty(), &mut evidence),
    };
    (class.to_string(), evidence)
}

/// A hang where every stuck rank waits in a collective is a communication error; one where a rank
/// is busy in Python code (the worker reports a frame, not a collective) is a loop in the framework.
fn hang_class(v: &Verdict, evidence: &mut Vec<String>) -> &'static str {
    let busy: Vec<&str> = v.stuck.iter().map(|s| s.collective.as_str()).filter(|c| c.contains(".py")).collect();
    if busy.is_empty() {
        return "distributed communication error: a collective not called on every rank of its group";
    }
    evidence.extend(busy.iter().map(|c| format!("a rank is busy in {c}, not waiting in a collective")));
    "a rank busy in the framework's own code outside any collective (an endless or very slow loop), not a communication deadlock"
}

fn divergence_class(
    case: &Case,
    loc: Option<&Localization>,
    scale_dir: Option<(f64, f64)>,
    uneven: bool,
    evidence: &mut Vec<String>,
) -> &'static str {
    if let Some(l) = loc {
        if l.replicas.iter().any(|r| r.vs_first > 1.0) {
            evidence.push("the ranks holding replicated copies of this tensor disagree with each other".into());
            return "missing or misplaced reduction (a replicated tensor never reduced, or reduced over the wrong group)";
        }
        if let Some((scale, dir)) = scale_dir {
            if dir < 1e-3 {
                if let Some(f) = simple_factor(case, scale) {
                    evidence.push(format!("the tensor points the right way but its norm is {f}"));
                    return "wrong scaling (a sum or mean over the wrong group size, a loss not divided)";
                }
            }
        }
        if let Some(s) = &l.split {
            let bad: Vec<String> = s.chunks.iter().filter(|c| c.ratio > 1.0).map(|c| c.index.to_string()).collect();
            if bad.len() < s.chunks.len() {
                evidence.push(format!("only chunk(s) {} of dim {} over {} ranks are wrong", bad.join(", "), s.dim, s.parts));
                if uneven {
                    return "uneven sharding: padding or a remainder mishandled on some ranks";
                }
                return "allocation (sharding) strategy error on some ranks";
            }
        }
        if l.phase == "optimizer step" || l.phase == "a later training step" {
            evidence.push("the first step's forward and gradients agree; the update does not".into());
            return "a global quantity computed locally (gradient norm, clipping, overflow check) or an optimizer-state sharding error";
        }
    }
    if uneven {
        return "uneven sharding (a size not divisible by its degree)";
    }
    "incorrect implementation of a sharding rule or collective"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hang(stuck: &str) -> Verdict {
        serde_json::from_str(&format!(
            r#"{{"target": "t", "kind": "hang", "reason": "r", "checks": [], "stuck": {stuck},
                "features": [], "notes": [], "versions": {{}}, "threshold": 100.0}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_hang_in_a_collective_and_a_rank_busy_in_python_get_different_causes() {
        let mut evidence = vec![];
        let in_collective = hang(r#"[{"rank": 1, "collective": "all_reduce", "group": "tp[0, 1]"}]"#);
        assert!(hang_class(&in_collective, &mut evidence).contains("a collective not called on every rank"));
        assert!(evidence.is_empty());
        let frame = "torch/fx/experimental/symbolic_shapes.py in guard_or_false via torch/distributed/tensor/_dispatch.py";
        let busy = hang(&format!(r#"[{{"rank": 0, "collective": "{frame}", "group": "world"}}]"#));
        assert!(hang_class(&busy, &mut evidence).contains("not a communication deadlock"));
        assert_eq!(evidence, vec![format!("a rank is busy in {frame}, not waiting in a collective")]);
    }
}
