//! `xccl train` end to end, ranks as real processes over TCP and shared memory: data
//! parallelism gives the parameters of a single-process run, a resumed run ends
//! bit-identical to an uninterrupted one, and bad flags or files are refused with a reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

use common::{params, rel_diff};
use xccl_train::checkpoint::DIR_NAME;

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

/// A tiny model and task, so each run takes about a second.
const TINY: &[&str] =
    &["--digits", "2", "--width", "16", "--layers", "1", "--heads", "2", "--batch", "7", "--lr", "1e-3"];

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xccl-train-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn train(out: &Path, args: &[&str]) -> Output {
    train_on(TINY, out, args)
}

/// `xccl train` with model and data flags `model`, then `args`.
fn train_on(model: &[&str], out: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(XCCL);
    cmd.arg("train").args(model).args(args).arg("--out").arg(out).env("XCCL_TIMEOUT", "60");
    cmd.output().expect("run xccl train")
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The events of the Chrome trace a run left.
fn trace_events(out: &Path) -> Vec<serde_json::Value> {
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("trace.json")).expect("trace.json")).expect("json");
    trace["traceEvents"].as_array().expect("events").clone()
}

#[test]
fn parallel_processes_match_a_single_process() {
    let single = out_dir("single");
    ok(&train(&single, &["--dp", "1", "--steps", "20"]));
    let reference = params(&single);
    for (name, args) in [
        ("ddp2", &["--dp", "2", "--steps", "20"][..]),
        (
            "ddp3-accum",
            &[
                "--dp",
                "3",
                "--accum",
                "2",
                "--steps",
                "20",
                "--bucket-mb",
                "0.01",
                "--first-bucket-mb",
                "0.002",
            ],
        ),
        ("ps", &["--dp", "3", "--strategy", "ps", "--servers", "2", "--steps", "20"]),
        ("zero1", &["--dp", "2", "--zero", "1", "--steps", "20"]),
        ("zero2-tp", &["--dp", "2", "--tp", "2", "--zero", "2", "--steps", "20"]),
        ("zero3", &["--dp", "3", "--zero", "3", "--accum", "2", "--steps", "20"]),
        ("zero3-recompute", &["--dp", "2", "--zero", "3", "--recompute", "--steps", "20"]),
    ] {
        let dir = out_dir(name);
        let out = train(&dir, args);
        ok(&out);
        let d = rel_diff(&params(&dir), &reference);
        assert!(d < 1e-5, "{name}: relative difference {d:e} from the single-process run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("accuracy") && stdout.contains("exposed comm."), "{stdout}");
        let events = trace_events(&dir);
        assert!(events.iter().any(|e| e["cat"] == "comm"), "{name}: no communication in the trace");
        assert!(events.iter().any(|e| e["name"] == "bwd embed"), "{name}: no backward in the trace");
        assert!(std::fs::read_to_string(dir.join("loss.svg")).expect("loss.svg").contains("<svg"));
        std::fs::remove_dir_all(dir).unwrap();
    }
    std::fs::remove_dir_all(single).unwrap();
}

#[test]
fn tensor_parallel_processes_match_a_single_process() {
    let single = out_dir("tp-single");
    ok(&train(&single, &["--dp", "1", "--steps", "50"]));
    let reference = params(&single);
    for (name, args) in [
        ("tp", &["--dp", "2", "--tp", "2", "--steps", "50"][..]),
        ("tp-sp", &["--dp", "1", "--tp", "2", "--sp", "--steps", "50"][..]),
    ] {
        let dir = out_dir(name);
        let out = train(&dir, args);
        ok(&out);
        let d = rel_diff(&params(&dir), &reference);
        assert!(d < 1e-5, "{name}: relative difference {d:e} from the single-process run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The summary says what each rank holds: about half the parameters.
        assert!(stdout.contains("rank 1") && stdout.contains("% of the model"), "{stdout}");
        let events = trace_events(&dir);
        // The track of rank 0's tensor-parallel communicator has operations on it.
        let track = events
            .iter()
            .find(|e| e["ph"] == "M" && e["pid"] == 0 && e["args"]["name"] == "comm tp")
            .map(|e| e["tid"].clone())
            .expect("a comm tp track");
        let tp_ops =
            events.iter().filter(|e| e["cat"] == "comm" && e["pid"] == 0 && e["tid"] == track).count();
        assert!(tp_ops > 0, "{name}: no tensor-parallel communication in the trace");
        std::fs::remove_dir_all(dir).unwrap();
    }
    std::fs::remove_dir_all(single).unwrap();
}

#[test]
fn pipeline_processes_match_a_single_process() {
    // Batches of 8 rows: 2 data-parallel shares of 2 micro-batches of 2 rows.
    let tiny: Vec<&str> = TINY.iter().map(|&a| if a == "7" { "8" } else { a }).collect();
    let train = |out: &Path, args: &[&str]| train_on(&tiny, out, &[args, &["--steps", "50"]].concat());
    let single = out_dir("pp-single");
    ok(&train(&single, &["--dp", "1"]));
    let dir = out_dir("pp");
    let tied_single = out_dir("pp-single-tied");
    ok(&train(&tied_single, &["--dp", "1", "--tied"]));
    let out = train(&dir, &["--pp", "2", "--dp", "2", "--micro-batches", "2", "--tied"]);
    ok(&out);
    let d = rel_diff(&params(&dir), &params(&tied_single));
    assert!(d < 1e-5, "pp 2 x dp 2: relative difference {d:e} from the single-process run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("(pp 2 x dp 2)") && stdout.contains("bubble"), "{stdout}");
    // The timeline is drawn, and every stage is a lane of the trace with forwards and
    // backwards on it, its sends on the pipeline group's track.
    let svg = std::fs::read_to_string(dir.join("pipeline.svg")).expect("pipeline.svg");
    assert!(svg.contains("stage 1"), "{svg}");
    let events = trace_events(&dir);
    for (pid, lane) in [(0, "stage 0"), (2, "stage 1")] {
        let tid = events
            .iter()
            .find(|e| e["ph"] == "M" && e["pid"] == pid && e["args"]["name"] == lane)
            .map(|e| e["tid"].clone())
            .unwrap_or_else(|| panic!("no lane {lane} on rank {pid}"));
        let on = |p: &str| {
            events
                .iter()
                .filter(|e| {
                    e["pid"] == pid && e["tid"] == tid && e["name"].as_str().is_some_and(|n| n.starts_with(p))
                })
                .count()
        };
        assert_eq!((on("F("), on("B(")), (100, 100), "{lane}: 2 forwards and 2 backwards per step");
    }
    let sends = events
        .iter()
        .filter(|e| e["cat"] == "comm" && e["name"].as_str().is_some_and(|n| n.starts_with("send")))
        .count();
    assert!(sends >= 4 * 50, "{sends} sends between the stages");
    // Without the tie, the untied model matches too (no shared gradient).
    let untied = out_dir("pp-untied");
    ok(&train(&untied, &["--pp", "2", "--dp", "1", "--micro-batches", "4", "--schedule", "gpipe"]));
    let d = rel_diff(&params(&untied), &params(&single));
    assert!(d < 1e-5, "gpipe pp 2: relative difference {d:e} from the single-process run");
    // Zero-bubble: input-gradient and weight-gradient halves as separate actions, drawn.
    let zb = out_dir("pp-zb");
    ok(&train(&zb, &["--pp", "2", "--dp", "1", "--micro-batches", "4", "--schedule", "zb-h1"]));
    let d = rel_diff(&params(&zb), &params(&single));
    assert!(d < 1e-5, "zb-h1 pp 2: relative difference {d:e} from the single-process run");
    let names: Vec<String> =
        trace_events(&zb).iter().filter_map(|e| e["name"].as_str().map(str::to_string)).collect();
    for half in ["Bi(", "W("] {
        assert_eq!(names.iter().filter(|n| n.starts_with(half)).count(), 2 * 4 * 50, "{half} spans");
    }
    for d in [single, tied_single, dir, untied, zb] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn zero_bubble_v_processes_match_a_single_process() {
    // Four layers: two stages × two chunks of one layer, placed in a V (rank 0 holds the
    // first and the last stage, so the tied embedding and head stay on one rank); batches of
    // 12 rows: 3 micro-batches, the fewest zb-v runs on 2 stages.
    let model: Vec<&str> = TINY
        .iter()
        .map(|&a| {
            if a == "1" {
                "4"
            } else if a == "7" {
                "12"
            } else {
                a
            }
        })
        .collect();
    let train = |out: &Path, args: &[&str]| train_on(&model, out, &[args, &["--steps", "30"]].concat());
    let single = out_dir("zbv-single");
    ok(&train(&single, &["--dp", "1", "--tied"]));
    let zbv = out_dir("zbv");
    ok(&train(&zbv, &["--pp", "2", "--dp", "1", "--micro-batches", "3", "--schedule", "zb-v", "--tied"]));
    let d = rel_diff(&params(&zbv), &params(&single));
    assert!(d < 1e-5, "zb-v pp 2: relative difference {d:e} from the single-process run");
    // Each rank runs both of its chunks' forwards and split backwards.
    let names: Vec<String> =
        trace_events(&zbv).iter().filter_map(|e| e["name"].as_str().map(str::to_string)).collect();
    for pass in ["F(", "Bi(", "W("] {
        assert_eq!(names.iter().filter(|n| n.starts_with(pass)).count(), 2 * 2 * 3 * 30, "{pass} spans");
    }
    // Too few micro-batches: refused before training, saying how many it needs.
    let few =
        train(&out_dir("zbv-few"), &["--pp", "2", "--dp", "1", "--micro-batches", "2", "--schedule", "zb-v"]);
    let stderr = String::from_utf8_lossy(&few.stderr);
    assert!(!few.status.success() && stderr.contains("--micro-batches 3 or more"), "{stderr}");
    for d in [single, zbv] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn a_resumed_run_ends_bit_identical() {
    let whole = out_dir("whole");
    ok(&train(&whole, &["--dp", "2", "--steps", "10", "--checkpoint-every", "4"]));
    let part = out_dir("part");
    ok(&train(&part, &["--dp", "2", "--steps", "6", "--checkpoint-every", "4"]));
    let resumed = train(&part, &["--dp", "2", "--steps", "10", "--checkpoint-every", "4", "--resume"]);
    ok(&resumed);
    assert_eq!(params(&part), params(&whole), "the resumed run's parameters differ");
    // A different configuration is refused, saying why.
    let other = train(&part, &["--dp", "2", "--steps", "12", "--resume", "--seed", "5"]);
    assert!(!other.status.success());
    let err = String::from_utf8_lossy(&other.stderr);
    // Every rank knows why, so the reason is printed whichever rank the launcher stops
    // first (rank 0 alone knew it once, and its words were sometimes cut short).
    assert!(err.contains("different configuration"), "{err}");
    for d in [whole, part] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn the_asynchronous_parameter_server_reports_its_staleness() {
    let dir = out_dir("async");
    let out = train(&dir, &["--dp", "3", "--strategy", "ps-async", "--staleness", "2", "--steps", "30"]);
    ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("staleness"), "{stdout}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_flags_and_files_are_refused_with_a_reason() {
    let dir = out_dir("bad");
    let empty = dir.with_extension("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let text = dir.with_extension("text.txt");
    std::fs::write(&text, "the quick brown fox jumps over the lazy dog. ".repeat(20)).unwrap();
    let cases: [(&[&str], &str); 15] = [
        (&["--zero", "4"], "use 1, 2 or 3"),
        (&["--zero", "1", "--strategy", "ps"], "use it with --strategy ddp"),
        (&["--pp", "2", "--micro-batches", "3"], "multiple of --dp × --micro-batches"),
        (&["--pp", "4"], "only 3 blocks"),
        (&["--pp", "2", "--schedule", "zigzag"], "gpipe"),
        (&["--pp", "2", "--pp-balance", "1,1"], "adding up to the model's 3 blocks"),
        (&["--tp", "4"], "--heads 2 is not divisible by --tp 4"),
        (&["--tp", "2", "--sp", "--data", text.to_str().unwrap(), "--context", "9"], "rows have 9 tokens"),
        (&["--sp"], "use it with --tp 2 or more"),
        (&["--data", "/nonexistent/input.txt"], "cannot read"),
        (&["--data", empty.to_str().unwrap()], "empty"),
        (&["--strategy", "ddp", "--staleness", "3"], "--staleness applies to --strategy ps-async"),
        (&["--strategy", "ps", "--dp", "2", "--servers", "2", "--dedicated-servers"], "no workers"),
        (&["--context", "4"], "raise --context"),
        (&["--resume"], "no checkpoint"),
    ];
    for (args, want) in cases {
        let out = train(&dir, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: expected '{want}' in: {err}");
    }
    let _ = std::fs::remove_file(empty);
    let _ = std::fs::remove_file(text);
    let _ = std::fs::remove_dir_all(dir);
}

/// Every file of the checkpoint in `out`, by path relative to it.
fn checkpoint_files(out: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let root = out.join(DIR_NAME);
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("checkpoint directory") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                let rel = p.strip_prefix(&root).expect("inside").to_path_buf();
                files.insert(rel, std::fs::read(&p).expect("read"));
            }
        }
    }
    files
}

#[test]
fn checkpoints_are_byte_identical_on_rerun_and_survive_a_rank_killed_mid_save() {
    // The same run twice writes the same bytes (ZeRO 3: every rank writes its slices).
    let args = ["--dp", "2", "--zero", "3", "--steps", "6", "--checkpoint-every", "3", "--seed", "7"];
    let (a, b) = (out_dir("bytes-a"), out_dir("bytes-b"));
    ok(&train(&a, &args));
    ok(&train(&b, &args));
    let (fa, fb) = (checkpoint_files(&a), checkpoint_files(&b));
    assert!(fa.keys().any(|k| k.to_string_lossy().contains("rank-00001")), "{:?}", fa.keys());
    assert_eq!(fa.keys().collect::<Vec<_>>(), fb.keys().collect::<Vec<_>>());
    for (k, v) in &fa {
        assert!(v == &fb[k], "{} differs between two runs", k.display());
    }
    // Resumed towards step 12, rank 1 dies right after writing its piece of step 9: the
    // step-6 checkpoint is still the one to load, complete.
    let more =
        ["--dp", "2", "--zero", "3", "--steps", "12", "--checkpoint-every", "3", "--seed", "7", "--resume"];
    let mut cmd = Command::new(XCCL);
    cmd.arg("train").args(TINY).args(more).arg("--out").arg(&a).env("XCCL_TIMEOUT", "60");
    let crashed = cmd.env("XCCL_DCP_CRASH_AFTER_SHARD", "1").output().expect("run xccl train");
    assert!(!crashed.status.success(), "the run with a killed rank succeeded");
    let info = Command::new(XCCL).args(["checkpoint", "info"]).arg(a.join(DIR_NAME)).output().expect("info");
    ok(&info);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("step 6"), "{text}");
    // It resumes from there and ends where an uninterrupted run ends.
    ok(&train(&a, &more));
    let whole = out_dir("bytes-whole");
    ok(&train(&whole, &more[..more.len() - 1]));
    assert_eq!(params(&a), params(&whole), "resumed after the crash, the parameters differ");
    for d in [a, b, whole] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn an_exported_and_imported_checkpoint_starts_a_run_where_the_other_ended() {
    // A learning rate that moves the tiny model far in 30 steps.
    let fast: Vec<&str> = TINY.iter().map(|&a| if a == "1e-3" { "1e-2" } else { a }).collect();
    let train = |out: &Path, args: &[&str]| train_on(&fast, out, args);
    let first = out_dir("export-first");
    ok(&train(&first, &["--dp", "2", "--zero", "2", "--steps", "30"]));
    let file = first.join("exported.safetensors");
    let export =
        Command::new(XCCL).args(["checkpoint", "export"]).arg(first.join(DIR_NAME)).arg(&file).output();
    ok(&export.expect("export"));
    // A fresh directory whose checkpoint is the imported file: the run starts from its
    // parameters (fresh optimiser state, step 0), under another mesh.
    let second = out_dir("export-second");
    let import =
        Command::new(XCCL).args(["checkpoint", "import"]).arg(&file).arg(second.join(DIR_NAME)).output();
    ok(&import.expect("import"));
    ok(&train(&second, &["--dp", "1", "--steps", "1", "--resume"]));
    let fresh = out_dir("export-fresh");
    ok(&train(&fresh, &["--dp", "1", "--steps", "1"]));
    let first_loss = |dir: &Path| {
        let s: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("summary.json")).expect("summary")).expect("json");
        s["losses"][0][1].as_f64().expect("a loss")
    };
    let last: serde_json::Value =
        serde_json::from_slice(&std::fs::read(first.join("summary.json")).expect("summary")).expect("json");
    let last = last["losses"][29][1].as_f64().expect("step 29's loss");
    let (resumed, from_scratch) = (first_loss(&second), first_loss(&fresh));
    // The imported run's first loss is the trained model's (same parameters, another
    // batch), far below a fresh model's.
    assert!(
        (resumed - last).abs() < 0.25 * last && resumed < 0.8 * from_scratch,
        "{resumed} {last} {from_scratch}"
    );
    for d in [first, second, fresh] {
        std::fs::remove_dir_all(d).unwrap();
    }
}
