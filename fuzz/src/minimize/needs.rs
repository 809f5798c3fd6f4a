//! What a minimized divergence needs. The minimizer keeps a candidate only when it fails the same way (the same
//! first divergent tensor), so a minimized case keeps any feature whose removal moves the divergence to another
//! tensor, needed or not: shared blocks, frozen parameters, biases, tied embeddings. This probe drops such features
//! one at a time (ranks, strategies, realisation options, data and model features), keeping each drop under which
//! the case still diverges anywhere; what is left is what the bug needs, and `cluster` groups findings by it.

use std::collections::HashSet;

use shardfuzz_harnesses::case::{Case, Limits};
use shardfuzz_harnesses::target::Target;

use super::passes::feature_drops;
use crate::oracle::{evaluate, Oracle, VerdictKind};

/// Most target runs of one probe.
pub const MAX_PROBE_EXECS: u64 = 24;

/// The case with every droppable feature dropped while it still diverges on `target`, and the runs it took.
pub fn probe(target: &mut dyn Target, case: &Case, oracle: &Oracle) -> (Case, u64) {
    let mut current = case.clone();
    let mut tried: HashSet<Case> = HashSet::new();
    let mut execs = 0;
    'restart: while execs < MAX_PROBE_EXECS {
        // (No simplicity check, unlike the minimizer: every candidate drops something, and untying the
        // embeddings, which adds an LM head, is a drop here.)
        for cand in feature_drops(&current) {
            if execs >= MAX_PROBE_EXECS {
                break 'restart;
            }
            if !tried.insert(cand.clone()) || cand.validate(&Limits::default()).is_err() {
                continue;
            }
            execs += 1;
            if evaluate(target, &cand, oracle).kind == VerdictKind::Divergent {
                current = cand;
                continue 'restart;
            }
        }
        break;
    }
    (current, execs)
}
