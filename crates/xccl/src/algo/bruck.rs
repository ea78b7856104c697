//! Bruck's algorithms: `⌈log2 n⌉` rounds for any `n`, for small messages.
//!
//! Both work on a rotated copy in scratch, where position `j` belongs to rank `rank + j`.
//! All-gather: in round `k` a rank sends the first `2^k` positions it has to `rank - 2^k`
//! and receives the next ones from `rank + 2^k`. All-to-all: in round `k` every block whose
//! position has bit `k` set moves `2^k` ranks on, packed into one message.

use super::{Algorithm, Declaration, Implementation, Shape};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Bruck,
    name: "bruck",
    implements: &[
        Implementation::any(CollKind::AllGather, |c| Some(all_gather(c.rank, c.gather()?))),
        Implementation {
            kind: CollKind::AllToAll,
            supports: |_, shape| matches!(shape, Shape::Count(_)),
            build: |c| Some(all_to_all(c.rank, c.n(), c.count()?)),
        },
    ],
};

/// All-gather; blocks may be uneven (all-gather-v).
pub fn all_gather(rank: usize, blocks: &Blocks) -> Program {
    let n = blocks.count();
    let mut p = Program::new();
    // The rotated layout: position j holds rank (rank + j) % n's block.
    let rotated = Blocks::from_counts(&(0..n).map(|j| blocks.len_of((rank + j) % n)).collect::<Vec<_>>());
    p.scratch = blocks.total();
    p.step().copy(Region::new(Buf::Input, 0, blocks.len_of(rank)), rotated.region(Buf::Scratch, 0));
    let mut d = 1;
    while d < n {
        let m = d.min(n - d);
        p.step()
            .send((rank + n - d) % n, rotated.span(Buf::Scratch, 0, m))
            .recv((rank + d) % n, rotated.span(Buf::Scratch, d, d + m));
        d *= 2;
    }
    let s = p.step();
    for j in 0..n {
        s.copy(rotated.region(Buf::Scratch, j), blocks.region(Buf::Output, (rank + j) % n));
    }
    p
}

/// All-to-all of `n` blocks of `block` elements.
pub fn all_to_all(rank: usize, n: usize, block: usize) -> Program {
    let mut p = Program::new();
    let blocks = Blocks::uniform(block, n);
    // Scratch: the rotated blocks, then a packing area and an unpacking area of up to n / 2
    // blocks each.
    let half = n.div_ceil(2);
    p.scratch = block * (n + 2 * half);
    let tmp = |j: usize| blocks.region(Buf::Scratch, j);
    let area = |base: usize, i: usize, len: usize| Region::new(Buf::Scratch, block * (base + i), block * len);
    let s = p.step();
    for j in 0..n {
        s.copy(blocks.region(Buf::Input, (rank + j) % n), tmp(j));
    }
    let mut d = 1;
    while d < n {
        let moving: Vec<usize> = (1..n).filter(|j| j & d != 0).collect();
        let m = moving.len();
        let s = p.step();
        for (i, &j) in moving.iter().enumerate() {
            s.copy(tmp(j), area(n, i, 1));
        }
        s.send((rank + d) % n, area(n, 0, m)).recv((rank + n - d) % n, area(n + half, 0, m));
        for (i, &j) in moving.iter().enumerate() {
            s.copy(area(n + half, i, 1), tmp(j));
        }
        d *= 2;
    }
    // Position j now holds what rank (rank - j) sent to this rank.
    let s = p.step();
    for j in 0..n {
        s.copy(tmp(j), blocks.region(Buf::Output, (rank + n - j) % n));
    }
    p
}
