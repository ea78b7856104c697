//! Behaviour beyond single results, over the local transport: split groups used at once from
//! several threads, asynchronous operations overlapping each other and computation, events,
//! point-to-point matching, and failures (a panicking rank, mismatches, deadlines).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use xccl::{Config, Error, ReduceOp};

#[test]
fn split_follows_mpi_comm_split_semantics() {
    for n in 1..=8 {
        on_ranks(n, test_config(), |c| {
            let r = c.rank();
            // Colour by parity; odd ranks keyed in reverse; rank 0 opts out.
            let color = (r != 0).then_some((r % 2) as u32);
            let key = if r % 2 == 1 { -(r as i32) } else { 0 };
            let sub = c.split(color, key).unwrap();
            if r == 0 {
                assert!(sub.is_none());
                return;
            }
            let sub = sub.unwrap();
            let mut members: Vec<usize> = (1..n).filter(|q| q % 2 == r % 2).collect();
            if r % 2 == 1 {
                members.reverse();
            }
            assert_eq!(sub.size(), members.len());
            assert_eq!(members[sub.rank()], r, "n {n} rank {r}");
            // Gather the members' parent ranks through the new group: the order must match.
            let mut got = vec![0u64; sub.size()];
            sub.all_gather(&[r as u64], &mut got).unwrap();
            assert_eq!(got, members.iter().map(|&m| m as u64).collect::<Vec<_>>());
        });
    }
}

#[test]
fn groups_used_concurrently_from_several_threads_do_not_cross_talk() {
    // A 2 x 3 mesh: every rank uses its row group, its column group and the world at the
    // same time from three threads, 100 operations each, with distinct data.
    on_ranks(6, test_config(), |c| {
        let r = c.rank();
        let row = c.split(Some((r / 3) as u32), 0).unwrap().unwrap();
        let col = c.split(Some((r % 3) as u32), 0).unwrap().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..100u64 {
                    let mut v = vec![r as u64 * 1000 + i; 300];
                    row.all_reduce(&mut v, ReduceOp::Sum).unwrap();
                    let base = (r / 3) * 3;
                    let want: u64 = (base..base + 3).map(|q| q as u64 * 1000 + i).sum();
                    assert!(v.iter().all(|x| *x == want));
                }
            });
            s.spawn(|| {
                for i in 0..100u64 {
                    let mut v = vec![0i32; 4];
                    col.all_gather(&[r as i32, i as i32], &mut v).unwrap();
                    assert_eq!(v, vec![(r % 3) as i32, i as i32, (r % 3 + 3) as i32, i as i32]);
                }
            });
            s.spawn(|| {
                for i in 0..100 {
                    let mut v = vec![r as f64; 50];
                    c.broadcast(&mut v, i % 6).unwrap();
                    assert!(v.iter().all(|x| *x == (i % 6) as f64));
                }
            });
        });
    });
}

#[test]
fn a_duplicate_keeps_the_ranks_and_runs_its_own_settings_alongside() {
    on_ranks(4, test_config(), |c| {
        let r = c.rank();
        let mut config = c.config().clone();
        config.algos.set(xccl::CollKind::AllReduce, xccl::algo::Algorithm::ReduceBroadcast).unwrap();
        let dup = c.dup_with(config).unwrap();
        assert_eq!((dup.rank(), dup.size()), (r, 4));
        assert_ne!(dup.id(), c.id());
        // Both at once, interleaved across threads: each sees only its own traffic.
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..50u32 {
                    let mut v = vec![r as u32 + i; 1000];
                    dup.all_reduce(&mut v, ReduceOp::Sum).unwrap();
                    assert!(v.iter().all(|x| *x == 6 + 4 * i));
                }
            });
            for i in 0..50u32 {
                let mut v = vec![r as u32 * i; 10];
                c.all_reduce(&mut v, ReduceOp::Max).unwrap();
                assert!(v.iter().all(|x| *x == 3 * i));
            }
        });
        let choice = dup.algorithm_for(xccl::CollKind::AllReduce, 1000, xccl::DType::U32, 0).unwrap();
        assert_eq!(choice.algo, xccl::algo::Algorithm::ReduceBroadcast);
    });
}

#[test]
fn waiting_in_slices_returns_when_the_operation_completes() {
    on_ranks(2, test_config(), |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(200));
        }
        let work = c.all_reduce_async(vec![c.rank() as u32 + 1; 10], ReduceOp::Sum);
        let start = Instant::now();
        let mut slices = 0;
        while !work.wait_for(Duration::from_millis(20)) {
            slices += 1;
            assert!(start.elapsed() < Duration::from_secs(20), "never completed");
        }
        // Rank 0 waited for rank 1 to arrive, slice by slice.
        if c.rank() == 0 {
            assert!(slices >= 3, "{slices} slices");
        }
        assert_eq!(work.wait().unwrap(), vec![3; 10]);
    });
}

#[test]
fn async_operations_overlap_compute_and_complete_in_issue_order() {
    on_ranks(4, test_config(), |c| {
        let r = c.rank();
        let n = c.size();
        // Issue a series of operations without waiting, compute meanwhile, then wait in
        // reverse order: each result must still be right.
        let big = c.all_reduce_async(vec![r as f32; 1 << 20], ReduceOp::Sum);
        let gathered = c.all_gather_async(vec![r as u32; 1000], vec![0u32; 4000]);
        let event = c.record_event();
        let bcast = c.broadcast_async(vec![r as i64; 777], 2);
        let compute: f64 = (0..200_000).map(|i| (i as f64).sqrt()).sum();
        assert!(compute > 0.0);
        let b = bcast.wait().unwrap();
        assert!(b.iter().all(|x| *x == 2));
        // The event covers the two operations issued before it.
        event.wait().unwrap();
        assert!(big.is_completed() && gathered.is_completed());
        let (_, g) = gathered.wait().unwrap();
        assert!(g.iter().enumerate().all(|(k, x)| *x == (k / 1000) as u32));
        let v = big.wait().unwrap();
        assert!(v.iter().all(|x| *x == (n * (n - 1) / 2) as f32));
        // A blocking call after asynchronous ones waits its turn.
        let pending = c.all_reduce_async(vec![1u8; 10], ReduceOp::Sum);
        let mut now = [r as u32];
        c.all_reduce(&mut now, ReduceOp::Max).unwrap();
        assert!(pending.is_completed(), "issue order: the earlier async op finished first");
        assert_eq!(pending.wait().unwrap(), vec![4u8; 10]);
        assert_eq!(now[0], 3);
    });
}

#[test]
fn communication_proceeds_while_the_caller_computes() {
    // While rank 0 computes for 300 ms, the others' all-reduce with it cannot finish; once
    // it waits, everything completes. Meanwhile rank 0's progress thread has already
    // received what it could: its wait returns quickly.
    on_ranks(3, test_config(), |c| {
        let work = c.all_reduce_async(vec![1f32; 1 << 18], ReduceOp::Sum);
        if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(300));
            assert!(work.is_completed(), "the progress thread ran the operation during compute");
        }
        let t0 = Instant::now();
        let v = work.wait().unwrap();
        assert!(v.iter().all(|x| *x == 3.0));
        if c.rank() == 0 {
            assert!(t0.elapsed() < Duration::from_millis(100));
        }
    });
}

#[test]
fn point_to_point_matches_by_peer_and_tag_in_order() {
    on_ranks(3, test_config(), |c| {
        match c.rank() {
            0 => {
                // Three messages to rank 1: tags 7, 8, 7.
                c.send(&[1u32, 1], 1, 7).unwrap();
                c.send(&[2u32; 5], 1, 8).unwrap();
                c.send(&[3u32, 3], 1, 7).unwrap();
                c.send(&[0f64; 0], 2, 0).unwrap();
            }
            1 => {
                // Ask for tag 8 first: the two tag-7 messages wait, in order.
                let mut b = [0u32; 5];
                c.recv(&mut b, 0, 8).unwrap();
                assert_eq!(b, [2; 5]);
                let mut a = [0u32; 2];
                c.recv(&mut a, 0, 7).unwrap();
                assert_eq!(a, [1, 1]);
                c.recv(&mut a, 0, 7).unwrap();
                assert_eq!(a, [3, 3]);
            }
            _ => {
                let got = c.irecv(Vec::<f64>::new(), 0, 0).wait().unwrap();
                assert!(got.is_empty());
            }
        }
        c.barrier().unwrap();
        // A receive of the wrong size or type is an error naming both sides.
        if c.rank() == 0 {
            c.send(&[1i32; 4], 1, 1).unwrap();
        }
        if c.rank() == 1 {
            let e = c.recv(&mut [0i32; 3], 0, 1).unwrap_err();
            assert!(matches!(e, Error::Mismatch { .. }), "{e}");
        }
    });
}

#[test]
fn isend_then_irecv_on_every_rank_never_deadlocks() {
    // Each message is larger than a ring, so a send can only finish if the peer's receive
    // runs at the same time; the receive is issued after the send on every rank.
    on_ranks(4, test_config(), |c| {
        let (r, n) = (c.rank(), c.size());
        for round in 0..30 {
            let s = c.isend(vec![(r * 100 + round) as u32; 1 << 19], (r + 1) % n, round as u32);
            let got = c.irecv(vec![0u32; 1 << 19], (r + n - 1) % n, round as u32).wait().unwrap();
            assert!(got.iter().all(|x| *x == (((r + n - 1) % n) * 100 + round) as u32));
            s.wait().unwrap();
        }
    });
}

#[test]
fn a_rank_that_panics_fails_the_others_promptly_naming_it() {
    let config = Config { timeout: Duration::from_secs(60), ..Config::default() };
    let comms = xccl::Communicator::local_with(4, config).unwrap();
    let start = Instant::now();
    let results: Vec<std::thread::Result<Result<(), Error>>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let mut v = vec![1f32; 1 << 16];
                    c.all_reduce(&mut v, ReduceOp::Sum)?;
                    if c.rank() == 1 {
                        panic!("rank 1 hits a bug in user code");
                    }
                    c.all_reduce(&mut v, ReduceOp::Sum)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    for (r, res) in results.into_iter().enumerate() {
        if r == 1 {
            assert!(res.is_err(), "rank 1 panicked");
            continue;
        }
        let err = res.unwrap().unwrap_err();
        assert_eq!(err.culprit(), Some(1), "rank {r}: {err}");
        assert!(err.to_string().contains("panicked"), "{err}");
    }
}

#[test]
fn mismatches_on_memory_links_describe_both_sides() {
    let errs = on_ranks(3, test_config(), |c| {
        let mut v = vec![0i32; 10];
        let res = match c.rank() {
            0 => c.all_reduce(&mut v, ReduceOp::Sum),
            1 => c.all_reduce(&mut v, ReduceOp::Max),
            _ => c.all_reduce(&mut v[..9], ReduceOp::Sum),
        };
        res.and_then(|()| c.barrier()).unwrap_err().to_string()
    });
    assert!(errs.iter().any(|e| e.contains("sum") && e.contains("max")), "{errs:?}");
    assert!(errs.iter().any(|e| e.contains("x 10") && e.contains("x 9")), "{errs:?}");
    // After the failure, the communicator refuses further work with the original cause.
}

#[test]
fn a_failed_communicator_refuses_later_operations_with_the_cause() {
    on_ranks(2, test_config(), |c| {
        let mut v = [0u8; 4];
        let first = if c.rank() == 0 {
            c.all_reduce(&mut v, ReduceOp::Sum)
        } else {
            c.all_reduce(&mut v[..2], ReduceOp::Sum)
        };
        let first = first.and_then(|()| c.barrier()).unwrap_err();
        let later = c.barrier().unwrap_err();
        assert!(matches!(later, Error::Aborted(_)), "{later}");
        assert!(later.to_string().contains(&first.to_string()) || c.rank() == 1, "{later} / {first}");
        assert!(c.all_reduce_async(vec![1u8], ReduceOp::Sum).wait().is_err());
    });
}

#[test]
fn a_rank_that_never_comes_times_out_naming_the_operation() {
    let config = Config { timeout: Duration::from_millis(300), ..Config::default() };
    let started = AtomicBool::new(false);
    let errs = on_ranks(3, config, |c| {
        if c.rank() == 2 {
            // Stay alive but silent until the others have given up.
            while !started.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(900));
            return None;
        }
        started.store(true, Ordering::SeqCst);
        let t0 = Instant::now();
        let e = c.reduce_scatter(&[0f32; 6], &mut [0f32; 2], ReduceOp::Sum).unwrap_err();
        Some((e, t0.elapsed()))
    });
    for (e, took) in errs.into_iter().flatten() {
        assert!(took < Duration::from_secs(5));
        if let Error::Timeout { detail, .. } = &e {
            assert!(e.to_string().contains("reduce_scatter #0") && detail.contains("rank"), "{e}");
        } else {
            assert!(matches!(e, Error::RemoteAbort { .. }), "{e}");
        }
    }
}

#[test]
fn the_timeline_records_every_operation_in_order() {
    on_ranks(2, test_config(), |c| {
        assert!(c.take_timeline().is_empty(), "nothing is recorded until asked");
        c.record_timeline(true);
        let mut v = vec![1f32; 1000];
        c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        let w = c.broadcast_async(vec![0u8; 10], 1);
        if c.rank() == 0 {
            c.send(&[1i64; 3], 1, 4).unwrap();
        } else {
            c.recv(&mut [0i64; 3], 0, 4).unwrap();
        }
        w.wait().unwrap();
        let spans = c.take_timeline();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(spans.len(), 3, "{names:?}");
        assert!(names[0].starts_with("all_reduce #0 (f32 x 1000"), "{names:?}");
        assert!(names[1].starts_with("broadcast #1"), "{names:?}");
        assert!(names[2].starts_with(if c.rank() == 0 { "send to 1 (tag 4" } else { "recv from 0 (tag 4" }));
        assert_eq!(spans[0].bytes, 4000);
        for s in &spans {
            assert!(s.issued <= s.started && s.started <= s.finished);
        }
        assert!(c.take_timeline().is_empty(), "taken spans are gone");
    });
}
