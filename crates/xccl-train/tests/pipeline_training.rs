//! Pipeline parallelism on thread ranks gives the parameters of single-process training:
//! pp ∈ {1, 2, 4} × micro-batches ∈ {1, 3, 8} × every schedule, with and without
//! recomputation; the 3D shapes dp × pp × tp up to 8 ranks, interleaved too; tied and
//! untied heads; ZB-V in its V, tied and untied. Reruns are bit-identical; a checkpoint
//! written under one (dp, pp, tp) resumes under another; impossible shapes fail on every
//! rank before any communication.

mod common;

use common::{ddp, moved, reference, rel_diff, run, run_with, temp, tiny, with_checkpoint};
use xccl_train::config::{Balance, PipelineConfig};
use xccl_train::optim::OptimConfig;
use xccl_train::pipeline::schedule::Kind;
use xccl_train::trainer::TrainConfig;

const STEPS: u64 = 20;
const TOLERANCE: f64 = 1e-5;

/// `config` with a pipeline of `stages` stages running `schedule` on `m` micro-batches.
fn piped(
    config: &TrainConfig,
    stages: usize,
    schedule: Kind,
    v: usize,
    m: usize,
    recompute: bool,
) -> TrainConfig {
    let pipeline =
        PipelineConfig { stages, schedule, virtual_stages: v, recompute, balance: Balance::Params };
    TrainConfig { pipeline: Some(pipeline), accum: m, ..config.clone() }
}

/// Trains `config` on `dp` data-parallel replicas and checks every rank against `expect`.
fn check(config: &TrainConfig, dp: usize, expect: &[f32], what: &str) -> Vec<f32> {
    let ranks = dp * config.pp() * config.tp;
    let outcomes = run(ranks, config);
    for o in &outcomes[1..] {
        assert_eq!(o.params, outcomes[0].params, "{what}: ranks disagree");
    }
    let d = rel_diff(&outcomes[0].params, expect);
    assert!(d < TOLERANCE, "{what}: relative difference {d:e} from single-process training");
    let summary = outcomes[0].summary.as_ref().expect("rank 0 summarises");
    assert_eq!(summary.losses.len() as u64, config.steps, "{what}: a loss per step reaches rank 0");
    outcomes[0].params.clone()
}

#[test]
fn every_schedule_stage_count_and_micro_batch_count_matches_single_process_training() {
    // 2 layers: 4 blocks, enough for 4 stages. Tied head: the embedding is shared by the
    // first and the last stage.
    let base = tiny(OptimConfig::adamw(1e-3), ddp(), 24, 1, STEPS);
    let expect = reference(&base);
    assert!(moved(&base, &expect) > 100.0 * TOLERANCE, "training did not move the parameters");
    for stages in [1, 2, 4] {
        for m in [1, 3, 8] {
            for schedule in [Kind::GPipe, Kind::OneFOneB, Kind::ZeroBubble] {
                for recompute in [false, true] {
                    let config = piped(&base, stages, schedule, 1, m, recompute);
                    let what = format!("tied, pp {stages}, m {m}, {schedule}, recompute {recompute}");
                    check(&config, 1, &expect, &what);
                }
            }
        }
    }
}

#[test]
fn interleaved_schedules_and_an_untied_head_match() {
    // 4 layers: 2 stages × 2 chunks of one layer each.
    let mut base = tiny(OptimConfig::adamw(1e-3), ddp(), 16, 1, STEPS);
    base.model.layers = 4;
    base.model.tied = false;
    let expect = reference(&base);
    for (stages, v, m, recompute) in [(2, 2, 2, false), (2, 2, 8, true), (4, 1, 8, false)] {
        let config = piped(&base, stages, Kind::Interleaved, v, m, recompute);
        let what = format!("untied, interleaved, pp {stages}, v {v}, m {m}, recompute {recompute}");
        check(&config, 1, &expect, &what);
    }
    // Stages cut by measured block time, and by an explicit list.
    for balance in [Balance::Time, Balance::Blocks(vec![1, 4, 1])] {
        let mut config = piped(&base, 3, Kind::OneFOneB, 1, 4, false);
        if let Some(p) = &mut config.pipeline {
            p.balance = balance.clone();
        }
        check(&config, 1, &expect, &format!("pp 3 balanced by {balance:?}"));
    }
}

#[test]
fn zero_bubble_v_matches_single_process_training() {
    // Two chunks per stage in a V. Tied: the embedding (first stage) and the head (last
    // stage) are both rank 0's, and rank p − 1 hands its first chunk's output to its second
    // itself.
    // Cut by parameter counts over the V (any number of layers), or by an explicit list.
    for (layers, stages, tied, m, recompute, dp, balance) in [
        (4, 2, true, 3, false, 1, Balance::Params),
        (3, 2, false, 8, true, 1, Balance::Params),
        (4, 2, true, 4, false, 2, Balance::Blocks(vec![1, 2, 2, 1])),
        (6, 4, true, 7, false, 1, Balance::Params),
    ] {
        let mut base = tiny(OptimConfig::adamw(1e-3), ddp(), 4 * m * dp, 1, STEPS);
        base.model.layers = layers;
        base.model.tied = tied;
        let expect = reference(&base);
        let mut config = piped(&base, stages, Kind::ZeroBubbleV, 2, m, recompute);
        if let Some(p) = &mut config.pipeline {
            p.balance = balance;
        }
        let what = format!("zb-v, pp {stages}, dp {dp}, m {m}, tied {tied}, recompute {recompute}");
        check(&config, dp, &expect, &what);
    }
}

#[test]
fn three_dimensional_meshes_match_single_process_training() {
    let mut base = tiny(OptimConfig::adamw(1e-3), ddp(), 16, 1, STEPS);
    base.model.heads = 4;
    let expect = reference(&base);
    // (dp, pp, tp, schedule, v, m)
    let shapes = [
        (2, 2, 2, Kind::OneFOneB, 1, 4),
        (1, 2, 4, Kind::GPipe, 1, 2),
        (4, 2, 1, Kind::OneFOneB, 1, 2),
        (2, 2, 2, Kind::ZeroBubble, 1, 4),
        (1, 2, 2, Kind::ZeroBubbleV, 2, 4),
    ];
    for (dp, pp, tp, schedule, v, m) in shapes {
        let mut config = piped(&base, pp, schedule, v, m, false);
        config.tp = tp;
        config.sp = tp > 1;
        check(&config, dp, &expect, &format!("dp {dp} pp {pp} tp {tp} {schedule} m {m}"));
    }
    // Interleaving on 2 × 4: 8 layers, one per chunk.
    let mut deep = base.clone();
    deep.model.layers = 8;
    deep.model.tied = false;
    let expect = reference(&deep);
    let config = piped(&deep, 4, Kind::Interleaved, 2, 4, true);
    check(&config, 2, &expect, "dp 2 pp 4 tp 1 interleaved v 2 m 4, recompute");
}

#[test]
fn pipeline_runs_are_bit_identical() {
    let base = tiny(OptimConfig::adamw(1e-2), ddp(), 16, 1, STEPS);
    let config = piped(&base, 2, Kind::OneFOneB, 1, 4, false);
    let a = run(4, &config);
    let b = run(4, &config);
    assert_eq!(a[0].params, b[0].params);
    assert_eq!(a[0].summary.as_ref().unwrap().losses, b[0].summary.as_ref().unwrap().losses);
}

#[test]
fn a_checkpoint_resumes_under_another_mesh() {
    let dir = temp("pp", "ckpt");
    let mut base = tiny(OptimConfig::adamw(1e-3), ddp(), 16, 1, STEPS);
    base.model.heads = 4;
    let whole = reference(&base);
    // The first half on dp 2 × pp 2, the second on pp 4 × tp 2, then on one rank.
    let first = with_checkpoint(
        TrainConfig { steps: STEPS / 2, ..piped(&base, 2, Kind::GPipe, 1, 2, false) },
        &dir,
        0,
        false,
    );
    run(4, &first);
    let mut second = with_checkpoint(piped(&base, 4, Kind::OneFOneB, 1, 4, true), &dir, 0, true);
    second.tp = 2;
    let resumed = run(8, &second);
    let d = rel_diff(&resumed[0].params, &whole);
    assert!(d < TOLERANCE, "resumed under pp 4 × tp 2: relative difference {d:e}");
    // And the other way: written by a pipeline, resumed without one.
    run(4, &first);
    let plain = with_checkpoint(base.clone(), &dir, 0, true);
    let d = rel_diff(&run(1, &plain)[0].params, &whole);
    assert!(d < TOLERANCE, "resumed on one rank: relative difference {d:e}");
    std::fs::remove_dir_all(dir).unwrap();
    // Written by ZB-V (rank 0 holding the first and the last stage), resumed by 1F1B on
    // the looped placement (a directory of its own: nothing else to resume from).
    let dir = temp("pp", "ckpt-zbv");
    let first = with_checkpoint(
        TrainConfig { steps: STEPS / 2, ..piped(&base, 2, Kind::ZeroBubbleV, 2, 4, false) },
        &dir,
        0,
        false,
    );
    run(2, &first);
    let looped = with_checkpoint(piped(&base, 2, Kind::OneFOneB, 1, 4, false), &dir, 0, true);
    let d = rel_diff(&run(2, &looped)[0].params, &whole);
    assert!(d < TOLERANCE, "written by zb-v, resumed by 1f1b: relative difference {d:e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn impossible_pipelines_fail_on_every_rank_before_communicating() {
    let base = tiny(OptimConfig::adamw(1e-3), ddp(), 16, 1, 2);
    let cases = [
        // 16 rows do not make 2 shares of 3 equal micro-batches.
        (piped(&base, 2, Kind::OneFOneB, 1, 3, false), 4, "multiple of --dp × --micro-batches"),
        // 4 blocks cannot make 5 stages.
        (piped(&base, 5, Kind::GPipe, 1, 2, false), 5, "only 4 blocks"),
        // 2 layers over 2 stages × 2 chunks.
        (piped(&base, 2, Kind::Interleaved, 2, 2, false), 2, "does not divide the layers per stage"),
        // 3 ranks are not dp × 2 stages.
        (piped(&base, 2, Kind::GPipe, 1, 2, false), 3, "--dp × --pp × --tp"),
    ];
    for (config, ranks, expect) in cases {
        let results = run_with(ranks, &config, |_| ());
        for r in results {
            let e = r.err().unwrap_or_else(|| panic!("{expect}: a rank went on")).to_string();
            assert!(e.contains(expect), "expected '{expect}' in: {e}");
        }
    }
}
