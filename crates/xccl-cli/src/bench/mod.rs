//! `xccl bench`: nccl-tests-style measurements of one collective over a range of sizes.
//!
//! Methodology (the same as the peer harnesses in `shared/bench/peers`): per size, one
//! untimed run on fresh data whose exact result is known and checked element by element;
//! warm-up runs; then timed back-to-back runs between two barriers, their number chosen by
//! rank 0 so the loop lasts about `--target-sec` unless `-n` fixes it; the result is checked
//! again after the loop. `time` is the per-run time averaged over ranks, `tmax` the slowest
//! rank's. Buffers are out of place (in place for broadcast), freshly allocated per size, on
//! the heap or (`--huge-pages`) on 2 MiB pages.

use std::time::{Duration, Instant};

use xccl::algo::{Algorithm, Shape};
use xccl::protocol::{Protocol, ProtocolPolicy};
use xccl::{CollKind, Communicator, Config, DType, Element, ReduceOp, bf16, f16};

mod case;

use case::{Case, wrong_count};
pub(crate) use case::{case, run_once, wrong};

/// `--max-iters`' default.
pub(crate) const MAX_ITERS: u64 = 20_000;

/// The operation to measure: a collective ([`CollKind`]; `reduce_scatter_v` is its uneven
/// variant, rank k's block 1 + k % 3 parts of the per-rank input) or, as `sendrecv`
/// ([`CollKind::SendRecv`]), a message to the next rank around a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coll {
    /// The operation.
    pub kind: CollKind,
    /// The uneven variant (`reduce_scatter_v`).
    pub uneven: bool,
}

impl Coll {
    /// Every operation the benchmark knows: the collectives, the uneven reduce-scatter, and
    /// point-to-point messages.
    pub fn all() -> Vec<Coll> {
        let mut all: Vec<Coll> =
            CollKind::COLLECTIVES.into_iter().map(|kind| Coll { kind, uneven: false }).collect();
        all.push(Coll { kind: CollKind::ReduceScatter, uneven: true });
        all.push(Coll { kind: CollKind::SendRecv, uneven: false });
        all
    }

    /// The operation called `s`: a collective's name as [`CollKind::named`] takes it,
    /// nccl-tests' (`allreduce`, `bcast`), `reduce_scatter_v` or `sendrecv`.
    pub fn parse(s: &str) -> Result<Coll, String> {
        let norm = s.trim().replace('_', "").to_ascii_lowercase();
        let (kind, uneven) = match norm.as_str() {
            "sendrecv" => (Some(CollKind::SendRecv), false),
            "bcast" => (Some(CollKind::Broadcast), false),
            "reducescatterv" => (Some(CollKind::ReduceScatter), true),
            _ => (CollKind::named(&norm), false),
        };
        kind.map(|kind| Coll { kind, uneven }).ok_or_else(|| {
            let names: Vec<String> = Coll::all().iter().map(|c| c.to_string()).collect();
            format!("`{s}` is not an operation xccl bench measures; one of: {}", names.join(", "))
        })
    }

    /// The name nccl-tests uses (`allreduce`, `bcast`, ...), which the peer harnesses and
    /// `summarize_shm.py` read.
    pub fn name(self) -> String {
        match (self.kind, self.uneven) {
            (CollKind::Broadcast, _) => "bcast".into(),
            (CollKind::SendRecv, _) => "sendrecv".into(),
            (CollKind::ReduceScatter, true) => "reduce_scatter_v".into(),
            (CollKind::ReduceScatter, false) => "reduce_scatter".into(),
            (kind, _) => kind.name().replace('_', ""),
        }
    }

    fn rooted(self) -> bool {
        self.kind.one_way() || self.kind == CollKind::Reduce
    }

    /// The collective whose algorithms run it (none for point-to-point messages).
    pub(crate) fn collective(self) -> Option<CollKind> {
        (self.kind != CollKind::SendRecv).then_some(self.kind)
    }
}

impl std::fmt::Display for Coll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.kind, self.uneven) {
            (CollKind::SendRecv, _) => f.write_str("sendrecv"),
            (kind, true) => write!(f, "{kind}_v"),
            (kind, false) => write!(f, "{kind}"),
        }
    }
}

/// Arguments of `xccl bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The operation: all_reduce, all_gather, reduce_scatter, reduce_scatter_v, broadcast,
    /// reduce, all_to_all, scatter, gather, barrier (one row: sizes do not apply) or sendrecv.
    #[arg(value_parser = Coll::parse)]
    pub coll: Coll,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    pub max: usize,
    /// Multiply the size by this much each step.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: usize,
    /// Exact list of sizes (e.g. `8,1K,1M,64M`), instead of -b/-e/-f.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// Timed runs per size (default: as many as fit in --target-sec at the rate measured
    /// after the warm-up, 3 to --max-iters).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<usize>,
    /// The most timed runs --target-sec sets (the peers' harnesses stop at 20000 too: at 0.5
    /// µs an operation that is 10 ms, which the machine's noise fills; raise it to time small
    /// sizes for --target-sec).
    #[arg(long, default_value_t = MAX_ITERS, value_parser = clap::value_parser!(u64).range(3..))]
    pub max_iters: u64,
    /// Untimed warm-up runs per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Seconds the timed loop should last when -n is not given.
    #[arg(long, default_value_t = 0.3)]
    pub target_sec: f64,
    /// Element type.
    #[arg(short = 'd', long = "datatype", default_value = "f32")]
    pub dtype: DType,
    /// Reduction.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: ReduceOp,
    /// Root of rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Run this many ranks as threads of this process instead of joining a launched job.
    #[arg(long)]
    pub local: Option<usize>,
    /// Print rows in the peer harnesses' format (no root column) for `summarize.py`.
    #[arg(long)]
    pub peer_format: bool,
    /// Buffers on 2 MiB pages (`xccl::HostBuffer`), which large messages between processes
    /// of one host copy much faster from; by default, ordinary heap memory (`Vec`).
    #[arg(long, conflicts_with = "page_offsets")]
    pub huge_pages: bool,
    /// Place the input at an address `IN` bytes past a 4 KiB boundary and the output `OUT`
    /// bytes past one (`--page-offsets IN[,OUT]`; `OUT` is `IN` when left out; each a
    /// multiple of the element size below 4096), as Open MPI's harness's `-p` places both
    /// its buffers; by default wherever the heap puts them. Copies between buffers a few
    /// bytes apart modulo 4 KiB are the slow case of `rep movsb` (docs/PERFORMANCE.md).
    #[arg(long, value_parser = parse_page_offsets)]
    pub page_offsets: Option<(usize, usize)>,
    /// Run in place (one buffer for input and output), as PyTorch's API does; results are
    /// checked on the first run only, since every run changes the data.
    #[arg(long)]
    pub inplace: bool,
    /// Check the result after every timed run, not only after the loop (slow: for fault
    /// campaigns, where a run that returns must never return wrong data).
    #[arg(long)]
    pub check_every: bool,
    /// Run this algorithm instead of the tuner's pick (`xccl verify` lists the names).
    #[arg(long, conflicts_with = "every_algo")]
    pub algo: Option<Algorithm>,
    /// Run every algorithm of the collective at each size, with the tuner's predicted time
    /// beside the measured one; `*` marks the tuner's pick.
    #[arg(long)]
    pub every_algo: bool,
    /// The protocols allowed, as `XCCL_PROTO` takes them (`stream`, `ll,eager`, ...).
    #[arg(long, conflicts_with = "every_proto")]
    pub proto: Option<String>,
    /// Also run each protocol on its own (`algo/proto` rows; `auto` lets the executor
    /// choose per message, as it does by default); with `--every-algo`, for every algorithm.
    #[arg(long)]
    pub every_proto: bool,
    /// Keep the processor busy this many µs before each timed run, as a training step
    /// computes between its collectives; the time reported is the collectives' alone. With
    /// more busy ranks than cores, it measures what an operation waits for its ranks' turns.
    #[arg(long, default_value_t = 0.0)]
    pub compute_us: f64,
}

impl BenchArgs {
    /// `coll` in f32 sums, out of place, root 0, each size timed for `target_sec` after three
    /// warm-up runs, the tuner's algorithm and protocols: the arguments other commands time
    /// collectives with (`xccl tune`, `xccl demo`), changed where they need.
    pub fn timed(coll: Coll, target_sec: f64) -> BenchArgs {
        BenchArgs {
            coll,
            min: 1,
            max: 1,
            factor: 2,
            sizes: Vec::new(),
            iters: None,
            warmup: 3,
            target_sec,
            max_iters: MAX_ITERS,
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
            page_offsets: None,
            compute_us: 0.0,
        }
    }
}

/// Runs `rank` with `config` on this process's rank of the launched job, or on `local`
/// ranks as threads of this process: how `xccl tune`'s measurements join their ranks.
pub(crate) fn on_ranks(
    local: Option<usize>,
    config: Config,
    rank: impl Fn(&Communicator) -> xccl::Result<()> + Sync,
) -> xccl::Result<()> {
    match local {
        Some(n) => {
            let comms = Communicator::local_with(n, config)?;
            std::thread::scope(|s| {
                let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| rank(c))).collect();
                hs.into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| Err(xccl::Error::Internal("a rank panicked".into())))
                    })
                    .collect::<xccl::Result<Vec<_>>>()
            })?;
            Ok(())
        }
        None => rank(&Communicator::connect(&xccl::bootstrap::Rendezvous::from_env()?, config)?),
    }
}

/// The median of `v` (reordered); 0 when empty.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// `--page-offsets IN[,OUT]`: the input's and the output's bytes past a 4 KiB boundary.
fn parse_page_offsets(s: &str) -> Result<(usize, usize), String> {
    let parse = |v: &str| -> Result<usize, String> {
        let n: usize = v.trim().parse().map_err(|_| format!("{v:?} is not a number of bytes"))?;
        if n >= 4096 {
            return Err(format!("{n} is past the 4 KiB page it places a buffer in (0 to 4095)"));
        }
        Ok(n)
    };
    match s.split(',').collect::<Vec<_>>()[..] {
        [both] => parse(both).map(|n| (n, n)),
        [input, output] => Ok((parse(input)?, parse(output)?)),
        _ => Err(format!("{s:?}: expected IN or IN,OUT (bytes past a 4 KiB boundary)")),
    }
}

pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    xccl::parse_bytes("size", s, 0, usize::MAX).map_err(|e| e.to_string())
}

/// Runs `xccl bench`.
pub fn run(args: &BenchArgs) -> xccl::Result<()> {
    if args.inplace && args.coll.kind != CollKind::AllReduce {
        return Err(xccl::Error::Config(
            "--inplace applies to all_reduce (broadcast is always in place)".into(),
        ));
    }
    if !(args.compute_us.is_finite() && (0.0..=1e7).contains(&args.compute_us)) {
        return Err(xccl::Error::Config(format!(
            "--compute-us {}: µs of computing between runs, from 0 to 10000000",
            args.compute_us
        )));
    }
    let mut config = Config::from_env()?;
    if let Some(spec) = &args.proto {
        config.protocols = ProtocolPolicy::parse(spec)?;
    }
    if let Some(algo) = args.algo {
        let kind = args
            .coll
            .collective()
            .ok_or_else(|| xccl::Error::Config("--algo does not apply to sendrecv".into()))?;
        config.algos.set(kind, algo)?;
    }
    match args.local {
        Some(n) => {
            let comms = Communicator::local_with(n, config)?;
            std::thread::scope(|s| {
                let hs: Vec<_> =
                    comms.iter().map(|c| s.spawn(move || bench_rank(c, args, "local"))).collect();
                hs.into_iter()
                    .map(|h| h.join().expect("bench rank panicked"))
                    .collect::<xccl::Result<Vec<_>>>()
            })?;
            Ok(())
        }
        None => {
            // Under a launcher; with XCCL_BACKEND=mpi, on the MPI library.
            let comm = Communicator::from_env_with(config.clone())?;
            let transport = match comm.backend() {
                "native" if config.shm => "shm+tcp",
                "native" => "tcp",
                other => other,
            };
            if transport == "mpi"
                && (args.algo.is_some() || args.every_algo || args.proto.is_some() || args.every_proto)
            {
                return Err(xccl::Error::Config(
                    "--algo, --every-algo, --proto and --every-proto choose xccl's algorithms and protocols; \
                     the MPI backend runs MPI's"
                        .into(),
                ));
            }
            bench_rank(&comm, args, transport)
        }
    }
}

fn sizes(args: &BenchArgs) -> Vec<usize> {
    if args.coll.kind == CollKind::Barrier {
        return vec![0];
    }
    if !args.sizes.is_empty() {
        return args.sizes.clone();
    }
    let mut v = Vec::new();
    let mut s = args.min.max(1);
    while s <= args.max {
        v.push(s);
        s = s.saturating_mul(args.factor.max(2));
    }
    v
}

fn bench_rank(c: &Communicator, args: &BenchArgs, transport: &str) -> xccl::Result<()> {
    macro_rules! typed {
        ($($d:ident => $t:ty),*) => { match args.dtype { $(DType::$d => bench_typed::<$t>(c, args, transport),)* } };
    }
    typed!(F32 => f32, F64 => f64, F16 => f16, BF16 => bf16, I8 => i8, I32 => i32, I64 => i64, U8 => u8, U32 => u32, U64 => u64)
}

/// One measured size.
pub(crate) struct Row {
    /// Bytes as nccl-tests counts them.
    real: usize,
    count: usize,
    /// Mean over ranks, seconds per operation.
    pub tavg: f64,
    /// The slowest rank's seconds per operation.
    tmax: f64,
    algbw: f64,
    busbw: f64,
    /// Wrong elements, over all ranks.
    pub wrong: usize,
    iters: usize,
}

/// Measures one size on `c`: a checked run, the warm-up, the number of runs (`-n`, or
/// [`calibrate`]d to fill `--target-sec`), the timed runs, and the result checked again. Also
/// returns the layout each rank passed.
pub(crate) fn measure<T: Element>(
    c: &Communicator,
    args: &BenchArgs,
    bytes: usize,
) -> xccl::Result<(Row, Shape)> {
    let n = c.size();
    let mut k = case::<T>(c, args, bytes)?;
    let mut bad = wrong_count(c, args, &mut k)?;
    for _ in 0..args.warmup.max(1) {
        run_once(c, args, &mut k)?;
    }
    let iters = match args.iters {
        Some(iters) => iters.max(1),
        None => calibrate(c, args, &mut k)?,
    };
    c.barrier()?;
    let compute = Duration::from_secs_f64(args.compute_us * 1e-6);
    let (t0, mut computing) = (Instant::now(), Duration::ZERO);
    for i in 0..iters {
        if !compute.is_zero() {
            let start = Instant::now();
            while start.elapsed() < compute {
                std::hint::spin_loop();
            }
            computing += start.elapsed();
        }
        run_once(c, args, &mut k)?;
        if args.check_every && !args.inplace {
            let w = wrong(&k);
            if w > 0 {
                return Err(xccl::Error::Internal(format!("run {i} returned {w} wrong values")));
            }
        }
    }
    let dt = t0.elapsed().saturating_sub(computing).as_secs_f64() / iters as f64;
    c.barrier()?;
    if !args.inplace {
        bad += wrong(&k);
    }
    let mut sums = [dt, bad as f64];
    c.all_reduce(&mut sums, ReduceOp::Sum)?;
    let mut tmax = [dt];
    c.all_reduce(&mut tmax, ReduceOp::Max)?;
    let tavg = sums[0] / n as f64;
    let real = k.count * size_of::<T>();
    let algbw = real as f64 / tavg / 1e9;
    let row = Row {
        real,
        count: k.count,
        tavg,
        tmax: tmax[0],
        algbw,
        busbw: algbw * args.coll.kind.bus_factor(n),
        wrong: sums[1] as usize,
        iters,
    };
    Ok((row, k.shape))
}

/// The number of timed runs that lasts `--target-sec` at the rate this job runs at now:
/// batches of runs doubling in length until one lasts a tenth of that (rank 0's clock
/// decides for all), so that the first runs after start-up, which may be slower by far
/// (ranks still being placed on cores, pages still being touched), do not set it. A count
/// set from them gave a window of a few milliseconds that a start-up transient filled.
fn calibrate<T: Element>(c: &Communicator, args: &BenchArgs, k: &mut Case<T>) -> xccl::Result<usize> {
    let mut batch = 1usize;
    loop {
        let t0 = Instant::now();
        for _ in 0..batch {
            run_once(c, args, k)?;
        }
        let mut per_run = [t0.elapsed().as_secs_f64() / batch as f64];
        c.broadcast(&mut per_run, 0)?;
        let most = usize::try_from(args.max_iters).unwrap_or(usize::MAX);
        if per_run[0] * batch as f64 >= args.target_sec / 10.0 || batch.saturating_mul(2) > most {
            return Ok((args.target_sec / per_run[0].max(1e-9)).clamp(3.0, most as f64) as usize);
        }
        batch *= 2;
    }
}

fn bench_typed<T: Element>(c: &Communicator, args: &BenchArgs, transport: &str) -> xccl::Result<()> {
    let (n, r) = (c.size(), c.rank());
    if args.coll.rooted() && args.root >= n {
        return Err(xccl::Error::Config(format!("--root {} is outside {n} ranks", args.root)));
    }
    let say = |s: String| {
        if r == 0 {
            println!("{s}");
        }
    };
    let redop = if args.coll.kind.combines() { args.op.name() } else { "none" };
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    say(format!(
        "# xccl bench: op={} nranks={n} transport={transport} dtype={} redop={redop} {} host_cpus={cores} oversubscribed={}",
        args.coll.name(),
        args.dtype,
        if args.inplace { "in-place" } else { "out-of-place" },
        if n > cores { "yes" } else { "no" }
    ));
    say("#".into());
    say(format!("# op={}  busbw factor={:.4}", args.coll.name(), args.coll.kind.bus_factor(n)));
    let root_col = if args.peer_format { String::new() } else { format!(" {:>5}", "root") };
    let pred_col = if args.every_algo { format!(" {:>10}", "pred(us)") } else { String::new() };
    say(format!(
        "# {:>12} {:>12} {:>6} {:>5}{root_col} {:>12} {:>11} {:>11} {:>6} {:>12} {:>6}  algo{pred_col}",
        "size(B)",
        "count",
        "type",
        "redop",
        "time(us)",
        "algbw(GB/s)",
        "busbw(GB/s)",
        "#wrong",
        "tmax(us)",
        "iters"
    ));
    // With --every-algo or --every-proto, one duplicate communicator per algorithm and
    // protocol, each forced to it.
    let kind = args.coll.collective();
    let sweep = args.every_algo || args.every_proto;
    let algos: Vec<Option<Algorithm>> = match (args.every_algo, kind) {
        (false, _) => vec![None],
        (true, None) => return Err(xccl::Error::Config("--every-algo does not apply to sendrecv".into())),
        (true, Some(kind)) => Algorithm::for_collective(kind)
            .iter()
            .filter(|a| a.supports(kind, n, &Shape::Count(1)))
            .map(|a| Some(*a))
            .collect(),
    };
    let protos: Vec<Option<Protocol>> = if args.every_proto {
        std::iter::once(None).chain(Protocol::ALL.into_iter().map(Some)).collect()
    } else {
        vec![None]
    };
    let mut forced = Vec::new();
    if sweep {
        for algo in &algos {
            for proto in &protos {
                let mut config = c.config().clone();
                if let (Some(algo), Some(kind)) = (algo, kind) {
                    config.algos.set(kind, *algo)?;
                }
                if let Some(p) = proto {
                    config.protocols = ProtocolPolicy::parse(p.name())?;
                }
                forced.push((*algo, *proto, c.dup_with(config)?));
            }
        }
    }
    let runs: Vec<(Option<Algorithm>, Option<Protocol>, &Communicator)> = if sweep {
        forced.iter().map(|(a, p, comm)| (*a, *p, comm)).collect()
    } else {
        vec![(None, None, c)]
    };
    let mut bus_sum = 0.0;
    let mut rows = 0usize;
    let mut wrong_total = 0usize;
    for bytes in sizes(args) {
        let mut measured = Vec::new();
        for (forced_algo, forced_proto, comm) in &runs {
            let (row, shape) = measure::<T>(comm, args, bytes)?;
            bus_sum += row.busbw;
            rows += 1;
            wrong_total += row.wrong;
            let (algo, pred) = match kind {
                Some(_) if c.backend() != "native" => (c.backend().to_string(), f64::NAN),
                Some(kind) => {
                    let choice = c.algorithm_for_shape(kind, &shape, args.dtype, args.root)?;
                    let algo = forced_algo.unwrap_or(choice.algo);
                    let pred = choice.ranking.iter().find(|(a, _)| *a == algo).map_or(f64::NAN, |p| p.1);
                    let mark = if args.every_algo && algo == choice.algo && forced_proto.is_none() {
                        "*"
                    } else {
                        ""
                    };
                    let proto = match (args.every_proto, forced_proto) {
                        (false, _) => String::new(),
                        (true, Some(p)) => format!("/{p}"),
                        (true, None) => "/auto".into(),
                    };
                    (format!("{algo}{proto}{mark}"), pred)
                }
                None => ("p2p".to_string(), f64::NAN),
            };
            let root = if args.coll.rooted() { args.root.to_string() } else { "-1".into() };
            let root_col = if args.peer_format { String::new() } else { format!(" {root:>5}") };
            let pred_col = if args.every_algo { format!(" {:>10.2}", pred * 1e6) } else { String::new() };
            say(format!(
                "  {:>12} {:>12} {:>6} {redop:>5}{root_col} {:>12.2} {:>11.3} {:>11.3} {:>6} {:>12.2} {:>6}  {algo}{pred_col}",
                row.real,
                row.count,
                args.dtype.name(),
                row.tavg * 1e6,
                row.algbw,
                row.busbw,
                row.wrong,
                row.tmax * 1e6,
                row.iters
            ));
            measured.push((algo, row.tavg));
        }
        if sweep
            && let (Some(best), Some(pick)) = (
                measured.iter().min_by(|a, b| a.1.total_cmp(&b.1)),
                measured.iter().find(|(a, _)| a.ends_with('*')),
            )
        {
            say(format!(
                "# tuner at {bytes} B: picked {} at {:.2} us, best {} at {:.2} us: {:.2}x the best",
                pick.0.trim_end_matches('*'),
                pick.1 * 1e6,
                best.0.trim_end_matches('*'),
                best.1 * 1e6,
                pick.1 / best.1
            ));
        }
    }
    say(format!("# Out of bounds values : {wrong_total} {}", if wrong_total == 0 { "OK" } else { "FAILED" }));
    say(format!("# Avg bus bandwidth    : {:.4}", if rows > 0 { bus_sum / rows as f64 } else { 0.0 }));
    if wrong_total > 0 {
        return Err(xccl::Error::Internal(format!("{wrong_total} wrong values")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_parses_back_from_its_names() {
        for coll in Coll::all() {
            assert_eq!(Coll::parse(&coll.to_string()), Ok(coll), "{coll}");
            assert_eq!(Coll::parse(&coll.name()), Ok(coll), "{}", coll.name());
        }
        assert_eq!(Coll::all().len(), CollKind::COLLECTIVES.len() + 2);
        let bcast = Coll { kind: CollKind::Broadcast, uneven: false };
        assert_eq!(Coll::parse("bcast"), Ok(bcast));
        assert_eq!(Coll::parse("AllReduce").map(|c| c.kind), Ok(CollKind::AllReduce));
        let e = Coll::parse("all_gather_v").unwrap_err();
        assert!(e.contains("`all_gather_v` is not") && e.contains("reduce_scatter_v, sendrecv"), "{e}");
    }
}
