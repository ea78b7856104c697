//! `xccl demo`: launches local ranks as processes, runs and checks every collective over
//! TCP, and prints a table. The quickest way to see that a machine can run xccl.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use xccl::{Communicator, ReduceOp};

use crate::bench::{self, BenchArgs, Coll};
use crate::run::{self, Job, Prefixed};

/// Arguments of `xccl demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Ranks to launch.
    #[arg(short = 'n', long, default_value_t = 4)]
    pub nproc: usize,
    /// Bytes per rank in each collective.
    #[arg(long, default_value = "1M", value_parser = |s: &str| xccl::parse_bytes("size", s, 8, 1 << 30).map_err(|e| e.to_string()))]
    pub bytes: usize,
    /// Run as one rank of an already launched demo (used by the demo itself).
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// Runs `xccl demo`.
pub fn run(args: &DemoArgs) -> ExitCode {
    if !args.worker {
        let exe = match std::env::current_exe() {
            Ok(e) => e.to_string_lossy().into_owned(),
            Err(e) => {
                eprintln!("xccl demo: cannot find this program: {e}");
                return ExitCode::from(2);
            }
        };
        let command = vec![exe, "demo".into(), "--worker".into(), "--bytes".into(), args.bytes.to_string()];
        return run::launch(
            &Job::local("xccl demo", args.nproc, command),
            Arc::new(Prefixed::new(args.nproc)),
        );
    }
    match worker(args.bytes) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("xccl demo: {e}");
            ExitCode::from(1)
        }
    }
}

fn worker(bytes: usize) -> xccl::Result<bool> {
    let c = Communicator::from_env()?;
    let (n, r) = (c.size(), c.rank());
    if r == 0 {
        println!(
            "xccl demo: {n} ranks (processes) over TCP, {bytes} bytes of f32 per rank, every result checked"
        );
        println!(
            "{:<16} {:>10} {:>12} {:>12} {:>8}",
            "collective", "bytes", "time (us)", "busbw (GB/s)", "check"
        );
    }
    let mut all_ok = true;
    let mut report = |name: &str, bytes: usize, secs: f64, busbw: f64, wrong: usize| -> xccl::Result<()> {
        let mut total = [wrong as u64];
        c.all_reduce(&mut total, ReduceOp::Sum)?;
        all_ok &= total[0] == 0;
        if r == 0 {
            let verdict = if total[0] == 0 { "ok".to_string() } else { format!("{} wrong", total[0]) };
            println!("{name:<16} {bytes:>10} {:>12.1} {busbw:>12.3} {verdict:>8}", secs * 1e6);
        }
        Ok(())
    };
    for coll in Coll::all() {
        let args = BenchArgs {
            min: bytes,
            max: bytes,
            sizes: vec![bytes],
            iters: Some(5),
            warmup: 1,
            root: n - 1,
            ..BenchArgs::timed(coll, 0.1)
        };
        let mut k = bench::case::<f32>(&c, &args, bytes)?;
        bench::run_once(&c, &args, &mut k)?;
        let mut wrong = bench::wrong(&k);
        c.barrier()?;
        let t0 = Instant::now();
        for _ in 0..5 {
            bench::run_once(&c, &args, &mut k)?;
        }
        let secs = t0.elapsed().as_secs_f64() / 5.0;
        wrong += bench::wrong(&k);
        let real = k.count * 4;
        report(&coll.name(), real, secs, real as f64 / secs / 1e9 * coll.kind.bus_factor(n), wrong)?;
    }

    // The uneven variants the benchmark does not measure.
    let counts: Vec<usize> = (0..n).map(|k| 1000 + 17 * k).collect();
    let mine = vec![r as f32; counts[r]];
    let mut out = vec![0f32; counts.iter().sum()];
    let t0 = Instant::now();
    c.all_gather_v(&mine, &mut out, &counts)?;
    let secs = t0.elapsed().as_secs_f64();
    let want = counts.iter().enumerate().flat_map(|(k, &m)| std::iter::repeat_n(k as f32, m));
    let wrong = out.iter().zip(want).filter(|(a, b)| *a != b).count();
    report("all_gather_v", out.len() * 4, secs, 0.0, wrong)?;

    let send: Vec<usize> = (0..n).map(|d| (r + d) % 3 * 100).collect();
    let recv: Vec<usize> = (0..n).map(|s| (s + r) % 3 * 100).collect();
    let input: Vec<f32> = (0..n).flat_map(|d| std::iter::repeat_n((r * 10 + d) as f32, send[d])).collect();
    let mut out = vec![0f32; recv.iter().sum()];
    let t0 = Instant::now();
    c.all_to_all_v(&input, &send, &mut out, &recv)?;
    let secs = t0.elapsed().as_secs_f64();
    let want = (0..n).flat_map(|s| std::iter::repeat_n((s * 10 + r) as f32, recv[s]));
    let wrong = out.iter().zip(want).filter(|(a, b)| *a != b).count();
    report("all_to_all_v", input.len() * 4, secs, 0.0, wrong)?;
    if r == 0 {
        println!("{}", if all_ok { "all collectives correct" } else { "SOME RESULTS WERE WRONG" });
    }
    Ok(all_ok)
}
