//! Linear scatter, gather and broadcast: the root exchanges directly with every other rank,
//! in one step. On shared memory with single-copy transfers every receiver copies from the
//! root's buffer at once, so a broadcast costs one copy per rank, all in parallel, with no
//! rank waiting for another to pass the data on.

use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Linear,
    name: "linear",
    implements: &[
        Implementation::any(CollKind::Broadcast, |c| Some(broadcast(c.rank, c.n(), c.count()?, c.root))),
        Implementation::any(CollKind::Scatter, |c| Some(scatter(c.rank, c.n(), c.count()?, c.root))),
        Implementation::any(CollKind::Gather, |c| Some(gather(c.rank, c.n(), c.count()?, c.root))),
    ],
};

/// Ranks other than the root, starting after it, so that roots spread their first sends.
fn others(n: usize, root: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |i| (root + i) % n)
}

/// Scatter: block `i` of the root's `n * block`-element input goes to rank `i`'s output.
pub fn scatter(rank: usize, n: usize, block: usize, root: usize) -> Program {
    let mut p = Program::new();
    if block == 0 {
        return p;
    }
    let blocks = Blocks::uniform(block, n);
    let out = Region::new(Buf::Output, 0, block);
    let step = p.step();
    if rank == root {
        for q in others(n, root) {
            step.send(q, blocks.region(Buf::Input, q));
        }
        // After the sends, so that the receivers start while the root copies its block.
        step.copy(blocks.region(Buf::Input, root), out);
    } else {
        step.recv(root, out);
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

/// Gather: rank `i`'s `block`-element input lands in block `i` of the root's output.
pub fn gather(rank: usize, n: usize, block: usize, root: usize) -> Program {
    let mut p = Program::new();
    if block == 0 {
        return p;
    }
    let blocks = Blocks::uniform(block, n);
    let input = Region::new(Buf::Input, 0, block);
    let step = p.step();
    if rank == root {
        for q in others(n, root) {
            step.recv(q, blocks.region(Buf::Output, q));
        }
        step.copy(input, blocks.region(Buf::Output, root));
    } else {
        step.send(root, input);
    }
    p
}
