//! `xccl train` across two emulated hosts (`bench/cluster.sh`: network namespaces with
//! their own addresses, ranks of one host on shared memory, hosts over TCP), against one
//! process: tensor and sequence parallelism split over the hosts, zero-bubble pipelines
//! (ZB-H1, and ZB-V's V) whose stages are on different hosts, and ZeRO stage 3 over the
//! hosts end with the parameters of the single-process run.

use std::path::PathBuf;
use std::process::Command;

#[allow(dead_code)]
#[path = "../../xccl/tests/common/cluster.rs"]
mod cluster;
mod common;

use common::{params, rel_diff, run_ok, text};

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

/// A tiny model and task (batch 8: two micro-batches of 2 rows per pipeline replica), 20
/// steps.
const TINY: &[&str] = &[
    "--digits", "2", "--width", "16", "--layers", "1", "--heads", "2", "--batch", "8", "--lr", "1e-3",
    "--steps", "20",
];

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xccl-train-hosts-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn training_across_two_emulated_hosts_matches_a_single_process() {
    let c = match cluster::Cluster::up(&format!("tr{}", std::process::id() % 10000), &["--hosts", "2"]) {
        Ok(c) => c,
        Err(why) => return common::require::skip("netns", why),
    };
    let single = out_dir("single");
    run_ok(Command::new(XCCL).arg("train").args(TINY).args(["--dp", "1", "--out"]).arg(&single));
    let reference = params(&single);
    for (name, ranks_per_host, args) in [
        // The tensor-parallel pair split over the hosts.
        ("tp-sp", 1, &["--dp", "1", "--tp", "2", "--sp"][..]),
        // Each stage a tensor-parallel pair on one host, the pipeline between the hosts.
        (
            "tp-sp-zb",
            2,
            &["--dp", "1", "--tp", "2", "--sp", "--pp", "2", "--micro-batches", "2", "--schedule", "zb-h1"],
        ),
        // ZeRO-3's gathers and reduce-scatters over the hosts.
        ("zero3", 1, &["--dp", "2", "--zero", "3"]),
    ] {
        let dir = out_dir(name);
        let out_flag = dir.display().to_string();
        let cmd: Vec<&str> = [&[XCCL, "train"], TINY, args, &["--out", &out_flag]].concat();
        let out = c.launch(ranks_per_host, &[("XCCL_TIMEOUT", "60")], &cmd);
        assert!(out.status.success(), "{name} on 2 hosts x {ranks_per_host}: {}", text(&out));
        let d = rel_diff(&params(&dir), &reference);
        assert!(d < 1e-5, "{name} on 2 hosts: relative difference {d:e} from the single-process run");
        std::fs::remove_dir_all(dir).unwrap();
    }
    std::fs::remove_dir_all(single).unwrap();
    // ZB-V with a stage per host: rank 0 (host 0) holds the first stage and the last, rank 1
    // (host 1) the two middle ones, so each micro-batch crosses the link both ways twice.
    // Three layers (five blocks, four stages) and batches of 6 rows: 3 micro-batches.
    let model: Vec<&str> = TINY
        .iter()
        .map(|&a| {
            if a == "1" {
                "3"
            } else if a == "8" {
                "6"
            } else {
                a
            }
        })
        .collect();
    let single = out_dir("zbv-single");
    run_ok(Command::new(XCCL).arg("train").args(&model).args(["--dp", "1", "--out"]).arg(&single));
    let dir = out_dir("zbv");
    let out_flag = dir.display().to_string();
    let args = ["--dp", "1", "--pp", "2", "--micro-batches", "3", "--schedule", "zb-v", "--out", &out_flag];
    let cmd: Vec<&str> = [&[XCCL, "train"], &model[..], &args[..]].concat();
    let out = c.launch(1, &[("XCCL_TIMEOUT", "60")], &cmd);
    assert!(out.status.success(), "zb-v on 2 hosts: {}", text(&out));
    let d = rel_diff(&params(&dir), &params(&single));
    assert!(d < 1e-5, "zb-v on 2 hosts: relative difference {d:e} from the single-process run");
    for d in [single, dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}
