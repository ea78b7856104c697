//! `xccl plan`: the best ways to train a model on a number of ranks. Given `xccl train`'s
//! model and batch flags, the job's ranks, the hosts (`xccl sim train`'s network flags) and
//! a memory limit per rank, it tries every mesh `dp × tp × pp` of the ranks, with sequence
//! parallelism or not, every pipeline schedule, micro-batch count (powers of two),
//! recomputation and ZeRO stage that `xccl train` accepts for it, predicts each one's step
//! with `xccl sim train` (the blocks measured here once per tensor-parallel size and
//! micro-batch size; the collectives simulated with the tuner's calibrated costs), estimates
//! what each rank holds, and prints the fastest that fit, with the exact `xccl train`
//! command of each.
//!
//! What a rank holds is estimated as its model states (parameters, gradients and optimiser
//! state as the strategy shards them: DDP `(8 + s)·Ψ`, ZeRO-1 `8Ψ + (s + 4)·Ψ/dp` (its
//! reduce-scatter's own output), ZeRO-2 `4Ψ + (s + 4)·Ψ/dp`, ZeRO-3 `(8 + s)·Ψ/dp` and two
//! gathered blocks, for `Ψ` the parameters of its stage and tensor-parallel rank and `s` the
//! optimiser's bytes of state per parameter) plus the activations its forwards keep: each
//! block's `Saved` (measured) times the micro-batches the schedule holds at its peak on that
//! rank ([`check`]), or, with recomputation, their inputs and one block's. The allocator's
//! reserve, the runtime and a backward's transients come on top (docs/PERFORMANCE.md,
//! "Memory per rank").

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::process::ExitCode;

use xccl_train::config::{Balance, Strategy, TrainConfig};
use xccl_train::pipeline::check::check;
use xccl_train::pipeline::placement::Placement;
use xccl_train::pipeline::schedule::{Kind, Schedule};

use crate::sim_train::measure::Profile;
use crate::sim_train::{self, Layout, Prediction, SimTrainArgs, predict_crowded};
use crate::train::TrainArgs;

/// Arguments of `xccl plan`. What it searches (`xccl train`'s mesh, schedule, micro-batch,
/// ZeRO, sequence-parallel and recomputation flags) is left out of its help.
#[derive(clap::Args, Debug)]
#[command(mut_args(hide_searched))]
pub struct PlanArgs {
    /// The model and batch (`xccl train`'s flags; the mesh, schedule, micro-batches, ZeRO
    /// stage, sequence parallelism and recomputation are searched, not given) and the
    /// network (`xccl sim train`'s).
    #[command(flatten)]
    pub sim: SimTrainArgs,
    /// Ranks of the job: every dp x tp x pp that multiplies to it is tried.
    #[arg(long)]
    pub ranks: usize,
    /// Most memory per rank, in GiB, for its model states and kept activations
    /// [default: no limit].
    #[arg(long)]
    pub mem_gib: Option<f64>,
    /// Configurations printed, fastest first.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Most micro-batches per step tried (powers of two up to it).
    #[arg(long, default_value_t = 16)]
    pub max_micro_batches: usize,
}

/// One configuration the planner tries: what it sets of `xccl train`'s flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// `--dp`.
    pub dp: usize,
    /// `--tp`.
    pub tp: usize,
    /// `--pp`.
    pub pp: usize,
    /// `--sp`.
    pub sp: bool,
    /// `--schedule` (with `pp > 1`).
    pub schedule: Option<Kind>,
    /// `--virtual-stages` (2 for the interleaved schedule).
    pub virtual_stages: usize,
    /// `--micro-batches`.
    pub micro_batches: usize,
    /// `--zero`.
    pub zero: Option<u8>,
    /// `--recompute`.
    pub recompute: bool,
}

impl Candidate {
    /// `base` with this configuration's flags.
    pub fn apply(&self, base: &TrainArgs) -> TrainArgs {
        let mut t = base.clone();
        t.dp = self.dp;
        t.tp = self.tp;
        t.pp = self.pp;
        t.sp = self.sp;
        t.schedule = self.schedule;
        t.virtual_stages = Some(self.virtual_stages);
        t.accum = self.micro_batches;
        t.zero = self.zero;
        t.recompute = self.recompute;
        t
    }

    /// Its flags on `xccl train`'s command line.
    pub fn flags(&self) -> String {
        let mut f = format!("--dp {} --tp {} --pp {}", self.dp, self.tp, self.pp);
        if self.sp {
            f += " --sp";
        }
        if let Some(k) = self.schedule {
            f += &format!(" --schedule {k}");
        }
        if self.virtual_stages != 1 {
            f += &format!(" --virtual-stages {}", self.virtual_stages);
        }
        f += &format!(" --micro-batches {}", self.micro_batches);
        if let Some(z) = self.zero {
            f += &format!(" --zero {z}");
        }
        if self.recompute {
            f += " --recompute";
        }
        f
    }
}

/// Every configuration of `ranks` ranks: each `dp × tp × pp = ranks`; sequence parallelism
/// or not when `tp > 1`; without a pipeline DDP or ZeRO 1–3 (ZeRO-3 with recomputation or
/// not); with one every schedule (interleaved with two chunks per rank), with and without
/// recomputation, under DDP; micro-batches in powers of two up to `max_micro` and at most
/// a row each. Some are not runnable (`xccl train`'s checks say which).
pub fn candidates(ranks: usize, batch: usize, max_micro: usize) -> Vec<Candidate> {
    let divisors = |n: usize| (1..=n).filter(move |d| n.is_multiple_of(*d));
    let mut out = Vec::new();
    for tp in divisors(ranks) {
        for pp in divisors(ranks / tp) {
            let dp = ranks / (tp * pp);
            let micro = (0..).map(|e| 1usize << e).take_while(|&m| m <= max_micro.max(1) && m * dp <= batch);
            for m in micro {
                for sp in [false, true] {
                    if sp && tp == 1 {
                        continue;
                    }
                    let c = Candidate {
                        dp,
                        tp,
                        pp,
                        sp,
                        schedule: None,
                        virtual_stages: 1,
                        micro_batches: m,
                        zero: None,
                        recompute: false,
                    };
                    if pp == 1 {
                        out.push(c.clone());
                        let zero = if dp > 1 { [1, 2, 3].as_slice() } else { &[] };
                        for &z in zero {
                            out.push(Candidate { zero: Some(z), ..c.clone() });
                        }
                        if dp > 1 {
                            out.push(Candidate { zero: Some(3), recompute: true, ..c.clone() });
                        }
                        continue;
                    }
                    for kind in Kind::ALL {
                        for recompute in [false, true] {
                            let v = kind.chunks().unwrap_or(if kind == Kind::Interleaved { 2 } else { 1 });
                            out.push(Candidate {
                                schedule: Some(kind),
                                virtual_stages: v,
                                recompute,
                                ..c.clone()
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// Bytes a rank holds: model states and kept activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// Parameters, gradients and optimiser state (and ZeRO-3's gathered blocks).
    pub states: usize,
    /// What its forwards keep for their backwards at the schedule's peak.
    pub activations: usize,
}

impl Memory {
    /// Both.
    pub fn total(&self) -> usize {
        self.states + self.activations
    }
}

/// The most any rank of `config` (placed by `layout`, blocks measured in `profile`) holds,
/// as the module documentation counts it.
pub fn memory(config: &TrainConfig, profile: &Profile, layout: Layout) -> Result<Memory, String> {
    let blocks = &profile.blocks;
    let state = 4 * config.optim.state_names().len();
    let stages = sim_train::stage_blocks(config, profile)?;
    let (again, schedule) = match &config.pipeline {
        Some(pc) => {
            let s = Schedule::new(pc.schedule, pc.shape(config.accum)).map_err(|e| e.to_string())?;
            let report = check(&s).map_err(|v| format!("the {} schedule: {v}", pc.schedule))?;
            (pc.recompute, Some(report.rank_activations))
        }
        None => (matches!(config.strategy, Strategy::Zero(z) if z.stage == 3 && z.recompute), None),
    };
    // A block's input, kept when its forward is run again: the previous block's output
    // (f32), or the token ids of the first.
    let input = |k: usize| if k == 0 { 0 } else { blocks[k - 1].out_elems * 4 };
    let mut worst = Memory { states: 0, activations: 0 };
    let placement = config.pipeline.as_ref().map_or(Placement::Looped, |pc| pc.schedule.placement());
    for rank in 0..layout.pp {
        let chunks = placement.chunks_of(&stages, layout.pp, rank);
        let mine: Vec<usize> = chunks.iter().flat_map(|c| c.clone()).collect();
        let psi: usize = mine.iter().map(|&k| blocks[k].params).sum();
        let largest = mine.iter().map(|&k| blocks[k].params).max().unwrap_or(0);
        let dp = layout.dp.max(1);
        let states = match config.strategy {
            Strategy::Zero(z) if z.stage == 1 => 8 * psi + (state + 4) * psi / dp,
            Strategy::Zero(z) if z.stage == 2 => 4 * psi + (state + 4) * psi / dp,
            Strategy::Zero(_) => (8 + state) * psi / dp + 2 * 4 * largest,
            _ => (8 + state) * psi,
        };
        // Per (micro-batch, chunk) a rank holds: each chunk's kept bytes, the largest.
        let kept = |c: &std::ops::Range<usize>| -> usize {
            match again {
                true => input(c.start),
                false => c.clone().map(|k| blocks[k].saved).sum(),
            }
        };
        let per_pair = chunks.iter().map(kept).max().unwrap_or(0);
        let rerun = match again {
            true => mine.iter().map(|&k| blocks[k].saved).max().unwrap_or(0),
            false => 0,
        };
        let activations = match &schedule {
            Some(peaks) => peaks.get(rank).copied().unwrap_or(0) * per_pair + rerun,
            None if again => mine.iter().map(|&k| input(k)).sum::<usize>() + rerun,
            None => per_pair,
        };
        let m = Memory { states, activations };
        if m.total() > worst.total() {
            worst = m;
        }
    }
    Ok(worst)
}

/// A configuration with what the planner predicts for it.
pub struct Planned {
    /// The configuration.
    pub candidate: Candidate,
    /// Its predicted step.
    pub prediction: Prediction,
    /// What its fullest rank holds.
    pub memory: Memory,
}

/// Runs `xccl plan`.
pub fn run(args: &PlanArgs) -> ExitCode {
    match plan(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xccl plan: {e}");
            ExitCode::from(2)
        }
    }
}

/// `xccl train`'s flags that the planner searches or that do not apply to a plan.
const SEARCHED: &[&str] = &[
    "dp",
    "tp",
    "pp",
    "sp",
    "schedule",
    "virtual_stages",
    "accum",
    "zero",
    "recompute",
    "strategy",
    "staleness",
    "servers",
    "dedicated_servers",
    "steps",
    "checkpoint_every",
    "resume",
    "max_restarts",
    "out",
];

/// Hides a searched flag from `xccl plan --help`.
fn hide_searched(a: clap::Arg) -> clap::Arg {
    let hidden = a.is_hide_set() || SEARCHED.contains(&a.get_id().as_str());
    a.hide(hidden)
}

fn plan(args: &PlanArgs) -> Result<(), String> {
    let base = &args.sim.train;
    let given = [
        ("--dp", base.dp != 2),
        ("--tp", base.tp != 1),
        ("--pp", base.pp != 1),
        ("--sp", base.sp),
        ("--schedule", base.schedule.is_some()),
        ("--virtual-stages", base.virtual_stages.is_some()),
        ("--micro-batches", base.accum != 1),
        ("--zero", base.zero.is_some()),
        ("--recompute", base.recompute),
        ("--worker", base.worker),
    ];
    let given: Vec<&str> = given.iter().filter(|g| g.1).map(|g| g.0).collect();
    if !given.is_empty() {
        return Err(format!(
            "{} {} what the planner searches: give the job's size with --ranks N instead",
            given.join(", "),
            if given.len() == 1 { "is" } else { "are" }
        ));
    }
    if args.ranks == 0 || args.top == 0 {
        return Err("--ranks and --top must be at least 1".into());
    }
    let limit = match args.mem_gib {
        Some(g) if !(g.is_finite() && g > 0.0) => {
            return Err(format!("--mem-gib {g}: a size in GiB above 0"));
        }
        Some(g) => Some((g * f64::from(1u32 << 30)) as usize),
        None => None,
    };
    let machine = args.sim.machine(args.ranks)?;
    let all = candidates(args.ranks, base.batch, args.max_micro_batches);
    let mut planned = Vec::new();
    let mut rejected: HashMap<String, usize> = HashMap::new();
    let mut profiles: HashMap<(usize, bool, usize), (Profile, f64)> = HashMap::new();
    let mut over = 0;
    for c in &all {
        let t = c.apply(base);
        let (task, config) = match t.config() {
            Ok(v) => v,
            Err(e) => {
                *rejected.entry(e).or_default() += 1;
                continue;
            }
        };
        let dp = config.dp(args.ranks).map_err(|e| e.to_string())?;
        let rows = config.batch.div_ceil(dp * config.accum).max(1);
        let key = (config.tp, config.sp, rows);
        let (profile, crowd) = match profiles.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                eprintln!("# measuring tp {} sp {} on micro-batches of {rows} rows", config.tp, config.sp);
                e.insert(args.sim.profile(&machine, &config, args.ranks, task.seq_len())?)
            }
        };
        let layout = Layout { dp, pp: config.pp(), tp: config.tp, ranks_per_host: machine.ranks_per_host };
        let net = sim_train::Net { topo: &machine.topo, costs: &machine.costs };
        let prediction = match predict_crowded(&config, profile, layout, &net, *crowd) {
            Ok((p, _)) => p,
            Err(e) => {
                *rejected.entry(e).or_default() += 1;
                continue;
            }
        };
        let memory = memory(&config, profile, layout)?;
        if limit.is_some_and(|l| memory.total() > l) {
            over += 1;
            continue;
        }
        planned.push(Planned { candidate: c.clone(), prediction, memory });
    }
    planned.sort_by(|a, b| {
        a.prediction.step.total_cmp(&b.prediction.step).then(a.memory.total().cmp(&b.memory.total()))
    });
    println!(
        "# xccl plan: {} ranks ({} hosts x {} ranks) on {}, batch {}; {} configurations: {} runnable{}, {} not accepted by xccl train",
        args.ranks,
        machine.hosts,
        machine.ranks_per_host,
        machine.topo.name,
        base.batch,
        all.len(),
        planned.len(),
        match limit {
            Some(_) => format!(" within --mem-gib, {over} over it"),
            None => String::new(),
        },
        rejected.values().sum::<usize>()
    );
    let mut reasons: Vec<(&String, &usize)> = rejected.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (why, n) in reasons.iter().take(3) {
        println!("#   {n} x {why}");
    }
    if planned.is_empty() {
        return Err(match limit {
            Some(_) => "no configuration fits in --mem-gib: raise it or add ranks".into(),
            None => "no configuration runs: see the reasons above".into(),
        });
    }
    println!(
        "# {:<4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>11} {:>10}  configuration",
        "rank", "step(ms)", "compute", "tp comm", "bubble", "exposed", "states(MiB)", "kept(MiB)"
    );
    let ms = |s: f64| s * 1e3;
    let mib = |b: usize| b as f64 / f64::from(1u32 << 20);
    let model = model_flags(base);
    for (i, p) in planned.iter().take(args.top).enumerate() {
        let r = &p.prediction;
        println!(
            "  {:<4} {:>10.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>11.3} {:>10.3}  {}",
            i + 1,
            ms(r.step),
            ms(r.compute),
            ms(r.tp_comm),
            ms(r.bubble),
            ms(r.exposed),
            mib(p.memory.states),
            mib(p.memory.activations),
            p.candidate.flags()
        );
    }
    println!("# the commands, fastest first:");
    for p in planned.iter().take(args.top) {
        println!("xccl train {model} {}", p.candidate.flags());
    }
    Ok(())
}

/// The model, data, optimiser and batch flags of `t`, as `xccl train` takes them.
fn model_flags(t: &TrainArgs) -> String {
    use clap::ValueEnum;
    let name =
        |v: Option<clap::builder::PossibleValue>| v.map(|v| v.get_name().to_string()).unwrap_or_default();
    let mut f = format!(
        "--model {} --layers {} --heads {} --width {} --batch {} --optim {} --seed {}",
        name(t.model.to_possible_value()),
        t.layers,
        t.heads,
        t.width,
        t.batch,
        name(t.optim.to_possible_value()),
        t.seed
    );
    if let Some(c) = t.context {
        f += &format!(" --context {c}");
    }
    if t.tied {
        f += " --tied";
    }
    if let Some(lr) = t.lr {
        f += &format!(" --lr {lr}");
    }
    match &t.data {
        Some(d) => {
            f += &format!(" --data {}", d.display());
            if t.byte_level {
                f += " --byte-level";
            }
        }
        None => f += &format!(" --digits {}", t.digits),
    }
    match &t.pp_balance {
        Balance::Params => {}
        Balance::Time => f += " --pp-balance time",
        Balance::Blocks(b) => {
            let b: Vec<String> = b.iter().map(|n| n.to_string()).collect();
            f += &format!(" --pp-balance {}", b.join(","));
        }
    }
    if t.bucket_mb != 25.0 || t.first_bucket_mb != 1.0 {
        f += &format!(" --bucket-mb {} --first-bucket-mb {}", t.bucket_mb, t.first_bucket_mb);
    }
    f
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::sim_train::measure::BlockTimes;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: TrainArgs,
    }

    fn config(flags: &[&str]) -> TrainConfig {
        let mut argv = vec!["x", "--digits", "2", "--heads", "2", "--width", "16", "--layers", "2"];
        argv.extend_from_slice(flags);
        Wrap::try_parse_from(argv).unwrap().args.config().unwrap().1
    }

    /// Four blocks: `params[k]` parameters, `saved[k]` bytes kept, 100 output elements each.
    fn profile(params: [usize; 4], saved: [usize; 4]) -> Profile {
        Profile {
            blocks: (0..4)
                .map(|k| BlockTimes {
                    name: format!("b{k}"),
                    fwd: 1e-3,
                    bwd: 2e-3,
                    out_elems: 100,
                    params: params[k],
                    saved: saved[k],
                    tp_fwd: vec![],
                    tp_bwd: vec![],
                    wait_fwd: 0.0,
                    wait_bwd: 0.0,
                })
                .collect(),
            slots: (0..4).map(|k| (k, params[k])).collect(),
            optim_per_elem: 0.0,
            spread: crate::sim_train::spread::Spread::default(),
            source: "test".into(),
        }
    }

    fn layout(dp: usize, pp: usize) -> Layout {
        Layout { dp, pp, tp: 1, ranks_per_host: dp * pp }
    }

    #[test]
    fn every_candidate_is_a_mesh_of_the_ranks() {
        let all = candidates(8, 16, 8);
        for c in &all {
            assert_eq!(c.dp * c.tp * c.pp, 8, "{c:?}");
            assert!(
                c.micro_batches.is_power_of_two() && c.micro_batches <= 8 && c.micro_batches * c.dp <= 16
            );
            assert!(!c.sp || c.tp > 1, "{c:?}");
            assert_eq!(c.schedule.is_some(), c.pp > 1, "{c:?}");
            assert!(c.zero.is_none() || (c.dp > 1 && c.pp == 1), "{c:?}");
        }
        // Every mesh of 8 ranks is there: (dp, tp, pp) with dp·tp·pp = 8 is 10 meshes.
        let mut meshes: Vec<(usize, usize, usize)> = all.iter().map(|c| (c.dp, c.tp, c.pp)).collect();
        meshes.dedup();
        meshes.sort();
        meshes.dedup();
        assert_eq!(meshes.len(), 10);
        // Each configuration once.
        for (i, a) in all.iter().enumerate() {
            assert!(!all[i + 1..].contains(a), "{a:?} twice");
        }
        // Its flags are xccl train's.
        let c = all.iter().find(|c| c.pp == 2 && c.schedule == Some(Kind::Interleaved)).unwrap();
        let argv: Vec<String> = c.flags().split(' ').map(String::from).collect();
        let t = Wrap::try_parse_from(std::iter::once("x".to_string()).chain(argv)).unwrap().args;
        assert_eq!(c.apply(&t).dp, t.dp);
        assert_eq!((t.dp, t.tp, t.pp, t.virtual_stages, t.schedule), (c.dp, c.tp, c.pp, Some(2), c.schedule));
    }

    #[test]
    fn model_states_follow_the_zero_paper() {
        let p = profile([1000, 3000, 3000, 2000], [0; 4]);
        let psi = 9000;
        let states = |flags: &[&str], dp| memory(&config(flags), &p, layout(dp, 1)).unwrap().states;
        assert_eq!(states(&["--dp", "4"], 4), 16 * psi);
        assert_eq!(states(&["--dp", "4", "--zero", "1"], 4), 8 * psi + 12 * psi / 4);
        assert_eq!(states(&["--dp", "4", "--zero", "2"], 4), 4 * psi + 12 * psi / 4);
        // Two gathered blocks of the largest.
        assert_eq!(states(&["--dp", "4", "--zero", "3"], 4), 16 * psi / 4 + 2 * 4 * 3000);
        // SGD keeps one state (momentum) per parameter.
        assert_eq!(states(&["--dp", "4", "--optim", "sgd"], 4), 12 * psi);
    }

    #[test]
    fn kept_activations_follow_the_schedule() {
        let p = profile([10; 4], [1000, 2000, 3000, 500]);
        let acts = |flags: &[&str]| memory(&config(flags), &p, layout(1, 2)).unwrap().activations;
        // Two stages by parameters: blocks 0-1 (3000 bytes per micro-batch) and 2-3 (3500).
        // GPipe keeps every micro-batch on each stage; the fullest rank is the last.
        let g = ["--dp", "1", "--pp", "2", "--micro-batches", "4", "--schedule", "gpipe"];
        assert_eq!(acts(&g), 4 * 3500);
        // 1F1B: rank 0 holds min(p, m) = 2 (6000 + states), rank 1 one (3500).
        let f = ["--dp", "1", "--pp", "2", "--micro-batches", "4", "--schedule", "1f1b"];
        assert_eq!(acts(&f), 2 * 3000);
        // Recomputation: each held micro-batch's stage input (stage 0's are token ids, not
        // counted; stage 1's 100 f32) and one block's whole saved set: rank 0 0 + 2000,
        // rank 1 400 + 3000.
        let r = ["--dp", "1", "--pp", "2", "--micro-batches", "4", "--schedule", "1f1b", "--recompute"];
        assert_eq!(acts(&r), 3400);
        // Without a pipeline: one micro-batch's blocks.
        let d = memory(&config(&["--dp", "2", "--micro-batches", "2"]), &p, layout(2, 1)).unwrap();
        assert_eq!(d.activations, 6500);
        // ZeRO-3 with recomputation: every block's input, then the largest block's saved set.
        let z = memory(&config(&["--dp", "2", "--zero", "3", "--recompute"]), &p, layout(2, 1)).unwrap();
        assert_eq!(z.activations, 3 * 400 + 3000);
    }
}
