//! The stream: a communicator's queue of operations and the progress thread that runs them
//! in issue order, the CPU counterpart of a CUDA communication stream.
//!
//! Blocking calls and asynchronous calls share one order. A blocking call made while the
//! stream is idle (nothing queued, nothing running) runs at once on the caller's thread and
//! returns its result directly, sparing two thread hand-offs; otherwise it queues behind what
//! is there and waits.
//!
//! Point-to-point operations form batches: a batch takes in every point-to-point operation
//! issued while it runs, progresses them all at once and completes each as it finishes, so
//! an `isend` and an `irecv` between two ranks never wait on each other. A collective issued
//! after them starts once the batch is done.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::exec::{Bufs, Engine, P2p, P2pFeed, Plan};
use crate::flight::{Queued, Recorder};
use crate::transport::{Farewell, Waker};
use crate::work::{Completion, OpSpan, SpanOp};

/// What a queued operation does.
pub(crate) enum JobOp {
    /// A collective: its plan, sequence number and buffers.
    Coll { plan: Arc<Plan>, seq: u64, bufs: Bufs },
    /// One point-to-point message.
    P2p { msg: P2p },
    /// Completes when everything before it has.
    Marker,
}

// SAFETY: the raw pointers inside an operation point to buffers that the issuer keeps valid and
// untouched until the operation has completed (blocking calls wait for it; async calls park
// the owned buffers in the completion); only the thread running the operation uses them.
unsafe impl Send for JobOp {}

/// One queued operation, when it was issued (while recording), and where its outcome goes.
struct Job {
    op: JobOp,
    issued: Option<Instant>,
    done: Option<Arc<Completion>>,
}

impl Job {
    fn finish(&self, result: &Result<()>) {
        if let Some(d) = &self.done {
            d.finish(result.clone());
        }
    }
}

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
    /// Used only by whoever set `busy` (see [`Shared::engine`]).
    engine: UnsafeCell<Engine>,
    /// The flight recorder, used only by whoever set `busy` (see [`Shared::flight`]).
    flight: UnsafeCell<Recorder>,
    /// An operation panicked inside the engine: its streams may be in the middle of a frame.
    engine_poisoned: AtomicBool,
    /// Wakes the engine out of a wait when work is issued to a running batch.
    waker: Waker,
    /// The engine's abort post ([`Stream::abort`]).
    cancel: Arc<OnceLock<String>>,
    /// Spans of finished operations, while recording.
    timeline: Mutex<Option<Vec<OpSpan>>>,
    /// Whether spans are recorded: clocks are read only then.
    recording: AtomicBool,
}

// SAFETY: everything in `Shared` is synchronised by its own lock or is atomic, except the
// engine, which only the thread that set `busy` under the queue's lock uses (`Shared::engine`).
unsafe impl Sync for Shared {}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The engine, for the one who set `busy` (a plain flag under the queue's lock rather
    /// than a second lock, which would cost two more atomic operations per operation). If an
    /// earlier operation panicked inside it, it is aborted first, since its streams may be in
    /// the middle of a frame.
    ///
    /// # Safety
    /// The caller set `busy` (or is the progress thread closing the stream, when no one else
    /// can issue) and keeps it set while the returned value lives.
    unsafe fn engine(&self) -> EngineRef<'_> {
        // SAFETY: `busy` is set by one thread at a time (under the queue's lock), and only that
        // thread reaches the engine, so this is the only reference to it.
        let engine = unsafe { &mut *self.engine.get() };
        if self.engine_poisoned.load(Ordering::Relaxed) {
            self.engine_poisoned.store(false, Ordering::Relaxed);
            engine.fail(Error::Internal("an earlier operation panicked inside xccl".into()));
        }
        EngineRef { engine, poisoned: &self.engine_poisoned }
    }

    /// The flight recorder.
    ///
    /// # Safety
    /// As for [`Shared::engine`]: the caller set `busy` and keeps it set while the returned
    /// reference lives, and holds no other reference from this function.
    #[allow(clippy::mut_from_ref)]
    unsafe fn flight(&self) -> &mut Recorder {
        // SAFETY: only the thread that set `busy` calls this, once at a time (the caller's
        // contract), so this is the only reference to the recorder.
        unsafe { &mut *self.flight.get() }
    }

    /// After operation `error` failed: writes the flight record (once per communicator),
    /// with the operations still queued, and says where it is.
    fn report_failure(&self, flight: &mut Recorder, error: &Error) {
        let queued: Vec<Queued> = self
            .queue()
            .jobs
            .iter()
            .filter_map(|j| match &j.op {
                JobOp::Coll { plan, seq, bufs } => {
                    Some(Queued { what: plan.desc.with_seq(*seq).to_string(), bytes: bufs.input_len })
                }
                JobOp::P2p { msg } => Some(Queued { what: describe_p2p(msg), bytes: msg.len }),
                JobOp::Marker => None,
            })
            .collect();
        if let Some(path) = flight.write_once(error, &queued) {
            tracing::error!(
                "the last operations of this communicator are in {} (`xccl flight {}` shows every rank's)",
                path.display(),
                path.parent().map_or_else(String::new, |d| d.display().to_string())
            );
        }
    }

    /// The time, if recording.
    fn stamp(&self) -> Option<Instant> {
        self.recording.load(Ordering::Relaxed).then(Instant::now)
    }

    /// Adds a span if recording (and the operation was issued while recording).
    /// `what` gives the operation's name and typed record (made only when recording).
    fn record(
        &self,
        what: impl FnOnce() -> (String, SpanOp),
        bytes: usize,
        issued: Option<Instant>,
        started: Option<Instant>,
    ) {
        let (Some(issued), Some(started)) = (issued, started) else { return };
        let mut t = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(spans) = t.as_mut() {
            let (name, op) = what();
            spans.push(OpSpan { name, op, bytes, issued, started, finished: Instant::now() });
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

/// The engine while an operation runs; marks it poisoned if a panic unwinds through it.
struct EngineRef<'a> {
    engine: &'a mut Engine,
    poisoned: &'a AtomicBool,
}

impl Deref for EngineRef<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        self.engine
    }
}

impl DerefMut for EngineRef<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        self.engine
    }
}

impl Drop for EngineRef<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.poisoned.store(true, Ordering::Relaxed);
        }
    }
}

/// Marks the stream idle again when dropped, also while unwinding.
struct BusyGuard<'a>(&'a Shared);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let mut q = self.0.queue();
        q.busy = false;
        // Wake the progress thread only if it has something to do: waking it for nothing on
        // every inline operation would cost a context switch each time.
        let work = !q.jobs.is_empty() || q.closing.is_some();
        drop(q);
        if work {
            self.0.cv.notify_all();
        }
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
    pub fn start(rank: usize, engine: Engine, flight: Recorder) -> Result<Stream> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { jobs: VecDeque::new(), busy: false, next_seq: 0, closing: None }),
            cv: Condvar::new(),
            waker: engine.waker(),
            cancel: engine.cancel_handle(),
            engine: UnsafeCell::new(engine),
            flight: UnsafeCell::new(flight),
            engine_poisoned: AtomicBool::new(false),
            timeline: Mutex::new(None),
            recording: AtomicBool::new(false),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xccl-r{rank}"))
            .spawn(move || progress(&s2))
            .map_err(|e| Error::io("starting the progress thread", e))?;
        Ok(Stream { rank, shared, thread: Some(thread) })
    }

    /// Starts (or stops, dropping what was recorded) recording the spans of operations
    /// issued from now on.
    pub fn record_timeline(&self, on: bool) {
        *self.shared.timeline.lock().unwrap_or_else(PoisonError::into_inner) = on.then(Vec::new);
        self.shared.recording.store(on, Ordering::Relaxed);
    }

    /// Takes the spans recorded so far.
    pub fn take_timeline(&self) -> Vec<OpSpan> {
        let mut t = self.shared.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        t.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Queues an operation built from the next collective sequence number; its outcome goes
    /// to `done`. Returns the sequence number.
    pub fn submit(&self, make: impl FnOnce(u64) -> JobOp, done: Arc<Completion>) -> u64 {
        let mut q = self.shared.queue();
        let seq = q.next_seq;
        q.next_seq += 1;
        let job = Job { op: make(seq), issued: self.shared.stamp(), done: Some(done) };
        self.shared.enqueue(q, job);
        seq
    }

    /// Queues an operation that takes no sequence number (point-to-point, marker).
    pub fn submit_unsequenced(&self, op: JobOp, done: Arc<Completion>) {
        let job = Job { op, issued: self.shared.stamp(), done: Some(done) };
        self.shared.enqueue(self.shared.queue(), job);
    }

    /// Runs an operation built from the next collective sequence number and returns the
    /// number and the outcome once it has completed: on this thread if the stream is idle,
    /// else after what is queued.
    pub fn run(&self, make: impl FnOnce(u64) -> JobOp) -> (u64, Result<()>) {
        let mut q = self.shared.queue();
        let seq = q.next_seq;
        q.next_seq += 1;
        let op = make(seq);
        (seq, self.run_or_queue(q, op))
    }

    /// Runs an operation without sequence number like [`Stream::run`].
    pub fn run_unsequenced(&self, op: JobOp) -> Result<()> {
        self.run_or_queue(self.shared.queue(), op)
    }

    fn run_or_queue(&self, mut q: MutexGuard<'_, Queue>, op: JobOp) -> Result<()> {
        let issued = self.shared.stamp();
        if q.busy || !q.jobs.is_empty() {
            let done = Arc::new(Completion::default());
            self.shared.enqueue(q, Job { op, issued, done: Some(done.clone()) });
            return done.wait_result();
        }
        q.busy = true;
        drop(q);
        // Cleared even if the operation panics, so the stream never stays busy forever.
        let _busy = BusyGuard(&self.shared);
        // SAFETY: this thread set `busy` above; `engine`, declared after `_busy`, is dropped
        // before it clears `busy`.
        let mut engine = unsafe { self.shared.engine() };
        run(&self.shared, &mut engine, Job { op, issued, done: None })
    }
}

impl Stream {
    /// Aborts the communicator from any thread: the operation in progress fails at its next
    /// wait (it is woken), every later one fails at once, and the peers are told, naming this
    /// rank and `reason`. The first reason given is kept.
    pub fn abort(&self, reason: &str) {
        let _ = self.shared.cancel.set(reason.to_string());
        self.shared.waker.wake();
        self.shared.cv.notify_one();
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let farewell = if let Some(reason) = self.shared.cancel.get() {
            Farewell::Abort { origin: self.rank, reason: format!("rank {}: aborted: {reason}", self.rank) }
        } else if std::thread::panicking() {
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
                        q.busy = true;
                        drop(q);
                        // SAFETY: `busy` is set and the stream is being dropped: no one else
                        // issues operations any more.
                        unsafe { shared.engine() }.close(farewell);
                        return;
                    }
                }
                q = shared.cv.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let _busy = BusyGuard(shared);
        let done = job.done.clone();
        // SAFETY: this thread set `busy` above; `_busy` clears it after the engine is dropped.
        let outcome =
            std::panic::catch_unwind(AssertUnwindSafe(|| run(shared, &mut *unsafe { shared.engine() }, job)));
        if let (Err(_), Some(done)) = (outcome, done) {
            // A bug inside xccl: fail the operation instead of leaving its waiter hanging.
            done.finish_if_pending(Err(Error::Internal("operation panicked inside xccl".into())));
        }
    }
}

/// A message of a batch: the message, where its outcome goes, and when it was issued and
/// started (while recording).
/// A message of a batch: its completion, when it was issued and started, and its flight
/// record.
type FedJob = (P2p, Option<Arc<Completion>>, Option<Instant>, Option<Instant>, u64);

/// `send to 3 (tag 7, f32 x 16)`.
fn describe_p2p(m: &P2p) -> String {
    let (verb, dir) = if m.send { ("send", "to") } else { ("recv", "from") };
    format!("{verb} {dir} {} (tag {}, {} x {})", m.peer, m.tag, m.dtype, m.len / m.dtype.size())
}

/// Feeds a point-to-point batch from the queue: the job that started it, then every
/// point-to-point job at the head of the queue as it is issued.
struct QueueFeed<'a> {
    shared: &'a Shared,
    first: Option<Job>,
    /// The batch's messages, in the order fetched, with their jobs.
    jobs: Vec<FedJob>,
    /// Whether the first message (the job that started the batch) completed.
    first_done: bool,
}

impl P2pFeed for QueueFeed<'_> {
    fn fetch(&mut self, into: &mut Vec<P2p>) {
        let mut take = |job: Job| {
            if let JobOp::P2p { msg } = job.op {
                into.push(msg);
                // SAFETY: the feed runs on the thread that set `busy`, inside `run`, which
                // holds no reference to the recorder while the engine runs the batch.
                let id = unsafe { self.shared.flight() }.p2p(msg.send, msg.peer, msg.tag, msg.dtype, msg.len);
                self.jobs.push((msg, job.done, job.issued, self.shared.stamp(), id));
            }
        };
        if let Some(job) = self.first.take() {
            take(job);
        }
        let mut q = self.shared.queue();
        while matches!(q.jobs.front(), Some(Job { op: JobOp::P2p { .. }, .. })) {
            if let Some(job) = q.jobs.pop_front() {
                take(job);
            }
        }
    }

    fn complete(&mut self, index: usize) {
        let (m, done, issued, started, id) = &self.jobs[index];
        // SAFETY: as in `fetch`.
        unsafe { self.shared.flight() }.end(*id, None);
        // Recorded before the waiter wakes, so that its next look at the timeline sees it.
        let what = || {
            let op =
                SpanOp::Message { send: m.send, peer: m.peer, dtype: m.dtype, count: m.len / m.dtype.size() };
            (describe_p2p(m), op)
        };
        self.shared.record(what, m.len, *issued, *started);
        if let Some(d) = done {
            d.finish(Ok(()));
        }
        self.first_done |= index == 0;
    }
}

impl QueueFeed<'_> {
    /// Fails every message of the batch that has not completed.
    fn fail_pending(&self, e: &Error) {
        for d in self
            .first
            .iter()
            .filter_map(|j| j.done.as_ref())
            .chain(self.jobs.iter().filter_map(|j| j.1.as_ref()))
        {
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

/// Runs one job taken from the queue (a point-to-point job starts a batch); returns its
/// outcome, and hands it to its completion if it has one.
fn run(shared: &Shared, engine: &mut Engine, job: Job) -> Result<()> {
    let started = shared.stamp();
    match &job.op {
        JobOp::Coll { plan, seq, bufs } => {
            // SAFETY: `run` is called by the thread that set `busy`; the reference ends with
            // this arm and the engine does not reach the recorder.
            let flight = unsafe { shared.flight() };
            let id = flight.coll(plan.desc.with_seq(*seq), bufs.input_len.max(bufs.output_len));
            let result = engine.collective(plan, *seq, bufs);
            flight.end(id, result.as_ref().err());
            if let Err(e) = &result {
                shared.report_failure(flight, e);
            }
            let d = &plan.desc;
            let what = || {
                let op = SpanOp::Collective {
                    kind: d.kind,
                    dtype: d.dtype,
                    count: bufs.input_len / d.dtype.size(),
                };
                (d.with_seq(*seq).to_string(), op)
            };
            shared.record(what, bufs.input_len, job.issued, started);
            job.finish(&result);
            result
        }
        JobOp::Marker => {
            let result = engine.dead().map_or(Ok(()), |e| Err(Error::Aborted(Box::new(e.clone()))));
            job.finish(&result);
            result
        }
        JobOp::P2p { .. } => {
            let mut feed = QueueFeed { shared, first: Some(job), jobs: Vec::new(), first_done: false };
            match engine.p2p(&mut feed) {
                Ok(()) => Ok(()),
                Err(e) => {
                    feed.fail_pending(&e);
                    // SAFETY: as for collectives; the batch (and its feed's use of the
                    // recorder) is over.
                    let flight = unsafe { shared.flight() };
                    flight.fail_running(&e);
                    shared.report_failure(flight, &e);
                    if feed.first_done { Ok(()) } else { Err(e) }
                }
            }
        }
    }
}
