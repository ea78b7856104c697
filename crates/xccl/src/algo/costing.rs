//! Every rank's schedule of one collective as the tuner prices it (`tune`'s rules of time),
//! held compactly: what the price needs of each operation (what it does, its peer, its
//! length, the protocol the executor would choose, whether a later send forwards what it
//! receives), each distinct step stored once with its peers counted from the rank that runs
//! it (the ring's 4096 ranks run two distinct steps), and each rank's program as runs of one
//! step repeated. Thousands of ranks' programs fit: the 33 million steps of the ring's
//! all-reduce on 4096 ranks, held as steps, took gigabytes.

use rustc_hash::FxHashMap;

use super::tune::{CostModel, Placement};
use super::{Algorithm, Shape, build};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::protocol::{self, Outgoing, Protocol};
use crate::schedule::order::{self, Follow};
use crate::schedule::{Op, Step};

/// Bytes a forwarding rank waits for before passing a message on (the executor's segment).
const HOP_BYTES: f64 = (1 << 20) as f64;

/// What an operation does.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
enum What {
    Send,
    /// A receive; `forwarded` when a later send of its step follows it by a data rule.
    Recv {
        reduce: bool,
        forwarded: bool,
    },
    Copy,
}

/// One operation as the tuner prices it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
struct Priced {
    what: What,
    /// The peer, counted from the rank that runs it (`(peer - rank) mod n`).
    peer: u32,
    /// Elements.
    len: usize,
    /// The protocol the message travels by.
    protocol: Option<Protocol>,
}

/// What pricing a step works with, kept from one step to the next.
#[derive(Default)]
struct Scratch {
    acc: Vec<order::Access>,
    /// Per operation: a later one follows it by a data rule; a later send does.
    dependents: Vec<bool>,
    forwarded: Vec<bool>,
    /// The step priced.
    out: Vec<Priced>,
}

/// Every rank's schedule of one collective, built once and costed under any constants (what
/// calibration needs).
#[derive(Clone, Debug)]
pub struct Costing {
    place: Placement,
    /// The distinct steps, as ranges of `ops`.
    steps: Vec<(u32, u32)>,
    ops: Vec<Priced>,
    /// Per rank, its steps as runs of `(step, times)`.
    programs: Vec<Vec<(u32, u32)>>,
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
        let crowded = place.crowding().iter().any(|c| *c > 1.0);
        let mut c = Costing {
            place: place.clone(),
            steps: Vec::new(),
            ops: Vec::new(),
            programs: Vec::with_capacity(n),
            esize,
            kind,
            algo,
            crowded,
        };
        let mut index: FxHashMap<Box<[Priced]>, u32> = FxHashMap::default();
        let mut scratch = Scratch::default();
        for r in 0..n {
            let p = build(kind, algo, r, &place.hosts, root, shape)?;
            let mut runs: Vec<(u32, u32)> = Vec::new();
            for step in &p.steps {
                c.price(r, step, &mut scratch)
                    .map_err(|e| Error::Internal(format!("{kind} by {algo}: bad schedule: {e}")))?;
                let priced = &scratch.out;
                let id = match index.get(priced.as_slice()) {
                    Some(&id) => id,
                    None => {
                        let id = c.steps.len() as u32;
                        let start = c.ops.len() as u32;
                        c.ops.extend_from_slice(priced);
                        c.steps.push((start, c.ops.len() as u32));
                        index.insert(priced.as_slice().into(), id);
                        id
                    }
                };
                match runs.last_mut() {
                    Some((last, times)) if *last == id => *times += 1,
                    _ => runs.push((id, 1)),
                }
            }
            c.programs.push(runs);
        }
        Ok(c)
    }

    /// Whether a host of the layout has more ranks than cores.
    pub fn crowded(&self) -> bool {
        self.crowded
    }

    /// The predicted time under `model`, in seconds.
    pub fn time(&self, model: &CostModel) -> f64 {
        let weights = model.factors(self.kind, self.algo, self.crowded);
        self.cost(model, weights)
    }

    /// `step` of rank `r` as the tuner prices it, in `s.out`: which sends have dependents and
    /// which receives are forwarded by the ordering rule (`schedule::order`), and the
    /// protocol of each message as the executor would choose it (`protocol::for_send` and
    /// `protocol::expected`: the same functions, with the link classes' facts).
    fn price(&self, r: usize, step: &Step, s: &mut Scratch) -> std::result::Result<(), String> {
        let n = self.place.hosts.len();
        s.acc.clear();
        for op in &step.ops {
            s.acc.push(order::checked_access(op, false)?);
        }
        // Which operations a later one follows by a data rule, and which receives a later
        // send does.
        let (dependents, forwarded) = (&mut s.dependents, &mut s.forwarded);
        dependents.clear();
        dependents.resize(s.acc.len(), false);
        forwarded.clear();
        forwarded.resize(s.acc.len(), false);
        for (j, later) in s.acc.iter().enumerate() {
            for (i, earlier) in s.acc[..j].iter().enumerate() {
                if matches!(order::follow(earlier, later), Some(Follow::Segments | Follow::Whole)) {
                    dependents[i] = true;
                    forwarded[i] |= matches!(step.ops[j], Op::Send { .. });
                }
            }
        }
        let sole = step.ops.iter().filter(|op| !matches!(op, Op::Recv { .. })).count() == 1;
        let allowed = self.place.protocols.for_kind(self.kind);
        s.out.clear();
        for (j, op) in step.ops.iter().enumerate() {
            let relative = |peer: usize| ((peer + n - r) % n) as u32;
            s.out.push(match *op {
                Op::Send { peer, src } => {
                    let m = Outgoing {
                        len: src.len * self.esize,
                        has_dependents: s.dependents[j],
                        sole_one_way: self.kind.one_way() && !self.crowded && sole,
                        plain: !self.kind.combines() && (!self.crowded || !self.kind.one_way()),
                        pull_min: self.place.pull_min,
                    };
                    let protocol = Some(protocol::for_send(&m, &self.place.link(r, peer), allowed));
                    Priced { what: What::Send, peer: relative(peer), len: src.len, protocol }
                }
                Op::Recv { peer, dst, with } => Priced {
                    what: What::Recv { reduce: with.is_some(), forwarded: s.forwarded[j] },
                    peer: relative(peer),
                    len: dst.len,
                    protocol: Some(protocol::expected(
                        dst.len * self.esize,
                        &self.place.link(r, peer),
                        self.place.pull_min.combining,
                        allowed,
                    )),
                },
                Op::Copy { dst, .. } => Priced { what: What::Copy, peer: 0, len: dst.len, protocol: None },
            });
        }
        Ok(())
    }

    /// Every rank's step `s` in turn: `f(rank, its operations)`, for the ranks that have
    /// one. `at` holds each rank's place in its runs, step after step.
    fn each_rank(&self, at: &mut [(u32, u32)], mut f: impl FnMut(usize, &[Priced])) {
        for (r, runs) in self.programs.iter().enumerate() {
            let (run, done) = &mut at[r];
            let Some(&(id, times)) = runs.get(*run as usize) else { continue };
            let (a, b) = self.steps[id as usize];
            f(r, &self.ops[a as usize..b as usize]);
            *done += 1;
            if *done == times {
                (*run, *done) = (*run + 1, 0);
            }
        }
    }

    /// The absolute peer of an operation of rank `r`.
    fn peer(&self, r: usize, op: &Priced) -> usize {
        (r + op.peer as usize) % self.programs.len()
    }

    /// The predicted time with the latency terms weighted by `weights.0` and the bandwidth
    /// terms by `weights.1`.
    fn cost(&self, model: &CostModel, (wl, wb): (f64, f64)) -> f64 {
        let (place, esize) = (&self.place, self.esize);
        let steps = self.programs.iter().map(|p| p.iter().map(|run| run.1 as usize).sum()).max().unwrap_or(0);
        let inter = model.of(place.inter);
        let nhosts = place.hosts.iter().max().map_or(0, |h| h + 1);
        let crowding = place.crowding();
        let mut total = 0.0;
        let (mut at, mut fwd_at) = (vec![(0, 0); self.programs.len()], vec![(0, 0); self.programs.len()]);
        for _ in 0..steps {
            let mut slowest = 0.0f64;
            // Bytes each host sends to and receives from other hosts: they share its one link.
            let mut host_out = vec![0.0f64; nhosts];
            let mut host_in = vec![0.0f64; nhosts];
            self.each_rank(&mut at, |r, ops| {
                let (mut msgs, mut out, mut inn, mut work, mut waits) = (0.0, 0.0, 0.0, 0.0, 0.0);
                for op in ops {
                    let (pl, pb) = op.protocol.map_or((1.0, 1.0), |p| model.protocol_factors(p));
                    let (peer, bytes) = (self.peer(r, op), (op.len * esize) as f64);
                    match op.what {
                        What::Send => {
                            let c = model.of(place.class(r, peer));
                            msgs += c.alpha * pl;
                            if place.hosts[r] == place.hosts[peer] {
                                out += bytes * c.beta * pb;
                            } else {
                                host_out[place.hosts[r]] += bytes;
                            }
                        }
                        What::Recv { reduce, .. } => {
                            waits += 1.0;
                            if place.hosts[r] == place.hosts[peer] {
                                inn += bytes * model.of(place.class(r, peer)).beta * pb;
                            } else {
                                host_in[place.hosts[r]] += bytes;
                            }
                            if reduce {
                                work += bytes * model.of(place.intra).gamma;
                            }
                        }
                        What::Copy => work += bytes * model.of(place.intra).delta,
                    }
                }
                let crowd = crowding[r];
                let handoff = if crowd > 1.0 { model.switch * waits } else { 0.0 };
                let latency = msgs * crowd + handoff;
                let bandwidth = (f64::max(out, inn) + work) * crowd;
                slowest = slowest.max(wl * latency + wb * bandwidth);
            });
            let busiest_host = host_out.iter().chain(&host_in).fold(0.0f64, |m, b| m.max(*b));
            total +=
                slowest.max(wb * busiest_host * inter.beta) + self.forwarding(model, (wl, wb), &mut fwd_at);
        }
        total
    }

    /// The latency of forwarding in the next step (`at`: each rank's place in its runs):
    /// the longest chain of ranks that pass on what they receive, times one segment's hop.
    fn forwarding(&self, model: &CostModel, (wl, wb): (f64, f64), at: &mut [(u32, u32)]) -> f64 {
        let (place, esize) = (&self.place, self.esize);
        let n = self.programs.len();
        // For each rank, the peers whose messages it forwards and the cost of one hop to it.
        let mut feeds: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
        self.each_rank(at, |r, ops| {
            for op in ops {
                if let What::Recv { forwarded: true, .. } = op.what {
                    let peer = self.peer(r, op);
                    let (pl, pb) = op.protocol.map_or((1.0, 1.0), |p| model.protocol_factors(p));
                    let k = model.of(place.class(r, peer));
                    let hop =
                        wl * k.alpha * pl + wb * f64::min((op.len * esize) as f64, HOP_BYTES) * k.beta * pb;
                    feeds[r].push((peer, hop));
                }
            }
        });
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
}
