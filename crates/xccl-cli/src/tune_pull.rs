//! `xccl tune pull`: from which length this machine should pull messages.
//!
//! Between processes of one host a message either streams, copied twice through the
//! shared-memory ring, or is pulled, copied once by the receiver straight out of the
//! sender's memory (`process_vm_readv`, which pins the pages it reads). Which costs less
//! is the machine's: on an Intel Xeon guest a 32 KiB message of a 2-rank all-gather took 3.4
//! µs pulled against 4.9 streamed; on an AMD EPYC guest a 2-rank 1 MiB all-reduce took 74-86
//! µs streamed against 140-205 pulled, and pulls only came out ahead from 4-16 MiB
//! (docs/PERFORMANCE.md). The built-in thresholds (`protocol::PullMin::built_in`) depend on
//! the processor's maker for that reason; this measures the machine itself.
//!
//! Under `xccl run` (or with `--local N`), this times three cases at every length of
//! `--lengths`, once never pulling and once always, `--reps` times in turns: a ring
//! reduce-scatter (messages the receiver combines), a ring all-gather and a direct
//! all-to-all (messages it only places), each message carrying the collective's size over
//! the ranks. Per length and way it takes the median repetition: the fastest favoured
//! streaming, whose windows scatter more (it needs sender and receiver on a core at once),
//! and picked thresholds under which 2 MiB messages then ran 1.4-1.7x slower than pulled in
//! every later comparison; the threshold is the one that costs least over every length and
//! case measured,
//! each counted relative to its faster way, where the ways tie within 10% the built-in
//! threshold's choice standing (`off`: never pull). Rank 0 prints the table and
//! the tuning file's `pull` line for hosts of that many ranks (`pull C P ranks=N`), and with
//! `-o FILE` puts that line into FILE (replacing the line for the same count there, keeping
//! the rest: a file may hold a line per count), for `XCCL_TUNE_FILE`. Run it with as many ranks per
//! host as the jobs it tunes for: on a host with more ranks than cores, streaming waits for
//! sender and receiver to share a core, and the answer differs. A job whose ranks span
//! hosts, or talk TCP (`XCCL_SHM=0`), is refused on every rank before anything is timed.

use std::fmt::Write as _;
use std::path::PathBuf;

use xccl::algo::Algorithm;
use xccl::algo::tune::{CostModel, LinkClass, PullLine};
use xccl::protocol::{CpuVendor, PullMin, PullSetting};
use xccl::{CollKind, Communicator};

use crate::bench::{self, BenchArgs, Coll};

/// Arguments of `xccl tune pull`.
#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// Message lengths in bytes (each collective moves this many per rank).
    #[arg(long, value_delimiter = ',', default_value = "16K,32K,64K,128K,256K,512K,1M,2M,4M,8M,16M")]
    lengths: Vec<String>,
    /// Seconds each timed loop should last.
    #[arg(long, default_value_t = 0.1)]
    target_sec: f64,
    /// Measurements of each case, taken in turns over the lengths and both ways; the median
    /// counts.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Run this many ranks as threads of this process instead of joining a launched job
    /// (threads pull with plain copies, not as processes do: for trying the command).
    #[arg(long)]
    local: Option<usize>,
    /// Put the `pull` line into this tuning file (created if absent).
    #[arg(short, long)]
    out: Option<PathBuf>,
}

/// Runs `xccl tune pull`.
pub fn run(args: &PullArgs) -> xccl::Result<()> {
    let lengths = args
        .lengths
        .iter()
        .map(|s| xccl::parse_bytes("--lengths", s, 1, 1 << 30))
        .collect::<xccl::Result<Vec<_>>>()?;
    if lengths.is_empty() || lengths.windows(2).any(|w| w[0] >= w[1]) {
        return Err(xccl::Error::Config("--lengths: give increasing byte counts, e.g. 64K,1M,16M".into()));
    }
    if !(args.target_sec.is_finite() && args.target_sec > 0.0) || args.reps == 0 {
        return Err(xccl::Error::Config("--target-sec and --reps must be positive".into()));
    }
    bench::on_ranks(args.local, xccl::Config::from_env()?, |c| measure_rank(c, args, &lengths))
}

/// One case measured: a collective and the algorithm forced on it (each of its messages then
/// carries the collective's size over the ranks).
struct Case {
    kind: CollKind,
    algo: Algorithm,
    /// Its receivers combine what they receive.
    combines: bool,
}

/// The placed messages are measured twice: one a step (the ring) and to every peer at once
/// (all-to-all's direct exchange, where a rank that pulls need not wait for its senders'
/// turns on crowded cores).
const CASES: [Case; 3] = [
    Case { kind: CollKind::ReduceScatter, algo: Algorithm::Ring, combines: true },
    Case { kind: CollKind::AllGather, algo: Algorithm::Ring, combines: false },
    Case { kind: CollKind::AllToAll, algo: Algorithm::Direct, combines: false },
];

fn measure_rank(c: &Communicator, args: &PullArgs, lengths: &[usize]) -> xccl::Result<()> {
    let n = c.size();
    if n < 2 {
        return Err(xccl::Error::Config(
            "xccl tune pull measures messages between ranks: run it under `xccl run -n 2` (or more), or with --local 2"
                .into(),
        ));
    }
    // Known on every rank before anything is sent: the placement is the bootstrap's.
    let place = c.placement();
    let hosts = place.hosts.iter().collect::<std::collections::BTreeSet<_>>().len();
    if hosts > 1 {
        return Err(xccl::Error::Config(format!(
            "xccl tune pull measures shared memory between the ranks of one host, and this job's {n} ranks \
             are on {hosts} hosts: run it on one host (`xccl run -n R` there, R as many ranks as the jobs \
             it tunes put on a host) and give the file to every host of the same kind"
        )));
    }
    if place.intra == LinkClass::Tcp {
        return Err(xccl::Error::Config(
            "xccl tune pull measures shared memory, and XCCL_SHM=0 has these ranks talk over TCP, \
             which never pulls: unset XCCL_SHM"
                .into(),
        ));
    }
    // Per case, two communicators forced to its algorithm: never pulling, and always.
    let mut comms = Vec::new();
    for case in &CASES {
        let mut pair = Vec::new();
        for pull in [usize::MAX, 1] {
            let mut config = c.config().clone();
            config.algos.set(case.kind, case.algo)?;
            config.pull = PullSetting::exactly(PullMin { combining: pull, plain: pull });
            pair.push(c.dup_with(config)?);
        }
        comms.push(pair);
    }
    // times[case][way][length]: each repetition's seconds.
    let mut times = vec![vec![vec![Vec::new(); lengths.len()]; 2]; CASES.len()];
    for _ in 0..args.reps {
        for (k, case) in CASES.iter().enumerate() {
            let kind = case.kind;
            let bargs = BenchArgs::timed(Coll { kind, uneven: false }, args.target_sec);
            for (i, &len) in lengths.iter().enumerate() {
                for (way, comm) in comms[k].iter().enumerate() {
                    let (row, _) = bench::measure::<f32>(comm, &bargs, len * n)?;
                    if row.wrong > 0 {
                        return Err(xccl::Error::Internal(format!(
                            "{kind} of {len} B a rank: {} wrong values",
                            row.wrong
                        )));
                    }
                    times[k][way][i].push(row.tavg);
                }
            }
        }
    }
    if c.rank() != 0 {
        return Ok(());
    }
    // Per case: (streamed, pulled), the median repetition at each length.
    let typical: Vec<(Vec<f64>, Vec<f64>)> = times
        .iter()
        .map(|ways| {
            let best = |w: &Vec<Vec<f64>>| w.iter().map(|r| bench::median(&mut r.clone())).collect();
            (best(&ways[0]), best(&ways[1]))
        })
        .collect();
    let mut table = format!(
        "# xccl tune pull: {n} ranks, the median of {} repetitions (µs), streamed / pulled\n",
        args.reps
    );
    let _ = write!(table, "# {:>10}", "length");
    for case in &CASES {
        let _ = write!(table, " {:>24}", format!("{}/{}", case.kind.name(), case.algo));
    }
    table.push('\n');
    for (i, &len) in lengths.iter().enumerate() {
        let _ = write!(table, "  {len:>10}");
        for (s, p) in &typical {
            let _ = write!(table, " {:>11.2} / {:>10.2}", s[i] * 1e6, p[i] * 1e6);
        }
        table.push('\n');
    }
    let series = |combining: bool| -> Vec<(&[f64], &[f64])> {
        CASES
            .iter()
            .zip(&typical)
            .filter(|(case, _)| case.combines == combining)
            .map(|(_, (s, p))| (s.as_slice(), p.as_slice()))
            .collect()
    };
    // What a job of these ranks pulls from without a tuning file: every rank is on this host
    // (checked above), as processes or as threads (`--local`, whose pulls are copies).
    let built_in = if place.intra == LinkClass::Local {
        PullMin::default()
    } else {
        PullMin::built_in(CpuVendor::this(), c.size())
    };
    let pull = PullMin {
        combining: threshold(lengths, &series(true), built_in.combining),
        plain: threshold(lengths, &series(false), built_in.plain),
    };
    // The line holds for hosts of as many ranks as this job puts on its one.
    let line = CostModel::pull_line(PullLine { ranks: Some(n), min: pull });
    eprint!("{table}");
    println!("{line}");
    if let Some(path) = &args.out {
        let old = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(xccl::Error::io(format!("reading {}", path.display()), e)),
        };
        let text = with_pull_line(&old, &line, n);
        // The file must still read as a tuning file (its other lines untouched).
        CostModel::default().with_text(&path.display().to_string(), &text)?;
        std::fs::write(path, text).map_err(|e| xccl::Error::io(format!("writing {}", path.display()), e))?;
        eprintln!("# written to {} (XCCL_TUNE_FILE={} uses it)", path.display(), path.display());
    }
    Ok(())
}

/// Two ways within this fraction of each other at a length are a tie: on a noisy machine the
/// median window of either can land on either side of the other.
const TIE: f64 = 0.10;

/// The threshold among `lengths` (increasing, or `usize::MAX`: never pull) whose choice
/// costs least over the lengths and cases measured (`series`: per case, streamed and pulled
/// seconds at each length): each length of each case counts the time of the way the
/// threshold picks for it over the faster way's, so that every length weighs alike and one
/// noisy length moves the threshold only as far as it is worth. Where the two ways tie
/// ([`TIE`]) the way `built_in` (the threshold without a measurement) picks costs nothing
/// and the other a trifle: the measurement moves the threshold only where it shows a
/// difference. Equal costs go to the longer threshold (a stream pins no pages).
fn threshold(lengths: &[usize], series: &[(&[f64], &[f64])], built_in: usize) -> usize {
    let cost = |from: usize| -> f64 {
        series
            .iter()
            .flat_map(|(stream, pull)| {
                (0..lengths.len()).map(move |i| {
                    let (s, p, pulls) = (stream[i], pull[i], lengths[i] >= from);
                    if (s - p).abs() <= TIE * s.min(p) {
                        if pulls == (lengths[i] >= built_in) { 1.0 } else { 1.0 + 1e-3 }
                    } else {
                        (if pulls { p } else { s }) / s.min(p)
                    }
                })
            })
            .sum()
    };
    let mut best = (cost(usize::MAX), usize::MAX);
    for &from in lengths.iter().rev() {
        let c = cost(from);
        if c < best.0 {
            best = (c, from);
        }
    }
    best.1
}

/// `text` (a tuning file) with its `pull` line for hosts of `ranks` ranks replaced by `line`,
/// at the end; the lines for other counts, or for any, stay.
fn with_pull_line(text: &str, line: &str, ranks: usize) -> String {
    let count = format!("ranks={ranks}");
    let mut out: String = text
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split('#').next().unwrap_or("").split_whitespace().collect();
            !(f.first() == Some(&"pull") && f.get(3) == Some(&count.as_str()))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    out += line;
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_costs_least_over_the_lengths_and_cases_measured() {
        let lens = [16, 32, 64, 128];
        let one = |s: &'static [f64], p: &'static [f64]| vec![(s, p)];
        // No built-in preference (it would pull from beyond every length measured).
        let none = usize::MAX;
        // Pulling loses at 16 and 32 and wins from 64 on: from 64.
        assert_eq!(threshold(&lens, &one(&[1.0; 4], &[2.0, 1.5, 0.8, 0.5]), none), 64);
        // One noisy length (64 loses by 20%) is not worth pulling 32 and 128 later.
        assert_eq!(threshold(&lens, &one(&[1.0; 4], &[2.0, 1.5, 1.2, 0.5]), none), 128);
        // Wins everywhere: from the shortest measured; loses everywhere: never.
        assert_eq!(threshold(&lens, &one(&[2.0; 4], &[1.0; 4]), none), 16);
        assert_eq!(threshold(&lens, &one(&[1.0; 4], &[1.5; 4]), none), usize::MAX);
        // Two cases: one pulls best from 64, the other from 32 with a larger gain there.
        let two: Vec<(&[f64], &[f64])> =
            vec![(&[1.0; 4], &[2.0, 1.2, 0.8, 0.8]), (&[1.0; 4], &[2.0, 0.5, 0.5, 0.5])];
        assert_eq!(threshold(&lens, &two, none), 32);
    }

    #[test]
    fn where_the_ways_tie_the_built_in_threshold_stands() {
        let lens = [16, 32, 64, 128];
        let s: &[f64] = &[1.0; 4];
        // Streaming clearly ahead at 16, ties (within 10%) from 32 on: the built-in 32 stands,
        // and so would a built-in 128; a built-in 16 gives way to what 16 shows.
        let p: &[f64] = &[1.5, 1.05, 0.95, 1.08];
        assert_eq!(threshold(&lens, &[(s, p)], 32), 32);
        assert_eq!(threshold(&lens, &[(s, p)], 128), 128);
        assert_eq!(threshold(&lens, &[(s, p)], 16), 32);
        // Everything tied: the built-in, or never where it is beyond every length.
        assert_eq!(threshold(&lens, &[(s, &[1.02; 4])], 64), 64);
        assert_eq!(threshold(&lens, &[(s, &[1.02; 4])], usize::MAX), usize::MAX);
    }

    #[test]
    fn the_pull_line_replaces_the_files_own_for_its_count_and_reads_back() {
        let min = PullMin { combining: 4 << 20, plain: usize::MAX };
        let line = CostModel::pull_line(PullLine { ranks: Some(2), min });
        assert_eq!(line, "pull 4194304 off ranks=2");
        // Its count's line goes; the line for any count and the one for 4 ranks stay.
        let old = "link shm 1 2 3 4\npull 1 1 ranks=2\npull 8K 8K\npull 2 2 ranks=4 # other\n# note\n";
        let text = with_pull_line(old, &line, 2);
        assert_eq!(
            text,
            "link shm 1 2 3 4\npull 8K 8K\npull 2 2 ranks=4 # other\n# note\npull 4194304 off ranks=2\n"
        );
        let m = CostModel::default().with_text("t", &text).unwrap();
        assert_eq!(m.pull_for(2), Some(min));
        assert_eq!(m.pull_for(4), Some(PullMin { combining: 2, plain: 2 }));
        assert_eq!(m.pull_for(3), Some(PullMin { combining: 8 << 10, plain: 8 << 10 }));
        assert_eq!(with_pull_line("", "pull off off ranks=2", 2), "pull off off ranks=2\n");
    }
}
