//! `XCCL_BACKEND` is checked in every build, before any communication: an unknown backend,
//! or `mpi` in an xccl built without feature `mpi`, is refused with what to do.

use std::process::{Command, Output};

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

/// One rank of `xccl train` (as a launcher would start it) with `XCCL_BACKEND=backend`.
fn worker_with(backend: &str) -> Output {
    Command::new(XCCL)
        .args([
            "train", "--digits", "2", "--width", "16", "--layers", "1", "--heads", "2", "--steps", "1",
            "--dp", "1",
        ])
        .arg("--out")
        .arg(std::env::temp_dir().join(format!("xccl-backend-env-{}", std::process::id())))
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("XCCL_BACKEND", backend)
        .output()
        .expect("run xccl train")
}

#[test]
fn unknown_backends_are_refused_with_the_choices() {
    let out = worker_with("nccl");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("XCCL_BACKEND='nccl' is not a backend") && err.contains("'mpi'"), "{err}");
}

#[cfg(not(feature = "mpi"))]
#[test]
fn the_mpi_backend_without_the_feature_says_how_to_get_it() {
    let out = worker_with("mpi");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("built without MPI") && err.contains("--features mpi"), "{err}");
}
