//! How many fresh cases a guided campaign generates beside its mutations: in proportion to what
//! each has been finding lately (corpus entries added per execution), as a two-armed bandit.
//!
//! A fixed rate (one fresh case every 64 rounds) was measured against pure random generation on
//! the framework targets: random generation covered more framework code in equal time
//! (`bench guidance`, README), because a fresh op case there reaches new sharding code more often
//! than a mutation of a known one. On the native target mutations keep finding more. Neither rate
//! suits both, so the share follows the yields.

/// Recent executions and corpus additions of one arm; halved when the executions pass
/// [`WINDOW`], so the estimate follows the campaign's current phase.
#[derive(Debug, Clone, Copy)]
struct Arm {
    execs: f64,
    added: f64,
}

const WINDOW: f64 = 4096.0;
/// Never below one fresh case in 256 executions, never above 9 in 10.
const MIN_SHARE: f64 = 1.0 / 256.0;
const MAX_SHARE: f64 = 0.9;

impl Arm {
    /// One addition in two executions: both arms start even.
    fn prior() -> Arm {
        Arm { execs: 2.0, added: 1.0 }
    }

    fn record(&mut self, execs: u64, added: u64) {
        self.execs += execs as f64;
        self.added += added as f64;
        if self.execs > WINDOW {
            self.execs /= 2.0;
            self.added /= 2.0;
        }
    }

    fn yield_per_exec(&self) -> f64 {
        self.added / self.execs
    }
}

#[derive(Debug, Clone)]
pub struct GenerationShare {
    fresh: Arm,
    mutated: Arm,
    carry: f64,
}

impl Default for GenerationShare {
    fn default() -> Self {
        GenerationShare { fresh: Arm::prior(), mutated: Arm::prior(), carry: 0.0 }
    }
}

impl GenerationShare {
    pub fn record_mutations(&mut self, execs: u64, added: u64) {
        self.mutated.record(execs, added);
    }

    pub fn record_fresh(&mut self, added: u64) {
        self.fresh.record(1, added);
    }

    /// The share of executions fresh cases get: each arm's recent yield over both.
    pub fn share(&self) -> f64 {
        let (f, m) = (self.fresh.yield_per_exec(), self.mutated.yield_per_exec());
        let share = if f + m > 0.0 { f / (f + m) } else { MIN_SHARE };
        share.clamp(MIN_SHARE, MAX_SHARE)
    }

    /// Fresh cases to run after a round of `mutation_execs` mutated executions.
    pub fn fresh_after(&mut self, mutation_execs: u64) -> usize {
        let s = self.share();
        self.carry += s / (1.0 - s) * mutation_execs.max(1) as f64;
        let n = self.carry.floor();
        self.carry -= n;
        n as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_follows_the_arm_that_finds_more() {
        let mut g = GenerationShare::default();
        for _ in 0..200 {
            g.record_mutations(8, 0);
            g.record_fresh(1);
        }
        assert!(g.share() > 0.8, "fresh cases find everything: {}", g.share());
        // The arm tried less adapts more slowly (its window is counted in its own executions).
        for _ in 0..20_000 {
            g.record_mutations(8, 1);
            g.record_fresh(0);
        }
        assert!(g.share() < 0.05, "mutations find everything: {}", g.share());
        assert!(g.share() >= MIN_SHARE);
    }

    #[test]
    fn fresh_cases_per_round_match_the_share_over_many_rounds() {
        let mut g = GenerationShare::default();
        let fresh: usize = (0..1000).map(|_| g.fresh_after(8)).sum();
        // Even priors: one fresh case per mutated execution.
        assert!((7900..=8100).contains(&fresh), "{fresh}");
    }
}
