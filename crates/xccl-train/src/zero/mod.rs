//! ZeRO (DeepSpeed's Zero Redundancy Optimizer; PyTorch's FSDP): data parallelism where
//! the group partitions what DDP replicates. With AdamW in f32 DDP holds 16 bytes per
//! parameter on every rank (4 parameters, 4 gradients, 8 moments); over a group of `N`:
//!
//! | stage | sharded | bytes per parameter per rank |
//! |---|---|---|
//! | 1 | optimiser state | 8 + 8/N |
//! | 2 | and gradients | 4 + 12/N |
//! | 3 | and parameters | 16/N, plus the working set |
//!
//! Who owns what is one structure, [`layout::ShardLayout`]: each block's elements cut into
//! `N` slices. One step on each rank of the group:
//!
//! 1. Gradients of this rank's share, block by block ([`Context::gradients`]). Stage 1
//!    keeps a full gradient buffer and, once the last micro-batch's backward has finished
//!    a block, reduce-scatters the block's gradient (`reduce_scatter_v`, its slices'
//!    counts) while earlier blocks are still in backward, as DDP overlaps its all-reduce.
//!    Stages 2 and 3 do so after *every* micro-batch and free the block's full gradient:
//!    each rank accumulates only its slice. Stage 3 also gathers each block's parameters
//!    (`all_gather_v`) just before it runs and frees them after ([`gather::Gatherer`]),
//!    prefetching the next block's; the blocks' forwards run again in backward
//!    ([`Graph::Recompute`](crate::model::Graph::Recompute)), because candle's autograd keeps
//!    a graph's weights alive until its backward and so would hold every block's
//!    parameters between forward and backward.
//! 2. The optimiser steps this rank's slices only.
//! 3. Stages 1 and 2 all-gather each block's updated slices into the full parameters;
//!    stage 3 keeps its updated shard for the next step's gathers.
//!
//! Communication per step is DDP's for stages 1 and 2 (a reduce-scatter and an all-gather
//! are one all-reduce) and 1.5 times it for stage 3 (parameters are gathered twice).

pub mod gather;
pub mod layout;

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use xccl::{Communicator, ReduceOp, Work};

use crate::checkpoint::Source;
pub use crate::config::ZeroConfig;
use crate::dcp::Snapshot;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::params::{Chunks, Shard};
use crate::run::{Context, Done, Finish, Observer, Start};
use crate::trace::{Kind, Trace};
use gather::Gatherer;
use layout::ShardLayout;

/// A collective in flight over a unit: it gives back its input and its output.
pub(crate) type UnitWork = Work<(Vec<f32>, Vec<f32>)>;

/// Reduce-scatters allowed in flight before the oldest is waited for (stages 2 and 3: each
/// holds a block's full gradient until it completes).
const IN_FLIGHT: usize = 2;

/// The reduction of a step's gradients into this rank's slices.
struct Reducer<'a> {
    comm: &'a Communicator,
    layout: &'a ShardLayout,
    /// Stage 1 keeps its full gradient chunks; 2 and 3 free them once reduced.
    keep_full: bool,
    /// Launch during backward (else everything at the end of the step).
    overlap: bool,
    launched: Vec<bool>,
    pending: VecDeque<(usize, UnitWork)>,
    /// This rank's slice of the summed gradient, in shard order.
    shard: Vec<f32>,
}

impl Reducer<'_> {
    /// The backward of a micro-batch finished block `k` and every later one.
    fn block_done(&mut self, k: usize, grads: &mut Chunks, last: bool) -> Result<()> {
        if !self.overlap || (self.keep_full && !last) {
            return Ok(());
        }
        for u in (0..self.layout.units().len()).rev() {
            if self.layout.units()[u].block >= k && !self.launched[u] {
                self.launch(u, grads)?;
            }
        }
        if self.launched.iter().all(|&l| l) && !last {
            // The next micro-batch starts over.
            self.launched.fill(false);
        }
        Ok(())
    }

    fn launch(&mut self, u: usize, grads: &mut Chunks) -> Result<()> {
        let counts = &self.layout.units()[u].counts;
        let full = grads.take(u);
        let full = if full.is_empty() { vec![0.0; grads.range(u).len()] } else { full };
        let out = vec![0.0; counts[self.layout.rank()]];
        self.pending.push_back((u, self.comm.reduce_scatter_v_async(full, out, counts, ReduceOp::Sum)));
        self.launched[u] = true;
        while !self.keep_full && self.pending.len() > IN_FLIGHT {
            self.complete_oldest(grads)?;
        }
        Ok(())
    }

    fn complete_oldest(&mut self, grads: &mut Chunks) -> Result<()> {
        let Some((u, work)) = self.pending.pop_front() else { return Ok(()) };
        let (full, slice) = work.wait()?;
        for (s, g) in self.shard[self.layout.shard_range(u)].iter_mut().zip(&slice) {
            *s += g;
        }
        if self.keep_full {
            grads.put(u, full)?;
        }
        Ok(())
    }

    /// Launches whatever is left (a rank with no rows ran no backward; stage 1 in a
    /// pipeline reduces at the end) and waits for everything; returns the time it waited.
    fn finish(&mut self, grads: &mut Chunks) -> Result<Duration> {
        for u in (0..self.layout.units().len()).rev() {
            if !self.launched[u] {
                self.launch(u, grads)?;
            }
        }
        let t0 = Instant::now();
        while !self.pending.is_empty() {
            self.complete_oldest(grads)?;
        }
        self.launched.fill(false);
        Ok(t0.elapsed())
    }
}

/// Bytes this rank holds for parameters, gradients and optimiser state between steps.
fn held(stage: u8, local: usize, shard: usize, optimizer: &Optimizer) -> [u64; 3] {
    let bytes = |n: usize| 4 * n as u64;
    let states = optimizer.state().len();
    match stage {
        1 => [bytes(local), bytes(local + shard), bytes(states * shard)],
        2 => [bytes(local), bytes(shard), bytes(states * shard)],
        _ => [bytes(shard), bytes(shard), bytes(states * shard)],
    }
}

/// One rank's ZeRO state between steps: its slices of the optimiser state, of the
/// gradient and (stage 3) of the parameters.
pub(crate) struct Zero {
    config: ZeroConfig,
    layout: ShardLayout,
    first: u64,
    losses: Vec<(u64, f64)>,
    optimizer: Optimizer,
    shard_params: Vec<f32>,
    grads: Chunks,
    shard_grads: Vec<f32>,
}

impl Zero {
    /// Cuts this rank's slices out of where the run starts; at stage 3 the model's
    /// parameters are then freed (the gathers of each step bring them back block by block).
    pub fn new(cx: &Context, config: ZeroConfig, start: Start) -> Result<Zero> {
        let (dp, model) = (cx.mesh.dp(), cx.model);
        let set = model.params();
        let layout = ShardLayout::new(set, model.blocks().len(), dp.size(), dp.rank());
        let Start { step: first, params, optimizer, losses } = start;
        let state = optimizer.state().iter().map(|s| layout.shard_of(s)).collect();
        let optimizer = Optimizer::restore(*optimizer.config(), optimizer.steps(), state)?;
        let shard_params = if config.stage == 3 { layout.shard_of(&params) } else { Vec::new() };
        drop(params);
        let lens: Vec<usize> = layout.units().iter().map(|u| u.range.len()).collect();
        let grads = if config.stage == 1 { Chunks::new(&lens) } else { Chunks::vacant(&lens) };
        if config.stage == 3 {
            for slot in set.slots() {
                slot.param.release()?;
            }
        }
        let shard_grads = vec![0.0; layout.shard_len()];
        Ok(Zero { config, layout, first, losses, optimizer, shard_params, grads, shard_grads })
    }
}

/// The ZeRO loop over the data-parallel group.
pub(crate) fn run(
    cx: &Context,
    zero: Zero,
    trace: &mut Trace,
    observer: &mut dyn Observer,
) -> Result<Finish> {
    let dp = cx.mesh.dp();
    let model = cx.model;
    let set = model.params();
    let Zero { config, layout, first, losses, mut optimizer, mut shard_params, mut grads, mut shard_grads } =
        zero;
    let stage3 = config.stage == 3;
    let mut done = Done { losses, ..Done::default() };
    let mut working_set = 0;
    let mut saver = cx.saver()?;
    for step in first..cx.config.steps {
        let t0 = Instant::now();
        let (share, norm) = trace.span(|| "data".into(), || cx.share(step, dp.rank(), dp.size()));
        grads.zero();
        shard_grads.fill(0.0);
        let mut reducer = Reducer {
            comm: dp,
            layout: &layout,
            keep_full: config.stage == 1,
            overlap: config.stage > 1 || cx.pipeline.is_none(),
            launched: vec![false; layout.units().len()],
            pending: VecDeque::new(),
            shard: std::mem::take(&mut shard_grads),
        };
        let mut gatherer = match stage3 {
            true => Some(Gatherer::new(dp, &layout, model, &shard_params)?),
            false => None,
        };
        let residency = gatherer.as_mut().map(|g| g as &mut dyn crate::model::Residency);
        let (local, pipe) = cx.gradients(&share, norm, &mut grads, trace, residency, |k, g, last| {
            reducer.block_done(k, g, last)
        })?;
        if let Some(g) = &mut gatherer {
            g.drain()?;
            g.release_all()?;
            working_set = working_set.max(g.peak);
        }
        drop(gatherer);
        // The pipeline's shared parameters are summed between stages on the full
        // gradients, before they are reduce-scattered (stage 1 then reduces at the end).
        let local = cx.finish_step(&mut grads, local)?;
        let w0 = Instant::now();
        let total = dp.all_reduce_async(vec![local], ReduceOp::Sum);
        let wait = reducer.finish(&mut grads)?;
        let loss = total.wait()?[0];
        trace.record(Kind::Wait, "wait reduce-scatter".into(), w0, w0 + wait);
        shard_grads = reducer.shard;
        trace.span(
            || "optimizer".into(),
            || step_shards(cx, &layout, &mut optimizer, &mut shard_params, &shard_grads, stage3),
        )?;
        let sent = cx.step_comm(trace);
        cx.end_step((step, t0, wait, sent), pipe, loss, &mut done, observer);
        if cx.checkpoint_due(step + 1) {
            let snap = snapshot(cx, &layout, &optimizer, &shard_params, stage3, step + 1, &done.losses)?;
            trace.span(|| "checkpoint".into(), || cx.submit(&mut saver, snap))?;
        }
    }
    if let Some(s) = &mut saver {
        s.wait()?;
    }
    let mut held = held(config.stage, set.len(), layout.shard_len(), &optimizer);
    if stage3 {
        held[0] += 4 * working_set as u64;
    }
    // The final parameters, whole on every rank of the group.
    let params = match stage3 {
        true => gather_all(dp, &layout, &shard_params)?,
        false => set.read()?,
    };
    let Done { steps, losses, peak_rss, timeline } = done;
    Ok(Finish { params, steps, losses, role: "worker", peak_rss, timeline, held })
}

/// The optimiser's step over this rank's slices, then (stages 1 and 2) every block's
/// updated slices all-gathered into the model's parameters, two blocks in flight.
fn step_shards(
    cx: &Context,
    layout: &ShardLayout,
    optimizer: &mut Optimizer,
    shard_params: &mut [f32],
    shard_grads: &[f32],
    stage3: bool,
) -> Result<()> {
    let (dp, set) = (cx.mesh.dp(), cx.model.params());
    optimizer.begin_step();
    let mut gathers = VecDeque::new();
    for (u, unit) in layout.units().iter().enumerate() {
        let sr = layout.shard_range(u);
        if stage3 {
            optimizer.update(sr.start, &mut shard_params[sr.clone()], &shard_grads[sr])?;
            continue;
        }
        let mut mine = set.read_range(layout.owned(u))?;
        optimizer.update(sr.start, &mut mine, &shard_grads[sr])?;
        gathers.push_back((
            unit.range.start,
            dp.all_gather_v_async(mine, vec![0.0; unit.range.len()], &unit.counts),
        ));
        while gathers.len() > 2 {
            write_back(set, gathers.pop_front())?;
        }
    }
    while !gathers.is_empty() {
        write_back(set, gathers.pop_front())?;
    }
    Ok(())
}

fn write_back(set: &crate::params::ParamSet, gather: Option<(usize, UnitWork)>) -> Result<()> {
    let (at, work) = gather.ok_or_else(|| Error::internal("no gather to wait for"))?;
    let (_, full) = work.wait()?;
    set.write_range(at, &full)
}

/// What this rank writes to a checkpoint: its slices of the parameters and of the
/// optimiser state (a piece every rank of the tensor-parallel group holds whole only from
/// the group's first rank; a pipeline's mirrors from their owner), copied now.
fn snapshot(
    cx: &Context,
    layout: &ShardLayout,
    optimizer: &Optimizer,
    shard_params: &[f32],
    stage3: bool,
    step: u64,
    losses: &[(u64, f64)],
) -> Result<Snapshot> {
    let set = cx.model.params();
    let tp_rank = cx.mesh.tp().rank();
    let parts: Vec<_> = layout
        .owned_params(set)
        .into_iter()
        .filter(|(i, _)| {
            let s = &set.slots()[*i];
            !s.mirror && (tp_rank == 0 || s.param.shard() != Shard::Replicated)
        })
        .collect();
    let at = |r: Range<usize>| layout.in_shard(r).ok_or_else(|| Error::internal("a piece outside the shard"));
    let values = |source: Source, r: Range<usize>| match source {
        Source::Params if stage3 => Ok(shard_params[at(r)?].to_vec()),
        Source::Params => set.read_range(r),
        Source::State(i) => Ok(optimizer.state()[i][at(r)?].to_vec()),
    };
    cx.snapshot(step, &parts, values, optimizer.steps(), losses)
}

/// This rank's whole flat vector from every rank's `shard` (one all-gather per unit).
fn gather_all(dp: &Communicator, layout: &ShardLayout, shard: &[f32]) -> Result<Vec<f32>> {
    let len = layout.units().last().map_or(0, |u| u.range.end);
    let mut full = vec![0.0; len];
    for (u, unit) in layout.units().iter().enumerate() {
        dp.all_gather_v(&shard[layout.shard_range(u)], &mut full[unit.range.clone()], &unit.counts)?;
    }
    Ok(full)
}
