//! Every schedule of every collective, proven symbolically on every world size 1..=64 and
//! every root (the same run as `xccl verify`); the uneven gather and scatter layouts, and
//! broken schedules of them.

use xccl::CollKind;
use xccl::algo::{self, Algorithm, Shape};
use xccl::schedule::{Blocks, Buf, Op, Program, Region};
use xccl::verify::{self, Case};

#[test]
fn every_algorithm_is_correct_on_every_world_size_up_to_64() {
    let mut failures = Vec::new();
    let mut cases = 0;
    verify::verify_all(64, |cell| {
        cases += cell.cases;
        failures.extend(cell.failure);
    });
    assert!(failures.is_empty(), "{} failures, first: {}", failures.len(), failures[0]);
    assert!(cases > 30_000, "only {cases} cases ran");
}

fn uneven(kind: CollKind, counts: &[usize], root: usize) -> Case {
    let blocks = Blocks::from_counts(counts);
    let shape = if kind == CollKind::Gather { Shape::Gather(blocks) } else { Shape::Scatter(blocks) };
    Case {
        kind,
        algo: Algorithm::Linear,
        hosts: vec![0; counts.len()],
        root,
        shape,
        exchange: None,
        in_place: false,
    }
}

/// The case's schedules, with rank `rank`'s changed by `break_it`.
fn broken(c: &Case, rank: usize, break_it: impl Fn(&mut Program)) -> Result<verify::Stats, String> {
    verify::verify_programs(c, |r, shape| {
        let mut p = algo::build(c.kind, c.algo, r, &c.hosts, c.root, shape).map_err(|e| e.to_string())?;
        if r == rank {
            break_it(&mut p);
        }
        Ok(p)
    })
}

#[test]
fn uneven_gather_and_scatter_are_verified_for_every_algorithm_and_root() {
    for kind in [CollKind::Gather, CollKind::Scatter] {
        assert!(!Algorithm::for_collective(kind).is_empty(), "{kind}");
        for &algo in Algorithm::for_collective(kind) {
            for n in 1..=9 {
                let cases = verify::cases(kind, algo, n);
                let blocks = cases.iter().filter(|c| !matches!(c.shape, Shape::Count(_))).count();
                // Three layouts (empty blocks among uneven ones, one non-empty block, all
                // empty) for every root, wherever the algorithm claims the layout.
                let claimed = algo.supports(kind, n, &uneven(kind, &vec![1; n], 0).shape);
                assert_eq!(blocks, if claimed { 3 * n } else { 0 }, "{kind} by {algo} on {n}");
                for c in &cases {
                    verify::verify(c).unwrap();
                }
            }
        }
    }
    // Empty blocks travel in no message: 3 messages of 6 elements to or from root 2.
    let counts = [3, 0, 5, 1, 2];
    for kind in [CollKind::Gather, CollKind::Scatter] {
        let stats = verify::verify(&uneven(kind, &counts, 2)).unwrap();
        assert_eq!((stats.messages, stats.elements), (3, 6), "{kind}");
    }
}

#[test]
fn broken_uneven_gather_and_scatter_schedules_are_caught() {
    let counts = [3, 0, 5, 1, 2];
    let gather = uneven(CollKind::Gather, &counts, 2);
    // The root forgets to copy its own block (output 3..8).
    let e = broken(&gather, 2, |p| p.steps[0].ops.retain(|op| !matches!(op, Op::Copy { .. }))).unwrap_err();
    assert!(e.contains("rank 2 output[3] holds garbage"), "{e}");
    // The root waits for the empty block of rank 1, which sends nothing.
    let e = broken(&gather, 2, |p| {
        p.steps[0].recv(1, Region::new(Buf::Output, 3, 0));
    })
    .unwrap_err();
    assert!(e.contains("deadlock") && e.contains("rank 2"), "{e}");
    // The root sends rank 4's block from one element too early.
    let scatter = uneven(CollKind::Scatter, &counts, 2);
    let e = broken(&scatter, 2, |p| {
        for op in &mut p.steps[0].ops {
            if let Op::Send { peer: 4, src } = op {
                src.off -= 1;
            }
        }
    })
    .unwrap_err();
    assert!(e.contains("rank 4 output[0]") && e.contains("expected"), "{e}");
    // Schedules of the even layout with the same total do not fit the uneven buffers.
    let even = Shape::Count(11 / 5);
    for c in [&gather, &scatter] {
        let e = verify::verify_programs(c, |r, _| {
            algo::build(c.kind, c.algo, r, &c.hosts, c.root, &even).map_err(|e| e.to_string())
        })
        .unwrap_err();
        assert!(e.contains("outside") || e.contains("expects"), "{e}");
    }
}
