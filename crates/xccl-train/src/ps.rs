//! The parameter server, in the stale synchronous parallel (SSP) model.
//!
//! The flat parameters are cut into one shard per server; servers are ranks `0..S`, and
//! workers are every rank (servers work too) or ranks `S..` (`dedicated`). Per shard `j`
//! there are two communicators, made by the mesh ([`Mesh::subgroup`]), whose members are the
//! workers and server `j` (the root, rank 0 in them):
//!
//! - **push**: at clock `c`, each worker reduces its gradient of shard `j` to the server
//!   (`reduce_async(Sum)`: a push aggregated on the way); shard 0's push also carries the
//!   worker's part of the loss;
//! - **pull**: when the server has applied the optimiser to the sum of clock `c`'s
//!   gradients, it broadcasts version `c + 1` of its shard; each worker issued that
//!   `broadcast_async` in advance and uses the newest version that has arrived.
//!
//! A worker may start clock `c` only when it holds versions `>= c - s` of every shard (the
//! staleness bound `s`); it waits otherwise. With `s = 0` this is synchronous training and
//! gives the same parameters as single-process training. Every communicator is driven by
//! one thread per rank, always in the same order on every rank: a server rank that also
//! works issues shard `j`'s pushes from its worker thread and hands the operations to its
//! server thread, which alone issues the pulls (the broadcasts of new versions) and serves
//! its own worker through a shared slot. Servers gather their shards to server 0 for
//! checkpoints over a third communicator that only server threads use.
//!
//! A worker runs the common training loop (`train_loop`) with `Worker` as its
//! `Strategy`: a step begins by acquiring a recent enough version (the pull), its
//! reduction is the push, and the optimiser step is the servers'. A server runs its own
//! serve loop, on its own thread when its rank also works.
//!
//! [`Mesh::subgroup`]: crate::mesh::Mesh::subgroup

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use xccl::{Communicator, ReduceOp, Work};

use crate::checkpoint::Source as Values;
pub use crate::config::PsConfig;
use crate::data::shares;
use crate::dcp::Snapshot;
use crate::error::{Error, Result};
use crate::mesh::{Axis, Mesh};
use crate::optim::Optimizer;
use crate::params::Chunks;
use crate::run::{Context, Finish, Observer, Start};
use crate::strategy::{Begin, Final, Reduced, Strategy};
use crate::trace::{Kind, Trace};
use crate::train_loop;

/// Who serves and who works in a job of `size` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    size: usize,
    servers: usize,
    dedicated: bool,
}

impl Roles {
    /// The roles for `size` ranks; checks that there are servers and workers.
    pub fn new(size: usize, config: &PsConfig) -> Result<Roles> {
        let workers = if config.dedicated { size.saturating_sub(config.servers) } else { size };
        if config.servers == 0 || config.servers > size || workers == 0 {
            return Err(Error::config(format!(
                "{} server(s){} on {size} rank(s) leave no workers or no servers: \
                 use 1 <= --servers <= --dp{}",
                config.servers,
                if config.dedicated { " (dedicated)" } else { "" },
                if config.dedicated { " - 1 with --dedicated-servers" } else { "" }
            )));
        }
        Ok(Roles { size, servers: config.servers, dedicated: config.dedicated })
    }

    /// Whether `rank` serves a shard.
    pub fn is_server(&self, rank: usize) -> bool {
        rank < self.servers
    }

    /// Whether `rank` computes gradients.
    pub fn is_worker(&self, rank: usize) -> bool {
        !self.dedicated || rank >= self.servers
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        (0..self.size).filter(|&r| self.is_worker(r)).count()
    }

    /// The index of worker `rank` among the workers.
    pub fn worker_index(&self, rank: usize) -> Option<usize> {
        self.is_worker(rank).then(|| (0..rank).filter(|&r| self.is_worker(r)).count())
    }
}

/// The newest version of a shard, published by a server thread to the worker of its rank.
struct Published {
    state: Mutex<Slot>,
    cv: Condvar,
}

struct Slot {
    version: u64,
    values: Vec<f32>,
    failed: Option<String>,
}

impl Published {
    /// A slot holding `version` of a shard.
    fn new(version: u64, values: Vec<f32>) -> Published {
        Published { state: Mutex::new(Slot { version, values, failed: None }), cv: Condvar::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, version: u64, values: &[f32]) {
        let mut s = self.lock();
        s.version = version;
        s.values.clear();
        s.values.extend_from_slice(values);
        self.cv.notify_all();
    }

    fn fail(&self, why: String) {
        self.lock().failed = Some(why);
        self.cv.notify_all();
    }
}

/// One clock's push of a shard, as the server receives it: the reduce of the gradients and,
/// for shard 0, of the loss.
struct Push {
    grads: Work<(Vec<f32>, Vec<f32>)>,
    loss: Option<Work<(Vec<f64>, Vec<f64>)>>,
}

/// How a worker gets versions of one shard.
enum Source {
    /// From the server thread of this rank.
    Local { slot: Arc<Published>, to_server: Sender<Push> },
    /// Broadcasts from a server on another rank, issued in advance, oldest first.
    Remote { pull: Communicator, pulls: VecDeque<Work<Vec<f32>>>, spare: Vec<Vec<f32>> },
}

/// A worker's view of one shard.
struct ShardLink {
    range: Range<usize>,
    push: Communicator,
    source: Source,
    /// The version of the shard this worker holds.
    version: u64,
    /// Pushes not known to be complete (remote shards), oldest first.
    pushes: VecDeque<Work<(Vec<f32>, Vec<f32>)>>,
    losses: VecDeque<Work<(Vec<f64>, Vec<f64>)>>,
}

/// The worker side of one rank: a `Strategy` whose steps start from the newest version
/// of every shard within the staleness bound and whose reduction pushes to the servers.
pub(crate) struct Worker {
    links: Vec<ShardLink>,
    params: Vec<f32>,
    /// The staleness bound.
    staleness: u64,
    /// This worker's index among the workers, and their number.
    index: (usize, usize),
    /// Global losses from the server thread of this rank (server 0's rank).
    reports: Option<Receiver<(u64, f64)>>,
}

impl Worker {
    /// Makes sure every shard is at version `>= need`, taking the newest that arrived;
    /// returns the oldest version held and the time spent waiting.
    fn acquire(&mut self, need: u64, cx: &Context) -> Result<(u64, Duration)> {
        let mut waited = Duration::ZERO;
        let mut changed = false;
        for link in &mut self.links {
            match &mut link.source {
                Source::Remote { pulls, spare, .. } => {
                    while let Some(front) = pulls.front() {
                        if link.version >= need && !front.is_completed() {
                            break;
                        }
                        let t0 = Instant::now();
                        let buf = pulls.pop_front().map(Work::wait).transpose()?.unwrap_or_default();
                        waited += t0.elapsed();
                        self.params[link.range.clone()].copy_from_slice(&buf);
                        spare.push(buf);
                        link.version += 1;
                        changed = true;
                    }
                }
                Source::Local { slot, .. } => {
                    let t0 = Instant::now();
                    let mut s = slot.lock();
                    while s.version < need && s.failed.is_none() {
                        s = slot
                            .cv
                            .wait_timeout(s, Duration::from_secs(1))
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                    waited += t0.elapsed();
                    if let Some(why) = &s.failed {
                        return Err(Error::Thread(format!("the server thread of this rank failed: {why}")));
                    }
                    if s.version > link.version {
                        self.params[link.range.clone()].copy_from_slice(&s.values);
                        link.version = s.version;
                        changed = true;
                    }
                }
            }
            if link.version < need {
                return Err(Error::internal(format!("version {need} of a shard was never pulled")));
            }
        }
        if changed {
            cx.model.params().write(&self.params)?;
        }
        let version = self.links.iter().map(|l| l.version).min().unwrap_or(need);
        Ok((version, waited))
    }

    /// Pushes clock `clock`'s gradients (taken out of `grads`, which gets chunks of the same
    /// lengths back, to be zeroed before the next step) and this worker's part of the loss,
    /// and issues the pulls of version `clock + 1`.
    fn push(&mut self, grads: &mut Chunks, loss: f64) -> Result<()> {
        for (j, link) in self.links.iter_mut().enumerate() {
            let len = link.range.len();
            let g = grads.take(j);
            let fresh = match &mut link.source {
                Source::Local { to_server, .. } => {
                    let grads = link.push.reduce_async(g, vec![0.0; len], ReduceOp::Sum, 0);
                    let loss =
                        (j == 0).then(|| link.push.reduce_async(vec![loss], vec![0.0], ReduceOp::Sum, 0));
                    to_server
                        .send(Push { grads, loss })
                        .map_err(|_| Error::Thread("the server thread of this rank stopped".into()))?;
                    vec![0.0; len]
                }
                Source::Remote { pull, pulls, spare } => {
                    link.pushes.push_back(link.push.reduce_async(g, Vec::new(), ReduceOp::Sum, 0));
                    if j == 0 {
                        link.losses.push_back(link.push.reduce_async(
                            vec![loss],
                            Vec::new(),
                            ReduceOp::Sum,
                            0,
                        ));
                    }
                    let buf = spare.pop().unwrap_or_else(|| vec![0.0; len]);
                    pulls.push_back(pull.broadcast_async(buf, 0));
                    // Reuse the buffer of the oldest push once it is complete.
                    let mut reused = None;
                    while link.pushes.front().is_some_and(Work::is_completed) {
                        if let Some(w) = link.pushes.pop_front() {
                            reused = Some(w.wait()?.0);
                        }
                    }
                    while link.losses.front().is_some_and(Work::is_completed) {
                        if let Some(w) = link.losses.pop_front() {
                            w.wait()?;
                        }
                    }
                    // The loop zeroes the gradients before the next step.
                    reused.unwrap_or_else(|| vec![0.0; len])
                }
            };
            grads.put(j, fresh)?;
        }
        Ok(())
    }

    /// Waits for every outstanding push (reporting their errors).
    fn drain(&mut self) -> Result<()> {
        for link in &mut self.links {
            for w in link.pushes.drain(..) {
                w.wait()?;
            }
            for w in link.losses.drain(..) {
                w.wait()?;
            }
        }
        Ok(())
    }
}

/// Where a server gets each clock's push from.
enum Input {
    /// From the worker thread of its own rank.
    Channel(Receiver<Push>),
    /// It issues its part of the reduces itself (a dedicated server contributes zeros).
    Own(Communicator),
}

/// One server: a shard, its optimiser and its communicators.
struct Server {
    shard: usize,
    range: Range<usize>,
    params: Vec<f32>,
    optimizer: Optimizer,
    input: Input,
    pull: Communicator,
    servers: Communicator,
    publish: Option<Arc<Published>>,
    /// Server 0: the loss history.
    losses: Vec<(u64, f64)>,
    trace: Trace,
    /// Set when the worker thread of this rank failed: stop waiting for its pushes.
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Serves clocks `first..steps`; `report(clock, loss)` gets each global loss (shard 0).
    fn serve(&mut self, cx: &Context, first: u64, report: &mut dyn FnMut(u64, f64)) -> Result<()> {
        let len = self.range.len();
        let mut broadcasts: VecDeque<Work<Vec<f32>>> = VecDeque::new();
        for clock in first..cx.config.steps {
            let push = match &self.input {
                Input::Channel(rx) => {
                    rx.recv().map_err(|_| Error::Thread("the worker thread of this rank stopped".into()))?
                }
                Input::Own(push) => Push {
                    grads: push.reduce_async(vec![0.0; len], vec![0.0; len], ReduceOp::Sum, 0),
                    loss: (self.shard == 0)
                        .then(|| push.reduce_async(vec![0.0], vec![0.0], ReduceOp::Sum, 0)),
                },
            };
            let t0 = Instant::now();
            let (_, sum) = self.wait(push.grads)?;
            let loss = push.loss.map(|w| self.wait(w)).transpose()?.map(|(_, l)| l[0]);
            self.trace.record(Kind::Wait, format!("wait gradients {clock}"), t0, Instant::now());
            let grads = Chunks::from_vec(sum);
            self.trace.span(|| "optimizer".into(), || self.optimizer.step(&mut self.params, &grads))?;
            let version = clock + 1;
            if let Some(p) = &self.publish {
                p.publish(version, &self.params);
            }
            broadcasts.push_back(self.pull.broadcast_async(self.params.clone(), 0));
            while broadcasts.front().is_some_and(Work::is_completed) {
                broadcasts.pop_front().map(Work::wait).transpose()?;
            }
            if let Some(loss) = loss {
                self.losses.push((clock, loss));
                report(clock, loss);
            }
            if cx.checkpoint_due(version) {
                self.checkpoint(cx, version)?;
            }
        }
        for w in broadcasts {
            w.wait()?;
        }
        Ok(())
    }

    /// Waits for `work`, giving up if the worker thread of this rank failed (its peers may
    /// then never complete the operation).
    fn wait<B: Send + 'static>(&self, work: Work<B>) -> Result<B> {
        while !work.wait_for(Duration::from_millis(10)) {
            if self.stop.load(Ordering::Relaxed) {
                return Err(Error::Thread("stopped because the worker thread of this rank failed".into()));
            }
        }
        Ok(work.wait()?)
    }

    /// Every server writes its shard of the parameters and of the optimiser state
    /// (collective over the servers).
    fn checkpoint(&mut self, cx: &Context, version: u64) -> Result<()> {
        let t0 = Instant::now();
        let Some(c) = &cx.config.checkpoint else { return Ok(()) };
        let set = cx.model.params();
        let mine = shares(set.len(), self.servers.size())[self.shard].clone();
        let parts: Vec<_> = set
            .slots()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let r = s.range();
                let (from, to) = (mine.start.max(r.start), mine.end.min(r.end));
                (from < to).then(|| (i, from - r.start..to - r.start))
            })
            .collect();
        let (params, state) = (&self.params, self.optimizer.state());
        let at = |r: Range<usize>| r.start - mine.start..r.end - mine.start;
        let values = |source: Values, r: Range<usize>| match source {
            Values::Params => Ok(params[at(r)].to_vec()),
            Values::State(i) => Ok(state[i][at(r)].to_vec()),
        };
        let snapshot = cx.snapshot(version, &parts, values, self.optimizer.steps(), &self.losses)?;
        crate::dcp::save(&self.servers, &c.path, snapshot)?;
        self.trace.record(Kind::Compute, "checkpoint".into(), t0, Instant::now());
        Ok(())
    }

    /// [`serve`](Self::serve), telling the worker of this rank if it fails.
    fn run(&mut self, cx: &Context, first: u64, report: &mut dyn FnMut(u64, f64)) -> Result<()> {
        let r = self.serve(cx, first, report);
        if let (Err(e), Some(p)) = (&r, &self.publish) {
            p.fail(e.to_string());
        }
        r
    }
}

/// The communicators of one rank: per shard a push and a pull group (`None` where this
/// rank is not a member), and the servers' group.
struct Groups {
    push: Vec<Option<Communicator>>,
    pull: Vec<Option<Communicator>>,
    servers: Option<Communicator>,
}

impl Groups {
    /// Asks `mesh` for the groups along its data-parallel axis (the whole job: the
    /// parameter server has no other axis), in the same order on every rank.
    fn new(mesh: &Mesh, roles: &Roles, shards: usize, record: bool) -> Result<Groups> {
        let (mut push, mut pull) = (Vec::new(), Vec::new());
        for j in 0..shards {
            // The server is rank 0 of its shard's groups.
            let member = |r: usize| roles.is_worker(r) || r == j;
            push.push(mesh.subgroup(Axis::Dp, &member, Some(j))?);
            pull.push(mesh.subgroup(Axis::Dp, &member, Some(j))?);
        }
        let servers = mesh.subgroup(Axis::Dp, &|r| roles.is_server(r), None)?;
        let groups = Groups { push, pull, servers };
        for c in groups.all() {
            c.record_timeline(record);
        }
        Ok(groups)
    }

    fn all(&self) -> impl Iterator<Item = &Communicator> {
        self.push.iter().chain(&self.pull).flatten().chain(&self.servers)
    }

    /// Shard `j`'s push and pull groups.
    fn shard(&self, j: usize) -> Result<(Communicator, Communicator)> {
        match (&self.push[j], &self.pull[j]) {
            (Some(p), Some(q)) => Ok((p.clone(), q.clone())),
            _ => Err(Error::internal(format!("this rank is not in shard {j}'s groups"))),
        }
    }

    /// Moves every group's operations into `trace`.
    fn trace_into(&self, trace: &mut Trace) {
        for (j, c) in self.push.iter().enumerate() {
            if let Some(c) = c {
                trace.add_ops(&format!("comm push {j}"), c.take_timeline());
            }
        }
        for (j, c) in self.pull.iter().enumerate() {
            if let Some(c) = c {
                trace.add_ops(&format!("comm pull {j}"), c.take_timeline());
            }
        }
        if let Some(s) = &self.servers {
            trace.add_ops("comm servers", s.take_timeline());
        }
    }
}

/// The server of shard `rank` on a server rank, starting from `start`.
fn server(cx: &Context, groups: &Groups, ranges: &[Range<usize>], start: &Start) -> Result<Option<Server>> {
    let j = cx.mesh.dp().rank();
    let Some(servers) = &groups.servers else { return Ok(None) };
    let range = ranges[j].clone();
    let state = start.optimizer.state().iter().map(|s| s[range.clone()].to_vec()).collect();
    let (push, pull) = groups.shard(j)?;
    Ok(Some(Server {
        shard: j,
        params: start.params[range.clone()].to_vec(),
        range,
        optimizer: Optimizer::restore(*start.optimizer.config(), start.step, state)?,
        input: Input::Own(push),
        pull,
        servers: servers.clone(),
        publish: None,
        losses: start.losses.clone(),
        trace: Trace::new(format!("server {j}"), cx.config.trace),
        stop: Arc::new(AtomicBool::new(false)),
    }))
}

/// The worker of this rank, worker `index` of `workers`: links to every shard. The shard
/// this rank serves (if it does) is wired to `server` through a channel and a shared slot,
/// and its global losses to the worker through `reports`.
fn worker(
    groups: &Groups,
    ranges: &[Range<usize>],
    start: &Start,
    (staleness, index): (u64, (usize, usize)),
    mut server: Option<&mut Server>,
    reports: Option<Receiver<(u64, f64)>>,
) -> Result<Worker> {
    let mut links = Vec::new();
    for (j, range) in ranges.iter().enumerate() {
        let (push, pull) = groups.shard(j)?;
        let source = match server.as_deref_mut() {
            Some(s) if s.shard == j => {
                let slot = Arc::new(Published::new(start.step, start.params[range.clone()].to_vec()));
                let (tx, rx) = channel();
                s.input = Input::Channel(rx);
                s.publish = Some(slot.clone());
                Source::Local { slot, to_server: tx }
            }
            _ => Source::Remote { pull, pulls: VecDeque::new(), spare: Vec::new() },
        };
        let (pushes, losses) = (VecDeque::new(), VecDeque::new());
        links.push(ShardLink { range: range.clone(), push, source, version: start.step, pushes, losses });
    }
    Ok(Worker { links, params: start.params.clone(), staleness, index, reports })
}

/// A worker's hooks: pull before the step, push as its reduction; the servers step the
/// optimiser and write the checkpoints.
impl Strategy for Worker {
    fn gradient_buffer(&self) -> Chunks {
        let shard_lens: Vec<usize> = self.links.iter().map(|l| l.range.len()).collect();
        Chunks::new(&shard_lens)
    }

    fn begin_step(&mut self, cx: &Context, step: u64, trace: &mut Trace) -> Result<Begin> {
        let t0 = Instant::now();
        let need = step.saturating_sub(self.staleness);
        let (version, waited) = self.acquire(need, cx)?;
        trace.record(Kind::Wait, format!("wait version {need}"), t0, t0 + waited);
        Ok(Begin { worker: self.index, wait: waited, version: Some(version) })
    }

    fn reduce(&mut self, _: &Context, grads: &mut Chunks, loss: f64, _: &mut Trace) -> Result<Reduced> {
        self.push(grads, loss)?;
        Ok(Reduced { loss: None, wait: Duration::ZERO })
    }

    fn optimizer_step(&mut self, _: &Context, _: &Chunks) -> Result<()> {
        Ok(())
    }

    fn traffic(&mut self, _: &Context, _: &mut Trace) -> [u64; 3] {
        // The servers' groups are their own, traced with them.
        [0, 0, 0]
    }

    fn arrived(&mut self) -> Vec<(u64, f64)> {
        self.reports.as_ref().map_or_else(Vec::new, |r| r.try_iter().collect())
    }

    fn snapshot(&self, _: &Context, _: u64, _: &[(u64, f64)]) -> Result<Option<Snapshot>> {
        Ok(None)
    }

    fn finish(&mut self, cx: &Context, trace: &mut Trace) -> Result<Final> {
        let t0 = Instant::now();
        self.acquire(cx.config.steps, cx)?;
        self.drain()?;
        trace.record(Kind::Wait, "wait final version".into(), t0, Instant::now());
        let serves = self.links.iter().any(|l| matches!(l.source, Source::Local { .. }));
        let role = if serves { "worker+server" } else { "worker" };
        Ok(Final { params: self.params.clone(), held: [0; 3], role })
    }
}

/// The parameter server on one rank: servers serve (on their own thread when the rank also
/// works), workers run the training loop with a `Worker`; every rank ends with the final
/// parameters.
pub(crate) fn run(
    cx: &Context,
    config: PsConfig,
    start: Start,
    trace: &mut Trace,
    observer: &mut dyn Observer,
) -> Result<Finish> {
    let world = cx.mesh.dp();
    let rank = world.rank();
    let roles = Roles::new(world.size(), &config)?;
    let ranges = shares(cx.model.params().len(), config.servers);
    let groups = Groups::new(cx.mesh, &roles, config.servers, cx.config.trace)?;
    let mut server = server(cx, &groups, &ranges, &start)?;
    let mut finish = match (roles.worker_index(rank), server.as_mut()) {
        (None, Some(server)) => {
            // A dedicated server: serve on this thread.
            crate::metrics::reset_peak_rss();
            let started = cx.started;
            server.run(cx, start.step, &mut |clock, loss| {
                observer.loss(clock, loss, started.elapsed().as_secs_f64())
            })?;
            Finish { params: start.params.clone(), role: "server", ..Finish::default() }
        }
        (Some(index), mut server) => {
            let stop = server.as_ref().map(|s| s.stop.clone());
            let (to_report, reports) = channel();
            let index = (index, roles.workers());
            let reports = server.is_some().then_some(reports);
            let link = (config.staleness, index);
            let mut worker = worker(&groups, &ranges, &start, link, server.as_deref_mut(), reports)?;
            let first = start.step;
            let from = (first, start.losses.clone());
            std::thread::scope(|scope| -> Result<Finish> {
                let serving = server.map(|s| {
                    scope.spawn(move || {
                        s.run(cx, first, &mut |clock, loss| {
                            let _ = to_report.send((clock, loss));
                        })
                    })
                });
                let worked = train_loop::run(cx, &mut worker, from, None, trace, observer);
                if worked.is_err() {
                    // Tell the server thread to stop waiting for this worker's pushes.
                    if let Some(stop) = &stop {
                        stop.store(true, Ordering::Relaxed);
                    }
                    worker.links.clear();
                }
                let served = match serving {
                    Some(h) => h.join().map_err(|_| Error::Thread("the server thread panicked".into()))?,
                    None => Ok(()),
                };
                let mut finish = worked?;
                for (clock, loss) in worker.arrived() {
                    train_loop::record(cx, &mut finish.losses, clock, loss, observer);
                }
                served.map(|()| finish)
            })?
        }
        (None, None) => return Err(Error::internal("a rank that neither works nor serves")),
    };
    if let Some(s) = server {
        finish.losses = s.losses;
        trace.absorb(s.trace);
    }
    // Every rank ends with the final parameters: the first worker's, broadcast.
    let first_worker = (0..world.size()).find(|&r| roles.is_worker(r)).unwrap_or(0);
    world.broadcast(&mut finish.params, first_worker)?;
    groups.trace_into(trace);
    finish.peak_rss = crate::metrics::peak_rss_bytes();
    Ok(finish)
}
