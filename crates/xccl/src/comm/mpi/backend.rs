//! MPI as the backend of a communicator's stream (`stream/`): a task is one MPI call (a
//! collective) or the communicator's own work (setup, split, dup); a point-to-point batch
//! posts its messages as non-blocking MPI sends and receives and tests them until each
//! has completed; closing frees the MPI communicator.
//!
//! Each communicator has its own stream, so its own thread: communicators progress
//! independently, and a checkpoint written on a duplicate from a background thread never
//! waits behind, or deadlocks with, the training on the original. After a failure the
//! communicator is unusable, as a native one: every later operation fails with
//! [`Error::Aborted`] naming the first failure. MPI cannot stop a call in progress, so the
//! backend has no [`Signals`].

use std::ffi::c_int;
use std::time::Duration;

use mpi::ffi;

use super::env::{self, Handle};
use super::{Coll, SendBufs};
use crate::error::{Error, Result};
use crate::exec::{Bufs, P2p, P2pFeed};
use crate::frame::OpDesc;
use crate::stream::{Backend, Signals};
use crate::transport::Farewell;
use crate::work::SpanOp;

/// What MPI runs on a communicator's stream.
pub(crate) enum Task {
    /// A collective on the caller's buffers.
    Coll(Coll, SendBufs),
    /// The communicator's own work, by name: it runs with the communicator's handle.
    Setup(&'static str, Box<dyn Fn(ffi::MPI_Comm) -> Result<()> + Send>),
}

impl Task {
    /// Collective `coll` on `bufs`.
    pub fn coll(coll: Coll, bufs: Bufs) -> Task {
        Task::Coll(coll, SendBufs(bufs))
    }
}

impl crate::stream::Task for Task {
    fn name(&self, _seq: u64) -> String {
        match self {
            Task::Coll(coll, _) => coll.name(),
            Task::Setup(name, _) => (*name).to_string(),
        }
    }

    fn span(&self) -> SpanOp {
        match self {
            Task::Coll(coll, bufs) => coll.what(bufs.0.input_len),
            Task::Setup(..) => SpanOp::Setup,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Task::Coll(_, bufs) => bufs.0.input_len,
            Task::Setup(..) => 0,
        }
    }

    fn flight(&self, _seq: u64) -> Option<(OpDesc, usize)> {
        None
    }
}

/// One MPI communicator, as the stream runs operations on it.
pub(crate) struct MpiBackend {
    comm: Handle<ffi::MPI_Comm>,
    /// This process's rank in it.
    rank: usize,
    /// The first failure; later operations fail with it.
    failed: Option<Error>,
}

impl MpiBackend {
    /// The backend of `comm` (which it frees when closed), this process being `rank`.
    pub fn new(comm: ffi::MPI_Comm, rank: usize) -> MpiBackend {
        MpiBackend { comm: Handle(comm), rank, failed: None }
    }

    /// The error of an earlier failure, if any.
    fn alive(&self) -> Result<()> {
        self.failed.as_ref().map_or(Ok(()), |e| Err(Error::Aborted(Box::new(e.clone()))))
    }

    /// Notes `result`'s failure, if it is the first.
    fn note(&mut self, result: &Result<()>) {
        if let Err(e) = result {
            self.failed.get_or_insert_with(|| e.clone());
        }
    }
}

impl Backend for MpiBackend {
    type Task = Task;
    const THREAD: &'static str = "xccl-mpi-";

    fn run(&mut self, task: &Task, _seq: u64) -> Result<()> {
        self.alive()?;
        let result = match task {
            Task::Coll(coll, bufs) => coll.run(self.comm.0, *bufs),
            Task::Setup(_, work) => work(self.comm.0),
        };
        self.note(&result);
        result
    }

    fn p2p(&mut self, feed: &mut dyn P2pFeed) -> Result<()> {
        self.alive()?;
        let mut batch = Batch { backend: self, live: Vec::new(), requests: Vec::new() };
        let result = batch.run(feed);
        self.note(&result);
        result
    }

    fn dead(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    fn fail(&mut self, error: Error) {
        self.failed.get_or_insert(error);
    }

    fn close(&mut self, _farewell: Farewell) {
        if env::finalized() {
            return;
        }
        let mut comm = self.comm.0;
        // SAFETY: the backend owns `comm` and nothing is pending on it (the stream is drained).
        if let Err(e) = env::check(unsafe { ffi::MPI_Comm_free(&mut comm) }, || "MPI_Comm_free".into()) {
            tracing::warn!("freeing an MPI communicator: {e}");
        }
    }

    fn signals(&self) -> Option<Signals> {
        None
    }
}

/// The point-to-point messages in flight on one communicator.
struct Batch<'a> {
    backend: &'a mut MpiBackend,
    /// Posted messages, by their index in the feed, `None` once completed; `requests`
    /// matches it index for index.
    live: Vec<Option<P2p>>,
    requests: Vec<ffi::MPI_Request>,
}

impl Batch<'_> {
    /// Runs the batch until every message in it completed.
    fn run(&mut self, feed: &mut dyn P2pFeed) -> Result<()> {
        let mut new = Vec::new();
        let mut idle = 0u32;
        loop {
            feed.fetch(&mut new);
            for msg in new.drain(..) {
                self.post(msg, feed);
            }
            if self.live.iter().all(Option::is_none) {
                return Ok(());
            }
            match self.test(feed) {
                Ok(0) => idle += 1,
                Ok(_) => idle = 0,
                Err(e) => {
                    self.cancel_all();
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
    }

    /// Reports message `i` finished with `result`.
    fn finished(&mut self, i: usize, result: Result<()>, feed: &mut dyn P2pFeed) {
        self.backend.note(&result);
        feed.complete(i, result);
    }

    /// Posts one message (one that fails to post fails at once).
    fn post(&mut self, msg: P2p, feed: &mut dyn P2pFeed) {
        match isend_irecv(self.backend.comm.0, &msg) {
            Ok(req) => {
                self.requests.push(req);
                self.live.push(Some(msg));
            }
            Err(e) => {
                // A completed slot keeps the indices aligned.
                // SAFETY: reading an exported constant.
                self.requests.push(unsafe { ffi::RSMPI_REQUEST_NULL });
                self.live.push(None);
                self.finished(self.live.len() - 1, Err(e), feed);
            }
        }
    }

    /// Tests the posted messages and reports those that completed; how many did.
    fn test(&mut self, feed: &mut dyn P2pFeed) -> Result<usize> {
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
            let Some(msg) = self.live.get_mut(i).and_then(Option::take) else {
                return Err(Error::Internal(format!("MPI completed unknown message {i}")));
            };
            let result = received_all(&msg, status, self.backend.rank);
            self.finished(i, result, feed);
        }
        Ok(count)
    }

    /// After a failure: cancels what is still posted (its buffers may be freed once the
    /// stream has failed it).
    fn cancel_all(&mut self) {
        for (req, posted) in self.requests.iter_mut().zip(&mut self.live) {
            if posted.take().is_some() {
                // SAFETY: `req` is an active request of this batch; cancelling then waiting
                // releases MPI's use of its buffer.
                unsafe {
                    ffi::MPI_Cancel(req);
                    ffi::MPI_Wait(req, ffi::RSMPI_STATUS_IGNORE);
                }
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
    // completes (the stream's `JobOp`); a send only reads it.
    let rc = unsafe {
        if msg.send {
            ffi::MPI_Isend(super::real(msg.ptr, msg.len).cast_const(), count, t, peer, tag, comm, &mut req)
        } else {
            ffi::MPI_Irecv(super::real(msg.ptr, msg.len), count, t, peer, tag, comm, &mut req)
        }
    };
    env::check(rc, || format!("MPI_I{api} (peer {}, tag {})", msg.peer, msg.tag))?;
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
