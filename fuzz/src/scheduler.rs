//! Which corpus entry to mutate next: entries that cover rarely hit parts of the map are chosen
//! more often (FairFuzz's rare branches, libFuzzer's Entropic). A combination of behaviours that few
//! executions ever reached is the frontier of the search; mutating the entry that reached it is how
//! the next, deeper combination is found. A round-robin queue of thousands of entries would take
//! minutes to return to it.

use libafl::corpus::{Corpus, CorpusId};
use libafl::schedulers::{RemovableScheduler, Scheduler};
use libafl::state::{HasCorpus, HasRand};
use libafl::Error;
use libafl_bolts::rands::Rand;

use crate::coverage;

/// Slots remembered per entry.
const RARE_SLOTS_KEPT: usize = 16;

#[derive(Debug)]
pub struct RareFeatureScheduler {
    /// Executions that hit each map slot.
    hits: Vec<u32>,
    entries: Vec<Entry>,
    choices: u64,
}

#[derive(Debug)]
struct Entry {
    id: CorpusId,
    /// The rarest map slots it hit when it was added (hit counts only grow, so the rarest slot of
    /// an entry stays among them; keeping a few makes reweighting cheap with thousands of entries).
    slots: Vec<u32>,
    /// Milliseconds it ran.
    cost_ms: f64,
    /// Recomputed every few choices (each recomputation is a pass over its slots).
    weight: f64,
    /// No target could express it (an op case on the native target): never chosen while another
    /// entry can be. Without feedback every entry has empty slots and weighs by cost alone, and
    /// these refusals are the cheapest runs: they took two thirds of the executions.
    expressed: bool,
}

impl Default for RareFeatureScheduler {
    fn default() -> Self {
        RareFeatureScheduler { hits: vec![0; coverage::MAP_SIZE], entries: vec![], choices: 0 }
    }
}

impl RareFeatureScheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// An entry's weight: the inverse square of how often its rarest slot was hit, over its cost.
    /// Its own mutants hit that slot too, so an entry fades after some tens of mutations; of two
    /// entries as rare, the one that runs in half the time gets twice the mutations (AFL favours
    /// fast, small entries for the same reason).
    fn weight(&self, e: &Entry) -> f64 {
        if !e.expressed {
            return 0.0;
        }
        let rarest = e.slots.iter().map(|&s| self.hits[s as usize]).min().unwrap_or(u32::MAX);
        entry_weight(rarest, e.cost_ms)
    }
}

/// 1 / (hits of the rarest slot)² / (milliseconds per run)².
fn entry_weight(rarest_hits: u32, cost_ms: f64) -> f64 {
    let rarest = f64::from(rarest_hits.max(1));
    let cost = cost_ms.max(0.5);
    1.0 / (rarest * rarest * cost * cost)
}

impl<I, S> RemovableScheduler<I, S> for RareFeatureScheduler {}

impl<I, S> Scheduler<I, S> for RareFeatureScheduler
where
    S: HasCorpus<I> + HasRand,
{
    fn on_add(&mut self, state: &mut S, id: CorpusId) -> Result<(), Error> {
        let parent = *state.corpus().current();
        state.corpus().get(id)?.borrow_mut().set_parent_id_optional(parent);
        // The map still holds the execution that made this entry interesting.
        let mut slots = coverage::hits().clone();
        slots.sort_by_key(|&s| self.hits[s as usize]);
        slots.truncate(RARE_SLOTS_KEPT);
        let mut e = Entry {
            id,
            slots,
            cost_ms: coverage::last_exec_time().as_secs_f64() * 1e3,
            weight: 0.0,
            expressed: coverage::last_expressed(),
        };
        e.weight = self.weight(&e);
        self.entries.push(e);
        Ok(())
    }

    fn on_evaluation<OT>(&mut self, _state: &mut S, _input: &I, _observers: &OT) -> Result<(), Error> {
        for &s in coverage::hits().iter() {
            self.hits[s as usize] = self.hits[s as usize].saturating_add(1);
        }
        Ok(())
    }

    fn next(&mut self, state: &mut S) -> Result<CorpusId, Error> {
        let Some(last) = self.entries.last() else {
            return Err(Error::empty("the corpus is empty"));
        };
        let mut pick = last.id;
        self.choices += 1;
        if self.choices % 16 == 0 {
            let weights: Vec<f64> = self.entries.iter().map(|e| self.weight(e)).collect();
            for (e, w) in self.entries.iter_mut().zip(weights) {
                e.weight = w;
            }
        }
        let total: f64 = self.entries.iter().map(|e| e.weight).sum();
        let mut x = state.rand_mut().next_float() * total;
        for e in &self.entries {
            if x < e.weight {
                pick = e.id;
                break;
            }
            x -= e.weight;
        }
        self.set_current_scheduled(state, Some(pick))?;
        Ok(pick)
    }

    fn set_current_scheduled(&mut self, state: &mut S, next_id: Option<CorpusId>) -> Result<(), Error> {
        *state.corpus_mut().current_mut() = next_id;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rare_and_cheap_entries_weigh_more_and_an_entry_fades_as_its_slot_gets_hit() {
        assert!(entry_weight(1, 2.0) > entry_weight(5, 2.0));
        assert!(entry_weight(5, 1.0) > entry_weight(5, 4.0));
        // Ten mutants that hit the same rare slot cut its weight a hundredfold.
        assert!((entry_weight(1, 2.0) / entry_weight(10, 2.0) - 100.0).abs() < 1e-9);
        // Near-free runs are floored, so they cannot take the whole schedule.
        assert_eq!(entry_weight(3, 0.01), entry_weight(3, 0.5));
    }

    #[test]
    fn an_entry_no_target_could_express_is_never_weighed() {
        let s = RareFeatureScheduler::new();
        let entry = |expressed| Entry { id: CorpusId(0), slots: vec![], cost_ms: 0.1, weight: 0.0, expressed };
        assert_eq!(s.weight(&entry(false)), 0.0);
        assert!(s.weight(&entry(true)) > 0.0);
    }
}
