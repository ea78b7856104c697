//! Algorithms: pure functions from `(rank, nranks, shape, root)` to a [`Program`].
//!
//! Each algorithm lives in its own file and declares there what it implements (its
//! `DECLARATION`: its name, and for each collective whether it runs on a layout and how it
//! builds the schedule); this module keeps the wire tags (the [`Algorithm`] enum) and the
//! one list of declarations, from which names, [`Algorithm::for_collective`] and
//! [`Algorithm::supports`] follow. [`build`] maps a collective and an algorithm to its
//! schedule; [`tune`] predicts every candidate's time from its schedule and picks the
//! fastest, unless the environment names one (`XCCL_ALGO=allreduce:ring,broadcast:chain`).
//! All ranks must run the same algorithm; the choice travels in every frame header, so a
//! rank configured differently gets a mismatch error rather than a deadlock.

mod bruck;
mod chain;
mod cost_model;
mod costing;
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
use std::sync::OnceLock;

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

/// What one algorithm implements, declared in the algorithm's own file.
pub(crate) struct Declaration {
    /// The algorithm.
    pub algo: Algorithm,
    /// Its name in `XCCL_ALGO` and in messages.
    pub name: &'static str,
    /// The collectives it implements.
    pub implements: &'static [Implementation],
}

/// One collective an algorithm implements.
pub(crate) struct Implementation {
    /// The collective.
    pub kind: CollKind,
    /// Whether it runs on `n` ranks with this layout.
    pub supports: fn(usize, &Shape) -> bool,
    /// The schedule of one rank; `None` for a layout it does not take.
    pub build: fn(&Call<'_>) -> Option<Program>,
}

impl Implementation {
    /// An implementation of `kind` on any number of ranks, for every layout `build` takes.
    pub(crate) const fn any(kind: CollKind, build: fn(&Call<'_>) -> Option<Program>) -> Implementation {
        Implementation { kind, supports: always, build }
    }
}

/// Everything a schedule depends on: the calling rank, the hosts of all ranks (their number
/// is the world size), the root and the layout.
pub(crate) struct Call<'a> {
    /// The rank whose schedule is built.
    pub rank: usize,
    /// `hosts[r]` is the host of rank `r`.
    pub hosts: &'a [usize],
    /// The root of rooted collectives.
    pub root: usize,
    /// The data layout.
    pub shape: &'a Shape,
}

impl Call<'_> {
    /// Ranks.
    pub fn n(&self) -> usize {
        self.hosts.len()
    }

    /// The count of a [`Shape::Count`] layout.
    pub fn count(&self) -> Option<usize> {
        match self.shape {
            Shape::Count(c) => Some(*c),
            _ => None,
        }
    }

    /// The blocks of a [`Shape::Gather`] layout.
    pub fn gather(&self) -> Option<&Blocks> {
        match self.shape {
            Shape::Gather(b) => Some(b),
            _ => None,
        }
    }

    /// The blocks of a [`Shape::Scatter`] layout.
    pub fn scatter(&self) -> Option<&Blocks> {
        match self.shape {
            Shape::Scatter(b) => Some(b),
            _ => None,
        }
    }
}

/// For implementations that run on any number of ranks with any layout.
fn always(_: usize, _: &Shape) -> bool {
    true
}

/// Every algorithm's declaration. Their order is the order of preference where predictions
/// tie, and the first that implements a collective is its fallback default.
const DECLARATIONS: [&Declaration; 15] = [
    &ring::DECLARATION,
    &reduce_broadcast::DECLARATION,
    &recursive_doubling::DECLARATION,
    &rabenseifner::DECLARATION,
    &dbtree::DECLARATION,
    &hierarchical::DECLARATION,
    &pairwise::DECLARATION,
    &bruck::DECLARATION,
    &recursive_halving::DECLARATION,
    &direct::DECLARATION,
    &tree::DECLARATION,
    &scatter_allgather::DECLARATION,
    &chain::DECLARATION,
    &linear::DECLARATION,
    &dissemination::DECLARATION,
];

impl Algorithm {
    /// Every algorithm, in the order of the declarations.
    pub const ALL: [Algorithm; DECLARATIONS.len()] = {
        let mut all = [Algorithm::Ring; DECLARATIONS.len()];
        let mut i = 0;
        while i < all.len() {
            all[i] = DECLARATIONS[i].algo;
            i += 1;
        }
        all
    };

    fn declaration(self) -> &'static Declaration {
        DECLARATIONS.iter().copied().find(|d| d.algo == self).unwrap_or(DECLARATIONS[0])
    }

    /// The name used in `XCCL_ALGO` and in messages.
    pub fn name(self) -> &'static str {
        self.declaration().name
    }

    /// The algorithm a wire tag names, if any.
    pub(crate) fn from_tag(tag: u8) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| *a as u8 == tag)
    }

    /// The algorithms that implement `kind`, the fallback default first.
    pub fn for_collective(kind: CollKind) -> &'static [Algorithm] {
        static LISTS: OnceLock<Vec<(CollKind, Vec<Algorithm>)>> = OnceLock::new();
        let lists = LISTS.get_or_init(|| {
            CollKind::COLLECTIVES
                .into_iter()
                .map(|k| {
                    let algos = DECLARATIONS
                        .iter()
                        .filter(|d| d.implements.iter().any(|i| i.kind == k))
                        .map(|d| d.algo)
                        .collect();
                    (k, algos)
                })
                .collect()
        });
        lists.iter().find(|(k, _)| *k == kind).map_or(&[], |(_, a)| a.as_slice())
    }

    /// How this algorithm implements `kind`, if it does.
    fn implementation(self, kind: CollKind) -> Option<&'static Implementation> {
        self.declaration().implements.iter().find(|i| i.kind == kind)
    }

    /// Whether this algorithm can run `kind` on `n` ranks with this data layout.
    pub fn supports(self, kind: CollKind, n: usize, shape: &Shape) -> bool {
        self.implementation(kind).is_some_and(|i| (i.supports)(n, shape))
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
    /// One block per rank in the output: block `i` comes from rank `i` (all-gather and
    /// gather; with uneven counts, all-gather-v and gather-v).
    Gather(Blocks),
    /// One block per rank in the input: block `i` goes to rank `i`, reduced over all ranks
    /// (reduce-scatter) or from the root (scatter); with uneven counts, reduce-scatter-v and
    /// scatter-v.
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
    // An even all-gather, gather, reduce-scatter or scatter is the uniform layout of its
    // uneven form.
    let uniform;
    let shape = match (kind, shape) {
        (K::AllGather | K::Gather, Shape::Count(c)) => {
            uniform = Shape::Gather(Blocks::uniform(*c, n));
            &uniform
        }
        (K::ReduceScatter | K::Scatter, Shape::Count(c)) => {
            uniform = Shape::Scatter(Blocks::uniform(*c, n));
            &uniform
        }
        _ => shape,
    };
    let call = Call { rank, hosts, root, shape };
    let program = algo
        .implementation(kind)
        .and_then(|i| (i.build)(&call))
        .ok_or_else(|| Error::Internal(format!("no schedule for {kind} by {algo} with {shape:?}")))?;
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
    fn an_even_call_is_the_uniform_layout_of_its_uneven_form() {
        use CollKind as K;
        let layout = |kind, b| {
            if matches!(kind, K::Gather | K::AllGather) { Shape::Gather(b) } else { Shape::Scatter(b) }
        };
        for kind in [K::ReduceScatter, K::AllGather, K::Scatter, K::Gather] {
            for &algo in Algorithm::for_collective(kind) {
                for n in 1..=9 {
                    let hosts = vec![0; n];
                    for rank in 0..n {
                        let root = n / 2;
                        let uniform = layout(kind, Blocks::uniform(5, n));
                        if !algo.supports(kind, n, &uniform) {
                            continue;
                        }
                        let even = build(kind, algo, rank, &hosts, root, &Shape::Count(5)).unwrap();
                        let blocks = build(kind, algo, rank, &hosts, root, &uniform);
                        assert_eq!(even, blocks.unwrap(), "{kind} by {algo} n {n} rank {rank}");
                        let counts: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % 5).collect();
                        let uneven = layout(kind, Blocks::from_counts(&counts));
                        let p = build(kind, algo, rank, &hosts, root, &uneven);
                        let (total, mine) = (counts.iter().sum(), counts[rank]);
                        let (input, output) = match kind {
                            K::ReduceScatter | K::Scatter => (total, mine),
                            _ => (mine, total),
                        };
                        p.unwrap().check(rank, n, input, output).unwrap();
                    }
                    let wrong = layout(kind, Blocks::uniform(1, n + 1));
                    assert!(build(kind, algo, 0, &hosts, 0, &wrong).is_err());
                }
            }
        }
    }

    #[test]
    fn every_algorithm_is_declared_once_and_the_lists_keep_their_order() {
        use Algorithm as A;
        for a in Algorithm::ALL {
            assert_eq!(DECLARATIONS.iter().filter(|d| d.algo == a).count(), 1, "{a:?}");
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
            assert_eq!(Algorithm::from_tag(a as u8), Some(a));
        }
        let mut tags: Vec<u8> = Algorithm::ALL.iter().map(|a| *a as u8).collect();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), Algorithm::ALL.len());
        // The fallback default of each collective comes first.
        let lists: [(CollKind, &[Algorithm]); 9] = [
            (
                CollKind::AllReduce,
                &[
                    A::Ring,
                    A::ReduceBroadcast,
                    A::RecursiveDoubling,
                    A::Rabenseifner,
                    A::DoubleBinaryTree,
                    A::Hierarchical,
                    A::Direct,
                ],
            ),
            (CollKind::AllGather, &[A::Ring, A::RecursiveDoubling, A::Bruck, A::Direct]),
            (CollKind::ReduceScatter, &[A::Ring, A::RecursiveHalving, A::Direct]),
            (CollKind::Broadcast, &[A::Binomial, A::ScatterAllGather, A::Chain, A::Linear]),
            (CollKind::Reduce, &[A::Binomial]),
            (CollKind::Scatter, &[A::Linear]),
            (CollKind::Gather, &[A::Linear]),
            (CollKind::AllToAll, &[A::Pairwise, A::Bruck, A::Direct]),
            (CollKind::Barrier, &[A::Dissemination]),
        ];
        for (kind, want) in lists {
            assert_eq!(Algorithm::for_collective(kind), want, "{kind}");
        }
        assert!(Algorithm::for_collective(CollKind::SendRecv).is_empty());
        assert!(!A::RecursiveDoubling.supports(CollKind::AllGather, 6, &Shape::Count(1)));
        assert!(!A::Bruck.supports(
            CollKind::AllToAll,
            4,
            &Shape::Exchange { send: Blocks::uniform(1, 4), recv: Blocks::uniform(1, 4) }
        ));
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
