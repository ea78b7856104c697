//! PyTorch's launcher and store, for real: torchrun (PyTorch 2.x) starts `xccl bench` and
//! `xccl train`, whose ranks join torchrun's agent store through PyTorch's own protocol; a
//! PyTorch `TCPStore` and an xccl client share keys both ways; PyTorch processes started by
//! `xccl run` use its store (`init_process_group` with the env:// defaults, then gloo).
//!
//! Needs a Python with PyTorch: `XCCL_TEST_PYTHON`, else `python3` on PATH, else the
//! virtual environments `.ci/run` and `bench/` set up; without one each test says why it
//! skips.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use xccl::bootstrap::C10dClient;

mod common;

use common::{param_bits as params, run_ok as ok, text, torch_python as python};

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

/// `python -m torch.distributed.run ARGS` (torchrun) with settings for a small, shared machine.
fn torchrun(python: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "torch.distributed.run"])
        .args(args)
        .env("XCCL_TIMEOUT", "60")
        .env("RAYON_NUM_THREADS", "1");
    for k in ["XCCL_JOB_ID", "XCCL_STORE_ADDR", "XCCL_SECRET", "XCCL_RANK", "RANK", "WORLD_SIZE"] {
        cmd.env_remove(k);
    }
    cmd
}

/// A port nobody listens on now (torchrun's static rendezvous passes port 0 on to its
/// workers as is, so tests pick one).
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port().to_string()
}

#[test]
fn torchrun_starts_xccl_bench_on_three_ranks() {
    let Some(python) = python() else { return };
    // torchrun's default (static) rendezvous and --standalone (c10d rendezvous on a free port).
    for extra in [vec!["--master-port".to_string(), free_port()], vec!["--standalone".to_string()]] {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let mut cmd = torchrun(&python, &extra);
        cmd.args(["--nproc_per_node", "3", "--no-python", XCCL, "bench", "all_reduce", "--sizes", "8,1M"]);
        let out = ok(&mut cmd);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("nranks=3"), "{}", text(&out));
        assert!(
            stdout.contains("1048576") && stdout.contains("# Out of bounds values : 0 OK"),
            "{}",
            text(&out)
        );
    }
}

/// A tiny model and task, so each run takes seconds.
const TINY: &[&str] = &[
    "--digits", "2", "--width", "16", "--layers", "1", "--heads", "2", "--batch", "9", "--lr", "1e-3",
    "--steps", "6", "--dp", "3",
];

#[test]
fn xccl_train_under_torchrun_equals_its_own_launch() {
    let Some(python) = python() else { return };
    let base = std::env::temp_dir().join(format!("xccl-torchrun-{}", std::process::id()));
    let (own, under) = (base.join("own"), base.join("torchrun"));
    let mut cmd = Command::new(XCCL);
    cmd.arg("train")
        .args(TINY)
        .arg("--out")
        .arg(&own)
        .env("XCCL_TIMEOUT", "60")
        .env("RAYON_NUM_THREADS", "1");
    ok(&mut cmd);
    let port = free_port();
    let mut cmd =
        torchrun(&python, &["--master-port", &port, "--nproc_per_node", "3", "--no-python", XCCL, "train"]);
    cmd.args(TINY).arg("--out").arg(&under);
    ok(&mut cmd);
    assert_eq!(params(&under), params(&own), "under torchrun, the parameters differ");
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn a_pytorch_store_and_an_xccl_client_share_keys_both_ways() {
    let Some(python) = python() else { return };
    // PyTorch serves (with either of its servers); this process is an xccl client.
    for libuv in ["True", "False"] {
        let script = format!(
            r#"
import sys
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv={libuv}, timeout=timedelta(seconds=30))
s.set("from/torch", b"torch value")
s.add("counter", 10)
print(s.port, flush=True)
assert s.get("from/xccl") == b"xccl value", s.get("from/xccl")
assert s.add("counter", 0) == 13, s.add("counter", 0)
print("python saw xccl's keys", flush=True)
sys.stdin.readline()
"#
        );
        let mut child = Command::new(&python)
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = lines.next().expect("a port").expect("read the port");
        let addr = format!("127.0.0.1:{}", port.trim());
        let mut c = C10dClient::connect(&addr, "", Duration::from_secs(30)).expect("join PyTorch's store");
        assert_eq!(c.get("from/torch").unwrap(), b"torch value");
        assert_eq!(c.add("counter", 3).unwrap(), 13, "PyTorch keeps counters as text; so do we");
        c.set("from/xccl", b"xccl value").unwrap();
        assert_eq!(lines.next().unwrap().unwrap(), "python saw xccl's keys");
        // A missing key is a timeout naming it, not a hang.
        let mut short = C10dClient::connect(&addr, "job/", Duration::from_millis(500)).unwrap();
        let err = short.get("never").unwrap_err().to_string();
        assert!(err.contains("job/never"), "{err}");
        child.stdin.take().unwrap().write_all(b"\n").unwrap();
        assert!(child.wait().unwrap().success(), "use_libuv={libuv}");
    }
}

#[test]
fn pytorch_processes_started_by_xccl_run_use_its_store() {
    let Some(python) = python() else { return };
    // init_process_group with the env:// defaults joins the store `xccl run` serves (it
    // speaks PyTorch's protocol); gloo then all-reduces, and the store passes a key from
    // rank 0 to rank 1 through PyTorch's client.
    let script = r#"
import os
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(r + 1)])
dist.all_reduce(t)
assert t.item() == n * (n + 1) / 2, t
store = dist.distributed_c10d._get_default_store()
if r == 0:
    store.set("greeting", "hello from rank 0")
assert store.get("greeting") == b"hello from rank 0"
print(f"rank {r} ok", flush=True)
dist.destroy_process_group()
"#;
    let mut cmd = Command::new(XCCL);
    cmd.args(["run", "-n", "2", "--"]).arg(&python).args(["-c", script]);
    let out = ok(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rank 0 ok") && stdout.contains("rank 1 ok"), "{}", text(&out));
}
