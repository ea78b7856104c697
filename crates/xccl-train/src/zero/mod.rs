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
//! 1. Gradients of this rank's share, block by block (the loop, `train_loop`). Stage 1
//!    keeps a full gradient buffer and, once the last micro-batch's backward has finished
//!    a block, reduce-scatters the block's gradient (`reduce_scatter_v`, its slices'
//!    counts) while earlier blocks are still in backward, as DDP overlaps its all-reduce.
//!    Stages 2 and 3 do so after *every* micro-batch and free the block's full gradient:
//!    each rank accumulates only its slice. Stage 3 also gathers each block's parameters
//!    (`all_gather_v`) just before it runs and frees them after (`gather::Gatherer`),
//!    prefetching the next block's: after its forward, and again after its backward (the
//!    last block's stay from its forward to its backward, which follows the loss). What
//!    a block keeps between the two ([`Block::forward_saved`](crate::model::Block::forward_saved))
//!    holds no parameter, so its forward need not run again (as PyTorch's FSDP2 frees
//!    parameters by resizing their storage under autograd); recomputation
//!    ([`Graph::Recompute`](crate::model::Graph::Recompute)) stays an option for memory.
//! 2. The optimiser steps this rank's slices only.
//! 3. Stages 1 and 2 all-gather each block's updated slices into the full parameters;
//!    stage 3 keeps its updated shard for the next step's gathers.
//!
//! Communication per step is DDP's for stages 1 and 2 (a reduce-scatter and an all-gather
//! are one all-reduce) and 1.5 times it for stage 3 (parameters are gathered twice).
//!
//! `Zero` is a `Strategy`: step 1 is its block hooks (stage 3's gathers before and after
//! each block, the reduce-scatters as blocks finish) and its reduction (`reduce`), steps 2
//! and 3 its optimiser step.

pub mod gather;
pub mod layout;
mod reduce;

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use xccl::{Communicator, ReduceOp, Work};

use crate::checkpoint::Source;
pub use crate::config::ZeroConfig;
use crate::dcp::Snapshot;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::params::{Chunks, Lent, ParamSet, Shard};
use crate::run::{Context, Start};
use crate::strategy::{Begin, Final, Reduced, Strategy};
use crate::trace::{Kind, Trace};
use gather::Gatherer;
use layout::ShardLayout;
use reduce::Reducer;

/// A collective in flight over a unit: it gives back its input and its output.
pub(crate) type UnitWork = Work<(Vec<f32>, Vec<f32>)>;

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

/// One rank's ZeRO state: its slices of the optimiser state, of the gradient and (stage 3)
/// of the parameters, the reduction and (stage 3) the gathers of each step.
pub(crate) struct Zero<'a> {
    dp: &'a Communicator,
    model: &'a Model,
    stage: u8,
    /// Stage 3 runs each block's forward again before its backward.
    recompute: bool,
    layout: ShardLayout,
    optimizer: Optimizer,
    /// Stage 3: this rank's slices of the parameters, one chunk per unit, each sent by its
    /// unit's gathers as it is (no chunks otherwise).
    shard_params: Chunks,
    reducer: Reducer,
    /// Stage 3: the gathers of the blocks' parameters.
    gatherer: Option<Gatherer<'a>>,
    /// Stage 3: the most full parameter elements present at once in any step.
    working_set: usize,
    /// Stages 1 and 2: per unit, the buffer its last gather lent to the parameters, taken
    /// back for its next gather.
    lent: Vec<Option<Lent>>,
}

impl<'a> Zero<'a> {
    /// Cuts this rank's slices out of where the run starts; at stage 3 the model's
    /// parameters are then freed (the gathers of each step bring them back block by block).
    pub fn new(cx: &Context<'a>, config: ZeroConfig, start: Start) -> Result<Zero<'a>> {
        let (dp, model) = (cx.mesh.dp(), cx.model);
        let set = model.params();
        let layout = ShardLayout::new(set, model.blocks().len(), dp.size(), dp.rank());
        let Start { params, optimizer, .. } = start;
        let state = optimizer.state().iter().map(|s| layout.shard_of(s)).collect();
        let optimizer = Optimizer::restore(*optimizer.config(), optimizer.steps(), state)?;
        let stage3 = config.stage == 3;
        let shard_params = if stage3 {
            let lens: Vec<usize> = (0..layout.units().len()).map(|u| layout.shard_range(u).len()).collect();
            let mut chunks = Chunks::new(&lens);
            chunks.set(0, &layout.shard_of(&params))?;
            chunks
        } else {
            Chunks::new(&[])
        };
        drop(params);
        if stage3 {
            for slot in set.slots() {
                slot.param.release()?;
            }
        }
        // Stage 1 keeps the full gradient and, in a pipeline, reduces it only at the end,
        // after the shared parameters' gradients are summed between stages.
        let overlap = config.stage > 1 || cx.pipeline.is_none();
        let reducer = Reducer::new(dp.clone(), &layout, config.stage == 1, overlap);
        let gatherer = stage3.then(|| Gatherer::new(dp, &layout, model));
        Ok(Zero {
            dp,
            model,
            stage: config.stage,
            recompute: stage3 && config.recompute,
            layout,
            optimizer,
            shard_params,
            reducer,
            gatherer,
            working_set: 0,
            lent: Vec::new(),
        })
    }
}

/// ZeRO's hooks: stage 3's gathers around each block, each block's gradient
/// reduce-scattered as it finishes, the optimiser over this rank's slices.
impl Strategy for Zero<'_> {
    fn gradient_buffer(&self) -> Chunks {
        let lens: Vec<usize> = self.layout.units().iter().map(|u| u.range.len()).collect();
        // Stages 2 and 3 allocate a block's chunk when backward first adds to it.
        if self.stage == 1 { Chunks::new(&lens) } else { Chunks::vacant(&lens) }
    }

    fn begin_step(&mut self, _: &Context, _: u64, _: &mut Trace) -> Result<Begin> {
        self.reducer.reset();
        Ok(Begin { worker: (self.dp.rank(), self.dp.size()), wait: Duration::ZERO, version: None })
    }

    fn releases_params(&self) -> bool {
        self.gatherer.is_some()
    }

    fn recomputes(&self) -> bool {
        self.recompute
    }

    fn before_block(&mut self, k: usize, next: Option<usize>) -> Result<()> {
        match &mut self.gatherer {
            Some(g) => g.fetch(&self.layout, &mut self.shard_params, k, next),
            None => Ok(()),
        }
    }

    fn after_block(&mut self, k: usize) -> Result<()> {
        match &mut self.gatherer {
            Some(g) => g.evict(k),
            None => Ok(()),
        }
    }

    fn block_done(&mut self, k: usize, grads: &mut Chunks, last: bool) -> Result<()> {
        self.reducer.block_done(&self.layout, k, grads, last)
    }

    fn reduce(&mut self, cx: &Context, grads: &mut Chunks, loss: f64, trace: &mut Trace) -> Result<Reduced> {
        if let Some(g) = &mut self.gatherer {
            g.drain(&mut self.shard_params)?;
            g.release_all()?;
            self.working_set = self.working_set.max(g.peak);
        }
        // The pipeline's shared parameters are summed between stages on the full local
        // gradients: once reduce-scattered, the two stages' slices of them differ.
        cx.sum_shared(grads)?;
        let w0 = Instant::now();
        let total = self.dp.all_reduce_async(vec![loss], ReduceOp::Sum);
        let wait = self.reducer.finish(&self.layout, grads)?;
        let loss = total.wait()?[0];
        trace.record(Kind::Wait, "wait reduce-scatter".into(), w0, w0 + wait);
        Ok(Reduced { loss: Some(loss), wait })
    }

    fn optimizer_step(&mut self, _: &Context, _: &Chunks) -> Result<()> {
        let shard_grads = &self.reducer.shard;
        let set = self.model.params();
        let (layout, optimizer, dp) = (&self.layout, &mut self.optimizer, self.dp);
        match self.stage {
            3 => step_shard(layout, optimizer, &mut self.shard_params, shard_grads),
            _ => step_and_gather(dp, set, layout, optimizer, shard_grads, &mut self.lent),
        }
    }

    fn snapshot(&self, cx: &Context, step: u64, losses: &[(u64, f64)]) -> Result<Option<Snapshot>> {
        snapshot(
            cx,
            &self.layout,
            &self.optimizer,
            self.gatherer.as_ref().map(|_| &self.shard_params),
            step,
            losses,
        )
        .map(Some)
    }

    fn finish(&mut self, _: &Context, _: &mut Trace) -> Result<Final> {
        let set = self.model.params();
        let mut held = held(self.stage, set.len(), self.layout.shard_len(), &self.optimizer);
        held[0] += 4 * self.working_set as u64;
        // The final parameters, whole on every rank of the group.
        let params = match self.gatherer {
            Some(_) => gather_all(self.dp, &self.layout, &self.shard_params)?,
            None => set.read()?,
        };
        Ok(Final { params, held, role: "worker" })
    }
}

/// Stage 3: the optimiser's step over this rank's slices of the parameters.
fn step_shard(
    layout: &ShardLayout,
    optimizer: &mut Optimizer,
    params: &mut Chunks,
    grads: &[f32],
) -> Result<()> {
    optimizer.begin_step();
    for u in 0..layout.units().len() {
        let sr = layout.shard_range(u);
        optimizer.update(sr.start, params.chunk_mut(u), &grads[sr])?;
    }
    Ok(())
}

/// Stages 1 and 2: the optimiser's step over this rank's slices of the model's parameters,
/// every block's updated slices all-gathered into them, two blocks in flight. Each gather
/// lends its buffer to the parameters (`lent`, per unit); the next step's gather of the
/// unit takes it back once this rank's slices are read from it (nothing reads the unit's
/// parameters until that gather lends it again).
fn step_and_gather(
    dp: &Communicator,
    set: &ParamSet,
    layout: &ShardLayout,
    optimizer: &mut Optimizer,
    shard_grads: &[f32],
    lent: &mut Vec<Option<Lent>>,
) -> Result<()> {
    lent.resize_with(layout.units().len(), || None);
    optimizer.begin_step();
    let mut gathers = VecDeque::new();
    for (u, unit) in layout.units().iter().enumerate() {
        let sr = layout.shard_range(u);
        let mut mine = set.read_range(layout.owned(u))?;
        optimizer.update(sr.start, &mut mine, &shard_grads[sr])?;
        let full = match lent[u].take() {
            Some(old) => set.take_back(old)?,
            None => vec![0.0; unit.range.len()],
        };
        gathers.push_back((u, dp.all_gather_v_async(mine, full, &unit.counts)));
        while gathers.len() > 2 {
            write_back(set, layout, lent, gathers.pop_front())?;
        }
    }
    while !gathers.is_empty() {
        write_back(set, layout, lent, gathers.pop_front())?;
    }
    Ok(())
}

fn write_back(
    set: &ParamSet,
    layout: &ShardLayout,
    lent: &mut [Option<Lent>],
    gather: Option<(usize, UnitWork)>,
) -> Result<()> {
    let (u, work) = gather.ok_or_else(|| Error::internal("no gather to wait for"))?;
    let (_, full) = work.wait()?;
    lent[u] = Some(set.lend_range(layout.units()[u].range.start, full)?);
    Ok(())
}

/// What this rank writes to a checkpoint: its slices of the parameters (stage 3: of
/// `shard_params`; else read from the model) and of the optimiser state (a piece every rank
/// of the tensor-parallel group holds whole only from the group's first rank; a pipeline's
/// mirrors from their owner), copied now.
fn snapshot(
    cx: &Context,
    layout: &ShardLayout,
    optimizer: &Optimizer,
    shard_params: Option<&Chunks>,
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
    let values = |source: Source, r: Range<usize>| match (source, shard_params) {
        (Source::Params, Some(shard)) => shard.get(at(r)?),
        (Source::Params, None) => set.read_range(r),
        (Source::State(i), _) => Ok(optimizer.state()[i][at(r)?].to_vec()),
    };
    cx.snapshot(step, &parts, values, optimizer.steps(), losses)
}

/// This rank's whole flat vector from every rank's `shard` (one all-gather per unit).
fn gather_all(dp: &Communicator, layout: &ShardLayout, shard: &Chunks) -> Result<Vec<f32>> {
    let len = layout.units().last().map_or(0, |u| u.range.end);
    let mut full = vec![0.0; len];
    for (u, unit) in layout.units().iter().enumerate() {
        dp.all_gather_v(shard.chunk(u), &mut full[unit.range.clone()], &unit.counts)?;
    }
    Ok(full)
}
