//! Every collective, every element type, every reduction, world sizes 1 to 8, every root
//! and awkward sizes, against a naive single-threaded reference, over the local transport.

mod common;

use common::forms::*;
use common::*;
use xccl::algo::Algorithm;
use xccl::{CollKind, Communicator, Config, ReduceOp};

#[test]
fn all_reduce_matches_the_reference() {
    for n in 1..=8 {
        on_ranks(n, test_config(), |c| every_dtype!(all_reduce_forms, c));
    }
}

#[test]
fn all_reduce_through_a_root_matches_the_reference() {
    let mut config = test_config();
    config.algos.set(CollKind::AllReduce, Algorithm::ReduceBroadcast).unwrap();
    for n in 1..=8 {
        on_ranks(n, config.clone(), |c| every_dtype!(all_reduce_forms, c));
    }
}

#[test]
fn reduce_matches_the_reference_for_every_root() {
    for n in 1..=8 {
        on_ranks(n, test_config(), |c| every_dtype!(reduce_forms, c));
    }
}

#[test]
fn broadcast_reaches_every_rank_from_every_root() {
    for n in 1..=8 {
        on_ranks(n, test_config(), |c| every_dtype!(broadcast_forms, c));
    }
}

#[test]
fn all_gather_and_gather_even_and_uneven_for_every_root() {
    for n in 1..=8 {
        on_ranks(n, test_config(), |c| every_dtype!(gather_forms, c));
    }
}

#[test]
fn scatter_even_and_uneven_from_every_root() {
    for n in 1..=8 {
        on_ranks(n, test_config(), |c| every_dtype!(scatter_forms, c));
    }
}

#[test]
fn reduce_scatter_even_and_uneven_match_the_reference() {
    for n in 1..=8 {
        on_ranks(n, test_config(), |c| every_dtype!(reduce_scatter_forms, c));
    }
}

#[test]
fn all_to_all_even_and_uneven() {
    for n in 1..=8 {
        on_ranks(n, test_config(), |c| every_dtype!(all_to_all_forms, c));
    }
}

#[test]
fn barrier_orders_everything_before_it() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for n in 1..=8 {
        let arrived = AtomicUsize::new(0);
        on_ranks(n, test_config(), |c| {
            for round in 1..=5 {
                // Stagger arrivals so a broken barrier would let an early rank through.
                std::thread::sleep(std::time::Duration::from_millis((c.rank() * 3) as u64));
                arrived.fetch_add(1, Ordering::SeqCst);
                c.barrier().unwrap();
                assert!(
                    arrived.load(Ordering::SeqCst) >= round * n,
                    "rank {} passed barrier {round} early",
                    c.rank()
                );
                c.barrier_async().wait().unwrap();
            }
        });
    }
}

#[test]
fn large_messages_cross_many_segments() {
    // Several MiB: dozens of pipelined segments per message on every path.
    let len = (3 << 20) / 4 + 7;
    for n in [2, 3, 5, 8] {
        on_ranks(n, test_config(), |c| {
            let r = c.rank();
            let op = ReduceOp::Sum;
            let mut buf = input::<f32>(op, r, len, 1);
            c.all_reduce(&mut buf, op).unwrap();
            assert_each(&buf, |i| expected::<f32>(op, n, i, 1), "large all_reduce");
            let mut buf = input::<i64>(op, r, len / 2, 2);
            c.reduce_in_place(&mut buf, ReduceOp::Max, n - 1).unwrap();
            if r == n - 1 {
                assert_each(&buf, |i| expected::<i64>(ReduceOp::Max, n, i, 2), "large reduce");
            }
            let mut buf = input::<u8>(op, r, len * 3, 3);
            c.broadcast(&mut buf, 1).unwrap();
            assert_each(&buf, |i| val::<u8>(op, 1, i, 3), "large broadcast");
            let block = len / n;
            let inp = input::<f64>(op, r, block * n, 4);
            let mut out = vec![0f64; block];
            c.reduce_scatter(&inp, &mut out, op).unwrap();
            assert_each(&out, |i| expected::<f64>(op, n, r * block + i, 4), "large reduce_scatter");
        });
    }
}

#[test]
fn float_results_are_bit_identical_on_every_rank_and_every_run() {
    // Inputs whose sums round: every rank must still end with the same bits, run after run.
    let len = 100_003;
    let runs: Vec<Vec<Vec<u32>>> = (0..2)
        .map(|_| {
            on_ranks(5, test_config(), |c| {
                let mut v: Vec<f32> =
                    (0..len).map(|i| ((i * 2654435761 + c.rank() * 97) % 1000) as f32 / 7.0).collect();
                c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
                v.iter().map(|x| x.to_bits()).collect()
            })
        })
        .collect();
    for run in &runs {
        assert!(run.iter().all(|r| r == &run[0]), "ranks disagree");
    }
    assert_eq!(runs[0], runs[1], "two runs disagree");
}

#[test]
fn wrong_arguments_are_reported_not_panicked() {
    on_ranks(3, Config::default(), |c| {
        let mut out = vec![0f32; 5];
        let e = c.all_gather(&[1.0f32, 2.0], &mut out).unwrap_err();
        assert!(e.to_string().contains("expected 6"), "{e}");
        assert!(c.broadcast(&mut [0u8; 4], 3).unwrap_err().to_string().contains("root 3"));
        assert!(c.send(&[1u8], c.rank(), 0).is_err());
        assert!(c.all_to_all(&[0u8; 4], &mut [0u8; 4]).is_err());
        assert!(c.all_gather_v(&[0u8; 1], &mut [0u8; 3], &[1, 2]).is_err());
        // reduce_scatter_v: the error names what is wrong, before any communication.
        let mut out = vec![0f32; 2];
        let e = c.reduce_scatter_v(&[0f32; 6], &mut out, &[2, 2], ReduceOp::Sum).unwrap_err();
        assert!(e.to_string().contains("reduce_scatter_v: counts has 2 entries, expected 3"), "{e}");
        let e = c.reduce_scatter_v(&[0f32; 5], &mut out, &[2, 2, 2], ReduceOp::Sum).unwrap_err();
        assert!(e.to_string().contains("the input has 5 elements, expected 6 (the sum of counts)"), "{e}");
        let counts = [1, 2, 3];
        let e = c.reduce_scatter_v(&[0f32; 6], &mut [0f32; 4], &counts, ReduceOp::Sum).unwrap_err();
        let want = format!("the output has 4 elements, expected {}", counts[c.rank()]);
        assert!(e.to_string().contains(&want), "{e}");
        let e = c.reduce_scatter_v(&[0u8; 2], &mut [0u8; 1], &[1, usize::MAX, 1], ReduceOp::Max).unwrap_err();
        assert!(e.to_string().contains("more elements than memory"), "{e}");
        let e = c.reduce_scatter_v_async(vec![0i32; 3], vec![0; 1], &[1, 1], ReduceOp::Min).wait();
        assert!(e.unwrap_err().to_string().contains("counts has 2 entries"));
        let e = c.all_reduce_async(vec![0u8; 3], ReduceOp::Sum);
        drop(e);
        assert!(c.reduce_scatter_async(vec![0i32; 4], vec![0; 2], ReduceOp::Max).wait().is_err());
        // The communicator still works after refused calls.
        let mut v = [1u32];
        c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v[0], 3);
    });
}

#[test]
fn uneven_gather_and_scatter_refuse_wrong_arguments_on_every_rank_before_communicating() {
    for n in 1..=5 {
        on_ranks(n, test_config(), |c| {
            let r = c.rank();
            let counts: Vec<usize> = (0..n).map(|k| k % 3 * 2).collect();
            let total: usize = counts.iter().sum();
            let message = |e: xccl::Error| e.to_string();
            for root in 0..n {
                let mine = vec![1i32; counts[r]];
                let mut all = vec![0i32; total];
                // Counts of the wrong length, on every rank.
                let e = message(c.gather_v(&mine, &mut all, &counts[1..], root).unwrap_err());
                let want = format!("gather_v: counts has {} entries, expected {n} (one per rank)", n - 1);
                assert!(e.contains(&want), "{e}");
                let e = message(c.scatter_v(&all, &mut all.clone()[..counts[r]], &[1; 7], root).unwrap_err());
                assert!(e.contains("scatter_v: counts has 7 entries"), "{e}");
                // This rank's input (gather_v) or output (scatter_v) of the wrong length: every
                // rank checks its own, the non-roots included.
                let wrong = vec![1i32; counts[r] + 1];
                let e = message(c.gather_v(&wrong, &mut all, &counts, root).unwrap_err());
                let want = format!(
                    "gather_v: the input has {} elements, expected {} (counts[{r}], this rank's)",
                    counts[r] + 1,
                    counts[r]
                );
                assert!(e.contains(&want), "{e}");
                let e = message(c.scatter_v(&all, &mut wrong.clone(), &counts, root).unwrap_err());
                assert!(e.contains("scatter_v: the output has") && e.contains("this rank's"), "{e}");
                let e = c.gather_v_async(wrong.clone(), vec![0i32; total], &counts, root).wait();
                assert!(message(e.unwrap_err()).contains("gather_v: the input has"));
                let e = c.scatter_v_async(all.clone(), wrong, &counts, root).wait();
                assert!(message(e.unwrap_err()).contains("scatter_v: the output has"));
                // Counts that overflow (checked before this rank's block).
                if n > 1 {
                    let huge = vec![usize::MAX; n];
                    let e = message(c.gather_v(&mine, &mut all, &huge, root).unwrap_err());
                    assert!(e.contains("gather_v: counts add up to more elements than memory"), "{e}");
                    let e = message(c.scatter_v(&all, &mut all.clone(), &huge, root).unwrap_err());
                    assert!(e.contains("scatter_v: counts add up to more elements than memory"), "{e}");
                }
                // The root's output (gather_v) or input (scatter_v) of the wrong length: only the
                // root checks it, so only the root calls.
                if r == root {
                    let e =
                        message(c.gather_v(&mine, &mut vec![0i32; total + 2], &counts, root).unwrap_err());
                    let want = format!(
                        "gather_v: the root's output has {} elements, expected {total} (the sum of counts)",
                        total + 2
                    );
                    assert!(e.contains(&want), "{e}");
                    let e = message(
                        c.scatter_v(&vec![0i32; total + 1], &mut vec![0i32; counts[r]], &counts, root)
                            .unwrap_err(),
                    );
                    assert!(e.contains("scatter_v: the root's input has"), "{e}");
                }
            }
            // A root outside the group.
            let mut all = vec![0u8; 2 * n];
            let e = message(c.gather_v(&[7u8; 2], &mut all, &vec![2; n], n).unwrap_err());
            assert!(e.contains(&format!("gather_v: root {n} is outside this group of {n} ranks")), "{e}");
            let e = c.scatter_v_async(all.clone(), vec![0u8; 2], &vec![2; n], n + 3).wait();
            assert!(message(e.unwrap_err()).contains(&format!("scatter_v: root {}", n + 3)));
            // Nothing was sent: the communicator still works, with the same buffers.
            let root = n - 1;
            c.gather_v(&[r as u8; 2], &mut all, &vec![2; n], root).unwrap();
            if r == root {
                assert_eq!(all, (0..2 * n).map(|i| (i / 2) as u8).collect::<Vec<_>>());
            }
            let mut mine = [0u8; 2];
            c.scatter_v(&all, &mut mine, &vec![2; n], root).unwrap();
            assert_eq!(mine, [r as u8; 2]);
        });
    }
}

/// Runs one collective of `kind` with `len` elements per block on every rank and checks it.
fn run_and_check<T: Small>(c: &Communicator, kind: CollKind, len: usize, root: usize, what: &str) {
    let (n, r) = (c.size(), c.rank());
    let op = ReduceOp::Sum;
    match kind {
        CollKind::AllReduce => {
            let mut v = input::<T>(op, r, len, 5);
            c.all_reduce(&mut v, op).unwrap();
            assert_each(&v, |i| expected::<T>(op, n, i, 5), what);
            let mut out = vec![T::small(1); len];
            c.all_reduce_into(&input::<T>(ReduceOp::Max, r, len, 6), &mut out, ReduceOp::Max).unwrap();
            assert_each(&out, |i| expected::<T>(ReduceOp::Max, n, i, 6), what);
        }
        CollKind::AllGather => {
            let mut out = vec![T::small(0); len * n];
            c.all_gather(&input::<T>(op, r, len, 7), &mut out).unwrap();
            assert_each(&out, |k| val(op, k / len.max(1), k % len.max(1), 7), what);
            let counts: Vec<usize> = (0..n).map(|k| (len + k) % 3 * (len / 3 + 1)).collect();
            let mut out = vec![T::small(0); counts.iter().sum()];
            c.all_gather_v(&input::<T>(op, r, counts[r], 8), &mut out, &counts).unwrap();
            let want: Vec<T> =
                (0..n).flat_map(|k| (0..counts[k]).map(move |i| val::<T>(op, k, i, 8))).collect();
            assert_eq!(out, want, "{what} (v)");
        }
        CollKind::ReduceScatter => {
            let mut out = vec![T::small(0); len];
            c.reduce_scatter(&input::<T>(op, r, len * n, 9), &mut out, op).unwrap();
            assert_each(&out, |i| expected::<T>(op, n, r * len + i, 9), what);
            // Uneven blocks, some empty, blocking with `Sum` and asynchronous with `Max`.
            let counts: Vec<usize> = (0..n).map(|k| (len + k * 7 + 3) % 5 * (len / 4 + 1)).collect();
            let (total, off) = (counts.iter().sum(), counts[..r].iter().sum::<usize>());
            let mut out = vec![T::small(0); counts[r]];
            c.reduce_scatter_v(&input::<T>(op, r, total, 11), &mut out, &counts, op).unwrap();
            assert_each(&out, |i| expected::<T>(op, n, off + i, 11), &format!("{what} (v {counts:?})"));
            let max = ReduceOp::Max;
            let work = c.reduce_scatter_v_async(input::<T>(max, r, total, 12), out, &counts, max);
            let (_, out) = work.wait().unwrap();
            assert_each(&out, |i| expected::<T>(max, n, off + i, 12), &format!("{what} (v async)"));
            // Every block empty but one.
            let counts: Vec<usize> = (0..n).map(|k| if k == n - 1 { len + 1 } else { 0 }).collect();
            let mut out = vec![T::small(0); counts[r]];
            c.reduce_scatter_v(&input::<T>(op, r, len + 1, 13), &mut out, &counts, op).unwrap();
            assert_each(&out, |i| expected::<T>(op, n, i, 13), &format!("{what} (v, one block)"));
        }
        CollKind::Broadcast => {
            let mut v = input::<T>(op, r, len, 10);
            c.broadcast(&mut v, root).unwrap();
            assert_each(&v, |i| val(op, root, i, 10), what);
        }
        CollKind::Gather => {
            let mut out = vec![T::small(0); if r == root { len * n } else { 0 }];
            c.gather(&input::<T>(op, r, len, 14), &mut out, root).unwrap();
            if r == root {
                assert_each(&out, |k| val(op, k / len.max(1), k % len.max(1), 14), what);
            }
            for counts in uneven_counts(len, n, root) {
                gather_v_form::<T>(c, &counts, root, 15);
            }
        }
        CollKind::Scatter => {
            let mut out = vec![T::small(0); len];
            let inp = if r == root { input::<T>(op, root, len * n, 16) } else { Vec::new() };
            c.scatter(&inp, &mut out, root).unwrap();
            assert_each(&out, |i| val(op, root, r * len + i, 16), what);
            for counts in uneven_counts(len, n, root) {
                scatter_v_form::<T>(c, &counts, root, 17);
            }
        }
        CollKind::AllToAll => {
            let code = |s: usize, d: usize, i: usize| T::small(((s * 13 + d * 5 + i) % 90) as i64);
            let inp: Vec<T> = (0..len * n).map(|k| code(r, k / len.max(1), k % len.max(1))).collect();
            let mut out = vec![T::small(0); len * n];
            c.all_to_all(&inp, &mut out).unwrap();
            assert_each(&out, |k| code(k / len.max(1), r, k % len.max(1)), what);
        }
        other => unreachable!("{other} has a single algorithm"),
    }
}

#[test]
fn every_algorithm_matches_the_reference() {
    // Counts: empty, tiny, not divisible, and several hundred KiB (many segments of a ring).
    let lens = [0usize, 1, 5, 1021, 150_001];
    for kind in [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
    ] {
        for &algo in Algorithm::for_collective(kind) {
            for n in [1, 2, 3, 4, 5, 7, 8] {
                if !algo.supports(kind, n, &xccl::algo::Shape::Count(1)) {
                    continue;
                }
                let mut config = test_config();
                config.algos.set(kind, algo).unwrap();
                on_ranks(n, config, |c| {
                    for &len in &lens {
                        let root = (len + 1) % n;
                        let what = format!("{kind} by {algo}, n {n}, len {len}");
                        run_and_check::<f32>(c, kind, len, root, &what);
                        run_and_check::<i64>(c, kind, len / 3, root, &what);
                    }
                });
            }
        }
    }
}

#[test]
fn large_all_reduces_written_ahead_match_the_reference() {
    // Threads of one process (the peer's memory is written directly): 2 ranks by the
    // algorithms whose folded halves go back to the same peer in the next step (Rabenseifner,
    // the tuner's pick) and by two that do not, and Rabenseifner on 3 ranks (folded) and 4
    // (its middle rounds); each with the fused protocol allowed, and without it.
    let cases = [
        (2, None),
        (2, Some(Algorithm::Ring)),
        (2, Some(Algorithm::Direct)),
        (3, Some(Algorithm::Rabenseifner)),
        (4, Some(Algorithm::Rabenseifner)),
    ];
    for (n, algo) in cases {
        for policy in ["", "ll,eager,pull,split"] {
            let mut config = test_config();
            config.protocols = xccl::protocol::ProtocolPolicy::parse(policy).unwrap();
            if let Some(algo) = algo {
                config.algos.set(CollKind::AllReduce, algo).unwrap();
            }
            on_ranks(n, config, |c| {
                large_all_reduce_forms::<f32>(c);
                large_all_reduce_forms::<f64>(c);
            });
        }
    }
}

#[test]
fn every_protocol_matches_the_reference() {
    // Each protocol forced on its own (with stream, the fallback, where it does not apply),
    // at sizes on both sides of the LL, eager, pull and split thresholds.
    let lens = [0usize, 1, 9, 1024, 1025, 20_000, 300_000];
    for proto in xccl::protocol::Protocol::ALL {
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::Broadcast,
            CollKind::AllToAll,
            CollKind::Gather,
            CollKind::Scatter,
        ] {
            for n in [2, 3, 5] {
                let mut config = test_config();
                config.protocols = xccl::protocol::ProtocolPolicy::parse(proto.name()).unwrap();
                on_ranks(n, config, |c| {
                    for &len in &lens {
                        let root = (len + 1) % n;
                        let what = format!("{kind} by protocol {proto}, n {n}, len {len}");
                        run_and_check::<f32>(c, kind, len, root, &what);
                        run_and_check::<u8>(c, kind, len / 3, root, &what);
                    }
                });
            }
        }
    }
}
