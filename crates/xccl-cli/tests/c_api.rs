//! The C API with a real C and C++ compiler: `crates/xccl-c/install.sh` installs the library
//! (shared and static), the header and the pkg-config file into a temporary prefix; the
//! example programs (`crates/xccl-c/examples/`) are compiled with what `pkg-config` says and
//! run under `xccl run` (every collective checked against a reference computed from what each
//! rank contributes; a unique id, async waits, an abort), statically linked too, and across
//! two emulated hosts (`bench/cluster.sh`, where namespaces can be made). Without a C compiler
//! each test says why it skips; `.ci/run` installs one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

// The emulated-cluster harness of the xccl crate's tests (this file uses part of it).
#[allow(dead_code)]
#[path = "../../xccl/tests/common/cluster.rs"]
mod cluster;
mod common;

use common::text;

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");
const CRATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../xccl-c");

/// The installed prefix and the compiled examples, once per test binary; `Err` says why the
/// tests skip.
struct Built {
    prefix: PathBuf,
    c: PathBuf,
    c_static: PathBuf,
    cpp: PathBuf,
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

fn built() -> &'static Result<Built, String> {
    static BUILT: OnceLock<Result<Built, String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        for tool in ["cc", "c++", "pkg-config"] {
            if !have(tool) {
                return Err(format!("{tool} not found (apt-get install gcc g++ pkg-config)"));
            }
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c-api-{}", std::process::id()));
        let prefix = dir.join("prefix");
        let out = Command::new("bash")
            .arg(Path::new(CRATE).join("install.sh"))
            .arg(&prefix)
            .env("PROFILE", "debug")
            .env("CARGO", env!("CARGO"))
            .output()
            .map_err(|e| format!("bash: {e}"))?;
        assert!(out.status.success(), "install.sh failed: {}", text(&out));
        let pc = |args: &[&str]| -> Vec<String> {
            let o = Command::new("pkg-config")
                .args(args)
                .arg("xccl")
                .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
                .output()
                .expect("pkg-config runs");
            assert!(o.status.success(), "pkg-config {args:?} xccl: {}", text(&o));
            String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect()
        };
        let (cflags, libs) = (pc(&["--cflags"]), pc(&["--libs"]));
        let private: Vec<String> =
            pc(&["--static", "--libs-only-l"]).into_iter().filter(|l| l != "-lxccl").collect();
        let rpath = format!("-Wl,-rpath,{}", prefix.join("lib").display());
        let compile = |compiler: &str, std: &str, src: &str, exe: &Path, link: &[String]| {
            let o = Command::new(compiler)
                .args([std, "-Wall", "-Wextra", "-Werror", "-O1"])
                .arg(Path::new(CRATE).join("examples").join(src))
                .args(&cflags)
                .arg("-o")
                .arg(exe)
                .args(link)
                .output()
                .expect("the compiler runs");
            assert!(o.status.success(), "{compiler} {src}: {}", text(&o));
        };
        let (c, c_static, cpp) =
            (dir.join("collectives"), dir.join("collectives-static"), dir.join("unique_id"));
        let shared: Vec<String> = libs.iter().cloned().chain([rpath]).collect();
        compile("cc", "-std=c11", "collectives.c", &c, &shared);
        let fixed: Vec<String> =
            [prefix.join("lib/libxccl.a").display().to_string()].into_iter().chain(private).collect();
        compile("cc", "-std=c11", "collectives.c", &c_static, &fixed);
        compile("c++", "-std=c++17", "unique_id.cpp", &cpp, &shared);
        Ok(Built { prefix, c, c_static, cpp })
    })
}

/// `xccl run -n N -- exe`, which must succeed with one line "checks passed" per rank.
fn run(n: usize, exe: &Path) {
    let out = Command::new(XCCL)
        .args(["run", "-n", &n.to_string(), "--"])
        .arg(exe)
        .env("XCCL_TIMEOUT", "60")
        .output()
        .expect("xccl run starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{} on {n} ranks: {}", exe.display(), text(&out));
    assert_eq!(stdout.matches("checks passed").count(), n, "every rank reports: {stdout}");
}

#[test]
fn the_c_example_checks_every_collective_under_xccl_run() {
    let b = match built() {
        Ok(b) => b,
        Err(why) => return common::require::skip("cc", why),
    };
    for n in [1, 2, 3] {
        run(n, &b.c);
    }
    // The static library needs nothing at run time.
    let ldd = Command::new("ldd").arg(&b.c_static).output().map(|o| o.stdout).unwrap_or_default();
    assert!(!String::from_utf8_lossy(&ldd).contains("libxccl"), "statically linked");
    run(2, &b.c_static);
}

#[test]
fn the_cpp_example_meets_by_unique_id_and_sees_an_abort() {
    let b = match built() {
        Ok(b) => b,
        Err(why) => return common::require::skip("cc", why),
    };
    assert!(b.prefix.join("include/xccl.h").exists());
    for n in [2, 3] {
        run(n, &b.cpp);
    }
}

#[test]
fn the_c_example_runs_across_two_emulated_hosts() {
    let b = match built() {
        Ok(b) => b,
        Err(why) => return common::require::skip("cc", why),
    };
    let c = match cluster::Cluster::up(&format!("capi{}", std::process::id() % 10000), &["--hosts", "2"]) {
        Ok(c) => c,
        Err(why) => return common::require::skip("netns", why),
    };
    for exe in [&b.c, &b.cpp] {
        let exe = exe.display().to_string();
        let out = c.launch(2, &[("XCCL_TIMEOUT", "60")], &[&exe]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{exe} on 2 hosts × 2 ranks: {}", text(&out));
        assert_eq!(stdout.matches("checks passed").count(), 4, "every rank reports: {stdout}");
    }
}
