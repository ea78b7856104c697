//! `xccl bench` sweeps protocols beside algorithms, `XCCL_DEBUG=info` names each plan's
//! protocols beside its algorithm, buffers on huge pages carry every collective, and buffers
//! placed within their pages show when pulls go through the bounce buffer.

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

#[test]
fn buffers_on_huge_pages_carry_every_collective_between_processes() {
    // Processes, so that large messages are copied straight out of the peer's memory (the
    // path huge pages speed up); sizes on both sides of the pull threshold.
    for (coll, extra) in [
        ("all_reduce", None),
        ("all_reduce", Some("--inplace")),
        ("all_gather", None),
        ("reduce_scatter", None),
        ("all_to_all", None),
        ("broadcast", None),
        ("sendrecv", None),
    ] {
        let mut cmd = xccl();
        cmd.args(["run", "-n", "2", "--", env!("CARGO_BIN_EXE_xccl"), "bench", coll, "--huge-pages"]);
        cmd.args(["--sizes", "8,1M,6M", "-n", "3", "-w", "1"]).args(extra);
        let out = run_ok(&mut cmd);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let rows = stdout
            .lines()
            .filter(|l| l.starts_with("[0]") && l[3..].trim_start().starts_with(char::is_numeric));
        assert_eq!(rows.count(), 3, "{coll} {extra:?}: a row per size\n{}", text(&out));
        assert!(stdout.contains("Out of bounds values : 0 OK"), "{coll} {extra:?}\n{}", text(&out));
    }
}

#[test]
fn computing_between_runs_is_left_out_of_the_time_and_bad_values_are_refused() {
    // 200 ms of computing before each of three runs: counted, a run would take at least
    // that; left out, what remains is the collective and the wait for the later rank.
    let out = run_ok(xccl().args([
        "bench",
        "all_reduce",
        "--local",
        "2",
        "--sizes",
        "8",
        "-n",
        "3",
        "-w",
        "1",
        "--compute-us",
        "200000",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout.lines().find(|l| l.trim_start().starts_with("8 ")).expect("a row of 8 bytes");
    let time: f64 = row.split_whitespace().nth(5).and_then(|t| t.parse().ok()).expect("the time column");
    assert!(time < 100_000.0, "{time} µs per run counts the computing\n{}", text(&out));
    for bad in ["-1", "NaN", "1e12"] {
        let flag = format!("--compute-us={bad}");
        let out =
            xccl().args(["bench", "all_reduce", "--local", "2", "--sizes", "8", &flag]).output().unwrap();
        assert!(!out.status.success() && text(&out).contains("--compute-us"), "{bad}: {}", text(&out));
    }
}

/// Without `-n`, the number of timed runs fills `--target-sec` up to `--max-iters`: 8-byte
/// all-reduces between two thread ranks take microseconds, so a tenth of a second holds far
/// more than 7 of them and the count is the cap; a cap under 3 is refused.
#[test]
fn the_timed_runs_stop_at_the_cap() {
    let out = run_ok(xccl().args([
        "bench",
        "all_reduce",
        "--local",
        "2",
        "--sizes",
        "8",
        "--target-sec",
        "0.1",
        "--max-iters",
        "7",
        "--peer-format",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout.lines().find(|l| l.trim_start().starts_with('8')).expect("the 8-byte row");
    // size count type redop time algbw busbw #wrong tmax iters algo
    assert_eq!(row.split_whitespace().nth(9), Some("7"), "{}", text(&out));
    let refused = xccl().args(["bench", "all_reduce", "--local", "2", "--max-iters", "2"]).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--max-iters"), "{}", text(&refused));
}

#[test]
fn buffers_placed_a_few_bytes_apart_are_pulled_through_the_bounce_buffer_and_said_so() {
    // Two processes pull each other's block of a 256 KiB all-gather (pulled from 64 KiB on
    // every machine). The output 16 bytes further into its page than the input puts each
    // block's destination 16 bytes past its source: the copy goes through the bounce buffer,
    // once per process says the debug log. Buffers at the same place in their pages do not.
    let run = |offsets: &str| {
        let mut cmd = xccl();
        cmd.env("XCCL_DEBUG", "info").env("XCCL_PULL_PLAIN_BYTES", "64K").args([
            "run",
            "-n",
            "2",
            "--",
            env!("CARGO_BIN_EXE_xccl"),
            "bench",
            "all_gather",
            "--sizes",
            "256K",
            "-n",
            "3",
            "-w",
            "1",
            "--page-offsets",
            offsets,
        ]);
        text(&run_ok(&mut cmd))
    };
    let notice = "goes through a bounce buffer";
    let apart = run("0,16");
    assert!(apart.contains("Out of bounds values : 0 OK"), "{apart}");
    assert!(apart.contains("lies 16 bytes past its source"), "{apart}");
    assert_eq!(apart.matches(notice).count(), 2, "one notice per process\n{apart}");
    let together = run("16");
    assert!(together.contains("Out of bounds values : 0 OK"), "{together}");
    assert!(!together.contains(notice), "{together}");
    let bad =
        xccl().args(["bench", "all_gather", "--local", "2", "--page-offsets", "4096"]).output().unwrap();
    assert!(!bad.status.success() && text(&bad).contains("0 to 4095"), "{}", text(&bad));
}
