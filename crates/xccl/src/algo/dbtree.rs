//! Double binary tree all-reduce: half of the buffer is reduced up one binary tree and
//! broadcast back down it, the other half on a second tree in which every inner node of the
//! first is a leaf, so each rank forwards for at most one tree. Everything is one pipelined
//! step: segments flow up and back down while later ones are still arriving. Latency grows
//! with `log2 n` (like a tree), bandwidth stays close to the ring's.
//!
//! The first tree is the in-order tree of 1-based positions by lowest set bit: its inner
//! nodes are the odd ranks and its leaves the even ones. The second is the same tree over
//! relabelled ranks: mirrored (`n - 1 - r`) when `n` is even, shifted by one when it is odd,
//! either way turning odd labels into even ranks.

use super::{Algorithm, Declaration, Implementation};
use crate::coll::CollKind;
use crate::schedule::{Blocks, Buf, Program};

/// A tree over ranks `0..n`: the parent (none for the root) and the children of each rank.
pub(super) struct Tree {
    pub parent: Vec<Option<usize>>,
    pub children: Vec<Vec<usize>>,
}

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::DoubleBinaryTree,
    name: "dbtree",
    implements: &[Implementation::any(CollKind::AllReduce, |c| Some(all_reduce(c.rank, c.n(), c.count()?)))],
};

/// Parent and children of every position `0..n` in the lowest-set-bit in-order tree.
fn lowbit_tree(n: usize) -> Tree {
    let mut parent = vec![None; n];
    let mut children = vec![Vec::new(); n];
    // Positions are 1-based inside; the root of a range is its position with the highest
    // lowest set bit.
    fn build(
        lo: usize,
        hi: usize,
        up: Option<usize>,
        parent: &mut [Option<usize>],
        children: &mut [Vec<usize>],
    ) {
        if lo > hi {
            return;
        }
        let root = (lo..=hi).max_by_key(|p| p & p.wrapping_neg()).expect("non-empty range");
        parent[root - 1] = up.map(|u| u - 1);
        if let Some(u) = up {
            children[u - 1].push(root - 1);
        }
        build(lo, root - 1, Some(root), parent, children);
        build(root + 1, hi, Some(root), parent, children);
    }
    build(1, n, None, &mut parent, &mut children);
    Tree { parent, children }
}

/// The two trees.
pub(super) fn trees(n: usize) -> [Tree; 2] {
    let a = lowbit_tree(n);
    // Rank r sits at label `label(r)` of the second tree.
    let label = |r: usize| if n.is_multiple_of(2) { n - 1 - r } else { (r + n - 1) % n };
    let rank_of = |l: usize| if n.is_multiple_of(2) { n - 1 - l } else { (l + 1) % n };
    let b = Tree {
        parent: (0..n).map(|r| a.parent[label(r)].map(rank_of)).collect(),
        children: (0..n).map(|r| a.children[label(r)].iter().map(|&c| rank_of(c)).collect()).collect(),
    };
    [a, b]
}

/// All-reduce of `count` elements.
pub fn all_reduce(rank: usize, n: usize, count: usize) -> Program {
    let mut p = Program::new();
    let halves = Blocks::even(count, 2);
    let s = p.step();
    for (h, Tree { parent, children }) in trees(n).iter().enumerate() {
        let (input, output) = (halves.region(Buf::Input, h), halves.region(Buf::Output, h));
        let kids = &children[rank];
        for (i, &c) in kids.iter().enumerate() {
            s.recv_reduce(c, output, if i == 0 { input } else { output });
        }
        if let Some(up) = parent[rank] {
            s.send(up, if kids.is_empty() { input } else { output });
            s.recv(up, output);
        }
        for &c in kids {
            s.send(c, output);
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_spanning_trees_with_disjoint_inner_nodes() {
        for n in 1..80 {
            let ts = trees(n);
            for Tree { parent, children } in &ts {
                assert_eq!(parent.iter().filter(|p| p.is_none()).count(), 1, "n={n}: one root");
                for (r, kids) in children.iter().enumerate() {
                    assert!(kids.len() <= 2);
                    for &c in kids {
                        assert_eq!(parent[c], Some(r));
                    }
                    // Walking up reaches the root.
                    let (mut at, mut hops) = (r, 0);
                    while let Some(p) = parent[at] {
                        at = p;
                        hops += 1;
                        assert!(hops <= n);
                    }
                }
            }
            for r in 0..n {
                let inner = ts.iter().filter(|t| !t.children[r].is_empty()).count();
                assert!(inner <= 1, "n={n}: rank {r} is an inner node of both trees");
            }
        }
    }
}
