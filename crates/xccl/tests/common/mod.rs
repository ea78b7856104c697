//! Helpers shared by the integration tests: exact test values per element type, a naive
//! reference, and running one closure per rank.

#![allow(dead_code, unused_imports, unused_macros)]

pub mod cluster;
pub mod forms;
pub mod require;

use std::time::Duration;

use xccl::{Communicator, Config, Element, ReduceOp, reference_reduce};

/// Element types built from small integers, so that float sums are exact.
pub trait Small: Element {
    fn small(v: i64) -> Self {
        Self::from_f64(v as f64)
    }
}

impl<T: Element> Small for T {}

/// The value rank `rank` contributes at index `i`: products stay small powers of two, sums
/// of up to 64 ranks stay below 2^9 (exact in every float type).
pub fn val<T: Small>(op: ReduceOp, rank: usize, i: usize, salt: usize) -> T {
    let v = match op {
        ReduceOp::Prod => 1 + i64::from((rank + i + salt).is_multiple_of(5)),
        _ => ((rank * 7 + i * 13 + salt * 3) % 8) as i64,
    };
    T::small(v)
}

/// Rank `rank`'s input of `len` elements.
pub fn input<T: Small>(op: ReduceOp, rank: usize, len: usize, salt: usize) -> Vec<T> {
    (0..len).map(|i| val(op, rank, i, salt)).collect()
}

/// The naive reduction over ranks `0..n` of the inputs at index `i`.
pub fn expected<T: Small>(op: ReduceOp, n: usize, i: usize, salt: usize) -> T {
    let vals: Vec<T> = (0..n).map(|r| val(op, r, i, salt)).collect();
    reference_reduce(op, &vals).expect("at least one rank")
}

/// Settings for tests: a short deadline so that a failing test fails instead of hanging.
pub fn test_config() -> Config {
    // The pull thresholds of every processor but AMD's on every machine, so that the sizes a
    // test picks lie on the sides of them it names.
    let pull = xccl::protocol::PullSetting::exactly(xccl::protocol::PullMin::default());
    Config { timeout: Duration::from_secs(30), pull, ..Config::default() }
}

/// A job name no other job of this test process has: a rank's process counts the worlds it
/// joins per job and rank (the k-th gets the k-th key space in the store), so two tests
/// that ran at once under one name could give the ranks of one world different counts.
pub fn unique_job(what: &str) -> String {
    static JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{what}-{}-{k}", std::process::id())
}

/// Runs `f` on every rank of a fresh local group of `n`, each on its own thread.
pub fn on_ranks<R: Send>(n: usize, config: Config, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    let comms = Communicator::local_with(n, config).expect("local group");
    std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// Sizes worth testing: empty, one, small primes, counts that do not divide by the world
/// size, and larger ones.
pub const SIZES: &[usize] = &[0, 1, 2, 3, 7, 13, 61, 1021, 65537];
