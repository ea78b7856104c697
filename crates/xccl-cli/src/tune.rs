//! `xccl tune`: calibrates the tuner's cost model on this machine.
//!
//! `xccl tune measure` (under `xccl run`, or with `--local N`) times every algorithm of
//! every collective at each size, as `xccl bench --every-algo` does, and writes one record
//! per measurement. `xccl tune fit` reads records (of several world sizes, say) and fits the
//! constants of the link classes they used, minimising the squared log error of the
//! predicted times; it prints the constants as `XCCL_TUNE_*` settings and, for every
//! collective, size and world size, the algorithm the tuner then picks against the fastest
//! one measured.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use xccl::algo::tune::{CostModel, Costing, Efficiency, LinkClass, LinkCost, Placement};
use xccl::algo::{Algorithm, Shape};
use xccl::bootstrap::Rendezvous;
use xccl::{CollKind, Communicator, Config, DType, ReduceOp};

use crate::bench::{self, BenchArgs, Coll};

/// Arguments of `xccl tune`.
#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    #[command(subcommand)]
    what: TuneCommand,
}

#[derive(clap::Subcommand, Debug)]
enum TuneCommand {
    /// Time every algorithm of every collective at each size (run under `xccl run`).
    Measure(MeasureArgs),
    /// Fit the cost model to measurements and show the tuner's picks.
    Fit(FitArgs),
}

#[derive(clap::Args, Debug)]
struct MeasureArgs {
    /// Sizes in bytes, as `xccl bench` counts them.
    #[arg(long, value_delimiter = ',', default_value = "8,1K,64K,1M,16M,64M")]
    sizes: Vec<String>,
    /// Collectives to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all",
        value_parser = Coll::parse
    )]
    colls: Vec<Coll>,
    /// Seconds each timed loop should last.
    #[arg(long, default_value_t = 0.2)]
    target_sec: f64,
    /// Measurements of each case; the record keeps their median.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Run this many ranks as threads of this process instead of joining a launched job.
    #[arg(long)]
    local: Option<usize>,
    /// Where rank 0 writes the records (default: standard output).
    #[arg(short, long)]
    out: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct FitArgs {
    /// Record files written by `xccl tune measure`.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write the fitted constants here, as a tuning file for `XCCL_TUNE_FILE`.
    #[arg(short, long)]
    out: Option<PathBuf>,
    /// Only check the default constants (those built in, or `XCCL_TUNE_FILE`'s) against the
    /// records: no fitting.
    #[arg(long)]
    check: bool,
}

/// Runs `xccl tune`.
pub fn run(args: &TuneArgs) -> ExitCode {
    let result = match &args.what {
        TuneCommand::Measure(m) => measure(m),
        TuneCommand::Fit(f) => fit(f),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xccl tune: {e}");
            ExitCode::from(1)
        }
    }
}

fn class_name(c: LinkClass) -> &'static str {
    match c {
        LinkClass::Local => "local",
        LinkClass::Shm => "shm",
        LinkClass::Tcp => "tcp",
    }
}

fn class_of(s: &str) -> Option<LinkClass> {
    [LinkClass::Local, LinkClass::Shm, LinkClass::Tcp].into_iter().find(|c| class_name(*c) == s)
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

fn measure(args: &MeasureArgs) -> xccl::Result<()> {
    if args.colls.iter().any(|c| c.uneven) {
        // A record holds one count per rank, and the fit costs that even layout.
        return Err(xccl::Error::Config(
            "--colls: reduce_scatter_v is not measured, records hold even layouts (reduce_scatter's \
             efficiencies apply to it)"
                .into(),
        ));
    }
    let sizes = args
        .sizes
        .iter()
        .map(|s| xccl::parse_bytes("--sizes", s, 1, usize::MAX))
        .collect::<xccl::Result<Vec<_>>>()?;
    let config = Config::from_env()?;
    match args.local {
        Some(n) => {
            let comms = Communicator::local_with(n, config)?;
            std::thread::scope(|s| {
                let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| measure_rank(c, args, &sizes))).collect();
                hs.into_iter()
                    .map(|h| h.join().expect("tune rank panicked"))
                    .collect::<xccl::Result<Vec<_>>>()
            })?;
            Ok(())
        }
        None => measure_rank(&Communicator::connect(&Rendezvous::from_env()?, config)?, args, &sizes),
    }
}

fn measure_rank(c: &Communicator, args: &MeasureArgs, sizes: &[usize]) -> xccl::Result<()> {
    let topo = c.placement();
    let mut records = String::new();
    for &coll in &args.colls {
        let kind =
            coll.collective().ok_or_else(|| xccl::Error::Config("sendrecv has no algorithms".into()))?;
        let bargs = BenchArgs {
            coll,
            min: 1,
            max: 1,
            factor: 2,
            sizes: Vec::new(),
            iters: None,
            warmup: 3,
            target_sec: args.target_sec,
            dtype: DType::F32,
            op: ReduceOp::Sum,
            root: 0,
            local: None,
            peer_format: false,
            inplace: false,
            check_every: false,
            algo: None,
            every_algo: false,
            proto: None,
            every_proto: false,
            huge_pages: false,
            compute_us: 0.0,
        };
        for &algo in Algorithm::for_collective(kind) {
            if !algo.supports(kind, c.size(), &Shape::Count(1)) {
                continue;
            }
            let mut config = c.config().clone();
            config.algos.set(kind, algo)?;
            let forced = c.dup_with(config)?;
            for &bytes in sizes {
                let mut times = Vec::new();
                let mut per_rank = 0;
                for _ in 0..args.reps.max(1) {
                    let (row, shape) = bench::measure::<f32>(&forced, &bargs, bytes)?;
                    if row.wrong > 0 {
                        return Err(xccl::Error::Internal(format!(
                            "{kind} by {algo}: {} wrong values",
                            row.wrong
                        )));
                    }
                    times.push(row.tavg);
                    if let Shape::Count(count) = shape {
                        per_rank = count;
                    }
                }
                times.sort_by(f64::total_cmp);
                let median = times[times.len() / 2];
                let _ = writeln!(
                    records,
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{per_rank}\t4\t0\t{:.9e}",
                    class_name(topo.intra),
                    class_name(topo.inter),
                    join(&topo.hosts),
                    join(&topo.cores),
                    kind.name(),
                    algo,
                    bytes,
                    median
                );
            }
        }
        if c.rank() == 0 {
            eprintln!("xccl tune: measured {kind}");
        }
    }
    if c.rank() == 0 {
        let header =
            "# intra\tinter\thosts\tcores\tcollective\talgorithm\tbytes\tcount\tesize\troot\tseconds\n";
        match &args.out {
            Some(path) => std::fs::write(path, format!("{header}{records}"))
                .map_err(|e| xccl::Error::io(format!("writing {}", path.display()), e))?,
            None => print!("{header}{records}"),
        }
    }
    Ok(())
}

/// One measurement, with its schedules ready to be costed.
struct Record {
    /// Which table it belongs to: link classes, ranks and cores.
    group: String,
    /// The link classes it used.
    classes: Vec<LinkClass>,
    /// Whether a host had more ranks than cores.
    crowded: bool,
    kind: CollKind,
    algo: Algorithm,
    bytes: usize,
    seconds: f64,
    costing: Costing,
}

fn parse_records(files: &[PathBuf]) -> xccl::Result<Vec<Record>> {
    let mut records = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| xccl::Error::io(format!("reading {}", path.display()), e))?;
        for (no, line) in text.lines().enumerate() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let bad = |what: &str| {
                xccl::Error::Config(format!(
                    "{}:{}: {what} (expected a record of xccl tune measure)",
                    path.display(),
                    no + 1
                ))
            };
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() != 11 {
                return Err(bad("11 tab-separated fields needed"));
            }
            let list = |s: &str| s.split(',').map(str::parse::<usize>).collect::<Result<Vec<_>, _>>();
            let hosts = list(f[2]).map_err(|_| bad("bad host list"))?;
            let cores = list(f[3]).map_err(|_| bad("bad core list"))?;
            let intra = class_of(f[0]).ok_or_else(|| bad("unknown link class"))?;
            let inter = class_of(f[1]).ok_or_else(|| bad("unknown link class"))?;
            let kind = xccl::algo::AlgoOverrides::parse(&format!("{}:{}", f[4], f[5]))
                .map_err(|e| bad(&e.to_string()))?;
            let kind = [
                CollKind::AllReduce,
                CollKind::AllGather,
                CollKind::ReduceScatter,
                CollKind::Broadcast,
                CollKind::AllToAll,
                CollKind::Reduce,
                CollKind::Scatter,
                CollKind::Gather,
            ]
            .into_iter()
            .find(|k| kind.get(*k).is_some())
            .ok_or_else(|| bad("unknown collective"))?;
            let algo: Algorithm = f[5].parse().map_err(|e: xccl::Error| bad(&e.to_string()))?;
            let num = |s: &str, what: &str| s.parse::<usize>().map_err(|_| bad(what));
            let (bytes, count, esize, root) = (
                num(f[6], "bad size")?,
                num(f[7], "bad count")?,
                num(f[8], "bad element size")?,
                num(f[9], "bad root")?,
            );
            let seconds: f64 = f[10].parse().map_err(|_| bad("bad time"))?;
            if hosts.len() != cores.len() || hosts.is_empty() || !seconds.is_finite() || seconds <= 0.0 {
                return Err(bad("inconsistent record"));
            }
            let hosts_used: std::collections::BTreeSet<usize> = hosts.iter().copied().collect();
            let classes = if hosts_used.len() > 1 { vec![intra, inter] } else { vec![intra] };
            let crowded = hosts_used.iter().any(|h| {
                let here: Vec<usize> = (0..hosts.len()).filter(|&r| hosts[r] == *h).collect();
                here.len() > cores[here[0]]
            });
            let topo = Placement::new(hosts, cores, intra, inter);
            let costing = Costing::new(&topo, kind, algo, root, &Shape::Count(count), esize)?;
            let group = format!(
                "{} ranks, {} (cores {})",
                topo.hosts.len(),
                if intra == inter {
                    class_name(intra).to_string()
                } else {
                    format!("{} + {}", class_name(intra), class_name(inter))
                },
                f[3]
            );
            records.push(Record { group, classes, crowded, kind, algo, bytes, seconds, costing });
        }
    }
    if records.is_empty() {
        return Err(xccl::Error::Config("no records in the files given".into()));
    }
    Ok(records)
}

/// Which efficiency each fitted factor pair belongs to: every (collective, algorithm,
/// crowded) of the records.
type Keys = Vec<(CollKind, Algorithm, bool)>;

/// Weight of the pull of every efficiency factor towards 1 (in squared log units): where
/// the measurements say little about a factor, it stays near the plain model.
const PRIOR: f64 = 0.05;

/// The parameters, as logarithms: per link class alpha (µs), beta, gamma, delta (GB/s), the
/// hand-off (µs), then per key the latency and the bandwidth factor.
fn to_params(m: &CostModel, keys: &Keys) -> Vec<f64> {
    let mut p = Vec::new();
    for c in [m.local, m.shm, m.tcp] {
        p.extend([c.alpha * 1e6, 1e-9 / c.beta, 1e-9 / c.gamma, 1e-9 / c.delta].map(f64::ln));
    }
    p.push((m.switch * 1e6).max(1e-3).ln());
    for &(kind, algo, crowded) in keys {
        let (l, b) = m.factors(kind, algo, crowded);
        p.extend([l.ln(), b.ln()]);
    }
    p
}

fn from_params(p: &[f64], keys: &Keys) -> CostModel {
    let class = |i: usize| LinkCost::new(p[i].exp(), p[i + 1].exp(), p[i + 2].exp(), p[i + 3].exp());
    let efficiency = keys
        .iter()
        .enumerate()
        .map(|(k, &(kind, algo, crowded))| Efficiency {
            kind,
            algo,
            crowded,
            latency: p[13 + 2 * k].exp(),
            bandwidth: p[14 + 2 * k].exp(),
        })
        .collect();
    // Protocol factors are not fitted: they stay the reference machine's.
    let protocols = CostModel::default().protocols;
    CostModel {
        local: class(0),
        shm: class(4),
        tcp: class(8),
        switch: p[12].exp() * 1e-6,
        efficiency,
        protocols,
    }
}

/// Squared log error of the predictions, plus the prior on the factors.
fn error(records: &[Record], p: &[f64], keys: &Keys) -> f64 {
    let m = from_params(p, keys);
    let misfit: f64 = records.iter().map(|r| (r.costing.time(&m) / r.seconds).ln().powi(2)).sum();
    misfit + PRIOR * p[13..].iter().map(|x| x * x).sum::<f64>()
}

/// Fits the constants the records can tell about, starting from `start`: coordinate descent
/// on the logarithms, halving the step when no move helps. Returns the model, the link
/// classes and hand-off that moved (per class alpha, beta, gamma, delta; then the hand-off)
/// and the remaining squared log error of the predictions.
fn fit_model(records: &[Record], start: &CostModel) -> (CostModel, Vec<bool>, f64) {
    let mut keys: Keys = records.iter().map(|r| (r.kind, r.algo, r.crowded)).collect();
    keys.sort_by_key(|&(k, a, c)| (k as u8, a as u8, c));
    keys.dedup();
    let mut used = vec![false; 13 + 2 * keys.len()];
    for r in records {
        for (i, class) in [LinkClass::Local, LinkClass::Shm, LinkClass::Tcp].into_iter().enumerate() {
            if r.classes.contains(&class) {
                used[4 * i..4 * i + 4].iter_mut().for_each(|u| *u = true);
            }
        }
        used[12] |= r.crowded;
    }
    used[13..].iter_mut().for_each(|u| *u = true);
    let mut p = to_params(start, &keys);
    let mut best = error(records, &p, &keys);
    let mut step = 0.5f64;
    while step > 0.001 {
        let mut improved = false;
        for i in (0..p.len()).filter(|&i| used[i]) {
            for dir in [step, -step] {
                let mut q = p.clone();
                q[i] += dir;
                let e = error(records, &q, &keys);
                if e < best {
                    (p, best) = (q, e);
                    improved = true;
                }
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    let fitted = from_params(&p, &keys);
    let misfit = records.iter().map(|r| (r.costing.time(&fitted) / r.seconds).ln().powi(2)).sum();
    used.truncate(13);
    (fitted, used, misfit)
}

fn fit(args: &FitArgs) -> xccl::Result<()> {
    let records = parse_records(&args.files)?;
    let default = Config::from_env()?.costs;
    let rms = |m: &CostModel| {
        let e: f64 = records.iter().map(|r| (r.costing.time(m) / r.seconds).ln().powi(2)).sum();
        (e / records.len() as f64).sqrt()
    };
    let fitted = if args.check {
        println!(
            "# the default constants against {} measurements: rms log error {:.3}",
            records.len(),
            rms(&default)
        );
        default.clone()
    } else {
        let (fitted, used, _) = fit_model(&records, &default);
        println!("# fitted over {} measurements: rms log error {:.3}", records.len(), rms(&fitted));
        let show = |c: &LinkCost| {
            format!("{:.3},{:.3},{:.3},{:.3}", c.alpha * 1e6, 1e-9 / c.beta, 1e-9 / c.gamma, 1e-9 / c.delta)
        };
        for (name, c, i) in [("LOCAL", &fitted.local, 0), ("SHM", &fitted.shm, 4), ("TCP", &fitted.tcp, 8)] {
            if used[i] {
                println!("# link constants: XCCL_TUNE_{name}={}", show(c));
            }
        }
        if used[12] {
            println!("# hand-off: XCCL_TUNE_SWITCH_US={:.2}", fitted.switch * 1e6);
        }
        println!("# {} algorithm efficiencies fitted", fitted.efficiency.len());
        if let Some(path) = &args.out {
            let text = format!(
                "# Written by xccl tune fit from {} measurements; use with XCCL_TUNE_FILE.\n{}",
                records.len(),
                fitted.to_text()
            );
            std::fs::write(path, text)
                .map_err(|e| xccl::Error::io(format!("writing {}", path.display()), e))?;
            println!("# wrote {}", path.display());
        }
        fitted
    };
    // Picks per table, collective and size, under the fitted and the default constants.
    let mut cases: BTreeMap<(String, &'static str, usize), Vec<&Record>> = BTreeMap::new();
    for r in &records {
        cases.entry((r.group.clone(), r.kind.name(), r.bytes)).or_default().push(r);
    }
    let pick = |rs: &[&Record], m: &CostModel| {
        rs.iter().min_by(|a, b| a.costing.time(m).total_cmp(&b.costing.time(m))).map(|r| (r.algo, r.seconds))
    };
    let (mut within, mut worst) = (0, 1.0f64);
    let mut table = String::new();
    for ((group, coll, bytes), rs) in &cases {
        let fastest = rs.iter().min_by(|a, b| a.seconds.total_cmp(&b.seconds)).map(|r| (r.algo, r.seconds));
        let (Some((fa, ft)), Some((pa, pt)), Some((da, dt))) =
            (fastest, pick(rs, &fitted), pick(rs, &default))
        else {
            continue;
        };
        let ratio = pt / ft;
        worst = worst.max(ratio);
        within += usize::from(ratio <= 1.1);
        let measured: Vec<String> = rs.iter().map(|r| format!("{} {:.1}", r.algo, r.seconds * 1e6)).collect();
        let _ = writeln!(
            table,
            "| {group} | {coll} | {bytes} | {} | {fa} | **{pa}** | {ratio:.2} | {da} ({:.2}) |",
            measured.join(", "),
            dt / ft
        );
    }
    println!();
    println!(
        "| ranks | collective | bytes | measured (µs) | fastest | tuner's pick (fitted) | pick / fastest | pick with defaults (/ fastest) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    print!("{table}");
    println!();
    println!("# {within} of {} picks within 10% of the fastest; worst {worst:.2}x", cases.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of every all-reduce algorithm on `topo`, timed by `truth`.
    fn synthetic(truth: &CostModel, topo: &Placement, group: &str) -> Vec<Record> {
        let mut out = Vec::new();
        for &algo in Algorithm::for_collective(CollKind::AllReduce) {
            for count in [2usize, 1 << 10, 1 << 14, 1 << 18, 1 << 22] {
                if !algo.supports(CollKind::AllReduce, topo.hosts.len(), &Shape::Count(count)) {
                    continue;
                }
                let costing =
                    Costing::new(topo, CollKind::AllReduce, algo, 0, &Shape::Count(count), 4).unwrap();
                let seconds = costing.time(truth);
                out.push(Record {
                    group: group.into(),
                    classes: vec![topo.intra],
                    crowded: topo.hosts.len() > topo.cores[0],
                    kind: CollKind::AllReduce,
                    algo,
                    bytes: 4 * count,
                    seconds,
                    costing,
                });
            }
        }
        out
    }

    #[test]
    fn the_fit_recovers_the_constants_that_made_the_times() {
        // Times made by the plain alpha-beta-gamma model (every algorithm as efficient as
        // its formula says), fitted from a start with the same shape.
        let plain = CostModel { efficiency: Vec::new(), ..CostModel::default() };
        let truth = CostModel { shm: LinkCost::new(0.7, 9.0, 5.0, 20.0), switch: 35e-6, ..plain.clone() };
        let mut records = synthetic(&truth, &Placement::one_host(2, 2, LinkClass::Shm), "2");
        records.extend(synthetic(&truth, &Placement::one_host(4, 2, LinkClass::Shm), "4"));
        let (fitted, used, err) = fit_model(&records, &plain);
        assert!(err < 1e-3, "residual {err}");
        // Only shared memory and the hand-off were measured, so only they moved.
        assert_eq!(used.iter().filter(|u| **u).count(), 5);
        let (t, d) = (fitted.tcp, CostModel::default().tcp);
        for (x, y) in [(t.alpha, d.alpha), (t.beta, d.beta), (t.gamma, d.gamma), (t.delta, d.delta)] {
            assert!((x / y - 1.0).abs() < 1e-9, "{t:?} moved from {d:?}");
        }
        for r in &records {
            let ratio = r.costing.time(&fitted) / r.seconds;
            assert!((0.97..1.03).contains(&ratio), "{} at {} B: {ratio}", r.algo, r.bytes);
        }
    }

    #[test]
    fn records_that_do_not_parse_say_where() {
        let dir = std::env::temp_dir().join(format!("xccl-tune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.tsv");
        std::fs::write(&bad, "shm\ttcp\t0,0\t2,2\tall_reduce\tteleport\t8\t2\t4\t0\t1e-6\n").unwrap();
        let err = parse_records(std::slice::from_ref(&bad)).err().unwrap().to_string();
        assert!(err.contains("bad.tsv:1") && err.contains("teleport"), "{err}");
        let good = dir.join("good.tsv");
        std::fs::write(&good, "shm\ttcp\t0,0\t2,2\tall_reduce\tring\t8\t2\t4\t0\t1e-6\n").unwrap();
        let recs = parse_records(&[good]).unwrap();
        assert_eq!((recs[0].algo, recs[0].bytes, recs[0].crowded), (Algorithm::Ring, 8, false));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
