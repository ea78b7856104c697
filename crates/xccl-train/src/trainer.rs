//! The training loop shared by the strategies: configuration, the start (fresh or from a
//! checkpoint, parameters broadcast from rank 0), each worker's gradient computation over
//! its share of the global batch, and the end (evaluation, reports gathered to rank 0).

use std::path::PathBuf;
use std::time::Instant;

use serde_json::Value;
use xccl::Communicator;

use crate::checkpoint::{self, Checkpoint};
use crate::data::{Batch, Task, TaskConfig, shares};
use crate::ddp::{Ddp, DdpConfig};
use crate::error::{Error, Result};
use crate::metrics::{RankReport, StepStat, Summary, gather_reports};
use crate::model::{self, Graph, Model, ModelConfig};
use crate::optim::{OptimConfig, Optimizer};
use crate::params::Chunks;
use crate::ps::{self, PsConfig};
use crate::trace::{self, Kind, Trace};

/// How the data-parallel ranks share the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Every rank holds the parameters; gradients are all-reduced in buckets ([`crate::ddp`]).
    Ddp(DdpConfig),
    /// Server ranks hold the parameters; workers push gradients and pull parameters
    /// ([`crate::ps`]).
    Ps(PsConfig),
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Strategy::Ddp(d) => write!(
                f,
                "DDP (buckets of {} KiB, first {} KiB)",
                d.bucket_bytes >> 10,
                d.first_bucket_bytes >> 10
            ),
            Strategy::Ps(p) => {
                let kind = if p.staleness == 0 {
                    "synchronous".into()
                } else {
                    format!("staleness {}", p.staleness)
                };
                let dedicated = if p.dedicated { "dedicated" } else { "also workers" };
                write!(f, "parameter server ({kind}, {} server(s), {dedicated})", p.servers)
            }
        }
    }
}

/// Where and how often to checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// The checkpoint file (see [`checkpoint::FILE_NAME`]).
    pub path: PathBuf,
    /// Write one every this many steps (0: only at the end); always at the end.
    pub every: u64,
    /// Continue from the file instead of starting fresh.
    pub resume: bool,
}

/// A training run.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// The model (its vocabulary must be the task's).
    pub model: ModelConfig,
    /// The data.
    pub task: TaskConfig,
    /// The optimiser.
    pub optim: OptimConfig,
    /// How ranks share the work.
    pub strategy: Strategy,
    /// Rows (sequences) per global step, over all ranks and micro-batches.
    pub batch: usize,
    /// Micro-batches each worker cuts its share into (gradient accumulation).
    pub accum: usize,
    /// Steps to train to (a resumed run continues up to this step).
    pub steps: u64,
    /// Seed of the parameters and of every batch.
    pub seed: u64,
    /// Checkpointing, if any.
    pub checkpoint: Option<CheckpointConfig>,
    /// Record a trace of compute and communication.
    pub trace: bool,
    /// Evaluate the final parameters on held-out data (rank 0).
    pub evaluate: bool,
}

impl TrainConfig {
    /// Checks the settings against each other and against the task.
    pub fn validate(&self, task: &dyn Task) -> Result<()> {
        if self.model.vocab != task.vocab() {
            return Err(Error::config(format!(
                "the model's vocabulary ({}) is not the data's ({})",
                self.model.vocab,
                task.vocab()
            )));
        }
        if task.seq_len() > self.model.context {
            return Err(Error::config(format!(
                "rows of this data have {} tokens but --context is {}: raise --context",
                task.seq_len(),
                self.model.context
            )));
        }
        if self.batch == 0 || self.accum == 0 {
            return Err(Error::config("--batch and --accum must be at least 1"));
        }
        self.optim.validate()
    }

    /// Everything that determines the trajectory of the parameters (not the number of
    /// ranks, the strategy or the accumulation, which training is equivalent under).
    pub fn fingerprint(&self, task: &dyn Task) -> String {
        format!(
            "model: {}; data: {}; optimizer: {}; batch: {}; seed: {}",
            self.model,
            task.describe(),
            self.optim,
            self.batch,
            self.seed
        )
    }
}

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
    /// The final parameters, flat (identical on every rank).
    pub params: Vec<f32>,
    /// This rank's steps.
    pub steps: Vec<StepStat>,
    /// Rank 0: the run's summary.
    pub summary: Option<Summary>,
    /// Rank 0 with tracing on: the Chrome trace of every rank.
    pub trace: Option<Value>,
}

/// Where a run starts: parameters, optimiser state and loss history (on every rank).
pub(crate) struct Start {
    pub step: u64,
    pub params: Vec<f32>,
    pub optimizer: Optimizer,
    pub losses: Vec<(u64, f64)>,
}

/// What a strategy's loop hands back.
pub(crate) struct Finish {
    pub params: Vec<f32>,
    pub steps: Vec<StepStat>,
    pub losses: Vec<(u64, f64)>,
    pub role: &'static str,
}

/// The pieces every strategy's loop uses.
pub(crate) struct Context<'a> {
    pub world: &'a Communicator,
    pub config: &'a TrainConfig,
    pub task: &'a dyn Task,
    pub model: &'a Model,
    pub fingerprint: String,
    pub started: Instant,
}

impl Context<'_> {
    /// Whether to checkpoint once `done` steps are done.
    pub fn checkpoint_due(&self, done: u64) -> bool {
        self.config
            .checkpoint
            .as_ref()
            .is_some_and(|c| done == self.config.steps || (c.every > 0 && done.is_multiple_of(c.every)))
    }

    /// Writes a checkpoint (rank 0's job).
    pub fn save(
        &self,
        step: u64,
        params: Vec<f32>,
        state: Vec<Vec<f32>>,
        losses: &[(u64, f64)],
    ) -> Result<()> {
        let Some(c) = &self.config.checkpoint else { return Ok(()) };
        let ck = Checkpoint {
            step,
            fingerprint: self.fingerprint.clone(),
            params,
            state,
            losses: losses.to_vec(),
        };
        checkpoint::save(&c.path, self.model.params(), &self.config.optim, &ck)
    }

    /// The global batch of `step` and this worker's share of it (worker `index` of `workers`).
    pub fn share(&self, step: u64, index: usize, workers: usize) -> (Batch, f64) {
        let global = self.task.batch(self.config.seed, step, self.config.batch);
        let norm = global.counted() as f64;
        (global.rows(shares(self.config.batch, workers)[index].clone()), norm)
    }

    /// Accumulates into `grads` the gradient of this worker's part of the global mean loss
    /// over its `share`, cut into micro-batches; `last_block_done(k, grads)` is called when
    /// the backward of the last non-empty micro-batch has finished block `k`. Returns this
    /// worker's part of the loss.
    pub fn gradients(
        &self,
        share: &Batch,
        norm: f64,
        grads: &mut Chunks,
        trace: &mut Trace,
        mut last_block_done: impl FnMut(usize, &mut Chunks),
    ) -> Result<f64> {
        let micro: Vec<_> =
            shares(share.rows, self.config.accum).into_iter().filter(|r| !r.is_empty()).collect();
        let mut loss_sum = 0.0;
        for (i, rows) in micro.iter().enumerate() {
            let last = i + 1 == micro.len();
            let (ids, targets, mask) = share.rows(rows.clone()).tensors()?;
            let fwd = self.model.forward(&ids, Graph::Blockwise, trace)?;
            let loss = trace.span(|| "loss".into(), || model::loss(fwd.logits(), &targets, &mask, norm))?;
            loss_sum += f64::from(loss.to_scalar::<f32>()?);
            self.model.backward(fwd, &loss, trace, |k, g| {
                grads.add_grads(self.model.params(), &g)?;
                if last {
                    last_block_done(k, grads);
                }
                Ok(())
            })?;
        }
        Ok(loss_sum)
    }
}

/// Trains as one rank of `world` (every rank calls this with the same configuration),
/// telling `observer` how it goes. Returns the final parameters on every rank; rank 0 also
/// gets the summary and, with tracing on, the trace of every rank.
pub fn train(world: &Communicator, config: &TrainConfig, observer: &mut dyn Observer) -> Result<Outcome> {
    let task = config.task.load()?;
    config.validate(task.as_ref())?;
    let model = Model::new(&config.model, config.seed)?;
    world.record_timeline(config.trace);
    let mut trace = Trace::new("compute", config.trace);
    let mut cx = Context {
        world,
        config,
        task: task.as_ref(),
        model: &model,
        fingerprint: config.fingerprint(task.as_ref()),
        started: Instant::now(),
    };
    let start = start(&cx)?;
    model.params().write(&start.params)?;
    observer.start(start.step);
    cx.started = Instant::now();
    let finish = match config.strategy {
        Strategy::Ddp(d) => run_ddp(&cx, d, start, &mut trace, observer)?,
        Strategy::Ps(p) => ps::run(&cx, p, start, &mut trace, observer)?,
    };
    let wall = cx.started.elapsed().as_secs_f64();
    model.params().write(&finish.params)?;
    let evaluation = if config.evaluate && world.rank() == 0 {
        Some(trace.span(|| "evaluate".into(), || task.evaluate(&model))?)
    } else {
        None
    };
    trace.add_ops("comm world", world.take_timeline());
    let report = RankReport {
        rank: world.rank(),
        role: finish.role.to_string(),
        steps: finish.steps.clone(),
        spans: trace.take(),
    };
    let reports = gather_reports(world, &report)?;
    let (summary, chrome) = match reports {
        None => (None, None),
        Some(reports) => {
            let tokens = config.batch * task.seq_len();
            let mut s = Summary::new(
                world.size(),
                config.strategy.to_string(),
                model.params().len(),
                finish.losses,
                tokens,
                wall,
                &reports,
            );
            s.evaluation = evaluation;
            let spans: Vec<_> = reports.into_iter().map(|r| r.spans).collect();
            (Some(s), config.trace.then(|| trace::chrome_json(&spans)))
        }
    };
    Ok(Outcome { params: finish.params, steps: finish.steps, summary, trace: chrome })
}

/// Rank 0 loads the checkpoint (when resuming) or takes the fresh parameters, then
/// broadcasts the step, parameters and optimiser state to everyone.
fn start(cx: &Context) -> Result<Start> {
    let world = cx.world;
    let optim = cx.config.optim;
    let set = cx.model.params();
    let resume = cx.config.checkpoint.as_ref().filter(|c| c.resume);
    let (loaded, failure) = match (world.rank(), resume) {
        (0, Some(c)) => match load(cx, c) {
            Ok(ck) => (Some(ck), None),
            Err(e) => (None, Some(e)),
        },
        _ => (None, None),
    };
    // Everyone learns whether rank 0 could start, so nobody waits for a broadcast that
    // will never come.
    let mut header = [u64::from(failure.is_none()), loaded.as_ref().map_or(0, |c| c.step)];
    world.broadcast(&mut header, 0)?;
    if let Some(e) = failure {
        return Err(e);
    }
    if header[0] == 0 {
        return Err(Error::Thread("rank 0 could not start the run (see its error)".into()));
    }
    let step = header[1];
    let (mut params, mut state, losses) = match loaded {
        Some(ck) => (ck.params, ck.state, ck.losses),
        None => (set.read()?, Optimizer::new(optim, set.len()).state().to_vec(), Vec::new()),
    };
    world.broadcast(&mut params, 0)?;
    if step > 0 {
        for s in &mut state {
            world.broadcast(s, 0)?;
        }
    }
    let optimizer = Optimizer::restore(optim, step, state)?;
    Ok(Start { step, params, optimizer, losses })
}

/// Reads the checkpoint to resume from and checks that it belongs to this run.
fn load(cx: &Context, c: &CheckpointConfig) -> Result<Checkpoint> {
    let ck = checkpoint::load(&c.path, cx.model.params(), &cx.config.optim)?;
    if ck.fingerprint != cx.fingerprint {
        return Err(Error::Checkpoint {
            path: c.path.clone(),
            msg: format!(
                "it was written by a different configuration:\n  checkpoint: {}\n  this run:   {}\n\
                 resume with the same settings, or start over without --resume",
                ck.fingerprint, cx.fingerprint
            ),
        });
    }
    if ck.step > cx.config.steps {
        return Err(Error::config(format!(
            "the checkpoint is at step {}, beyond --steps {}: ask for more steps",
            ck.step, cx.config.steps
        )));
    }
    Ok(ck)
}

/// The DDP loop: every rank is a worker and holds the whole optimiser.
fn run_ddp(
    cx: &Context,
    config: DdpConfig,
    start: Start,
    trace: &mut Trace,
    observer: &mut dyn Observer,
) -> Result<Finish> {
    let world = cx.world;
    let (mut ddp, mut grads) = Ddp::new(world.clone(), cx.model.params(), config)?;
    let Start { step: first, mut params, mut optimizer, mut losses } = start;
    let mut steps = Vec::new();
    for step in first..cx.config.steps {
        let t0 = Instant::now();
        let (share, norm) = trace.span(|| "data".into(), || cx.share(step, world.rank(), world.size()));
        grads.zero();
        let local = cx.gradients(&share, norm, &mut grads, trace, |k, g| ddp.block_done(k, g))?;
        let w0 = Instant::now();
        let (loss, wait) = ddp.finish(&mut grads, local)?;
        trace.record(Kind::Wait, "wait all-reduce".into(), w0, w0 + wait);
        trace.span(
            || "optimizer".into(),
            || optimizer.step(&mut params, &grads).and_then(|()| cx.model.params().write(&params)),
        )?;
        let stat =
            StepStat { step, seconds: t0.elapsed().as_secs_f64(), wait: wait.as_secs_f64(), version: None };
        observer.step(&stat);
        steps.push(stat);
        if world.rank() == 0 {
            losses.push((step, loss));
            observer.loss(step, loss, cx.started.elapsed().as_secs_f64());
            if cx.checkpoint_due(step + 1) {
                trace.span(
                    || "checkpoint".into(),
                    || cx.save(step + 1, params.clone(), optimizer.state().to_vec(), &losses),
                )?;
            }
        }
    }
    Ok(Finish { params, steps, losses, role: "worker" })
}
