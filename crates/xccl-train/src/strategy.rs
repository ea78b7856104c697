//! The seam between the one training loop ([`crate::train_loop`]) and a data-parallel
//! strategy: DDP ([`crate::ddp`]), ZeRO stages 1–3 ([`crate::zero`]) or a parameter server's
//! worker ([`crate::ps`]). A strategy is its data (buckets, shards, an optimiser, links to
//! servers) and the hooks of [`Strategy`]; the loop calls them in this order each step:
//!
//! ```text
//! begin_step → (per block, as forward and backward run: before_block, after_block, block_done)
//!            → reduce → [Context::finish_step] → optimizer_step → traffic → arrived
//!            → snapshot (when a checkpoint is due)
//! ```
//!
//! and [`finish`](Strategy::finish) once after the last step. Pipeline and tensor
//! parallelism compose underneath: a pipeline changes how a step's gradients are computed
//! (its chunks call [`block_done`](Strategy::block_done) as their last backward ends), tensor
//! parallelism what the local parameters are; a strategy reduces this rank's local flat
//! gradient over the data-parallel group whatever it holds.
//!
//! [`Context::finish_step`]: crate::run::Context::finish_step

use std::time::Duration;

use crate::dcp::Snapshot;
use crate::error::Result;
use crate::params::Chunks;
use crate::run::Context;
use crate::trace::Trace;

/// What [`Strategy::begin_step`] tells the loop about the step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Begin {
    /// This rank's share of the global batch: worker `.0` of `.1` workers.
    pub worker: (usize, usize),
    /// Time spent waiting before the step could start (parameter server: for a recent
    /// enough version).
    pub wait: Duration,
    /// The version of the parameters the step computes on, where versions exist (the
    /// parameter server).
    pub version: Option<u64>,
}

/// What [`Strategy::reduce`] tells the loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reduced {
    /// The sum of the step's loss over the data-parallel group (in a pipeline, this stage's
    /// part: non-zero on the last stage only), the same on every rank of the group; `None`
    /// where only servers learn it (the parameter server: global losses then come from
    /// [`Strategy::arrived`]).
    pub loss: Option<f64>,
    /// Time spent waiting for the reduction (the step's exposed communication).
    pub wait: Duration,
}

/// What a strategy leaves once its last step is done.
#[derive(Debug)]
pub(crate) struct Final {
    /// This rank's final local parameters, flat in [`ParamSet`](crate::params::ParamSet)
    /// order.
    pub params: Vec<f32>,
    /// Bytes held between steps for parameters, gradients and optimiser state.
    pub held: [u64; 3],
    /// The rank's role in reports.
    pub role: &'static str,
}

/// A data-parallel strategy: the hooks the training loop calls, each with its contract.
/// The loop owns the gradient buffer (laid out by [`gradient_buffer`](Self::gradient_buffer))
/// and passes it to the hooks that read or write it, so a strategy never holds it while
/// the model writes into it. Every rank of the data-parallel group calls the hooks in the
/// same order with the same arguments (up to its own data), so the collectives a strategy
/// issues from them match across the group.
pub(crate) trait Strategy {
    /// The buffer the loop accumulates a step's local gradients into, flat in
    /// [`ParamSet`](crate::params::ParamSet) order and cut into chunks as the strategy's
    /// reduction moves them (DDP: buckets; ZeRO: blocks; parameter server: shards). Called
    /// once, before the first step.
    fn gradient_buffer(&self) -> Chunks;

    /// Step `step` begins; `grads` is about to be zeroed. Makes the model's parameters the
    /// ones this step computes on (the parameter server pulls a version recent enough) and
    /// readies per-step state. Returns which worker this rank is and how long it waited.
    fn begin_step(&mut self, cx: &Context, step: u64, trace: &mut Trace) -> Result<Begin>;

    /// Whether the model's parameters are present only between [`before_block`] and
    /// [`after_block`] (ZeRO stage 3). Such a strategy cannot run under a pipeline, whose
    /// stages keep their parameters.
    ///
    /// [`before_block`]: Self::before_block
    /// [`after_block`]: Self::after_block
    fn releases_params(&self) -> bool {
        false
    }

    /// Whether every block's forward runs again just before its backward
    /// ([`Graph::Recompute`](crate::model::Graph::Recompute)) instead of keeping what its
    /// backward needs. Default: no.
    fn recomputes(&self) -> bool {
        false
    }

    /// Block `k` is about to run (its forward, or before its backward the forward again);
    /// `next` will run after it (to prefetch). After this returns, `k`'s parameters must be
    /// in the model. Not called in a pipeline. Default: nothing (parameters stay).
    fn before_block(&mut self, _k: usize, _next: Option<usize>) -> Result<()> {
        Ok(())
    }

    /// Block `k` is done with its parameters until its next [`before_block`](Self::before_block).
    /// Default: nothing.
    fn after_block(&mut self, _k: usize) -> Result<()> {
        Ok(())
    }

    /// The backward of a micro-batch has finished block `k` and every later block: their
    /// gradients (for this micro-batch and every earlier one) are in `grads`, and no later
    /// backward of this micro-batch will add to them. `last`: the step's last micro-batch.
    /// In a pipeline it is called once per chunk, with `k` the chunk's first block, when
    /// the chunk's last micro-batch is done (`last` true). A strategy may move chunks out of
    /// `grads` here (to reduce them while backward goes on) if it puts them back, or what
    /// replaces them, by the end of [`reduce`](Self::reduce). Default: nothing.
    fn block_done(&mut self, _k: usize, _grads: &mut Chunks, _last: bool) -> Result<()> {
        Ok(())
    }

    /// Backward of the step is done (`loss`: this rank's part of the global mean loss, `0`
    /// on pipeline stages without the loss). Completes the reduction of the step's gradients
    /// over the data-parallel group: afterwards what [`optimizer_step`](Self::optimizer_step)
    /// reads (all of `grads`, or this rank's slice of it) is the sum over the group, with the
    /// gradients of parameters that two pipeline stages share summed between them
    /// ([`Context::sum_shared`]), and no operation the strategy launched on the group is
    /// still in flight. Returns the group's summed loss (see [`Reduced::loss`]) and the time
    /// waited, also recorded in `trace`.
    fn reduce(&mut self, cx: &Context, grads: &mut Chunks, loss: f64, trace: &mut Trace) -> Result<Reduced>;

    /// After [`reduce`](Self::reduce) (and [`Context::finish_step`]): steps the optimiser on
    /// the reduced gradients, so that the model's parameters (or this rank's shard of them)
    /// are the next step's. A strategy whose servers step the optimiser does nothing.
    fn optimizer_step(&mut self, cx: &Context, grads: &Chunks) -> Result<()>;

    /// The bytes the step sent on the mesh's tensor-parallel, data-parallel and pipeline
    /// groups, their operations moved into `trace` ([`Context::step_comm`]). Called once per
    /// step after the optimiser step. The parameter server overrides it: its groups are its
    /// own, traced at the end.
    fn traffic(&mut self, cx: &Context, trace: &mut Trace) -> [u64; 3] {
        cx.step_comm(trace)
    }

    /// Global losses `(step, loss)` of earlier steps that became known on this rank since the
    /// last call, for a strategy whose [`reduce`](Self::reduce) returns no loss. Default: none.
    fn arrived(&mut self) -> Vec<(u64, f64)> {
        Vec::new()
    }

    /// What this rank contributes to the checkpoint after `step` steps (`losses`: the history
    /// on rank 0), its values copied now; the loop writes it in the background. Called on
    /// every rank when a checkpoint is due; `None` where the strategy's checkpoints are
    /// written elsewhere (the parameter server's servers).
    fn snapshot(&self, cx: &Context, step: u64, losses: &[(u64, f64)]) -> Result<Option<Snapshot>>;

    /// Once, after the last step and its checkpoint: waits for anything still in flight and
    /// returns this rank's final local parameters (the same on every rank of a data-parallel
    /// group), the bytes held between steps and the rank's role.
    fn finish(&mut self, cx: &Context, trace: &mut Trace) -> Result<Final>;
}
