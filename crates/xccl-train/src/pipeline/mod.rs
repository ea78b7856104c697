//! Pipeline parallelism: the model cut between blocks into stages, the mini-batch into
//! micro-batches, so that stages work at the same time.
//!
//! - [`schedule`]: a schedule is plain data, per pipeline rank the ordered list of its
//!   actions (forward or backward of micro-batch `j` on chunk `c`, the backward whole or split
//!   into its input and weight gradients, sends and receives of activations and gradients,
//!   the optimiser step): GPipe, 1F1B, interleaved 1F1B, ZB-H1 and ZB-V.
//! - [`placement`]: which rank holds which global stage (looped, or ZB-V's V).
//! - `zero_bubble`, `zero_bubble_v` (private): ZB-H1's and ZB-V's passes per rank and their
//!   closed-form bubbles.
//! - [`check`]: proves a schedule free of deadlock, its sends and receives matched, every
//!   backward after its forward, the activations held within the schedule's bound, and its
//!   bubble equal to the closed form (`xccl verify` runs it over every shape).
//! - [`violation`]: what the checker reports: a schedule's figures, or what is wrong with it.
//! - [`stages`]: which blocks each stage (or chunk) holds.
//! - [`execute`]: runs a schedule on one rank's part of the model.
//!
//! [`build`] puts a rank's stage together; data parallelism ([`crate::ddp`]) then reduces
//! each stage's gradients over its data-parallel group as it would a whole model's, and
//! tensor parallelism works inside the stage's blocks.

pub mod check;
pub mod execute;
pub mod placement;
pub mod schedule;
pub mod stages;
pub mod violation;
mod zero_bubble;
mod zero_bubble_v;

use std::time::Instant;

use xccl::Communicator;

use crate::data::Task;
use crate::error::{Result, agree_with_root};
use crate::mesh::{Axis, Mesh};
use crate::model::ModelConfig;
use crate::model::{Graph, Model};
use crate::tp::Tp;
use crate::trace::Trace;
use execute::Pipeline;
use stages::{Balance, PipelineConfig};

/// What [`build`] needs of a training run (`TrainConfig::stage_run`).
#[derive(Clone, Copy, Debug)]
pub struct StageRun<'a> {
    /// The whole model.
    pub model: &'a ModelConfig,
    /// The seed of its parameters (and of the batch that times its blocks).
    pub seed: u64,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Rows of one micro-batch on one data-parallel rank.
    pub rows: usize,
}

/// This rank's stage of the pipeline `p` of `run` on `mesh`: its part of the model (built
/// for tensor-parallel group `tp`) and the pipeline that runs it. Collective over the world
/// (measuring block times with [`Balance::Time`], the groups of shared parameters).
pub fn build(
    mesh: &Mesh,
    run: &StageRun<'_>,
    p: &PipelineConfig,
    tp: &Tp,
    task: &dyn Task,
) -> Result<(Model, Pipeline)> {
    let schedule = schedule::Schedule::new(p.schedule, p.shape(run.micro_batches))?;
    let costs = match p.balance {
        _ if !stages::needs_costs(p) => Vec::new(),
        Balance::Params => param_counts(run.model, run.seed)?,
        Balance::Time => block_times(mesh.world(), run, task)?,
        Balance::Blocks(_) => Vec::new(),
    };
    let cut = stages::cut(run.model, p, &costs)?;
    let keep: Vec<usize> = schedule.chunks_of(&cut, mesh.coord(Axis::Pp)).into_iter().flatten().collect();
    let model = Model::part(run.model, run.seed, tp, Some(&keep))?;
    let pipeline = Pipeline::new(mesh, schedule, &model, &cut, p.recompute)?;
    Ok((model, pipeline))
}

/// The parameter count of every block of the model (each block built and dropped in turn).
fn param_counts(model: &ModelConfig, seed: u64) -> Result<Vec<f64>> {
    let none = Model::part(model, seed, &Tp::none(), Some(&[]))?;
    let mut counts = vec![0.0; stages::blocks(model)];
    for e in none.params().layout().entries() {
        if let Some(c) = counts.get_mut(e.block) {
            *c += e.range().len() as f64;
        }
    }
    Ok(counts)
}

/// The forward + backward time of every block on a micro-batch of `rows` rows, measured on
/// world rank 0 (three passes, the first left out) and broadcast, so every rank cuts alike.
fn block_times(world: &Communicator, run: &StageRun<'_>, task: &dyn Task) -> Result<Vec<f64>> {
    let n = stages::blocks(run.model);
    let attempt = (world.rank() == 0).then(|| measure(run, task, n));
    let mut times =
        agree_with_root(world, "measure the blocks' times", attempt)?.unwrap_or_else(|| vec![0.0; n]);
    world.broadcast(&mut times, 0)?;
    Ok(times)
}

fn measure(run: &StageRun<'_>, task: &dyn Task, n: usize) -> Result<Vec<f64>> {
    let model = Model::new(run.model, run.seed)?;
    let batch = task.batch(run.seed, 0, run.rows);
    let norm = batch.counted().max(1) as f64;
    let (ids, targets, mask) = batch.tensors()?;
    let names: Vec<String> = model.blocks().iter().map(|b| b.name().to_string()).collect();
    let mut times = vec![0.0; n];
    for pass in 0..3 {
        let mut trace = Trace::new("measure", true);
        let t0 = Instant::now();
        let fwd = model.forward(&ids, Graph::Blockwise, &mut trace)?;
        let loss = model.loss(fwd.logits(), &targets, &mask, norm)?;
        model.backward(fwd, &loss, &mut trace, |_, _| Ok(()))?;
        if pass == 0 {
            continue;
        }
        for s in trace.spans() {
            let block = s.name.split_once(' ').map(|(_, b)| b);
            if let Some(k) = block.and_then(|b| names.iter().position(|x| x == b)) {
                times[k] += s.dur_us;
            }
        }
        // The loss belongs to the last block.
        times[n - 1] +=
            t0.elapsed().as_secs_f64() * 1e6 - trace.spans().iter().map(|s| s.dur_us).sum::<f64>();
    }
    Ok(times)
}
