//! `xccl train` unchanged on the MPI backend: ranks started by a real `mpirun` with
//! `XCCL_BACKEND=mpi` end with the same parameters, bit for bit, as the same settings on
//! xccl's own transports. Skipped, saying why, when `mpirun` is not installed.

#![cfg(feature = "mpi")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use xccl_train::checkpoint::{DIR_NAME, read_params};

mod common;

use common::{mpirun_env, text};

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

/// The tiny model and task of `tests/train.rs`.
const TINY: &[&str] =
    &["--digits", "2", "--width", "16", "--layers", "1", "--heads", "2", "--batch", "7", "--lr", "1e-3"];

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xccl-mpi-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(what: &str, out: &Output) {
    assert!(out.status.success(), "{what}: {}", text(out));
}

/// The final parameters a run left in its checkpoint, by name.
fn params(out: &Path) -> BTreeMap<String, Vec<f32>> {
    read_params(&out.join(DIR_NAME)).expect("checkpoint")
}

/// `xccl train` on xccl's own transports (it launches its ranks itself).
fn native(out: &Path, args: &[&str]) -> Output {
    Command::new(XCCL)
        .arg("train")
        .args(TINY)
        .args(args)
        .arg("--out")
        .arg(out)
        .env("XCCL_TIMEOUT", "60")
        .env("RAYON_NUM_THREADS", "1")
        .env_remove("XCCL_BACKEND")
        .output()
        .expect("run xccl train")
}

/// The MPI launcher: `MPIRUN`, else `mpirun`.
fn mpirun() -> String {
    std::env::var("MPIRUN").unwrap_or_else(|_| "mpirun".into())
}

/// The ranks of `xccl train` started by mpirun, on the MPI backend.
fn under_mpirun(ranks: usize, out: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(mpirun());
    cmd.args(["-np", &ranks.to_string()])
        .arg(XCCL)
        .arg("train")
        .args(TINY)
        .args(args)
        .arg("--out")
        .arg(out)
        .env("XCCL_BACKEND", "mpi")
        .env("RAYON_NUM_THREADS", "1");
    mpirun_env(&mut cmd).output().expect("run mpirun")
}

#[test]
fn training_under_mpirun_matches_the_native_backend() {
    if Command::new(mpirun()).arg("--version").output().is_err() {
        common::require::skip(
            "mpi",
            format!("{} not found (install Open MPI or MPICH, see docs/MPI.md)", mpirun()),
        );
        return;
    }
    // DDP (all-reduce of buckets, checkpoints written from a duplicate communicator on a
    // background thread), ZeRO-1 (reduce-scatter, all-gather) and tensor parallelism (a
    // split communicator).
    for (name, args) in [
        ("ddp", &["--dp", "2", "--steps", "20"][..]),
        ("zero1", &["--dp", "2", "--zero", "1", "--steps", "20"][..]),
        ("tp", &["--dp", "1", "--tp", "2", "--steps", "20"][..]),
    ] {
        let (a, b) = (out_dir(&format!("{name}-native")), out_dir(&format!("{name}-mpi")));
        ok(&format!("{name} native"), &native(&a, args));
        let out = under_mpirun(2, &b, args);
        ok(&format!("{name} under mpirun"), &out);
        let (want, got) = (params(&a), params(&b));
        assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>(), "{name}");
        for (k, w) in &want {
            let same = w.iter().zip(&got[k]).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same && w.len() == got[k].len(), "{name}: parameter {k} differs from the native run");
        }
        // Rank 0 reported its summary, as on the native backend, and the operations in the
        // trace ran on MPI (their names say so).
        assert!(String::from_utf8_lossy(&out.stdout).contains("summary"), "{name}: no summary");
        let trace = std::fs::read_to_string(b.join("trace.json")).expect("trace.json");
        assert!(trace.contains(", mpi)\""), "{name}: no MPI operation in the trace");
        std::fs::remove_dir_all(a).unwrap();
        std::fs::remove_dir_all(b).unwrap();
    }
}
