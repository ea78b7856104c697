//! The worker of one MPI communicator: its queue of operations and the thread that runs
//! them in issue order, the MPI counterpart of the native backend's stream (`stream.rs`).
//!
//! Each communicator has its own thread, so communicators progress independently: a
//! checkpoint written on a duplicate from a background thread never waits behind, or
//! deadlocks with, the training on the original. Blocking calls and asynchronous calls
//! share one order; a blocking call made while the worker is idle runs at once on the
//! caller's thread. Point-to-point messages form batches as in the native stream: a batch
//! posts every message at the head of the queue, and those issued while it runs, as
//! non-blocking MPI sends and receives and completes each as it finishes, so an `isend` and
//! an `irecv` between two ranks never wait on each other.
//!
//! After a failure the communicator is unusable, as a native one: every later operation
//! fails with the original error.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::ffi;

use super::env::{self, Handle};
use crate::error::{Error, Result};
use crate::exec::P2p;
use crate::work::{Completion, OpSpan, SpanOp};

/// An operation on the communicator (a collective, a split), run with its handle.
pub(super) type Task = Box<dyn FnOnce(ffi::MPI_Comm) -> Result<()> + Send>;

/// What a queued operation does.
enum Op {
    Task(Task),
    P2p(SendP2p),
}

/// A point-to-point message that may cross to the worker thread.
#[derive(Copy, Clone)]
struct SendP2p(P2p);

// SAFETY: the message's pointer is to a buffer its issuer keeps valid and untouched until the
// message completed (blocking calls wait for it; async calls park the buffer in the
// completion); only the thread running the batch uses it.
unsafe impl Send for SendP2p {}

struct Job {
    op: Op,
    about: About,
}

/// What a job's outcome is reported to.
struct About {
    /// The operation's name, while recording.
    name: Option<String>,
    /// The operation, typed.
    what: SpanOp,
    bytes: usize,
    issued: Option<Instant>,
    done: Option<Arc<Completion>>,
}

impl About {
    fn finish(&self, result: &Result<()>) {
        if let Some(d) = &self.done {
            d.finish(result.clone());
        }
    }
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Someone (the worker or an inline caller) is running operations.
    busy: bool,
    closing: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    cv: Condvar,
    comm: Handle<ffi::MPI_Comm>,
    rank: usize,
    /// The largest tag MPI accepts on this communicator.
    tag_ub: u32,
    /// The first failure; later operations fail with it.
    failed: Mutex<Option<Error>>,
    timeline: Mutex<Option<Vec<OpSpan>>>,
    recording: AtomicBool,
}

/// The queue and thread of one MPI communicator; dropping it waits for what was issued,
/// then frees the communicator.
pub(super) struct Worker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the worker of `comm` (which it frees when dropped), this process being `rank`.
    pub fn start(comm: ffi::MPI_Comm, rank: usize) -> Result<Worker> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            comm: Handle(comm),
            rank,
            tag_ub: env::tag_ub(comm)?,
            failed: Mutex::new(None),
            timeline: Mutex::new(None),
            recording: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xccl-mpi-{rank}"))
            .spawn(move || serve(&s))
            .map_err(|e| Error::io("starting the MPI worker thread", e))?;
        Ok(Worker { shared, thread: Some(thread) })
    }

    /// Runs `f` after everything issued before it and returns its result: on this thread if
    /// the worker is idle.
    pub fn run<R: Send + 'static>(
        &self,
        name: impl FnOnce() -> String,
        what: SpanOp,
        bytes: usize,
        f: impl FnOnce(ffi::MPI_Comm) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let slot = Arc::new(Mutex::new(None));
        let out = slot.clone();
        let task: Task = Box::new(move |comm| {
            let r = f(comm)?;
            *out.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
            Ok(())
        });
        self.run_op(self.job(Op::Task(task), name, what, bytes, None))?;
        let r = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        r.ok_or_else(|| Error::Internal("an MPI operation finished without its result".into()))
    }

    /// Queues `task`; its outcome goes to `done`.
    pub fn submit(
        &self,
        name: impl FnOnce() -> String,
        what: SpanOp,
        bytes: usize,
        task: Task,
        done: Arc<Completion>,
    ) {
        self.shared.enqueue(self.job(Op::Task(task), name, what, bytes, Some(done)));
    }

    /// Sends or receives one message, returning once it completed.
    pub fn p2p(&self, msg: P2p) -> Result<()> {
        self.run_op(self.job(Op::P2p(SendP2p(msg)), || p2p_name(&msg), p2p_what(&msg), msg.len, None))
    }

    /// Queues one message; its outcome goes to `done`.
    pub fn submit_p2p(&self, msg: P2p, done: Arc<Completion>) {
        self.shared.enqueue(self.job(
            Op::P2p(SendP2p(msg)),
            || p2p_name(&msg),
            p2p_what(&msg),
            msg.len,
            Some(done),
        ));
    }

    /// Whether spans are being recorded (names are made only then).
    pub fn recording(&self) -> bool {
        self.shared.recording.load(Ordering::Relaxed)
    }

    /// The largest message tag MPI accepts on this communicator.
    pub fn tag_ub(&self) -> u32 {
        self.shared.tag_ub
    }

    /// Starts or stops recording spans.
    pub fn record_timeline(&self, on: bool) {
        *self.shared.timeline.lock().unwrap_or_else(PoisonError::into_inner) = on.then(Vec::new);
        self.shared.recording.store(on, Ordering::Relaxed);
    }

    /// The spans recorded since the last call.
    pub fn take_timeline(&self) -> Vec<OpSpan> {
        let mut t = self.shared.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        t.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn job(
        &self,
        op: Op,
        name: impl FnOnce() -> String,
        what: SpanOp,
        bytes: usize,
        done: Option<Arc<Completion>>,
    ) -> Job {
        let issued = self.shared.recording.load(Ordering::Relaxed).then(Instant::now);
        Job { op, about: About { name: issued.map(|_| name()), what, bytes, issued, done } }
    }

    fn run_op(&self, mut job: Job) -> Result<()> {
        let mut q = self.shared.queue();
        if q.busy || !q.jobs.is_empty() {
            let done = Arc::new(Completion::default());
            job.about.done = Some(done.clone());
            q.jobs.push_back(job);
            drop(q);
            self.shared.cv.notify_all();
            return done.wait_result();
        }
        q.busy = true;
        drop(q);
        let _busy = BusyGuard(&self.shared);
        execute(&self.shared, job)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shared.queue().closing = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("xccl MPI worker thread panicked");
        }
    }
}

/// Clears `busy` when the one who set it is done, and wakes the worker.
struct BusyGuard<'a>(&'a Shared);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.queue().busy = false;
        self.0.cv.notify_all();
    }
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enqueue(&self, job: Job) {
        self.queue().jobs.push_back(job);
        self.cv.notify_all();
    }

    /// The error of an earlier failure, if any.
    fn aborted(&self) -> Result<()> {
        match &*self.failed.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(e) => Err(Error::Aborted(Box::new(e.clone()))),
            None => Ok(()),
        }
    }

    /// Notes the outcome of an operation: its span (while recording), and the first failure.
    fn outcome(&self, job: &About, started: Instant, result: &Result<()>) {
        if let Err(e) = result {
            self.failed.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(|| e.clone());
        }
        if let (Some(name), Some(issued)) = (&job.name, job.issued) {
            let mut t = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(spans) = t.as_mut() {
                let span = OpSpan {
                    name: name.clone(),
                    op: job.what,
                    bytes: job.bytes,
                    issued,
                    started,
                    finished: Instant::now(),
                };
                spans.push(span);
            }
        }
    }
}

/// The worker thread: runs queued jobs until the worker is dropped, then frees the
/// communicator.
fn serve(shared: &Shared) {
    loop {
        let job = {
            let mut q = shared.queue();
            loop {
                if !q.busy {
                    if let Some(job) = q.jobs.pop_front() {
                        q.busy = true;
                        break job;
                    }
                    if q.closing {
                        drop(q);
                        free(shared.comm.0);
                        return;
                    }
                }
                q = shared.cv.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let _busy = BusyGuard(shared);
        let done = job.about.done.clone();
        if std::panic::catch_unwind(AssertUnwindSafe(|| execute(shared, job))).is_err()
            && let Some(done) = done
        {
            // A bug inside xccl: fail the operation instead of leaving its waiter hanging.
            done.finish_if_pending(Err(Error::Internal("MPI operation panicked inside xccl".into())));
        }
    }
}

fn free(comm: ffi::MPI_Comm) {
    if env::finalized() {
        return;
    }
    let mut comm = comm;
    // SAFETY: the worker owns `comm` and nothing is pending on it (the queue is drained).
    if let Err(e) = env::check(unsafe { ffi::MPI_Comm_free(&mut comm) }, || "MPI_Comm_free".into()) {
        tracing::warn!("freeing an MPI communicator: {e}");
    }
}

/// Runs one job (a point-to-point job starts a batch); returns its outcome and hands it to
/// its completion.
fn execute(shared: &Shared, job: Job) -> Result<()> {
    if let Err(e) = shared.aborted() {
        job.about.finish(&Err(e.clone()));
        return Err(e);
    }
    match job.op {
        Op::Task(task) => {
            let started = Instant::now();
            let result = task(shared.comm.0);
            shared.outcome(&job.about, started, &result);
            job.about.finish(&result);
            result
        }
        Op::P2p(msg) => {
            let mut batch = Batch { shared, live: Vec::new(), requests: Vec::new(), first: None };
            batch.post(msg, job.about);
            batch.run()
        }
    }
}

/// A posted message of a batch.
struct Posted {
    about: About,
    msg: P2p,
    started: Instant,
}

/// The point-to-point messages in flight on one communicator.
struct Batch<'a> {
    shared: &'a Shared,
    /// Posted messages, `None` once completed; `requests` matches it index for index.
    live: Vec<Option<Posted>>,
    requests: Vec<ffi::MPI_Request>,
    /// The outcome of the message that started the batch, once known.
    first: Option<Result<()>>,
}

impl Batch<'_> {
    /// Runs the batch until every message in it completed; the outcome of the first.
    fn run(mut self) -> Result<()> {
        let mut idle = 0u32;
        loop {
            self.take_in();
            if self.live.iter().all(Option::is_none) {
                break;
            }
            match self.test() {
                Ok(0) => idle += 1,
                Ok(_) => idle = 0,
                Err(e) => {
                    self.cancel_all(&e);
                    return Err(e);
                }
            }
            // Nothing finished: poll again at once for a while, then pause briefly.
            if idle > 1000 {
                std::thread::sleep(Duration::from_micros(50));
            } else if idle > 100 {
                std::thread::yield_now();
            }
        }
        self.first.take().unwrap_or_else(|| Err(Error::Internal("a batch lost its first message".into())))
    }

    /// Records the outcome of message `i` and hands it to its completion.
    fn finished(&mut self, i: usize, about: &About, started: Instant, result: Result<()>) {
        self.shared.outcome(about, started, &result);
        about.finish(&result);
        if i == 0 {
            self.first = Some(result);
        }
    }

    /// Posts the point-to-point jobs at the head of the queue.
    fn take_in(&mut self) {
        loop {
            let job = {
                let mut q = self.shared.queue();
                if !matches!(q.jobs.front(), Some(Job { op: Op::P2p(_), .. })) {
                    return;
                }
                q.jobs.pop_front()
            };
            if let Some(Job { op: Op::P2p(msg), about }) = job {
                self.post(msg, about);
            }
        }
    }

    /// Posts one message (one that fails to post fails at once).
    fn post(&mut self, SendP2p(msg): SendP2p, about: About) {
        let started = Instant::now();
        match isend_irecv(self.shared.comm.0, &msg) {
            Ok(req) => {
                self.requests.push(req);
                self.live.push(Some(Posted { about, msg, started }));
            }
            Err(e) => {
                // A completed slot keeps the indices aligned.
                // SAFETY: reading an exported constant.
                self.requests.push(unsafe { ffi::RSMPI_REQUEST_NULL });
                self.live.push(None);
                self.finished(self.live.len() - 1, &about, started, Err(e));
            }
        }
    }

    /// Tests the posted messages and finishes those that completed; how many did.
    fn test(&mut self) -> Result<usize> {
        let n = c_int::try_from(self.requests.len())
            .map_err(|_| Error::Internal("more than 2^31 messages in flight".into()))?;
        let mut count: c_int = 0;
        let mut indices = vec![0 as c_int; self.requests.len()];
        // SAFETY: MPI_Status is plain data that MPI fills in.
        let mut statuses: Vec<ffi::MPI_Status> = vec![unsafe { std::mem::zeroed() }; self.requests.len()];
        // SAFETY: the arrays hold `n` entries each; completed requests are MPI_REQUEST_NULL.
        let rc = unsafe {
            ffi::MPI_Testsome(
                n,
                self.requests.as_mut_ptr(),
                &mut count,
                indices.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        env::check(rc, || "MPI_Testsome (point-to-point messages)".into())?;
        let count = usize::try_from(count).unwrap_or(0); // MPI_UNDEFINED: none active
        for (&index, status) in indices.iter().zip(&statuses).take(count) {
            let i = usize::try_from(index).unwrap_or(usize::MAX);
            let Some(posted) = self.live.get_mut(i).and_then(Option::take) else {
                return Err(Error::Internal(format!("MPI completed unknown message {i}")));
            };
            let result = received_all(&posted.msg, status, self.shared.rank);
            self.finished(i, &posted.about, posted.started, result);
        }
        Ok(count)
    }

    /// After a failure: cancels what is still posted (its buffers may be freed once failed)
    /// and fails it.
    fn cancel_all(&mut self, e: &Error) {
        for (req, posted) in self.requests.iter_mut().zip(&mut self.live) {
            if let Some(p) = posted.take() {
                // SAFETY: `req` is an active request of this batch; cancelling then waiting
                // releases MPI's use of its buffer.
                unsafe {
                    ffi::MPI_Cancel(req);
                    ffi::MPI_Wait(req, ffi::RSMPI_STATUS_IGNORE);
                }
                p.about.finish(&Err(e.clone()));
            }
        }
    }
}

/// Posts `msg` as MPI_Isend or MPI_Irecv.
fn isend_irecv(comm: ffi::MPI_Comm, msg: &P2p) -> Result<ffi::MPI_Request> {
    let api = if msg.send { "send" } else { "recv" };
    let lib = env::library()?;
    let t = lib.datatype(msg.dtype);
    let count = super::count(api, msg.len / msg.dtype.size())?;
    let peer = super::count(api, msg.peer)?;
    // Checked against MPI_TAG_UB when the call was made.
    let tag =
        c_int::try_from(msg.tag).map_err(|_| Error::Internal(format!("tag {} reached MPI", msg.tag)))?;
    // SAFETY: reading an exported constant.
    let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: `msg.ptr` holds `count` elements of `t`, kept valid until the request
    // completes (see `SendP2p`); a send only reads it.
    let rc = unsafe {
        if msg.send {
            ffi::MPI_Isend(super::real(msg.ptr, msg.len).cast_const(), count, t, peer, tag, comm, &mut req)
        } else {
            ffi::MPI_Irecv(super::real(msg.ptr, msg.len), count, t, peer, tag, comm, &mut req)
        }
    };
    env::check(rc, || p2p_name(msg))?;
    Ok(req)
}

/// Whether a completed receive got as many elements as it asked for (MPI fails longer
/// messages itself, with MPI_ERR_TRUNCATE).
fn received_all(msg: &P2p, status: &ffi::MPI_Status, rank: usize) -> Result<()> {
    if msg.send {
        return Ok(());
    }
    let want = msg.len / msg.dtype.size();
    let mut got: c_int = 0;
    let lib = env::library()?;
    // SAFETY: `status` is the status MPI filled in for this receive.
    env::check(unsafe { ffi::MPI_Get_count(status, lib.datatype(msg.dtype), &mut got) }, || {
        "MPI_Get_count".into()
    })?;
    if usize::try_from(got).ok() == Some(want) {
        return Ok(());
    }
    Err(Error::Mismatch {
        rank,
        local: format!("recv of {want} x {} (tag {})", msg.dtype, msg.tag),
        peer: msg.peer,
        remote: format!("send of {got} elements"),
    })
}

fn p2p_what(m: &P2p) -> SpanOp {
    SpanOp::Message { send: m.send, peer: m.peer, dtype: m.dtype, count: m.len / m.dtype.size() }
}

fn p2p_name(m: &P2p) -> String {
    let (verb, dir) = if m.send { ("send", "to") } else { ("recv", "from") };
    format!("{verb} {dir} {} (tag {}, {} x {}, mpi)", m.peer, m.tag, m.dtype, m.len / m.dtype.size())
}
