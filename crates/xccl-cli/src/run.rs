//! `xccl run`: starts the ranks of a job as local processes.
//!
//! The launcher serves the job's key-value store (on node 0), gives every rank the
//! variables of torchrun's conventions plus `XCCL_*` ones, prefixes each output line with its
//! rank, and watches the ranks: when one fails, the others are stopped and the launcher exits
//! with the failed rank's status, naming it, or, with `--max-restarts K`, starts the whole
//! job again (a fresh store, every rank told the attempt in `TORCHELASTIC_RESTART_COUNT` and
//! `XCCL_RESTART_COUNT`), as torchrun does. Ctrl-C stops every rank cleanly and never restarts.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use xccl::bootstrap::{Auth, StoreServer, remove_job_segments};

/// Arguments of `xccl run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Ranks (processes) to start on this node.
    #[arg(short = 'n', long = "nproc-per-node")]
    pub nproc: usize,
    /// Address of node 0, where the store is served.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Port of the store on node 0 (0: any free port; single node only).
    #[arg(long, default_value_t = 0)]
    pub master_port: u16,
    /// This node's index among `--nnodes`.
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Number of nodes; each runs `xccl run` with the same `-n`, `--master-*` and `XCCL_SECRET`.
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// Seconds ranks get to exit after Ctrl-C or a failure before they are killed.
    #[arg(long, default_value_t = 5.0)]
    pub grace: f64,
    /// Times to start the whole job again after a rank fails (single node; multi-node
    /// elastic jobs: torchrun).
    #[arg(long, default_value_t = 0)]
    pub max_restarts: u32,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Where the ranks' output goes, line by line, and the launcher's own messages.
pub trait Output: Send + Sync {
    /// One line (ending in a newline) that `rank` wrote to its stdout or its stderr.
    fn line(&self, rank: usize, stderr: bool, line: &[u8]);
    /// A message of the launcher itself (a rank failed, the job was interrupted).
    fn note(&self, msg: &str) {
        eprintln!("{msg}");
    }
}

/// The output of `xccl run`: each line prefixed with its rank, to the launcher's stdout or
/// stderr.
pub struct Prefixed {
    width: usize,
}

impl Prefixed {
    /// Prefixes wide enough for the ranks of a world of `world` ranks.
    pub fn new(world: usize) -> Prefixed {
        Prefixed { width: world.saturating_sub(1).to_string().len() }
    }

    /// `line` with `rank`'s prefix.
    pub fn prefix(&self, rank: usize, line: &[u8]) -> Vec<u8> {
        let mut out = format!("[{rank:>w$}] ", w = self.width).into_bytes();
        out.extend_from_slice(line);
        out
    }
}

impl Output for Prefixed {
    fn line(&self, rank: usize, stderr: bool, line: &[u8]) {
        let line = self.prefix(rank, line);
        let _ = if stderr {
            std::io::stderr().lock().write_all(&line)
        } else {
            std::io::stdout().lock().write_all(&line)
        };
    }
}

/// A job of `nproc` ranks on this node, as `xccl run` and the commands built on it start it.
#[derive(Clone, Debug)]
pub struct Job {
    /// The name in the launcher's messages, e.g. `xccl run`.
    pub name: &'static str,
    /// Ranks (processes) on this node.
    pub nproc: usize,
    /// Address of node 0, where the store is served.
    pub master_addr: String,
    /// Port of the store (0: any free port; single node only).
    pub master_port: u16,
    /// This node's index among `nnodes`.
    pub node_rank: usize,
    /// Number of nodes.
    pub nnodes: usize,
    /// Seconds ranks get to exit after Ctrl-C or a failure before they are killed.
    pub grace: f64,
    /// Times to start the whole job again after a rank fails (single node only).
    pub max_restarts: u32,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Variables set for every rank on top of the launcher's.
    pub env: Vec<(String, String)>,
}

impl Job {
    /// A job of `nproc` ranks on this machine only, named `name` in messages.
    pub fn local(name: &'static str, nproc: usize, command: Vec<String>) -> Job {
        Job {
            name,
            nproc,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            node_rank: 0,
            nnodes: 1,
            grace: 5.0,
            max_restarts: 0,
            command,
            env: Vec::new(),
        }
    }
}

impl From<RunArgs> for Job {
    fn from(a: RunArgs) -> Job {
        Job {
            name: "xccl run",
            nproc: a.nproc,
            master_addr: a.master_addr,
            master_port: a.master_port,
            node_rank: a.node_rank,
            nnodes: a.nnodes,
            grace: a.grace,
            max_restarts: a.max_restarts,
            command: a.command,
            env: Vec::new(),
        }
    }
}

/// The glibc setting that advises transparent huge pages for the memory behind each rank's
/// large allocations (`MADV_HUGEPAGE`, as NumPy does for its arrays and PyTorch with
/// `THP_MEM_ALLOC_ENABLE=1`): a message between processes is copied straight out of its
/// sender's memory, page by page, so large messages in ordinary `Vec`s and tensors move at
/// the speed of `HostBuffer`s.
const HUGE_MALLOC: &str = "glibc.malloc.hugetlb=1";

/// The `GLIBC_TUNABLES` a rank gets: the launcher's own (`current`) with [`HUGE_MALLOC`]
/// added, unless `XCCL_MALLOC_HUGE_PAGES` (`setting`) is `0` or `current` already says how
/// malloc uses huge pages; `Ok(None)` leaves the variable as it is.
fn malloc_tunables(current: Option<&str>, setting: Option<&str>) -> Result<Option<String>, String> {
    match setting {
        None | Some("1") => {}
        Some("0") => return Ok(None),
        Some(other) => {
            return Err(format!(
                "XCCL_MALLOC_HUGE_PAGES={other}: give 1 (the ranks' large allocations on transparent huge \
                 pages, the default) or 0 (malloc as configured)"
            ));
        }
    }
    Ok(match current.map(str::trim) {
        Some(t) if t.split(':').any(|kv| kv.trim().starts_with("glibc.malloc.hugetlb")) => None,
        Some(t) if !t.is_empty() => Some(format!("{t}:{HUGE_MALLOC}")),
        _ => Some(HUGE_MALLOC.to_string()),
    })
}

fn random_hex(bytes: usize) -> Result<String, String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness for the job secret: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// What one rank did, in words, and the exit code it maps to.
fn describe(status: ExitStatus) -> (String, u8) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (format!("exited with status {c}"), u8::try_from(c).unwrap_or(1)),
        (None, Some(s)) => (format!("was killed by signal {s}"), 128u8.saturating_add(s as u8)),
        _ => ("ended in an unknown way".into(), 1),
    }
}

/// Hands `src` line by line to `output` as `rank`'s.
fn forward(
    src: impl Read + Send + 'static,
    rank: usize,
    stderr: bool,
    output: Arc<dyn Output>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(src);
        let mut line = Vec::new();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            output.line(rank, stderr, &line);
            line.clear();
        }
    })
}

fn signal_group(child: &Child, sig: Signal) {
    if let Some(pid) = Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, sig);
    }
}

/// Runs `xccl run`.
pub fn run(args: RunArgs) -> ExitCode {
    let output = Arc::new(Prefixed::new(args.nproc * args.nnodes));
    launch(&Job::from(args), output)
}

/// How long the other ranks get after a rank failed before they are asked to stop: their
/// communicators see the failure at once, so they end by themselves, each naming the lost
/// rank.
const SETTLE: Duration = Duration::from_secs(1);

/// How one attempt of a job ended.
enum Ending {
    /// Every rank exited with status 0.
    Success,
    /// Ctrl-C (SIGINT, SIGTERM or SIGHUP) reached the launcher and no rank had failed.
    Interrupted,
    /// `rank` failed first (`what`, in words); the job's exit code would be `code`.
    Failed { rank: usize, what: String, code: u8 },
    /// A rank could not be started; the others were stopped.
    NotStarted,
}

/// What stays the same over the attempts of a job.
struct Setup<'a> {
    job: &'a Job,
    secret: String,
    /// The job's id (`XCCL_JOB_ID`): the same in every attempt, which each meet in a store
    /// of their own.
    id: String,
    output: Arc<dyn Output>,
    /// Where the ranks write their flight records: `$XCCL_FLIGHT_DIR` (or
    /// `$TMPDIR/xccl-flight`), in a folder per job and attempt.
    flight_base: std::path::PathBuf,
    /// Set by Ctrl-C, SIGTERM and SIGHUP.
    stop: Arc<AtomicBool>,
    /// `GLIBC_TUNABLES` for the ranks ([`malloc_tunables`]), if it changes.
    tunables: Option<String>,
}

/// Starts the ranks of `job` on this node, hands their output to `output`, and watches
/// them: when one fails the others are stopped, and the job is started again while restarts
/// are left; the exit code is then the last failed rank's.
pub fn launch(args: &Job, output: Arc<dyn Output>) -> ExitCode {
    let name = args.name;
    let fail = |msg: &dyn std::fmt::Display| {
        output.note(&format!("{name}: {msg}"));
        ExitCode::from(2)
    };
    if args.nproc == 0 || args.nnodes == 0 || args.node_rank >= args.nnodes || args.command.is_empty() {
        return fail(&"need a command, -n >= 1, --nnodes >= 1 and --node-rank < --nnodes");
    }
    let multi = args.nnodes > 1;
    if multi && args.max_restarts > 0 {
        return fail(&format!(
            "--max-restarts {} needs every node's launcher to agree on each restart, which {name} does \
             not do: use torchrun (--nnodes, --max-restarts, --rdzv-backend c10d) for multi-node elastic \
             jobs, or leave out --max-restarts",
            args.max_restarts
        ));
    }
    let secret = match std::env::var("XCCL_SECRET") {
        Ok(s) => s,
        Err(_) if multi => {
            return fail(&"multi-node runs need XCCL_SECRET set to the same value on every node");
        }
        Err(_) => match random_hex(16) {
            Ok(s) => s,
            Err(e) => return fail(&e),
        },
    };
    let id = std::env::var("XCCL_JOB_ID")
        .unwrap_or_else(|_| format!("xccl-run-{}", random_hex(6).unwrap_or_default()));
    if multi && args.master_port == 0 {
        return fail(&"multi-node runs need --master-port");
    }
    let tunables = match malloc_tunables(
        std::env::var("GLIBC_TUNABLES").ok().as_deref(),
        std::env::var("XCCL_MALLOC_HUGE_PAGES").ok().as_deref(),
    ) {
        Ok(t) => t,
        Err(e) => return fail(&e),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            return fail(&format!("cannot handle signals: {e}"));
        }
    }
    let flight_base = std::env::var_os("XCCL_FLIGHT_DIR")
        .map_or_else(|| std::env::temp_dir().join("xccl-flight"), std::path::PathBuf::from);
    let setup = Setup { job: args, secret, id, output: output.clone(), flight_base, stop, tunables };
    let attempts = args.max_restarts.saturating_add(1);
    let mut attempt = 0;
    loop {
        let ending = match setup.attempt(attempt) {
            Ok(e) => e,
            Err(e) => return fail(&e),
        };
        // A rank that died while its communicator was being built can leave a segment file.
        remove_job_segments(&setup.id);
        match ending {
            Ending::Success => return ExitCode::SUCCESS,
            Ending::Interrupted => return ExitCode::from(130),
            Ending::NotStarted => return ExitCode::from(127),
            Ending::Failed { rank, what, code } => {
                attempt += 1;
                if attempt < attempts && !setup.stop.load(Ordering::Relaxed) {
                    output.note(&format!(
                        "{name}: rank {rank} {what}; restarting the job (attempt {} of {attempts})",
                        attempt + 1
                    ));
                    continue;
                }
                let tries =
                    if attempts > 1 { format!(" in attempt {attempt} of {attempts}") } else { String::new() };
                output.note(&format!("{name}: job failed: rank {rank} {what}{tries}"));
                if let Some(table) = crate::flight::summary(&setup.flight_dir(attempt as usize - 1), 4) {
                    output.note(&format!("{name}: what the ranks were doing (flight records):\n{table}"));
                }
                return ExitCode::from(code.max(1));
            }
        }
    }
}

impl Setup<'_> {
    /// The flight records' folder of attempt `attempt`.
    fn flight_dir(&self, attempt: usize) -> std::path::PathBuf {
        self.flight_base.join(format!("{}-attempt{attempt}", self.id))
    }

    /// Serves a fresh store (node 0) and runs attempt `attempt` (0 first) of the job on this
    /// node to its end. `Err`: the store could not be served.
    fn attempt(&self, attempt: u32) -> Result<Ending, String> {
        let (args, name, output) = (self.job, self.job.name, &self.output);
        let multi = args.nnodes > 1;
        let mut _store = None;
        let store_addr = if args.node_rank == 0 {
            let auth =
                Auth::new(self.id.clone(), self.secret.clone().into_bytes()).map_err(|e| e.to_string())?;
            let bind = if multi { "0.0.0.0".to_string() } else { args.master_addr.clone() };
            let s = StoreServer::start((bind.as_str(), args.master_port), auth)
                .map_err(|e| format!("cannot serve the store on {bind}:{}: {e}", args.master_port))?;
            let port = s.addr().port();
            _store = Some(s);
            format!("{}:{port}", args.master_addr)
        } else {
            format!("{}:{}", args.master_addr, args.master_port)
        };
        let port = store_addr.rsplit(':').next().unwrap_or("0").to_string();

        let world = args.nproc * args.nnodes;
        let mut running: Vec<Option<Child>> = Vec::new();
        let mut ranks = Vec::new();
        let mut pipes = Vec::new();
        for local in 0..args.nproc {
            // A large job takes a while to start: stop starting ranks once Ctrl-C came or a
            // started one failed (looked at every 16 ranks); `watch` then stops the ranks
            // started and says why.
            let failed = |c: &mut Child| matches!(c.try_wait(), Ok(Some(s)) if !s.success());
            if self.stop.load(Ordering::Relaxed)
                || (local % 16 == 15 && running.iter_mut().flatten().any(failed))
            {
                break;
            }
            let rank = args.node_rank * args.nproc + local;
            let mut cmd = Command::new(&args.command[0]);
            cmd.args(&args.command[1..]);
            for (k, v) in [
                ("RANK", rank.to_string()),
                ("WORLD_SIZE", world.to_string()),
                ("LOCAL_RANK", local.to_string()),
                ("LOCAL_WORLD_SIZE", args.nproc.to_string()),
                ("GROUP_RANK", args.node_rank.to_string()),
                ("MASTER_ADDR", args.master_addr.clone()),
                ("MASTER_PORT", port.clone()),
                ("TORCHELASTIC_RESTART_COUNT", attempt.to_string()),
                // The store speaks PyTorch's protocol too: PyTorch programs join it as
                // clients (`init_process_group` with env://) instead of serving their own.
                ("TORCHELASTIC_USE_AGENT_STORE", "True".to_string()),
                ("TORCHELASTIC_MAX_RESTARTS", args.max_restarts.to_string()),
                ("XCCL_RANK", rank.to_string()),
                ("XCCL_WORLD_SIZE", world.to_string()),
                ("XCCL_LOCAL_RANK", local.to_string()),
                ("XCCL_STORE_ADDR", store_addr.clone()),
                ("XCCL_SECRET", self.secret.clone()),
                ("XCCL_JOB_ID", self.id.clone()),
                ("XCCL_RESTART_COUNT", attempt.to_string()),
                ("XCCL_FLIGHT_DIR", self.flight_dir(attempt as usize).display().to_string()),
            ] {
                cmd.env(k, v);
            }
            if let Some(t) = &self.tunables {
                cmd.env("GLIBC_TUNABLES", t);
            }
            cmd.envs(args.env.iter().map(|(k, v)| (k, v)));
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
            {
                use std::os::unix::process::CommandExt;
                // Own process group: Ctrl-C reaches the launcher only, which then stops every rank.
                cmd.process_group(0);
                // SAFETY: the closure runs in the forked child before exec and only makes one
                // async-signal-safe system call (prctl); it touches no memory of the parent.
                unsafe {
                    cmd.pre_exec(|| {
                        rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                        Ok(())
                    });
                }
            }
            match cmd.spawn() {
                Ok(mut child) => {
                    if let Some(out) = child.stdout.take() {
                        pipes.push(forward(out, rank, false, output.clone()));
                    }
                    if let Some(err) = child.stderr.take() {
                        pipes.push(forward(err, rank, true, output.clone()));
                    }
                    running.push(Some(child));
                    ranks.push(rank);
                }
                Err(e) => {
                    output.note(&format!("{name}: cannot start '{}': {e}", args.command[0]));
                    for c in running.iter().flatten() {
                        signal_group(c, Signal::KILL);
                    }
                    for c in running.iter_mut().flatten() {
                        let _ = c.wait();
                    }
                    return Ok(Ending::NotStarted);
                }
            }
        }
        let ending = self.watch(&mut running, &ranks);
        for p in pipes {
            let _ = p.join();
        }
        Ok(ending)
    }

    /// Waits for the ranks `running` (world ranks `ranks`) to end: on Ctrl-C, or once the
    /// others had [`SETTLE`] after the first failure to notice it and say so themselves, the
    /// ranks still running are asked to stop, and killed after the grace period.
    fn watch(&self, running: &mut [Option<Child>], ranks: &[usize]) -> Ending {
        let (name, output) = (self.job.name, &self.output);
        let grace = Duration::from_secs_f64(self.job.grace.max(0.0));
        let settle = SETTLE.min(grace);
        let mut failure: Option<(usize, String, u8)> = None;
        let mut failed_at: Option<Instant> = None;
        let mut stopping_since: Option<Instant> = None;
        let mut interrupted = false;
        loop {
            if self.stop.load(Ordering::Relaxed) && !interrupted {
                interrupted = true;
                output.note(&format!(
                    "{name}: interrupted; stopping {} rank(s)",
                    running.iter().flatten().count()
                ));
                for c in running.iter().flatten() {
                    signal_group(c, Signal::INT);
                }
                stopping_since.get_or_insert_with(Instant::now);
            }
            for (i, slot) in running.iter_mut().enumerate() {
                let Some(child) = slot else { continue };
                if let Ok(Some(status)) = child.try_wait() {
                    let pid = child.id();
                    *slot = None;
                    if !status.success() && failure.is_none() && !interrupted {
                        let (what, code) = describe(status);
                        output.note(&format!(
                            "{name}: rank {} (pid {pid}) {what}; stopping the other ranks",
                            ranks[i]
                        ));
                        failure = Some((ranks[i], what, code));
                        failed_at = Some(Instant::now());
                    }
                }
            }
            if failed_at.is_some_and(|t| t.elapsed() >= settle) && stopping_since.is_none() {
                for c in running.iter().flatten() {
                    signal_group(c, Signal::TERM);
                }
                stopping_since = Some(Instant::now());
            }
            if running.iter().all(Option::is_none) {
                break;
            }
            if stopping_since.is_some_and(|t| t.elapsed() > grace) {
                for c in running.iter().flatten() {
                    signal_group(c, Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        match failure {
            Some((rank, what, code)) => Ending::Failed { rank, what, code },
            None if interrupted => Ending::Interrupted,
            None => Ending::Success,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_huge_page_malloc_unless_told_otherwise() {
        assert_eq!(malloc_tunables(None, None), Ok(Some(HUGE_MALLOC.to_string())));
        assert_eq!(malloc_tunables(Some(""), Some("1")), Ok(Some(HUGE_MALLOC.to_string())));
        // Other tunables are kept; the user's own choice for huge pages wins.
        let kept = format!("glibc.malloc.arena_max=2:{HUGE_MALLOC}");
        assert_eq!(malloc_tunables(Some("glibc.malloc.arena_max=2"), None), Ok(Some(kept)));
        assert_eq!(malloc_tunables(Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"), None), Ok(None));
        assert_eq!(malloc_tunables(None, Some("0")), Ok(None));
        let e = malloc_tunables(None, Some("yes")).unwrap_err();
        assert!(e.contains("XCCL_MALLOC_HUGE_PAGES=yes") && e.contains("give 1"), "{e}");
    }
}
