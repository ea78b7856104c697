//! PyTorch's backend "xccl" across hosts, for real: on a 2-host emulated cluster
//! (`bench/cluster.sh`: network namespaces joined by veth links), torchrun runs in each host's
//! namespace (c10d rendezvous on host 0, 2 processes per host, `XCCL_HOST_KEY` per host so
//! that ranks of a host share memory and hosts talk TCP over the veth), and every rank runs
//! an ordinary DDP program (`python/tests/check_torch_ddp_hosts.py`) that trains the same
//! model on a "gloo" group and on an `xccl` group and compares them. The trust cases of
//! `crates/xccl/src/bootstrap/group.rs`:
//!
//! - no `XCCL_SECRET`: each group draws its secret and shares it through its store;
//! - the same `XCCL_SECRET` on every rank (a defect once refused every rank here:
//!   "refusing to listen ... without a job secret");
//! - another `XCCL_SECRET` on the second host: making the xccl group fails on the ranks, in
//!   bounded time, with an error that names the secret.
//!
//! The package is made as in tests/python.rs (the extension cargo built, copied as
//! `xccl/_xccl.abi3.so` beside the sources) and the native backend is compiled once, before
//! any rank starts (`python -m xccl.torch`), in a directory kept between runs
//! (`target/tmp/torch-cluster/`, PyTorch's build cache there too: `TORCH_EXTENSIONS_DIR`), so
//! that only the first run compiles it. The tests run one at a time (each job takes both
//! cores).
//! Each says why it skips where it cannot run: not root or no network namespaces, no Python
//! with PyTorch, no C++ compiler.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[allow(dead_code)] // the launcher and the link controls are not used here
#[path = "../../xccl/tests/common/cluster.rs"]
mod cluster;
mod common;

use cluster::Cluster;

const PYTHON_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../python");
const SCRIPT: &str = "check_torch_ddp_hosts.py";
/// How long one job may take before the test kills it and fails (a job takes about 30 s on
/// two cores).
const LIMIT: Duration = Duration::from_secs(240);
/// The rendezvous port on host 0 (each test has its own cluster, so any port is free).
const PORT: u16 = 29500;

/// The interpreter, the package directory (on `PYTHONPATH`) and a directory for logs.
struct Setup {
    python: PathBuf,
    pythonpath: PathBuf,
    logs: PathBuf,
}

/// The package and the compiled native backend, once per test binary; `Err` says why the
/// tests skip. A backend that does not compile where a compiler is fails the test.
fn setup() -> &'static Result<Setup, String> {
    static SETUP: OnceLock<Result<Setup, String>> = OnceLock::new();
    SETUP.get_or_init(|| {
        let python = common::torch_python().ok_or("no Python with PyTorch (see above)")?;
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("torch-cluster");
        common::package::assemble(&root)?;
        let logs = root.join(format!("logs-{}", std::process::id()));
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        let start = Instant::now();
        common::package::build_backend(&python, &root)?;
        eprintln!("native backend ready in {:.1?}", start.elapsed());
        Ok(Setup { python, pythonpath: root, logs })
    })
}

/// One torchrun job: both hosts' exit statuses (`None`: killed at [`LIMIT`]), their output,
/// and how long the job took.
struct Job {
    status: Vec<Option<ExitStatus>>,
    log: String,
    took: Duration,
}

impl Job {
    fn ok(&self) -> bool {
        self.status.iter().all(|s| s.is_some_and(|s| s.success()))
    }
}

/// Runs the script under torchrun on both hosts of `c` at once, `secrets[h]` as host h's
/// `XCCL_SECRET` (none where `None`), and waits for both (killing them at [`LIMIT`]).
fn torchrun(c: &Cluster, s: &Setup, case: &str, secrets: [Option<&str>; 2]) -> Job {
    let script = Path::new(PYTHON_DIR).join("tests").join(SCRIPT);
    let start = Instant::now();
    let mut children: Vec<(Child, PathBuf)> = Vec::new();
    for (h, secret) in secrets.iter().enumerate() {
        let log = s.logs.join(format!("{case}-h{h}.log"));
        let file = File::create(&log).expect("log file");
        let mut cmd = Command::new("bash");
        cmd.arg(cluster::script())
            .args(["exec", &c.name, &h.to_string(), "--"])
            .arg(&s.python)
            .args(["-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "2"])
            .args(["--rdzv-backend", "c10d", "--rdzv-endpoint", &format!("10.77.0.1:{PORT}")])
            .args(["--rdzv-id", &format!("{}-{case}", c.name), "--max-restarts", "0"])
            // The namespaces share the machine's hostname, which resolves to none of their
            // addresses: say which host serves the rendezvous and what each host is called.
            .args(["--local-addr", &format!("10.77.0.{}", h + 1)])
            .args(["--rdzv-conf", if h == 0 { "is_host=1" } else { "is_host=0" }])
            .arg(&script)
            .current_dir(script.parent().expect("tests dir"))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            let torch =
                ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"];
            if k.starts_with("XCCL_") || torch.contains(&k.as_str()) {
                cmd.env_remove(&k);
            }
        }
        cmd.env("PYTHONPATH", &s.pythonpath)
            .env("PYTHONUNBUFFERED", "1")
            .env("XCCL_HOST_KEY", format!("{}-h{h}", c.name))
            .env("XCCL_TIMEOUT", "20")
            .env("GLOO_SOCKET_IFNAME", "eth0")
            .env("OMP_NUM_THREADS", "1")
            .env("RAYON_NUM_THREADS", "1");
        if let Some(secret) = secret {
            cmd.env("XCCL_SECRET", secret);
        }
        children.push((cmd.spawn().expect("bash runs"), log));
    }
    let mut status: Vec<Option<ExitStatus>> = vec![None; children.len()];
    while status.iter().any(Option::is_none) && start.elapsed() < LIMIT {
        for (i, (child, _)) in children.iter_mut().enumerate() {
            if status[i].is_none() {
                status[i] = child.try_wait().expect("waiting for torchrun");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = start.elapsed();
    for (i, (child, _)) in children.iter_mut().enumerate() {
        if status[i].is_none() {
            // The agent; its workers go with the cluster (`down` kills what runs in it).
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let log = children
        .iter()
        .enumerate()
        .map(|(h, (_, p))| format!("===== host {h}\n{}", std::fs::read_to_string(p).unwrap_or_default()))
        .collect();
    Job { status, log, took }
}

/// Runs `case` on a fresh 2-host cluster, one test at a time; `None`: skipped (said why).
fn run(case: &str, secrets: [Option<&str>; 2]) -> Option<Job> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let c = match Cluster::up(&format!("tc{case}{}", std::process::id() % 100_000), &["--hosts", "2"]) {
        Ok(c) => c,
        Err(why) => {
            common::require::skip("netns", why);
            return None;
        }
    };
    let s = match setup() {
        Ok(s) => s,
        Err(why) => {
            common::require::skip("torch", why);
            return None;
        }
    };
    let job = torchrun(&c, s, case, secrets);
    assert!(
        job.status.iter().all(Option::is_some),
        "case {case}: the job did not end in {LIMIT:?}:\n{}",
        job.log
    );
    Some(job)
    // `c` dropped: the cluster is removed and whatever still runs in it killed.
}

/// Asserts that the job trained on both hosts and every rank checked; prints rank 0's line.
fn expect_trained(case: &str, job: &Job) {
    assert!(job.ok(), "case {case}: torchrun failed ({:?}):\n{}", job.status, job.log);
    for r in 0..4 {
        let line = format!("rank {r}: ddp ok");
        assert!(job.log.contains(&line), "case {case}: no '{line}' in:\n{}", job.log);
    }
    let summary = job.log.lines().find_map(|l| l.find("ddp hosts ok").map(|i| &l[i..]));
    let summary = summary.unwrap_or_else(|| panic!("case {case}: no 'ddp hosts ok' in:\n{}", job.log));
    eprintln!("case {case} ({:.1?}): {summary}", job.took);
}

#[test]
fn ddp_across_two_hosts_without_a_secret() {
    if let Some(job) = run("a", [None, None]) {
        expect_trained("a", &job);
    }
}

#[test]
fn ddp_across_two_hosts_with_the_same_secret_everywhere() {
    if let Some(job) = run("b", [Some("tc-shared-secret"), Some("tc-shared-secret")]) {
        assert!(!job.log.contains("tc-shared-secret"), "the secret was printed:\n{}", job.log);
        assert!(
            !job.log.contains("refusing to listen"),
            "with XCCL_SECRET set the ranks must listen:\n{}",
            job.log
        );
        expect_trained("b", &job);
    }
}

#[test]
fn another_secret_on_the_second_host_is_refused_in_bounded_time() {
    let Some(job) = run("c", [Some("tc-secret-of-host-0"), Some("tc-secret-of-host-1")]) else { return };
    assert!(
        job.status.iter().all(|s| s.is_some_and(|s| !s.success())),
        "both hosts' torchrun must fail ({:?}):\n{}",
        job.status,
        job.log
    );
    assert!(!job.log.contains("ddp ok"), "a rank trained with another secret:\n{}", job.log);
    assert!(!job.log.contains("tc-secret-of-host"), "a secret was printed:\n{}", job.log);
    let failed: Vec<&str> = job.log.lines().filter(|l| l.contains("xccl group failed")).collect();
    assert!(!failed.is_empty(), "no rank said its xccl group failed:\n{}", job.log);
    // The refused ranks (2 and 3) name the secret from the handshake, and rank 0, which refused
    // them, from the refusals its acceptor remembers. (Rank 1 only waited: ranks 2 and 3 stop at
    // their first refusal, which is rank 0's.)
    for r in [0, 2, 3] {
        assert!(
            failed
                .iter()
                .any(|l| l.contains(&format!("rank {r}: xccl group failed"))
                    && l.contains("XCCL_SECRET differs")),
            "rank {r}'s error does not name the secret:\n{}",
            job.log
        );
    }
    // Bounded: the group's timeout (30 s) and XCCL_TIMEOUT (20 s) end it, not LIMIT.
    assert!(job.took < Duration::from_secs(150), "took {:?}:\n{}", job.took, job.log);
    eprintln!("case c ({:.1?}, statuses {:?}):", job.took, job.status);
    for l in failed {
        eprintln!("  {l}");
    }
}
