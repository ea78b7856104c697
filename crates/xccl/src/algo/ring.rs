//! Ring schedules: every rank sends to `rank + 1` and receives from `rank - 1`.
//!
//! Reduce-scatter takes `n - 1` steps; in step `s` rank `r` passes on the partial sum of
//! block `r - s - 1` and folds its own contribution into block `r - s - 2`, so after the
//! last step it holds block `r` reduced over all ranks. All-gather takes `n - 1` steps that
//! pass every completed block once around the ring. All-reduce is the two back to back: each
//! rank sends and receives `2 (n - 1) / n` of the buffer, the bandwidth optimum.

use crate::schedule::{Blocks, Buf, Program, Region};

fn neighbours(rank: usize, n: usize) -> (usize, usize) {
    ((rank + 1) % n, (rank + n - 1) % n)
}

/// Block `rank - back` modulo `n`.
fn behind(rank: usize, back: usize, n: usize) -> usize {
    (rank + n * 2 - back % n) % n
}

/// Appends the `n - 1` reduce-scatter steps. Partial results of block `b` after step `s`
/// live in `acc(s, b)`; the last step writes block `rank` to `last`.
fn reduce_scatter_steps(
    p: &mut Program,
    rank: usize,
    blocks: &Blocks,
    acc: impl Fn(usize, usize) -> Region,
    last: Region,
) {
    let n = blocks.count();
    let (next, prev) = neighbours(rank, n);
    for s in 0..n - 1 {
        let out_b = behind(rank, s + 1, n);
        let src = if s == 0 { blocks.region(Buf::Input, out_b) } else { acc(s - 1, out_b) };
        let in_b = behind(rank, s + 2, n);
        let dst = if s == n - 2 { last } else { acc(s, in_b) };
        p.step().send(next, src).recv_reduce(prev, dst, blocks.region(Buf::Input, in_b));
    }
}

/// Appends the `n - 1` all-gather steps; block `rank` is read from `own` in the first step
/// and every block is written to the output.
fn all_gather_steps(p: &mut Program, rank: usize, blocks: &Blocks, own: Region) {
    let n = blocks.count();
    let (next, prev) = neighbours(rank, n);
    for t in 0..n - 1 {
        let out_b = behind(rank, t, n);
        let src = if t == 0 { own } else { blocks.region(Buf::Output, out_b) };
        p.step().send(next, src).recv(prev, blocks.region(Buf::Output, behind(rank, t + 1, n)));
    }
}

/// Ring all-reduce of `count` elements: input and output both `count` long.
pub fn all_reduce(rank: usize, n: usize, count: usize) -> Program {
    let mut p = Program::new();
    if count == 0 {
        return p;
    }
    let all = |buf| Region::new(buf, 0, count);
    if n == 1 {
        p.step().copy(all(Buf::Input), all(Buf::Output));
        return p;
    }
    let blocks = Blocks::even(count, n);
    let acc = |_, b| blocks.region(Buf::Output, b);
    reduce_scatter_steps(&mut p, rank, &blocks, acc, blocks.region(Buf::Output, rank));
    all_gather_steps(&mut p, rank, &blocks, blocks.region(Buf::Output, rank));
    p
}

/// Ring reduce-scatter: input `n * block` elements, output the `block` elements of this rank.
pub fn reduce_scatter(rank: usize, n: usize, block: usize) -> Program {
    let mut p = Program::new();
    if block == 0 {
        return p;
    }
    let blocks = Blocks::uniform(block, n);
    let out = Region::new(Buf::Output, 0, block);
    if n == 1 {
        p.step().copy(blocks.region(Buf::Input, 0), out);
        return p;
    }
    // Partial sums alternate between two scratch blocks: step `s` receives into one while
    // it sends the other, received in step `s - 1`.
    p.scratch = 2 * block;
    let acc = |s: usize, _| Region::new(Buf::Scratch, (s % 2) * block, block);
    reduce_scatter_steps(&mut p, rank, &blocks, acc, out);
    p
}

/// Ring all-gather: this rank's input is block `rank` of the output laid out by `blocks`
/// (uneven blocks give all-gather-v).
pub fn all_gather(rank: usize, blocks: &Blocks) -> Program {
    let mut p = Program::new();
    if blocks.total() == 0 {
        return p;
    }
    let own = Region::new(Buf::Input, 0, blocks.len_of(rank));
    p.step().copy(own, blocks.region(Buf::Output, rank));
    if blocks.count() > 1 {
        all_gather_steps(&mut p, rank, blocks, own);
    }
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
        let p = reduce_scatter(1, 4, 10);
        let last = p.steps.last().unwrap();
        assert!(matches!(
            last.ops[1],
            Op::Recv { dst: Region { buf: Buf::Output, off: 0, len: 10 }, with: Some(w), .. } if w.off == 10
        ));
    }
}
