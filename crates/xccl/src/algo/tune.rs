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

use std::fmt;

pub use super::cost_model::{CostModel, Efficiency, LinkClass, LinkCost};
use super::{Algorithm, Shape, build};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::protocol::{self, LinkFacts, Outgoing, Protocol, ProtocolPolicy};
use crate::schedule::order::{Follow, StepOrder};
use crate::schedule::{Op, Program};

/// Bytes a forwarding rank waits for before passing a message on (the executor's segment).
const HOP_BYTES: f64 = (1 << 20) as f64;

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
    /// Messages at least this long may be pulled (`XCCL_PULL_BYTES`).
    pub pull_min: usize,
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
            pull_min: protocol::PULL_MIN,
        }
    }

    /// What the protocol choice knows of the link between ranks `a` and `b`, from its class:
    /// memory links carry LL and can be pulled from (threads always, processes where the
    /// kernel allows), with quarter-ring frames; sockets neither, with 1 MiB segments.
    fn link(&self, a: usize, b: usize) -> LinkFacts {
        match self.class(a, b) {
            LinkClass::Local | LinkClass::Shm => {
                LinkFacts { memory: true, ll_max: protocol::LL_MAX, seg: 1 << 20, peer_pulls: true }
            }
            LinkClass::Tcp => LinkFacts { memory: false, ll_max: 0, seg: 1 << 20, peer_pulls: false },
        }
    }

    fn class(&self, a: usize, b: usize) -> LinkClass {
        if self.hosts[a] == self.hosts[b] { self.intra } else { self.inter }
    }

    /// Ranks per core on each rank's host (at least 1).
    fn crowding(&self) -> Vec<f64> {
        (0..self.hosts.len())
            .map(|r| {
                let here = self.hosts.iter().filter(|&&h| h == self.hosts[r]).count();
                (here as f64 / self.cores.get(r).copied().unwrap_or(1).max(1) as f64).max(1.0)
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

/// Every rank's schedule of one collective, built once and costed under any constants (what
/// calibration needs).
#[derive(Clone, Debug)]
pub struct Costing {
    place: Placement,
    programs: Vec<Program>,
    /// Per rank and step, what follows what (`schedule::order`).
    orders: Vec<Vec<StepOrder>>,
    esize: usize,
    kind: CollKind,
    algo: Algorithm,
    crowded: bool,
}

impl Costing {
    /// The schedules of `algo` running `kind` on `place` with this layout.
    pub fn new(
        place: &Placement,
        kind: CollKind,
        algo: Algorithm,
        root: usize,
        shape: &Shape,
        esize: usize,
    ) -> Result<Costing> {
        let n = place.hosts.len();
        let programs =
            (0..n).map(|r| build(kind, algo, r, &place.hosts, root, shape)).collect::<Result<Vec<_>>>()?;
        let orders = programs
            .iter()
            .map(|p| {
                p.steps.iter().map(|s| StepOrder::of(s, false)).collect::<std::result::Result<Vec<_>, _>>()
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Internal(format!("{kind} by {algo}: bad schedule: {e}")))?;
        let crowded = place.crowding().iter().any(|c| *c > 1.0);
        Ok(Costing { place: place.clone(), programs, orders, esize, kind, algo, crowded })
    }

    /// Whether a host of the layout has more ranks than cores.
    pub fn crowded(&self) -> bool {
        self.crowded
    }

    /// The predicted time under `model`, in seconds.
    pub fn time(&self, model: &CostModel) -> f64 {
        let weights = model.factors(self.kind, self.algo, self.crowded);
        cost(model, weights, self)
    }

    /// The protocol message `j` of step `s` of rank `r` travels by, as the executor would
    /// choose it (`protocol::for_send` and `protocol::expected`): the same function, with
    /// the link classes' facts.
    fn protocol(&self, r: usize, s: usize, j: usize) -> Option<Protocol> {
        let step = &self.programs[r].steps[s];
        let allowed = self.place.protocols.for_kind(self.kind);
        match step.ops[j] {
            Op::Send { peer, src } => {
                let sole = step.ops.iter().filter(|op| !matches!(op, Op::Recv { .. })).count() == 1;
                let m = Outgoing {
                    len: src.len * self.esize,
                    has_dependents: self.orders[r][s].has_dependents(j),
                    sole_one_way: self.kind.one_way() && !self.crowded && sole,
                    plain: !self.kind.combines() && (!self.crowded || !self.kind.one_way()),
                    pull_min: self.place.pull_min,
                };
                Some(protocol::for_send(&m, &self.place.link(r, peer), allowed))
            }
            Op::Recv { peer, dst, .. } => Some(protocol::expected(
                dst.len * self.esize,
                &self.place.link(r, peer),
                self.place.pull_min,
                allowed,
            )),
            Op::Copy { .. } => None,
        }
    }
}

/// The predicted time of `programs` with the latency terms weighted by `weights.0` and the
/// bandwidth terms by `weights.1`.
fn cost(model: &CostModel, weights: (f64, f64), c: &Costing) -> f64 {
    let (place, programs, esize) = (&c.place, &c.programs, c.esize);
    let (wl, wb) = weights;
    let steps = programs.iter().map(|p| p.steps.len()).max().unwrap_or(0);
    let inter = model.of(place.inter);
    let nhosts = place.hosts.iter().max().map_or(0, |h| h + 1);
    let crowding = place.crowding();
    let mut total = 0.0;
    for s in 0..steps {
        let mut slowest = 0.0f64;
        // Bytes each host sends to and receives from other hosts: they share its one link.
        let mut host_out = vec![0.0f64; nhosts];
        let mut host_in = vec![0.0f64; nhosts];
        for (r, p) in programs.iter().enumerate() {
            let Some(step) = p.steps.get(s) else { continue };
            let (mut msgs, mut out, mut inn, mut work, mut waits) = (0.0, 0.0, 0.0, 0.0, 0.0);
            for (j, op) in step.ops.iter().enumerate() {
                let (pl, pb) = c.protocol(r, s, j).map_or((1.0, 1.0), |p| model.protocol_factors(p));
                match *op {
                    Op::Send { peer, src } => {
                        let bytes = (src.len * esize) as f64;
                        let c = model.of(place.class(r, peer));
                        msgs += c.alpha * pl;
                        if place.hosts[r] == place.hosts[peer] {
                            out += bytes * c.beta * pb;
                        } else {
                            host_out[place.hosts[r]] += bytes;
                        }
                    }
                    Op::Recv { peer, dst, with } => {
                        let bytes = (dst.len * esize) as f64;
                        waits += 1.0;
                        if place.hosts[r] == place.hosts[peer] {
                            inn += bytes * model.of(place.class(r, peer)).beta * pb;
                        } else {
                            host_in[place.hosts[r]] += bytes;
                        }
                        if with.is_some() {
                            work += bytes * model.of(place.intra).gamma;
                        }
                    }
                    Op::Copy { dst, .. } => work += (dst.len * esize) as f64 * model.of(place.intra).delta,
                }
            }
            let crowd = crowding[r];
            let handoff = if crowd > 1.0 { model.switch * waits } else { 0.0 };
            let latency = msgs * crowd + handoff;
            let bandwidth = (f64::max(out, inn) + work) * crowd;
            slowest = slowest.max(wl * latency + wb * bandwidth);
        }
        let busiest_host = host_out.iter().chain(&host_in).fold(0.0f64, |m, b| m.max(*b));
        total += slowest.max(wb * busiest_host * inter.beta) + forwarding(model, weights, c, s);
    }
    total
}

/// The latency of forwarding in step `s`: the longest chain of ranks that pass on what
/// they receive, times one segment's hop.
fn forwarding(model: &CostModel, (wl, wb): (f64, f64), c: &Costing, s: usize) -> f64 {
    let (place, programs, esize) = (&c.place, &c.programs, c.esize);
    let n = programs.len();
    // For each rank, the peers whose messages it forwards and the cost of one hop to it.
    let mut feeds: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
    for (r, p) in programs.iter().enumerate() {
        let Some(step) = p.steps.get(s) else { continue };
        let order = &c.orders[r][s];
        // A receive is forwarded when a later send follows it by the ordering rule.
        let mut forwarded = vec![false; step.ops.len()];
        for (j, op) in step.ops.iter().enumerate() {
            if matches!(op, Op::Send { .. }) {
                for &(i, how) in order.follows(j) {
                    forwarded[i] |= how != Follow::InOrder && matches!(step.ops[i], Op::Recv { .. });
                }
            }
        }
        for (i, op) in step.ops.iter().enumerate() {
            let Op::Recv { peer, dst, .. } = *op else { continue };
            if forwarded[i] {
                let (pl, pb) = c.protocol(r, s, i).map_or((1.0, 1.0), |p| model.protocol_factors(p));
                let k = model.of(place.class(r, peer));
                let hop =
                    wl * k.alpha * pl + wb * f64::min((dst.len * esize) as f64, HOP_BYTES) * k.beta * pb;
                feeds[r].push((peer, hop));
            }
        }
    }
    // Longest path by relaxation: chains are at most n long.
    let mut depth = vec![0.0f64; n];
    for _ in 0..n {
        let mut changed = false;
        for r in 0..n {
            let d = feeds[r].iter().map(|&(p, hop)| depth[p] + hop).fold(0.0, f64::max);
            if d > depth[r] + 1e-15 {
                depth[r] = d;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    depth.into_iter().fold(0.0, f64::max)
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
    fn hierarchy_wins_only_when_hosts_are_far_apart() {
        let t = Placement::new(vec![0, 0, 0, 0, 1, 1, 1, 1], vec![8; 8], LinkClass::Shm, LinkClass::Tcp);
        // The ring crosses between hosts in two places only, so with a network a few times
        // slower than shared memory it still wins; with one twenty times slower, crossing once
        // per host (the hierarchy) pays for its slower inside phases.
        let near = rank(&plain(), &t, CollKind::AllReduce, 0, &Shape::Count(1 << 20), 4).unwrap();
        assert_ne!(near.algo, Algorithm::Hierarchical, "{near}");
        let far = CostModel { tcp: LinkCost::new(50.0, 0.3, 7.0, 10.0), ..plain() };
        let c = rank(&far, &t, CollKind::AllReduce, 0, &Shape::Count(1 << 20), 4).unwrap();
        assert_eq!(c.algo, Algorithm::Hierarchical, "{c}");
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
