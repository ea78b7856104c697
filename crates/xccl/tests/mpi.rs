//! The MPI backend under a real `mpirun`: the test launches this test binary itself on 3
//! ranks, which run every form of every collective (the matrix of `common/forms.rs`, every
//! element type and operator), splits and duplicates, point-to-point messages and the
//! asynchronous forms on `Communicator::mpi_world`, each checked against the naive
//! reference. Skipped, saying why, when `mpirun` is not installed; `MPIRUN` names another
//! launcher (`mpirun.mpich`).

#![cfg(feature = "mpi")]

mod common;

use std::process::Command;

use common::forms::*;
use common::*;
use xccl::{CollKind, Communicator, DType, ReduceOp};

/// Set in the environment of the ranks that mpirun starts.
const CHILD: &str = "XCCL_MPI_TEST_RANK";

const RANKS: usize = 3;

#[test]
fn collectives_under_mpirun() {
    if std::env::var_os(CHILD).is_some() {
        rank_main();
        return;
    }
    let mpirun = std::env::var("MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let Ok(version) = Command::new(&mpirun).arg("--version").output() else {
        common::require::skip(
            "mpi",
            format!("{mpirun} not found (install Open MPI or MPICH, see docs/MPI.md)"),
        );
        return;
    };
    eprintln!("mpirun: {}", String::from_utf8_lossy(&version.stdout).lines().next().unwrap_or("?"));
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(&mpirun)
        .args(["-np", &RANKS.to_string()])
        .arg(&exe)
        .args(["--exact", "collectives_under_mpirun", "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        // Open MPI: run as root in containers, more ranks than cores, shared memory and TCP
        // on loopback only (MPICH ignores these).
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_MCA_pml", "ob1")
        .env("OMPI_MCA_btl", "self,vader,tcp")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        // MPICH 4.0.2 (Debian 12) crashes in its shared-memory MPI_Reduce with MPI_IN_PLACE
        // at the root (a plain C program does too); its generic collectives are fine.
        .env("MPIR_CVAR_DEVICE_COLLECTIVES", "none")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mpirun failed ({}):\n{stdout}\n{stderr}", out.status);
    // Every rank ran the test (not a harness that filtered it away).
    let passed = stdout.matches("rank done").count();
    assert_eq!(passed, RANKS, "ranks that finished:\n{stdout}\n{stderr}");
}

/// One rank of the job.
fn rank_main() {
    let world = Communicator::mpi_world().unwrap();
    assert_eq!(world.size(), RANKS, "this test runs on {RANKS} ranks");
    assert_eq!(world.backend(), "mpi");
    let id = world.id();
    let mut ids = vec![0u64; RANKS];
    world.all_gather(&[id], &mut ids).unwrap();
    assert!(ids.iter().all(|&x| x == id), "every member has the same id: {ids:?}");

    every_dtype!(all_reduce_forms, &world);
    every_dtype!(reduce_forms, &world);
    every_dtype!(broadcast_forms, &world);
    every_dtype!(gather_forms, &world);
    every_dtype!(scatter_forms, &world);
    every_dtype!(reduce_scatter_forms, &world);
    every_dtype!(all_to_all_forms, &world);

    splits_and_duplicates(&world);
    point_to_point(&world);
    order_and_events(&world);
    wrong_arguments_leave_the_communicator_usable(&world);
    world.barrier().unwrap();
    println!("rank done {}", world.rank());
}

fn splits_and_duplicates(world: &Communicator) {
    let (n, r) = (world.size(), world.rank());
    // Even ranks in one group, odd in another, in reverse order; u32::MAX is a valid color.
    let color = if r % 2 == 0 { 7 } else { u32::MAX };
    let sub = world.split(Some(color), -(r as i32)).unwrap().unwrap();
    let members: Vec<usize> = (0..n).filter(|q| q % 2 == r % 2).rev().collect();
    assert_eq!(sub.size(), members.len());
    assert_eq!(members[sub.rank()], r, "ordered by key");
    let mut v = vec![r as i64];
    sub.all_reduce(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v[0], members.iter().sum::<usize>() as i64);
    every_dtype!(all_reduce_forms, &sub);
    reduce_scatter_forms::<f32>(&sub);

    // A rank passing no color gets no communicator; the others one of their own.
    let left = world.split((r != 0).then_some(1), 0).unwrap();
    assert_eq!(left.is_none(), r == 0);
    if let Some(c) = &left {
        assert_eq!(c.size(), n - 1);
        all_to_all_forms::<i32>(c);
    }

    // A duplicate progresses on its own: a thread runs collectives on it while this thread
    // runs others on the original, in a different order than on other ranks' threads.
    let dup = world.dup_with(world.config().clone()).unwrap();
    assert_eq!((dup.rank(), dup.size()), (r, n));
    assert_ne!(dup.id(), world.id());
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            for k in 0..50 {
                let mut v = vec![k as f64 + r as f64; 1000];
                dup.all_reduce(&mut v, ReduceOp::Sum).unwrap();
                assert!(v.iter().all(|&x| x == (n * k + n * (n - 1) / 2) as f64));
            }
        });
        for k in 0..50u64 {
            let w = world.broadcast_async(vec![k + r as u64; 300], k as usize % n);
            assert_eq!(w.wait().unwrap(), vec![k + (k % n as u64); 300]);
        }
        t.join().unwrap();
    });
}

fn point_to_point(world: &Communicator) {
    let (n, r) = (world.size(), world.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for &len in SIZES {
        // Every rank sends to the next and receives from the previous, asynchronously: the
        // sends and receives of a rank progress together (a blocking send first would wait
        // forever for large messages).
        let mine: Vec<f32> = (0..len).map(|i| val(ReduceOp::Sum, r, i, len)).collect();
        let s = world.isend(mine.clone(), next, 5);
        let got = world.irecv(vec![0f32; len], prev, 5).wait().unwrap();
        assert_eq!(s.wait().unwrap(), mine, "the send's buffer comes back");
        assert_each(&got, |i| val(ReduceOp::Sum, prev, i, len), &format!("ring of {len}"));
    }
    // Blocking forms, several tags: tag 2 is sent first but received second.
    if r == 0 {
        world.send(&[1u64, 2, 3], 1, 2).unwrap();
        world.send(&[4u64], 1, 9).unwrap();
    } else if r == 1 {
        let (mut a, mut b) = ([0u64; 1], [0u64; 3]);
        world.recv(&mut a, 0, 9).unwrap();
        world.recv(&mut b, 0, 2).unwrap();
        assert_eq!((a, b), ([4], [1, 2, 3]));
    }
    // bf16 and u8 messages.
    let x: Vec<xccl::bf16> = (0..17).map(|i| xccl::bf16::from_f32(i as f32 * 0.5 + r as f32)).collect();
    let w = world.isend(x, next, 1);
    let got = world.irecv(vec![xccl::bf16::ZERO; 17], prev, 1).wait().unwrap();
    w.wait().unwrap();
    assert_eq!(got[3], xccl::bf16::from_f32(1.5 + prev as f32));
    let w = world.isend(vec![r as u8; 3], prev, 3);
    let got = world.irecv(vec![0u8; 3], next, 3).wait().unwrap();
    w.wait().unwrap();
    assert_eq!(got, vec![next as u8; 3]);
}

fn order_and_events(world: &Communicator) {
    let (n, r) = (world.size(), world.rank());
    world.record_timeline(true);
    // Asynchronous operations, then a blocking one: all in issue order.
    let works: Vec<_> =
        (0..20).map(|k| world.all_reduce_async(vec![k + r as i32; 64], ReduceOp::Max)).collect();
    let ev = world.record_event();
    let mut last = vec![r as u32];
    world.all_reduce(&mut last, ReduceOp::Min).unwrap();
    assert_eq!(last, vec![0]);
    assert!(ev.is_completed(), "a blocking call returns after what was issued before it");
    ev.wait().unwrap();
    for (k, w) in works.into_iter().enumerate() {
        assert_eq!(w.wait().unwrap(), vec![(k + n - 1) as i32; 64]);
    }
    world.barrier_async().wait().unwrap();
    let spans = world.take_timeline();
    world.record_timeline(false);
    assert!(spans.len() >= 22, "{} spans", spans.len());
    assert!(spans[0].name.starts_with("all_reduce"), "{}", spans[0].name);
    // The engine's algorithm choice does not apply: a clear error, not a panic.
    let err = world.algorithm_for(CollKind::AllReduce, 1024, DType::F32, 0).unwrap_err();
    assert!(err.to_string().contains("chooses its own algorithms"), "{err}");
}

fn wrong_arguments_leave_the_communicator_usable(world: &Communicator) {
    let (n, r) = (world.size(), world.rank());
    let err = world.all_gather(&[1f32; 2], &mut [0f32; 5]).unwrap_err();
    assert!(err.to_string().contains("expected"), "{err}");
    let err = world.reduce(&[1f32], &mut [0f32], ReduceOp::Sum, n).unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
    let err = world.send(&[1u8], r, 0).unwrap_err();
    assert!(err.to_string().contains("itself"), "{err}");
    let err = world.isend(vec![1u8], (r + 1) % n, u32::MAX).wait().unwrap_err();
    assert!(err.to_string().contains("largest tag"), "{err}");
    let mut v = vec![1u64; 5];
    world.all_reduce(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, vec![n as u64; 5]);
}
