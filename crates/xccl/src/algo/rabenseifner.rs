//! Rabenseifner's all-reduce: recursive-halving reduce-scatter (partners at distance 1, 2,
//! 4, …) then the mirror all-gather over the participants' blocks. Bandwidth-optimal like
//! the ring (each rank moves `2 (p - 1) / p` of the buffer) in `2 log2 p` rounds instead of
//! `2 (p - 1)`.
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
    // Reduce-scatter by recursive halving with the distance doubling (MPICH's order): the
    // first round, which moves half the buffer, pairs neighbouring participants, and the
    // rounds that cross farther move less. Ranks are numbered host by host, so on several
    // hosts the largest exchanges stay inside a host (2 hosts x 2 ranks: half the bytes on
    // the hosts' links that halving from the farthest partner sends). Each round keeps one
    // half of the range of blocks still held, by the round's bit of `v`; participant `v`
    // ends with one block, reduced.
    let (mut lo, mut hi) = (0, f.p);
    let mut rounds = Vec::new();
    let mut mask = 1;
    while mask < f.p {
        let s = p.step();
        if let Role::Part { v, .. } = role {
            let partner = f.rank_of(v ^ mask);
            let mid = lo + (hi - lo) / 2;
            let (keep, give) = if v & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
            let cur = |a, b| if in_out { out(a, b) } else { blocks.span(Buf::Input, a, b) };
            s.send(partner, cur(give.0, give.1)).recv_reduce(
                partner,
                out(keep.0, keep.1),
                cur(keep.0, keep.1),
            );
            in_out = true;
            rounds.push((partner, keep, give));
            (lo, hi) = keep;
        }
        mask <<= 1;
    }
    // All-gather: the rounds in reverse. Each sends the half the rank kept in that round,
    // complete once the later rounds are mirrored, and receives the half it gave away there,
    // which the partner kept and completed alike.
    for _ in 0..f.p.max(1).trailing_zeros() {
        let s = p.step();
        if let Some((partner, keep, give)) = rounds.pop() {
            s.send(partner, out(keep.0, keep.1)).recv(partner, out(give.0, give.1));
        }
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
