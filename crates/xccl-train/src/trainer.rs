//! [`train`]: a training run composed of its parts. The world becomes a mesh (pipeline ×
//! data-parallel × tensor-parallel, [`crate::mesh`]); the model, or this rank's pipeline
//! stage of it ([`crate::pipeline`]), is built for this rank's tensor-parallel group
//! ([`crate::tp`]); the one training loop (`train_loop`) runs the steps with a
//! data-parallel `Strategy` ([`crate::ddp`], [`crate::zero`], or
//! a parameter server's worker, [`crate::ps`], whose servers serve instead); [`crate::run`]
//! starts and ends it. The strategies never see each other: DDP reduces whatever parameters
//! the model holds, whole, a stage's blocks or tensor-parallel pieces, and a pipeline only
//! replaces how one step's gradients are computed.

use std::time::Instant;

use xccl::Communicator;

pub use crate::config::{CheckpointConfig, Strategy, TrainConfig};
pub use crate::run::{Observer, Outcome};

use crate::ddp::Ddp;
use crate::error::Result;
use crate::mesh::{Axis, Mesh};
use crate::model::Model;
use crate::run::{self, Context};
use crate::tp::Tp;
use crate::trace::Trace;
use crate::zero::Zero;
use crate::{pipeline, ps, train_loop};

/// Trains as one rank of `world` (every rank calls this with the same configuration),
/// telling `observer` how it goes. Returns the final parameters on every rank; rank 0 also
/// gets the summary and, with tracing on, the trace of every rank.
pub fn train(world: &Communicator, config: &TrainConfig, observer: &mut dyn Observer) -> Result<Outcome> {
    // Everything that can be known without communicating is checked first, on every rank.
    let task = config.task.load()?;
    config.validate(task.as_ref())?;
    let dp = config.dp(world.size())?;
    let mesh = Mesh::new(world, &[(Axis::Pp, config.pp()), (Axis::Dp, dp), (Axis::Tp, config.tp)])?;
    let tp = Tp::new(mesh.tp().clone(), config.sp);
    let (model, pipeline) = match &config.pipeline {
        Some(p) => {
            let (model, pipeline) = pipeline::build(&mesh, &config.stage_run(dp), p, &tp, task.as_ref())?;
            (model, Some(pipeline))
        }
        None => (Model::with_tp(&config.model, config.seed, &tp)?, None),
    };
    for c in [mesh.tp(), mesh.dp(), mesh.pp(), world] {
        c.record_timeline(config.trace);
    }
    // In a pipeline, each stage's compute is its own lane of the trace.
    let lane = match &config.pipeline {
        Some(_) => format!("stage {}", mesh.coord(Axis::Pp)),
        None => "compute".to_string(),
    };
    let mut trace = Trace::new(lane, config.trace);
    let mut cx = Context {
        mesh: &mesh,
        config,
        task: task.as_ref(),
        model: &model,
        pipeline: pipeline.as_ref(),
        fingerprint: config.fingerprint(task.as_ref()),
        started: Instant::now(),
    };
    let start = run::start(&cx)?;
    model.params().write(&start.params)?;
    let from = (start.step, start.losses.clone());
    observer.start(start.step);
    cx.started = Instant::now();
    // A strategy is made from where the run starts before the steps begin (ZeRO keeps only
    // its slices of it; stage 3 frees the parameters).
    let finish = match config.strategy {
        Strategy::Ddp(d) => {
            train_loop::run(&cx, &mut Ddp::new(&cx, d, start)?, from, cx.saver()?, &mut trace, observer)?
        }
        Strategy::Zero(z) => {
            train_loop::run(&cx, &mut Zero::new(&cx, z, start)?, from, cx.saver()?, &mut trace, observer)?
        }
        // Workers run the loop with the parameter server's worker; servers serve.
        Strategy::Ps(p) => ps::run(&cx, p, start, &mut trace, observer)?,
    };
    let wall = cx.started.elapsed().as_secs_f64();
    run::end(&cx, finish, trace, wall)
}
