//! `xccl bench` sweeps protocols beside algorithms, and `XCCL_DEBUG=info` names each plan's
//! protocols beside its algorithm.

mod common;

use std::process::Command;

use common::{run_ok, text};

fn xccl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xccl"))
}

#[test]
fn every_algorithm_runs_with_every_protocol_and_checks_its_data() {
    let out = run_ok(xccl().args([
        "bench",
        "all_reduce",
        "--local",
        "2",
        "--sizes",
        "8,5000",
        "-n",
        "3",
        "-w",
        "1",
        "--every-algo",
        "--every-proto",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> =
        stdout.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
    for algo in ["ring", "recursive_doubling", "direct"] {
        for proto in ["auto", "ll", "eager", "stream", "pull", "split"] {
            let name = format!("{algo}/{proto}");
            let n =
                rows.iter().filter(|r| r.split_whitespace().any(|w| w.trim_end_matches('*') == name)).count();
            assert_eq!(n, 2, "{name} at both sizes\n{}", text(&out));
        }
    }
    assert!(stdout.contains("Out of bounds values : 0 OK"), "{}", text(&out));
}

#[test]
fn the_debug_log_names_each_plans_protocols_and_bad_lists_are_refused() {
    let out = run_ok(xccl().env("XCCL_DEBUG", "info").args([
        "bench",
        "all_reduce",
        "--local",
        "2",
        "--sizes",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "--proto",
        "stream",
    ]));
    let all = text(&out);
    assert!(all.contains("protocols stream") && all.contains("all_reduce #"), "{all}");
    let out = xccl().args(["bench", "all_reduce", "--local", "2", "--proto", "ll128"]).output().unwrap();
    assert!(!out.status.success() && text(&out).contains("unknown protocol 'll128'"), "{}", text(&out));
}
