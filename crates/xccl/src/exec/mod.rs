//! The executor: runs any [`Program`](crate::schedule::Program) (or a batch of
//! point-to-point messages) over any [`Links`], in named parts:
//!
//! | file | concept |
//! |---|---|
//! | `mod.rs` | the [`Engine`] of one rank in one communicator, and its entry points |
//! | `plan.rs` | a collective's [`Plan`], its steps compiled once: labels, protocols, ordering |
//! | `task.rs` | the operations of the step being run and the questions the loop asks of them |
//! | `step.rs` | the run loop: steps in turn, and one step's passes, polls and sleeps |
//! | `peer.rs` | one [`Peer`](peer::Peer): its link's facts and the wire state that outlives a step |
//! | `express.rs` | the express lane for steps of small messages |
//! | `ll.rs` | the LL protocol: small messages through the links' LL channels |
//! | `outbound.rs` | frames to a peer: streamed segments, pull descriptors, what is owed; `Peer::write_out` writes the frame in progress as far as the link takes it |
//! | `inbound.rs` | frames from a peer: checked headers, placed payloads, pulls, splits |
//! | `fused.rs` | the fused protocol: a folded pull's result written into its sender's next receive, where the sender granted it |
//! | `reading.rs` | where reading a peer's stream stands (`Inbound`); `Inbound::fill` reads a header, control payload or padding as far as the link gives it |
//! | `scripted.rs` | (tests) a link that cuts its stream wherever a test says, for the per-peer machines' unit tests |
//! | `p2p.rs` | point-to-point matching and the stash of early messages |
//! | `failure.rs` | aborts, lost peers, timeouts; `Fate`, what befell the communicator (its failure, the program's abort, the collectives it ran last) |
//! | `fuzzing.rs` | the executor with its peer played from bytes, for the fuzzer; and recording what a peer sends, for its seeds |
//!
//! The step ordering rule is `schedule::order`'s; how each message travels is
//! [`protocol`](crate::protocol)'s choice. Messages are cut into segments of at most the
//! link's frame size, so a rank reduces segment `k` while its peer is already sending
//! segment `k + 1`, and a forwarding rank passes segment `k` on while segment `k + 1` is
//! still arriving. Progress is measured per operation in bytes done from the start of its
//! region: op `j` may touch byte `b` of its region once every earlier op it follows has done
//! `b` bytes of an identical region (or has finished, for a merely overlapping one).

mod express;
mod failure;
mod fused;
pub(crate) mod fuzzing;
mod inbound;
mod ll;
mod outbound;
mod p2p;
mod peer;
mod plan;
mod reading;
#[cfg(test)]
mod scripted;
mod step;
mod task;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::frame::OpDesc;
use crate::protocol::ProtocolPolicy;
use crate::reduce::ReduceOp;
use crate::transport::{Farewell, Links};

use failure::Fate;
use p2p::Stash;
pub(crate) use p2p::{P2p, P2pFeed};
use peer::Peer;
pub(crate) use plan::Plan;
use task::{StepBufs, StepRun};

/// The caller's buffers of one collective, as raw byte ranges.
///
/// The memory must stay valid, and untouched by anyone else, until the operation that
/// received these buffers has completed.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Bufs {
    pub input: *const u8,
    pub input_len: usize,
    pub output: *mut u8,
    pub output_len: usize,
}
/// How the executor behaves; fixed per communicator.
#[derive(Clone, Debug)]
pub(crate) struct Tuning {
    /// Longest wait without progress before an operation fails.
    pub timeout: Duration,
    /// Most bytes of unexpected point-to-point messages kept at once.
    pub max_stash: usize,
    /// From which length messages are pulled by receivers that can read this rank's memory
    /// (`usize::MAX`: never).
    pub pull_min: crate::protocol::PullMin,
    /// The protocols each collective may use (`XCCL_PROTO`).
    pub protocols: ProtocolPolicy,
    /// Where a rank that times out finds out which rank is silent (the job's store), if the
    /// ranks share one.
    pub board: Option<std::sync::Arc<dyn crate::stall::Board>>,
}
/// One rank's executor in one communicator: its links, the state of each peer, and all
/// other state that outlives a step.
pub(crate) struct Engine {
    rank: usize,
    nranks: usize,
    comm: u64,
    links: Links,
    /// Per peer: its link's facts and the wire state kept across operations.
    peers: Vec<Peer>,
    /// Staging for pulled segments that are combined.
    stage: Vec<u64>,
    tuning: Tuning,
    scratch: Vec<u64>,
    /// Step buffers kept between steps.
    spare: Option<Box<StepBufs>>,
    /// Point-to-point messages that arrived before their receives.
    stash: Stash,
    /// What befell the communicator: its failure, the program's abort, what it ran.
    fate: Fate,
}

/// How long an aborting rank tries to finish half-written frames so that its abort notice
/// can follow them.
pub(super) const ABORT_PATIENCE: Duration = Duration::from_millis(200);

// SAFETY: the raw pointers in `out` frames point into buffers of the operation being run,
// which the submitter keeps valid until the operation completes; frames never outlive it.
unsafe impl Send for Engine {}

/// What the step is part of, for labels, checks and messages.
#[derive(Copy, Clone)]
pub(super) enum Ctx<'a> {
    /// Step `step` of collective `desc`.
    Coll { desc: &'a OpDesc, step: u32 },
    /// A point-to-point batch.
    P2p,
}
impl Ctx<'_> {
    /// The operation, for messages.
    pub fn describe(&self) -> String {
        match self {
            Ctx::Coll { desc, .. } => desc.to_string(),
            Ctx::P2p => "send/recv".to_string(),
        }
    }

    /// The element type and reduction of a combining step.
    pub fn combine(&self) -> Option<(DType, ReduceOp)> {
        match self {
            Ctx::Coll { desc, .. } => desc.op.map(|op| (desc.dtype, op)),
            Ctx::P2p => None,
        }
    }
}
impl Engine {
    pub fn new(rank: usize, nranks: usize, comm: u64, mut links: Links, tuning: Tuning) -> Engine {
        let peers = (0..nranks).map(|p| Peer::new(links.link(p).ok())).collect();
        Engine {
            peers,
            stage: Vec::new(),
            rank,
            nranks,
            comm,
            links,
            tuning,
            scratch: Vec::new(),
            spare: None,
            stash: Stash::default(),
            fate: Fate::default(),
        }
    }

    /// A waker for this engine's waits.
    pub fn waker(&self) -> crate::transport::Waker {
        self.links.waker()
    }

    /// Where the program's abort is posted (see [`Engine::cancel`]).
    pub fn cancel_handle(&self) -> Arc<OnceLock<String>> {
        self.fate.cancel.clone()
    }

    /// The error that killed this communicator, if one did.
    pub fn dead(&self) -> Option<&Error> {
        self.fate.dead.as_ref()
    }

    /// Fails every operation from now on with `err`, and tells the peers.
    pub fn fail(&mut self, err: Error) {
        self.abort(&err);
    }

    /// Closes the links cleanly (after the last operation).
    pub fn close(&mut self, farewell: Farewell) {
        if self.fate.dead.is_some() {
            return;
        }
        let mid: Vec<bool> = self.peers.iter().map(|p| p.out.is_some()).collect();
        self.links.close_all(&farewell, &mid, Duration::from_secs(2));
        self.fate.dead = Some(Error::Internal("communicator used after it was closed".into()));
    }

    /// Runs collective `plan` as operation number `seq` on `bufs`.
    pub fn collective(&mut self, plan: &Plan, seq: u64, bufs: &Bufs) -> Result<()> {
        let desc = plan.desc.with_seq(seq);
        self.ensure_alive(|| desc.to_string())?;
        if bufs.input_len < plan.input_len || bufs.output_len < plan.output_len {
            return Err(Error::Internal(format!("{desc}: buffers smaller than the plan's")));
        }
        let res = self.run_program(&desc, plan, bufs).map_err(|e| self.explain(e));
        self.fate.record(desc);
        if let Err(e) = &res {
            // The operations before it are in the stream's flight record.
            tracing::error!(rank = self.rank, comm = self.comm, "{e}");
            self.abort(e);
        }
        res
    }

    /// Runs point-to-point messages from `feed` concurrently, taking in those issued
    /// meanwhile, until every message taken has completed and none is waiting.
    pub fn p2p(&mut self, feed: &mut dyn P2pFeed) -> Result<()> {
        self.ensure_alive(|| "send/recv".to_string())?;
        let mut run = StepRun::new(Ctx::P2p, self.nranks, self.take_bufs());
        let res = self.run_step(&mut run, Some(feed)).map_err(|e| self.explain(e));
        self.spare = Some(run.into_bufs());
        if let Err(e) = &res {
            self.abort(e);
        }
        res
    }
}
