//! Dissemination barrier: in round `k` every rank signals `rank + 2^k` and waits for
//! `rank - 2^k`; after `⌈log2 n⌉` rounds every rank has transitively heard from all others.

use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Dissemination,
    name: "dissemination",
    implements: &[Implementation::any(CollKind::Barrier, |c| {
        (c.count()? == 0).then(|| barrier(c.rank, c.n()))
    })],
};

/// Barrier among `n` ranks with empty messages.
pub fn barrier(rank: usize, n: usize) -> Program {
    let mut p = Program::new();
    let empty = Region::new(Buf::Output, 0, 0);
    let mut dist = 1;
    while dist < n {
        p.step().send((rank + dist) % n, empty).recv((rank + n - dist) % n, empty);
        dist *= 2;
    }
    p
}
