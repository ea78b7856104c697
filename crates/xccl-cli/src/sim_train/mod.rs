//! `xccl sim train`: predicts the time of one training step of `xccl train` for a model and a
//! mesh (dp × pp × tp) on a modelled network, from per-block compute times (measured here on
//! the model's own blocks, or read from an earlier run's trace) and the collectives the
//! strategy sends, each simulated by `xccl_sim` on the topology with the ranks where train's
//! mesh puts them (pipeline stages outermost, tensor-parallel groups innermost: inside a
//! host when hosts hold whole groups).
//!
//! The volumes are train's own: DDP's buckets ([`xccl_train::ddp::plan`]), ZeRO's
//! reduce-scatter and all-gather per block, the tensor-parallel operations recorded while the
//! blocks ran, the activations and gradients a pipeline stage's last block sends. They are
//! composed with the overlap each strategy allows ([`predict`]): DDP and ZeRO's reductions
//! run on their communicator while backward goes on (`xccl_sim::timeline::stream`),
//! tensor-parallel operations sit on the critical path, and a pipeline runs its schedule's
//! actions per stage with messages between them (`xccl_sim::timeline::run`).

pub mod measure;
mod predict;
pub mod spans;
pub mod spread;

use std::collections::BTreeMap;
use std::process::ExitCode;

use xccl::algo::tune::CostModel;
use xccl_sim::Topology;
use xccl_sim::spec;
use xccl_train::config::{Strategy, TrainConfig};
use xccl_train::pipeline::stages;

use crate::train::TrainArgs;
use measure::{Micro, Profile};
pub use predict::{Net, Prediction, predict_crowded};

/// Arguments of `xccl sim train`: the flags of `xccl train` for the model, mesh and
/// strategy, and those of `xccl sim` for the network.
#[derive(clap::Args, Debug)]
pub struct SimTrainArgs {
    /// The model, the mesh and the strategy, as `xccl train` takes them.
    #[command(flatten)]
    pub train: TrainArgs,
    /// The network, as `xccl sim --topology` takes it; `measured` is a star with the tuning
    /// file's TCP constants.
    #[arg(long, default_value = "measured")]
    pub topology: String,
    /// Hosts.
    #[arg(long, default_value_t = 1)]
    pub hosts: usize,
    /// Ranks per host [default: the job's ranks over the hosts].
    #[arg(long)]
    pub ranks_per_host: Option<usize>,
    /// The cost model's file (`xccl tune fit -o`); default `XCCL_TUNE_FILE` or the reference.
    #[arg(long)]
    pub tune_file: Option<String>,
    /// Seconds of processor time per message between hosts, in µs (default: the model's TCP
    /// latency for `measured`, 1 µs otherwise).
    #[arg(long)]
    pub alpha_us: Option<f64>,
    /// Take the per-block compute times from this trace of an earlier `xccl train` run
    /// (its trace.json, recorded without --pp) instead of measuring them.
    #[arg(long, value_name = "FILE")]
    pub from_trace: Option<std::path::PathBuf>,
    /// The rank of the trace whose spans are read.
    #[arg(long, default_value_t = 0)]
    pub trace_rank: usize,
    /// Timed iterations of the measurement (after one warm-up).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Compute threads per rank [default: as xccl train, this machine's cores over the
    /// job's ranks]; measuring uses them (RAYON_NUM_THREADS, when not set).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Cores per modelled host [default: this machine's]. The measurement runs the ranks of
    /// one host at once here (a block's median run); where a host's busy threads outnumber
    /// its cores, compute is scaled by how many times they do.
    #[arg(long)]
    pub host_cores: Option<usize>,
}

/// Runs `xccl sim train`.
pub fn run(args: &SimTrainArgs) -> ExitCode {
    match simulate(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xccl sim train: {e}");
            ExitCode::from(2)
        }
    }
}

/// The mesh and its placement on hosts: world rank `(s, d, t)` is `s·dp·tp + d·tp + t` (as
/// train's mesh orders `pp × dp × tp`), on host `rank / ranks_per_host`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Data-parallel size.
    pub dp: usize,
    /// Pipeline stages.
    pub pp: usize,
    /// Tensor-parallel size.
    pub tp: usize,
    /// Ranks per host.
    pub ranks_per_host: usize,
}

impl Layout {
    /// The world rank at stage `s`, data-parallel index `d`, tensor-parallel index `t`.
    pub fn rank(&self, s: usize, d: usize, t: usize) -> usize {
        (s * self.dp + d) * self.tp + t
    }

    /// The host of world rank `r`.
    pub fn host(&self, r: usize) -> usize {
        r / self.ranks_per_host.max(1)
    }
}

/// The modelled machine of a prediction: the network, the cost model, and how a job's
/// ranks sit on hosts and cores.
pub struct Machine {
    /// Hosts and links.
    pub topo: Topology,
    /// What ranks spend on a message.
    pub costs: CostModel,
    /// Hosts.
    pub hosts: usize,
    /// Ranks per host.
    pub ranks_per_host: usize,
    /// Compute threads per rank.
    pub threads: usize,
    /// This machine's cores, which measure a host's ranks at once.
    cores: usize,
}

impl SimTrainArgs {
    /// The machine these flags model for a job of `ranks` ranks. Sets `RAYON_NUM_THREADS`
    /// to the ranks' threads when it is not set, so call it before any compute starts.
    pub fn machine(&self, ranks: usize) -> Result<Machine, String> {
        if self.hosts == 0 {
            return Err("--hosts must be at least 1".into());
        }
        let rph = self.ranks_per_host.unwrap_or(ranks.div_ceil(self.hosts));
        if rph == 0 || rph * self.hosts < ranks {
            return Err(format!(
                "{} hosts x {rph} ranks per host hold fewer than the job's {ranks} ranks (--dp x --pp x --tp)",
                self.hosts
            ));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = self.threads.unwrap_or((cores / ranks.max(1)).max(1));
        if threads == 0 || self.iters == 0 || self.host_cores == Some(0) {
            return Err("--threads, --iters and --host-cores must be at least 1".into());
        }
        if std::env::var_os("RAYON_NUM_THREADS").is_none() {
            // SAFETY: no other thread runs yet (nothing has started candle, rayon or a
            // communicator), so nothing reads the environment while it changes.
            unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
        }
        // Freed memory kept for the next allocations, as in train's ranks.
        crate::train::keep_freed_memory();
        let mut costs = match &self.tune_file {
            Some(f) => {
                let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
                CostModel::default().with_text(f, &text).map_err(|e| e.to_string())?
            }
            None => CostModel::from_lookup(|k| std::env::var(k).ok()).map_err(|e| e.to_string())?,
        };
        let topo = spec::parse(&self.topology, self.hosts, &costs)?;
        if !self.topology.starts_with("measured") {
            costs.tcp.alpha = 1e-6;
        }
        if let Some(a) = self.alpha_us {
            if !a.is_finite() || a < 0.0 {
                return Err(format!("--alpha-us {a}: a latency in µs"));
            }
            costs.tcp.alpha = a * 1e-6;
        }
        Ok(Machine { topo, costs, hosts: self.hosts, ranks_per_host: rph, threads, cores })
    }

    /// The blocks of `config` (a job of `ranks` ranks, sequences of `len` tokens) timed on
    /// `machine`: measured here with a host's ranks at once, or read from `--from-trace`;
    /// and the factor by which the modelled host's cores slow (or speed) their compute
    /// against this machine's.
    pub fn profile(
        &self,
        machine: &Machine,
        config: &TrainConfig,
        ranks: usize,
        len: usize,
    ) -> Result<(Profile, f64), String> {
        let dp = config.dp(ranks).map_err(|e| e.to_string())?;
        let micro = Micro { rows: config.batch.div_ceil(dp * config.accum).max(1), len };
        let rph = machine.ranks_per_host;
        let traced = self.from_trace.is_some();
        let mut profile = measure::measure(
            &config.model,
            config.seed,
            config.tp,
            config.sp,
            micro,
            config.optim,
            if traced { 1 } else { self.iters },
            // The ranks this machine would hold of one host, measured at once.
            if traced { 1 } else { (rph.min(ranks) / config.tp).max(1) },
        )?;
        if let Some(path) = &self.from_trace {
            from_trace(&mut profile, path, self.trace_rank, config.tp)?;
        }
        // The measurement ran a host's ranks at once on this machine's cores (sharing its
        // memory), but a block's time is the median of its runs: a rank whose thread waits
        // for a core (more busy threads than cores) waits between blocks, or stretches a few
        // runs of one, and the median leaves that out (four 1-thread ranks on two cores
        // measured at full speed each, and were predicted at 0.52 of their step). So
        // crowding is applied here:
        // the modelled host's busy threads over its cores (with every rank computing:
        // `predict_crowded` counts the ranks computing at a time).
        let host_cores = self.host_cores.unwrap_or(machine.cores) as f64;
        let busy = (rph.min(ranks) * machine.threads) as f64;
        Ok((profile, if traced { 1.0 } else { (busy / host_cores).max(1.0) }))
    }
}

fn simulate(args: &SimTrainArgs) -> Result<(), String> {
    let t = &args.train;
    if t.worker {
        return Err("--worker is for ranks of xccl train".into());
    }
    let (task, config) = t.config()?;
    if let Strategy::Ps(_) = config.strategy {
        return Err("the parameter server is not modelled: use --strategy ddp (with --zero if wanted)".into());
    }
    let ranks = t.ranks();
    let machine = args.machine(ranks)?;
    let (profile, crowd) = args.profile(&machine, &config, ranks, task.seq_len())?;
    let dp = config.dp(ranks).map_err(|e| e.to_string())?;
    let rph = machine.ranks_per_host;
    let layout = Layout { dp, pp: config.pp(), tp: config.tp, ranks_per_host: rph };
    let net = predict::Net { topo: &machine.topo, costs: &machine.costs };
    let (p, slowdown) = predict_crowded(&config, &profile, layout, &net, crowd)?;
    let micro_rows = config.batch.div_ceil(dp * config.accum).max(1);
    println!(
        "# xccl sim train: {} on {} ({} hosts x {rph} ranks), mesh dp {dp} x pp {} x tp {}{}, {}, {} micro-batch(es) of {} rows",
        config.model,
        machine.topo.name,
        machine.hosts,
        layout.pp,
        layout.tp,
        if config.sp { " (sp)" } else { "" },
        config.strategy,
        config.accum,
        micro_rows
    );
    if let Some(pc) = &config.pipeline {
        println!("# pipeline: {} schedule, stages {:?}", pc.schedule, p.stages);
    }
    println!(
        "# compute: {}; x{slowdown:.2} for ranks sharing a host's cores ({crowd:.2} busy threads a core with every rank computing); x{:.3} waiting for the slowest of {} group(s) of {} rank(s) (from {} measured at once)",
        profile.source,
        profile.spread.wait_factor(ranks / layout.tp),
        ranks / layout.tp,
        layout.tp,
        profile.spread.at_once()
    );
    println!(
        "# {:<8} {:>10} {:>10} {:>10} {:>12}  tp collectives (fwd / bwd), their wait for the slowest rank (us)",
        "block", "fwd(us)", "bwd(us)", "params", "out elems"
    );
    for b in &profile.blocks {
        println!(
            "  {:<8} {:>10.1} {:>10.1} {:>10} {:>12}  {} / {}, {:.1} / {:.1}",
            b.name,
            b.fwd * 1e6,
            b.bwd * 1e6,
            b.params,
            b.out_elems,
            b.tp_fwd.len(),
            b.tp_bwd.len(),
            b.wait_fwd * 1e6,
            b.wait_bwd * 1e6
        );
    }
    print!("{}", p.render());
    Ok(())
}

/// Replaces the measured block times with those of rank `rank` of the trace at `path`, and
/// the measured waits and spread with those of the trace's ranks (`tp` consecutive ranks a
/// tensor-parallel group, as `xccl train` places them).
fn from_trace(profile: &mut Profile, path: &std::path::Path, rank: usize, tp: usize) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--from-trace {}: {e}", path.display()))?;
    let first = profile.blocks.first().map(|b| b.name.clone()).unwrap_or_default();
    let ranks = spans::trace_runs(&text, &first).map_err(|e| format!("{}: {e}", path.display()))?;
    let runs = ranks.get(&(rank as u64)).ok_or_else(|| {
        format!(
            "{}: rank {rank} of the trace has no span 'fwd {first}': per-block spans are recorded by `xccl train` \
             without --pp (a pipeline's trace has one span per stage)",
            path.display()
        )
    })?;
    let hint =
        |e: String| format!("{}: {e} (was it recorded with the same model and --pp 1?)", path.display());
    spans::apply_spans(&mut profile.blocks, runs).map_err(hint)?;
    let mut groups: BTreeMap<u64, Vec<&[Vec<xccl_train::trace::Span>]>> = BTreeMap::new();
    for (r, runs) in &ranks {
        groups.entry(r / tp.max(1) as u64).or_default().push(runs.as_slice());
    }
    spans::apply_groups(profile, &groups.into_values().collect::<Vec<_>>()).map_err(hint)?;
    profile.source = format!("{} (rank {rank}, {} iteration(s))", path.display(), runs.len());
    Ok(())
}

/// The blocks of each pipeline stage (one range without a pipeline).
pub fn stage_blocks(
    config: &xccl_train::config::TrainConfig,
    profile: &Profile,
) -> Result<Vec<std::ops::Range<usize>>, String> {
    let n = profile.blocks.len();
    match &config.pipeline {
        None => Ok(std::iter::once(0..n).collect()),
        Some(p) => {
            let costs: Vec<f64> = match p.balance {
                xccl_train::config::Balance::Time => profile.blocks.iter().map(|b| b.fwd + b.bwd).collect(),
                _ => profile.blocks.iter().map(|b| b.params as f64).collect(),
            };
            stages::cut(&config.model, p, &costs).map_err(|e| e.to_string())
        }
    }
}
