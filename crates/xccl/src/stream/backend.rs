//! What a [`Stream`](super::Stream) runs its operations on: the [`Backend`] trait, which
//! xccl's engine (`comm/native.rs`) and MPI's communicator (`comm/mpi/backend.rs`)
//! implement, and the [`Task`]s they run.
//!
//! The stream owns the order (queue, progress thread, inline runs, point-to-point batches),
//! the timeline and the flight recorder; a backend only runs one task, progresses one batch
//! of messages, keeps its failure state and closes. Only the thread running operations
//! holds the backend, so none of its methods needs a lock.

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};
use crate::exec::P2pFeed;
use crate::frame::OpDesc;
use crate::transport::{Farewell, Waker};
use crate::work::SpanOp;

/// What runs the operations of one stream.
pub(crate) trait Backend: Send + 'static {
    /// A collective, or other work of the backend's own, ready to run.
    type Task: Task;
    /// The progress thread's name, before the rank (`xccl-r3`).
    const THREAD: &'static str;

    /// Runs `task` as collective number `seq`. After an earlier failure it fails at once
    /// with [`Error::Aborted`]; its own failure makes the later ones fail.
    fn run(&mut self, task: &Self::Task, seq: u64) -> Result<()>;
    /// Runs the point-to-point messages of `feed` concurrently, taking in those issued
    /// meanwhile, until every message taken has completed; reports each one to the feed as
    /// it completes. An error fails the messages not yet reported, and every later operation.
    fn p2p(&mut self, feed: &mut dyn P2pFeed) -> Result<()>;
    /// The error that made the communicator unusable, if one did.
    fn dead(&self) -> Option<&Error>;
    /// Fails every operation from now on with `error` (an operation panicked).
    fn fail(&mut self, error: Error);
    /// Closes the communicator after its last operation, saying `farewell` to the peers
    /// where the backend has its own.
    fn close(&mut self, farewell: Farewell);
    /// How other threads reach the running operation, if they can.
    fn signals(&self) -> Option<Signals>;
}

/// How threads other than the running one reach a backend's operation.
pub(crate) struct Signals {
    /// Wakes a wait of the running operation (new messages for its batch, an abort).
    pub waker: Waker,
    /// Where an abort is posted; the backend fails its operation at its next wait.
    pub cancel: Arc<OnceLock<String>>,
}

/// What the stream knows of a task: for the timeline, the flight recorder and errors.
pub(crate) trait Task: Send {
    /// The task as errors and timelines name it, as collective number `seq`.
    fn name(&self, seq: u64) -> String;
    /// The task, typed, for the timeline.
    fn span(&self) -> SpanOp;
    /// Bytes of this rank's input.
    fn bytes(&self) -> usize;
    /// The collective and the bytes it moves per rank, as the flight recorder keeps it
    /// (`None`: the backend's tasks are not recorded).
    fn flight(&self, seq: u64) -> Option<(OpDesc, usize)>;
}
