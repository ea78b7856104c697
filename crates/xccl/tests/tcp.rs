//! The TCP transport with ranks as threads (real sockets, a real store, the handshake):
//! a representative subset of collectives, splits, failures and bad peers. Every rank gets
//! its own host key, so all of them talk TCP.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use xccl::bootstrap::{Auth, Rendezvous, StoreServer};
use xccl::{Communicator, Config, Error, ReduceOp};

fn rendezvous(rank: usize, size: usize, store: &str, auth: &Auth) -> Rendezvous {
    Rendezvous {
        rank,
        size,
        local_rank: rank,
        store: store.to_string(),
        serve_store: false,
        c10d_prefix: None,
        auth: auth.clone(),
        timeout: Duration::from_secs(20),
        host: format!("host-of-rank-{rank}"),
        launcher: "test",
    }
}

/// Runs `f` on `n` ranks connected over TCP through a fresh store, one such world at a time:
/// the failure tests use timeouts of a second or less and peers that join, read or leave
/// a few tens of milliseconds apart, which other tests' ranks competing for the cores (a
/// 64 MiB exchange, 128 MiB streamed) could stretch beyond what they test.
fn on_tcp_ranks<R: Send>(n: usize, config: Config, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding it leaves it poisoned; the next one may still run.
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let auth = Auth::new(unique_job(&format!("tcp-test-{n}")), "secret").unwrap();
    let store = StoreServer::start("127.0.0.1:0", auth.clone()).unwrap();
    let addr = store.addr().to_string();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (addr, auth, config, f) = (&addr, &auth, config.clone(), &f);
                s.spawn(move || {
                    let comm = Communicator::connect(&rendezvous(r, n, addr, auth), config).expect("connect");
                    f(&comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

#[test]
fn collectives_over_tcp_match_the_reference() {
    for n in [1, 2, 3, 4, 5] {
        on_tcp_ranks(n, test_config(), |c| {
            let r = c.rank();
            for &len in &[0usize, 1, 13, 4099, 300_007] {
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                    let mut v = input::<f32>(op, r, len, len);
                    c.all_reduce(&mut v, op).unwrap();
                    assert!(
                        v.iter().enumerate().all(|(i, x)| *x == expected::<f32>(op, n, i, len)),
                        "all_reduce {op} {len}"
                    );
                }
                let mut v = input::<i64>(ReduceOp::Prod, r, len, 1);
                c.reduce_in_place(&mut v, ReduceOp::Prod, n / 2).unwrap();
                if r == n / 2 {
                    assert!(
                        v.iter().enumerate().all(|(i, x)| *x == expected::<i64>(ReduceOp::Prod, n, i, 1))
                    );
                }
                let mut b = input::<u8>(ReduceOp::Sum, r, len, 2);
                c.broadcast(&mut b, n - 1).unwrap();
                assert!(b.iter().enumerate().all(|(i, x)| *x == val::<u8>(ReduceOp::Sum, n - 1, i, 2)));
                let mut g = vec![xccl::bf16::ZERO; len * n];
                let mine = input::<xccl::bf16>(ReduceOp::Sum, r, len, 3);
                c.all_gather(&mine, &mut g).unwrap();
                assert!(
                    g.iter()
                        .enumerate()
                        .all(|(i, x)| *x == val(ReduceOp::Sum, i / len.max(1), i % len.max(1), 3))
                );
                let inp = input::<f64>(ReduceOp::Sum, r, len * n, 4);
                let mut out = vec![0f64; len];
                c.reduce_scatter(&inp, &mut out, ReduceOp::Sum).unwrap();
                assert!(
                    out.iter()
                        .enumerate()
                        .all(|(i, x)| *x == expected::<f64>(ReduceOp::Sum, n, r * len + i, 4))
                );
                // Uneven blocks, some empty, asynchronous.
                let counts: Vec<usize> = (0..n).map(|k| (k * 7 + 3) % 5 * (len / 4 + 1)).collect();
                let off: usize = counts[..r].iter().sum();
                let inp = input::<i64>(ReduceOp::Min, r, counts.iter().sum(), 5);
                let work = c.reduce_scatter_v_async(inp, vec![0i64; counts[r]], &counts, ReduceOp::Min);
                let (_, out) = work.wait().unwrap();
                assert!(
                    out.iter().enumerate().all(|(i, x)| *x == expected::<i64>(ReduceOp::Min, n, off + i, 5)),
                    "reduce_scatter_v {counts:?}"
                );
                let inp: Vec<i32> = (0..len * n).map(|k| (r * 1000 + k / len.max(1)) as i32).collect();
                let mut out = vec![0i32; len * n];
                c.all_to_all(&inp, &mut out).unwrap();
                assert!(out.iter().enumerate().all(|(k, x)| *x == ((k / len.max(1)) * 1000 + r) as i32));
                // Uneven gather and scatter, with empty blocks, from and to every root.
                for root in 0..n {
                    for counts in forms::uneven_counts(len, n, root) {
                        forms::gather_v_form::<i64>(c, &counts, root, 6);
                        forms::scatter_v_form::<xccl::bf16>(c, &counts, root, 7);
                    }
                }
            }
            c.barrier().unwrap();
        });
    }
}

#[test]
fn point_to_point_tags_and_async_overlap_over_tcp() {
    on_tcp_ranks(3, test_config(), |c| {
        let r = c.rank();
        let (next, prev) = ((r + 1) % 3, (r + 2) % 3);
        // Two tags sent in one order, received in the other: the first waits in the stash.
        let a = c.isend(vec![r as u32; 1000], next, 1);
        let b = c.isend(vec![r as u32 + 10; 70_000], next, 2);
        let mut got2 = vec![0u32; 70_000];
        c.recv(&mut got2, prev, 2).unwrap();
        let mut got1 = vec![0u32; 1000];
        c.recv(&mut got1, prev, 1).unwrap();
        assert!(got1.iter().all(|x| *x == prev as u32));
        assert!(got2.iter().all(|x| *x == prev as u32 + 10));
        a.wait().unwrap();
        b.wait().unwrap();
        // Large exchanges posted as isend then irecv on every rank cannot deadlock, however
        // the progress thread happens to pick them up.
        for round in 0..20 {
            let s = c.isend(vec![(r + round) as f64; 1 << 20], next, 5);
            let rv = c.irecv(vec![0f64; 1 << 20], prev, 5);
            assert!(rv.wait().unwrap().iter().all(|x| *x == (prev + round) as f64));
            s.wait().unwrap();
        }
    });
}

#[test]
fn split_groups_work_concurrently_over_tcp() {
    on_tcp_ranks(4, test_config(), |c| {
        let r = c.rank();
        // 2 x 2 mesh: rows (same r / 2) and columns (same r % 2), used from two threads at once.
        let row = c.split(Some((r / 2) as u32), r as i32).unwrap().unwrap();
        let col = c.split(Some((r % 2) as u32), r as i32).unwrap().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..50 {
                    let mut v = vec![(r + i) as i64; 777];
                    row.all_reduce(&mut v, ReduceOp::Sum).unwrap();
                    let base = (r / 2) * 2;
                    assert!(v.iter().all(|x| *x == (2 * (base + i) + 1) as i64));
                }
            });
            s.spawn(|| {
                for i in 0..50 {
                    let mut v = vec![(r * 10 + i) as i64; 555];
                    col.all_reduce(&mut v, ReduceOp::Max).unwrap();
                    assert!(v.iter().all(|x| *x == ((2 + r % 2) * 10 + i) as i64));
                }
            });
        });
        assert!(c.split(None, 0).unwrap().is_none());
    });
}

#[test]
fn mismatched_collectives_fail_on_both_sides_describing_both() {
    // Rank 1's broadcast only sends, so it can complete before rank 0 has looked at its
    // data; its next operation then fails with rank 0's description of both sides.
    let errs = on_tcp_ranks(2, test_config(), |c| {
        let mut v = vec![1f32; 64];
        let first = if c.rank() == 0 { c.all_reduce(&mut v, ReduceOp::Sum) } else { c.broadcast(&mut v, 1) };
        first.and_then(|()| c.barrier()).unwrap_err()
    });
    for e in &errs {
        let msg = e.to_string();
        assert!(msg.contains("all_reduce #0") && msg.contains("broadcast #0"), "{msg}");
    }
    // Same collective, different counts: every rank receives, so every rank fails in it.
    let errs = on_tcp_ranks(3, test_config(), |c| {
        let mut v = vec![1f32; 64 + c.rank()];
        c.all_reduce(&mut v, ReduceOp::Sum)
    });
    for e in errs {
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains("all_reduce #0"), "{msg}");
    }
}

#[test]
fn a_failed_peer_fails_everyone_promptly() {
    // Rank 2 drops out (its thread panics mid-way); the others must fail well before the
    // 30-second deadline, naming it.
    let start = Instant::now();
    let errs = on_tcp_ranks(4, test_config(), |c| {
        let mut v = vec![1f32; 1 << 16];
        c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        if c.rank() == 2 {
            return None;
        }
        Some(c.all_reduce(&mut v, ReduceOp::Sum).unwrap_err())
    });
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    for e in errs.into_iter().flatten() {
        let text = e.to_string();
        assert!(text.contains("rank 2") || e.culprit() == Some(2), "{text}");
    }
}

#[test]
fn wrong_secret_is_refused() {
    let auth = Auth::new("secret-test", "right").unwrap();
    let store = StoreServer::start("127.0.0.1:0", auth.clone()).unwrap();
    let addr = store.addr().to_string();
    let bad = Auth::new("secret-test", "wrong").unwrap();
    let err = Communicator::connect(&rendezvous(0, 2, &addr, &bad), test_config()).unwrap_err();
    assert!(matches!(err, Error::Handshake { .. }), "{err}");
    assert!(err.to_string().contains("XCCL_SECRET"), "{err}");
}

#[test]
fn timeouts_name_the_operation_and_the_silent_rank() {
    let config = Config { timeout: Duration::from_millis(500), ..Config::default() };
    let errs = on_tcp_ranks(3, config, |c| {
        if c.rank() == 1 {
            // Rank 1 never joins the collective (but stays alive until the others give up).
            std::thread::sleep(Duration::from_millis(1500));
            return None;
        }
        Some(c.barrier().unwrap_err())
    });
    for e in errs.into_iter().flatten() {
        let msg = e.to_string();
        assert!(matches!(e, Error::Timeout { .. }) || matches!(e, Error::RemoteAbort { .. }), "{msg}");
        if let Error::Timeout { .. } = e {
            assert!(msg.contains("barrier #0") && msg.contains("rank 1"), "{msg}");
        }
        // Rank 1 never says whom it waits for: every rank that gave up blames it.
        assert_eq!(e.culprit(), Some(1), "{msg}");
    }
}

#[test]
fn a_peer_that_does_not_read_for_longer_than_the_link_timeout_is_not_lost() {
    // Rank 1 sends more than the sockets hold while rank 0 is busy for 4 s: its window stays
    // closed four times longer than the link timeout, but its host answers, so nothing is
    // lost (the kernel's TCP_USER_TIMEOUT would have ended the connection).
    let config = Config { link_timeout: Duration::from_secs(1), ..test_config() };
    let n = 32 << 20;
    let got = on_tcp_ranks(2, config, |c| {
        if c.rank() == 1 {
            let v: Vec<u32> = (0..n as u32).collect();
            c.send(&v, 0, 7).map(|()| true)
        } else {
            std::thread::sleep(Duration::from_secs(4));
            let mut v = vec![0u32; n];
            c.recv(&mut v, 1, 7).map(|()| v.iter().enumerate().all(|(i, &x)| x == i as u32))
        }
    });
    for (r, g) in got.into_iter().enumerate() {
        assert!(g.as_ref().is_ok_and(|&ok| ok), "rank {r}: {g:?}");
    }
}

#[test]
fn a_rank_that_times_out_reports_a_failure_its_peers_heard_of_meanwhile() {
    // Rank 2 waits for rank 1, which stays silent. Meanwhile rank 0, which had sent rank 2 a
    // message rank 2 has not read, fails: its farewell lies behind that message. Rank 2's
    // timeout must say where the failure began, not only whom it waited for.
    let config = Config { timeout: Duration::from_millis(1500), ..Config::default() };
    let errs = on_tcp_ranks(3, config, |c| match c.rank() {
        0 => {
            c.send(&[7u32; 1000], 2, 5).unwrap();
            c.abort("disk on fire").unwrap();
            let _ = c.barrier();
            None
        }
        1 => {
            std::thread::sleep(Duration::from_secs(5));
            None
        }
        _ => {
            let mut v = [0u32; 4];
            Some(c.recv(&mut v, 1, 9).unwrap_err())
        }
    });
    let e = errs.into_iter().flatten().next().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, Error::Timeout { .. }), "{msg}");
    assert!(msg.contains("meanwhile rank 0 failed") && msg.contains("disk on fire"), "{msg}");
    assert_eq!(e.culprit(), Some(0), "{msg}");
}

#[test]
fn a_rank_that_aborts_mid_exchange_is_heard_with_its_reason() {
    // Rank 0 aborts in the middle of an exchange of 32 MiB each way, its socket full (rank 1
    // joins later), and rank 1 then streams its half while rank 0 leaves. Rank 0 must say
    // its farewell once rank 1 reads, and must not close with rank 1's bytes unread (a reset
    // can overtake the farewell); rank 1, in the middle of one of rank 0's frames, must find
    // the farewell behind it. Rank 1 joins only once rank 0 has aborted: on a crowded
    // machine a late abort would otherwise let the exchange finish first.
    for round in 0..5 {
        let aborted = AtomicBool::new(false);
        let errs = on_tcp_ranks(2, test_config(), |c| {
            let input = vec![c.rank() as f32; 16 << 20];
            let mut output = vec![0f32; 16 << 20];
            std::thread::scope(|s| {
                if c.rank() == 0 {
                    s.spawn(|| {
                        std::thread::sleep(Duration::from_millis(20));
                        c.abort("disk on fire").unwrap();
                        aborted.store(true, Ordering::Release);
                    });
                } else {
                    let since = Instant::now();
                    while !aborted.load(Ordering::Acquire) && since.elapsed() < Duration::from_secs(30) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    std::thread::sleep(Duration::from_millis(40));
                }
                c.all_to_all(&input, &mut output).err()
            })
        });
        let msg = errs[1].as_ref().map_or_else(|| "no error".to_string(), |e| e.to_string());
        assert!(msg.contains("disk on fire"), "round {round}: {msg}");
    }
}

#[test]
fn a_rank_that_times_out_does_not_blame_itself_for_a_peer_that_took_it_for_silent() {
    // Rank 0 waits for rank 1, and gives up before rank 1 has timed out in turn: rank 1,
    // which waits for the silent rank 2, has not posted yet, so rank 0 names rank 1 and
    // leaves. When rank 1 times out it reads that farewell; it must still blame rank 2.
    let config = Config { timeout: Duration::from_millis(1000), ..Config::default() };
    let errs = on_tcp_ranks(3, config, |c| {
        let mut v = [0u32; 4];
        match c.rank() {
            0 => Some(c.recv(&mut v, 1, 9).unwrap_err()),
            1 => {
                std::thread::sleep(Duration::from_millis(1200));
                Some(c.recv(&mut v, 2, 9).unwrap_err())
            }
            _ => {
                std::thread::sleep(Duration::from_secs(6));
                None
            }
        }
    });
    let (first, second) = (errs[0].as_ref().unwrap(), errs[1].as_ref().unwrap());
    assert_eq!(first.culprit(), Some(1), "{first}");
    let msg = second.to_string();
    assert!(matches!(second, Error::Timeout { .. }), "{msg}");
    assert_eq!(second.culprit(), Some(2), "{msg}");
}
