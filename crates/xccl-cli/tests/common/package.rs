//! The Python package as the tests load it: `python/xccl/*.py`, its native PyTorch backend's
//! sources (`csrc/`) and the extension cargo built for the test binary
//! (`target/<profile>/deps/libxccl_python.so`, as `xccl/_xccl.abi3.so`), assembled in a
//! directory that goes on `PYTHONPATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

const PYTHON_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../python");

/// The extension cargo built for this test binary (in `target/<profile>/deps`).
pub fn extension() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let deps = exe.parent().ok_or("test binary has no directory")?;
    [deps.join("libxccl_python.so"), deps.join("../libxccl_python.so")]
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| format!("libxccl_python.so not found near {}", deps.display()))
}

/// Puts a copy of `from` at `to` unless `to` has the same bytes already (a source rewritten
/// with a new time would make ninja compile the backend again), renaming a new file into
/// place (a rank of another run may have the old one mapped).
fn install(from: &Path, to: &Path) -> Result<(), String> {
    let bytes = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if std::fs::read(to).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let tmp = to.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, &bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mode = std::fs::metadata(from).map_err(|e| e.to_string())?.permissions();
    std::fs::set_permissions(&tmp, mode).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, to).map_err(|e| format!("{}: {e}", to.display()))
}

/// Copies `from`'s files whose names `keep` accepts into `to` (see [`install`]).
fn copy_files(from: &Path, to: &Path, keep: impl Fn(&Path) -> bool) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_file() && keep(&path) {
            let name = path.file_name().ok_or("a source without a name")?;
            install(&path, &to.join(name))?;
        }
    }
    Ok(())
}

/// Assembles the package `xccl` in `root` (made if needed); `root` goes on `PYTHONPATH`.
pub fn assemble(root: &Path) -> Result<(), String> {
    let pkg = root.join("xccl");
    let sources = Path::new(PYTHON_DIR).join("xccl");
    copy_files(&sources, &pkg, |p| p.extension().is_some_and(|x| x == "py" || x == "pyi"))?;
    copy_files(&sources.join("csrc"), &pkg.join("csrc"), |_| true)?;
    install(&extension()?, &pkg.join("_xccl.abi3.so"))
}

/// Compiles the native PyTorch backend of the package in `root` with `python` (once per
/// version of its sources: PyTorch's extension cache keeps it), before ranks start, so that no
/// rank compiles while its peers wait. `Err`: no C++ compiler, so the caller skips; a backend
/// that does not compile where there is one fails.
pub fn build_backend(python: &Path, root: &Path) -> Result<(), String> {
    let cxx = Command::new("c++").arg("--version").output().is_ok_and(|o| o.status.success());
    if !cxx {
        return Err("no C++ compiler (c++) to build the native PyTorch backend (apt-get install g++)".into());
    }
    let out = Command::new(python)
        .args(["-m", "xccl.torch"])
        .env("PYTHONPATH", root)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    assert!(out.status.success(), "building the native backend failed: {}", super::text(&out));
    Ok(())
}
