//! Algorithms: pure functions from `(rank, nranks, shape, root)` to a [`Program`].
//!
//! Each algorithm lives in its own module. [`build`] maps a collective and an algorithm to
//! its schedule; [`tune`] predicts every candidate's time from its schedule and picks the
//! fastest, unless the environment names one (`XCCL_ALGO=allreduce:ring,broadcast:chain`).
//! All ranks must run the same algorithm; the choice travels in every frame header, so a
//! rank configured differently gets a mismatch error rather than a deadlock.

mod bruck;
mod chain;
mod dbtree;
mod direct;
mod dissemination;
mod fold;
mod hierarchical;
mod linear;
mod pairwise;
mod rabenseifner;
mod recursive_doubling;
mod recursive_halving;
mod reduce_broadcast;
mod ring;
mod scatter_allgather;
mod tree;
pub mod tune;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::schedule::{Blocks, Buf, Program, Region};

/// A family of schedules.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Algorithm {
    /// Ring: reduce-scatter then all-gather around `0 → 1 → … → n-1 → 0`.
    Ring = 1,
    /// Binomial tree rooted at the root, pipelined in segments.
    Binomial = 2,
    /// The root talks to every other rank directly, in one step.
    Linear = 3,
    /// All-to-all in `n-1` rounds of pairwise exchange.
    Pairwise = 4,
    /// All-reduce as a linear reduce to rank 0 followed by a broadcast from it: the
    /// parameter-server shape.
    ReduceBroadcast = 5,
    /// Barrier by dissemination: `⌈log2 n⌉` rounds of messages to `rank + 2^k`.
    Dissemination = 6,
    /// Recursive doubling (hypercube exchange): `log2 n` rounds moving the whole buffer.
    RecursiveDoubling = 7,
    /// Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather.
    Rabenseifner = 8,
    /// Two binary trees, each carrying half the data, with disjoint inner nodes.
    DoubleBinaryTree = 9,
    /// Reduce inside hosts, ring among host leaders, broadcast inside hosts.
    Hierarchical = 10,
    /// Bruck: `⌈log2 n⌉` rounds for any `n` (small messages).
    Bruck = 11,
    /// Recursive halving: `log2 n` rounds, halving the data each time.
    RecursiveHalving = 12,
    /// Broadcast as scatter + ring all-gather.
    ScatterAllGather = 13,
    /// Pipelined chain broadcast.
    Chain = 14,
    /// Every rank exchanges with every other in one step (reduce-scatter and all-gather
    /// phases of one step each).
    Direct = 15,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 15] = [
        Algorithm::Ring,
        Algorithm::Binomial,
        Algorithm::Linear,
        Algorithm::Pairwise,
        Algorithm::ReduceBroadcast,
        Algorithm::Dissemination,
        Algorithm::RecursiveDoubling,
        Algorithm::Rabenseifner,
        Algorithm::DoubleBinaryTree,
        Algorithm::Hierarchical,
        Algorithm::Bruck,
        Algorithm::RecursiveHalving,
        Algorithm::ScatterAllGather,
        Algorithm::Chain,
        Algorithm::Direct,
    ];

    /// The name used in `XCCL_ALGO` and in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Binomial => "binomial",
            Algorithm::Linear => "linear",
            Algorithm::Pairwise => "pairwise",
            Algorithm::ReduceBroadcast => "reduce_broadcast",
            Algorithm::Dissemination => "dissemination",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::Rabenseifner => "rabenseifner",
            Algorithm::DoubleBinaryTree => "dbtree",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::Bruck => "bruck",
            Algorithm::RecursiveHalving => "recursive_halving",
            Algorithm::ScatterAllGather => "scatter_allgather",
            Algorithm::Chain => "chain",
            Algorithm::Direct => "direct",
        }
    }

    /// The algorithm a wire tag names, if any.
    pub(crate) fn from_tag(tag: u8) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| *a as u8 == tag)
    }

    /// The algorithms that implement `kind`, the fallback default first.
    pub fn for_collective(kind: CollKind) -> &'static [Algorithm] {
        use Algorithm as A;
        match kind {
            CollKind::AllReduce => &[
                A::Ring,
                A::ReduceBroadcast,
                A::RecursiveDoubling,
                A::Rabenseifner,
                A::DoubleBinaryTree,
                A::Hierarchical,
                A::Direct,
            ],
            CollKind::AllGather => &[A::Ring, A::RecursiveDoubling, A::Bruck, A::Direct],
            CollKind::ReduceScatter => &[A::Ring, A::RecursiveHalving, A::Direct],
            CollKind::Broadcast => &[A::Binomial, A::ScatterAllGather, A::Chain, A::Linear],
            CollKind::Reduce => &[A::Binomial],
            CollKind::Scatter | CollKind::Gather => &[A::Linear],
            CollKind::AllToAll => &[A::Pairwise, A::Bruck],
            CollKind::Barrier => &[A::Dissemination],
            CollKind::SendRecv => &[],
        }
    }

    /// Whether this algorithm can run `kind` on `n` ranks with this data layout.
    pub fn supports(self, kind: CollKind, n: usize, shape: &Shape) -> bool {
        if !Algorithm::for_collective(kind).contains(&self) {
            return false;
        }
        match (kind, self) {
            (CollKind::AllGather, Algorithm::RecursiveDoubling) => n.is_power_of_two(),
            (CollKind::AllToAll, Algorithm::Bruck) => matches!(shape, Shape::Count(_)),
            _ => true,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Algorithm::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| {
            let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            Error::Config(format!("unknown algorithm '{s}': expected one of {}", names.join(", ")))
        })
    }
}

/// The data layout of one collective call, as its schedule needs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// One count: the buffer of all-reduce/broadcast/reduce, the per-rank block of
    /// scatter/gather/reduce-scatter/all-gather/all-to-all (0 for barrier).
    Count(usize),
    /// One block per rank in the output (all-gather with uneven counts).
    Gather(Blocks),
    /// One block per rank in the input: block `i`, reduced over all ranks, goes to rank `i`
    /// (reduce-scatter; with uneven counts, reduce-scatter-v).
    Scatter(Blocks),
    /// What goes to each rank and what comes from each rank (all-to-all with uneven counts).
    Exchange {
        /// Block `j` of the input goes to rank `j`.
        send: Blocks,
        /// Block `j` of the output comes from rank `j`.
        recv: Blocks,
    },
}

impl Shape {
    /// Whether the call moves no data: a count of 0, or blocks that are all empty. Every
    /// rank passes the same counts, so every rank sees this alike (not so for
    /// [`Shape::Exchange`], whose blocks differ between ranks).
    pub fn is_empty(&self) -> bool {
        match self {
            Shape::Count(c) => *c == 0,
            Shape::Gather(blocks) | Shape::Scatter(blocks) => blocks.total() == 0,
            Shape::Exchange { .. } => false,
        }
    }
}

/// Per-collective algorithm choices that override the defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgoOverrides(HashMap<CollKind, Algorithm>);

impl AlgoOverrides {
    /// Parses `allreduce:ring,broadcast:binomial` (collective names with or without `_`).
    pub fn parse(spec: &str) -> Result<AlgoOverrides> {
        let mut map = HashMap::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (coll, algo) = item.split_once(':').ok_or_else(|| {
                Error::Config(format!("XCCL_ALGO item '{item}' is not COLLECTIVE:ALGORITHM"))
            })?;
            let kind = CollKind::named(coll)
                .ok_or_else(|| Error::Config(format!("XCCL_ALGO names unknown collective '{coll}'")))?;
            let algo: Algorithm = algo.trim().parse()?;
            if !Algorithm::for_collective(kind).contains(&algo) {
                return Err(Error::Config(format!(
                    "XCCL_ALGO: {kind} has no '{algo}' algorithm (available: {})",
                    Algorithm::for_collective(kind).iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
                )));
            }
            map.insert(kind, algo);
        }
        Ok(AlgoOverrides(map))
    }

    /// The algorithm set for `kind`, if any.
    pub fn get(&self, kind: CollKind) -> Option<Algorithm> {
        self.0.get(&kind).copied()
    }

    /// Sets the algorithm for one collective.
    pub fn set(&mut self, kind: CollKind, algo: Algorithm) -> Result<()> {
        if !Algorithm::for_collective(kind).contains(&algo) {
            return Err(Error::Config(format!("{kind} has no '{algo}' algorithm")));
        }
        self.0.insert(kind, algo);
        Ok(())
    }
}

/// Any collective on a single rank, whatever the algorithm: the input copied to the output
/// (nothing for a broadcast, which works in place, or a barrier).
fn alone(kind: CollKind, shape: &Shape) -> Program {
    let mut p = Program::new();
    let (from, to) = match shape {
        Shape::Count(c) => (Region::new(Buf::Input, 0, *c), Region::new(Buf::Output, 0, *c)),
        Shape::Gather(blocks) => (blocks.region(Buf::Input, 0), blocks.region(Buf::Output, 0)),
        Shape::Scatter(blocks) => {
            (blocks.region(Buf::Input, 0), Region::new(Buf::Output, 0, blocks.len_of(0)))
        }
        Shape::Exchange { send, recv } => (send.region(Buf::Input, 0), recv.region(Buf::Output, 0)),
    };
    if !matches!(kind, CollKind::Broadcast | CollKind::Barrier) {
        p.step().copy(from, to);
    }
    p
}

/// The schedule of collective `kind` by `algo` for `rank`; `hosts[r]` names the host of
/// rank `r` (its length is the number of ranks).
pub fn build(
    kind: CollKind,
    algo: Algorithm,
    rank: usize,
    hosts: &[usize],
    root: usize,
    shape: &Shape,
) -> Result<Program> {
    use Algorithm as A;
    use CollKind as K;
    let n = hosts.len();
    if !algo.supports(kind, n, shape) {
        return Err(Error::Config(format!("{algo} cannot run {kind} on {n} ranks with {shape:?}")));
    }
    let block_per_rank = match shape {
        Shape::Count(_) => true,
        Shape::Gather(b) | Shape::Scatter(b) => b.count() == n,
        Shape::Exchange { send, recv } => send.count() == n && recv.count() == n,
    };
    if !block_per_rank {
        return Err(Error::Config(format!("{shape:?} does not have one block per rank of {n}")));
    }
    if shape.is_empty() && kind != CollKind::Barrier {
        // Every rank passes the same counts, so all agree there is nothing to do.
        return Ok(Program::new());
    }
    if n == 1 {
        return Ok(alone(kind, shape));
    }
    let program = match (kind, algo, shape) {
        (K::AllReduce, A::Ring, Shape::Count(c)) => ring::all_reduce(rank, n, *c),
        (K::AllReduce, A::ReduceBroadcast, Shape::Count(c)) => reduce_broadcast::all_reduce(rank, n, *c),
        (K::AllReduce, A::RecursiveDoubling, Shape::Count(c)) => recursive_doubling::all_reduce(rank, n, *c),
        (K::AllReduce, A::Rabenseifner, Shape::Count(c)) => rabenseifner::all_reduce(rank, n, *c),
        (K::AllReduce, A::DoubleBinaryTree, Shape::Count(c)) => dbtree::all_reduce(rank, n, *c),
        (K::AllReduce, A::Hierarchical, Shape::Count(c)) => hierarchical::all_reduce(rank, hosts, *c),
        (K::AllReduce, A::Direct, Shape::Count(c)) => direct::all_reduce(rank, n, *c),
        (K::AllGather, _, Shape::Count(c)) => {
            return build(kind, algo, rank, hosts, root, &Shape::Gather(Blocks::uniform(*c, n)));
        }
        (K::AllGather, A::Ring, Shape::Gather(blocks)) => ring::all_gather(rank, blocks),
        (K::AllGather, A::RecursiveDoubling, Shape::Gather(blocks)) => {
            recursive_doubling::all_gather(rank, blocks)
        }
        (K::AllGather, A::Bruck, Shape::Gather(blocks)) => bruck::all_gather(rank, blocks),
        (K::AllGather, A::Direct, Shape::Gather(blocks)) => direct::all_gather(rank, blocks),
        (K::ReduceScatter, _, Shape::Count(c)) => {
            return build(kind, algo, rank, hosts, root, &Shape::Scatter(Blocks::uniform(*c, n)));
        }
        (K::ReduceScatter, A::Ring, Shape::Scatter(blocks)) => ring::reduce_scatter(rank, blocks),
        (K::ReduceScatter, A::RecursiveHalving, Shape::Scatter(blocks)) => {
            recursive_halving::reduce_scatter(rank, blocks)
        }
        (K::ReduceScatter, A::Direct, Shape::Scatter(blocks)) => direct::reduce_scatter(rank, blocks),
        (K::Broadcast, A::Binomial, Shape::Count(c)) => tree::broadcast(rank, n, *c, root),
        (K::Broadcast, A::ScatterAllGather, Shape::Count(c)) => {
            scatter_allgather::broadcast(rank, n, *c, root)
        }
        (K::Broadcast, A::Chain, Shape::Count(c)) => chain::broadcast(rank, n, *c, root),
        (K::Broadcast, A::Linear, Shape::Count(c)) => linear::broadcast(rank, n, *c, root),
        (K::Reduce, A::Binomial, Shape::Count(c)) => tree::reduce(rank, n, *c, root),
        (K::Scatter, A::Linear, Shape::Count(c)) => linear::scatter(rank, n, *c, root),
        (K::Gather, A::Linear, Shape::Count(c)) => linear::gather(rank, n, *c, root),
        (K::AllToAll, A::Pairwise, Shape::Count(c)) => {
            let b = Blocks::uniform(*c, n);
            pairwise::all_to_all(rank, &b, &b)
        }
        (K::AllToAll, A::Pairwise, Shape::Exchange { send, recv }) => pairwise::all_to_all(rank, send, recv),
        (K::AllToAll, A::Bruck, Shape::Count(c)) => bruck::all_to_all(rank, n, *c),
        (K::Barrier, A::Dissemination, Shape::Count(0)) => dissemination::barrier(rank, n),
        _ => {
            return Err(Error::Internal(format!("no schedule for {kind} by {algo} with {shape:?}")));
        }
    };
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_and_reject_nonsense() {
        let o = AlgoOverrides::parse("allreduce:reduce_broadcast, all_gather:ring").unwrap();
        assert_eq!(o.get(CollKind::AllReduce), Some(Algorithm::ReduceBroadcast));
        assert_eq!(o.get(CollKind::Broadcast), None);
        assert!(AlgoOverrides::parse("allreduce").is_err());
        assert!(AlgoOverrides::parse("allreduce:bogus").is_err());
        assert!(AlgoOverrides::parse("broadcast:ring").unwrap_err().to_string().contains("no 'ring'"));
        assert!(AlgoOverrides::parse("teleport:ring").is_err());
    }

    #[test]
    fn reduce_scatter_of_a_count_is_the_uniform_layout() {
        let kind = CollKind::ReduceScatter;
        for &algo in Algorithm::for_collective(kind) {
            for n in 1..=9 {
                let hosts = vec![0; n];
                for rank in 0..n {
                    let even = build(kind, algo, rank, &hosts, 0, &Shape::Count(5)).unwrap();
                    let blocks = build(kind, algo, rank, &hosts, 0, &Shape::Scatter(Blocks::uniform(5, n)));
                    assert_eq!(even, blocks.unwrap(), "{algo} n {n} rank {rank}");
                    let counts: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % 5).collect();
                    let uneven = Shape::Scatter(Blocks::from_counts(&counts));
                    let p = build(kind, algo, rank, &hosts, 0, &uneven).unwrap();
                    p.check(rank, n, counts.iter().sum(), counts[rank]).unwrap();
                }
                let wrong = Shape::Scatter(Blocks::uniform(1, n + 1));
                assert!(build(kind, algo, 0, &hosts, 0, &wrong).is_err());
            }
        }
    }

    #[test]
    fn every_listed_algorithm_builds_and_checks() {
        for kind in CollKind::COLLECTIVES {
            for &algo in Algorithm::for_collective(kind) {
                for n in 1..=9 {
                    for rank in 0..n {
                        let count = if kind == CollKind::Barrier { 0 } else { 13 };
                        let shape = Shape::Count(count);
                        if !algo.supports(kind, n, &shape) {
                            continue;
                        }
                        let hosts: Vec<usize> = (0..n).map(|r| r / 3).collect();
                        let p = build(kind, algo, rank, &hosts, n / 2, &shape).unwrap();
                        let (input, output) = match kind {
                            CollKind::Scatter | CollKind::ReduceScatter => (count * n, count),
                            CollKind::Gather | CollKind::AllGather => (count, count * n),
                            CollKind::AllToAll => (count * n, count * n),
                            _ => (count, count),
                        };
                        p.check(rank, n, input, output).unwrap();
                    }
                }
            }
        }
    }
}
