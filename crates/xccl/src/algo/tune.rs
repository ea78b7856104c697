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
//! the hand-off by `XCCL_TUNE_SWITCH_US`.

use std::fmt;

use super::{Algorithm, Shape, build};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::protocol::{self, LinkFacts, Outgoing, Protocol, ProtocolPolicy};
use crate::schedule::order::{Follow, StepOrder};
use crate::schedule::{Op, Program};

/// Kinds of link between two ranks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LinkClass {
    /// Threads of one process.
    Local,
    /// Processes of one host, through shared memory.
    Shm,
    /// TCP (between hosts, or on one host with shared memory off).
    Tcp,
}

/// The cost constants of one link class.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct LinkCost {
    /// Seconds per message.
    pub alpha: f64,
    /// Seconds per byte moved.
    pub beta: f64,
    /// Seconds per byte reduced.
    pub gamma: f64,
    /// Seconds per byte copied locally.
    pub delta: f64,
}

/// Bytes a forwarding rank waits for before passing a message on (the executor's segment).
const HOP_BYTES: f64 = (1 << 20) as f64;

impl LinkCost {
    /// Constants from a latency in µs and rates in GB/s.
    pub fn new(alpha_us: f64, move_gbps: f64, reduce_gbps: f64, copy_gbps: f64) -> LinkCost {
        LinkCost {
            alpha: alpha_us * 1e-6,
            beta: 1e-9 / move_gbps,
            gamma: 1e-9 / reduce_gbps,
            delta: 1e-9 / copy_gbps,
        }
    }

    fn parse(name: &str, v: &str) -> Result<LinkCost> {
        let nums: Vec<f64> =
            v.split(',').map(|x| x.trim().parse::<f64>()).collect::<std::result::Result<_, _>>().map_err(
                |_| Error::Config(format!("{name}='{v}' is not alpha_us,beta_gbps,gamma_gbps,delta_gbps")),
            )?;
        match nums[..] {
            [a, b, g, d] if nums.iter().all(|x| x.is_finite() && *x > 0.0) => Ok(LinkCost::new(a, b, g, d)),
            _ => Err(Error::Config(format!(
                "{name}='{v}' needs four positive numbers: alpha_us,beta_gbps,gamma_gbps,delta_gbps"
            ))),
        }
    }
}

/// How one algorithm's implementation of one collective runs compared with what the cost
/// of its schedule says: factors on the latency terms (`alpha`, hand-offs, forwarding hops)
/// and on the bandwidth terms (`beta`, `gamma`, `delta`), on hosts with a core per rank or
/// on crowded ones. They capture what a schedule's counts cannot: how much of a step's
/// traffic really overlaps, how caches fare, how ranks that share cores interleave.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Efficiency {
    /// The collective.
    pub kind: CollKind,
    /// The algorithm.
    pub algo: Algorithm,
    /// For hosts with more ranks than cores.
    pub crowded: bool,
    /// Factor on the latency terms.
    pub latency: f64,
    /// Factor on the bandwidth terms.
    pub bandwidth: f64,
}

/// The constants of every link class, and the algorithms' efficiencies.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Threads of one process.
    pub local: LinkCost,
    /// Shared memory.
    pub shm: LinkCost,
    /// TCP.
    pub tcp: LinkCost,
    /// Seconds each message a rank waits for costs on a crowded host (more ranks than cores),
    /// for handing the core over to its sender.
    pub switch: f64,
    /// Efficiencies; an algorithm absent here has factors of 1.
    pub efficiency: Vec<Efficiency>,
    /// Per protocol, factors on the latency and bandwidth of its messages (a protocol
    /// absent here has factors of 1): what LL saves per message, say.
    pub protocols: Vec<(Protocol, f64, f64)>,
}

/// The constants fitted on the reference machine (2 vCPU Zen 3 guest, shared memory between
/// processes, loopback TCP) by `xccl tune fit`; see docs/PERFORMANCE.md.
const REFERENCE: &str = include_str!("reference.tune");

impl Default for CostModel {
    /// The constants calibrated on the reference machine.
    fn default() -> Self {
        let base = CostModel {
            local: LinkCost::new(1.5, 6.0, 7.0, 10.0),
            shm: LinkCost::new(1.5, 6.0, 7.0, 10.0),
            tcp: LinkCost::new(25.0, 1.6, 7.0, 10.0),
            switch: 20e-6,
            efficiency: Vec::new(),
            protocols: Vec::new(),
        };
        // The embedded file is checked by a test; a broken one would leave the base model.
        base.clone().with_text("reference.tune", REFERENCE).unwrap_or(base)
    }
}

impl CostModel {
    /// Defaults, then the tuning file `XCCL_TUNE_FILE` (as `xccl tune fit -o` writes it),
    /// then `XCCL_TUNE_LOCAL`, `XCCL_TUNE_SHM`, `XCCL_TUNE_TCP` and `XCCL_TUNE_SWITCH_US`.
    /// Every rank must use the same constants (they choose algorithms).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<CostModel> {
        let mut m = CostModel::default();
        if let Some(path) = lookup("XCCL_TUNE_FILE") {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::Config(format!("XCCL_TUNE_FILE={path}: cannot read it: {e}")))?;
            m = m.with_text(&path, &text)?;
        }
        for (name, slot) in
            [("XCCL_TUNE_LOCAL", &mut m.local), ("XCCL_TUNE_SHM", &mut m.shm), ("XCCL_TUNE_TCP", &mut m.tcp)]
        {
            if let Some(v) = lookup(name) {
                *slot = LinkCost::parse(name, &v)?;
            }
        }
        if let Some(v) = lookup("XCCL_TUNE_SWITCH_US") {
            m.switch = parse_us("XCCL_TUNE_SWITCH_US", &v)?;
        }
        Ok(m)
    }

    /// This model with the settings of a tuning file (`name` names it in errors). Lines:
    /// `link CLASS ALPHA_US BETA_GBPS GAMMA_GBPS DELTA_GBPS`, `switch US`,
    /// `efficiency COLLECTIVE ALGORITHM spread|crowded LATENCY BANDWIDTH`,
    /// `protocol PROTOCOL LATENCY BANDWIDTH`; `#` starts a comment.
    pub fn with_text(mut self, name: &str, text: &str) -> Result<CostModel> {
        for (no, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| Error::Config(format!("{name}:{}: {what}: '{line}'", no + 1));
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |s: &str| s.parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0);
            match f[..] {
                ["link", class, a, b, g, d] => {
                    let slot = match class {
                        "local" => &mut self.local,
                        "shm" => &mut self.shm,
                        "tcp" => &mut self.tcp,
                        _ => return Err(bad("unknown link class (local, shm, tcp)")),
                    };
                    let (Some(a), Some(b), Some(g), Some(d)) = (num(a), num(b), num(g), num(d)) else {
                        return Err(bad("link constants must be positive numbers"));
                    };
                    *slot = LinkCost::new(a, b, g, d);
                }
                ["switch", us] => self.switch = parse_us(name, us).map_err(|_| bad("not microseconds"))?,
                ["efficiency", coll, algo, regime, lat, bw] => {
                    let kind = CollKind::named(coll).ok_or_else(|| bad("unknown collective"))?;
                    let algo: Algorithm = algo.parse().map_err(|e: Error| bad(&e.to_string()))?;
                    if !Algorithm::for_collective(kind).contains(&algo) {
                        return Err(bad(&format!("{kind} has no {algo} algorithm")));
                    }
                    let crowded = match regime {
                        "spread" => false,
                        "crowded" => true,
                        _ => return Err(bad("the regime is spread or crowded")),
                    };
                    let (Some(latency), Some(bandwidth)) = (num(lat), num(bw)) else {
                        return Err(bad("factors must be positive numbers"));
                    };
                    self.efficiency.retain(|e| (e.kind, e.algo, e.crowded) != (kind, algo, crowded));
                    self.efficiency.push(Efficiency { kind, algo, crowded, latency, bandwidth });
                }
                ["protocol", name, lat, bw] => {
                    let proto: Protocol = name.parse().map_err(|e: Error| bad(&e.to_string()))?;
                    let (Some(latency), Some(bandwidth)) = (num(lat), num(bw)) else {
                        return Err(bad("factors must be positive numbers"));
                    };
                    self.protocols.retain(|p| p.0 != proto);
                    self.protocols.push((proto, latency, bandwidth));
                }
                _ => return Err(bad("not a link, switch, efficiency or protocol line")),
            }
        }
        Ok(self)
    }

    /// The factors (latency, bandwidth) on messages that travel by `p`.
    pub fn protocol_factors(&self, p: Protocol) -> (f64, f64) {
        self.protocols.iter().find(|q| q.0 == p).map_or((1.0, 1.0), |q| (q.1, q.2))
    }

    /// The model as a tuning file, which [`CostModel::with_text`] reads back.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (name, c) in [("local", &self.local), ("shm", &self.shm), ("tcp", &self.tcp)] {
            out += &format!(
                "link {name} {:.4} {:.4} {:.4} {:.4}\n",
                c.alpha * 1e6,
                1e-9 / c.beta,
                1e-9 / c.gamma,
                1e-9 / c.delta
            );
        }
        out += &format!("switch {:.4}\n", self.switch * 1e6);
        for (p, lat, bw) in &self.protocols {
            out += &format!("protocol {p} {lat:.4} {bw:.4}\n");
        }
        for e in &self.efficiency {
            let regime = if e.crowded { "crowded" } else { "spread" };
            out += &format!(
                "efficiency {} {} {regime} {:.4} {:.4}\n",
                e.kind.name(),
                e.algo,
                e.latency,
                e.bandwidth
            );
        }
        out
    }

    /// The efficiency factors (latency, bandwidth) of `algo` running `kind`.
    pub fn factors(&self, kind: CollKind, algo: Algorithm, crowded: bool) -> (f64, f64) {
        self.efficiency
            .iter()
            .find(|e| (e.kind, e.algo, e.crowded) == (kind, algo, crowded))
            .map_or((1.0, 1.0), |e| (e.latency, e.bandwidth))
    }

    fn of(&self, class: LinkClass) -> &LinkCost {
        match class {
            LinkClass::Local => &self.local,
            LinkClass::Shm => &self.shm,
            LinkClass::Tcp => &self.tcp,
        }
    }
}

fn parse_us(name: &str, v: &str) -> Result<f64> {
    match v.trim().parse::<f64>() {
        Ok(us) if us.is_finite() && us >= 0.0 => Ok(us * 1e-6),
        _ => Err(Error::Config(format!("{name}='{v}' is not a number of microseconds"))),
    }
}

/// What the tuner knows about a communicator: which rank is on which host and how ranks
/// are linked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
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

impl Topology {
    /// `n` ranks on one host of `cores` cores, linked by `intra`, with the default protocols.
    pub fn one_host(n: usize, cores: usize, intra: LinkClass) -> Topology {
        Topology::new(vec![0; n], vec![cores; n], intra, LinkClass::Tcp)
    }

    /// Ranks on `hosts` with `cores`, linked by `intra` inside hosts and `inter` between
    /// them, with the default protocols.
    pub fn new(hosts: Vec<usize>, cores: Vec<usize>, intra: LinkClass, inter: LinkClass) -> Topology {
        Topology {
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
    topo: &Topology,
    kind: CollKind,
    algo: Algorithm,
    root: usize,
    shape: &Shape,
    esize: usize,
) -> Result<f64> {
    Ok(Costing::new(topo, kind, algo, root, shape, esize)?.time(model))
}

/// Every rank's schedule of one collective, built once and costed under any constants (what
/// calibration needs).
#[derive(Clone, Debug)]
pub struct Costing {
    topo: Topology,
    programs: Vec<Program>,
    /// Per rank and step, what follows what (`schedule::order`).
    orders: Vec<Vec<StepOrder>>,
    esize: usize,
    kind: CollKind,
    algo: Algorithm,
    crowded: bool,
}

impl Costing {
    /// The schedules of `algo` running `kind` on `topo` with this layout.
    pub fn new(
        topo: &Topology,
        kind: CollKind,
        algo: Algorithm,
        root: usize,
        shape: &Shape,
        esize: usize,
    ) -> Result<Costing> {
        let n = topo.hosts.len();
        let programs =
            (0..n).map(|r| build(kind, algo, r, &topo.hosts, root, shape)).collect::<Result<Vec<_>>>()?;
        let orders = programs
            .iter()
            .map(|p| {
                p.steps.iter().map(|s| StepOrder::of(s, false)).collect::<std::result::Result<Vec<_>, _>>()
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Internal(format!("{kind} by {algo}: bad schedule: {e}")))?;
        let crowded = topo.crowding().iter().any(|c| *c > 1.0);
        Ok(Costing { topo: topo.clone(), programs, orders, esize, kind, algo, crowded })
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
        let allowed = self.topo.protocols.for_kind(self.kind);
        match step.ops[j] {
            Op::Send { peer, src } => {
                let sole = step.ops.iter().filter(|op| !matches!(op, Op::Recv { .. })).count() == 1;
                let m = Outgoing {
                    len: src.len * self.esize,
                    has_dependents: self.orders[r][s].has_dependents(j),
                    sole_one_way: self.kind.one_way() && !self.crowded && sole,
                    plain: !self.kind.combines() && (!self.crowded || !self.kind.one_way()),
                    pull_min: self.topo.pull_min,
                };
                Some(protocol::for_send(&m, &self.topo.link(r, peer), allowed))
            }
            Op::Recv { peer, dst, .. } => Some(protocol::expected(
                dst.len * self.esize,
                &self.topo.link(r, peer),
                self.topo.pull_min,
                allowed,
            )),
            Op::Copy { .. } => None,
        }
    }
}

/// The predicted time of `programs` with the latency terms weighted by `weights.0` and the
/// bandwidth terms by `weights.1`.
fn cost(model: &CostModel, weights: (f64, f64), c: &Costing) -> f64 {
    let (topo, programs, esize) = (&c.topo, &c.programs, c.esize);
    let (wl, wb) = weights;
    let steps = programs.iter().map(|p| p.steps.len()).max().unwrap_or(0);
    let inter = model.of(topo.inter);
    let nhosts = topo.hosts.iter().max().map_or(0, |h| h + 1);
    let crowding = topo.crowding();
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
                        let c = model.of(topo.class(r, peer));
                        msgs += c.alpha * pl;
                        if topo.hosts[r] == topo.hosts[peer] {
                            out += bytes * c.beta * pb;
                        } else {
                            host_out[topo.hosts[r]] += bytes;
                        }
                    }
                    Op::Recv { peer, dst, with } => {
                        let bytes = (dst.len * esize) as f64;
                        waits += 1.0;
                        if topo.hosts[r] == topo.hosts[peer] {
                            inn += bytes * model.of(topo.class(r, peer)).beta * pb;
                        } else {
                            host_in[topo.hosts[r]] += bytes;
                        }
                        if with.is_some() {
                            work += bytes * model.of(topo.intra).gamma;
                        }
                    }
                    Op::Copy { dst, .. } => work += (dst.len * esize) as f64 * model.of(topo.intra).delta,
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
    let (topo, programs, esize) = (&c.topo, &c.programs, c.esize);
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
                let k = model.of(topo.class(r, peer));
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
    topo: &Topology,
    kind: CollKind,
    root: usize,
    shape: &Shape,
    esize: usize,
) -> Result<Choice> {
    let n = topo.hosts.len();
    let mut ranking = Vec::new();
    for &algo in Algorithm::for_collective(kind) {
        if algo.supports(kind, n, shape) {
            ranking.push((algo, predict(model, topo, kind, algo, root, shape, esize)?));
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

    fn topo(n: usize) -> Topology {
        Topology::one_host(n, 64, LinkClass::Shm)
    }

    /// The reference link constants without the algorithms' efficiencies or the protocols'
    /// factors.
    fn plain() -> CostModel {
        CostModel { efficiency: Vec::new(), protocols: Vec::new(), ..CostModel::default() }
    }

    #[test]
    fn the_reference_tuning_parses_and_round_trips() {
        let base = plain();
        let reference = base.clone().with_text("reference.tune", REFERENCE).unwrap();
        assert_eq!(reference, CostModel::default());
        let again = base.with_text("again", &reference.to_text()).unwrap();
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-3;
        assert!(close(again.shm.beta, reference.shm.beta) && close(again.switch, reference.switch));
        assert_eq!(again.efficiency.len(), reference.efficiency.len());
        assert_eq!(again.protocols, reference.protocols);
        assert_eq!(reference.protocol_factors(Protocol::Ll).0, 0.6);
        for (a, b) in again.efficiency.iter().zip(&reference.efficiency) {
            assert_eq!((a.kind, a.algo, a.crowded), (b.kind, b.algo, b.crowded));
            assert!(close(a.latency, b.latency) && close(a.bandwidth, b.bandwidth));
        }
    }

    #[test]
    fn tuning_files_say_which_line_is_wrong() {
        for (text, want) in [
            ("link fiber 1 2 3 4", "unknown link class"),
            ("link shm 1 2 -3 4", "positive"),
            ("efficiency all_reduce teleport spread 1 1", "teleport"),
            ("efficiency broadcast ring spread 1 1", "no ring"),
            ("efficiency all_reduce ring sideways 1 1", "spread or crowded"),
            ("switch x", "microseconds"),
            ("# fine\nbogus", "line 2"),
        ] {
            let err = plain().with_text("t.tune", text).unwrap_err().to_string();
            let want = want.replace("line 2", "t.tune:2");
            assert!(err.contains(&want), "{text}: {err}");
        }
    }

    #[test]
    fn efficiencies_change_the_pick() {
        let m = plain();
        let count = Shape::Count(4 << 20);
        let base = rank(&m, &topo(8), CollKind::AllReduce, 0, &count, 4).unwrap();
        let slow = Efficiency {
            kind: CollKind::AllReduce,
            algo: base.algo,
            crowded: false,
            latency: 1.0,
            bandwidth: 10.0,
        };
        let m2 = CostModel { efficiency: vec![slow], ..m };
        let other = rank(&m2, &topo(8), CollKind::AllReduce, 0, &count, 4).unwrap();
        assert_ne!(other.algo, base.algo, "{other}");
    }

    #[test]
    fn small_messages_prefer_few_rounds_and_large_ones_bandwidth() {
        let m = CostModel::default();
        let small = rank(&m, &topo(8), CollKind::AllReduce, 0, &Shape::Count(2), 4).unwrap();
        assert!(matches!(small.algo, Algorithm::RecursiveDoubling | Algorithm::Rabenseifner), "{small}");
        let large = rank(&m, &topo(8), CollKind::AllReduce, 0, &Shape::Count(16 << 20), 4).unwrap();
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
        let t = predict(&m, &topo(n), CollKind::AllReduce, Algorithm::Ring, 0, &Shape::Count(bytes / 4), 4)
            .unwrap();
        let nf = n as f64;
        let want = 2.0 * (nf - 1.0) * 10e-6
            + 2.0 * (nf - 1.0) / nf * bytes as f64 * 1e-9
            + (nf - 1.0) / nf * bytes as f64 * 0.5e-9;
        assert!((t - want).abs() / want < 1e-9, "{t} vs {want}");
    }

    #[test]
    fn hierarchy_wins_only_when_hosts_are_far_apart() {
        let t = Topology::new(vec![0, 0, 0, 0, 1, 1, 1, 1], vec![8; 8], LinkClass::Shm, LinkClass::Tcp);
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
        let mut stream_only = topo(2);
        stream_only.protocols = ProtocolPolicy::parse("stream").unwrap();
        let t = |topo: &Topology, count: usize| {
            predict(&m, topo, CollKind::AllReduce, Algorithm::RecursiveDoubling, 0, &Shape::Count(count), 4)
                .unwrap()
        };
        // 8 bytes go by LL unless the policy says otherwise; 256 KiB never do.
        assert!(t(&topo(2), 2) < 0.6 * t(&stream_only, 2), "{} {}", t(&topo(2), 2), t(&stream_only, 2));
        assert_eq!(t(&topo(2), 1 << 16), t(&stream_only, 1 << 16));
        // Over TCP nothing goes by LL.
        let tcp = Topology::one_host(2, 64, LinkClass::Tcp);
        let mut tcp_stream = tcp.clone();
        tcp_stream.protocols = ProtocolPolicy::parse("stream").unwrap();
        assert_eq!(t(&tcp, 2), t(&tcp_stream, 2));
    }

    #[test]
    fn forwarding_chains_pay_one_hop_per_level() {
        let m = CostModel { shm: LinkCost::new(10.0, 1.0, 2.0, 4.0), ..plain() };
        let t = |algo| predict(&m, &topo(8), CollKind::Broadcast, algo, 0, &Shape::Count(1), 4).unwrap();
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
        let crowded = Topology::one_host(8, 2, LinkClass::Shm);
        let c = rank(&m, &crowded, CollKind::AllReduce, 0, &count, 4).unwrap();
        let waits = |a| {
            let p = build(CollKind::AllReduce, a, 0, &[0; 8], 0, &count).unwrap();
            p.steps.iter().flat_map(|s| &s.ops).filter(|o| matches!(o, Op::Recv { .. })).count()
        };
        assert_eq!(waits(Algorithm::Ring), 14);
        assert!(waits(c.algo) < 14, "crowded {c}");
        let ring = |t: &Topology| predict(&m, t, CollKind::AllReduce, Algorithm::Ring, 0, &count, 4).unwrap();
        assert!(ring(&crowded) > 2.0 * ring(&topo(8)));
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
            let t = |shape: &Shape| predict(&m, &topo(n), kind, algo, 0, shape, 4).unwrap();
            // An even call is the uniform layout.
            assert_eq!(t(&Shape::Count(block)), t(&Shape::Scatter(Blocks::uniform(block, n))), "{algo}");
            // The same elements in one rank's block: no link shares that block's traffic.
            assert!(t(&skewed) > 2.0 * t(&Shape::Count(block)), "{algo}");
        }
        let choice = rank(&m, &topo(n), kind, 0, &skewed, 4).unwrap();
        assert_eq!(choice.ranking.len(), Algorithm::for_collective(kind).len(), "{choice}");
    }

    #[test]
    fn constants_parse_or_say_what_is_wrong() {
        let m = CostModel::from_lookup(|k| (k == "XCCL_TUNE_TCP").then(|| "50, 1, 5, 10".into())).unwrap();
        assert_eq!(m.tcp, LinkCost::new(50.0, 1.0, 5.0, 10.0));
        assert!(CostModel::from_lookup(|_| Some("1,2".into())).is_err());
        assert!(CostModel::from_lookup(|_| Some("1,2,x,4".into())).is_err());
        assert!(CostModel::from_lookup(|_| Some("1,-2,3,4".into())).is_err());
        let sw = CostModel::from_lookup(|k| (k == "XCCL_TUNE_SWITCH_US").then(|| "7".into())).unwrap();
        assert!((sw.switch - 7e-6).abs() < 1e-12);
        assert!(CostModel::from_lookup(|k| (k == "XCCL_TUNE_SWITCH_US").then(|| "-1".into())).is_err());
    }
}
