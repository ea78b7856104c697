//! The training run, one place for what every strategy shares: where it starts (fresh or
//! from a checkpoint), each worker's gradient computation over its share of the global
//! batch, checkpoints, and how it ends (evaluation, reports gathered to rank 0). A
//! strategy ([`crate::ddp`], [`crate::ps`]) is a loop over steps that uses a [`Context`];
//! [`crate::trainer::train`] composes the mesh, the model and a strategy.

use std::time::Instant;

use serde_json::Value;

use crate::checkpoint::{self, Checkpoint};
use crate::config::{CheckpointConfig, TrainConfig};
use crate::data::{Batch, Task, shares};
use crate::error::{Error, Result, agree_with_root};
use crate::mesh::Mesh;
use crate::metrics::{PipelineFacts, RankReport, StepStat, Summary, bus_bytes, gather_reports};
use crate::model::{Graph, Model, Residency};
use crate::optim::Optimizer;
use crate::params::Chunks;
use crate::pipeline::execute::{PipeStat, Pipeline};
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

/// What a strategy's loop hands back (this rank's parameters).
pub(crate) struct Finish {
    /// Peak resident memory after the last step, before its checkpoint.
    pub peak_rss: u64,
    /// Pipeline: the forwards and backwards of the last step.
    pub timeline: Vec<(String, Instant, Instant)>,
    pub params: Vec<f32>,
    pub steps: Vec<StepStat>,
    pub losses: Vec<(u64, f64)>,
    pub role: &'static str,
    /// Bytes held between steps for parameters, gradients and optimiser state.
    pub held: [u64; 3],
}

/// The pieces every strategy's loop uses.
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
    /// A strategy calls it at the end of each step's communication, before checkpointing.
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

    /// Writes a checkpoint of this rank's `params` and optimiser `state`: the
    /// tensor-parallel group gathers the full tensors and its first rank writes them. Every
    /// rank of the group calls it (in data parallelism, the group of data-parallel rank 0).
    pub fn save(&self, step: u64, params: &[f32], state: &[Vec<f32>], losses: &[(u64, f64)]) -> Result<()> {
        let Some(c) = &self.config.checkpoint else { return Ok(()) };
        let params = self.gather_full_to_first(params)?;
        let state = state.iter().map(|s| self.gather_full_to_first(s)).collect::<Result<Vec<_>>>()?;
        let (Some(params), Some(state)) = (params, state.into_iter().collect::<Option<Vec<_>>>()) else {
            return Ok(());
        };
        let set = self.model.params();
        let ck = Checkpoint {
            step,
            fingerprint: self.fingerprint.clone(),
            params,
            state,
            losses: losses.to_vec(),
        };
        checkpoint::save(&c.path, set, &self.config.optim, &ck)
    }

    /// The full flat vector of this replica's pieces `local` (over the tensor-parallel group,
    /// then the pipeline), onto its first rank: `Some` there, `None` elsewhere. Every rank
    /// of the replica calls it.
    fn gather_full_to_first(&self, local: &[f32]) -> Result<Option<Vec<f32>>> {
        let Some(mut full) = self.model.tp().gather_full_to_first(self.model.params(), local)? else {
            return Ok(None);
        };
        // Each stage filled in its own blocks and left the others zero: their sum is the whole.
        let pp = self.mesh.pp();
        if pp.size() > 1 {
            pp.reduce_in_place(&mut full, xccl::ReduceOp::Sum, 0)?;
        }
        Ok((pp.rank() == 0).then_some(full))
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

    /// After the data-parallel reduction of a step's gradients: the pipeline's shared
    /// parameters' gradients summed between their stages, and the step's `loss` (the
    /// data-parallel sum, known on the last stage) given to every stage.
    pub fn finish_step(&self, grads: &mut Chunks, loss: f64) -> Result<f64> {
        match self.pipeline {
            Some(p) => p.finish_step(grads, loss),
            None => Ok(loss),
        }
    }

    /// The global batch of `step` and this worker's share of it (worker `index` of `workers`).
    pub fn share(&self, step: u64, index: usize, workers: usize) -> (Batch, f64) {
        let global = self.task.batch(self.config.seed, step, self.config.batch);
        let norm = global.counted() as f64;
        (global.rows(shares(self.config.batch, workers)[index].clone()), norm)
    }

    /// Accumulates into `grads` the gradient of this worker's part of the global mean loss
    /// over its `share`, cut into micro-batches; `block_done(k, grads, last)` is called when
    /// the backward of a micro-batch has finished block `k` (and every later one), `last`
    /// on the last non-empty micro-batch (in a pipeline, only then). With `residency`
    /// (ZeRO stage 3) every block's forward runs again in backward ([`Graph::Recompute`])
    /// and `residency` is told when each block needs its parameters. Returns this worker's
    /// part of the loss and, in a pipeline, what its schedule did (the loss is then known
    /// on the last stage only).
    pub fn gradients(
        &self,
        share: &Batch,
        norm: f64,
        grads: &mut Chunks,
        trace: &mut Trace,
        residency: Option<&mut dyn Residency>,
        mut block_done: impl FnMut(usize, &mut Chunks, bool) -> Result<()>,
    ) -> Result<(f64, Option<PipeStat>)> {
        if let Some(p) = self.pipeline {
            if residency.is_some() {
                return Err(Error::internal("a pipeline stage keeps its parameters"));
            }
            let mut failed = None;
            let (loss, stat) = p.run(self.model, share, norm, grads, trace, |k, g| {
                if let Err(e) = block_done(k, g, true) {
                    failed.get_or_insert(e);
                }
            })?;
            return match failed {
                Some(e) => Err(e),
                None => Ok((loss, Some(stat))),
            };
        }
        let (graph, residency) = match residency {
            Some(r) => (Graph::Recompute, r),
            None => (Graph::Blockwise, &mut () as &mut dyn Residency),
        };
        let micro: Vec<_> =
            shares(share.rows, self.config.accum).into_iter().filter(|r| !r.is_empty()).collect();
        let mut loss_sum = 0.0;
        for (i, rows) in micro.iter().enumerate() {
            let last = i + 1 == micro.len();
            let (ids, targets, mask) = share.rows(rows.clone()).tensors()?;
            let fwd = self.model.forward_with(&ids, graph, trace, residency)?;
            let loss =
                trace.span(|| "loss".into(), || self.model.loss(fwd.logits(), &targets, &mask, norm))?;
            loss_sum += f64::from(loss.to_scalar::<f32>()?);
            self.model.backward_with(fwd, &loss, trace, residency, |k, g| {
                grads.add_grads(self.model.params(), &g)?;
                block_done(k, grads, last)
            })?;
        }
        Ok((loss_sum, None))
    }
}

/// Where this rank starts. Fresh: its parameters as built (exact pieces of the unsharded
/// model's), broadcast over the data-parallel group from its first rank anyway. Resuming:
/// rank 0 loads the checkpoint (full tensors) and broadcasts step, parameters and optimiser
/// state to everyone; each rank keeps its pieces, whatever the tensor-parallel size that
/// wrote it.
pub(crate) fn start(cx: &Context) -> Result<Start> {
    let world = cx.mesh.world();
    let optim = cx.config.optim;
    let set = cx.model.params();
    let resume = cx.config.checkpoint.as_ref().filter(|c| c.resume);
    let attempt = match (world.rank(), resume) {
        (0, Some(c)) => Some(load(cx, c)),
        _ => None,
    };
    let loaded = agree_with_root(world, "start the run", attempt)?;
    let mut step = [loaded.as_ref().map_or(0, |c| c.step)];
    world.broadcast(&mut step, 0)?;
    let [step] = step;
    if step == 0 && resume.is_none() {
        let mut params = set.read()?;
        cx.mesh.dp().broadcast(&mut params, 0)?;
        let optimizer = Optimizer::new(optim, set.len());
        return Ok(Start { step, params, optimizer, losses: Vec::new() });
    }
    let (mut params, mut state, losses) = match loaded {
        Some(ck) => (ck.params, ck.state, ck.losses),
        None => (
            vec![0.0; set.full_len()],
            vec![vec![0.0; set.full_len()]; optim.state_names().len()],
            Vec::new(),
        ),
    };
    world.broadcast(&mut params, 0)?;
    for s in &mut state {
        world.broadcast(s, 0)?;
    }
    let state = state.iter().map(|s| set.local_of_full(s)).collect::<Result<Vec<_>>>()?;
    let optimizer = Optimizer::restore(optim, step, state)?;
    Ok(Start { step, params: set.local_of_full(&params)?, optimizer, losses })
}

/// Reads the checkpoint to resume from and checks that it belongs to this run.
pub(crate) fn load(cx: &Context, c: &CheckpointConfig) -> Result<Checkpoint> {
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
