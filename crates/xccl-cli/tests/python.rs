//! The Python package `xccl` (python/): its checks (python/tests/*.py) run against the
//! extension cargo built, as threads of one interpreter and as processes under `xccl run`.
//!
//! The extension (`libxccl_python.so`, built because this crate dev-depends on
//! `xccl-python`) is copied as `xccl/_xccl.abi3.so` next to the package's Python sources and
//! its native PyTorch backend's (compiled on first use) in a temporary directory, which goes
//! on `PYTHONPATH` (`common::package`). The interpreter is `$XCCL_TEST_PYTHON`,
//! else the first of `python3` on `PATH` and the known virtual environments that has NumPy
//! (and is 3.11 or later); without one, every test says why it skips.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");
const PYTHON_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../python");

/// What the Python checks run with: the interpreter and the package directory.
struct Setup {
    python: String,
    pythonpath: PathBuf,
}

/// The interpreter to use, or why there is none.
fn find_python() -> Result<String, String> {
    let home = std::env::var("HOME").unwrap_or_default();
    let explicit = std::env::var("XCCL_TEST_PYTHON").ok();
    let candidates: Vec<String> = match &explicit {
        Some(p) => vec![p.clone()],
        None => vec![
            "python3".into(),
            format!("{home}/.cache/xccl-ci-venv/bin/python3"),
            "/tmp/peers-venv/bin/python3".into(),
        ],
    };
    let probe = "import sys, numpy; assert sys.version_info >= (3, 11), sys.version";
    for p in &candidates {
        let ok = Command::new(p).args(["-c", probe]).output().is_ok_and(|o| o.status.success());
        if ok {
            return Ok(p.clone());
        }
    }
    Err(format!("no Python 3.11+ with numpy among {candidates:?} (set XCCL_TEST_PYTHON)"))
}

/// The package directory, made once per test binary.
fn setup() -> &'static Result<Setup, String> {
    static SETUP: OnceLock<Result<Setup, String>> = OnceLock::new();
    SETUP.get_or_init(|| {
        let python = find_python()?;
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("python-{}", std::process::id()));
        common::package::assemble(&root)?;
        Ok(Setup { python, pythonpath: root })
    })
}

/// Runs `args` (a check script and its arguments, or `xccl run ... -- python ...`) with
/// the package importable; the exit status and the combined output. `None`: skipped.
fn run(launcher: &[&str], script: &str, args: &[&str], env: &[(&str, &str)]) -> Option<(bool, String)> {
    let s = match setup() {
        Ok(s) => s,
        Err(why) => {
            common::require::skip("python", why);
            return None;
        }
    };
    let dir = Path::new(PYTHON_DIR).join("tests");
    let mut argv: Vec<&str> = launcher.to_vec();
    argv.extend([s.python.as_str(), script]);
    argv.extend(args);
    let (program, rest) = argv.split_first().expect("a command");
    let out = s.pythonpath.join(format!("{script}-{}.log", args.join("-")).replace(' ', "_"));
    let log = std::fs::File::create(&out).expect("log file");
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .current_dir(&dir)
        .env("PYTHONPATH", &s.pythonpath)
        .env("XCCL_TIMEOUT", "60")
        .stdout(log.try_clone().expect("log file"))
        .stderr(log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the check") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!(
                "{argv:?} did not finish in 300 s:\n{}",
                std::fs::read_to_string(&out).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    for line in text.lines().filter(|l| l.contains("skipping:")) {
        eprintln!("{line}");
    }
    Some((status.success(), text))
}

/// `xccl run -n 3` (with a long grace, so that survivors of a failure report first).
const RUN3: &[&str] = &[XCCL, "run", "--grace", "30", "-n", "3", "--"];

/// Asserts that the check succeeded and that each rank of `ranks` printed a line with
/// `needle`.
fn expect_ok(result: &Option<(bool, String)>, ranks: usize, needle: &str) {
    let Some((ok, text)) = result else { return };
    assert!(ok, "the check failed:\n{text}");
    for r in 0..ranks {
        let who = format!("rank {r}: ");
        assert!(
            text.lines().any(|l| l.contains(&who) && l.contains(needle)),
            "no '{who}...{needle}' in:\n{text}"
        );
    }
}

#[test]
fn collectives_in_threads() {
    expect_ok(&run(&[], "check_collectives.py", &["threads"], &[]), 3, "checks ok");
}

#[test]
fn collectives_in_processes() {
    expect_ok(&run(RUN3, "check_collectives.py", &[], &[]), 3, "checks ok");
}

#[test]
fn bad_arguments_raise_before_communicating() {
    let result = run(&[], "check_errors.py", &["args"], &[]);
    expect_ok(&result, 3, "bad arguments raised InvalidArgumentError");
}

#[test]
fn a_missing_rank_times_out() {
    expect_ok(&run(&[], "check_errors.py", &["timeout"], &[("XCCL_TIMEOUT", "1")]), 1, "ok TimeoutError");
}

#[test]
fn mismatches_raise_mismatch_error() {
    for launcher in [&[][..], RUN3] {
        let result = run(launcher, "check_errors.py", &["mismatch"], &[]);
        expect_ok(&result, 3, "ok MismatchError (counts)");
        expect_ok(&result, 3, "ok MismatchError (collectives)");
        expect_ok(&result, 3, "ok the original communicator still works");
    }
}

#[test]
fn a_lost_rank_raises_peer_lost_on_the_others() {
    let start = Instant::now();
    let Some((ok, text)) = run(RUN3, "check_errors.py", &["lost"], &[]) else { return };
    // The launcher reports rank 2's exit as the job's failure.
    assert!(!ok && text.contains("rank 2"), "{text}");
    for r in 0..2 {
        for needle in ["ok PeerLostError (rank 2)", "ok later operations raise PeerLostError too"] {
            let line = format!("rank {r}: {needle}");
            assert!(text.contains(&line), "no '{line}' in:\n{text}");
        }
    }
    // XCCL_TIMEOUT is 60 s: the loss was detected, not timed out.
    assert!(start.elapsed() < Duration::from_secs(50), "took {:?}:\n{text}", start.elapsed());
}

#[test]
fn buffers_are_used_in_place_and_held_until_done() {
    let result = run(&[], "check_zero_copy.py", &[], &[]);
    for needle in [
        "ok blocking calls write into the caller's arrays",
        "ok an async call holds its buffer until wait()",
        "ok the buffer lives as long as its operation, not longer",
        "ok an exported bytearray cannot be resized",
        "ok a dropped Work keeps its buffer until the operation completed",
        "ok a Work can be waited on and polled from several threads",
        "ok in-place reduce and all_gather into the output's own block",
    ] {
        expect_ok(&result, 2, needle);
    }
}

/// Whether the checks' Python has PyTorch; says why the caller skips if not.
fn has_torch() -> bool {
    let Ok(s) = setup() else { return true }; // `run` says why it skips
    let ok = Command::new(&s.python)
        .args(["-c", "import torch.distributed"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        common::require::skip(
            "torch",
            format!("{} has no PyTorch (pip install torch, or run .ci/run once)", s.python),
        );
    }
    ok
}

#[test]
fn the_pytorch_backend_matches_gloo_call_by_call() {
    if has_torch() {
        expect_ok(&run(RUN3, "check_torch_backend.py", &[], &[]), 3, "torch backend ok");
    }
}

#[test]
fn the_backend_leaves_the_name_xccl_to_pytorchs_own_where_that_is_built() {
    if has_torch() {
        for mode in ["plain", "xpu-build"] {
            expect_ok(&run(&[], "check_torch_names.py", &[mode], &[]), 1, &format!("ok names {mode}"));
        }
    }
}

#[test]
fn ddp_on_xccl_trains_like_ddp_on_gloo_under_xccl_run_and_torchrun() {
    if !has_torch() {
        return;
    }
    expect_ok(&run(RUN3, "check_torch_ddp.py", &[], &[]), 3, "ddp ok");
    let Ok(s) = setup() else { return };
    let torchrun = [
        s.python.as_str(),
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "3",
        "--no-python",
    ];
    expect_ok(&run(&torchrun, "check_torch_ddp.py", &[], &[]), 3, "ddp ok");
}
