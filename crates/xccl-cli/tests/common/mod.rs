//! Helpers shared by the command's integration tests: a finished command in words, running
//! one that must succeed, the bits of a run's final parameters, and a Python with PyTorch.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use xccl_train::checkpoint::{DIR_NAME, read_params};

/// A finished command's status and output, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, which must succeed; its output.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("start the command");
    assert!(out.status.success(), "{}", text(&out));
    out
}

/// The bits of the final parameters a run left in its checkpoint in `out`, by name.
pub fn param_bits(out: &Path) -> BTreeMap<String, Vec<u32>> {
    let p = read_params(&out.join(DIR_NAME)).expect("checkpoint");
    p.into_iter().map(|(k, v)| (k, v.iter().map(|x| x.to_bits()).collect())).collect()
}

/// A Python that imports `torch.distributed` (`XCCL_TEST_PYTHON`, else `python3` on PATH,
/// else the virtual environments `.ci/run` and `bench/` set up); says why the caller skips
/// when there is none.
pub fn torch_python() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let candidates: Vec<PathBuf> = match std::env::var_os("XCCL_TEST_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec![
            PathBuf::from("python3"),
            home.join(".cache/xccl-ci-venv/bin/python3"),
            PathBuf::from("/tmp/peers-venv/bin/python3"),
        ],
    };
    let found = candidates.into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import torch.distributed"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        eprintln!(
            "skipping: no Python with PyTorch (set XCCL_TEST_PYTHON, or run .ci/run once to set up its venv)"
        );
    }
    found
}
