//! The equivalence principle: k steps of data-parallel training (DDP on 1 to 4 ranks, with
//! and without gradient accumulation and with uneven shares; the synchronous parameter
//! server with 1 and 2 servers, serving while working or dedicated) give the parameters of
//! k steps of single-process training on the same global batch, and two runs of the same
//! parallel configuration give the same bits.

mod common;

use common::{ddp, moved, reference, rel_diff, run, tiny};
use xccl_train::optim::OptimConfig;
use xccl_train::ps::PsConfig;
use xccl_train::trainer::Strategy;

const STEPS: u64 = 20;
const TOLERANCE: f64 = 1e-5;

/// Learning rates that move the parameters by several percent in 20 steps. (With AdamW at
/// 1e-2 they move by 45%, and rounding differences of 1e-9 after the first step, which any
/// change in summation order makes, grow past 1e-5 by step 20: also between two
/// single-process runs that merely sum in another order. Equivalence is about the
/// computation, not about the chaos of an over-driven optimiser.)
fn optimizers() -> [OptimConfig; 2] {
    [OptimConfig::Sgd { lr: 0.05, momentum: 0.9, weight_decay: 1e-3 }, OptimConfig::adamw(1e-3)]
}

#[test]
fn ddp_matches_single_process_training() {
    for optim in optimizers() {
        // 7 rows do not divide among 2, 3 or 4 ranks; with 4 ranks and 2 micro-batches one
        // micro-batch is empty.
        let expect = reference(&tiny(optim, ddp(), 7, 1, STEPS));
        for ranks in 1..=4 {
            for accum in [1, 2] {
                let config = tiny(optim, ddp(), 7, accum, STEPS);
                let outcomes = run(ranks, &config);
                for o in &outcomes[1..] {
                    assert_eq!(o.params, outcomes[0].params, "ranks disagree ({ranks} ranks, accum {accum})");
                }
                let d = rel_diff(&outcomes[0].params, &expect);
                assert!(d < TOLERANCE, "{optim}: {ranks} ranks, accum {accum}: relative difference {d:e}");
                assert!(moved(&config, &expect) > 100.0 * TOLERANCE, "training did not move the parameters");
            }
        }
    }
}

#[test]
fn ddp_with_a_rank_that_gets_no_rows() {
    let optim = OptimConfig::adamw(1e-3);
    let config = tiny(optim, ddp(), 3, 1, STEPS);
    let outcomes = run(4, &config);
    let d = rel_diff(&outcomes[3].params, &reference(&config));
    assert!(d < TOLERANCE, "relative difference {d:e}");
}

#[test]
fn ddp_runs_are_bit_identical() {
    let config = tiny(OptimConfig::adamw(1e-2), ddp(), 7, 2, STEPS);
    let a = run(3, &config);
    let b = run(3, &config);
    assert_eq!(a[0].params, b[0].params);
    assert_eq!(a[0].summary.as_ref().unwrap().losses, b[0].summary.as_ref().unwrap().losses);
}

fn ps(servers: usize, dedicated: bool) -> Strategy {
    Strategy::Ps(PsConfig { servers, dedicated, staleness: 0 })
}

#[test]
fn synchronous_parameter_server_matches_single_process_training() {
    // (ranks, servers, dedicated): one server that also works, two that also work, one
    // dedicated server with two workers, two dedicated servers with two workers.
    let layouts = [(2, 1, false), (3, 2, false), (3, 1, true), (4, 2, true)];
    for optim in optimizers() {
        let expect = reference(&tiny(optim, ddp(), 7, 1, STEPS));
        for (ranks, servers, dedicated) in layouts {
            let config = tiny(optim, ps(servers, dedicated), 7, 2, STEPS);
            let outcomes = run(ranks, &config);
            for o in &outcomes[1..] {
                assert_eq!(o.params, outcomes[0].params, "ranks disagree ({ranks} ranks, {servers} servers)");
            }
            let d = rel_diff(&outcomes[0].params, &expect);
            assert!(d < TOLERANCE, "{optim}: {ranks} ranks, {servers} servers, dedicated {dedicated}: {d:e}");
            // Synchronous: every step computed on the newest parameters.
            for o in &outcomes {
                assert!(
                    o.steps.iter().all(|s| s.version == Some(s.step)),
                    "a synchronous step used stale parameters"
                );
            }
        }
    }
}

#[test]
fn synchronous_parameter_server_runs_are_bit_identical() {
    let config = tiny(OptimConfig::adamw(1e-2), ps(2, false), 7, 1, STEPS);
    let a = run(3, &config);
    let b = run(3, &config);
    assert_eq!(a[0].params, b[0].params);
}
