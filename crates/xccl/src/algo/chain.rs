//! Pipelined chain broadcast: `root → root + 1 → … → root - 1`, every rank forwarding each
//! segment as soon as it has arrived. Each link carries the message once, so for large
//! messages the time approaches one message time plus `n - 1` segment times.

use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Chain,
    name: "chain",
    implements: &[Implementation::any(CollKind::Broadcast, |c| {
        Some(broadcast(c.rank, c.n(), c.count()?, c.root))
    })],
};

/// Broadcast of `count` elements from `root`.
pub fn broadcast(rank: usize, n: usize, count: usize, root: usize) -> Program {
    let mut p = Program::new();
    let v = (rank + n - root) % n;
    let all = Region::new(Buf::Output, 0, count);
    let s = p.step();
    if v > 0 {
        s.recv((rank + n - 1) % n, all);
    }
    if v < n - 1 {
        s.send((rank + 1) % n, all);
    }
    p
}
