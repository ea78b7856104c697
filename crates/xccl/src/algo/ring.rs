//! Ring schedules: every rank sends to the next member and receives from the previous one.
//!
//! Reduce-scatter takes `n - 1` steps; in step `s` member `i` passes on the partial sum of
//! block `i - s - 1` and folds its own contribution into block `i - s - 2`, so after the
//! last step it holds block `i` reduced over all members. All-gather takes `n - 1` steps
//! that pass every completed block once around the ring. All-reduce is the two back to back:
//! each rank sends and receives `2 (n - 1) / n` of the buffer, the bandwidth optimum.
//!
//! The step helpers work on any list of members (ranks in ring order); block `i` belongs to
//! member `i`.

use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Ring,
    name: "ring",
    implements: &[
        Implementation::any(CollKind::AllReduce, |c| Some(all_reduce(c.rank, c.n(), c.count()?))),
        Implementation::any(CollKind::AllGather, |c| Some(all_gather(c.rank, c.gather()?))),
        Implementation::any(CollKind::ReduceScatter, |c| Some(reduce_scatter(c.rank, c.scatter()?))),
    ],
};

/// Member `me`'s position in `members`, and the ranks after and before it.
fn place(me: usize, members: &[usize]) -> (usize, usize, usize) {
    let n = members.len();
    let i = members.iter().position(|&m| m == me).expect("rank is a member of its ring");
    (i, members[(i + 1) % n], members[(i + n - 1) % n])
}

/// Block `i - back` modulo `n`.
fn behind(i: usize, back: usize, n: usize) -> usize {
    (i + n * 2 - back % n) % n
}

/// Appends the `n - 1` reduce-scatter steps. The first step reads and combines with blocks of
/// `first`; partial results of block `b` after step `s` live in `acc(s, b)`; the last step
/// writes this member's block to `last`.
pub(super) fn reduce_scatter_steps(
    p: &mut Program,
    me: usize,
    members: &[usize],
    blocks: &Blocks,
    first: Buf,
    acc: impl Fn(usize, usize) -> Region,
    last: Region,
) {
    let n = members.len();
    let (i, next, prev) = place(me, members);
    for s in 0..n - 1 {
        let out_b = behind(i, s + 1, n);
        let src = if s == 0 { blocks.region(first, out_b) } else { acc(s - 1, out_b) };
        let in_b = behind(i, s + 2, n);
        let dst = if s == n - 2 { last } else { acc(s, in_b) };
        p.step().send(next, src).recv_reduce(prev, dst, blocks.region(first, in_b));
    }
}

/// Appends the `n - 1` all-gather steps; this member's block is read from `own` in the first
/// step and every block is written to the output.
pub(super) fn all_gather_steps(p: &mut Program, me: usize, members: &[usize], blocks: &Blocks, own: Region) {
    let n = members.len();
    let (i, next, prev) = place(me, members);
    for t in 0..n - 1 {
        let out_b = behind(i, t, n);
        let src = if t == 0 { own } else { blocks.region(Buf::Output, out_b) };
        p.step().send(next, src).recv(prev, blocks.region(Buf::Output, behind(i, t + 1, n)));
    }
}

/// Ring all-reduce of `count` elements among `members` (in ring order), starting from the
/// values in `first` (the input, or the output when an earlier phase left them there).
pub(super) fn all_reduce_among(p: &mut Program, me: usize, members: &[usize], count: usize, first: Buf) {
    let all = |buf| Region::new(buf, 0, count);
    if members.len() == 1 {
        if first != Buf::Output {
            p.step().copy(all(first), all(Buf::Output));
        }
        return;
    }
    let blocks = Blocks::even(count, members.len());
    let i = place(me, members).0;
    let acc = |_, b| blocks.region(Buf::Output, b);
    reduce_scatter_steps(p, me, members, &blocks, first, acc, blocks.region(Buf::Output, i));
    all_gather_steps(p, me, members, &blocks, blocks.region(Buf::Output, i));
}

/// Ring all-reduce of `count` elements: input and output both `count` long.
pub fn all_reduce(rank: usize, n: usize, count: usize) -> Program {
    let mut p = Program::new();
    let members: Vec<usize> = (0..n).collect();
    all_reduce_among(&mut p, rank, &members, count, Buf::Input);
    p
}

/// Ring reduce-scatter: the input is laid out by `blocks`, and block `rank`, reduced over
/// all ranks, lands in the output (uneven blocks give reduce-scatter-v).
pub fn reduce_scatter(rank: usize, blocks: &Blocks) -> Program {
    let mut p = Program::new();
    let out = Region::new(Buf::Output, 0, blocks.len_of(rank));
    // Partial sums alternate between two scratch areas: step `s` receives into one while it
    // sends the other, received in step `s - 1`. Each area holds the largest block, since
    // the blocks passing through a rank differ in length.
    let area = blocks.max_len();
    p.scratch = 2 * area;
    let acc = |s: usize, b: usize| Region::new(Buf::Scratch, (s % 2) * area, blocks.len_of(b));
    let members: Vec<usize> = (0..blocks.count()).collect();
    reduce_scatter_steps(&mut p, rank, &members, blocks, Buf::Input, acc, out);
    p
}

/// Ring all-gather: this rank's input is block `rank` of the output laid out by `blocks`
/// (uneven blocks give all-gather-v).
pub fn all_gather(rank: usize, blocks: &Blocks) -> Program {
    let mut p = Program::new();
    let own = Region::new(Buf::Input, 0, blocks.len_of(rank));
    let members: Vec<usize> = (0..blocks.count()).collect();
    all_gather_steps(&mut p, rank, &members, blocks, own);
    // The own block is copied in the first step, after its messages are out.
    p.steps[0].copy(own, blocks.region(Buf::Output, rank));
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Op;

    #[test]
    fn all_reduce_uses_2n_minus_2_steps_and_neighbours_only() {
        let p = all_reduce(2, 5, 101);
        assert_eq!(p.steps.len(), 8);
        for step in &p.steps {
            for op in &step.ops {
                match op {
                    Op::Send { peer, .. } => assert_eq!(*peer, 3),
                    Op::Recv { peer, .. } => assert_eq!(*peer, 1),
                    Op::Copy { .. } => panic!("no local copies in a multi-rank ring"),
                }
            }
        }
    }

    #[test]
    fn reduce_scatter_ends_with_own_block_in_output() {
        let p = reduce_scatter(1, &Blocks::uniform(10, 4));
        let last = p.steps.last().unwrap();
        assert!(matches!(
            last.ops[1],
            Op::Recv { dst: Region { buf: Buf::Output, off: 0, len: 10 }, with: Some(w), .. } if w.off == 10
        ));
    }

    #[test]
    fn uneven_reduce_scatter_sizes_scratch_for_the_largest_block() {
        let blocks = Blocks::from_counts(&[3, 0, 9, 1]);
        let p = reduce_scatter(2, &blocks);
        assert_eq!(p.scratch, 18);
        let last = p.steps.last().unwrap();
        assert!(matches!(
            last.ops[1],
            Op::Recv { dst: Region { buf: Buf::Output, off: 0, len: 9 }, with: Some(w), .. } if w.off == 3
        ));
        p.check(2, 4, blocks.total(), 9).unwrap();
    }
}
