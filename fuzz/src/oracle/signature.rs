//! Signatures that deduplicate findings: target, verdict kind, where it shows (first divergent
//! tensor, crash site or stuck collective), and the semantic class of the configuration.

use shardfuzz_harnesses::case::Case;

use super::{Verdict, VerdictKind};

/// Replaces every run of digits by `#`, so layer indices, ranks and sizes do not split a bug.
fn generalise(s: &str) -> String {
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

/// The deduplication key of a finding.
pub fn signature(v: &Verdict, case: &Case) -> String {
    let site = match v.kind {
        VerdictKind::Divergent => v.first_divergent().map(|c| generalise(&c.tensor)).unwrap_or_default(),
        VerdictKind::Crash => {
            let msg: String = v.reason.split(':').skip(usize::from(v.crash_rank.is_some())).collect::<Vec<_>>().join(":");
            generalise(msg.trim()).chars().take(80).collect()
        }
        VerdictKind::Hang => v.stuck.first().map(|s| generalise(&format!("{} in {}", s.collective, s.group))).unwrap_or_default(),
        VerdictKind::HarnessError => generalise(&v.reason).chars().take(80).collect(),
        _ => String::new(),
    };
    let raw = format!("{}|{}|{}|{}", v.target, v.kind, site, config_class(case));
    raw
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
}
