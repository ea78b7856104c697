//! Checkpoints: a run interrupted and resumed ends with exactly the parameters of an
//! uninterrupted run; a checkpoint of another configuration is refused with a reason.

mod common;

use std::path::PathBuf;

use common::{ddp, run, run_with, tiny, with_checkpoint};
use xccl_train::optim::OptimConfig;
use xccl_train::ps::PsConfig;
use xccl_train::trainer::{Strategy, TrainConfig};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xccl-train-resume-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn resumed_runs_end_bit_identical() {
    let strategies = [ddp(), Strategy::Ps(PsConfig { servers: 2, dedicated: false, staleness: 0 })];
    for (i, strategy) in strategies.into_iter().enumerate() {
        let base = tiny(OptimConfig::adamw(1e-2), strategy, 7, 2, 12);
        let whole_dir = dir(&format!("whole{i}"));
        let whole = run(2, &with_checkpoint(base.clone(), &whole_dir, 5, false));
        // Interrupted after 7 steps (the checkpoint is written at the end), then resumed.
        let part_dir = dir(&format!("part{i}"));
        run(2, &with_checkpoint(TrainConfig { steps: 7, ..base.clone() }, &part_dir, 5, false));
        let resumed = run(2, &with_checkpoint(base.clone(), &part_dir, 5, true));
        assert_eq!(resumed[0].params, whole[0].params, "{strategy}: resumed run differs");
        assert_eq!(resumed[0].steps.len(), 5);
        let (a, b) = (whole[0].summary.as_ref().unwrap(), resumed[0].summary.as_ref().unwrap());
        assert_eq!(a.losses, b.losses, "the loss history continues across the resume");
        // A different configuration is refused, naming both.
        let other =
            with_checkpoint(TrainConfig { optim: OptimConfig::adamw(2e-2), ..base }, &whole_dir, 5, true);
        let errors: Vec<String> =
            run_with(2, &other, |_| ()).into_iter().filter_map(|r| r.err().map(|e| e.to_string())).collect();
        assert_eq!(errors.len(), 2, "every rank must fail");
        assert!(
            errors[0].contains("different configuration") && errors[0].contains("lr=0.02"),
            "{}",
            errors[0]
        );
        for d in [whole_dir, part_dir] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}

#[test]
fn resume_without_a_checkpoint_says_so() {
    let d = dir("missing");
    let config = with_checkpoint(tiny(OptimConfig::adamw(1e-2), ddp(), 4, 1, 2), &d, 0, true);
    let errors: Vec<String> =
        run_with(2, &config, |_| ()).into_iter().filter_map(|r| r.err().map(|e| e.to_string())).collect();
    assert_eq!(errors.len(), 2);
    assert!(errors.iter().any(|e| e.contains("no checkpoint there")), "{errors:?}");
    std::fs::remove_dir_all(d).unwrap();
}
