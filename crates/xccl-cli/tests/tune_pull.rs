//! `xccl tune pull` measures, between real processes, from which length this machine should
//! pull messages and puts its `pull` line into a tuning file; a job given that file
//! (`XCCL_TUNE_FILE`) pulls from those lengths, and the settings override it.

mod common;

use std::path::Path;
use std::process::Command;

use common::{run_ok, text};

fn xccl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xccl"))
}

/// The protocols of every all-gather plan that two processes logged for a 128 KiB
/// all-gather (64 KiB messages), run with `tune` as their tuning file and `env` set.
fn plans(tune: &Path, env: &[(&str, &str)]) -> Vec<String> {
    let x = env!("CARGO_BIN_EXE_xccl");
    let mut cmd = xccl();
    cmd.env("XCCL_TUNE_FILE", tune).env("XCCL_DEBUG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_ok(cmd.args([
        "run",
        "-n",
        "2",
        "--",
        x,
        "bench",
        "all_gather",
        "--sizes",
        "128K",
        "-n",
        "3",
        "-w",
        "1",
    ]));
    let all = text(&out);
    assert!(all.contains("Out of bounds values : 0 OK"), "{all}");
    let plans: Vec<String> = all
        .lines()
        .filter(|l| l.contains("all_gather #") && l.contains("protocols"))
        .map(|l| l.split("protocols").nth(1).unwrap_or("").to_string())
        .collect();
    assert!(!plans.is_empty(), "no plan logged\n{all}");
    plans
}

#[test]
fn the_measured_line_lands_in_the_tuning_file_and_jobs_pull_from_it() {
    let dir = std::env::temp_dir().join(format!("xccl-tune-pull-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("machine.tune");
    std::fs::write(&file, "# calibrated here\npull 1 1 ranks=2\npull 2 2 ranks=4\n").unwrap();
    let x = env!("CARGO_BIN_EXE_xccl");
    let out = run_ok(
        xccl()
            .args(["run", "-n", "2", "--", x, "tune", "pull", "--lengths", "16K,64K", "--target-sec", "0.01"])
            .args(["--reps", "1", "-o"])
            .arg(&file),
    );
    let written = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = written.lines().collect();
    // The line for hosts of 2 ranks replaced, the comment and the line for 4 kept.
    assert_eq!(lines.len(), 3, "{written}");
    assert_eq!(lines[..2], ["# calibrated here", "pull 2 2 ranks=4"]);
    let f: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(f.len(), 4, "{written}");
    assert_eq!((f[0], f[3]), ("pull", "ranks=2"));
    for v in &f[1..3] {
        assert!(["16384", "65536", "off"].contains(v), "a length measured, or off: {written}");
    }
    assert!(text(&out).contains(lines[2]), "printed too\n{}", text(&out));
    assert!(text(&out).contains("all_to_all/direct"), "the table\n{}", text(&out));

    // A job follows the file: 64 KiB messages never pulled, then pulled from 16 KiB.
    std::fs::write(&file, "pull off off\n").unwrap();
    assert!(plans(&file, &[]).iter().all(|p| !p.contains("pull")));
    std::fs::write(&file, "pull 16K 16K\n").unwrap();
    assert!(plans(&file, &[]).iter().all(|p| p.contains("pull")));
    // A line for this job's count of ranks on the host comes before the line for any count.
    std::fs::write(&file, "pull 16K 16K\npull off off ranks=2\n").unwrap();
    assert!(plans(&file, &[]).iter().all(|p| !p.contains("pull")));
    std::fs::write(&file, "pull off off\npull 16K 16K ranks=2\npull off off ranks=4\n").unwrap();
    assert!(plans(&file, &[]).iter().all(|p| p.contains("pull")));
    // The settings override it.
    assert!(plans(&file, &[("XCCL_PULL_PLAIN_BYTES", "off")]).iter().all(|p| !p.contains("pull")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_rank_or_lengths_out_of_order_are_refused_with_what_to_do() {
    let out = xccl().args(["tune", "pull", "--local", "1"]).output().unwrap();
    assert!(!out.status.success() && text(&out).contains("xccl run -n 2"), "{}", text(&out));
    let out = xccl().args(["tune", "pull", "--local", "2", "--lengths", "64K,16K"]).output().unwrap();
    assert!(!out.status.success() && text(&out).contains("increasing"), "{}", text(&out));
}

/// Two ranks on two hosts (`XCCL_HOST_KEY`, as on the emulated cluster's machines): both
/// refuse before measuring, saying what to do; and ranks of one host told to use TCP.
#[test]
fn a_job_across_hosts_or_over_tcp_is_refused_on_every_rank() {
    let x = env!("CARGO_BIN_EXE_xccl");
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap().port().to_string();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            xccl()
                .args(["tune", "pull", "--lengths", "16K", "--reps", "1"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", "0")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("XCCL_HOST_KEY", format!("tune-pull-host{r}"))
                .env("XCCL_TIMEOUT", "60")
                .env_remove("XCCL_STORE_ADDR")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let t = text(&out);
        assert!(
            !out.status.success() && t.contains("are on 2 hosts") && t.contains("run it on one host"),
            "rank {r}: {t}"
        );
    }
    let out = xccl()
        .env("XCCL_SHM", "0")
        .args(["run", "-n", "2", "--", x, "tune", "pull", "--lengths", "16K", "--reps", "1"])
        .output()
        .unwrap();
    // The launcher stops the other rank once one has failed, so one message may be all.
    let t = text(&out);
    assert!(!out.status.success() && t.contains("unset XCCL_SHM"), "{t}");
}

/// `xccl tune fit -o FILE` rewrites FILE with the fitted constants and keeps its `pull` line,
/// measured apart; the file then still reads as a tuning file.
#[test]
fn a_fit_written_over_the_file_keeps_its_pull_line() {
    let dir = std::env::temp_dir().join(format!("xccl-tune-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let records = dir.join("measured.tsv");
    std::fs::write(
        &records,
        "shm\ttcp\t0,0\t2,2\tall_reduce\tring\t8\t2\t4\t0\t1e-6\n\
         shm\ttcp\t0,0\t2,2\tall_reduce\tring\t1048576\t2\t4\t0\t1e-4\n\
         shm\ttcp\t0,0\t2,2\tall_reduce\trecursive_doubling\t1048576\t2\t4\t0\t2e-4\n",
    )
    .unwrap();
    let file = dir.join("machine.tune");
    std::fs::write(&file, "pull 1M off\n").unwrap();
    run_ok(xccl().arg("tune").arg("fit").arg(&records).arg("-o").arg(&file));
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains("link shm "), "the fit written: {written}");
    assert_eq!(
        written.lines().filter(|l| l.starts_with("pull")).collect::<Vec<_>>(),
        ["pull 1048576 off"],
        "{written}"
    );
    // A job reads it: 64 KiB placed messages are never pulled under `off`.
    assert!(plans(&file, &[]).iter().all(|p| !p.contains("pull")));
    std::fs::remove_dir_all(&dir).unwrap();
}
