//! `xccl run`: starts the ranks of a job as local processes.
//!
//! The launcher serves the job's key-value store (on node 0), gives every rank the
//! variables of torchrun's conventions plus `XCCL_*` ones, prefixes each output line with its
//! rank, and watches the ranks: when one fails, the others are stopped and the launcher exits
//! with the failed rank's status, naming it. Ctrl-C stops every rank cleanly.

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
            command: a.command,
            env: Vec::new(),
        }
    }
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

/// Starts the ranks of `job` on this node, hands their output to `output`, and watches
/// them: when one fails the others are stopped, and the exit code is the failed rank's.
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
    let job = std::env::var("XCCL_JOB_ID")
        .unwrap_or_else(|_| format!("xccl-run-{}", random_hex(6).unwrap_or_default()));
    if multi && args.master_port == 0 {
        return fail(&"multi-node runs need --master-port");
    }
    let auth = match Auth::new(job.clone(), secret.clone().into_bytes()) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    let mut _store = None;
    let store_addr = if args.node_rank == 0 {
        let bind = if multi { "0.0.0.0".to_string() } else { args.master_addr.clone() };
        match StoreServer::start((bind.as_str(), args.master_port), auth) {
            Ok(s) => {
                let port = s.addr().port();
                _store = Some(s);
                format!("{}:{port}", args.master_addr)
            }
            Err(e) => {
                return fail(&format!("cannot serve the store on {bind}:{}: {e}", args.master_port));
            }
        }
    } else {
        format!("{}:{}", args.master_addr, args.master_port)
    };
    let port = store_addr.rsplit(':').next().unwrap_or("0").to_string();

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            return fail(&format!("cannot handle signals: {e}"));
        }
    }

    let world = args.nproc * args.nnodes;
    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut pipes = Vec::new();
    for local in 0..args.nproc {
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
            ("XCCL_RANK", rank.to_string()),
            ("XCCL_WORLD_SIZE", world.to_string()),
            ("XCCL_LOCAL_RANK", local.to_string()),
            ("XCCL_STORE_ADDR", store_addr.clone()),
            ("XCCL_SECRET", secret.clone()),
            ("XCCL_JOB_ID", job.clone()),
        ] {
            cmd.env(k, v);
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
                children.push((rank, child));
            }
            Err(e) => {
                output.note(&format!("{name}: cannot start '{}': {e}", args.command[0]));
                for (_, c) in &children {
                    signal_group(c, Signal::KILL);
                }
                for (_, c) in &mut children {
                    let _ = c.wait();
                }
                return ExitCode::from(127);
            }
        }
    }

    let grace = Duration::from_secs_f64(args.grace.max(0.0));
    let mut running: Vec<Option<Child>> = Vec::new();
    let ranks: Vec<usize> = children.iter().map(|(r, _)| *r).collect();
    running.extend(children.into_iter().map(|(_, c)| Some(c)));
    let mut failure: Option<(usize, String, u8)> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut interrupted = false;
    loop {
        if stop.load(Ordering::Relaxed) && stopping_since.is_none() {
            interrupted = true;
            output
                .note(&format!("{name}: interrupted; stopping {} rank(s)", running.iter().flatten().count()));
            for c in running.iter().flatten() {
                signal_group(c, Signal::INT);
            }
            stopping_since = Some(Instant::now());
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
                }
            }
        }
        if failure.is_some() && stopping_since.is_none() {
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
    for p in pipes {
        let _ = p.join();
    }
    // A rank that died while its communicator was being built can leave a segment file.
    remove_job_segments(&job);
    match failure {
        Some((rank, what, code)) => {
            output.note(&format!("{name}: job failed: rank {rank} {what}"));
            ExitCode::from(code.max(1))
        }
        None if interrupted => ExitCode::from(130),
        None => ExitCode::SUCCESS,
    }
}
