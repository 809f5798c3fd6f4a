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
const RARE_SLOTS_KEPT: usize = 64;

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

    /// An entry's weight: how rare its rarest slots are, over its cost. Each of its kept slots adds
    /// 1 / (executions that hit it)²: an entry that alone combines many paths outweighs one with a
    /// single rare combination (with quadruples of paths nearly every entry has one slot hit once,
    /// and a weight from that slot alone spread the choice evenly over thousands of entries). Its
    /// own mutants hit the same slots, so an entry fades after some tens of mutations.
    fn weight(&self, e: &Entry) -> f64 {
        if !e.expressed {
            return 0.0;
        }
        let rarity: f64 = e.slots.iter().map(|&s| 1.0 / f64::from(self.hits[s as usize].max(1)).powi(2)).sum();
        entry_weight(rarity, e.cost_ms)
    }
}

/// rarity / (milliseconds per run)², rarity floored so entries without slots (no feedback) weigh by
/// cost alone; near-free runs are floored too, so they cannot take the whole schedule.
fn entry_weight(rarity: f64, cost_ms: f64) -> f64 {
    let cost = cost_ms.max(0.5);
    rarity.max(1e-12) / (cost * cost)
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

    fn scheduler_with_hits(hits: &[(u32, u32)]) -> RareFeatureScheduler {
        let mut s = RareFeatureScheduler::new();
        for &(slot, n) in hits {
            s.hits[slot as usize] = n;
        }
        s
    }

    fn entry(slots: &[u32], cost_ms: f64) -> Entry {
        Entry { id: CorpusId(0), slots: slots.to_vec(), cost_ms, weight: 0.0, expressed: true }
    }

    #[test]
    fn rare_cheap_entries_weigh_more_and_an_entry_fades_as_its_slots_get_hit() {
        let mut s = scheduler_with_hits(&[(1, 1), (2, 5), (3, 1)]);
        assert!(s.weight(&entry(&[1], 2.0)) > s.weight(&entry(&[2], 2.0)));
        assert!(s.weight(&entry(&[2], 1.0)) > s.weight(&entry(&[2], 4.0)));
        // Two rare combinations weigh twice one.
        assert!((s.weight(&entry(&[1, 3], 2.0)) / s.weight(&entry(&[1], 2.0)) - 2.0).abs() < 1e-9);
        // Ten mutants that hit the same rare slot cut its weight a hundredfold.
        let before = s.weight(&entry(&[1], 2.0));
        s.hits[1] = 10;
        assert!((before / s.weight(&entry(&[1], 2.0)) - 100.0).abs() < 1e-9);
        // Near-free runs are floored, so they cannot take the whole schedule.
        assert_eq!(s.weight(&entry(&[2], 0.01)), s.weight(&entry(&[2], 0.5)));
    }

    #[test]
    fn an_entry_no_target_could_express_is_never_weighed() {
        let s = RareFeatureScheduler::new();
        let entry = |expressed| Entry { id: CorpusId(0), slots: vec![], cost_ms: 0.1, weight: 0.0, expressed };
        assert_eq!(s.weight(&entry(false)), 0.0);
        assert!(s.weight(&entry(true)) > 0.0);
    }
}
