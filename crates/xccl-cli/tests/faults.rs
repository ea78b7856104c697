//! A shortened fault campaign (`bench/faults.py`, 12 trials) on the emulated cluster: ranks
//! killed, stopped, cut off or throttled in the middle of random collectives. No survivor
//! may hang or return a wrong result, none may take longer than its limit to fail, nothing
//! of the job may be left behind, and a killed rank must be named. Skipped, saying why,
//! where network namespaces cannot be made or Python is missing (unless `XCCL_REQUIRE` names
//! them). The full campaign (200 trials) runs from `bench/`.

mod common;

use std::process::Command;

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

#[test]
fn a_short_fault_campaign_on_the_emulated_cluster() {
    if !rustix::process::geteuid().is_root() {
        common::require::skip("netns", "not root, and the emulated cluster needs network namespaces");
        return;
    }
    if Command::new("python3").arg("--version").output().is_err() {
        common::require::skip("python", "python3 not found (it runs bench/faults.py)");
        return;
    }
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out_dir = std::env::temp_dir().join(format!("xccl-faults-{}", std::process::id()));
    let out = Command::new("python3")
        .arg(format!("{repo}/bench/faults.py"))
        .args(["--trials", "12", "--seed", "5", "--train-share", "0", "--xccl", XCCL])
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("cluster.sh") && stdout.is_empty() {
        common::require::skip("netns", format!("the emulated cluster could not be made: {stderr}"));
        return;
    }
    println!("{stdout}");
    let trials = std::fs::read_to_string(out_dir.join("trials.jsonl")).unwrap_or_default();
    let records: Vec<serde_json::Value> =
        trials.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(records.len(), 12, "every trial ran:\n{stdout}\n{stderr}");
    for r in &records {
        let outcome = r["outcome"].as_str().unwrap_or("?");
        assert!(
            !["hang", "wrong-result", "leftover", "not-started", "slow"].contains(&outcome),
            "trial {}: {outcome}: {r}\n{stdout}",
            r["trial"]
        );
        if r["kind"] == "kill" {
            assert_eq!(outcome, "ok", "a killed rank is named by every survivor: {r}");
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}
