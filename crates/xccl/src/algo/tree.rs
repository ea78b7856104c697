//! Binomial-tree broadcast and reduce, each a single pipelined step.
//!
//! Members are numbered from the root (`v` = position in the member list). The parent of `v`
//! is `v` without its lowest set bit; its children are `v + 2^k` for every `2^k` below that
//! bit. Because a rank's receive and its sends share one step and one region, segments flow
//! down (or up) the tree as soon as they arrive instead of waiting for whole messages.

use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Buf, Program, Region, Step};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Binomial,
    name: "binomial",
    implements: &[
        Implementation::any(CollKind::Broadcast, |c| Some(broadcast(c.rank, c.n(), c.count()?, c.root))),
        Implementation::any(CollKind::Reduce, |c| Some(reduce(c.rank, c.n(), c.count()?, c.root))),
    ],
};

/// The parent of position `v` (none for the root) and its children, nearest first.
fn family(v: usize, n: usize) -> (Option<usize>, Vec<usize>) {
    let low = if v == 0 { n.next_power_of_two() } else { 1 << v.trailing_zeros() };
    let parent = (v != 0).then(|| v - low);
    let children = (0..low.trailing_zeros()).map(|k| v + (1 << k)).filter(|&c| c < n).collect();
    (parent, children)
}

/// The ranks in tree order: the root first.
fn from_root(n: usize, root: usize) -> Vec<usize> {
    (0..n).map(|i| (root + i) % n).collect()
}

fn position(rank: usize, members: &[usize]) -> usize {
    members.iter().position(|&m| m == rank).expect("rank is a member of its tree")
}

/// Adds this rank's part of a broadcast of the output from `members[0]` to `step`.
pub(super) fn broadcast_among(step: &mut Step, rank: usize, members: &[usize], count: usize) {
    let (parent, mut children) = family(position(rank, members), members.len());
    // The farthest child heads the largest subtree: serve it first.
    children.reverse();
    let all = Region::new(Buf::Output, 0, count);
    if let Some(parent) = parent {
        step.recv(members[parent], all);
    }
    for c in children {
        step.send(members[c], all);
    }
}

/// Adds this rank's part of a reduce to `members[0]` to `step`: the root accumulates in its
/// output, other inner nodes in `inner`.
pub(super) fn reduce_among(step: &mut Step, rank: usize, members: &[usize], count: usize, inner: Buf) {
    let (parent, children) = family(position(rank, members), members.len());
    let input = Region::new(Buf::Input, 0, count);
    let acc = match (parent, children.is_empty()) {
        (None, _) => Region::new(Buf::Output, 0, count),
        (Some(_), true) => input,
        (Some(_), false) => Region::new(inner, 0, count),
    };
    // Nearest children have the smallest subtrees and finish first.
    for (i, c) in children.into_iter().enumerate() {
        step.recv_reduce(members[c], acc, if i == 0 { input } else { acc });
    }
    if let Some(parent) = parent {
        step.send(members[parent], acc);
    }
}

/// Broadcast of `count` elements in place (the output) from `root`.
pub fn broadcast(rank: usize, n: usize, count: usize, root: usize) -> Program {
    let mut p = Program::new();
    broadcast_among(p.step(), rank, &from_root(n, root), count);
    p
}

/// Reduce of `count` elements to `root`: the result lands in the root's output; other ranks
/// accumulate in scratch and leave their buffers untouched.
pub fn reduce(rank: usize, n: usize, count: usize, root: usize) -> Program {
    let mut p = Program::new();
    p.scratch = count;
    reduce_among(p.step(), rank, &from_root(n, root), count, Buf::Scratch);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_forms_a_spanning_tree() {
        for n in 1..40 {
            let mut seen = vec![0; n];
            for v in 0..n {
                let (parent, children) = family(v, n);
                for c in &children {
                    assert_eq!(family(*c, n).0, Some(v), "n={n} v={v} c={c}");
                    seen[*c] += 1;
                }
                assert_eq!(parent.is_none(), v == 0);
            }
            assert_eq!(seen[0], 0);
            assert!(seen[1..].iter().all(|&s| s == 1), "n={n}: every non-root has one parent");
        }
    }
}
