//! The training loop, written once for every data-parallel strategy ([`Strategy`]): per
//! step this rank's share of the global batch, its gradients computed block by block (or by
//! the pipeline's schedule) with the strategy told as blocks run and finish, the strategy's
//! reduction, [`Context::finish_step`], the optimiser step, the step's statistics and, when
//! due, a checkpoint written in the background.

use std::time::Instant;

use crate::data::{Batch, shares};
use crate::dcp::Saver;
use crate::error::{Error, Result};
use crate::metrics::StepStat;
use crate::model::{BlockGrads, Graph, Residency};
use crate::params::Chunks;
use crate::pipeline::execute::PipeStat;
use crate::run::{Context, Finish, Observer};
use crate::strategy::Strategy;
use crate::trace::{self, Trace};

/// Runs steps `first..steps` of `strategy` on this rank (`losses`: the global losses of the
/// steps before `first`, rank 0), then its [`finish`](Strategy::finish). Checkpoints go
/// through `saver` (`None`: the run writes none from this loop).
pub(crate) fn run(
    cx: &Context,
    strategy: &mut dyn Strategy,
    (first, losses): (u64, Vec<(u64, f64)>),
    mut saver: Option<Saver>,
    trace: &mut Trace,
    observer: &mut dyn Observer,
) -> Result<Finish> {
    // The peak memory reported is that of the steps, not of building the model and the
    // strategy.
    crate::metrics::reset_peak_rss();
    let mut grads = strategy.gradient_buffer();
    let mut done = Finish { losses, ..Finish::default() };
    for step in first..cx.config.steps {
        let t0 = Instant::now();
        let begun = strategy.begin_step(cx, step, trace)?;
        let (index, workers) = begun.worker;
        let (share, norm) = trace.span(|| "data".into(), || cx.share(step, index, workers));
        grads.zero();
        let (local, pipe) = gradients(cx, strategy, &mut grads, &share, norm, trace)?;
        let reduced = strategy.reduce(cx, &mut grads, local, trace)?;
        let loss = reduced.loss.map(|l| cx.finish_step(l)).transpose()?;
        trace.span(|| "optimizer".into(), || strategy.optimizer_step(cx, &grads))?;
        let stat = StepStat {
            step,
            seconds: t0.elapsed().as_secs_f64(),
            wait: (begun.wait + reduced.wait).as_secs_f64(),
            version: begun.version,
            sent: strategy.traffic(cx, trace),
            pipe: pipe.as_ref().map(|p| [p.busy, trace::unix_us(p.start), trace::unix_us(p.end)]),
        };
        if let Some(p) = pipe {
            done.timeline = p.timeline;
        }
        observer.step(&stat);
        done.steps.push(stat);
        if step + 1 == cx.config.steps {
            done.peak_rss = crate::metrics::peak_rss_bytes();
        }
        for (step, loss) in loss.map(|l| (step, l)).into_iter().chain(strategy.arrived()) {
            record(cx, &mut done.losses, step, loss, observer);
        }
        if cx.checkpoint_due(step + 1)
            && let Some(snapshot) = strategy.snapshot(cx, step + 1, &done.losses)?
        {
            trace.span(|| "checkpoint".into(), || cx.submit(&mut saver, snapshot))?;
        }
    }
    if let Some(s) = &mut saver {
        s.wait()?;
    }
    let end = strategy.finish(cx, trace)?;
    Ok(Finish { params: end.params, held: end.held, role: end.role, ..done })
}

/// Keeps the global `loss` of `step` on rank 0 and tells `observer`.
pub(crate) fn record(
    cx: &Context,
    losses: &mut Vec<(u64, f64)>,
    step: u64,
    loss: f64,
    observer: &mut dyn Observer,
) {
    if cx.mesh.world().rank() == 0 {
        losses.push((step, loss));
        observer.loss(step, loss, cx.started.elapsed().as_secs_f64());
    }
}

/// Accumulates into `grads` the gradient of this worker's part of the global mean loss over
/// its `share` (`norm`: counted tokens of the global batch), cut into micro-batches, telling
/// `strategy` as blocks run and finish. Returns this worker's part of the loss and, in a
/// pipeline, what its schedule did (the loss is then known on the last stage only).
fn gradients(
    cx: &Context,
    strategy: &mut dyn Strategy,
    grads: &mut Chunks,
    share: &Batch,
    norm: f64,
    trace: &mut Trace,
) -> Result<(f64, Option<PipeStat>)> {
    if let Some(p) = cx.pipeline {
        if strategy.releases_params() {
            return Err(Error::internal("a pipeline stage keeps its parameters"));
        }
        let mut failed = None;
        let (loss, stat) = p.run(cx.model, share, norm, grads, trace, |k, g| {
            if let Err(e) = strategy.block_done(k, g, true) {
                failed.get_or_insert(e);
            }
        })?;
        return match failed {
            Some(e) => Err(e),
            None => Ok((loss, Some(stat))),
        };
    }
    let graph = if strategy.recomputes() { Graph::Recompute } else { Graph::Blockwise };
    let micro: Vec<_> = shares(share.rows, cx.config.accum).into_iter().filter(|r| !r.is_empty()).collect();
    let mut hooks = Hooks { cx, strategy, grads, last: false };
    let mut loss_sum = 0.0;
    for (i, rows) in micro.iter().enumerate() {
        hooks.last = i + 1 == micro.len();
        let (ids, targets, mask) = share.rows(rows.clone()).tensors()?;
        let fwd = cx.model.forward_with(&ids, graph, trace, &mut hooks)?;
        let loss = trace.span(|| "loss".into(), || cx.model.loss(fwd.logits(), &targets, &mask, norm))?;
        loss_sum += f64::from(loss.to_scalar::<f32>()?);
        cx.model.backward_with(fwd, &loss, trace, &mut hooks, Hooks::block_done)?;
    }
    Ok((loss_sum, None))
}

/// The strategy's block hooks as the model sees them during one micro-batch.
struct Hooks<'a, 's> {
    cx: &'a Context<'a>,
    strategy: &'s mut dyn Strategy,
    grads: &'s mut Chunks,
    /// The step's last micro-batch.
    last: bool,
}

impl Hooks<'_, '_> {
    /// Block `k`'s backward gave `g`: added into the gradients, then the strategy told.
    fn block_done(&mut self, k: usize, g: BlockGrads) -> Result<()> {
        self.grads.add_grads(self.cx.model.params(), &g)?;
        self.strategy.block_done(k, self.grads, self.last)
    }
}

impl Residency for Hooks<'_, '_> {
    fn fetch(&mut self, k: usize, next: Option<usize>) -> Result<()> {
        self.strategy.before_block(k, next)
    }

    fn evict(&mut self, k: usize) -> Result<()> {
        self.strategy.after_block(k)
    }
}
