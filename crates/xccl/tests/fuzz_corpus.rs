//! The fuzzers' corpora (`fuzz/corpus/<target>/`, kept minimised in the repository) replayed
//! through their targets as an ordinary test: every input the coverage-guided fuzzer found
//! interesting must still run without a panic, on stable Rust and without cargo-fuzz. The
//! fuzzing itself is `bash bench/fuzz_cov.sh` (see docs/ARCHITECTURE.md, "Fuzzing").

use std::path::{Path, PathBuf};
use std::time::Instant;

/// The files of target `name`'s corpus.
fn corpus(name: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(name);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus of {name} ({}): {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the corpus of {name} is empty");
    files
}

#[test]
fn every_corpus_input_runs_through_its_target() {
    for (name, run) in xccl::fuzzing::TARGETS {
        let files = corpus(name);
        let started = Instant::now();
        for f in &files {
            let data = std::fs::read(f).expect("a corpus file");
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                panic!("{name}: {} panicked (see above)", f.display());
            }
        }
        eprintln!("{name}: {} inputs in {:.2} s", files.len(), started.elapsed().as_secs_f64());
    }
}

#[test]
fn the_corpora_reach_past_the_checks() {
    // Some inputs complete what they start: operations run, handshakes accepted.
    let passing = |name: &str, run: fn(&[u8]) -> bool| {
        corpus(name).iter().filter(|f| run(&std::fs::read(f).expect("a corpus file"))).count()
    };
    assert!(passing("frame_stream", xccl::fuzzing::frame_stream) > 0);
    assert!(passing("handshake_server", xccl::fuzzing::handshake_server) > 0);
    assert!(passing("handshake_client", xccl::fuzzing::handshake_client) > 0);
}
