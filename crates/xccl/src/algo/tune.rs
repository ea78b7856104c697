//! The tuner: picks the algorithm with the least predicted time.
//!
//! Predictions come from the schedules themselves. For a candidate algorithm the tuner
//! builds every rank's program and walks the steps: a rank's time in a step is
//! `α` per message it sends, plus `β` per byte (the larger of what it sends and what it
//! receives, links being full duplex), plus `γ` per byte it reduces and `δ` per byte it copies
//! locally, with `α` and `β` those of the link class between the two ranks (same process,
//! shared memory, TCP). Bytes between hosts are charged to the hosts, not the ranks: a host's
//! ranks share its one link. A step takes as long as its slowest rank or busiest host, since
//! ranks meet at every step, plus, where ranks forward what they receive within the step
//! (trees, chains), one segment's hop for every level of forwarding; the program takes the
//! sum of its steps. A single-step pipelined tree comes out
//! right too: its root pays for every child it feeds.
//!
//! A host with more ranks than cores runs them in turns: a rank's time in a step is
//! multiplied by the host's crowding (ranks per core), and every message it waits for costs a
//! hand-off of the core (`switch`), so with crowded hosts algorithms whose ranks wait for
//! fewer messages win.
//!
//! Everything the prediction uses (the collective, its size, the ranks and which of them
//! share a host, the constants) is the same on every rank, never a rank-local timing, so all
//! ranks choose alike. The constants default to values measured on the project's reference
//! machine (docs/PERFORMANCE.md) and can be overridden per class by `XCCL_TUNE_<CLASS>` as
//! `alpha_us,beta_gbps,gamma_gbps,delta_gbps` (for example `XCCL_TUNE_SHM=1.5,6,8,12`), and
//! the hand-off by `XCCL_TUNE_SWITCH_US` (`cost_model.rs` keeps them and their file format).

use std::collections::HashMap;
use std::fmt;

pub use super::cost_model::{CostModel, Efficiency, LinkClass, LinkCost, PullLine};
pub use super::costing::Costing;
use super::{Algorithm, Shape};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::protocol::{self, LinkFacts, ProtocolPolicy};

/// Where a communicator's ranks are, as the tuner sees it: each rank's host and that host's
/// cores, the classes of link inside and between hosts, and what its settings allow
/// (protocols, the pull threshold). Not a network topology: that is the simulator's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Host index of each rank.
    pub hosts: Vec<usize>,
    /// Cores of each rank's host.
    pub cores: Vec<usize>,
    /// The class of links between ranks of one host.
    pub intra: LinkClass,
    /// The class of links between hosts.
    pub inter: LinkClass,
    /// The protocols each collective may use (`XCCL_PROTO`).
    pub protocols: ProtocolPolicy,
    /// From which length messages may be pulled (`XCCL_PULL_BYTES`,
    /// `XCCL_PULL_PLAIN_BYTES`).
    pub pull_min: protocol::PullMin,
}

impl Placement {
    /// `n` ranks on one host of `cores` cores, linked by `intra`, with the default protocols.
    pub fn one_host(n: usize, cores: usize, intra: LinkClass) -> Placement {
        Placement::new(vec![0; n], vec![cores; n], intra, LinkClass::Tcp)
    }

    /// Ranks on `hosts` with `cores`, linked by `intra` inside hosts and `inter` between
    /// them, with the default protocols.
    pub fn new(hosts: Vec<usize>, cores: Vec<usize>, intra: LinkClass, inter: LinkClass) -> Placement {
        Placement {
            hosts,
            cores,
            intra,
            inter,
            protocols: ProtocolPolicy::default(),
            pull_min: protocol::PullMin::default(),
        }
    }

    /// What the protocol choice knows of the link between ranks `a` and `b`, from its class:
    /// memory links carry LL and can be pulled from (threads always, processes where the
    /// kernel allows), with quarter-ring frames; sockets neither, with 1 MiB segments.
    pub(super) fn link(&self, a: usize, b: usize) -> LinkFacts {
        match self.class(a, b) {
            LinkClass::Local | LinkClass::Shm => {
                LinkFacts { memory: true, ll_max: protocol::LL_MAX, seg: 1 << 20, peer_pulls: true }
            }
            LinkClass::Tcp => LinkFacts { memory: false, ll_max: 0, seg: 1 << 20, peer_pulls: false },
        }
    }

    pub(super) fn class(&self, a: usize, b: usize) -> LinkClass {
        if self.hosts[a] == self.hosts[b] { self.intra } else { self.inter }
    }

    /// Ranks per core on each rank's host (at least 1).
    pub(super) fn crowding(&self) -> Vec<f64> {
        let mut here: HashMap<usize, usize> = HashMap::new();
        for &h in &self.hosts {
            *here.entry(h).or_default() += 1;
        }
        (0..self.hosts.len())
            .map(|r| {
                (here[&self.hosts[r]] as f64 / self.cores.get(r).copied().unwrap_or(1).max(1) as f64).max(1.0)
            })
            .collect()
    }
}

/// The predicted time of `algo` running `kind` with this layout, in seconds.
pub fn predict(
    model: &CostModel,
    place: &Placement,
    kind: CollKind,
    algo: Algorithm,
    root: usize,
    shape: &Shape,
    esize: usize,
) -> Result<f64> {
    Ok(Costing::new(place, kind, algo, root, shape, esize)?.time(model))
}

/// A choice and what it was chosen over.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The chosen algorithm.
    pub algo: Algorithm,
    /// Every applicable candidate with its predicted time (seconds), fastest first.
    pub ranking: Vec<(Algorithm, f64)>,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.ranking.iter().map(|(a, t)| format!("{a} {:.1} µs", t * 1e6)).collect();
        write!(f, "{} (predicted: {})", self.algo, parts.join(", "))
    }
}

/// Ranks every algorithm that can run `kind` here by predicted time.
pub fn rank(
    model: &CostModel,
    place: &Placement,
    kind: CollKind,
    root: usize,
    shape: &Shape,
    esize: usize,
) -> Result<Choice> {
    let n = place.hosts.len();
    let mut ranking = Vec::new();
    for &algo in Algorithm::for_collective(kind) {
        if algo.supports(kind, n, shape) {
            ranking.push((algo, predict(model, place, kind, algo, root, shape, esize)?));
        }
    }
    // Stable: on equal predictions the listed order (the simpler algorithm first) wins.
    ranking.sort_by(|a, b| a.1.total_cmp(&b.1));
    let algo = ranking
        .first()
        .map(|(a, _)| *a)
        .ok_or_else(|| Error::Internal(format!("no algorithm for {kind}")))?;
    Ok(Choice { algo, ranking })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::build;
    use crate::protocol::Protocol;
    use crate::schedule::Op;

    fn place(n: usize) -> Placement {
        Placement::one_host(n, 64, LinkClass::Shm)
    }

    /// The reference link constants without the algorithms' efficiencies or the protocols'
    /// factors.
    fn plain() -> CostModel {
        CostModel { efficiency: Vec::new(), protocols: Vec::new(), ..CostModel::default() }
    }

    #[test]
    fn efficiencies_change_the_pick() {
        let m = plain();
        let count = Shape::Count(4 << 20);
        let base = rank(&m, &place(8), CollKind::AllReduce, 0, &count, 4).unwrap();
        let slow = Efficiency {
            kind: CollKind::AllReduce,
            algo: base.algo,
            crowded: false,
            latency: 1.0,
            bandwidth: 10.0,
        };
        let m2 = CostModel { efficiency: vec![slow], ..m };
        let other = rank(&m2, &place(8), CollKind::AllReduce, 0, &count, 4).unwrap();
        assert_ne!(other.algo, base.algo, "{other}");
    }

    #[test]
    fn small_messages_prefer_few_rounds_and_large_ones_bandwidth() {
        let m = CostModel::default();
        let small = rank(&m, &place(8), CollKind::AllReduce, 0, &Shape::Count(2), 4).unwrap();
        assert!(matches!(small.algo, Algorithm::RecursiveDoubling | Algorithm::Rabenseifner), "{small}");
        let large = rank(&m, &place(8), CollKind::AllReduce, 0, &Shape::Count(16 << 20), 4).unwrap();
        assert!(
            matches!(large.algo, Algorithm::Ring | Algorithm::Rabenseifner | Algorithm::DoubleBinaryTree),
            "{large}"
        );
        assert_ne!(large.algo, Algorithm::ReduceBroadcast);
    }

    #[test]
    fn the_ring_costs_what_the_textbook_says() {
        // 2(n-1) messages, 2(n-1)/n of the buffer each way, (n-1)/n reduced.
        let m = CostModel { shm: LinkCost::new(10.0, 1.0, 2.0, 4.0), ..plain() };
        let (n, bytes) = (4, 4_000_000usize);
        let t = predict(&m, &place(n), CollKind::AllReduce, Algorithm::Ring, 0, &Shape::Count(bytes / 4), 4)
            .unwrap();
        let nf = n as f64;
        let want = 2.0 * (nf - 1.0) * 10e-6
            + 2.0 * (nf - 1.0) / nf * bytes as f64 * 1e-9
            + (nf - 1.0) / nf * bytes as f64 * 0.5e-9;
        assert!((t - want).abs() / want < 1e-9, "{t} vs {want}");
    }

    #[test]
    fn the_fewest_bytes_between_hosts_win_only_when_hosts_are_far_apart() {
        let t = Placement::new(vec![0, 0, 0, 0, 1, 1, 1, 1], vec![8; 8], LinkClass::Shm, LinkClass::Tcp);
        // The ring crosses between hosts in two places only, so with a network a few times
        // slower than shared memory the hierarchy's extra inside phases do not pay; with one
        // twenty times slower, what sends
        // the fewest bytes between the hosts wins: the hierarchy (reduced inside, then one
        // all-reduce of a quarter per rank across) or Rabenseifner, whose rounds pair ranks
        // 1, 2, then 4 apart, so that only its last, smallest round (an eighth per rank)
        // crosses: the buffer once per host link each way, against the ring's 7/4.
        let near = rank(&plain(), &t, CollKind::AllReduce, 0, &Shape::Count(1 << 20), 4).unwrap();
        assert_ne!(near.algo, Algorithm::Hierarchical, "{near}");
        let far = CostModel { tcp: LinkCost::new(50.0, 0.3, 7.0, 10.0), ..plain() };
        let c = rank(&far, &t, CollKind::AllReduce, 0, &Shape::Count(1 << 20), 4).unwrap();
        assert!(matches!(c.algo, Algorithm::Hierarchical | Algorithm::Rabenseifner), "{c}");
        let time = |a| predict(&far, &t, CollKind::AllReduce, a, 0, &Shape::Count(1 << 20), 4).unwrap();
        assert!(time(Algorithm::Ring) > 1.3 * time(c.algo), "{c}");
    }

    #[test]
    fn messages_are_priced_by_the_protocol_the_executor_will_use() {
        let m = CostModel { protocols: vec![(Protocol::Ll, 0.5, 1.0)], ..plain() };
        let mut stream_only = place(2);
        stream_only.protocols = ProtocolPolicy::parse("stream").unwrap();
        let t = |place: &Placement, count: usize| {
            predict(&m, place, CollKind::AllReduce, Algorithm::RecursiveDoubling, 0, &Shape::Count(count), 4)
                .unwrap()
        };
        // 8 bytes go by LL unless the policy says otherwise; 256 KiB never do.
        assert!(t(&place(2), 2) < 0.6 * t(&stream_only, 2), "{} {}", t(&place(2), 2), t(&stream_only, 2));
        assert_eq!(t(&place(2), 1 << 16), t(&stream_only, 1 << 16));
        // Over TCP nothing goes by LL.
        let tcp = Placement::one_host(2, 64, LinkClass::Tcp);
        let mut tcp_stream = tcp.clone();
        tcp_stream.protocols = ProtocolPolicy::parse("stream").unwrap();
        assert_eq!(t(&tcp, 2), t(&tcp_stream, 2));
    }

    #[test]
    fn forwarding_chains_pay_one_hop_per_level() {
        let m = CostModel { shm: LinkCost::new(10.0, 1.0, 2.0, 4.0), ..plain() };
        let t = |algo| predict(&m, &place(8), CollKind::Broadcast, algo, 0, &Shape::Count(1), 4).unwrap();
        // A one-element chain over 8 ranks: seven hops in a row; a binomial tree: three levels,
        // but the root sends to three children.
        assert!(t(Algorithm::Chain) > 7.0 * 10e-6, "{}", t(Algorithm::Chain));
        assert!(t(Algorithm::Binomial) < t(Algorithm::Chain));
    }

    #[test]
    fn crowded_hosts_prefer_fewer_waits() {
        // Eight ranks on two cores: every message a rank waits for costs a turn on a core, so
        // the pick waits for fewer messages than the ring's fourteen, and the ring itself is
        // predicted slower than with a core per rank.
        let m = CostModel::default();
        let count = Shape::Count(16 << 10);
        let crowded = Placement::one_host(8, 2, LinkClass::Shm);
        let c = rank(&m, &crowded, CollKind::AllReduce, 0, &count, 4).unwrap();
        let waits = |a| {
            let p = build(CollKind::AllReduce, a, 0, &[0; 8], 0, &count).unwrap();
            p.steps.iter().flat_map(|s| &s.ops).filter(|o| matches!(o, Op::Recv { .. })).count()
        };
        assert_eq!(waits(Algorithm::Ring), 14);
        assert!(waits(c.algo) < 14, "crowded {c}");
        let ring =
            |t: &Placement| predict(&m, t, CollKind::AllReduce, Algorithm::Ring, 0, &count, 4).unwrap();
        assert!(ring(&crowded) > 2.0 * ring(&place(8)));
    }

    #[test]
    fn uneven_layouts_are_costed_from_their_blocks() {
        use crate::schedule::Blocks;
        let (m, n, block) = (plain(), 8, 1 << 16);
        let kind = CollKind::ReduceScatter;
        let mut skewed = vec![0; n];
        skewed[3] = block * n;
        let skewed = Shape::Scatter(Blocks::from_counts(&skewed));
        for &algo in Algorithm::for_collective(kind) {
            let t = |shape: &Shape| predict(&m, &place(n), kind, algo, 0, shape, 4).unwrap();
            // An even call is the uniform layout.
            assert_eq!(t(&Shape::Count(block)), t(&Shape::Scatter(Blocks::uniform(block, n))), "{algo}");
            // The same elements in one rank's block: no link shares that block's traffic.
            assert!(t(&skewed) > 2.0 * t(&Shape::Count(block)), "{algo}");
        }
        let choice = rank(&m, &place(n), kind, 0, &skewed, 4).unwrap();
        assert_eq!(choice.ranking.len(), Algorithm::for_collective(kind).len(), "{choice}");
    }
}
