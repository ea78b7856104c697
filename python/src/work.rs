//! `xccl.Work`: the handle on one asynchronous operation, which holds the Python buffers
//! the operation borrowed until it has completed.
//!
//! Releasing a buffer export needs the GIL, so exports are only ever released on Python
//! threads: by `wait` or `is_completed` once the operation has completed, when the `Work` is
//! dropped after that, or, for a `Work` dropped before its operation completed, by whichever
//! asynchronous call next finds it completed (the exports wait in a list until then). xccl's progress thread never touches a Python
//! object, so it never waits for the GIL.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

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
    /// The outcome, known; a failure is raised by every `wait`.
    Done(xccl::Result<()>),
}

/// The handle on an asynchronous operation (returned by the `*_async` methods, `isend` and
/// `irecv`). It holds the buffers the operation borrowed until the operation has completed;
/// the program must not read or write them before `wait` returned True (or `is_completed`).
/// Dropping a Work does not cancel the operation (every rank takes part in it): its
/// buffers stay borrowed until it completes.
#[pyclass(name = "Work", module = "xccl")]
pub struct Work {
    state: State,
    held: Vec<Held>,
}

impl Work {
    /// A handle on `pending`, which uses the memory of `held`. An operation that already
    /// failed on its arguments raises now instead.
    pub(crate) fn start(py: Python<'_>, pending: Box<dyn Pending>, held: Vec<Held>) -> PyResult<Work> {
        sweep_orphans();
        let mut w = Work { state: State::Running(pending), held };
        if w.is_running_done() {
            // Collected now to raise argument errors at the call; the buffers stay held until
            // the program asks (`wait`, `is_completed`), as for any operation.
            w.settle(|p| p.finish());
            if let State::Done(Err(e @ (xccl::Error::InvalidArgument { .. } | xccl::Error::Config(_)))) =
                &w.state
            {
                return Err(to_py(py, e));
            }
        }
        Ok(w)
    }

    /// Whether the operation is done but its outcome not collected yet.
    fn is_running_done(&self) -> bool {
        matches!(&self.state, State::Running(p) if p.is_completed())
    }

    /// Replaces a running state by its outcome, computed by `outcome`.
    fn settle(&mut self, outcome: impl FnOnce(Box<dyn Pending>) -> xccl::Result<()>) {
        let state = std::mem::replace(&mut self.state, State::Done(Ok(())));
        self.state = match state {
            State::Running(p) => State::Done(outcome(p)),
            done => done,
        };
    }
}

#[pymethods]
impl Work {
    /// Waits until the operation has completed, or until `timeout` seconds have passed.
    /// Returns True when it has completed (the buffers hold the results and are the caller's
    /// again) and False if the timeout passed first; raises the operation's error (an
    /// XcclError) if it failed.
    #[pyo3(signature = (timeout=None))]
    fn wait(&mut self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        if let State::Running(p) = &self.state {
            if let Some(t) = timeout {
                let t = Duration::try_from_secs_f64(t.max(0.0)).map_err(|_| {
                    crate::error::invalid(py, "Work.wait", format!("timeout {t} is not a number of seconds"))
                })?;
                if !py.detach(|| p.wait_for(t)) {
                    return Ok(false);
                }
            }
            self.settle(|p| py.detach(move || p.finish()));
        }
        self.held.clear();
        match &self.state {
            State::Done(Err(e)) => Err(to_py(py, e)),
            _ => Ok(true),
        }
    }

    /// Whether the operation has completed (successfully or not); does not block. Once it
    /// has, the buffers are the caller's again.
    fn is_completed(&mut self) -> bool {
        if self.is_running_done() {
            self.settle(|p| p.finish());
        }
        let done = matches!(self.state, State::Done(_));
        if done {
            self.held.clear();
        }
        done
    }

    fn __repr__(&self) -> &'static str {
        match &self.state {
            State::Running(_) => "<xccl.Work running>",
            State::Done(Ok(())) => "<xccl.Work done>",
            State::Done(Err(_)) => "<xccl.Work failed>",
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, State::Done(Ok(())));
        if let State::Running(p) = state {
            if !p.is_completed() {
                let held = std::mem::take(&mut self.held);
                ORPHANS.lock().unwrap_or_else(PoisonError::into_inner).push((p, held));
            }
        }
    }
}
