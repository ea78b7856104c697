//! The native backend of a communicator's stream: xccl's own [`Engine`] runs the
//! collectives' [`Plan`]s and the point-to-point batches over the communicator's links.

use std::ptr::NonNull;
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
    plan: PlanHold,
    /// This rank's input and output.
    pub bufs: Bufs,
}

/// How a collective holds its plan.
enum PlanHold {
    /// Lent by a blocking call, which keeps it alive until the collective has completed, as
    /// it does the buffers: no reference count to change.
    Lent(NonNull<Plan>),
    /// Its own (an asynchronous call).
    Owned(Arc<Plan>),
}

// SAFETY: the buffers' issuer keeps them valid and untouched until the collective has
// completed (blocking calls wait for it; async calls park the owned buffers in the
// completion), and so a lent plan, which is only read; only the thread running the
// collective uses them.
unsafe impl Send for Coll {}

impl Coll {
    /// A collective on `plan`, which the caller lends.
    ///
    /// # Safety
    /// `plan` must stay alive until the collective has completed (its outcome handed over).
    pub unsafe fn lent(plan: &Plan, bufs: Bufs) -> Coll {
        Coll { plan: PlanHold::Lent(NonNull::from(plan)), bufs }
    }

    /// A collective that owns its plan.
    pub fn owned(plan: Arc<Plan>, bufs: Bufs) -> Coll {
        Coll { plan: PlanHold::Owned(plan), bufs }
    }

    fn plan(&self) -> &Plan {
        match &self.plan {
            // SAFETY: `Coll::lent`'s caller keeps the plan alive until the collective has
            // completed, and the stream uses a task only until then.
            PlanHold::Lent(p) => unsafe { p.as_ref() },
            PlanHold::Owned(p) => p,
        }
    }
}

impl Task for Coll {
    fn name(&self, seq: u64) -> String {
        self.plan().desc.with_seq(seq).to_string()
    }

    fn span(&self) -> SpanOp {
        let d = &self.plan().desc;
        SpanOp::Collective { kind: d.kind, dtype: d.dtype, count: self.bufs.input_len / d.dtype.size() }
    }

    fn bytes(&self) -> usize {
        self.bufs.input_len
    }

    fn flight(&self, seq: u64) -> Option<(OpDesc, usize)> {
        Some((self.plan().desc.with_seq(seq), self.bufs.input_len.max(self.bufs.output_len)))
    }
}

impl Backend for Engine {
    type Task = Coll;
    const THREAD: &'static str = "xccl-r";

    fn run(&mut self, task: &Coll, seq: u64) -> Result<()> {
        self.collective(task.plan(), seq, &task.bufs)
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
