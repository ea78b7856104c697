//! `xccl checkpoint info|export|import`: a safetensors file imported and exported again
//! gives the same tensors byte for byte (and Python's safetensors reads the export, where it
//! is installed), a checkpoint written in pieces by several ranks exports whole parameters
//! without optimiser state, and bad input is refused with a reason and exit status 2.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use xccl::Communicator;
use xccl_train::dcp::{self, Piece, Snapshot};

mod common;

use common::text;

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xccl-checkpoint-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn xccl(args: &[&Path]) -> Output {
    Command::new(XCCL).arg("checkpoint").args(args).output().expect("run xccl checkpoint")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command failed with status 2 and a message containing `want`.
fn refused(out: &Output, want: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", text(out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(want), "expected '{want}' in:\n{}", text(out));
}

/// Writes tensors (name → dtype, shape, bytes) as a safetensors file.
fn write_safetensors(path: &Path, tensors: &BTreeMap<&str, (Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(&str, TensorView)> =
        tensors.iter().map(|(n, (d, s, b))| (*n, TensorView::new(*d, s.clone(), b).expect("view"))).collect();
    std::fs::write(path, safetensors::serialize(views, None).expect("serialize")).expect("write");
}

fn f32_bytes(n: usize, seed: f32) -> Vec<u8> {
    (0..n).flat_map(|i| (seed + i as f32 * 0.37 - 1.5).to_le_bytes()).collect()
}

/// Every tensor of a safetensors file: name → (dtype, shape, bytes).
fn read_safetensors(path: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).expect("read");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect()
}

#[test]
fn import_then_export_gives_the_same_tensors() {
    let dir = temp_dir("round-trip");
    let source = dir.join("model.safetensors");
    let tensors = BTreeMap::from([
        ("embed.weight", (Dtype::F32, vec![5, 3], f32_bytes(15, 0.0))),
        ("h00.mlp.fc.bias", (Dtype::F32, vec![4], f32_bytes(4, 7.0))),
        ("h00.attn.qkv.weight", (Dtype::F32, vec![2, 3, 4], f32_bytes(24, -3.0))),
        ("scale", (Dtype::F32, vec![], f32_bytes(1, 2.0))),
    ]);
    write_safetensors(&source, &tensors);
    let ckpt = dir.join("ckpt");
    let said = ok(&xccl(&[Path::new("import"), &source, &ckpt]));
    assert!(said.contains("imported 4 tensors"), "{said}");

    let info = ok(&xccl(&[Path::new("info"), &ckpt]));
    for want in ["step 0", "origin", "import of", "param.embed.weight", "[5, 3]", "param.scale", "files: 1"] {
        assert!(info.contains(want), "'{want}' missing from:\n{info}");
    }

    let exported = dir.join("export.safetensors");
    ok(&xccl(&[Path::new("export"), &ckpt, &exported]));
    let back = read_safetensors(&exported);
    let want: BTreeMap<String, _> = tensors.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    assert_eq!(back, want, "the exported tensors are the imported ones, byte for byte");
    // No metadata, deterministic bytes: importing the export and exporting again changes
    // nothing, and the file is what the safetensors crate writes for these tensors.
    let again = dir.join("again");
    ok(&xccl(&[Path::new("import"), &exported, &again]));
    let exported2 = dir.join("export2.safetensors");
    ok(&xccl(&[Path::new("export"), &again, &exported2]));
    assert_eq!(std::fs::read(&exported).unwrap(), std::fs::read(&exported2).unwrap());
    assert_eq!(std::fs::read(&exported).unwrap(), std::fs::read(&source).unwrap());

    python_check(&exported, &source);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Loads `exported` with Python's `safetensors.numpy` and compares it with `source`; says
/// why it skips where Python or the module is missing.
fn python_check(exported: &Path, source: &Path) {
    let probe = Command::new("python3").args(["-c", "import safetensors.numpy, numpy"]).output();
    match probe {
        Err(e) => {
            common::require::skip("python", format!("the Python check: python3 cannot be run ({e})"));
            return;
        }
        Ok(out) if !out.status.success() => {
            let why = String::from_utf8_lossy(&out.stderr);
            let why = why.lines().last().unwrap_or("unknown reason");
            common::require::skip(
                "python",
                format!("the Python check: `import safetensors.numpy, numpy` fails: {why}"),
            );
            return;
        }
        Ok(_) => {}
    }
    let script = r#"
import sys, numpy, safetensors.numpy
got = safetensors.numpy.load_file(sys.argv[1])
want = safetensors.numpy.load_file(sys.argv[2])
assert sorted(got) == sorted(want), (sorted(got), sorted(want))
for k in want:
    assert got[k].dtype == numpy.float32, (k, got[k].dtype)
    assert got[k].shape == want[k].shape, (k, got[k].shape, want[k].shape)
    assert numpy.array_equal(got[k], want[k]), k
print("python: %d tensors equal" % len(got))
"#;
    let out =
        Command::new("python3").arg("-c").arg(script).arg(exported).arg(source).output().expect("python3");
    assert!(out.status.success(), "the Python check failed:\n{}", text(&out));
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
}

#[test]
fn export_assembles_pieces_and_leaves_the_optimizer_out() {
    let dir = temp_dir("pieces");
    let ckpt = dir.join("ckpt");
    let w: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
    // Two ranks: rows of `param.w` split 1 + 3, `optim.m.w` split by flat ranges, `param.b`
    // replicated.
    let snapshot = |rank: usize| {
        let tensors = vec![
            ("param.w".to_string(), vec![4, 6]),
            ("param.b".to_string(), vec![6]),
            ("optim.m.w".to_string(), vec![4, 6]),
        ];
        let rows = if rank == 0 { (0, 1) } else { (1, 3) };
        let wp = Piece::boxed("param.w", vec![rows.0, 0], vec![rows.1, 6]);
        let wv = w[rows.0 * 6..(rows.0 + rows.1) * 6].to_vec();
        let flat = if rank == 0 { 0..10 } else { 10..24 };
        let mp = Piece::whole("optim.m.w", &[4, 6]).with_flat(flat.clone());
        let mv = vec![1.0; flat.len()];
        let bp = Piece::whole("param.b", &[6]);
        let extra = BTreeMap::from([
            ("fingerprint".to_string(), serde_json::json!("model gpt width 6")),
            ("mesh".to_string(), serde_json::json!({"dp": 2, "tp": 1})),
        ]);
        Snapshot { step: 12, tensors, pieces: vec![(wp, wv), (mp, mv), (bp, vec![3.0; 6])], extra }
    };
    let comms = Communicator::local(2).expect("communicators");
    std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let ckpt = &ckpt;
                s.spawn(move || dcp::save(&c, ckpt, snapshot(c.rank())))
            })
            .collect();
        for r in ranks {
            r.join().expect("rank").expect("save");
        }
    });
    let info = ok(&xccl(&[Path::new("info"), Path::new("--pieces"), &ckpt]));
    for want in [
        "step 12",
        "fingerprint",
        "\"model gpt width 6\"",
        "mesh",
        "optim.m.w",
        "files: 2",
        "3 pieces",
        "2 pieces",
    ] {
        assert!(info.contains(want), "'{want}' missing from:\n{info}");
    }
    assert!(info.contains("param.w#0  [1..4, 0..6]"), "{info}");
    let exported = dir.join("w.safetensors");
    ok(&xccl(&[Path::new("export"), &ckpt, &exported]));
    let back = read_safetensors(&exported);
    assert_eq!(back.keys().collect::<Vec<_>>(), ["b", "w"]);
    let values: Vec<f32> =
        back["w"].2.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(values, w);
    assert_eq!(back["w"].1, [4, 6]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let dir = temp_dir("bad");
    let missing = dir.join("missing");
    refused(&xccl(&[Path::new("info"), &missing]), "does not exist");
    refused(&xccl(&[Path::new("export"), &missing, &dir.join("x.safetensors")]), "does not exist");
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    refused(&xccl(&[Path::new("info"), &empty]), "no checkpoint here");

    let not_st = dir.join("junk.safetensors");
    std::fs::write(&not_st, b"not a safetensors file at all").unwrap();
    refused(&xccl(&[Path::new("import"), &not_st, &dir.join("c1")]), "is not a safetensors file");
    refused(&xccl(&[Path::new("import"), &dir.join("nope.safetensors"), &dir.join("c1")]), "cannot read");

    let bf16 = dir.join("bf16.safetensors");
    write_safetensors(
        &bf16,
        &BTreeMap::from([
            ("a", (Dtype::F32, vec![2], f32_bytes(2, 0.0))),
            ("b", (Dtype::BF16, vec![2], vec![0u8; 4])),
        ]),
    );
    refused(&xccl(&[Path::new("import"), &bf16, &dir.join("c2")]), "tensor b is BF16; only F32 tensors");
    assert!(!dir.join("c2").exists(), "nothing is written for a refused import");

    let good = dir.join("good.safetensors");
    write_safetensors(&good, &BTreeMap::from([("a", (Dtype::F32, vec![2], f32_bytes(2, 0.0)))]));
    let ckpt = dir.join("c3");
    ok(&xccl(&[Path::new("import"), &good, &ckpt]));
    refused(&xccl(&[Path::new("import"), &good, &ckpt]), "already holds a checkpoint");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rank_crashing_after_its_shard_leaves_no_checkpoint_and_the_next_save_cleans_up() {
    let dir = temp_dir("crash");
    let good = dir.join("good.safetensors");
    write_safetensors(&good, &BTreeMap::from([("a", (Dtype::F32, vec![3], f32_bytes(3, 1.0)))]));
    let ckpt = dir.join("ckpt");
    let crashed = Command::new(XCCL)
        .args(["checkpoint", "import"])
        .arg(&good)
        .arg(&ckpt)
        .env(dcp::CRASH_AFTER_SHARD, "0")
        .output()
        .expect("run xccl checkpoint import");
    assert!(!crashed.status.success() && crashed.status.code().is_none(), "{}", text(&crashed));
    assert!(ckpt.join("step-00000000.partial/rank-00000.safetensors").is_file());
    assert!(!ckpt.join("latest").exists() && !ckpt.join("step-00000000").exists());
    refused(&xccl(&[Path::new("info"), &ckpt]), "no checkpoint here");
    ok(&xccl(&[Path::new("import"), &good, &ckpt]));
    assert!(!ckpt.join("step-00000000.partial").exists());
    assert!(ok(&xccl(&[Path::new("info"), &ckpt])).contains("param.a"));
    std::fs::remove_dir_all(&dir).unwrap();
}
