//! ZeRO's reduction of a step's gradients into this rank's slices: each block's (unit's)
//! gradient reduce-scattered (`reduce_scatter_v`, its slices' counts) as soon as backward has
//! finished the block, while earlier blocks are still in backward.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use xccl::{Communicator, ReduceOp};

use super::UnitWork;
use super::layout::ShardLayout;
use crate::error::Result;
use crate::params::Chunks;

/// Reduce-scatters allowed in flight before the oldest is waited for (stages 2 and 3: each
/// holds a block's full gradient until it completes).
const IN_FLIGHT: usize = 2;

/// The reduction of a step's gradients over the data-parallel group `comm`.
pub(crate) struct Reducer {
    comm: Communicator,
    /// Stage 1 keeps its full gradient chunks; 2 and 3 free them once reduced.
    keep_full: bool,
    /// Launch during backward (else everything at the end of the step).
    overlap: bool,
    launched: Vec<bool>,
    pending: VecDeque<(usize, UnitWork)>,
    /// This rank's slice of the summed gradient, in shard order.
    pub shard: Vec<f32>,
    /// Output buffers of finished reduce-scatters, kept for the next ones (each is written
    /// whole by its collective): a fresh one costs a zero fill.
    spare: Vec<Vec<f32>>,
}

impl Reducer {
    /// A reducer of `layout`'s units over `comm`; `keep_full`: the full gradient chunks are
    /// put back once reduced (stage 1); `overlap`: reduce during backward.
    pub fn new(comm: Communicator, layout: &ShardLayout, keep_full: bool, overlap: bool) -> Reducer {
        Reducer {
            comm,
            keep_full,
            overlap,
            launched: vec![false; layout.units().len()],
            pending: VecDeque::new(),
            shard: vec![0.0; layout.shard_len()],
            spare: Vec::new(),
        }
    }

    /// A new step: nothing launched, the summed slice zero.
    pub fn reset(&mut self) {
        self.launched.fill(false);
        self.shard.fill(0.0);
    }

    /// The backward of a micro-batch finished block `k` and every later one.
    pub fn block_done(
        &mut self,
        layout: &ShardLayout,
        k: usize,
        grads: &mut Chunks,
        last: bool,
    ) -> Result<()> {
        if !self.overlap || (self.keep_full && !last) {
            return Ok(());
        }
        for u in (0..layout.units().len()).rev() {
            if layout.units()[u].block >= k && !self.launched[u] {
                self.launch(layout, u, grads)?;
            }
        }
        if self.launched.iter().all(|&l| l) && !last {
            // The next micro-batch starts over.
            self.launched.fill(false);
        }
        Ok(())
    }

    fn launch(&mut self, layout: &ShardLayout, u: usize, grads: &mut Chunks) -> Result<()> {
        let counts = &layout.units()[u].counts;
        // Stages 2 and 3 drop the full gradient once reduced: the chunk is vacant again.
        let full = if self.keep_full { grads.take(u) } else { grads.take_for_good(u) };
        let n = counts[layout.rank()];
        let out = match self.spare.iter().position(|b| b.len() == n) {
            Some(i) => self.spare.swap_remove(i),
            None => vec![0.0; n],
        };
        self.pending.push_back((u, self.comm.reduce_scatter_v_async(full, out, counts, ReduceOp::Sum)));
        self.launched[u] = true;
        while !self.keep_full && self.pending.len() > IN_FLIGHT {
            self.complete_oldest(layout, grads)?;
        }
        Ok(())
    }

    fn complete_oldest(&mut self, layout: &ShardLayout, grads: &mut Chunks) -> Result<()> {
        let Some((u, work)) = self.pending.pop_front() else { return Ok(()) };
        let (full, slice) = work.wait()?;
        for (s, g) in self.shard[layout.shard_range(u)].iter_mut().zip(&slice) {
            *s += g;
        }
        self.spare.push(slice);
        if self.keep_full {
            grads.put(u, full)?;
        } else {
            grads.recycle(full);
        }
        Ok(())
    }

    /// Launches whatever is left (a rank with no rows ran no backward; stage 1 in a
    /// pipeline reduces at the end) and waits for everything; returns the time it waited.
    pub fn finish(&mut self, layout: &ShardLayout, grads: &mut Chunks) -> Result<Duration> {
        for u in (0..layout.units().len()).rev() {
            if !self.launched[u] {
                self.launch(layout, u, grads)?;
            }
        }
        let t0 = Instant::now();
        while !self.pending.is_empty() {
            self.complete_oldest(layout, grads)?;
        }
        self.launched.fill(false);
        Ok(t0.elapsed())
    }
}
