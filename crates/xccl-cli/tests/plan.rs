//! `xccl plan` on this machine: its configurations ordered by predicted step, each printed
//! command accepted and run by `xccl train`, the model states it plans for each equal to
//! what the trained ranks report holding (`held_bytes` of train's summary), and what it
//! searches refused as a flag.

use std::process::Command;

mod common;

use common::{run_ok, text};

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

/// A small model on 2 ranks; 16 rows allow every mesh, schedule and micro-batch count.
const MODEL: &[&str] = &["--digits", "2", "--width", "32", "--layers", "2", "--heads", "2", "--batch", "16"];

/// One row of the plan's table: predicted step (ms), states (MiB), configuration.
struct Row {
    step: f64,
    states: f64,
    config: String,
}

fn rows(stdout: &str) -> Vec<Row> {
    stdout
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let at = l.find("--").expect("a configuration");
            Row {
                step: cols[1].parse().unwrap(),
                states: cols[6].parse().unwrap(),
                config: l[at..].to_string(),
            }
        })
        .collect()
}

#[test]
fn the_plans_commands_run_and_hold_the_planned_model_states() {
    let out = run_ok(
        Command::new(XCCL).arg("plan").args(MODEL).args(["--ranks", "2", "--top", "6", "--iters", "2"]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 6, "{stdout}");
    assert!(rows.windows(2).all(|w| w[0].step <= w[1].step), "not fastest first:\n{stdout}");
    let commands: Vec<&str> = stdout.lines().filter(|l| l.starts_with("xccl train ")).collect();
    assert_eq!(commands.len(), rows.len(), "{stdout}");
    for (row, command) in rows.iter().zip(&commands) {
        assert!(command.ends_with(&row.config), "{command} is not {}", row.config);
        let dir = std::env::temp_dir().join(format!("xccl-plan-{}-{}", std::process::id(), row.config.len()));
        let _ = std::fs::remove_dir_all(&dir);
        let args: Vec<&str> = command.split(' ').skip(1).collect();
        let run = Command::new(XCCL)
            .args(&args)
            .args(["--steps", "2", "--out"])
            .arg(&dir)
            .env("XCCL_TIMEOUT", "120")
            .output()
            .expect("run xccl train");
        assert!(run.status.success(), "{command}: {}", text(&run));
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
        // The fullest rank's parameters, gradients and optimiser state.
        let held = summary["per_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                ["params", "grads", "optimizer"]
                    .iter()
                    .map(|k| r["held_bytes"][k].as_f64().unwrap())
                    .sum::<f64>()
            })
            .fold(0.0, f64::max);
        let held_mib = held / f64::from(1u32 << 20);
        assert!(
            (held_mib - row.states).abs() <= 0.002 + 0.01 * held_mib,
            "{command}: planned {} MiB of model states, the ranks held {held_mib:.4} MiB",
            row.states
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn what_the_plan_searches_is_not_a_flag() {
    for flags in [&["--tp", "2"][..], &["--zero", "1"], &["--pp", "2", "--schedule", "gpipe"]] {
        let out =
            Command::new(XCCL).arg("plan").args(MODEL).args(["--ranks", "2"]).args(flags).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flags[0]) && err.contains("--ranks"), "{flags:?}: {err}");
    }
    let out = Command::new(XCCL)
        .arg("plan")
        .args(MODEL)
        .args(["--ranks", "2", "--mem-gib", "0.000001"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mem-gib"), "{}", text(&out));
}
