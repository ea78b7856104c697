//! PyTorch's own distributed tests (`torch.testing._internal.distributed.distributed_test`, run
//! as PyTorch runs them for Gloo: `bench/torch_suite.py`) on the native backend, registered as
//! `"xccl_cpu"` (the suite takes "xccl" for PyTorch's Intel backend). CI runs the subset in
//! `bench/torch_suite_ci.txt` (tests that pass on Gloo, covering rooted and unrooted
//! collectives, sub-groups, destroying groups, async work, send/recv and DDP) at
//! `WORLD_SIZE=2`; every one must pass.
//! The whole suite at 2 and 3 ranks, against Gloo: `bench/torch_suite.sh`, results in
//! docs/PERFORMANCE.md. Skipped, saying why, without a Python with PyTorch and pytest or a C++
//! compiler; `.ci/run` sets them up.

use std::path::Path;
use std::process::Command;

mod common;

use common::text;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

#[test]
fn pytorchs_distributed_tests_pass_on_xccl() {
    let Some(python) = common::torch_python() else { return };
    let pytest =
        Command::new(&python).args(["-c", "import pytest"]).output().is_ok_and(|o| o.status.success());
    if !pytest {
        return common::require::skip(
            "torch",
            format!("{} has no pytest (pip install pytest, or run .ci/run)", python.display()),
        );
    }
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("torch-suite");
    common::package::assemble(&root).expect("assembling the package");
    if let Err(why) = common::package::build_backend(&python, &root) {
        return common::require::skip("torch", why);
    }
    let out = Command::new(&python)
        .arg(Path::new(REPO).join("bench/torch_suite.py"))
        .args(["--backend", "xccl_cpu", "--world-size", "2", "--quiet-table"])
        .arg("--subset")
        .arg(Path::new(REPO).join("bench/torch_suite_ci.txt"))
        .arg("--out-dir")
        .arg(root.join(format!("out-{}", std::process::id())))
        .env("PYTHONPATH", &root)
        .env_remove("XCCL_SECRET")
        .output()
        .expect("the suite runner starts");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "PyTorch's distributed tests on xccl:\n{}", text(&out));
}
