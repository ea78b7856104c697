//! The training run, one place for what every strategy shares: where it starts (fresh or
//! from a checkpoint), the `Context` the loop and the strategies read (the global batch and
//! this worker's share of it, checkpoints, per-step communication volume, the pipeline's
//! end of a step), and how it ends (evaluation, reports gathered to rank 0). The loop itself
//! is `train_loop`, the strategies' seam `strategy`;
//! [`crate::trainer::train`] composes the mesh, the model and a strategy.

use std::time::Instant;

use serde_json::Value;

use std::ops::Range;

use crate::checkpoint::{self, Loaded, Source};
use crate::config::{CheckpointConfig, TrainConfig};
use crate::data::{Batch, Task, shares};
use crate::dcp::{Reader, Saver, Snapshot};
use crate::error::{Error, Result, agree_all};
use crate::mesh::Mesh;
use crate::metrics::{PipelineFacts, RankReport, StepStat, Summary, bus_bytes, gather_reports};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::params::Chunks;
use crate::pipeline::execute::Pipeline;
use crate::trace::{self, Trace};

/// What a rank sees of a run as it goes; the default methods ignore it.
pub trait Observer {
    /// Training starts (or resumes) at step `first`.
    fn start(&mut self, _first: u64) {}
    /// A step this rank worked on is done.
    fn step(&mut self, _stat: &StepStat) {}
    /// The global mean loss of `step` is known (rank 0 only), `seconds` into training.
    fn loss(&mut self, _step: u64, _loss: f64, _seconds: f64) {}
}

/// An observer that ignores everything.
impl Observer for () {}

/// How a run ended, on one rank.
#[derive(Debug)]
pub struct Outcome {
    /// The final parameters, full (gathered over the tensor-parallel group) and flat in
    /// [`ParamSet`](crate::params::ParamSet) order: identical on every rank, and laid out
    /// as a single-process run's.
    pub params: Vec<f32>,
    /// This rank's steps.
    pub steps: Vec<StepStat>,
    /// Rank 0: the run's summary.
    pub summary: Option<Summary>,
    /// Rank 0 with tracing on: the Chrome trace of every rank.
    pub trace: Option<Value>,
}

/// Where a run starts: this rank's parameters, optimiser state and loss history.
pub(crate) struct Start {
    pub step: u64,
    pub params: Vec<f32>,
    pub optimizer: Optimizer,
    pub losses: Vec<(u64, f64)>,
}

/// What the loop (or a parameter server's serve loop) hands back (this rank's parameters).
#[derive(Default)]
pub(crate) struct Finish {
    /// Peak resident memory after the last step, before its checkpoint.
    pub peak_rss: u64,
    /// Pipeline: the forwards and backwards of the last step.
    pub timeline: Vec<(String, Instant, Instant)>,
    pub params: Vec<f32>,
    /// This rank's steps.
    pub steps: Vec<StepStat>,
    /// `(step, global loss)` (rank 0).
    pub losses: Vec<(u64, f64)>,
    pub role: &'static str,
    /// Bytes held between steps for parameters, gradients and optimiser state.
    pub held: [u64; 3],
}

/// The pieces the training loop and every strategy use.
pub(crate) struct Context<'a> {
    pub mesh: &'a Mesh,
    pub config: &'a TrainConfig,
    pub task: &'a dyn Task,
    pub model: &'a Model,
    /// This rank's pipeline stage, when the model is cut into stages.
    pub pipeline: Option<&'a Pipeline>,
    pub fingerprint: String,
    pub started: Instant,
}

impl Context<'_> {
    /// The operations this rank's tensor-parallel, data-parallel and pipeline groups ran
    /// since the last call, moved into `trace`: returns the bytes each sent ([`bus_bytes`]).
    /// The loop calls it once per step, after the optimiser step, before checkpointing.
    pub fn step_comm(&self, trace: &mut Trace) -> [u64; 3] {
        let mut sent = [0; 3];
        let groups = [("comm tp", self.mesh.tp()), ("comm dp", self.mesh.dp()), ("comm pp", self.mesh.pp())];
        for (s, (label, c)) in sent.iter_mut().zip(groups) {
            let ops = c.take_timeline();
            *s = bus_bytes(c.size(), &ops);
            trace.add_ops(label, ops);
        }
        sent
    }

    /// Whether to checkpoint once `done` steps are done.
    pub fn checkpoint_due(&self, done: u64) -> bool {
        self.config
            .checkpoint
            .as_ref()
            .is_some_and(|c| done == self.config.steps || (c.every > 0 && done.is_multiple_of(c.every)))
    }

    /// A writer of checkpoints in the background on its own communicator, when the run
    /// checkpoints (collective over the world).
    pub fn saver(&self) -> Result<Option<Saver>> {
        match &self.config.checkpoint {
            Some(_) => Ok(Some(Saver::new(self.mesh.world_for_background()?))),
            None => Ok(None),
        }
    }

    /// Hands `snapshot` to `saver` (it waits for the previous checkpoint first, and reports
    /// its failure).
    pub fn submit(&self, saver: &mut Option<Saver>, snapshot: Snapshot) -> Result<()> {
        match (saver, &self.config.checkpoint) {
            (Some(s), Some(c)) => s.submit(&c.path, snapshot),
            _ => Ok(()),
        }
    }

    /// What this rank contributes to a checkpoint after `step` steps: the pieces `parts`
    /// (`(slot, elements of the slot)`, see [`checkpoint::snapshot`]) of the parameters and
    /// optimiser state, their values copied now from `values`.
    pub fn snapshot(
        &self,
        step: u64,
        parts: &[(usize, Range<usize>)],
        values: impl FnMut(Source, Range<usize>) -> Result<Vec<f32>>,
        optimizer_steps: u64,
        losses: &[(u64, f64)],
    ) -> Result<Snapshot> {
        let mesh = format!("{} on {}", self.config.strategy, self.mesh);
        let run = self.config.checkpoint.as_ref().and_then(|c| c.run.as_deref());
        let extra = checkpoint::extra(&self.fingerprint, losses, optimizer_steps, &mesh, run);
        checkpoint::snapshot(self.model.params(), &self.config.optim, parts, values, step, extra)
    }

    /// The full flat vector of this replica's pieces `local`, on every rank of the replica.
    fn gather_full(&self, local: &[f32]) -> Result<Vec<f32>> {
        let mut full = self.model.tp().gather_full(self.model.params(), local)?;
        let pp = self.mesh.pp();
        if pp.size() > 1 {
            pp.all_reduce(&mut full, xccl::ReduceOp::Sum)?;
        }
        Ok(full)
    }

    /// Sums the gradients of the parameters that two pipeline stages hold (a tied
    /// embedding) between those stages, in place in this rank's full local `grads`; nothing
    /// without a pipeline. A sum, so a strategy calls it either after its data-parallel
    /// reduction (DDP) or on its local gradients before reducing them (ZeRO, whose reduced
    /// gradients are sliced differently on the two stages); collective over the pairs of
    /// stages that share a parameter.
    pub fn sum_shared(&self, grads: &mut Chunks) -> Result<()> {
        match self.pipeline {
            Some(p) => p.sum_shared(grads),
            None => Ok(()),
        }
    }

    /// The end of a step's reduction, the same for every strategy: `loss` is the step's
    /// loss summed over the data-parallel group (what [`Reduced::loss`] holds: in a pipeline
    /// non-zero on the last stage only); returns the global loss, on every rank (summed
    /// over the pipeline group). The loop calls it once per step, after
    /// [`Strategy::reduce`] and before the optimiser step, on every rank of the loop.
    ///
    /// [`Reduced::loss`]: crate::strategy::Reduced::loss
    /// [`Strategy::reduce`]: crate::strategy::Strategy::reduce
    pub fn finish_step(&self, loss: f64) -> Result<f64> {
        match self.pipeline {
            Some(p) => p.total_loss(loss),
            None => Ok(loss),
        }
    }

    /// The global batch of `step` and this worker's share of it (worker `index` of `workers`).
    pub fn share(&self, step: u64, index: usize, workers: usize) -> (Batch, f64) {
        let global = self.task.batch(self.config.seed, step, self.config.batch);
        let norm = global.counted() as f64;
        (global.rows(shares(self.config.batch, workers)[index].clone()), norm)
    }
}

/// Where this rank starts. Fresh: its parameters as built (exact pieces of the unsharded
/// model's), broadcast over the data-parallel group from its first rank anyway. Resuming:
/// every rank reads the pieces of the checkpoint its own parameters and optimiser state
/// are made of, whatever the mesh that wrote it; if any rank cannot, every rank fails with
/// its reason.
pub(crate) fn start(cx: &Context) -> Result<Start> {
    let world = cx.mesh.world();
    let optim = cx.config.optim;
    let set = cx.model.params();
    let Some(c) = cx.config.checkpoint.as_ref().filter(|c| c.resume) else {
        let mut params = set.read()?;
        cx.mesh.dp().broadcast(&mut params, 0)?;
        let optimizer = Optimizer::new(optim, set.len());
        return Ok(Start { step: 0, params, optimizer, losses: Vec::new() });
    };
    let loaded = agree_all(world, "read the checkpoint", load(cx, c))?;
    let optimizer = Optimizer::restore(optim, loaded.optimizer_steps, loaded.state)?;
    Ok(Start { step: loaded.step, params: loaded.params, optimizer, losses: loaded.losses })
}

/// Reads this rank's part of the checkpoint to resume from and checks that it belongs to
/// this run (an imported checkpoint, which has no fingerprint, starts any run).
pub(crate) fn load(cx: &Context, c: &CheckpointConfig) -> Result<Loaded> {
    let reader = Reader::open(&c.path)?;
    let loaded = checkpoint::load(&reader, cx.model.params(), &cx.config.optim)?;
    if let Some(fp) = loaded.fingerprint.as_ref().filter(|fp| **fp != cx.fingerprint) {
        return Err(Error::Checkpoint {
            path: c.path.clone(),
            msg: format!(
                "it was written by a different configuration:\n  checkpoint: {fp}\n  this run:   {}\n\
                 resume with the same settings, or start over without --resume",
                cx.fingerprint
            ),
        });
    }
    if loaded.step > cx.config.steps {
        return Err(Error::config(format!(
            "the checkpoint is at step {}, beyond --steps {}: ask for more steps",
            loaded.step, cx.config.steps
        )));
    }
    Ok(loaded)
}

/// Ends the run on this rank: the final parameters (this rank's `finish.params`) gathered
/// to full tensors, evaluation on the tensor-parallel group of rank 0, every rank's report
/// gathered to rank 0, which builds the summary and the trace.
pub(crate) fn end(cx: &Context, finish: Finish, mut trace: Trace, wall: f64) -> Result<Outcome> {
    let (mesh, config, model) = (cx.mesh, cx.config, cx.model);
    let world = mesh.world();
    model.params().write(&finish.params)?;
    let full = cx.gather_full(&finish.params)?;
    let evaluation = match (config.evaluate, &config.pipeline) {
        (false, _) => None,
        // Rank 0 evaluates the whole model, put together from every stage's blocks.
        (true, Some(_)) if world.rank() == 0 => {
            let whole = Model::new(&config.model, config.seed)?;
            whole.params().write(&full)?;
            Some(trace.span(|| "evaluate".into(), || cx.task.evaluate(&whole))?)
        }
        (true, Some(_)) => None,
        (true, None) if mesh.dp().rank() == 0 => {
            let e = trace.span(|| "evaluate".into(), || cx.task.evaluate(model))?;
            (world.rank() == 0).then_some(e)
        }
        (true, None) => None,
    };
    let groups =
        [("comm tp", mesh.tp()), ("comm dp", mesh.dp()), ("comm pp", mesh.pp()), ("comm world", world)];
    for (label, c) in groups {
        trace.add_ops(label, c.take_timeline());
    }
    let report = RankReport {
        rank: world.rank(),
        role: finish.role.to_string(),
        steps: finish.steps.clone(),
        spans: trace.take(),
        params_held: model.params().len(),
        peak_rss_bytes: finish.peak_rss,
        held_bytes: finish.held,
        timeline: finish
            .timeline
            .iter()
            .map(|(n, a, b)| (n.clone(), trace::unix_us(*a), (*b - *a).as_secs_f64() * 1e6))
            .collect(),
    };
    let reports = gather_reports(world, &report)?;
    let (summary, chrome) = match reports {
        None => (None, None),
        Some(reports) => {
            let tokens = config.batch * cx.task.seq_len();
            let mut s = Summary::new(
                world.size(),
                format!("{} on {}", config.strategy, mesh),
                model.params().full_len(),
                finish.losses,
                tokens,
                wall,
                &reports,
            );
            s.evaluation = evaluation;
            s.flops_per_step =
                crate::model::flops::train_flops_per_step(&config.model, config.batch, cx.task.seq_len());
            if let (Some(p), Some(pl)) = (&config.pipeline, cx.pipeline) {
                // The first pipeline: world ranks of stage k at dp 0, tp 0 are k · dp · tp.
                let per_stage = world.size() / p.stages;
                let lanes: Vec<usize> = (0..p.stages).map(|k| k * per_stage).collect();
                let (bubble, timeline) = PipelineFacts::measure(&reports, &lanes);
                s.pipeline = Some(PipelineFacts {
                    schedule: p.schedule.to_string(),
                    stages: p.stages,
                    micro_batches: config.accum,
                    virtual_stages: p.virtual_stages,
                    recompute: p.recompute,
                    bubble_schedule: pl.schedule().closed_form_bubble(),
                    bubble_measured: bubble,
                    timeline,
                });
            }
            let spans: Vec<_> = reports.into_iter().map(|r| r.spans).collect();
            (Some(s), config.trace.then(|| trace::chrome_json(&spans)))
        }
    };
    Ok(Outcome { params: full, steps: finish.steps, summary, trace: chrome })
}
