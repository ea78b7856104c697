//! The stream: a communicator's queue of operations and the progress thread that runs them
//! in issue order, the CPU counterpart of a CUDA communication stream.
//!
//! Blocking calls and asynchronous calls share one order. A blocking call made while the
//! stream is idle (nothing queued, nothing running) runs at once on the caller's thread,
//! sparing two thread hand-offs; otherwise it queues behind what is there and waits.
//!
//! Point-to-point operations form batches: a batch takes in every point-to-point operation
//! issued while it runs, progresses them all at once and completes each as it finishes, so
//! an `isend` and an `irecv` between two ranks never wait on each other. A collective issued
//! after them starts once the batch is done.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::exec::{Bufs, Engine, P2p, P2pFeed};
use crate::frame::OpDesc;
use crate::schedule::{Program, Region};
use crate::transport::{Farewell, Waker};
use crate::work::{Completion, OpSpan};

/// One queued operation, and when it was issued.
pub(crate) struct Job {
    pub op: JobOp,
    pub issued: Instant,
}

impl Job {
    pub fn new(op: JobOp) -> Job {
        Job { op, issued: Instant::now() }
    }

    fn done(&self) -> &Arc<Completion> {
        match &self.op {
            JobOp::Coll { done, .. } | JobOp::P2p { done, .. } | JobOp::Marker { done } => done,
        }
    }
}

/// What a queued operation does.
pub(crate) enum JobOp {
    /// A collective: its identity, schedule, buffers and result regions.
    Coll { desc: OpDesc, program: Program, bufs: Bufs, results: Vec<Region>, done: Arc<Completion> },
    /// One point-to-point message.
    P2p { msg: P2p, done: Arc<Completion> },
    /// Completes when everything before it has.
    Marker { done: Arc<Completion> },
}

// SAFETY: the raw pointers inside an operation point to buffers that the issuer keeps valid and
// untouched until the job's completion is signalled (blocking calls wait for it; async calls
// park the owned buffers in the completion); only the thread running the job dereferences them.
unsafe impl Send for JobOp {}

struct Queue {
    jobs: VecDeque<Job>,
    /// Someone (the progress thread or an inline caller) is running operations.
    busy: bool,
    /// Collective sequence numbers handed out so far.
    next_seq: u64,
    /// Set when the communicator is dropped: how to say goodbye once the queue is empty.
    closing: Option<Farewell>,
}

struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
    /// Taken only by whoever set `busy`, so never contended.
    engine: Mutex<Engine>,
    /// Wakes the engine out of a wait when work is issued to a running batch.
    waker: Waker,
    /// Spans of finished operations, while recording.
    timeline: Mutex<Option<Vec<OpSpan>>>,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The engine; if an operation panicked inside it, it is aborted first, since its
    /// streams may be in the middle of a frame.
    fn engine(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|poisoned| {
            self.engine.clear_poison();
            let mut engine = poisoned.into_inner();
            engine.fail(Error::Internal("an earlier operation panicked inside xccl".into()));
            engine
        })
    }

    /// Adds a span if recording.
    fn record(&self, name: impl FnOnce() -> String, bytes: usize, issued: Instant, started: Instant) {
        let mut t = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(spans) = t.as_mut() {
            spans.push(OpSpan { name: name(), bytes, issued, started, finished: Instant::now() });
        }
    }

    /// Queues `job` behind everything there.
    fn enqueue(&self, mut q: MutexGuard<'_, Queue>, job: Job) {
        let busy = q.busy;
        q.jobs.push_back(job);
        drop(q);
        self.cv.notify_one();
        if busy {
            self.waker.wake();
        }
    }
}

/// Marks the stream idle again when dropped, also while unwinding.
struct BusyGuard<'a>(&'a Shared);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.queue().busy = false;
        self.0.cv.notify_all();
    }
}

/// The issuing side of a stream.
pub(crate) struct Stream {
    rank: usize,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Stream {
    /// Starts the progress thread of `rank` around `engine`.
    pub fn start(rank: usize, engine: Engine) -> Result<Stream> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { jobs: VecDeque::new(), busy: false, next_seq: 0, closing: None }),
            cv: Condvar::new(),
            waker: engine.waker(),
            engine: Mutex::new(engine),
            timeline: Mutex::new(None),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xccl-r{rank}"))
            .spawn(move || progress(&s2))
            .map_err(|e| Error::io("starting the progress thread", e))?;
        Ok(Stream { rank, shared, thread: Some(thread) })
    }

    /// Queues a collective built from the next sequence number; returns that number.
    pub fn submit(&self, make: impl FnOnce(u64) -> Job) -> u64 {
        let mut q = self.shared.queue();
        let seq = q.next_seq;
        q.next_seq += 1;
        self.shared.enqueue(q, make(seq));
        seq
    }

    /// Starts (or stops, dropping what was recorded) recording operation spans.
    pub fn record_timeline(&self, on: bool) {
        *self.shared.timeline.lock().unwrap_or_else(PoisonError::into_inner) = on.then(Vec::new);
    }

    /// Takes the spans recorded so far.
    pub fn take_timeline(&self) -> Vec<OpSpan> {
        self.shared
            .timeline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Queues a job that takes no sequence number (point-to-point, marker).
    pub fn submit_unsequenced(&self, job: Job) {
        self.shared.enqueue(self.shared.queue(), job);
    }

    /// Runs a collective built from the next sequence number and returns that number once
    /// it has completed: on this thread if the stream is idle, else after what is queued.
    pub fn run(&self, make: impl FnOnce(u64) -> Job, done: &Completion) -> u64 {
        let mut q = self.shared.queue();
        let seq = q.next_seq;
        q.next_seq += 1;
        self.run_or_queue(q, make(seq), done);
        seq
    }

    /// Runs a job without sequence number like [`Stream::run`].
    pub fn run_unsequenced(&self, job: Job, done: &Completion) {
        self.run_or_queue(self.shared.queue(), job, done);
    }

    fn run_or_queue(&self, mut q: MutexGuard<'_, Queue>, job: Job, done: &Completion) {
        if q.busy || !q.jobs.is_empty() {
            self.shared.enqueue(q, job);
        } else {
            q.busy = true;
            drop(q);
            // Cleared even if the operation panics, so the stream never stays busy forever.
            let _busy = BusyGuard(&self.shared);
            run(&self.shared, &mut self.shared.engine(), job);
        }
        let _ = done.wait_result();
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let farewell = if std::thread::panicking() {
            Farewell::Abort {
                origin: self.rank,
                reason: format!("rank {}: its thread panicked while holding the communicator", self.rank),
            }
        } else {
            Farewell::Goodbye
        };
        self.shared.queue().closing = Some(farewell);
        self.shared.cv.notify_one();
        if let Some(t) = self.thread.take() {
            // The thread catches panics of operations, so a join error is a panic elsewhere
            // in it: report it.
            if t.join().is_err() {
                tracing::error!("xccl progress thread panicked");
            }
        }
    }
}

fn progress(shared: &Shared) {
    loop {
        let job = {
            let mut q = shared.queue();
            loop {
                if !q.busy {
                    if let Some(job) = q.jobs.pop_front() {
                        q.busy = true;
                        break job;
                    }
                    if let Some(farewell) = q.closing.take() {
                        drop(q);
                        shared.engine().close(farewell);
                        return;
                    }
                }
                q = shared.cv.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let _busy = BusyGuard(shared);
        let done = job.done().clone();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| run(shared, &mut shared.engine(), job)));
        if outcome.is_err() {
            // A bug inside xccl: fail the operation instead of leaving its waiter hanging.
            done.finish_if_pending(Err(Error::Internal("operation panicked inside xccl".into())));
        }
    }
}

/// Feeds a point-to-point batch from the queue: the job that started it, then every
/// point-to-point job at the head of the queue as it is issued.
struct QueueFeed<'a> {
    shared: &'a Shared,
    first: Option<(P2p, Arc<Completion>, Instant)>,
    dones: Vec<Arc<Completion>>,
    msgs: Vec<P2p>,
    /// When each message was issued and taken in.
    times: Vec<(Instant, Instant)>,
}

impl P2pFeed for QueueFeed<'_> {
    fn fetch(&mut self, into: &mut Vec<P2p>) {
        if let Some((msg, done, issued)) = self.first.take() {
            self.msgs.push(msg);
            into.push(msg);
            self.dones.push(done);
            self.times.push((issued, Instant::now()));
        }
        let mut q = self.shared.queue();
        while matches!(q.jobs.front(), Some(Job { op: JobOp::P2p { .. }, .. })) {
            if let Some(Job { op: JobOp::P2p { msg, done }, issued }) = q.jobs.pop_front() {
                self.msgs.push(msg);
                into.push(msg);
                self.dones.push(done);
                self.times.push((issued, Instant::now()));
            }
        }
    }

    fn complete(&mut self, index: usize) {
        let (issued, started) = self.times[index];
        let m = self.msgs[index];
        let name = || {
            let (verb, dir) = if m.send { ("send", "to") } else { ("recv", "from") };
            format!("{verb} {dir} {} (tag {}, {} x {})", m.peer, m.tag, m.dtype, m.len / m.dtype.size())
        };
        // Recorded before the waiter wakes, so that its next look at the timeline sees it.
        self.shared.record(name, m.len, issued, started);
        self.dones[index].finish(Ok(()));
    }
}

impl QueueFeed<'_> {
    /// Fails every message of the batch that has not completed.
    fn fail_pending(&self, e: &Error) {
        for d in self.first.iter().map(|f| &f.1).chain(&self.dones) {
            d.finish_if_pending(Err(e.clone()));
        }
    }
}

impl Drop for QueueFeed<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.fail_pending(&Error::Internal("operation panicked inside xccl".into()));
        }
    }
}

/// Runs one job taken from the queue (a point-to-point job starts a batch).
fn run(shared: &Shared, engine: &mut Engine, job: Job) {
    let Job { op, issued } = job;
    let started = Instant::now();
    match op {
        JobOp::Coll { desc, program, bufs, results, done } => {
            let result = engine.collective(&desc, &program, &bufs, &results);
            shared.record(|| desc.to_string(), bufs.input_len, issued, started);
            done.finish(result);
        }
        JobOp::Marker { done } => {
            done.finish(engine.dead().map_or(Ok(()), |e| Err(Error::Aborted(Box::new(e.clone())))));
        }
        JobOp::P2p { msg, done } => {
            let mut feed = QueueFeed {
                shared,
                first: Some((msg, done, issued)),
                dones: Vec::new(),
                msgs: Vec::new(),
                times: Vec::new(),
            };
            if let Err(e) = engine.p2p(&mut feed) {
                feed.fail_pending(&e);
            }
        }
    }
}
