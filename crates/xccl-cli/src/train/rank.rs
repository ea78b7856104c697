//! One rank of `xccl train`, started by `xccl train` itself (the hidden `--worker` flag) or
//! by any launcher: `xccl run`, torchrun, mpirun, srun. It checks that the launcher started
//! as many ranks as the mesh needs before it communicates, resumes from the job's last
//! checkpoint when it runs in a restarted attempt of the job, trains, and reports: as tagged
//! lines that `xccl train`'s own launcher renders, or as plain text (rank 0) under another.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use serde_json::{Value, json};
use xccl::Communicator;
use xccl::bootstrap::Rendezvous;
use xccl_train::dcp::{LATEST, Reader};
use xccl_train::metrics::StepStat;
use xccl_train::trainer::{Observer, train};

use super::{Progress, TAG, TrainArgs};

/// Makes rank R kill itself with SIGKILL once it has done S steps, in the first attempt of
/// a job only: `XCCL_FAULT_KILL_AT_STEP=R:S` (a real crash, for the tests of restarts).
pub const FAULT_KILL_AT_STEP: &str = "XCCL_FAULT_KILL_AT_STEP";

/// The launcher that started this process as one rank of a job, from the variables it sets;
/// `None` when none did (then `xccl train` launches its own ranks).
pub fn launcher() -> Option<&'static str> {
    let set = |k: &str| std::env::var_os(k).is_some();
    if set("XCCL_RANK") {
        Some("xccl run")
    } else if set("RANK") && set("WORLD_SIZE") {
        Some("torchrun")
    } else if set("OMPI_COMM_WORLD_SIZE") || set("PMI_SIZE") {
        Some("mpirun")
    } else if set("SLURM_STEP_ID") && set("SLURM_NTASKS") {
        Some("srun")
    } else {
        None
    }
}

/// A variable holding a number, `None` when it is not set.
fn number<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => {
            v.trim().parse().map(Some).map_err(|_| format!("{name}='{v}' is not a non-negative integer"))
        }
    }
}

/// Which attempt of the job this is (0: the first), as `xccl run` and torchrun tell it.
fn restart_count() -> Result<u32, String> {
    Ok(number("XCCL_RESTART_COUNT")?.or(number("TORCHELASTIC_RESTART_COUNT")?).unwrap_or(0))
}

/// The id of the job, the same in all its attempts, when it may be restarted
/// (`TORCHELASTIC_MAX_RESTARTS` > 0): its checkpoints carry it, so that a restarted attempt
/// tells them from an earlier job's. A job that is not restarted leaves it out, and its
/// checkpoints' bytes are the same from one run to the next.
fn restartable_job_id() -> Result<Option<String>, String> {
    if number::<u32>("TORCHELASTIC_MAX_RESTARTS")?.unwrap_or(0) == 0 {
        return Ok(None);
    }
    Ok(["XCCL_JOB_ID", "TORCHELASTIC_RUN_ID"].iter().find_map(|k| std::env::var(k).ok()))
}

/// The rank and step of [`FAULT_KILL_AT_STEP`], when it is set.
fn fault() -> Result<Option<(usize, u64)>, String> {
    let Ok(v) = std::env::var(FAULT_KILL_AT_STEP) else { return Ok(None) };
    let parsed = v.split_once(':').and_then(|(r, s)| Some((r.trim().parse().ok()?, s.trim().parse().ok()?)));
    parsed.map(Some).ok_or_else(|| format!("{FAULT_KILL_AT_STEP}='{v}' is not RANK:STEPS, such as 1:6"))
}

/// Gives candle's matrix products `cores / ranks on this host` threads when the launcher
/// says how many ranks share the host and nobody chose (`RAYON_NUM_THREADS`).
fn share_cores() -> Result<(), String> {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return Ok(());
    }
    let local = number::<usize>("LOCAL_WORLD_SIZE")?.or(number("OMPI_COMM_WORLD_LOCAL_SIZE")?);
    if let Some(local) = local.filter(|&n| n > 0) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // SAFETY: called first thing in the rank, before it starts any thread (nothing reads
        // or writes the environment concurrently).
        unsafe { std::env::set_var("RAYON_NUM_THREADS", (cores / local).max(1).to_string()) };
    }
    Ok(())
}

/// Whether this rank continues from the checkpoint in `dir`: with `--resume`; in a restarted
/// attempt (`restart > 0`) when the checkpoint there was written by this job (`job`) with
/// this configuration (`fingerprint`); otherwise it starts from scratch.
fn resumes(
    resume: bool,
    dir: &Path,
    restart: u32,
    job: Option<&str>,
    fingerprint: &str,
) -> Result<bool, String> {
    if resume || restart == 0 || !dir.join(LATEST).exists() {
        return Ok(resume);
    }
    let reader = Reader::open(dir).map_err(|e| e.to_string())?;
    let field = |k: &str| reader.extra().get(k).and_then(Value::as_str).map(str::to_string);
    Ok(field("fingerprint").as_deref() == Some(fingerprint) && field("run").as_deref() == job)
}

/// Runs one rank: `external` names the launcher that started it, `None` when it is
/// `xccl train`'s own (`--worker`). Bad settings exit with status 2, failures with 1.
pub fn run(args: &TrainArgs, external: Option<&'static str>) -> ExitCode {
    let fail = |code: u8, msg: String| {
        eprintln!("xccl train: {msg}");
        ExitCode::from(code)
    };
    if external.is_some() {
        if let Err(e) = share_cores() {
            return fail(2, e);
        }
        if args.max_restarts > 0 {
            return fail(
                2,
                format!(
                    "--max-restarts: this rank was started by {}, which does the restarts (give it \
                     its own --max-restarts); leave it out of xccl train's arguments",
                    external.unwrap_or_default()
                ),
            );
        }
    }
    super::keep_freed_memory();
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        return fail(2, format!("cannot create --out {}: {e}", args.out.display()));
    }
    let prepared = (|| {
        let (task, mut config) = args.config()?;
        let rv = Rendezvous::from_env().map_err(|e| e.to_string())?;
        if rv.size != args.ranks() {
            let per_replica = args.pp * args.tp;
            let fix = if rv.size.is_multiple_of(per_replica) {
                format!("pass --dp {} (with --pp {} --tp {})", rv.size / per_replica, args.pp, args.tp)
            } else {
                format!(
                    "start {} ranks, or choose --dp, --pp and --tp with a product of {}",
                    args.ranks(),
                    rv.size
                )
            };
            return Err(format!(
                "{} started {} ranks, but the mesh --dp {} x --pp {} x --tp {} has {} ranks: {fix}",
                external.unwrap_or("xccl train"),
                rv.size,
                args.dp,
                args.pp,
                args.tp,
                args.ranks()
            ));
        }
        let restart = restart_count()?;
        let job = restartable_job_id()?;
        let fingerprint = config.fingerprint(task.as_ref());
        if let Some(c) = &mut config.checkpoint {
            c.resume = resumes(c.resume, &c.path, restart, job.as_deref(), &fingerprint)?;
            c.run = job;
            if restart > 0 && rv.rank == 0 {
                let start =
                    if c.resume { "resuming from the checkpoint in" } else { "no checkpoint of this job in" };
                let tail = if c.resume { "" } else { "; starting from scratch" };
                println!("xccl train: attempt {}: {start} {}{tail}", restart + 1, c.path.display());
            }
        }
        let kill_at = fault()?.filter(|&(r, _)| restart == 0 && r == rv.rank).map(|(_, s)| s);
        Ok((task, config, rv, kill_at))
    })();
    let (task, config, rv, kill_at) = match prepared {
        Ok(p) => p,
        Err(e) => return fail(2, e),
    };
    let plain = external.map(|_| Progress::new(config.steps));
    if plain.is_some() && rv.rank == 0 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = number("RAYON_NUM_THREADS").ok().flatten().unwrap_or(cores);
        println!("{}", super::header(args, &config, task.as_ref(), threads));
    }
    // From the environment again, so that XCCL_BACKEND (MPI) is honoured.
    let world = match xccl::Config::from_env().and_then(Communicator::from_env_with) {
        Ok(w) => w,
        Err(e) => return fail(1, e.to_string()),
    };
    let mut observer =
        Reporter { rank: world.rank(), tokens_per_step: config.batch * task.seq_len(), plain, kill_at };
    let mut outcome = match train(&world, &config, &mut observer) {
        Ok(o) => o,
        Err(e) => return fail(1, format!("rank {}: {e}", world.rank())),
    };
    if let Some(trace) = &outcome.trace {
        let path = args.out.join("trace.json");
        if let Err(e) = xccl_train::dcp::write_atomically(&path, trace.to_string().as_bytes()) {
            return fail(1, e.to_string());
        }
    }
    if let Some(summary) = &mut outcome.summary {
        // Model FLOP utilisation against this rank's matrix product on its threads, measured
        // now that the other ranks are done.
        summary.matmul_rate = xccl_train::model::flops::matmul_rate(1024, 10).ok();
        let mut event = summary.to_json();
        if observer.plain.is_some() {
            super::report(args, &config, &event);
        } else {
            event["event"] = json!("summary");
            observer.emit(&event);
        }
    }
    ExitCode::SUCCESS
}

/// Rank 0's progress: tagged lines for `xccl train`'s own launcher, or plain lines.
struct Reporter {
    rank: usize,
    tokens_per_step: usize,
    /// Under another launcher: progress printed as plain lines.
    plain: Option<Progress>,
    /// [`FAULT_KILL_AT_STEP`] for this rank in this attempt: the steps after which it dies.
    kill_at: Option<u64>,
}

impl Reporter {
    fn emit(&self, event: &Value) {
        if self.rank == 0 {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{TAG}{event}").and_then(|()| out.flush());
        }
    }
}

impl Observer for Reporter {
    fn start(&mut self, first: u64) {
        // What building the model and loading the start freed (ZeRO stage 3 frees the whole
        // model) goes back to the kernel, so the steps' peak memory is theirs.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the
        // kernel (under the allocator's locks); no live allocation is touched.
        unsafe {
            libc::malloc_trim(0);
        }
        match &mut self.plain {
            Some(p) => p.start(first, self.tokens_per_step as f64),
            None => {
                self.emit(&json!({"event": "start", "first": first, "tokens_per_step": self.tokens_per_step}))
            }
        }
    }

    fn step(&mut self, stat: &StepStat) {
        if self.kill_at == Some(stat.step + 1) {
            eprintln!(
                "xccl train: {FAULT_KILL_AT_STEP}: rank {} kills itself after step {}",
                self.rank,
                stat.step + 1
            );
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        }
    }

    fn loss(&mut self, step: u64, loss: f64, seconds: f64) {
        match &mut self.plain {
            Some(p) => {
                if let (msg, true) = p.loss(step, loss, seconds) {
                    println!("{}", p.line(step, &msg, seconds));
                }
            }
            None => self.emit(&json!({"event": "loss", "step": step, "loss": loss, "seconds": seconds})),
        }
    }
}
