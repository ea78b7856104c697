//! The settings of a training run, as plain data: [`TrainConfig`] and what it is made of
//! (the data-parallel strategy, the tensor-parallel size, the pipeline, checkpointing).
//! Every module of the run reads them; none of them depends on how a strategy is carried
//! out.

use std::path::PathBuf;

use crate::data::{Task, TaskConfig};
use crate::error::{Error, Result};
use crate::model::{ModelConfig, ModelKind};
use crate::optim::OptimConfig;
use crate::pipeline::StageRun;
use crate::pipeline::schedule::Shape;
pub use crate::pipeline::stages::{Balance, PipelineConfig};

/// Bucket sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdpConfig {
    /// Most bytes of gradient per bucket (PyTorch's default: 25 MiB).
    pub bucket_bytes: usize,
    /// Most bytes in the first bucket, the one launched first (PyTorch's: 1 MiB).
    pub first_bucket_bytes: usize,
}

impl Default for DdpConfig {
    fn default() -> DdpConfig {
        DdpConfig { bucket_bytes: 25 << 20, first_bucket_bytes: 1 << 20 }
    }
}

/// Parameter-server settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PsConfig {
    /// Server ranks (the first `servers` ranks), each holding one shard.
    pub servers: usize,
    /// Servers only serve; otherwise they are workers too.
    pub dedicated: bool,
    /// Staleness bound `s`: a worker at clock `c` needs parameters of version `>= c - s`.
    pub staleness: u64,
}

/// ZeRO (DeepSpeed's Zero Redundancy Optimizer; FSDP in PyTorch): what the data-parallel
/// group partitions instead of replicating ([`crate::zero`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroConfig {
    /// 1: the optimiser state; 2: and the gradients; 3: and the parameters.
    pub stage: u8,
    /// Stage 3: keep only each block's input and run its forward again just before its
    /// backward (less activation memory, one more forward per block). Without it each
    /// block keeps what its backward needs, which holds no parameter, so the gathered
    /// parameters are freed after the forward all the same.
    pub recompute: bool,
}

/// How the data-parallel ranks share the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Every rank holds the parameters; gradients are all-reduced in buckets ([`crate::ddp`]).
    Ddp(DdpConfig),
    /// Every rank holds a shard of the optimiser state (and of the gradients, and of the
    /// parameters, by stage) ([`crate::zero`]).
    Zero(ZeroConfig),
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
            Strategy::Zero(z) => {
                let what = [
                    "optimizer state",
                    "optimizer state and gradients",
                    "optimizer state, gradients and parameters",
                ];
                let what = what.get(usize::from(z.stage.max(1)) - 1).copied().unwrap_or("?");
                write!(f, "ZeRO stage {} ({what} sharded)", z.stage)
            }
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
    /// The checkpoint directory (a [`crate::dcp`] checkpoint; see [`crate::checkpoint::DIR_NAME`]).
    pub path: PathBuf,
    /// Write one every this many steps (0: only at the end); always at the end.
    pub every: u64,
    /// Continue from the file instead of starting fresh.
    pub resume: bool,
    /// The id of the job that writes the checkpoints (kept in their metadata as `run`), so a
    /// restarted attempt of the job can tell its own checkpoints from an earlier job's.
    pub run: Option<String>,
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
    /// How the data-parallel ranks share the work.
    pub strategy: Strategy,
    /// Tensor-parallel size: each group of `tp` consecutive ranks holds one copy of the
    /// model, every large weight split over it; the world has `dp × tp` ranks.
    pub tp: usize,
    /// Sequence parallelism inside each tensor-parallel group.
    pub sp: bool,
    /// Pipeline parallelism (`None`: every rank runs the whole model, micro-batch after
    /// micro-batch).
    pub pipeline: Option<PipelineConfig>,
    /// Rows (sequences) per global step, over all ranks and micro-batches.
    pub batch: usize,
    /// Micro-batches each worker cuts its share into (gradient accumulation; with a
    /// pipeline, the micro-batches the schedule runs).
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
        self.validate_tp(task)?;
        if let Some(p) = &self.pipeline {
            self.validate_pp(p)?;
        }
        if let Strategy::Zero(z) = self.strategy {
            if !(1..=3).contains(&z.stage) {
                return Err(Error::config(format!("--zero {} is not a ZeRO stage: use 1, 2 or 3", z.stage)));
            }
            if z.stage > 1 && self.pipeline.is_some() {
                return Err(Error::config(format!(
                    "--zero {} shards gradients per block during backward, which a pipeline stage's \
                     schedule does not allow: use --zero 1 with --pp",
                    z.stage
                )));
            }
        }
        self.optim.validate()
    }

    /// The pipeline settings against the model and the strategy.
    fn validate_pp(&self, p: &PipelineConfig) -> Result<()> {
        if p.stages == 0 {
            return Err(Error::config("--pp must be at least 1"));
        }
        if let Strategy::Ps(_) = self.strategy {
            return Err(Error::config(
                "the parameter server works on whole models: use --strategy ddp with --pp",
            ));
        }
        self.pipeline_shape(p).validate(p.schedule)?;
        crate::pipeline::stages::check(&self.model, p)
    }

    /// The sizes pipeline `p`'s schedule is built for (its micro-batches are `accum`).
    pub fn pipeline_shape(&self, p: &PipelineConfig) -> Shape {
        p.shape(self.accum)
    }

    /// What [`pipeline::build`](crate::pipeline::build) needs of this run, with `dp`
    /// data-parallel ranks.
    pub fn stage_run(&self, dp: usize) -> StageRun<'_> {
        StageRun {
            model: &self.model,
            seed: self.seed,
            micro_batches: self.accum,
            rows: (self.batch / (dp * self.accum).max(1)).max(1),
        }
    }

    /// Pipeline stages (1 without a pipeline).
    pub fn pp(&self) -> usize {
        self.pipeline.as_ref().map_or(1, |p| p.stages)
    }

    /// The tensor-parallel settings against the model, the data and the strategy.
    fn validate_tp(&self, task: &dyn Task) -> Result<()> {
        if self.tp == 0 {
            return Err(Error::config("--tp must be at least 1"));
        }
        if self.tp == 1 {
            return match self.sp {
                true => Err(Error::config(
                    "--sp splits sequences over a tensor-parallel group: use it with --tp 2 or more",
                )),
                false => Ok(()),
            };
        }
        if self.model.kind != ModelKind::Gpt {
            return Err(Error::config("tensor parallelism (--tp) applies to --model gpt only"));
        }
        if let Strategy::Ps(_) = self.strategy {
            return Err(Error::config(
                "the parameter server works on whole models: use --strategy ddp with --tp",
            ));
        }
        crate::tp::Tp::check_sizes(self.tp, self.sp, self.model.heads, task.seq_len())
    }

    /// Data-parallel size on a world of `world` ranks; an error, before any communication,
    /// when the world is not `dp × pp × tp`, or when a pipeline's micro-batches do not
    /// divide each data-parallel share of the batch.
    pub fn dp(&self, world: usize) -> Result<usize> {
        let (tp, pp) = (self.tp, self.pp());
        if tp == 0 || pp == 0 || world == 0 || !world.is_multiple_of(tp * pp) {
            let (sizes, product) = match self.pipeline {
                Some(_) => (format!("--pp {pp} × --tp {tp}"), "--dp × --pp × --tp"),
                None => (format!("--tp {tp}"), "--dp × --tp"),
            };
            return Err(Error::config(format!(
                "the job has {world} ranks, which is not a multiple of {sizes}: the world size \
                 must be {product}"
            )));
        }
        let dp = world / (tp * pp);
        if let Strategy::Zero(z) = self.strategy
            && z.stage > 1
            && self.batch < dp * self.accum
        {
            return Err(Error::config(format!(
                "--zero {} reduces gradients and gathers parameters once per micro-batch, so every \
                 data-parallel rank needs rows for each of its {} micro-batch(es): --batch {} is \
                 less than --dp × --accum ({})",
                z.stage,
                self.accum,
                self.batch,
                dp * self.accum
            )));
        }
        if self.pipeline.is_some() && !self.batch.is_multiple_of(dp * self.accum) {
            return Err(Error::config(format!(
                "--batch {} does not divide into {dp} data-parallel share(s) of {} equal \
                 micro-batches: a pipeline needs --batch to be a multiple of --dp × \
                 --micro-batches ({})",
                self.batch,
                self.accum,
                dp * self.accum
            )));
        }
        Ok(dp)
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
