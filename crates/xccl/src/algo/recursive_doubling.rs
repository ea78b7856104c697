//! Recursive doubling: in round `k` every rank exchanges everything it has with the rank
//! whose number differs in bit `k`. `log2 n` rounds, each moving the whole buffer: the
//! latency-optimal choice for small messages. Non-powers of two fold (see `fold`).

use super::fold::{Fold, Role};
use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::RecursiveDoubling,
    name: "recursive_doubling",
    implements: &[
        Implementation::any(CollKind::AllReduce, |c| Some(all_reduce(c.rank, c.n(), c.count()?))),
        Implementation {
            kind: CollKind::AllGather,
            supports: |n, _| n.is_power_of_two(),
            build: |c| Some(all_gather(c.rank, c.gather()?)),
        },
    ],
};

/// All-reduce of `count` elements. Partners combine the same two values, so every rank ends
/// with the same bits.
pub fn all_reduce(rank: usize, n: usize, count: usize) -> Program {
    let mut p = Program::new();
    let all = |buf| Region::new(buf, 0, count);
    let f = Fold::new(n);
    let role = f.role(rank);
    // Where this rank's running value is: its input until the first combination.
    let mut cur = all(Buf::Input);
    if f.folds() {
        let s = p.step();
        match role {
            Role::Extra { host } => {
                s.send(host, all(Buf::Input));
            }
            Role::Part { extra: Some(extra), .. } => {
                s.recv_reduce(extra, all(Buf::Output), cur);
                cur = all(Buf::Output);
            }
            Role::Part { extra: None, .. } => {}
        }
    }
    let mut mask = 1;
    while mask < f.p {
        let s = p.step();
        if let Role::Part { v, .. } = role {
            let partner = f.rank_of(v ^ mask);
            s.send(partner, cur).recv_reduce(partner, all(Buf::Output), cur);
            cur = all(Buf::Output);
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

/// All-gather over a power-of-two number of ranks: in round `k` a rank swaps the `2^k`
/// blocks it holds for its partner's.
pub fn all_gather(rank: usize, blocks: &Blocks) -> Program {
    let n = blocks.count();
    debug_assert!(n.is_power_of_two());
    let mut p = Program::new();
    let own = Region::new(Buf::Input, 0, blocks.len_of(rank));
    p.step().copy(own, blocks.region(Buf::Output, rank));
    let mut mask = 1;
    while mask < n {
        let partner = rank ^ mask;
        let mine = rank / mask * mask;
        let theirs = partner / mask * mask;
        let src = if mask == 1 { own } else { blocks.span(Buf::Output, mine, mine + mask) };
        p.step().send(partner, src).recv(partner, blocks.span(Buf::Output, theirs, theirs + mask));
        mask <<= 1;
    }
    p
}
