//! A point-to-point batch: the stream feeds the backend the message that started it, then
//! every point-to-point job at the head of the queue as it is issued, and completes each
//! job as the backend reports it.

use std::sync::Arc;
use std::time::Instant;

use super::{Backend, Job, JobOp, Shared};
use crate::error::{Error, Result};
use crate::exec::{P2p, P2pFeed};
use crate::work::{Completion, SpanOp};

/// A message of a batch: its completion, when it was issued and started (while recording),
/// and its flight record.
type FedJob = (P2p, Option<Arc<Completion>>, Option<Instant>, Option<Instant>, u64);

/// `send to 3 (tag 7, f32 x 16)`.
pub(super) fn describe(m: &P2p) -> String {
    let (verb, dir) = if m.send { ("send", "to") } else { ("recv", "from") };
    format!("{verb} {dir} {} (tag {}, {} x {})", m.peer, m.tag, m.dtype, m.len / m.dtype.size())
}

/// Feeds a point-to-point batch from the queue: the job that started it, then every
/// point-to-point job at the head of the queue as it is issued.
struct QueueFeed<'a, B: Backend> {
    shared: &'a Shared<B>,
    first: Option<Job<B::Task>>,
    /// The batch's messages, in the order fetched, with their jobs.
    jobs: Vec<FedJob>,
    /// The outcome of the first message (the job that started the batch), once reported.
    first_result: Option<Result<()>>,
}

impl<B: Backend> P2pFeed for QueueFeed<'_, B> {
    fn fetch(&mut self, into: &mut Vec<P2p>) {
        let mut take = |job: Job<B::Task>| {
            if let JobOp::P2p { msg } = job.op {
                into.push(msg);
                // SAFETY: the feed runs on the thread that set `BUSY`, inside `run`, which
                // holds no reference to the recorder while the backend runs the batch.
                let id = unsafe { self.shared.flight() }.p2p(msg.send, msg.peer, msg.tag, msg.dtype, msg.len);
                self.jobs.push((msg, job.done, job.issued, self.shared.stamp(), id));
            }
        };
        if let Some(job) = self.first.take() {
            take(job);
        }
        let mut q = self.shared.queue();
        while matches!(q.jobs.front(), Some(Job { op: JobOp::P2p { .. }, .. })) {
            if let Some(job) = self.shared.pop(&mut q) {
                take(job);
            }
        }
    }

    fn complete(&mut self, index: usize, result: Result<()>) {
        let (m, done, issued, started, id) = &self.jobs[index];
        // SAFETY: as in `fetch`.
        unsafe { self.shared.flight() }.end(*id, result.as_ref().err());
        // Recorded before the waiter wakes, so that its next look at the timeline sees it.
        let what = || {
            let op =
                SpanOp::Message { send: m.send, peer: m.peer, dtype: m.dtype, count: m.len / m.dtype.size() };
            (describe(m), op)
        };
        self.shared.record(what, m.len, *issued, *started);
        if let Some(d) = done {
            d.finish(result.clone());
        }
        if index == 0 {
            self.first_result = Some(result);
        }
    }
}

impl<B: Backend> QueueFeed<'_, B> {
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

impl<B: Backend> Drop for QueueFeed<'_, B> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.fail_pending(&Error::Internal("operation panicked inside xccl".into()));
        }
    }
}

/// Runs the batch that point-to-point `job` starts; returns the outcome of `job`'s message.
pub(super) fn run<B: Backend>(shared: &Shared<B>, backend: &mut B, job: Job<B::Task>) -> Result<()> {
    let mut feed = QueueFeed { shared, first: Some(job), jobs: Vec::new(), first_result: None };
    match backend.p2p(&mut feed) {
        Ok(()) => feed.first_result.take().unwrap_or(Ok(())),
        Err(e) => {
            feed.fail_pending(&e);
            // SAFETY: as in `fetch`; the batch (and its feed's use of the recorder) is over.
            let flight = unsafe { shared.flight() };
            flight.fail_running(&e);
            shared.report_failure(flight, &e);
            feed.first_result.take().unwrap_or(Err(e))
        }
    }
}
