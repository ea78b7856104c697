//! ZeRO stage 3's parameters: each rank keeps only its shard; a block's parameters are
//! all-gathered just before the block runs (forward, and again before its backward) and
//! freed right after. While block `k` computes, the
//! parameters of the block that runs next are already being gathered (prefetch), so at most
//! two blocks' full parameters exist at a time (three with a tied head, which also needs
//! the embedding's). A gather's buffer is lent to the parameters as it is (no copy) and
//! taken back when they are freed, for the next gather of a unit of its size: its memory
//! is allocated once, not once per fetch.

use std::collections::BTreeMap;

use xccl::Communicator;

use super::UnitWork;
use super::layout::ShardLayout;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::params::{Chunks, Lent};

/// Gathers and frees the parameters of the blocks of one rank's model. Its methods take the
/// [`ShardLayout`] it was made for and this rank's shard of the parameters, one chunk per
/// unit, as they are at the time (the optimiser updates the shard between steps). A unit's
/// chunk is sent by its gather itself, taken out of the shard while the gather is in flight
/// and put back when it completes: no copy.
pub(crate) struct Gatherer<'a> {
    comm: &'a Communicator,
    model: &'a Model,
    /// For each block, the units whose parameters it uses (its own, and an earlier block's
    /// it shares).
    needs: Vec<Vec<usize>>,
    /// Gathers in flight, by unit.
    in_flight: BTreeMap<usize, UnitWork>,
    /// Units whose full parameters are in the model now: the buffer lent to them.
    resident: Vec<Option<Lent>>,
    /// Most full elements resident or in flight at once (the working set), this step.
    pub peak: usize,
    /// Buffers of finished gathers (the whole), kept for the next ones: a fresh buffer costs
    /// a zero fill and a page fault per page.
    spare: Vec<Vec<f32>>,
}

impl<'a> Gatherer<'a> {
    /// A gatherer over `comm` (the data-parallel group) for `model`'s parameters, cut by
    /// `layout`. Every parameter is expected released.
    pub fn new(comm: &'a Communicator, layout: &ShardLayout, model: &'a Model) -> Gatherer<'a> {
        let set = model.params();
        let mut needs = Vec::with_capacity(model.blocks().len());
        for block in 0..model.blocks().len() {
            let mut units: Vec<usize> = model
                .used_params(block)
                .iter()
                .filter_map(|&i| layout.unit_of_element(set.slots()[i].offset))
                .collect();
            units.sort_unstable();
            units.dedup();
            needs.push(units);
        }
        Gatherer {
            comm,
            model,
            needs,
            in_flight: BTreeMap::new(),
            resident: (0..layout.units().len()).map(|_| None).collect(),
            peak: 0,
            spare: Vec::new(),
        }
    }

    fn launch(&mut self, layout: &ShardLayout, shard: &mut Chunks, u: usize) {
        if self.resident[u].is_some() || self.in_flight.contains_key(&u) {
            return;
        }
        let unit = &layout.units()[u];
        let full = match self.spare.iter().position(|f| f.len() == unit.range.len()) {
            Some(i) => self.spare.swap_remove(i),
            None => vec![0.0; unit.range.len()],
        };
        let work = self.comm.all_gather_v_async(shard.take(u), full, &unit.counts);
        self.in_flight.insert(u, work);
        self.note_working_set(layout);
    }

    fn note_working_set(&mut self, layout: &ShardLayout) {
        let units = layout.units();
        let held: usize = (0..units.len())
            .filter(|u| self.resident[*u].is_some() || self.in_flight.contains_key(u))
            .map(|u| units[u].range.len())
            .sum();
        self.peak = self.peak.max(held);
    }

    /// Puts unit `u`'s full parameters into the model (waiting for its gather): the
    /// gathered buffer lent to them.
    fn materialise(&mut self, layout: &ShardLayout, shard: &mut Chunks, u: usize) -> Result<()> {
        if self.resident[u].is_some() {
            return Ok(());
        }
        self.launch(layout, shard, u);
        let work = self.in_flight.remove(&u).ok_or_else(|| Error::internal("gather lost"))?;
        let (mine, full) = work.wait()?;
        shard.put(u, mine)?;
        self.resident[u] = Some(self.model.params().lend_range(layout.units()[u].range.start, full)?);
        Ok(())
    }

    /// Frees every parameter (between steps, or after a failure).
    pub fn release_all(&mut self) -> Result<()> {
        for u in 0..self.resident.len() {
            self.release(u)?;
        }
        Ok(())
    }

    /// Frees unit `u`'s parameters, its buffer kept for the next gather.
    fn release(&mut self, u: usize) -> Result<()> {
        if let Some(lent) = self.resident[u].take() {
            self.spare.push(self.model.params().take_back(lent)?);
        }
        Ok(())
    }

    /// Waits for the gathers still in flight (a prefetch nobody used), so that no
    /// collective is left running when the step ends, and puts their pieces back in `shard`.
    pub fn drain(&mut self, shard: &mut Chunks) -> Result<()> {
        for (u, work) in std::mem::take(&mut self.in_flight) {
            let (mine, full) = work.wait()?;
            shard.put(u, mine)?;
            self.spare.push(full);
        }
        Ok(())
    }

    /// Block `k` is about to run: its parameters put into the model (waiting for their
    /// gathers), those of `next`, the block that runs after it, launched (prefetch).
    pub fn fetch(
        &mut self,
        layout: &ShardLayout,
        shard: &mut Chunks,
        k: usize,
        next: Option<usize>,
    ) -> Result<()> {
        for u in self.needs[k].clone() {
            self.materialise(layout, shard, u)?;
        }
        if let Some(n) = next {
            for u in self.needs[n].clone() {
                self.launch(layout, shard, u);
            }
        }
        self.note_working_set(layout);
        Ok(())
    }

    /// Block `k` is done with its parameters: freed.
    pub fn evict(&mut self, k: usize) -> Result<()> {
        for u in self.needs[k].clone() {
            self.release(u)?;
        }
        Ok(())
    }
}
