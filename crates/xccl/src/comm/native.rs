//! The native backend of a communicator's stream: xccl's own [`Engine`] runs the
//! collectives' [`Plan`]s and the point-to-point batches over the communicator's links.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::exec::{Bufs, Engine, P2pFeed, Plan};
use crate::frame::OpDesc;
use crate::stream::{Backend, Signals, Task};
use crate::transport::Farewell;
use crate::work::SpanOp;

/// A collective of the native engine: its plan and the caller's buffers.
pub(crate) struct Coll {
    /// What every rank runs.
    pub plan: Arc<Plan>,
    /// This rank's input and output.
    pub bufs: Bufs,
}

// SAFETY: the buffers' issuer keeps them valid and untouched until the collective has
// completed (blocking calls wait for it; async calls park the owned buffers in the
// completion); only the thread running the collective uses them.
unsafe impl Send for Coll {}

impl Task for Coll {
    fn name(&self, seq: u64) -> String {
        self.plan.desc.with_seq(seq).to_string()
    }

    fn span(&self) -> SpanOp {
        let d = &self.plan.desc;
        SpanOp::Collective { kind: d.kind, dtype: d.dtype, count: self.bufs.input_len / d.dtype.size() }
    }

    fn bytes(&self) -> usize {
        self.bufs.input_len
    }

    fn flight(&self, seq: u64) -> Option<(OpDesc, usize)> {
        Some((self.plan.desc.with_seq(seq), self.bufs.input_len.max(self.bufs.output_len)))
    }
}

impl Backend for Engine {
    type Task = Coll;
    const THREAD: &'static str = "xccl-r";

    fn run(&mut self, task: &Coll, seq: u64) -> Result<()> {
        self.collective(&task.plan, seq, &task.bufs)
    }

    fn p2p(&mut self, feed: &mut dyn P2pFeed) -> Result<()> {
        Engine::p2p(self, feed)
    }

    fn dead(&self) -> Option<&Error> {
        Engine::dead(self)
    }

    fn fail(&mut self, error: Error) {
        Engine::fail(self, error);
    }

    fn close(&mut self, farewell: Farewell) {
        Engine::close(self, farewell);
    }

    fn signals(&self) -> Option<Signals> {
        Some(Signals { waker: self.waker(), cancel: self.cancel_handle() })
    }
}
