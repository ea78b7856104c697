//! Every schedule of every collective, proven symbolically on every world size 1..=64 and
//! every root (the same run as `xccl verify`).

use xccl::verify;

#[test]
fn every_algorithm_is_correct_on_every_world_size_up_to_64() {
    let mut failures = Vec::new();
    let mut cases = 0;
    verify::verify_all(64, |cell| {
        cases += cell.cases;
        failures.extend(cell.failure);
    });
    assert!(failures.is_empty(), "{} failures, first: {}", failures.len(), failures[0]);
    assert!(cases > 30_000, "only {cases} cases ran");
}
