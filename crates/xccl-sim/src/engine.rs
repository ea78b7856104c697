//! The event loop: every rank runs the program the executor would run, step by step, with
//! the step ordering rule of `xccl::schedule::order` deciding when each operation may start.
//!
//! - A step's operations start once the earlier ones they follow allow it; the step ends
//!   when all have ended, and the next starts then. Ranks meet only through messages.
//! - A send costs its rank `alpha` of processor time (sends leave one after another), then
//!   its bytes flow over the route to the receiver's host, sharing links fairly with other
//!   flows ([`Fluid`]); the message arrives after the route's latency. Between ranks of one
//!   host the route is the host's memory, with the shared-memory constants.
//! - Sends and receives between two ranks match in program order. A receive ends when its
//!   message has arrived and it has started, plus `gamma` per byte when it combines.
//! - A local copy takes `delta` per byte.
//! - Following segment by segment (the rule's [`Follow::Segments`]: a send of what is being
//!   received, or a fold into what an earlier fold is writing): the later send or receive
//!   starts once the earlier one has its first segment, and ends no earlier than one
//!   segment's time after it ends (a send: one segment on the wire; a combining receive: one
//!   segment's fold). This is the pipeline's closed form without simulating each segment. A
//!   copy waits for the whole.

use std::collections::VecDeque;
use std::rc::Rc;

use rustc_hash::FxHashMap;
use xccl::CollKind;
use xccl::algo::tune::CostModel;
use xccl::algo::{self, Algorithm, Shape};
use xccl::schedule::Step;
use xccl::schedule::order::Follow;

use crate::network::Fluid;
use crate::ordering::{Orderer, Orders};
use crate::queue::Queue;
use crate::table::{COp, Kind, Table};
use crate::topology::Topology;

/// Bytes of a forwarding segment: the executor's (`XCCL_SEGMENT_BYTES`' default).
pub const SEGMENT: f64 = (1 << 20) as f64;

/// What a simulated collective did.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Seconds until the last rank finished.
    pub time: f64,
    /// Messages sent.
    pub messages: u64,
    /// Bytes carried by each link of the topology.
    pub carried: Vec<f64>,
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Waiting,
    Running,
    Done,
}

/// Per operation of a rank's current step.
#[derive(Clone, Copy)]
struct OpRun {
    state: State,
    /// Earlier operations still in the way.
    blockers: u32,
    /// When its first segment is there (receives) or it may begin forwarding.
    seg_ready: Option<f64>,
    end: f64,
    /// A forwarding send whose flow ended before its source: ends one segment after it.
    held: Option<f64>,
}

struct Msg {
    src: u32,
    dst: u32,
    bytes: f64,
    /// The sending operation (index in the sender's step, which lasts until it ends).
    send_op: u32,
    route: Rc<[u32]>,
    lat: f64,
    /// Bottleneck rate of its route, for the last segment of a forwarded send.
    bottleneck: f64,
    arrived: Option<f64>,
    /// When its first segment is at the receiver (messages longer than a segment).
    first_segment: Option<f64>,
    /// Its flow while it is in flight.
    flow: Option<usize>,
    /// The receiving operation, once matched.
    recv_op: Option<u32>,
    /// A probe for its first segment is pending.
    probing: bool,
    /// Its receive has it all.
    received: bool,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    /// A send leaves its rank's processor.
    Inject { msg: usize },
    /// A message has fully arrived.
    Arrive { msg: usize },
    /// Is the first segment of a long message through yet?
    Probe { msg: usize },
    /// A receive has its first segment: forwarding may begin.
    Segment { rank: u32, op: u32 },
    /// An operation ends.
    End { rank: u32, op: u32 },
}

/// One collective call: what every rank runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The collective.
    pub kind: CollKind,
    /// Its algorithm.
    pub algo: Algorithm,
    /// The root of rooted collectives.
    pub root: usize,
    /// Its layout (element counts).
    pub shape: Shape,
    /// Bytes per element.
    pub esize: usize,
}

/// Simulates `call` with rank `r` on host `placement[r]` of `topo`: the same schedules the
/// executor runs (`algo::build`), with the tuner's constants (`costs`) for what the ranks
/// spend: the TCP class's latency per message between hosts, the shared-memory class's
/// latency, rate (the host's memory, shared by its ranks' messages), reduce and copy costs.
/// The network's rates and latencies are the topology's links.
pub fn simulate(
    topo: &Topology,
    costs: &CostModel,
    placement: &[usize],
    call: &Call,
) -> Result<Outcome, String> {
    simulate_calls(topo, costs, placement, call, 1)
}

/// [`simulate`] with every rank making `calls` of the collective back to back, as a
/// benchmark's loop does: a rank starts the next call when it has finished its part of the
/// last, so where ranks finish at different times (a root, a tree) one call's tail overlaps
/// the next one's start. The outcome is that of all the calls together.
pub fn simulate_calls(
    topo: &Topology,
    costs: &CostModel,
    placement: &[usize],
    call: &Call,
    calls: usize,
) -> Result<Outcome, String> {
    if let Some(&h) = placement.iter().find(|&&h| h >= topo.hosts) {
        return Err(format!("rank placed on host {h} of a topology of {} hosts", topo.hosts));
    }
    let mut orderer = Orderer::default();
    simulate_ordered(topo, costs, placement, call, calls, &mut |s, o| orderer.order(s, o))
}

/// [`simulate_calls`] with the orderings of each step made by `order`.
pub(crate) fn simulate_ordered(
    topo: &Topology,
    costs: &CostModel,
    placement: &[usize],
    call: &Call,
    calls: usize,
    order: &mut dyn FnMut(&Step, &mut Orders) -> Result<(), String>,
) -> Result<Outcome, String> {
    let mut table = Table::new();
    let progs = (0..placement.len())
        .map(|r| {
            let p = algo::build(call.kind, call.algo, r, placement, call.root, &call.shape)
                .map_err(|e| e.to_string())?;
            // The same steps again for each call: messages between two ranks pair up in
            // program order across calls, as the executor's do.
            Ok(table.add(&p, (r, placement.len()), call.esize, order)?.repeat(calls.max(1)))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Sim::new(topo, costs, placement, table, progs).run()
}

/// A route between hosts: its links, latency and bottleneck rate.
type Route = (Rc<[u32]>, f64, f64);

struct Sim<'a> {
    topo: &'a Topology,
    costs: &'a CostModel,
    placement: &'a [usize],
    table: Table,
    /// Per rank, its steps as runs of `(step index in `table`, times)`.
    progs: Vec<Vec<(u32, u32)>>,
    now: f64,
    queue: Queue<Ev>,
    /// Events due now, in the order they were scheduled (after those of the heap, which
    /// were scheduled earlier): lock-step schedules have many.
    due: VecDeque<Ev>,
    fluid: Fluid,
    /// Messages in flight or not yet received (slots are reused), and the free slots.
    msgs: Vec<Msg>,
    free: Vec<usize>,
    /// Messages sent so far.
    sent_count: u64,
    /// Per rank: current step (its run and how many of the run's steps are done),
    /// operations left in it, processor free from, the step's ops.
    step: Vec<(u32, u32)>,
    left: Vec<u32>,
    /// Per rank, its current step's index in the table and its first operation there.
    cur: Vec<(u32, u32)>,
    cpu: Vec<f64>,
    runs: Vec<Vec<OpRun>>,
    /// Per (src, dst): messages sent and not yet matched; receives started and not matched.
    unclaimed: FxHashMap<(u32, u32), VecDeque<usize>>,
    waiting: FxHashMap<(u32, u32), VecDeque<u32>>,
    /// Routes between hosts, with their latency and bottleneck rate, as found.
    routes: FxHashMap<(usize, usize), Route>,
    /// Operations whose blockers are gone, to start now.
    ready: Vec<(u32, u32)>,
    finished: usize,
}

impl<'a> Sim<'a> {
    fn new(
        topo: &'a Topology,
        costs: &'a CostModel,
        placement: &'a [usize],
        table: Table,
        progs: Vec<Vec<(u32, u32)>>,
    ) -> Sim<'a> {
        let n = progs.len();
        // The topology's links, then one memory link per host.
        let mut caps: Vec<f64> = topo.links.iter().map(|l| l.bw).collect();
        caps.extend(std::iter::repeat_n(1.0 / costs.shm.beta, topo.hosts));
        Sim {
            topo,
            costs,
            placement,
            table,
            progs,
            now: 0.0,
            queue: Queue::new(),
            due: VecDeque::new(),
            fluid: Fluid::new(caps),
            msgs: Vec::new(),
            free: Vec::new(),
            sent_count: 0,
            step: vec![(0, 0); n],
            left: vec![0; n],
            cur: vec![(0, 0); n],
            cpu: vec![0.0; n],
            runs: vec![Vec::new(); n],
            unclaimed: FxHashMap::default(),
            waiting: FxHashMap::default(),
            routes: FxHashMap::default(),
            ready: Vec::new(),
            finished: 0,
        }
    }

    fn at(&mut self, t: f64, ev: Ev) {
        if t == self.now {
            self.due.push_back(ev);
            return;
        }
        self.queue.push(t, ev);
    }

    fn run(mut self) -> Result<Outcome, String> {
        for r in 0..self.progs.len() {
            self.enter_step(r as u32);
        }
        self.drain_ready();
        loop {
            let next_ev = if self.due.is_empty() { self.queue.next_time() } else { Some(self.now) };
            let next_flow = self.fluid.next_end(self.now);
            match (next_ev, next_flow) {
                (None, None) => break,
                (Some(te), tf) if tf.is_none_or(|tf| te <= tf) => {
                    self.now = self.now.max(te);
                    // Events scheduled earlier for up to now, then those scheduled now.
                    while self.queue.next_time().is_some_and(|t| t <= self.now) {
                        let Some(bucket) = self.queue.pop_bucket() else { break };
                        for &ev in &bucket {
                            self.handle(ev);
                        }
                        self.queue.recycle(bucket);
                    }
                    while let Some(ev) = self.due.pop_front() {
                        self.handle(ev);
                    }
                }
                (_, Some(tf)) => {
                    self.now = self.now.max(tf);
                    while let Some(tag) = self.fluid.pop_finished(self.now) {
                        self.flow_ended(tag as usize);
                    }
                }
                (Some(_), None) => unreachable!("covered above"),
            }
            self.drain_ready();
        }
        if self.finished < self.progs.len() {
            let stuck: Vec<usize> =
                (0..self.progs.len()).filter(|&r| (self.step[r].0 as usize) < self.progs[r].len()).collect();
            return Err(format!(
                "the schedule deadlocks: ranks {:?} never finish (a receive without its send?)",
                &stuck[..stuck.len().min(8)]
            ));
        }
        let mut carried = self.fluid.carried.clone();
        carried.truncate(self.topo.links.len());
        Ok(Outcome { time: self.now, messages: self.sent_count, carried })
    }

    /// Rank `r` enters its current step (or finishes).
    fn enter_step(&mut self, r: u32) {
        let ri = r as usize;
        loop {
            let Some(&(id, _)) = self.progs[ri].get(self.step[ri].0 as usize) else {
                self.finished += 1;
                return;
            };
            let (a, b) = self.table.step(id);
            self.cur[ri] = (id, a as u32);
            if a == b {
                self.advance(ri);
                continue;
            }
            self.left[ri] = (b - a) as u32;
            let runs = &mut self.runs[ri];
            runs.clear();
            for j in a..b {
                let (d0, d1) = self.table.ops[j].deps;
                runs.push(OpRun {
                    state: State::Waiting,
                    blockers: d1 - d0,
                    seg_ready: None,
                    end: 0.0,
                    held: None,
                });
                if d1 == d0 {
                    self.ready.push((r, (j - a) as u32));
                }
            }
            return;
        }
    }

    /// Rank `ri` is done with its current step.
    fn advance(&mut self, ri: usize) {
        let (run, done) = &mut self.step[ri];
        *done += 1;
        if *done == self.progs[ri][*run as usize].1 {
            (*run, *done) = (*run + 1, 0);
        }
    }

    fn drain_ready(&mut self) {
        while let Some((r, op)) = self.ready.pop() {
            self.start(r, op);
        }
    }

    /// The route from host `a` to host `b` (its memory when they are the same), its latency
    /// and its bottleneck rate.
    fn route(&mut self, a: usize, b: usize) -> Route {
        if let Some(r) = self.routes.get(&(a, b)) {
            return r.clone();
        }
        let r = if a == b {
            (Rc::from(vec![(self.topo.links.len() + a) as u32]), 0.0, 1.0 / self.costs.shm.beta)
        } else {
            let route: Vec<u32> = self.topo.route(a, b).into_iter().map(|l| l as u32).collect();
            let lat = route.iter().map(|&l| self.topo.links[l as usize].lat).sum();
            let bw = route.iter().map(|&l| self.topo.links[l as usize].bw).fold(f64::INFINITY, f64::min);
            (Rc::from(route), lat, bw)
        };
        self.routes.insert((a, b), r.clone());
        r
    }

    /// Rank `r`'s current step (in the table).
    fn cur(&self, r: u32) -> u32 {
        self.cur[r as usize].0
    }

    /// Operation `j` of rank `r`'s current step.
    fn op(&self, r: u32, j: u32) -> COp {
        self.table.ops[self.cur[r as usize].1 as usize + j as usize]
    }

    fn start(&mut self, r: u32, j: u32) {
        let ri = r as usize;
        self.runs[ri][j as usize].state = State::Running;
        let op = self.op(r, j);
        let peer = ((r as usize + op.peer as usize) % self.progs.len()) as u32;
        match op.kind {
            Kind::Copy => {
                let t = self.now + op.bytes * self.costs.shm.delta;
                self.at(t, Ev::End { rank: r, op: j });
            }
            Kind::Send => {
                let (hs, hd) = (self.placement[ri], self.placement[peer as usize]);
                let alpha = if hs == hd { self.costs.shm.alpha } else { self.costs.tcp.alpha };
                let (route, lat, bottleneck) = self.route(hs, hd);
                let m = self.free.pop().unwrap_or(self.msgs.len());
                self.sent_count += 1;
                let send_op = j;
                let msg = Msg {
                    src: r,
                    dst: peer,
                    bytes: op.bytes,
                    send_op,
                    route,
                    lat,
                    bottleneck,
                    arrived: None,
                    first_segment: None,
                    flow: None,
                    recv_op: None,
                    probing: false,
                    received: false,
                };
                if m == self.msgs.len() {
                    self.msgs.push(msg);
                } else {
                    self.msgs[m] = msg;
                }
                let key = (r, peer);
                if let Some(recv) = self.waiting.get_mut(&key).and_then(VecDeque::pop_front) {
                    self.msgs[m].recv_op = Some(recv);
                } else {
                    self.unclaimed.entry(key).or_default().push_back(m);
                }
                let t = self.now.max(self.cpu[ri]) + alpha;
                self.cpu[ri] = t;
                self.at(t, Ev::Inject { msg: m });
            }
            Kind::Recv { .. } => {
                let key = (peer, r);
                match self.unclaimed.get_mut(&key).and_then(VecDeque::pop_front) {
                    Some(m) => {
                        self.msgs[m].recv_op = Some(j);
                        if let Some(t) = self.msgs[m].first_segment {
                            self.at(t.max(self.now), Ev::Segment { rank: r, op: j });
                        }
                        if self.msgs[m].arrived.is_some() {
                            self.receive(m);
                        }
                    }
                    None => self.waiting.entry(key).or_default().push_back(j),
                }
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Inject { msg } => {
                let m = &self.msgs[msg];
                if m.bytes <= 0.0 {
                    let t = self.now + m.lat;
                    self.at(t, Ev::Arrive { msg });
                    self.sent(msg, self.now);
                } else {
                    let (route, bytes, early) = (m.route.clone(), m.bytes, SEGMENT / m.bottleneck.max(1e-30));
                    let id = self.fluid.start(self.now, route, bytes, msg as u64);
                    self.msgs[msg].flow = Some(id);
                    if bytes > SEGMENT {
                        self.msgs[msg].probing = true;
                        self.at(self.now + early, Ev::Probe { msg });
                    }
                }
            }
            Ev::Arrive { msg } => {
                self.msgs[msg].arrived = Some(self.now);
                if self.msgs[msg].recv_op.is_some() {
                    self.receive(msg);
                }
            }
            Ev::Probe { msg } => {
                let Some(flow) = self.msgs[msg].flow else {
                    self.probe_done(msg);
                    return;
                };
                let m = &self.msgs[msg];
                let delivered = m.bytes - self.fluid.remaining(self.now, flow);
                let missing = SEGMENT - delivered;
                if missing > 1e-9 * SEGMENT {
                    let rate = self.fluid.rate(flow);
                    let wait = if rate > 0.0 { missing / rate } else { missing / m.bottleneck.max(1e-30) };
                    // On a link so fast that the rest of the segment takes less than the
                    // clock can tell at this time, it has arrived: probing again at the
                    // same instant would never let time move.
                    if self.now + wait > self.now {
                        self.at(self.now + wait, Ev::Probe { msg });
                        return;
                    }
                }
                let t = self.now + m.lat;
                // The sender has put its first segment out: what follows its send segment by
                // segment may start (it runs until the flow ends, so the operation is current).
                let (src, send_op) = (m.src, m.send_op);
                self.at(self.now, Ev::Segment { rank: src, op: send_op });
                self.msgs[msg].first_segment = Some(t);
                if let Some(j) = self.msgs[msg].recv_op {
                    let dst = self.msgs[msg].dst;
                    self.at(t, Ev::Segment { rank: dst, op: j });
                }
                self.probe_done(msg);
            }
            Ev::Segment { rank, op } => {
                let run = &mut self.runs[rank as usize][op as usize];
                if run.seg_ready.is_none() && run.state != State::Done {
                    run.seg_ready = Some(self.now);
                    self.release(rank, op, true);
                }
            }
            Ev::End { rank, op } => self.end(rank, op),
        }
    }

    /// A flow has delivered its bytes.
    fn flow_ended(&mut self, m: usize) {
        self.msgs[m].flow = None;
        let t = self.now + self.msgs[m].lat;
        self.at(t, Ev::Arrive { msg: m });
        self.sent(m, self.now);
    }

    /// The send of message `m` has put its last byte out at `t`: it ends, unless it
    /// forwards what is still arriving.
    fn sent(&mut self, m: usize, t: f64) {
        let (r, j) = (self.msgs[m].src, self.msgs[m].send_op);
        let ri = r as usize;
        let op = self.op(r, j);
        let last = op.bytes.min(SEGMENT) / self.msgs[m].bottleneck.max(1e-30);
        // Forwarding: no earlier than one segment after what it forwards.
        let mut end = t;
        for &(i, how) in self.table.pairs(self.cur(r), op.deps) {
            if how == Follow::Segments {
                let src = self.runs[ri][i as usize];
                if src.state != State::Done {
                    self.runs[ri][j as usize].held = Some(last);
                    return;
                }
                end = end.max(src.end + last);
            }
        }
        self.at(end, Ev::End { rank: r, op: j });
    }

    /// The receive matched with message `m` has it all: it ends after combining, and no
    /// earlier than one segment's fold after what it follows segment by segment.
    fn receive(&mut self, m: usize) {
        let (r, Some(j)) = (self.msgs[m].dst, self.msgs[m].recv_op) else { return };
        let op = self.op(r, j);
        let gamma = match op.kind {
            Kind::Recv { reduce: true } => self.costs.shm.gamma,
            _ => 0.0,
        };
        let mut end = self.msgs[m].arrived.unwrap_or(self.now).max(self.now) + op.bytes * gamma;
        let last = op.bytes.min(SEGMENT) * gamma;
        let ri = r as usize;
        let mut held = false;
        for &(i, how) in self.table.pairs(self.cur(r), op.deps) {
            if how == Follow::Segments {
                let src = self.runs[ri][i as usize];
                if src.state == State::Done {
                    end = end.max(src.end + last);
                } else {
                    held = true;
                }
            }
        }
        if held {
            // Ends when what it follows has ended (`end` below), if it has arrived by then.
            self.runs[ri][j as usize].held = Some(last);
            self.runs[ri][j as usize].end = end;
        } else {
            self.at(end, Ev::End { rank: r, op: j });
        }
        // Sent, arrived and received: its slot is free unless a probe is pending.
        self.msgs[m].received = true;
        if !self.msgs[m].probing {
            self.free.push(m);
        }
    }

    /// Message `m`'s probe for its first segment is over: its slot is free if the message
    /// was received meanwhile.
    fn probe_done(&mut self, m: usize) {
        self.msgs[m].probing = false;
        if self.msgs[m].received {
            self.free.push(m);
        }
    }

    fn end(&mut self, r: u32, j: u32) {
        let ri = r as usize;
        let run = &mut self.runs[ri][j as usize];
        if run.state == State::Done {
            return;
        }
        run.state = State::Done;
        run.end = self.now;
        self.release(r, j, false);
        // Operations held for this one (and for nothing else still running) end one
        // segment later.
        let id = self.cur(r);
        let rev = self.op(r, j).rev;
        for idx in rev.0..rev.1 {
            let k = self.table.pairs(id, (idx, idx + 1))[0].0 as usize;
            let deps = self.op(r, k as u32).deps;
            let pending =
                self.table.pairs(id, deps).iter().any(|&(i, how)| {
                    how == Follow::Segments && self.runs[ri][i as usize].state != State::Done
                });
            if pending {
                continue;
            }
            if let Some(last) = self.runs[ri][k].held {
                // No earlier than its own end as far as it got (a receive's arrival and fold).
                let own = self.runs[ri][k].end;
                self.runs[ri][k].held = None;
                self.at((self.now + last).max(own), Ev::End { rank: r, op: k as u32 });
            }
        }
        self.left[ri] -= 1;
        if self.left[ri] == 0 {
            self.advance(ri);
            self.enter_step(r);
        }
    }

    /// Operation `j` of rank `r` ended (`segment`: or has its first segment): the
    /// operations after it that it blocks may be able to start.
    fn release(&mut self, r: u32, j: u32, segment: bool) {
        let ri = r as usize;
        let id = self.cur(r);
        let rev = self.op(r, j).rev;
        for idx in rev.0..rev.1 {
            let (k, how) = self.table.pairs(id, (idx, idx + 1))[0];
            let k = k as usize;
            let op = self.op(r, k as u32);
            // A send or receive following segment by segment is released by the first
            // segment; anything else waits for the end (and must not be released twice).
            let forwards = how == Follow::Segments && !matches!(op.kind, Kind::Copy);
            if segment != forwards {
                if !segment && forwards && self.runs[ri][j as usize].seg_ready.is_none() {
                    // Ended before a first segment was seen (a short message): release now.
                } else {
                    continue;
                }
            }
            let run = &mut self.runs[ri][k];
            run.blockers -= 1;
            if run.blockers == 0 && run.state == State::Waiting {
                self.ready.push((r, k as u32));
            }
        }
    }
}
