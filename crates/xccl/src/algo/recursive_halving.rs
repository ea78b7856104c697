//! Recursive halving reduce-scatter: in round `k` a rank keeps half of the blocks it is
//! still responsible for, sends the other half to its partner and folds the partner's copy
//! of its half into its own. `log2 n` rounds moving `(n - 1) / n` of the buffer in all.
//! Non-powers of two fold (see `fold`): a host is responsible for its extra's block too.
//!
//! Blocks may be uneven (reduce-scatter-v): halving splits the *participants*, not the
//! elements, and the blocks of a range of participants are consecutive in the buffer, so
//! every message is still one contiguous span of whole blocks, however long each block is.

use super::fold::{Fold, Role};
use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::RecursiveHalving,
    name: "recursive_halving",
    implements: &[Implementation::any(CollKind::ReduceScatter, |c| {
        Some(reduce_scatter(c.rank, c.scatter()?))
    })],
};

/// The blocks participant `v` ends with: two for a host (its extra's and its own), else one.
fn first_block(f: &Fold, v: usize) -> usize {
    if v <= f.rem { 2 * v } else { v + f.rem }
}

/// Reduce-scatter of an input laid out by `blocks`: rank `r` gets block `r` reduced.
pub fn reduce_scatter(rank: usize, blocks: &Blocks) -> Program {
    let mut p = Program::new();
    let n = blocks.count();
    let out = Region::new(Buf::Output, 0, blocks.len_of(rank));
    let f = Fold::new(n);
    let role = f.role(rank);
    // Partial sums live in scratch laid out like the input; until the first combination the
    // input itself is the running value.
    p.scratch = blocks.total();
    let acc = |a: usize, b: usize| blocks.span(Buf::Scratch, a, b);
    let input = |a: usize, b: usize| blocks.span(Buf::Input, a, b);
    let mut in_acc = false;
    if f.folds() {
        let s = p.step();
        match role {
            Role::Extra { host } => {
                s.send(host, input(0, n));
            }
            Role::Part { extra: Some(extra), .. } => {
                s.recv_reduce(extra, acc(0, n), input(0, n));
                in_acc = true;
            }
            Role::Part { extra: None, .. } => {}
        }
    }
    // Participants `lo..hi` share the blocks this rank still works on.
    let (mut lo, mut hi) = (0, f.p);
    let mut mask = f.p / 2;
    while mask > 0 {
        let s = p.step();
        if let Role::Part { v, .. } = role {
            let partner = f.rank_of(v ^ mask);
            let mid = lo + mask;
            let (keep, give) = if v & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
            let (kb, ke) = (first_block(&f, keep.0), first_block(&f, keep.1));
            let (gb, ge) = (first_block(&f, give.0), first_block(&f, give.1));
            let cur = |a, b| if in_acc { acc(a, b) } else { input(a, b) };
            let last = mask == 1 && ke - kb == 1;
            let dst = if last { out } else { acc(kb, ke) };
            s.send(partner, cur(gb, ge)).recv_reduce(partner, dst, cur(kb, ke));
            in_acc = true;
            (lo, hi) = keep;
        }
        mask /= 2;
    }
    if f.folds() {
        let s = p.step();
        match role {
            Role::Extra { host } => {
                s.recv(host, out);
            }
            Role::Part { extra: Some(extra), .. } => {
                s.send(extra, blocks.region(Buf::Scratch, extra))
                    .copy(blocks.region(Buf::Scratch, rank), out);
            }
            Role::Part { extra: None, .. } => {}
        }
    }
    p
}
