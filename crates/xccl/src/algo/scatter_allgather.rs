//! Broadcast as scatter + ring all-gather (van de Geijn): the root sends block `i` to rank
//! `i`, then the blocks travel around the ring. Every rank sends and receives about twice
//! the message, whatever `n`: the large-message broadcast.

use super::ring;
use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::ScatterAllGather,
    name: "scatter_allgather",
    implements: &[Implementation::any(CollKind::Broadcast, |c| {
        Some(broadcast(c.rank, c.n(), c.count()?, c.root))
    })],
};

/// Broadcast of `count` elements from `root`.
pub fn broadcast(rank: usize, n: usize, count: usize, root: usize) -> Program {
    let mut p = Program::new();
    let blocks = Blocks::even(count, n);
    let s = p.step();
    if rank == root {
        for q in (1..n).map(|i| (root + i) % n) {
            s.send(q, blocks.region(Buf::Output, q));
        }
    } else {
        s.recv(root, blocks.region(Buf::Output, rank));
    }
    let members: Vec<usize> = (0..n).collect();
    ring::all_gather_steps(&mut p, rank, &members, &blocks, blocks.region(Buf::Output, rank));
    p
}
