//! Signatures that deduplicate findings: target, verdict kind, where it shows (first divergent
//! tensor, crash site or stuck collective), and the semantic class of the configuration.

use shardfuzz_harnesses::case::Case;

use super::{Verdict, VerdictKind};

/// Replaces every run of digits by `#`, so layer indices, ranks and sizes do not split a bug.
pub fn generalise(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_digits = false;
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(ch);
        }
    }
    out
}

/// The strategies a case combines, e.g. `tp+sp+dp+zero2`.
pub fn config_class(case: &Case) -> String {
    if let Some(l) = &case.library_op {
        return format!("lib-{}", l.full_name());
    }
    let p = &case.parallel;
    let mut parts = vec![];
    if case.op.is_some() {
        parts.push(format!("op-{:?}", case.op.as_ref().map(|o| o.kind).unwrap()).to_lowercase());
    }
    for (name, on) in
        [("tp", p.tp > 1), ("sp", p.sequence_parallel && p.tp > 1), ("dp", p.dp > 1), ("pp", p.pp > 1), ("cp", p.cp > 1), ("ep", p.ep > 1)]
    {
        if on {
            parts.push(name.to_string());
        }
    }
    if p.zero_stage > 0 && p.dp > 1 {
        parts.push(format!("zero{}", p.zero_stage));
    }
    if parts.is_empty() {
        parts.push("single".into());
    }
    parts.join("+")
}

/// The deduplication key of a finding. A crash is one finding per (target, exception type,
/// normalised message, raising frame) and a hang one per stuck collective, whatever the
/// configuration; a divergence is one per (target, first divergent tensor family in execution
/// order, strategy set), since the same wrong tensor under other strategies is usually another bug.
pub fn signature(v: &Verdict, case: &Case) -> String {
    match v.kind {
        VerdictKind::Divergent => {
            let site = crate::localize::first_divergent(v, case).map(|c| tensor_family(&c.tensor)).unwrap_or_default();
            format!("{}|{}|{}|{}", v.target, v.kind, site, config_class(case))
        }
        VerdictKind::Crash => format!("{}|{}|{}", v.target, v.kind, crash_site(v)),
        VerdictKind::Hang => {
            format!("{}|{}|{}", v.target, v.kind, hang_site(v))
        }
        VerdictKind::HarnessError => format!("{}|{}|{}", v.target, v.kind, generalise(&v.reason).chars().take(80).collect::<String>()),
        _ => format!("{}|{}||{}", v.target, v.kind, config_class(case)),
    }
}

/// A tensor's family: its name with layer indices generalised and the `.weight` / `.bias` suffix
/// dropped (`grad/layers.3.moe.down.bias` → `grad/layers.#.moe.down`): one module's tensors.
pub fn tensor_family(name: &str) -> String {
    let g = generalise(name);
    match g.strip_suffix(".weight").or_else(|| g.strip_suffix(".bias")) {
        Some(stem) => stem.to_string(),
        None => g,
    }
}

/// A hang's site: the first stuck collective and its group, numbers generalised.
pub fn hang_site(v: &Verdict) -> String {
    v.stuck.first().map(|s| generalise(&format!("{} in {}", s.collective, s.group))).unwrap_or_default()
}

/// A crash's site: exception type, normalised message (digits generalised, 80 characters) and the
/// raising frame (file tail and function, no line number), from a reason such as
/// `rank 1: ValueError: shape [4, 6] … (at File ".../torch/distributed/tensor/_ops/_view_ops.py", line 9, in f)`.
pub fn crash_site(v: &Verdict) -> String {
    let (message, frame) = crash_parts(v);
    let message: String = generalise(&message).chars().take(80).collect();
    if frame.is_empty() {
        message
    } else {
        format!("{message} @ {frame}")
    }
}

/// A crash's message (rank prefix and frame removed, whitespace collapsed) and its raising frame
/// (`torch/a/b.py:f`, empty when the reason names none).
pub fn crash_parts(v: &Verdict) -> (String, String) {
    let reason = match v.crash_rank {
        Some(_) => v.reason.split_once(':').map_or(v.reason.as_str(), |(_, rest)| rest),
        None => v.reason.as_str(),
    };
    // What the worker writes before the raising frame: the frame itself, or the activation checkpoint that
    // was recomputing our model code.
    let markers = [" (at ", " (in the model code recomputed by "];
    let found = markers.iter().filter_map(|m| reason.rfind(&format!("{m}File ")).map(|i| (i, i + m.len()))).max();
    let (message, frame) = match found {
        Some((i, j)) => (&reason[..i], reason[j..].trim_end_matches(')')),
        None => (reason, ""),
    };
    (message.split_whitespace().collect::<Vec<_>>().join(" "), raising_frame(frame))
}

/// `File "/x/site-packages/torch/a/b.py", line 12, in f` → `torch/a/b.py:f`.
fn raising_frame(frame: &str) -> String {
    let Some(rest) = frame.strip_prefix("File \"") else { return String::new() };
    let Some((path, tail)) = rest.split_once('"') else { return String::new() };
    let path = path.rsplit_once("site-packages/").map_or(path, |(_, p)| p);
    let func = tail.rsplit_once(" in ").map_or("", |(_, f)| f.trim());
    format!("{path}:{func}")
}

/// A short, file-name-safe digest of a signature.
pub fn signature_id(sig: &str) -> String {
    // FNV-1a: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in sig.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_generalised() {
        assert_eq!(generalise("grad/layers.12.attn.k.weight"), "grad/layers.#.attn.k.weight");
        assert_eq!(signature_id("a"), signature_id("a"));
        assert_ne!(signature_id("a"), signature_id("b"));
    }

    #[test]
    fn a_crash_site_is_type_message_and_frame_without_rank_or_line() {
        let v = Verdict {
            target: "torch-tp".into(),
            kind: VerdictKind::Crash,
            reason: "rank 1: RuntimeError: size 6 vs 4 (at File \"/v/lib/python3.12/site-packages/torch/distributed/tensor/_dispatch.py\", line 17, in dispatch)".into(),
            checks: vec![],
            stuck: vec![],
            crash_rank: Some(1),
            features: vec![],
            notes: vec![],
            versions: Default::default(),
            threshold: 1.0,
            members: vec![],
            localization: None,
        };
        assert_eq!(crash_site(&v), "RuntimeError: size # vs # @ torch/distributed/tensor/_dispatch.py:dispatch");
        let recomputed = Verdict {
            reason: "rank 0: IndexError: tuple index out of range (in the model code recomputed by File \"/v/site-packages/deepspeed/runtime/activation_checkpointing/checkpointing.py\", line 738, in backward)".into(),
            ..v
        };
        assert_eq!(
            crash_site(&recomputed),
            "IndexError: tuple index out of range @ deepspeed/runtime/activation_checkpointing/checkpointing.py:backward"
        );
    }
}
