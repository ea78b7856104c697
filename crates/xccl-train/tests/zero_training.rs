//! ZeRO stages 1–3 on thread ranks give the parameters of single-process training: every
//! stage × dp ∈ {1, 2, 3, 4} (uneven shards and shares) × tp ∈ {1, 2}, both optimisers,
//! with gradient accumulation, and stage 1 in a pipeline with a tied head; every stage on a
//! model whose first block leaves its backward to candle's autograd; reruns are
//! bit-identical; stage 3 holds only its shard and the working set; a checkpoint written in
//! slices at dp 2 × tp 2 × ZeRO 3 resumes at other meshes and stages; impossible settings
//! fail on every rank before any communication.

mod common;

use common::{moved, reference, rel_diff, run, run_with, temp, tiny, with_checkpoint};
use xccl_train::config::{Balance, PipelineConfig, ZeroConfig};
use xccl_train::model::{ModelConfig, ModelKind};
use xccl_train::optim::OptimConfig;
use xccl_train::pipeline::schedule::Kind;
use xccl_train::trainer::{Strategy, TrainConfig};

const STEPS: u64 = 20;
const TOLERANCE: f64 = 1e-5;

fn zero(stage: u8) -> Strategy {
    Strategy::Zero(ZeroConfig { stage, recompute: false })
}

/// Stage 3 running each block's forward again before its backward.
fn zero3_recompute() -> Strategy {
    Strategy::Zero(ZeroConfig { stage: 3, recompute: true })
}

fn optimizers() -> [OptimConfig; 2] {
    [OptimConfig::Sgd { lr: 0.05, momentum: 0.9, weight_decay: 1e-3 }, OptimConfig::adamw(1e-3)]
}

/// `config` at tensor-parallel size `tp` (4 heads, so that tp = 2 gets two each).
fn with_tp(mut config: TrainConfig, tp: usize) -> TrainConfig {
    config.model.heads = 4;
    config.tp = tp;
    config
}

/// Trains `config` on `dp` data-parallel replicas and checks every rank against `expect`.
fn check(config: &TrainConfig, dp: usize, expect: &[f32], what: &str) -> Vec<f32> {
    let outcomes = run(dp * config.pp() * config.tp, config);
    for o in &outcomes[1..] {
        assert_eq!(o.params, outcomes[0].params, "{what}: ranks disagree");
    }
    let d = rel_diff(&outcomes[0].params, expect);
    assert!(d < TOLERANCE, "{what}: relative difference {d:e} from single-process training");
    outcomes[0].params.clone()
}

#[test]
fn every_stage_matches_single_process_training() {
    for optim in optimizers() {
        // 7 rows: uneven shares over 2, 3 and 4 ranks.
        let base = with_tp(tiny(optim, zero(1), 7, 1, STEPS), 1);
        let expect = reference(&base);
        assert!(moved(&base, &expect) > 100.0 * TOLERANCE, "training did not move the parameters");
        for (name, strategy) in [1, 2, 3]
            .map(|s| (format!("zero {s}"), zero(s)))
            .into_iter()
            .chain([("zero 3 recomputing".to_string(), zero3_recompute())])
        {
            for dp in 1..=4 {
                for tp in [1, 2] {
                    // Accumulation where every rank has rows for two micro-batches.
                    let accum = if dp <= 3 { 2 } else { 1 };
                    let config = TrainConfig { accum, ..with_tp(tiny(optim, strategy, 7, 1, STEPS), tp) };
                    check(&config, dp, &expect, &format!("{optim}: {name}, dp {dp}, tp {tp}, accum {accum}"));
                }
            }
        }
    }
}

#[test]
fn a_block_left_to_candles_autograd_gets_its_lent_parameters_as_variables() {
    // The MLP's window embedding has no backward of its own: stages 1 and 2 lend it views
    // of the gathered buffer, which must become variables before candle's autograd runs.
    let mut base = tiny(OptimConfig::adamw(1e-2), zero(1), 7, 1, STEPS);
    base.model = ModelConfig { kind: ModelKind::Mlp, layers: 2, width: 32, tied: false, ..base.model };
    let expect = reference(&base);
    assert!(moved(&base, &expect) > 100.0 * TOLERANCE, "training did not move the parameters");
    for stage in [1, 2, 3] {
        let config = TrainConfig { strategy: zero(stage), ..base.clone() };
        check(&config, 2, &expect, &format!("mlp, zero {stage}, dp 2"));
    }
}

#[test]
fn stage_one_in_a_pipeline_with_a_tied_head_matches() {
    let optim = OptimConfig::adamw(1e-3);
    let base = tiny(optim, zero(1), 8, 2, STEPS);
    let expect = reference(&base);
    let pipeline = PipelineConfig {
        stages: 2,
        schedule: Kind::OneFOneB,
        virtual_stages: 1,
        recompute: false,
        balance: Balance::Params,
    };
    let config = TrainConfig { pipeline: Some(pipeline), ..base };
    check(&config, 2, &expect, "zero 1, pp 2 x dp 2");
    // The loss rank 0 records is the global one, as DDP's on the same mesh: the same at
    // the first step (the same parameters), within the tolerance after.
    let losses = |config: &TrainConfig| run(4, config)[0].summary.as_ref().unwrap().losses.clone();
    let (zero, ddp) = (losses(&config), losses(&TrainConfig { strategy: common::ddp(), ..config.clone() }));
    assert_eq!(zero.len() as u64, STEPS);
    assert_eq!(zero[0], ddp[0], "zero 1 and DDP record different first losses");
    for ((s, a), (t, b)) in zero.iter().zip(&ddp) {
        assert_eq!(s, t);
        assert!((a - b).abs() <= TOLERANCE * b.abs(), "step {s}: zero 1 loss {a}, DDP {b}");
    }
}

#[test]
fn zero_runs_are_bit_identical_and_stage_three_holds_a_shard() {
    for stage in 1..=3 {
        let mut config = tiny(OptimConfig::adamw(1e-2), zero(stage), 7, 1, 5);
        // Six layers of 3 280 elements, the embedding 320, the head 32.
        config.model.layers = 6;
        let a = run(3, &config);
        let b = run(3, &config);
        assert_eq!(a[0].params, b[0].params, "zero {stage}: reruns differ");
        assert_eq!(a[0].summary.as_ref().unwrap().losses, b[0].summary.as_ref().unwrap().losses);
        let summary = a[0].summary.as_ref().unwrap();
        let whole = 4 * summary.params as u64;
        for r in &summary.per_rank {
            let [params, grads, optimizer] = r.held_bytes;
            // AdamW's two moments of a third of the elements (one more per block at most).
            assert!(
                optimizer <= 2 * whole / 3 + 64,
                "zero {stage}, rank {}: optimizer {optimizer} B",
                r.rank
            );
            match stage {
                1 => assert!(params == whole && grads > whole, "{:?}", r.held_bytes),
                2 => assert!(params == whole && grads <= whole / 3 + 32, "{:?}", r.held_bytes),
                // The shard, plus the working set: the block running and the next one
                // (two layers; the tied head needs the embedding too).
                _ => {
                    let working = params - grads;
                    assert!(working <= 4 * (2 * 3280 + 320 + 32), "{:?}", r.held_bytes);
                    assert!(grads <= whole / 3 + 32, "{:?}", r.held_bytes);
                }
            }
        }
    }
}

#[test]
fn impossible_zero_settings_fail_on_every_rank_before_communicating() {
    let base = tiny(OptimConfig::adamw(1e-3), zero(2), 7, 2, 2);
    let piped = TrainConfig {
        pipeline: Some(PipelineConfig {
            stages: 2,
            schedule: Kind::GPipe,
            virtual_stages: 1,
            recompute: false,
            balance: Balance::Params,
        }),
        batch: 8,
        ..base.clone()
    };
    let cases = [
        (TrainConfig { strategy: zero(4), ..base.clone() }, 2, "use 1, 2 or 3"),
        (piped, 4, "use --zero 1 with --pp"),
        // 7 rows cannot give 4 ranks two micro-batches each.
        (base.clone(), 4, "less than --dp × --accum (8)"),
    ];
    for (config, ranks, expect) in cases {
        for r in run_with(ranks, &config, |_| ()) {
            let e = r.err().unwrap_or_else(|| panic!("{expect}: a rank went on")).to_string();
            assert!(e.contains(expect), "expected '{expect}' in: {e}");
        }
    }
}

#[test]
fn a_checkpoint_written_under_one_mesh_resumes_under_others() {
    let optim = OptimConfig::adamw(1e-3);
    // 8 rows: two micro-batches for each of 4 ranks.
    let base = with_tp(tiny(optim, zero(3), 8, 1, 20), 1);
    let whole = reference(&base);
    let dir = temp("zero", "reshard");
    // 10 steps at dp 2 × tp 2, ZeRO stage 3: every rank writes its slices.
    let first = with_checkpoint(TrainConfig { steps: 10, tp: 2, ..base.clone() }, &dir, 0, false);
    run(4, &first);
    let pipeline = PipelineConfig {
        stages: 2,
        schedule: Kind::GPipe,
        virtual_stages: 1,
        recompute: false,
        balance: Balance::Params,
    };
    let ddp = common::ddp();
    // (what, ranks, configuration of the resumed run)
    let resumed = [
        ("dp 1 x tp 4, DDP", 4, TrainConfig { tp: 4, strategy: ddp, ..base.clone() }),
        ("dp 4, zero 1", 4, TrainConfig { strategy: zero(1), accum: 2, ..base.clone() }),
        (
            "pp 2 x dp 2, zero 1",
            4,
            TrainConfig { pipeline: Some(pipeline), accum: 2, strategy: zero(1), ..base.clone() },
        ),
        ("dp 3, zero 2", 3, TrainConfig { strategy: zero(2), ..base.clone() }),
    ];
    for (what, ranks, config) in resumed {
        // Every resumed run starts from the same step-10 checkpoint: keep a copy of it.
        let copy = temp("zero", "reshard-copy");
        copy_dir(&dir, &copy);
        let outcomes = run(ranks, &with_checkpoint(config, &copy, 0, true));
        assert_eq!(outcomes[0].steps.len(), 10, "{what}: the resumed run starts at step 10");
        let d = rel_diff(&outcomes[0].params, &whole);
        assert!(d < TOLERANCE, "{what}: relative difference {d:e} from 20 uninterrupted steps");
        std::fs::remove_dir_all(copy).unwrap();
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Copies directory `from` (and its subdirectories) to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}
