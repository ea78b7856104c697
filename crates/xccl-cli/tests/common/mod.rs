//! Helpers shared by the command's integration tests: a finished command in words, running
//! one that must succeed, the bits of a run's final parameters, a Python with PyTorch, and
//! the Python package as the tests load it (`package`).

#![allow(dead_code)]

pub mod package;
#[path = "../../../xccl/tests/common/require.rs"]
pub mod require;

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

/// The final parameters a run left in its checkpoint under `out`, by name.
pub fn params(out: &Path) -> BTreeMap<String, Vec<f32>> {
    read_params(&out.join(DIR_NAME)).unwrap_or_else(|e| panic!("checkpoint in {}: {e}", out.display()))
}

/// ‖a − b‖ / ‖b‖ over every parameter (the same names in both).
pub fn rel_diff(a: &BTreeMap<String, Vec<f32>>, b: &BTreeMap<String, Vec<f32>>) -> f64 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "parameter names");
    let (mut d, mut n) = (0.0, 0.0);
    for (k, x) in a {
        for (p, q) in x.iter().zip(&b[k]) {
            d += (f64::from(*p) - f64::from(*q)).powi(2);
            n += f64::from(*q).powi(2);
        }
    }
    (d / n).sqrt()
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
        require::skip(
            "torch",
            "no Python with PyTorch (set XCCL_TEST_PYTHON, or run .ci/run once to set up its venv)",
        );
    }
    found
}

/// Settings for `mpirun` in tests: Open MPI as root in containers, more ranks than cores,
/// shared memory and TCP on loopback only; MPICH 4.0.2 (Debian 12), which crashes in its
/// shared-memory `MPI_Reduce` with `MPI_IN_PLACE` at the root (a plain C program does
/// too), on its generic collectives. Each MPI ignores the other's variables.
pub fn mpirun_env(cmd: &mut Command) -> &mut Command {
    cmd.envs([
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
        ("OMPI_MCA_pml", "ob1"),
        ("OMPI_MCA_btl", "self,vader,tcp"),
        ("OMPI_MCA_btl_tcp_if_include", "lo"),
        ("OMPI_MCA_oob_tcp_if_include", "lo"),
        ("MPIR_CVAR_DEVICE_COLLECTIVES", "none"),
    ])
}
