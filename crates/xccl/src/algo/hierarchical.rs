//! Hierarchical all-reduce: reduce inside each host to its leader (its lowest rank), ring
//! all-reduce among the leaders, broadcast inside each host. Only one rank per host talks
//! across hosts, so the slow links carry the data once per host instead of once per rank.
//! Every rank has the same number of steps (ranks idle in a phase have empty steps), which
//! keeps the steps of communicating ranks aligned.

use super::{Algorithm, Declaration, Implementation};
use super::{ring, tree};
use crate::coll::CollKind;
use crate::schedule::{Buf, Program, Region};

/// What this file implements.
pub(super) const DECLARATION: Declaration = Declaration {
    algo: Algorithm::Hierarchical,
    name: "hierarchical",
    implements: &[Implementation::any(CollKind::AllReduce, |c| {
        Some(all_reduce(c.rank, c.hosts, c.count()?))
    })],
};

/// All-reduce of `count` elements; `hosts[r]` names the host of rank `r`.
pub fn all_reduce(rank: usize, hosts: &[usize], count: usize) -> Program {
    let mut p = Program::new();
    let n = hosts.len();
    let all = |buf| Region::new(buf, 0, count);
    let local: Vec<usize> = (0..n).filter(|&q| hosts[q] == hosts[rank]).collect();
    // The lowest rank of each host, in rank order (linear: thousands of hosts).
    let mut seen = std::collections::HashSet::new();
    let leaders: Vec<usize> = (0..n).filter(|&q| seen.insert(hosts[q])).collect();
    let leader = local[0];
    // Phase 1: binomial reduce to the leader, accumulating in the output (which the final
    // broadcast overwrites anyway).
    if local.len() == 1 {
        p.step().copy(all(Buf::Input), all(Buf::Output));
    } else {
        tree::reduce_among(p.step(), rank, &local, count, Buf::Output);
    }
    // Phase 2: leaders only.
    if rank == leader {
        ring::all_reduce_among(&mut p, rank, &leaders, count, Buf::Output);
    } else {
        for _ in 0..2 * (leaders.len() - 1) {
            p.step();
        }
    }
    // Phase 3.
    if local.len() > 1 {
        tree::broadcast_among(p.step(), rank, &local, count);
    }
    p
}
