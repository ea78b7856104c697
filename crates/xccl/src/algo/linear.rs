//! Linear scatter, gather and broadcast: the root exchanges directly with every other rank,
//! in one step. On shared memory with single-copy transfers every receiver copies from the
//! root's buffer at once, so a broadcast costs one copy per rank, all in parallel, with no
//! rank waiting for another to pass the data on.
//!
//! Scatter and gather are schedules over blocks, one per rank: an even call is the uniform
//! layout (`build` makes it so), and uneven blocks give scatter-v and gather-v. Every rank
//! knows every block's length, so empty blocks are neither sent nor received.

use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Linear,
    name: "linear",
    implements: &[
        Implementation::any(CollKind::Broadcast, |c| Some(broadcast(c.rank, c.n(), c.count()?, c.root))),
        Implementation::any(CollKind::Scatter, |c| Some(scatter(c.rank, c.scatter()?, c.root))),
        Implementation::any(CollKind::Gather, |c| Some(gather(c.rank, c.gather()?, c.root))),
    ],
};

/// Ranks other than the root, starting after it, so that roots spread their first sends.
fn others(n: usize, root: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |i| (root + i) % n)
}

/// Scatter: block `i` of the root's input, laid out by `blocks`, goes to rank `i`'s output.
pub fn scatter(rank: usize, blocks: &Blocks, root: usize) -> Program {
    let mut p = Program::new();
    if blocks.total() == 0 {
        return p;
    }
    let out = Region::new(Buf::Output, 0, blocks.len_of(rank));
    if rank == root {
        let step = p.step();
        for q in others(blocks.count(), root).filter(|&q| blocks.len_of(q) > 0) {
            step.send(q, blocks.region(Buf::Input, q));
        }
        // After the sends, so that the receivers start while the root copies its block.
        if out.len > 0 {
            step.copy(blocks.region(Buf::Input, root), out);
        }
    } else if out.len > 0 {
        p.step().recv(root, out);
    }
    p
}

/// Broadcast of `count` elements from `root` (in place: the buffer is the output).
pub fn broadcast(rank: usize, n: usize, count: usize, root: usize) -> Program {
    let mut p = Program::new();
    let all = Region::new(Buf::Output, 0, count);
    let step = p.step();
    if rank == root {
        for q in others(n, root) {
            step.send(q, all);
        }
    } else {
        step.recv(root, all);
    }
    p
}

/// Gather: rank `i`'s input lands in block `i` of the root's output, laid out by `blocks`.
pub fn gather(rank: usize, blocks: &Blocks, root: usize) -> Program {
    let mut p = Program::new();
    if blocks.total() == 0 {
        return p;
    }
    let input = Region::new(Buf::Input, 0, blocks.len_of(rank));
    if rank == root {
        let step = p.step();
        for q in others(blocks.count(), root).filter(|&q| blocks.len_of(q) > 0) {
            step.recv(q, blocks.region(Buf::Output, q));
        }
        if input.len > 0 {
            step.copy(input, blocks.region(Buf::Output, root));
        }
    } else if input.len > 0 {
        p.step().send(root, input);
    }
    p
}
