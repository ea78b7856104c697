//! The stream: a communicator's queue of operations and the progress thread that runs them
//! in issue order, the CPU counterpart of a CUDA communication stream. One stream serves
//! every backend ([`Backend`]: xccl's engine or MPI's communicator).
//!
//! Blocking calls and asynchronous calls share one order. A blocking call made while the
//! stream is idle (nothing queued, nothing running) runs at once on the caller's thread and
//! returns its result directly, sparing two thread hand-offs; otherwise it queues behind what
//! is there and waits. Whether the stream is idle, and the next sequence number, are one
//! atomic word (`State`): an operation run on the caller's thread costs one atomic operation
//! to start and one to end, and takes the queue's lock only if someone queued meanwhile.
//!
//! Point-to-point operations form batches (`batch.rs`): a batch takes in every
//! point-to-point operation issued while it runs, progresses them all at once and completes
//! each as it finishes, so an `isend` and an `irecv` between two ranks never wait on each
//! other. A collective issued after them starts once the batch is done.

mod backend;
mod batch;

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

pub(crate) use backend::{Backend, Signals, Task};

use crate::error::{Error, Result};
use crate::exec::P2p;
use crate::flight::{Queued, Recorder};
use crate::transport::Farewell;
use crate::work::{Completion, OpSpan, SpanOp};

/// What a queued operation does.
pub(crate) enum JobOp<T> {
    /// A collective (or other task of the backend) and its sequence number.
    Task { task: T, seq: u64 },
    /// One point-to-point message.
    P2p { msg: P2p },
    /// Completes when everything before it has.
    Marker,
}

// SAFETY: the raw pointers of a message point to a buffer that the issuer keeps valid and
// untouched until the message has completed (blocking calls wait for it; async calls park
// the owned buffer in the completion); only the thread running the operation uses them.
unsafe impl<T: Send> Send for JobOp<T> {}

/// One queued operation, when it was issued (while recording), and where its outcome goes.
struct Job<T> {
    op: JobOp<T>,
    issued: Option<Instant>,
    done: Option<Arc<Completion>>,
}

impl<T> Job<T> {
    fn finish(&self, result: &Result<()>) {
        if let Some(d) = &self.done {
            d.finish(result.clone());
        }
    }
}

struct Queue<T> {
    jobs: VecDeque<Job<T>>,
    /// Set when the communicator is dropped: how to say goodbye once the queue is empty.
    closing: Option<Farewell>,
}

/// The stream's state word: the collective sequence numbers handed out so far (from bit 2),
/// whether someone (the progress thread or an inline caller) is running operations
/// ([`BUSY`]), and whether the queue holds jobs or a farewell ([`QUEUED`]).
///
/// `BUSY` is set only when `QUEUED` is clear (by a caller about to run inline) or under the
/// queue's lock (by the progress thread); `QUEUED` and the sequence number of a queued job
/// change together, under the queue's lock. So a caller that finds both flags clear and sets
/// `BUSY` with the next number in one step runs before anything issued after it, and one
/// that clears `BUSY` and finds `QUEUED` set wakes the progress thread (taking the lock, so
/// that the wake-up cannot fall between the progress thread's look and its wait).
struct State(AtomicU64);

/// Someone runs operations: only they may touch the backend and the recorder.
const BUSY: u64 = 1;
/// The queue holds jobs, or the farewell.
const QUEUED: u64 = 2;
/// One sequence number in the state word.
const SEQ: u64 = 4;

impl State {
    /// Sets `BUSY` if the stream is idle and nothing is queued, taking the next sequence
    /// number if `sequenced`; returns that number.
    fn claim(&self, sequenced: bool) -> Option<u64> {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            if s & (BUSY | QUEUED) != 0 {
                return None;
            }
            let next = (s | BUSY) + if sequenced { SEQ } else { 0 };
            // Acquire: the backend as the last one to run left it.
            match self.0.compare_exchange_weak(s, next, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some(s / SEQ),
                Err(now) => s = now,
            }
        }
    }

    /// Changes the word by `f` in one step; returns the old word.
    fn update(&self, f: impl Fn(u64) -> u64) -> u64 {
        match self.0.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |s| Some(f(s))) {
            Ok(s) | Err(s) => s,
        }
    }

    /// Clears `BUSY`; returns whether jobs are queued.
    fn release(&self) -> bool {
        // Release: what the backend did, for the next one to run.
        self.0.fetch_and(!BUSY, Ordering::Release) & QUEUED != 0
    }
}

struct Shared<B: Backend> {
    queue: Mutex<Queue<B::Task>>,
    state: State,
    cv: Condvar,
    /// Used only by whoever set `BUSY` (see [`Shared::backend`]).
    backend: UnsafeCell<B>,
    /// The flight recorder, used only by whoever set `BUSY` (see [`Shared::flight`]).
    flight: UnsafeCell<Recorder>,
    /// An operation panicked inside the backend: its streams may be in the middle of a frame.
    poisoned: AtomicBool,
    /// Wakes the backend out of a wait (work issued to a running batch, an abort) and posts
    /// aborts, where the backend can be reached.
    signals: Option<Signals>,
    /// Spans of finished operations, while recording.
    timeline: Mutex<Option<Vec<OpSpan>>>,
    /// Whether spans are recorded: clocks are read only then.
    recording: AtomicBool,
}

// SAFETY: everything in `Shared` is synchronised by its own lock or is atomic, except the
// backend and the recorder, which only the thread that set `BUSY` in the state word uses
// (`Shared::backend`, `Shared::flight`).
unsafe impl<B: Backend> Sync for Shared<B> {}

impl<B: Backend> Shared<B> {
    fn queue(&self) -> MutexGuard<'_, Queue<B::Task>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The backend, for the one who set `BUSY` (a flag of the state word rather than a
    /// second lock, which would cost two more atomic operations per operation). If an
    /// earlier operation panicked inside it, it is failed first, since its streams may be in
    /// the middle of a frame.
    ///
    /// # Safety
    /// The caller set `BUSY` and keeps it set while the returned value lives.
    unsafe fn backend(&self) -> BackendRef<'_, B> {
        // SAFETY: `BUSY` is set by one thread at a time (`State::claim` and the progress
        // thread's update are atomic), and only that thread reaches the backend, so this is
        // the only reference to it.
        let backend = unsafe { &mut *self.backend.get() };
        if self.poisoned.load(Ordering::Relaxed) {
            self.poisoned.store(false, Ordering::Relaxed);
            backend.fail(Error::Internal("an earlier operation panicked inside xccl".into()));
        }
        BackendRef { backend, poisoned: &self.poisoned }
    }

    /// The flight recorder.
    ///
    /// # Safety
    /// As for [`Shared::backend`]: the caller set `BUSY` and keeps it set while the returned
    /// reference lives, and holds no other reference from this function.
    #[allow(clippy::mut_from_ref)]
    unsafe fn flight(&self) -> &mut Recorder {
        // SAFETY: only the thread that set `BUSY` calls this, once at a time (the caller's
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
                JobOp::Task { task, seq } => Some(Queued { what: task.name(*seq), bytes: task.bytes() }),
                JobOp::P2p { msg } => Some(Queued { what: batch::describe(msg), bytes: msg.len }),
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

    /// Takes the first queued job, clearing `QUEUED` if it was the last and no farewell
    /// waits. The caller holds the queue's lock (`q`) and has set `BUSY`.
    fn pop(&self, q: &mut Queue<B::Task>) -> Option<Job<B::Task>> {
        let job = q.jobs.pop_front()?;
        if q.jobs.is_empty() && q.closing.is_none() {
            self.state.update(|s| s & !QUEUED);
        }
        Some(job)
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

    /// Queues the job `make` builds from the next collective sequence number (if
    /// `sequenced`) behind everything there; returns the number.
    fn enqueue(
        &self,
        mut q: MutexGuard<'_, Queue<B::Task>>,
        sequenced: bool,
        make: impl FnOnce(u64) -> Job<B::Task>,
    ) -> u64 {
        let s = self.state.update(|s| (s | QUEUED) + if sequenced { SEQ } else { 0 });
        q.jobs.push_back(make(s / SEQ));
        drop(q);
        self.cv.notify_one();
        if s & BUSY != 0
            && let Some(sig) = &self.signals
        {
            sig.waker.wake();
        }
        s / SEQ
    }
}

/// The backend while an operation runs; marks it poisoned if a panic unwinds through it.
struct BackendRef<'a, B> {
    backend: &'a mut B,
    poisoned: &'a AtomicBool,
}

impl<B> Deref for BackendRef<'_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        self.backend
    }
}

impl<B> DerefMut for BackendRef<'_, B> {
    fn deref_mut(&mut self) -> &mut B {
        self.backend
    }
}

impl<B> Drop for BackendRef<'_, B> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.poisoned.store(true, Ordering::Relaxed);
        }
    }
}

/// Marks the stream idle again when dropped, also while unwinding.
struct BusyGuard<'a, B: Backend>(&'a Shared<B>);

impl<B: Backend> Drop for BusyGuard<'_, B> {
    fn drop(&mut self) {
        // Wake the progress thread only if it has something to do: waking it for nothing on
        // every inline operation would cost a context switch each time. Taking the lock
        // first: the progress thread looks at the state and waits under it.
        if self.0.state.release() {
            drop(self.0.queue());
            self.0.cv.notify_all();
        }
    }
}

/// The issuing side of a stream.
pub(crate) struct Stream<B: Backend> {
    rank: usize,
    shared: Arc<Shared<B>>,
    thread: Option<JoinHandle<()>>,
}

impl<B: Backend> Stream<B> {
    /// Starts the progress thread of `rank` around `backend`, recording into `flight`.
    pub fn start(rank: usize, backend: B, flight: Recorder) -> Result<Stream<B>> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { jobs: VecDeque::new(), closing: None }),
            state: State(AtomicU64::new(0)),
            cv: Condvar::new(),
            signals: backend.signals(),
            backend: UnsafeCell::new(backend),
            flight: UnsafeCell::new(flight),
            poisoned: AtomicBool::new(false),
            timeline: Mutex::new(None),
            recording: AtomicBool::new(false),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}{rank}", B::THREAD))
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
    pub fn submit(&self, make: impl FnOnce(u64) -> JobOp<B::Task>, done: Arc<Completion>) -> u64 {
        let issued = self.shared.stamp();
        self.shared.enqueue(self.shared.queue(), true, |seq| Job { op: make(seq), issued, done: Some(done) })
    }

    /// Queues an operation that takes no sequence number (point-to-point, marker).
    pub fn submit_unsequenced(&self, op: JobOp<B::Task>, done: Arc<Completion>) {
        let job = Job { op, issued: self.shared.stamp(), done: Some(done) };
        self.shared.enqueue(self.shared.queue(), false, |_| job);
    }

    /// Runs an operation built from the next collective sequence number and returns the
    /// number and the outcome once it has completed: on this thread if the stream is idle,
    /// else after what is queued.
    pub fn run(&self, make: impl FnOnce(u64) -> JobOp<B::Task>) -> (u64, Result<()>) {
        self.run_or_queue(true, make)
    }

    /// Runs an operation without sequence number like [`Stream::run`].
    pub fn run_unsequenced(&self, op: JobOp<B::Task>) -> Result<()> {
        self.run_or_queue(false, |_| op).1
    }

    fn run_or_queue(&self, sequenced: bool, make: impl FnOnce(u64) -> JobOp<B::Task>) -> (u64, Result<()>) {
        let issued = self.shared.stamp();
        let Some(seq) = self.shared.state.claim(sequenced) else {
            let done = Arc::new(Completion::default());
            let job = |seq| Job { op: make(seq), issued, done: Some(done.clone()) };
            let seq = self.shared.enqueue(self.shared.queue(), sequenced, job);
            return (seq, done.wait_result());
        };
        // Cleared even if the operation panics, so the stream never stays busy forever.
        let _busy = BusyGuard(&self.shared);
        // SAFETY: this thread set `BUSY` above; `backend`, declared after `_busy`, is dropped
        // before it clears `BUSY`.
        let mut backend = unsafe { self.shared.backend() };
        (seq, run(&self.shared, &mut backend, Job { op: make(seq), issued, done: None }))
    }

    /// Aborts the communicator from any thread: the operation in progress fails at its next
    /// wait (it is woken), every later one fails at once, and the peers are told, naming this
    /// rank and `reason`. The first reason given is kept. Returns `false`, doing nothing,
    /// where the backend cannot be reached while it runs ([`Backend::signals`]).
    pub fn abort(&self, reason: &str) -> bool {
        let Some(s) = &self.shared.signals else { return false };
        let _ = s.cancel.set(reason.to_string());
        s.waker.wake();
        self.shared.cv.notify_one();
        true
    }
}

impl<B: Backend> Drop for Stream<B> {
    fn drop(&mut self) {
        let cancelled = self.shared.signals.as_ref().and_then(|s| s.cancel.get());
        let farewell = if let Some(reason) = cancelled {
            Farewell::Abort { origin: self.rank, reason: format!("rank {}: aborted: {reason}", self.rank) }
        } else if std::thread::panicking() {
            Farewell::Abort {
                origin: self.rank,
                reason: format!("rank {}: its thread panicked while holding the communicator", self.rank),
            }
        } else {
            Farewell::Goodbye
        };
        let mut q = self.shared.queue();
        q.closing = Some(farewell);
        self.shared.state.update(|s| s | QUEUED);
        drop(q);
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

fn progress<B: Backend>(shared: &Shared<B>) {
    loop {
        let job = {
            let mut q = shared.queue();
            loop {
                let idle = shared.state.0.load(Ordering::Acquire) & BUSY == 0;
                if idle && (!q.jobs.is_empty() || q.closing.is_some()) {
                    // `QUEUED` is set, so no inline caller sets `BUSY` meanwhile.
                    shared.state.update(|s| s | BUSY);
                    if let Some(job) = shared.pop(&mut q) {
                        break job;
                    }
                    if let Some(farewell) = q.closing.take() {
                        drop(q);
                        // SAFETY: `BUSY` is set and the stream is being dropped: no one else
                        // issues operations any more.
                        unsafe { shared.backend() }.close(farewell);
                        return;
                    }
                }
                q = shared.cv.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let _busy = BusyGuard(shared);
        let done = job.done.clone();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: this thread set `BUSY` above; `_busy` clears it after the backend is
            // dropped.
            let mut backend = unsafe { shared.backend() };
            run(shared, &mut backend, job)
        }));
        if let (Err(_), Some(done)) = (outcome, done) {
            // A bug inside xccl: fail the operation instead of leaving its waiter hanging.
            done.finish_if_pending(Err(Error::Internal("operation panicked inside xccl".into())));
        }
    }
}

/// Runs one job taken from the queue (a point-to-point job starts a batch); returns its
/// outcome, and hands it to its completion if it has one.
fn run<B: Backend>(shared: &Shared<B>, backend: &mut B, job: Job<B::Task>) -> Result<()> {
    let started = shared.stamp();
    match &job.op {
        JobOp::Task { task, seq } => {
            // SAFETY: `run` is called by the thread that set `BUSY`; the reference ends with
            // this arm and the backend does not reach the recorder.
            let flight = unsafe { shared.flight() };
            let id = task.flight(*seq).map(|(desc, bytes)| flight.coll(desc, bytes));
            let result = backend.run(task, *seq);
            if let Some(id) = id {
                flight.end(id, result.as_ref().err());
            }
            if let Err(e) = &result {
                shared.report_failure(flight, e);
            }
            shared.record(|| (task.name(*seq), task.span()), task.bytes(), job.issued, started);
            job.finish(&result);
            result
        }
        JobOp::Marker => {
            let result = backend.dead().map_or(Ok(()), |e| Err(Error::Aborted(Box::new(e.clone()))));
            job.finish(&result);
            result
        }
        JobOp::P2p { .. } => batch::run(shared, backend, job),
    }
}

#[cfg(test)]
mod tests;
