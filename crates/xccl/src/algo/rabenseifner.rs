//! Rabenseifner's all-reduce: recursive-halving reduce-scatter then recursive-doubling
//! all-gather over the participants' blocks. Bandwidth-optimal like the ring (each rank
//! moves `2 (p - 1) / p` of the buffer) in `2 log2 p` rounds instead of `2 (p - 1)`.
//! Non-powers of two fold (see `fold`).

use super::fold::{Fold, Role};
use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Rabenseifner,
    name: "rabenseifner",
    implements: &[Implementation::any(CollKind::AllReduce, |c| Some(all_reduce(c.rank, c.n(), c.count()?)))],
};

/// All-reduce of `count` elements.
pub fn all_reduce(rank: usize, n: usize, count: usize) -> Program {
    let mut p = Program::new();
    let all = |buf| Region::new(buf, 0, count);
    let f = Fold::new(n);
    let role = f.role(rank);
    let blocks = Blocks::even(count, f.p);
    let out = |a: usize, b: usize| blocks.span(Buf::Output, a, b);
    let mut in_out = false;
    if f.folds() {
        let s = p.step();
        match role {
            Role::Extra { host } => {
                s.send(host, all(Buf::Input));
            }
            Role::Part { extra: Some(extra), .. } => {
                s.recv_reduce(extra, all(Buf::Output), all(Buf::Input));
                in_out = true;
            }
            Role::Part { extra: None, .. } => {}
        }
    }
    // Reduce-scatter: participant v ends holding block v reduced.
    let (mut lo, mut hi) = (0, f.p);
    let mut mask = f.p / 2;
    while mask > 0 {
        let s = p.step();
        if let Role::Part { v, .. } = role {
            let partner = f.rank_of(v ^ mask);
            let mid = lo + mask;
            let (keep, give) = if v & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
            let cur = |a, b| if in_out { out(a, b) } else { blocks.span(Buf::Input, a, b) };
            s.send(partner, cur(give.0, give.1)).recv_reduce(
                partner,
                out(keep.0, keep.1),
                cur(keep.0, keep.1),
            );
            in_out = true;
            (lo, hi) = keep;
        }
        mask /= 2;
    }
    // All-gather: the range of finished blocks doubles every round.
    let mut mask = 1;
    while mask < f.p {
        let s = p.step();
        if let Role::Part { v, .. } = role {
            let partner = f.rank_of(v ^ mask);
            let mine = v / mask * mask;
            let theirs = (v ^ mask) / mask * mask;
            s.send(partner, out(mine, mine + mask)).recv(partner, out(theirs, theirs + mask));
        }
        mask <<= 1;
    }
    if f.folds() {
        let s = p.step();
        match role {
            Role::Extra { host } => {
                s.recv(host, all(Buf::Output));
            }
            Role::Part { extra: Some(extra), .. } => {
                s.send(extra, all(Buf::Output));
            }
            Role::Part { extra: None, .. } => {}
        }
    }
    p
}
