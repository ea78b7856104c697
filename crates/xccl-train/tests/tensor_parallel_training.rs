//! Training with tensor parallelism (and sequence parallelism) on a dp × tp mesh of thread
//! ranks gives the parameters of single-process training: dp ∈ {1, 2} × tp ∈ {1, 2, 4},
//! with and without sequence parallelism, tied and untied head, a vocabulary that tp does
//! not divide, both optimisers; reruns are bit-identical; a checkpoint written at one tp
//! resumes at another; impossible shapes fail on every rank before any communication.

mod common;

use std::path::Path;

use common::{ddp, moved, reference, rel_diff, run, run_with, temp, tiny, with_checkpoint};
use xccl_train::checkpoint::DIR_NAME;
use xccl_train::data::TaskConfig;
use xccl_train::dcp::Reader;
use xccl_train::optim::OptimConfig;
use xccl_train::trainer::TrainConfig;

const STEPS: u64 = 20;
const TOLERANCE: f64 = 1e-5;

/// `config` with `tp` and `sp`, and 4 heads so that tp = 4 gets one each.
fn with_tp(mut config: TrainConfig, tp: usize, sp: bool) -> TrainConfig {
    config.model.heads = 4;
    config.tp = tp;
    config.sp = sp;
    config
}

/// A character-level text task with 13 distinct characters: a vocabulary that 2 and 4 do
/// not divide.
fn thirteen_letters(dir: &Path) -> TaskConfig {
    let letters: Vec<char> = "abcdefghijkl ".chars().collect();
    let mut x = 12345u64;
    let text: String = (0..4000)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            letters[(x >> 33) as usize % letters.len()]
        })
        .collect();
    let path = dir.join("text.txt");
    std::fs::write(&path, text).unwrap();
    TaskConfig::Text { path, byte_level: false, len: 8 }
}

/// Trains `config` on dp × tp thread ranks and checks every rank against `expect`.
fn check(config: &TrainConfig, dp: usize, expect: &[f32], what: &str) -> Vec<f32> {
    let outcomes = run(dp * config.tp, config);
    for o in &outcomes[1..] {
        assert_eq!(o.params, outcomes[0].params, "{what}: ranks disagree");
    }
    let d = rel_diff(&outcomes[0].params, expect);
    assert!(d < TOLERANCE, "{what}: relative difference {d:e} from single-process training");
    outcomes[0].params.clone()
}

#[test]
fn tensor_parallel_training_matches_single_process_training() {
    // The sums (vocabulary 12), tied head, AdamW.
    let base = with_tp(tiny(OptimConfig::adamw(1e-3), ddp(), 7, 1, STEPS), 1, false);
    let expect = reference(&base);
    assert!(moved(&base, &expect) > 100.0 * TOLERANCE, "training did not move the parameters");
    for (dp, tp, sp) in
        [(1, 2, false), (1, 2, true), (2, 2, false), (2, 2, true), (1, 4, true), (2, 4, false)]
    {
        let what = format!("sums, tied, adamw, dp {dp} tp {tp} sp {sp}");
        check(&with_tp(base.clone(), tp, sp), dp, &expect, &what);
    }
}

#[test]
fn untied_head_odd_vocabulary_and_sgd() {
    let dir = temp("tp", "odd");
    let sgd = OptimConfig::Sgd { lr: 0.05, momentum: 0.9, weight_decay: 1e-3 };
    let mut base = with_tp(tiny(sgd, ddp(), 6, 2, STEPS), 1, false);
    base.task = thirteen_letters(&dir);
    base.model.vocab = 13;
    base.model.tied = false;
    let expect = reference(&base);
    assert!(moved(&base, &expect) > 100.0 * TOLERANCE, "training did not move the parameters");
    for (dp, tp, sp) in [(1, 2, false), (2, 2, true), (1, 4, false), (2, 4, true)] {
        let what = format!("13 letters, untied, sgd, accumulation 2, dp {dp} tp {tp} sp {sp}");
        check(&with_tp(base.clone(), tp, sp), dp, &expect, &what);
    }
    // AdamW on the padded vocabulary too, tied.
    let adam = TrainConfig { optim: OptimConfig::adamw(1e-3), ..base.clone() };
    let adam =
        TrainConfig { model: xccl_train::model::ModelConfig { tied: true, ..adam.model.clone() }, ..adam };
    let expect = reference(&adam);
    check(&with_tp(adam, 4, true), 1, &expect, "13 letters, tied, adamw, tp 4 sp");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tensor_parallel_runs_are_bit_identical() {
    let config = with_tp(tiny(OptimConfig::adamw(1e-2), ddp(), 7, 2, STEPS), 2, true);
    let a = run(4, &config);
    let b = run(4, &config);
    assert_eq!(a[0].params, b[0].params);
    assert_eq!(a[0].summary.as_ref().unwrap().losses, b[0].summary.as_ref().unwrap().losses);
}

#[test]
fn a_checkpoint_resumes_at_another_tensor_parallel_size() {
    let dir = temp("tp", "ckpt");
    let mut base = with_tp(tiny(OptimConfig::adamw(1e-3), ddp(), 8, 1, STEPS), 1, false);
    base.task = thirteen_letters(&dir);
    base.model.vocab = 13;
    base.model.tied = false;
    let whole = reference(&base);
    // (tp that writes, tp that resumes).
    for (write, resume) in [(2, 1), (2, 4), (1, 2), (4, 2)] {
        let d = temp("tp", &format!("ckpt-{write}-{resume}"));
        let first =
            with_checkpoint(with_tp(TrainConfig { steps: 10, ..base.clone() }, write, false), &d, 0, false);
        run(write, &first);
        // Full tensors with the unsharded names and shapes: the padding is not saved.
        let reader = Reader::open(&d.join(DIR_NAME)).unwrap();
        for name in ["param.embed.tok", "param.head.out.weight", "optim.m.head.out.weight"] {
            assert_eq!(reader.shape(name), Some(&[13, 16][..]), "{name}");
        }
        let second = with_checkpoint(with_tp(base.clone(), resume, resume > 1), &d, 0, true);
        let outcomes = run(2 * resume, &second);
        assert_eq!(outcomes[0].steps.len(), 10, "the resumed run starts at step 10");
        let d_rel = rel_diff(&outcomes[0].params, &whole);
        assert!(d_rel < TOLERANCE, "written at tp {write}, resumed at tp {resume}: {d_rel:e}");
        let losses = &outcomes[0].summary.as_ref().unwrap().losses;
        assert_eq!(losses.len(), STEPS as usize, "the loss history continues across the resume");
        std::fs::remove_dir_all(d).unwrap();
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Runs `config` on `n` thread ranks and returns every rank's error.
fn errors(n: usize, config: &TrainConfig) -> Vec<String> {
    let results = run_with(n, config, |_| ());
    assert!(results.iter().all(|r| r.is_err()), "some rank started");
    results.into_iter().filter_map(|r| r.err().map(|e| e.to_string())).collect()
}

#[test]
fn impossible_shapes_fail_on_every_rank_before_communicating() {
    let base = tiny(OptimConfig::adamw(1e-3), ddp(), 8, 1, 2);
    // 2 heads over 4 ranks.
    for e in errors(4, &TrainConfig { tp: 4, ..base.clone() }) {
        assert!(e.contains("--heads 2 is not divisible by --tp 4"), "{e}");
    }
    // Rows of 8 tokens over 3 ranks (with 6 heads, which 3 divides).
    let mut six = with_tp(base.clone(), 3, true);
    six.model.heads = 4;
    six.model.width = 24;
    for e in errors(3, &six) {
        assert!(e.contains("--heads 4 is not divisible by --tp 3"), "{e}");
    }
    six.model.heads = 6;
    for e in errors(3, &six) {
        assert!(e.contains("rows have 8 tokens"), "{e}");
    }
    // A world of 3 ranks is not dp × 2.
    for e in errors(3, &with_tp(base.clone(), 2, false)) {
        assert!(e.contains("not a multiple of --tp 2"), "{e}");
    }
    // Sequence parallelism needs a group.
    for e in errors(2, &TrainConfig { sp: true, ..base }) {
        assert!(e.contains("--sp"), "{e}");
    }
}

/// Bytes a rank of a tensor-parallel group of `p` sends per step, from Megatron's analysis:
/// per layer two all-reduces forward and two backward of the `rows × len × width`
/// activations (with sequence parallelism, the same as all-gathers and reduce-scatters),
/// plus one each for the vocabulary-parallel embedding (forward) and head (backward), three
/// numbers per token for the cross-entropy, and with sequence parallelism the all-reduce of
/// the replicated parameters' partial gradients once per micro-batch, and one more
/// all-gather per column-parallel layer (q/k/v, the MLP's first, the head) in backward:
/// the layer kept only this rank's part of its input and gathers it again for its
/// weight's gradient (Megatron-LM's saving).
fn analytic_tp_bytes(config: &TrainConfig, rows: usize, micro: usize, len: usize) -> f64 {
    let (p, h, l) = (config.tp as f64, config.model.width as f64, config.model.layers as f64);
    let (all_reduce, gather) = (2.0 * (p - 1.0) / p, (p - 1.0) / p);
    let n = (rows * len) as f64 * h;
    let loss = all_reduce * 3.0 * (rows * len) as f64;
    let elements = if config.sp {
        let replicated = config.model.context as f64 * h + 6.0 * h * l + 2.0 * h;
        gather * (8.0 * l + 4.0 + 2.0 * l + 1.0) * n + loss + all_reduce * micro as f64 * replicated
    } else {
        all_reduce * (4.0 * l + 2.0) * n + loss
    };
    4.0 * elements
}

#[test]
fn measured_communication_equals_the_analytic_volume() {
    for sp in [false, true] {
        let mut config = with_tp(tiny(OptimConfig::adamw(1e-3), ddp(), 6, 2, 3), 2, sp);
        config.trace = true;
        let outcomes = run(2, &config);
        let expect = analytic_tp_bytes(&config, 6, 2, 8);
        for o in &outcomes {
            for s in &o.steps {
                let sent = s.sent[0] as f64;
                assert!(
                    (sent - expect).abs() <= 1.0,
                    "sp {sp}, step {}: sent {sent}, analytic {expect}",
                    s.step
                );
                assert_eq!(s.sent[1], 0, "a data-parallel group of one sends nothing");
            }
        }
    }
}
