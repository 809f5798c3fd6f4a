//! Which corpus entry to mutate next: entries that cover rarely hit parts of the map are chosen
//! more often (FairFuzz's rare branches, libFuzzer's Entropic). A combination of behaviours that few
//! executions ever reached is the frontier of the search; mutating the entry that reached it is how
//! the next, deeper combination is found. A round-robin queue of thousands of entries would take
//! minutes to return to it.

use std::collections::HashMap;

use libafl::corpus::{Corpus, CorpusId};
use libafl::schedulers::{RemovableScheduler, Scheduler};
use libafl::state::{HasCorpus, HasRand};
use libafl::Error;
use libafl_bolts::rands::Rand;

use crate::coverage;

#[derive(Debug)]
pub struct RareFeatureScheduler {
    /// Executions that hit each map slot.
    hits: Vec<u32>,
    /// The map slots each corpus entry hit when it was added.
    slots: HashMap<CorpusId, Vec<u32>>,
    order: Vec<CorpusId>,
    /// Weights of `order`, recomputed every few choices (each is a pass over an entry's slots).
    weights: Vec<f64>,
    choices: u64,
}

impl Default for RareFeatureScheduler {
    fn default() -> Self {
        RareFeatureScheduler { hits: vec![0; coverage::MAP_SIZE], slots: HashMap::new(), order: vec![], weights: vec![], choices: 0 }
    }
}

impl RareFeatureScheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// An entry's weight: the inverse square of how often its rarest slot was hit. Its own
    /// mutants hit that slot too, so an entry fades after some tens of mutations unless they find
    /// nothing rarer.
    fn weight(&self, id: CorpusId) -> f64 {
        let rarest = f64::from(self.slots[&id].iter().map(|&s| self.hits[s as usize]).min().unwrap_or(u32::MAX).max(1));
        1.0 / (rarest * rarest)
    }
}

fn current_slots() -> Vec<u32> {
    let map = unsafe { std::slice::from_raw_parts(coverage::map_ptr(), coverage::MAP_SIZE) };
    map.iter().enumerate().filter(|(_, b)| **b != 0).map(|(i, _)| i as u32).collect()
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
        self.slots.insert(id, current_slots());
        self.order.push(id);
        self.weights.push(self.weight(id));
        Ok(())
    }

    fn on_evaluation<OT>(&mut self, _state: &mut S, _input: &I, _observers: &OT) -> Result<(), Error> {
        for s in current_slots() {
            self.hits[s as usize] = self.hits[s as usize].saturating_add(1);
        }
        Ok(())
    }

    fn next(&mut self, state: &mut S) -> Result<CorpusId, Error> {
        if self.order.is_empty() {
            return Err(Error::empty("the corpus is empty"));
        }
        self.choices += 1;
        if self.choices % 16 == 0 {
            self.weights = self.order.iter().map(|&id| self.weight(id)).collect();
        }
        let total: f64 = self.weights.iter().sum();
        let mut x = state.rand_mut().next_float() * total;
        let mut pick = self.order[self.order.len() - 1];
        for (&id, w) in self.order.iter().zip(&self.weights) {
            if x < *w {
                pick = id;
                break;
            }
            x -= w;
        }
        self.set_current_scheduled(state, Some(pick))?;
        Ok(pick)
    }

    fn set_current_scheduled(&mut self, state: &mut S, next_id: Option<CorpusId>) -> Result<(), Error> {
        *state.corpus_mut().current_mut() = next_id;
        Ok(())
    }
}
