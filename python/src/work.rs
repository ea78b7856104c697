//! `xccl.Work`: the handle on one asynchronous operation, which holds the Python buffers
//! the operation borrowed until it has completed.
//!
//! Releasing a buffer export needs the GIL, so exports are only ever released on Python
//! threads: by `wait` or `is_completed` once the operation has completed, when the `Work` is
//! dropped after that, or, for a `Work` dropped before its operation completed, by whichever
//! asynchronous call next finds it completed (the exports wait in a list until then).
//! xccl's progress thread never touches a Python object, so it never waits for the GIL.
//!
//! A `Work` may be used from several Python threads at once (one waits, another polls).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::buffer::Held;
use crate::error::to_py;

/// An operation in flight, whatever the buffers it owns.
pub(crate) trait Pending: Send + Sync {
    /// Whether it has completed.
    fn is_completed(&self) -> bool;
    /// Waits until it has completed or `timeout` has passed; whether it has completed.
    fn wait_for(&self, timeout: Duration) -> bool;
    /// Waits until it has completed; its outcome.
    fn finish(self: Box<Self>) -> xccl::Result<()>;
}

impl<B: Send + 'static> Pending for xccl::Work<B> {
    fn is_completed(&self) -> bool {
        xccl::Work::is_completed(self)
    }

    fn wait_for(&self, timeout: Duration) -> bool {
        xccl::Work::wait_for(self, timeout)
    }

    fn finish(self: Box<Self>) -> xccl::Result<()> {
        // The buffers xccl gives back only point into the exports: nothing to do with them.
        self.wait().map(drop)
    }
}

/// Operations whose `Work` was dropped before they completed, with the exports they use.
type Orphans = Vec<(Box<dyn Pending>, Vec<Held>)>;

static ORPHANS: Mutex<Orphans> = Mutex::new(Vec::new());

/// Releases the exports of orphaned operations that have completed. Called with the GIL.
pub(crate) fn sweep_orphans() {
    let done: Orphans = {
        let mut all = ORPHANS.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, pending) = std::mem::take(&mut *all).into_iter().partition(|(p, _)| p.is_completed());
        *all = pending;
        done
    };
    // Released outside the lock: releasing an export may run Python code that drops
    // another `Work`.
    drop(done);
}

enum State {
    Running(Box<dyn Pending>),
    /// A thread is waiting for the operation (without the GIL); it records the outcome.
    Waiting,
    /// The outcome, known; a failure is raised by every `wait`.
    Done(xccl::Result<()>),
}

struct Slot {
    state: State,
    /// The exports the operation uses, released once the program has seen it complete.
    held: Vec<Held>,
}

impl Slot {
    /// Records the outcome if the operation has completed; whether the outcome is known.
    fn collect(&mut self) -> bool {
        if matches!(&self.state, State::Running(p) if p.is_completed())
            && let State::Running(p) = std::mem::replace(&mut self.state, State::Waiting)
        {
            // Completed: returns at once.
            self.state = State::Done(p.finish());
        }
        matches!(self.state, State::Done(_))
    }
}

/// The handle on an asynchronous operation (returned by the `*_async` methods, `isend` and
/// `irecv`). It holds the buffers the operation borrowed until the operation has completed;
/// the program must not read or write them before `wait` returned True (or `is_completed`).
/// Dropping a Work does not cancel the operation (every rank takes part in it): its
/// buffers stay borrowed until it completes.
#[pyclass(name = "Work", module = "xccl", frozen)]
pub struct Work {
    slot: Mutex<Slot>,
    /// Signalled when a waiting thread recorded the outcome (or gave up waiting).
    cv: Condvar,
}

impl Work {
    /// A handle on `pending`, which uses the memory of `held`. An operation that already
    /// failed on its arguments raises now instead.
    pub(crate) fn start(py: Python<'_>, pending: Box<dyn Pending>, held: Vec<Held>) -> PyResult<Work> {
        sweep_orphans();
        let mut slot = Slot { state: State::Running(pending), held };
        // Collected now to raise argument errors at the call; the buffers stay held until
        // the program sees the operation complete, as for any operation.
        if slot.collect()
            && let State::Done(Err(e @ (xccl::Error::InvalidArgument { .. } | xccl::Error::Config(_)))) =
                &slot.state
        {
            return Err(to_py(py, e));
        }
        Ok(Work { slot: Mutex::new(slot), cv: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases the exports, the operation being done (outside the lock: releasing one
    /// may run Python code).
    fn release(&self) {
        let held = std::mem::take(&mut self.lock().held);
        drop(held);
    }

    /// The outcome, known: releases the exports and raises a failure.
    fn outcome(&self, py: Python<'_>) -> PyResult<bool> {
        self.release();
        let failed = match &self.lock().state {
            State::Done(Err(e)) => Some(e.clone()),
            _ => None,
        };
        failed.map_or(Ok(true), |e| Err(to_py(py, &e)))
    }
}

#[pymethods]
impl Work {
    /// Waits until the operation has completed, or until `timeout` seconds have passed.
    /// Returns True when it has completed (the buffers hold the results and are the caller's
    /// again) and False if the timeout passed first; raises the operation's error (an
    /// XcclError) if it failed.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = timeout
            .map(|t| {
                Duration::try_from_secs_f64(t.max(0.0)).map_err(|_| {
                    crate::error::invalid(py, "Work.wait", format!("timeout {t} is not a number of seconds"))
                })
            })
            .transpose()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        let left = || deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()));
        loop {
            let taken = {
                let mut s = self.lock();
                match std::mem::replace(&mut s.state, State::Waiting) {
                    State::Running(p) => Some(p),
                    other => {
                        s.state = other;
                        None
                    }
                }
            };
            let Some(p) = taken else {
                // Known, or another thread is collecting it: wait for that thread.
                let known = py.detach(|| {
                    let s = self.lock();
                    let wait = self.cv.wait_timeout_while(s, left(), |s| matches!(s.state, State::Waiting));
                    let (s, _) = wait.unwrap_or_else(PoisonError::into_inner);
                    !matches!(s.state, State::Waiting)
                });
                if !known {
                    return Ok(false);
                }
                if matches!(self.lock().state, State::Done(_)) {
                    return self.outcome(py);
                }
                // The other thread gave up (its timeout passed) before the operation
                // completed: wait here.
                continue;
            };
            let (state, completed) = py.detach(move || {
                if p.wait_for(left()) { (State::Done(p.finish()), true) } else { (State::Running(p), false) }
            });
            self.lock().state = state;
            self.cv.notify_all();
            return if completed { self.outcome(py) } else { Ok(false) };
        }
    }

    /// Whether the operation has completed (successfully or not); does not block. Once it
    /// has, the buffers are the caller's again.
    fn is_completed(&self) -> bool {
        let done = self.lock().collect();
        if done {
            self.release();
        }
        done
    }

    fn __repr__(&self) -> &'static str {
        match &self.lock().state {
            State::Running(_) | State::Waiting => "<xccl.Work running>",
            State::Done(Ok(())) => "<xccl.Work done>",
            State::Done(Err(_)) => "<xccl.Work failed>",
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let s = self.slot.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let State::Running(p) = std::mem::replace(&mut s.state, State::Done(Ok(())))
            && !p.is_completed()
        {
            let held = std::mem::take(&mut s.held);
            ORPHANS.lock().unwrap_or_else(PoisonError::into_inner).push((p, held));
        }
    }
}
