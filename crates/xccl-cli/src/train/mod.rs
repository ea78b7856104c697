//! `xccl train`: the main job. Launches local ranks as processes that train a model with
//! data parallelism (DDP or a parameter server), tensor, sequence and pipeline parallelism
//! on the embedded addition task or a text file, shows a progress bar, and ends with a
//! summary, a loss curve, a trace of compute and communication per rank, the pipeline's
//! timeline, and a checkpoint.
//!
//! The parent owns the terminal. Ranks run this same binary with the hidden `--worker` flag;
//! rank 0 reports progress as `@xccl-train {json}` lines on its stdout, which the parent
//! renders; every other line is shown with its rank's prefix. With `--max-restarts K` the
//! parent starts the job again when a rank fails, and the ranks resume from the last
//! checkpoint. Started by another launcher (`xccl run`, torchrun, mpirun, srun), `xccl train`
//! is one rank of that launcher's job ([`rank`]).

mod rank;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use xccl_train::checkpoint::DIR_NAME;
use xccl_train::config::{Balance, PipelineConfig, ZeroConfig};
use xccl_train::data::{Task, TaskConfig};
use xccl_train::ddp::DdpConfig;
use xccl_train::model::{ModelConfig, ModelKind};
use xccl_train::optim::OptimConfig;
use xccl_train::pipeline::schedule::Kind;
use xccl_train::ps::PsConfig;
use xccl_train::trainer::{CheckpointConfig, Strategy, TrainConfig};

use crate::run::{self, Job, Output, Prefixed};

/// Marks rank 0's progress lines.
const TAG: &str = "@xccl-train ";

fn parse_schedule(s: &str) -> Result<Kind, String> {
    s.parse()
}

fn parse_balance(s: &str) -> Result<Balance, String> {
    match s {
        "params" => Ok(Balance::Params),
        "time" => Ok(Balance::Time),
        list => list
            .split(',')
            .map(|k| k.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map(Balance::Blocks)
            .map_err(|_| format!("'{list}' is not params, time or a list of blocks per stage such as 3,2")),
    }
}

/// Data-parallel strategy.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrategyArg {
    /// Distributed data parallel: bucketed all-reduce overlapped with backward.
    Ddp,
    /// Synchronous parameter server.
    Ps,
    /// Asynchronous parameter server with a staleness bound (--staleness).
    PsAsync,
}

/// Model architecture.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelArg {
    /// GPT-style decoder.
    Gpt,
    /// Windowed MLP.
    Mlp,
}

/// Optimiser.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimArg {
    /// AdamW (default learning rate 1e-3).
    Adamw,
    /// SGD with momentum 0.9 (default learning rate 0.1).
    Sgd,
}

/// Arguments of `xccl train`.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Data-parallel size: replicas of the model, each on its share of the batch.
    #[arg(long, default_value_t = 2)]
    pub dp: usize,
    /// Tensor-parallel size: ranks each model is divided over (Megatron layers); the job
    /// launches dp x pp x tp local processes.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Pipeline stages: consecutive blocks of the model on consecutive ranks, working on
    /// --micro-batches at the same time.
    #[arg(long, default_value_t = 1)]
    pub pp: usize,
    /// Pipeline schedule: gpipe, 1f1b, interleaved, zb-h1 (1F1B with the backward split
    /// into input and weight gradients, the latter deferred into the bubble) or zb-v (two
    /// chunks per stage in a V, the backward split, a sixth of 1F1B's bubble; needs
    /// --micro-batches ≥ 2·pp − 1) [default: 1f1b; a schedule given with --pp 1 runs the
    /// pipeline executor on one stage].
    #[arg(long, value_parser = parse_schedule)]
    pub schedule: Option<Kind>,
    /// Model chunks per pipeline stage (--schedule interleaved; zb-v runs 2) [default: 2 with
    /// --schedule zb-v, else 1].
    #[arg(long)]
    pub virtual_stages: Option<usize>,
    /// Pipeline (or --zero 3): keep only each micro-batch's stage (block) input, run its
    /// forward again in backward.
    #[arg(long)]
    pub recompute: bool,
    /// Pipeline: cut stages by parameter count (params), by measured block time (time), or
    /// give the blocks per stage (e.g. 1,3 with 2 layers: the embedding, then both layers
    /// and the head).
    #[arg(long, default_value = "params", value_parser = parse_balance)]
    pub pp_balance: Balance,
    /// Sequence parallelism inside each tensor-parallel group (norms and residuals on
    /// len / tp positions per rank).
    #[arg(long)]
    pub sp: bool,
    /// How the ranks share the work.
    #[arg(long, value_enum, default_value_t = StrategyArg::Ddp)]
    pub strategy: StrategyArg,
    /// ZeRO over the data-parallel group instead of DDP: 1 shards the optimizer state, 2 also
    /// the gradients, 3 also the parameters (gathered block by block as they are needed).
    #[arg(long, value_name = "STAGE")]
    pub zero: Option<u8>,
    /// ps-async: how many steps a worker may run ahead of the parameters it has (default 2).
    #[arg(long)]
    pub staleness: Option<u64>,
    /// ps, ps-async: server ranks (the first ones), each holding a shard of the parameters.
    #[arg(long, default_value_t = 1)]
    pub servers: usize,
    /// ps, ps-async: servers only serve (otherwise they also compute gradients).
    #[arg(long)]
    pub dedicated_servers: bool,
    /// Training steps (a resumed run continues up to this step).
    #[arg(long, default_value_t = 2500)]
    pub steps: u64,
    /// Sequences per global step, over all ranks and micro-batches.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Micro-batches per rank per step (gradient accumulation; with a pipeline, the
    /// micro-batches its schedule runs).
    #[arg(long, visible_alias = "micro-batches", default_value_t = 1)]
    pub accum: usize,
    /// Model architecture.
    #[arg(long, value_enum, default_value_t = ModelArg::Gpt)]
    pub model: ModelArg,
    /// Layers (GPT decoder layers, MLP hidden layers).
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Attention heads (GPT).
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Features per token (GPT) or hidden units (MLP).
    #[arg(long, default_value_t = 128)]
    pub width: usize,
    /// Longest sequence the model takes [default: the sums' length, 64 for --data].
    #[arg(long)]
    pub context: Option<usize>,
    /// Tie the GPT's output head to its token embedding.
    #[arg(long)]
    pub tied: bool,
    /// Optimiser.
    #[arg(long, value_enum, default_value_t = OptimArg::Adamw)]
    pub optim: OptimArg,
    /// Learning rate [default: 1e-3 for adamw, 0.1 for sgd].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Train on this UTF-8 text file instead of the embedded addition task.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// With --data: bytes as tokens instead of characters.
    #[arg(long)]
    pub byte_level: bool,
    /// Addition task: digits per operand.
    #[arg(long, default_value_t = 3)]
    pub digits: usize,
    /// Seed of the parameters and the batches.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write a checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Continue from the checkpoint in --out.
    #[arg(long)]
    pub resume: bool,
    /// Start the job again (resuming from its last checkpoint) up to this many times when a
    /// rank fails, as torchrun's --max-restarts.
    #[arg(long, default_value_t = 0)]
    pub max_restarts: u32,
    /// Directory for the checkpoint, loss.svg, trace.json and summary.json.
    #[arg(long, default_value = "out/train")]
    pub out: PathBuf,
    /// DDP: most megabytes (MiB) of gradient per bucket.
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// DDP: most megabytes (MiB) in the first bucket.
    #[arg(long, default_value_t = 1.0)]
    pub first_bucket_mb: f64,
    /// Run as one rank of a launched job (used by `xccl train` itself).
    #[arg(long, hide = true)]
    pub worker: bool,
}

impl TrainArgs {
    /// The task and the training configuration these arguments describe.
    pub fn config(&self) -> Result<(Box<dyn Task>, TrainConfig), String> {
        let context = self.context.unwrap_or(match self.data {
            Some(_) => 64,
            None => 3 * self.digits + 2,
        });
        let task_config = match &self.data {
            Some(path) => TaskConfig::Text { path: path.clone(), byte_level: self.byte_level, len: context },
            None if self.byte_level => return Err("--byte-level applies to --data only".into()),
            None => TaskConfig::Sums { digits: self.digits },
        };
        let task = task_config.load().map_err(|e| e.to_string())?;
        let strategy = match (self.strategy, self.staleness) {
            (StrategyArg::Ddp, None) => {
                let mib = |name: &str, v: f64| {
                    if v.is_finite() && v > 0.0 && v <= 4096.0 {
                        Ok((v * f64::from(1u32 << 20)) as usize)
                    } else {
                        Err(format!("--{name} must be between 0 and 4096 (MiB), not {v}"))
                    }
                };
                Strategy::Ddp(DdpConfig {
                    bucket_bytes: mib("bucket-mb", self.bucket_mb)?,
                    first_bucket_bytes: mib("first-bucket-mb", self.first_bucket_mb)?,
                })
            }
            (StrategyArg::Ps, None) => Strategy::Ps(PsConfig {
                servers: self.servers,
                dedicated: self.dedicated_servers,
                staleness: 0,
            }),
            (StrategyArg::PsAsync, s) => Strategy::Ps(PsConfig {
                servers: self.servers,
                dedicated: self.dedicated_servers,
                staleness: s.unwrap_or(2),
            }),
            (_, Some(_)) => return Err("--staleness applies to --strategy ps-async only".into()),
        };
        let strategy = match (self.zero, strategy) {
            (None, s) => s,
            (Some(stage), Strategy::Ddp(_)) => {
                Strategy::Zero(ZeroConfig { stage, recompute: stage == 3 && self.recompute })
            }
            (Some(_), _) => {
                return Err("--zero shards the state of data parallelism: use it with --strategy ddp".into());
            }
        };
        if !matches!(strategy, Strategy::Ps(_)) && (self.servers != 1 || self.dedicated_servers) {
            return Err("--servers and --dedicated-servers apply to --strategy ps and ps-async".into());
        }
        if let Strategy::Ps(p) = strategy {
            xccl_train::ps::Roles::new(self.dp, &p).map_err(|e| e.to_string())?;
        }
        let optim = match self.optim {
            OptimArg::Adamw => OptimConfig::adamw(self.lr.unwrap_or(1e-3)),
            OptimArg::Sgd => OptimConfig::sgd(self.lr.unwrap_or(0.1)),
        };
        let model = ModelConfig {
            kind: match self.model {
                ModelArg::Gpt => ModelKind::Gpt,
                ModelArg::Mlp => ModelKind::Mlp,
            },
            vocab: task.vocab(),
            context,
            width: self.width,
            layers: self.layers,
            heads: self.heads,
            tied: self.tied,
        };
        let config = TrainConfig {
            model,
            task: task_config,
            optim,
            strategy,
            tp: self.tp,
            sp: self.sp,
            pipeline: (self.pp != 1
                || self.schedule.is_some()
                || self.virtual_stages.is_some()
                || (self.recompute && self.zero != Some(3)))
            .then(|| PipelineConfig {
                stages: self.pp,
                schedule: self.schedule.unwrap_or(Kind::OneFOneB),
                virtual_stages: self
                    .virtual_stages
                    .unwrap_or_else(|| self.schedule.and_then(Kind::chunks).unwrap_or(1)),
                recompute: self.recompute,
                balance: self.pp_balance.clone(),
            }),
            batch: self.batch,
            accum: self.accum,
            steps: self.steps,
            seed: self.seed,
            checkpoint: Some(CheckpointConfig {
                path: self.out.join(DIR_NAME),
                every: self.checkpoint_every,
                resume: self.resume,
                run: None,
            }),
            trace: true,
            evaluate: true,
        };
        if self.dp == 0 {
            return Err("--dp must be at least 1".into());
        }
        let dir = self.out.join(DIR_NAME);
        if self.resume && !dir.join(xccl_train::dcp::LATEST).exists() {
            return Err(format!(
                "--resume: there is no checkpoint in {}; run once without --resume first (or start \
                 from a file with `xccl checkpoint import FILE {}`)",
                dir.display(),
                dir.display()
            ));
        }
        config.validate(task.as_ref()).map_err(|e| e.to_string())?;
        config.dp(self.ranks()).map_err(|e| e.to_string())?;
        Ok((task, config))
    }

    /// Ranks the job launches: dp x pp x tp.
    pub fn ranks(&self) -> usize {
        self.dp * self.pp * self.tp
    }
}

/// Runs `xccl train`: as one rank when a launcher started it, otherwise as the launcher
/// of its own ranks.
pub fn run(args: &TrainArgs) -> ExitCode {
    if args.worker {
        return rank::run(args, None);
    }
    if let Some(launcher) = rank::launcher() {
        return rank::run(args, Some(launcher));
    }
    let fail = |msg: String| {
        eprintln!("xccl train: {msg}");
        ExitCode::from(2)
    };
    let (task, config) = match args.config() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        return fail(format!("cannot create --out {}: {e}", args.out.display()));
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e.to_string_lossy().into_owned(),
        Err(e) => return fail(format!("cannot find this program: {e}")),
    };
    let mut command = vec![exe];
    command.extend(std::env::args().skip(1));
    command.push("--worker".into());
    // One compute thread per core: N ranks on C cores get max(1, C / N) threads each.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ranks = args.ranks();
    let threads = (cores / ranks).max(1);
    let mut env = Vec::new();
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        env.push(("RAYON_NUM_THREADS".to_string(), threads.to_string()));
    }
    println!("{}", header(args, &config, task.as_ref(), threads));
    let job = Job { env, max_restarts: args.max_restarts, ..Job::local("xccl train", ranks, command) };
    let screen = Arc::new(Screen::new(ranks, config.steps));
    let code = run::launch(&job, screen.clone());
    screen.bar.finish_and_clear();
    if code != ExitCode::SUCCESS {
        return code;
    }
    let Some(summary) = screen.state().summary.take() else {
        return fail("rank 0 ended without a summary".into());
    };
    report(args, &config, &summary);
    ExitCode::SUCCESS
}

/// The line that opens a run: model, task, mesh, threads per rank, strategy, batch, steps.
fn header(args: &TrainArgs, config: &TrainConfig, task: &dyn Task, threads: usize) -> String {
    let mut axes = Vec::new();
    if args.pp > 1 {
        axes.push(format!("pp {}", args.pp));
    }
    if args.pp > 1 || args.tp > 1 {
        axes.push(format!("dp {}", args.dp));
    }
    if args.tp > 1 {
        axes.push(format!("tp {}", args.tp) + if args.sp { ", sequence parallel" } else { "" });
    }
    let mesh = if axes.is_empty() { String::new() } else { format!(" ({})", axes.join(" x ")) };
    format!(
        "xccl train: {} ({} parameters) on {}, {} ranks{mesh} x {threads} thread(s), {}; batch {} x {} tokens, {} steps",
        config.model,
        xccl_train::model::Model::new(&config.model, config.seed).map_or(0, |m| m.params().len()),
        task.describe(),
        args.ranks(),
        config.strategy,
        config.batch,
        task.seq_len(),
        config.steps
    )
}

/// Prints rank 0's `summary` and writes the loss curve, `summary.json` and the pipeline's
/// timeline into `--out`, naming every file.
fn report(args: &TrainArgs, config: &TrainConfig, summary: &Value) {
    print!("{}", summary["text"].as_str().unwrap_or_default());
    let svg = args.out.join("loss.svg");
    let losses: Vec<(u64, f64)> = serde_json::from_value(summary["losses"].clone()).unwrap_or_default();
    let title = format!("{} - {}", config.model, config.strategy);
    match plot_losses(&svg, &title, &losses) {
        Ok(()) => println!("loss curve          {}", svg.display()),
        Err(e) => eprintln!("xccl train: cannot draw {}: {e}", svg.display()),
    }
    let json = args.out.join("summary.json");
    match xccl_train::dcp::write_atomically(&json, summary.to_string().as_bytes()) {
        Ok(()) => println!("summary             {}", json.display()),
        Err(e) => eprintln!("xccl train: {e}"),
    }
    if let Some(p) = summary.get("pipeline").filter(|p| !p.is_null()) {
        let svg = args.out.join("pipeline.svg");
        match crate::pipeline_svg::draw(&svg, p) {
            Ok(()) => println!("pipeline timeline   {}", svg.display()),
            Err(e) => eprintln!("xccl train: cannot draw {}: {e}", svg.display()),
        }
    }
    println!("trace (Perfetto)    {}", args.out.join("trace.json").display());
    println!("checkpoint          {}", args.out.join(DIR_NAME).display());
}

/// Rank 0's progress in words, as the steps' losses come in.
struct Progress {
    steps: u64,
    tokens_per_step: f64,
    /// The step training started (or resumed) at.
    first: u64,
    /// The next step due a line of its own.
    next_line: u64,
}

impl Progress {
    fn new(steps: u64) -> Progress {
        Progress { steps, tokens_per_step: 0.0, first: 0, next_line: 0 }
    }

    /// Training starts (or resumes) at step `first`, with `tokens_per_step` tokens a step.
    fn start(&mut self, first: u64, tokens_per_step: f64) {
        (self.first, self.tokens_per_step, self.next_line) = (first, tokens_per_step, 0);
    }

    /// The message for `step`'s global `loss`, `seconds` into training, and whether the step
    /// is due a line of its own (the first, about every tenth of the run after it, the last).
    fn loss(&mut self, step: u64, loss: f64, seconds: f64) -> (String, bool) {
        let done = (step + 1).saturating_sub(self.first);
        let rate = if seconds > 0.0 { done as f64 * self.tokens_per_step / seconds } else { 0.0 };
        let due = step + 1 >= self.next_line || step + 1 == self.steps;
        if due {
            self.next_line = step + 1 + (self.steps / 10).max(1);
        }
        (format!("loss {loss:.4}  {rate:.0} tokens/s"), due)
    }

    /// The line of `step`, with its message.
    fn line(&self, step: u64, msg: &str, seconds: f64) -> String {
        format!("step {}/{}  {msg}  {seconds:.1} s", step + 1, self.steps)
    }
}

/// What rank 0 has reported so far.
struct State {
    progress: Progress,
    summary: Option<Value>,
}

/// The parent's terminal: a progress bar fed by rank 0, other output above it.
struct Screen {
    bar: ProgressBar,
    prefix: Prefixed,
    tty: bool,
    state: Mutex<State>,
}

impl Screen {
    fn new(world: usize, steps: u64) -> Screen {
        let bar = ProgressBar::new(steps);
        let style = ProgressStyle::with_template("{bar:32.cyan/blue} {pos}/{len} steps  {msg}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Screen {
            bar,
            prefix: Prefixed::new(world),
            tty: std::io::stderr().is_terminal(),
            state: Mutex::new(State { progress: Progress::new(steps), summary: None }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn progress(&self, event: &Value) {
        let mut st = self.state();
        match event["event"].as_str() {
            Some("start") => {
                let first = event["first"].as_u64().unwrap_or(0);
                st.progress.start(first, event["tokens_per_step"].as_f64().unwrap_or(0.0));
                self.bar.set_position(first);
                self.bar.reset_eta();
            }
            Some("loss") => {
                let step = event["step"].as_u64().unwrap_or(0);
                let loss = event["loss"].as_f64().unwrap_or(f64::NAN);
                let secs = event["seconds"].as_f64().unwrap_or(0.0);
                let (msg, due) = st.progress.loss(step, loss, secs);
                self.bar.set_position(step + 1);
                if self.tty {
                    self.bar.set_message(msg);
                } else if due {
                    println!("{}", st.progress.line(step, &msg, secs));
                }
            }
            Some("summary") => st.summary = Some(event.clone()),
            _ => {}
        }
    }
}

impl Output for Screen {
    fn line(&self, rank: usize, stderr: bool, line: &[u8]) {
        if rank == 0
            && !stderr
            && let Some(rest) = line.strip_prefix(TAG.as_bytes())
            && let Ok(event) = serde_json::from_slice::<Value>(rest)
        {
            self.progress(&event);
            return;
        }
        let text = String::from_utf8_lossy(&self.prefix.prefix(rank, line)).trim_end().to_string();
        if self.tty {
            self.bar.println(text);
        } else if stderr {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }

    fn note(&self, msg: &str) {
        self.bar.suspend(|| eprintln!("{msg}"));
    }
}

/// Keeps memory the process frees for its next allocations. candle allocates every
/// tensor afresh; with glibc's defaults, freed blocks above 128 KiB go back to the kernel
/// (unmapped, or trimmed off the heap's top), so every micro-batch faulted its activations
/// and gradients in again: a third of a small micro-batch's time went to page faults.
pub(crate) fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets parameters of the allocator (it takes the allocator's own
    // lock); no memory is touched. Blocks up to 32 MiB (glibc's largest threshold) come from
    // the heap, which is trimmed only above 1 GiB of free memory at its top.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// Draws the loss curve as SVG (no font needed), loss on a log scale.
fn plot_losses(path: &Path, title: &str, losses: &[(u64, f64)]) -> Result<(), String> {
    use plotters::prelude::*;
    let finite: Vec<(f64, f64)> =
        losses.iter().filter(|(_, l)| l.is_finite() && *l > 0.0).map(|&(s, l)| (s as f64 + 1.0, l)).collect();
    if finite.is_empty() {
        return Err("no loss to plot".into());
    }
    let max_x = finite.iter().map(|p| p.0).fold(1.0, f64::max);
    // Whole decades, so the log axis has labelled powers of ten.
    let max_y = 10f64.powf(finite.iter().map(|p| p.1).fold(f64::MIN_POSITIVE, f64::max).log10().ceil());
    let min_y = 10f64.powf(finite.iter().map(|p| p.1).fold(max_y, f64::min).log10().floor());
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_x, (min_y..max_y).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss (mean cross-entropy of target tokens, log scale)")
        .draw()
        .map_err(|e| e.to_string())?;
    chart.draw_series(LineSeries::new(finite, &BLUE)).map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
