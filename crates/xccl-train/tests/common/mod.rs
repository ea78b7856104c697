//! Helpers of the training tests: tiny configurations, parallel runs on thread ranks, and an
//! independent single-process reference.

#![allow(dead_code)]

use candle_core::{Tensor, Var};
use candle_nn::Optimizer as _;
use xccl::Communicator;
use xccl_train::checkpoint::DIR_NAME;
use xccl_train::data::TaskConfig;
use xccl_train::ddp::DdpConfig;
use xccl_train::model::{self, Graph, Model, ModelConfig, ModelKind};
use xccl_train::optim::OptimConfig;
use xccl_train::trace::Trace;
use xccl_train::trainer::{CheckpointConfig, Observer, Outcome, Strategy, TrainConfig, train};

/// A GPT small enough for many runs in a test: 2-digit sums (rows of 8 tokens).
pub fn tiny(optim: OptimConfig, strategy: Strategy, batch: usize, accum: usize, steps: u64) -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            kind: ModelKind::Gpt,
            vocab: 12,
            context: 8,
            width: 16,
            layers: 2,
            heads: 2,
            tied: true,
        },
        task: TaskConfig::Sums { digits: 2 },
        optim,
        strategy,
        tp: 1,
        sp: false,
        pipeline: None,
        batch,
        accum,
        steps,
        seed: 11,
        checkpoint: None,
        trace: false,
        evaluate: false,
    }
}

/// DDP with buckets small enough that this tiny model has several.
pub fn ddp() -> Strategy {
    Strategy::Ddp(DdpConfig { bucket_bytes: 8 << 10, first_bucket_bytes: 1 << 10 })
}

/// Runs `config` on `n` thread ranks; `observer(rank)` makes each rank's observer.
pub fn run_with<O: Observer + Send>(
    n: usize,
    config: &TrainConfig,
    observer: impl Fn(usize) -> O,
) -> Vec<xccl_train::Result<Outcome>> {
    let comms = Communicator::local(n).expect("local communicators");
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let mut obs = observer(comm.rank());
                s.spawn(move || train(&comm, config, &mut obs))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// Runs `config` on `n` thread ranks and returns each rank's outcome.
pub fn run(n: usize, config: &TrainConfig) -> Vec<Outcome> {
    run_with(n, config, |_| ()).into_iter().map(|r| r.expect("training failed")).collect()
}

/// Single-process training on the whole global batch, written independently of the
/// library's training loop: one graph through the whole model, `loss.backward()`, and
/// candle-nn's AdamW or a momentum SGD on candle tensors. Returns the flat parameters.
pub fn reference(config: &TrainConfig) -> Vec<f32> {
    let task = config.task.load().unwrap();
    let model = Model::new(&config.model, config.seed).unwrap();
    let vars: Vec<Var> = model.params().slots().iter().map(|s| s.param.var().unwrap()).collect();
    enum Opt {
        Adam(candle_nn::AdamW),
        Sgd { lr: f64, momentum: f64, wd: f64, bufs: Vec<Option<Tensor>> },
    }
    let mut opt = match config.optim {
        OptimConfig::AdamW { lr, beta1, beta2, eps, weight_decay } => Opt::Adam(
            candle_nn::AdamW::new(
                vars.clone(),
                candle_nn::ParamsAdamW { lr, beta1, beta2, eps, weight_decay },
            )
            .unwrap(),
        ),
        OptimConfig::Sgd { lr, momentum, weight_decay } => {
            Opt::Sgd { lr, momentum, wd: weight_decay, bufs: vec![None; vars.len()] }
        }
    };
    let mut trace = Trace::new("reference", false);
    for step in 0..config.steps {
        let batch = task.batch(config.seed, step, config.batch);
        let (ids, targets, mask) = batch.tensors().unwrap();
        let fwd = model.forward(&ids, Graph::Whole, &mut trace).unwrap();
        let loss = model::loss(fwd.logits(), &targets, &mask, batch.counted() as f64).unwrap();
        let grads = loss.backward().unwrap();
        match &mut opt {
            Opt::Adam(a) => a.step(&grads).unwrap(),
            Opt::Sgd { lr, momentum, wd, bufs } => {
                for (v, buf) in vars.iter().zip(bufs.iter_mut()) {
                    let g = (grads.get(v).unwrap() + (v.as_tensor() * *wd).unwrap()).unwrap();
                    let b = match buf.take() {
                        None => g,
                        Some(b) => ((b * *momentum).unwrap() + g).unwrap(),
                    };
                    v.set(&(v.as_tensor() - (&b * *lr).unwrap()).unwrap()).unwrap();
                    *buf = Some(b);
                }
            }
        }
    }
    model.params().read().unwrap()
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum();
    let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (d / n).sqrt()
}

/// ‖a − b‖ / ‖b‖ between the parameters after training and at initialisation: how far
/// training moved them (a test of equivalence means nothing if they did not move).
pub fn moved(config: &TrainConfig, params: &[f32]) -> f64 {
    let init = Model::new(&config.model, config.seed).unwrap().params().read().unwrap();
    rel_diff(params, &init)
}

/// A fresh, empty directory for test `name` of a test file `prefix` (per process).
pub fn temp(prefix: &str, name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("xccl-{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `config` checkpointing into `dir` every `every` steps (0: at the end), resuming if `resume`.
pub fn with_checkpoint(
    mut config: TrainConfig,
    dir: &std::path::Path,
    every: u64,
    resume: bool,
) -> TrainConfig {
    config.checkpoint = Some(CheckpointConfig { path: dir.join(DIR_NAME), every, resume, run: None });
    config
}
