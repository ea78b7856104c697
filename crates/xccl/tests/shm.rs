//! The shared-memory transport, with ranks as threads (each rank maps the segment itself, as
//! a process would): one host, and mixed jobs where host keys split the ranks into hosts
//! that talk TCP to each other and shared memory inside.

mod common;

use std::time::{Duration, Instant};

use common::*;
use xccl::algo::Algorithm;
use xccl::bootstrap::{Auth, Rendezvous, StoreServer};
use xccl::protocol::{Protocol, ProtocolPolicy};
use xccl::{CollKind, Communicator, Config, ReduceOp};

/// Runs `f` on ranks connected through a fresh store; rank `r` sits on host `hosts[r]`.
fn on_hosts<R: Send>(hosts: &[&str], config: Config, f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    on_hosts_with(hosts, &vec![config; hosts.len()], f)
}

/// Like [`on_hosts`], with rank `r` configured by `configs[r]`.
fn on_hosts_with<R: Send>(
    hosts: &[&str],
    configs: &[Config],
    f: impl Fn(&Communicator) -> R + Sync,
) -> Vec<R> {
    let n = hosts.len();
    let auth = Auth::new(unique_job(&format!("shm-test-{}", hosts.join(""))), "s").unwrap();
    let store = StoreServer::start("127.0.0.1:0", auth.clone()).unwrap();
    let addr = store.addr().to_string();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let rv = Rendezvous {
                    rank: r,
                    size: n,
                    local_rank: r,
                    store: addr.clone(),
                    serve_store: false,
                    c10d_prefix: None,
                    auth: auth.clone(),
                    timeout: Duration::from_secs(20),
                    host: hosts[r].to_string(),
                    launcher: "test",
                };
                let (config, f) = (configs[r].clone(), &f);
                s.spawn(move || f(&Communicator::connect(&rv, config).expect("connect")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

fn subset(c: &Communicator) {
    let (n, r) = (c.size(), c.rank());
    for &len in &[0usize, 1, 13, 4099, 700_001] {
        let mut v = input::<f32>(ReduceOp::Sum, r, len, len);
        c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        assert!(
            v.iter().enumerate().all(|(i, x)| *x == expected::<f32>(ReduceOp::Sum, n, i, len)),
            "all_reduce {len}"
        );
        let mut b = input::<u8>(ReduceOp::Sum, r, len, 2);
        c.broadcast(&mut b, n - 1).unwrap();
        assert!(b.iter().enumerate().all(|(i, x)| *x == val::<u8>(ReduceOp::Sum, n - 1, i, 2)));
        let block = len / n;
        let mut out = vec![0i64; block];
        c.reduce_scatter(&input::<i64>(ReduceOp::Max, r, block * n, 3), &mut out, ReduceOp::Max).unwrap();
        assert!(
            out.iter().enumerate().all(|(i, x)| *x == expected::<i64>(ReduceOp::Max, n, r * block + i, 3))
        );
        // Uneven blocks, some empty.
        let counts: Vec<usize> = (0..n).map(|k| (k * 7 + 3) % 5 * (block / 3 + 1)).collect();
        let off: usize = counts[..r].iter().sum();
        let inp = input::<f32>(ReduceOp::Sum, r, counts.iter().sum(), 9);
        let mut out = vec![0f32; counts[r]];
        c.reduce_scatter_v(&inp, &mut out, &counts, ReduceOp::Sum).unwrap();
        assert!(
            out.iter().enumerate().all(|(i, x)| *x == expected::<f32>(ReduceOp::Sum, n, off + i, 9)),
            "reduce_scatter_v {counts:?}"
        );
        let mut g = vec![0u32; block * n];
        c.all_gather(&input::<u32>(ReduceOp::Sum, r, block, 4), &mut g).unwrap();
        assert!(
            g.iter()
                .enumerate()
                .all(|(k, x)| *x == val::<u32>(ReduceOp::Sum, k / block.max(1), k % block.max(1), 4))
        );
    }
    // Messages of 1 to 2 MiB one way: the receiver copies the head while the sender writes
    // the tail; larger ones from a sender with nothing else to do stream through the ring
    // (with a core per rank).
    let mut big = input::<u32>(ReduceOp::Sum, r, 500_003, 5);
    c.broadcast(&mut big, 0).unwrap();
    assert!(big.iter().enumerate().all(|(i, x)| *x == val::<u32>(ReduceOp::Sum, 0, i, 5)), "broadcast 2 MB");
    let mut huge = input::<u32>(ReduceOp::Sum, r, 1_300_001, 8);
    c.broadcast(&mut huge, n - 1).unwrap();
    assert!(
        huge.iter().enumerate().all(|(i, x)| *x == val::<u32>(ReduceOp::Sum, n - 1, i, 8)),
        "broadcast 5 MB"
    );
    let block = 262_147;
    let mut mine = vec![0u32; block];
    c.scatter(&input::<u32>(ReduceOp::Sum, r, block * n, 6), &mut mine, n - 1).unwrap();
    assert!(mine.iter().enumerate().all(|(i, x)| *x == val::<u32>(ReduceOp::Sum, n - 1, r * block + i, 6)));
    let mut all = vec![0u32; if r == 0 { block * n } else { 0 }];
    c.gather(&input::<u32>(ReduceOp::Sum, r, block, 7), &mut all, 0).unwrap();
    assert!(all.iter().enumerate().all(|(k, x)| *x == val::<u32>(ReduceOp::Sum, k / block, k % block, 7)));
    // Uneven, with an empty block: messages of every protocol's size, one way.
    let counts: Vec<usize> = (0..n).map(|k| [block, 0, 1_300_001, 7][k % 4]).collect();
    forms::scatter_v_form::<u32>(c, &counts, n - 1, 10);
    forms::gather_v_form::<f32>(c, &counts, 0, 11);
    let s = c.isend(vec![r as f64; 300_000], (r + 1) % n, 1);
    let got = c.irecv(vec![0f64; 300_000], (r + n - 1) % n, 1).wait().unwrap();
    assert!(got.iter().all(|x| *x == ((r + n - 1) % n) as f64));
    s.wait().unwrap();
    c.barrier().unwrap();
}

#[test]
fn collectives_over_shared_memory_match_the_reference() {
    for n in [2, 3, 4] {
        on_hosts(&vec!["one-host"; n], test_config(), subset);
    }
}

#[test]
fn mixed_jobs_use_shared_memory_inside_hosts_and_tcp_between() {
    let hosts = ["a", "a", "b", "b", "b"];
    on_hosts(&hosts, test_config(), subset);
    // The hierarchical all-reduce with real hosts: leaders 0 and 2 meet over TCP.
    let mut config = test_config();
    config.algos.set(CollKind::AllReduce, Algorithm::Hierarchical).unwrap();
    on_hosts(&hosts, config, |c| {
        for len in [1usize, 1000, 500_003] {
            let mut v = input::<f64>(ReduceOp::Sum, c.rank(), len, 9);
            c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
            assert!(v.iter().enumerate().all(|(i, x)| *x == expected::<f64>(ReduceOp::Sum, 5, i, 9)));
        }
        // Splits keep the host structure: each split group builds its own links.
        let odd = c.split(Some((c.rank() % 2) as u32), 0).unwrap().unwrap();
        let mut v = [c.rank() as i32];
        odd.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v[0], (0..5).filter(|q| q % 2 == c.rank() % 2).sum::<usize>() as i32);
    });
}

#[test]
fn large_all_reduces_written_ahead_over_shared_memory_match_the_reference() {
    // Cross-memory attach (`process_vm_writev` into the peer): 2 ranks (Rabenseifner, the
    // tuner's pick), Rabenseifner's middle rounds on 4; then ranks that disagree on the fused
    // protocol: the one without it declines the other's grant and refuses to write ahead
    // itself, and both still get the reference result.
    let mut four = test_config();
    four.algos.set(CollKind::AllReduce, Algorithm::Rabenseifner).unwrap();
    for (n, config) in [(2, test_config()), (4, four)] {
        on_hosts(&vec!["one"; n], config, |c| {
            forms::large_all_reduce_forms::<f32>(c);
            forms::large_all_reduce_forms::<f64>(c);
        });
    }
    let without =
        Config { protocols: ProtocolPolicy::parse("ll,eager,pull,split").unwrap(), ..test_config() };
    for configs in [[without.clone(), test_config()], [test_config(), without]] {
        on_hosts_with(&["one"; 2], &configs, |c| {
            forms::large_all_reduce_forms::<f32>(c);
            forms::large_all_reduce_forms::<f64>(c);
        });
    }
}

#[test]
fn every_protocol_over_shared_memory_and_tcp_matches_the_reference() {
    for proto in Protocol::ALL {
        let mut config = test_config();
        config.protocols = ProtocolPolicy::parse(proto.name()).unwrap();
        on_hosts(&["one"; 3], config.clone(), subset);
        on_hosts(&["a", "a", "b"], config, subset);
    }
}

#[test]
fn ranks_that_disagree_on_the_protocol_fail_with_a_mismatch_instead_of_hanging() {
    // Rank 0 streams what the others send by LL (and expects frames where they send LL):
    // nobody may wait for the timeout.
    let config = Config { timeout: Duration::from_secs(60), ..test_config() };
    let stream_only = Config { protocols: ProtocolPolicy::parse("stream").unwrap(), ..config.clone() };
    let start = Instant::now();
    let errors = on_hosts_with(&["h"; 3], &[stream_only, config.clone(), config], |c| {
        let mut v = vec![c.rank() as f32; 8];
        c.all_reduce(&mut v, ReduceOp::Sum).unwrap_err().to_string()
    });
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    assert!(
        errors.iter().any(|e| e.contains("LL") && e.contains("mismatch")),
        "no rank named the protocol mismatch: {errors:?}"
    );
}

#[test]
fn a_rank_that_panics_over_shared_memory_fails_the_others_promptly() {
    let config = Config { timeout: Duration::from_secs(60), ..test_config() };
    let start = Instant::now();
    let outcomes = std::panic::catch_unwind(|| {
        on_hosts(&["h"; 3], config, |c| {
            let mut v = vec![1f32; 1 << 18];
            c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
            if c.rank() == 2 {
                panic!("rank 2 fails in user code");
            }
            c.all_reduce(&mut v, ReduceOp::Sum).unwrap_err()
        })
    });
    // The scope re-raises rank 2's panic; the others must have returned (not hung) first.
    assert!(outcomes.is_err());
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
}

#[test]
fn no_segment_file_is_left_behind() {
    let job_files = || {
        std::fs::read_dir("/dev/shm")
            .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("xccl-")).count())
            .unwrap_or(0)
    };
    on_hosts(&["h"; 4], test_config(), |c| {
        let sub = c.split(Some((c.rank() / 2) as u32), 0).unwrap().unwrap();
        sub.barrier().unwrap();
        c.barrier().unwrap();
    });
    // Other tests may be creating segments at the same moment; none of ours may remain.
    let deadline = Instant::now() + Duration::from_secs(5);
    while job_files() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(job_files(), 0, "segment files left in /dev/shm");
}
