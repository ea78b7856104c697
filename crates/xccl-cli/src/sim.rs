//! `xccl sim`: simulates collectives on a modelled network with the schedules the executor
//! runs (the `xccl-sim` crate) and prints, per algorithm and size, the time, algorithm and
//! bus bandwidth, and the time the simulation took; then the simulator's best against the
//! tuner's pick, and the busiest links (optionally an SVG heat map). `xccl sim train` (the
//! [`crate::sim_train`] module) predicts a training step instead.

use std::process::ExitCode;
use std::time::Instant;

use xccl::CollKind;
use xccl::algo::Algorithm;
use xccl::algo::tune::CostModel;
use xccl_sim::sweep::{sweep, tuner_pick};
use xccl_sim::{report, spec};

/// Arguments of `xccl sim`.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// `xccl sim train`: predict a training step instead.
    #[command(subcommand)]
    pub what: Option<SimCommand>,
    /// The network: star, ring, torus[:dims=8x8], hypercube, fat-tree[:k=16,levels=3,over=2],
    /// dragonfly[:a=8,p=4,h=4,routing=valiant], dragonfly+[:leaves=8,spines=8,p=8,h=4], or
    /// measured (the tuning file's TCP constants); every shape takes bw=GBIT_S and lat=US.
    #[arg(long, default_value = "fat-tree")]
    pub topology: String,
    /// Hosts.
    #[arg(long, default_value_t = 64)]
    pub hosts: usize,
    /// Ranks per host (they share its memory).
    #[arg(long, default_value_t = 1)]
    pub ranks_per_host: usize,
    /// The collective.
    #[arg(long, default_value = "all_reduce")]
    pub collective: String,
    /// Algorithms, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    pub algo: String,
    /// Bytes per rank, comma-separated (K, M, G suffixes).
    #[arg(long, default_value = "1K,1M,64M,1G", value_delimiter = ',', value_parser = crate::bench::parse_size)]
    pub sizes: Vec<usize>,
    /// The cost model's file (`xccl tune fit -o`); default `XCCL_TUNE_FILE` or the reference.
    #[arg(long)]
    pub tune_file: Option<String>,
    /// Seconds of processor time per message between hosts, in µs (default: the model's
    /// TCP latency for `measured`, 1 µs otherwise).
    #[arg(long)]
    pub alpha_us: Option<f64>,
    /// Show the tuner's pick beside the simulator's best (`auto`: up to 4096 ranks; the
    /// tuner costs every rank's schedule of every algorithm, about 10 s at 4096 ranks).
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub pick: String,
    /// Write a heat map of the links' load (the largest size, the best algorithm) here.
    #[arg(long)]
    pub svg: Option<String>,
    /// Calls every rank makes back to back, as `xccl bench`'s loop does; the time shown is
    /// what one call adds to such a loop (a root's or a tree's tail overlaps the next call).
    /// 1: a single call, every rank starting together.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub calls: u32,
}

/// What `xccl sim` can simulate besides one collective.
#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// Predict a training step's time for a model and mesh (dp x pp x tp) from measured
    /// per-block compute times plus simulated collectives, with the overlap the strategy
    /// allows: `xccl sim train --dp 2 --pp 2 --topology fat-tree --hosts 4`.
    Train(Box<crate::sim_train::SimTrainArgs>),
}

/// Runs `xccl sim`.
pub fn run(args: &SimArgs) -> ExitCode {
    if let Some(SimCommand::Train(t)) = &args.what {
        return crate::sim_train::run(t);
    }
    match simulate(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xccl sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn simulate(args: &SimArgs) -> Result<(), String> {
    let kind = CollKind::named(&args.collective)
        .ok_or_else(|| format!("unknown collective '{}'", args.collective))?;
    let mut costs = match &args.tune_file {
        Some(f) => {
            let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
            CostModel::default().with_text(f, &text).map_err(|e| e.to_string())?
        }
        None => CostModel::from_lookup(|k| std::env::var(k).ok()).map_err(|e| e.to_string())?,
    };
    if args.hosts == 0 || args.ranks_per_host == 0 {
        return Err("--hosts and --ranks-per-host must be positive".into());
    }
    let topo = spec::parse(&args.topology, args.hosts, &costs)?;
    if !args.topology.starts_with("measured") {
        costs.tcp.alpha = 1e-6;
    }
    if let Some(a) = args.alpha_us {
        costs.tcp.alpha = a * 1e-6;
    }
    let only: Option<Vec<Algorithm>> = match args.algo.as_str() {
        "all" => None,
        list => Some(
            list.split(',')
                .map(|a| a.trim().parse::<Algorithm>().map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()?,
        ),
    };
    let n = args.hosts * args.ranks_per_host;
    let placement: Vec<usize> = (0..n).map(|r| r / args.ranks_per_host).collect();
    println!(
        "# xccl sim: {} on {} ({} hosts x {} ranks), alpha {:.2} us, shared memory {:.1} GB/s{}",
        kind,
        topo.name,
        args.hosts,
        args.ranks_per_host,
        costs.tcp.alpha * 1e6,
        1e-9 / costs.shm.beta,
        if args.calls > 1 { format!(", a call in a loop of {}", args.calls) } else { String::new() }
    );
    println!(
        "# {:>12} {:<20} {:>14} {:>12} {:>12} {:>10}",
        "size(B)", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "sim(s)"
    );
    let t0 = Instant::now();
    let rows = sweep(&topo, &costs, &placement, kind, only.as_deref(), &args.sizes, args.calls as usize);
    let mut heat = None;
    for &bytes in &args.sizes {
        let here: Vec<_> = rows.iter().filter(|r| r.bytes == bytes).collect();
        for r in &here {
            match &r.outcome {
                Ok(o) => {
                    let algbw = bytes as f64 / o.time / 1e9;
                    println!(
                        "  {:>12} {:<20} {:>14.2} {:>12.3} {:>12.3} {:>10.2}",
                        bytes,
                        r.algo.name(),
                        o.time * 1e6,
                        algbw,
                        algbw * kind.bus_factor(n),
                        r.wall
                    );
                }
                Err(e) => println!("  {:>12} {:<20} {e}", bytes, r.algo.name()),
            }
        }
        let best = here
            .iter()
            .filter_map(|r| r.outcome.as_ref().ok().map(|o| (r.algo, o)))
            .min_by(|a, b| a.1.time.total_cmp(&b.1.time));
        if let Some((algo, o)) = best {
            let want_pick = match args.pick.as_str() {
                "always" => true,
                "never" => false,
                _ => n <= 4096,
            };
            let pick = want_pick.then(|| tuner_pick(&topo, &costs, &placement, kind, bytes)).flatten();
            let verdict = match pick {
                Some((p, _)) if p == algo => "the same".to_string(),
                Some((p, _)) => match here.iter().find(|r| r.algo == p).and_then(|r| r.outcome.as_ref().ok())
                {
                    Some(po) => format!("{:.2}x the best's time", po.time / o.time),
                    None => "not simulated".into(),
                },
                None if want_pick => "none".into(),
                None => "not asked: --pick always".into(),
            };
            println!(
                "# {bytes} B: simulator's best {} ({:.2} us); tuner picks {} ({verdict})",
                algo.name(),
                o.time * 1e6,
                pick.map_or("-", |p| p.0.name())
            );
            heat = Some((algo, bytes, o.clone()));
        }
    }
    println!("# simulated in {:.2} s", t0.elapsed().as_secs_f64());
    if let Some((algo, bytes, o)) = heat {
        println!("# busiest links ({} at {bytes} B):", algo.name());
        for (l, b, u) in report::busiest(&topo, &o.carried, o.time, 5) {
            let link = &topo.links[l];
            println!("#   {} {} -> {}: {:.3e} B, {:.0}% busy", link.kind, link.from, link.to, b, u * 100.0);
        }
        if let Some(path) = &args.svg {
            let title = format!("{kind} by {} of {bytes} B per rank on {}", algo.name(), topo.name);
            std::fs::write(path, report::heat_map_svg(&topo, &o.carried, o.time, &title))
                .map_err(|e| format!("{path}: {e}"))?;
            println!("# heat map: {path}");
        }
    }
    Ok(())
}
