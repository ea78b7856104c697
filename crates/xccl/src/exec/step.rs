//! The run loop: a collective's steps one after another, and the loop that runs one step
//! (or a point-to-point batch) to completion: each pass moves LL messages, writes as many
//! frames as the links take and the ordering rule allows, reads and places (or reduces) as
//! many bytes as have arrived, and runs local copies; a pass that moves nothing polls a
//! while, then sleeps on the links until something changes.

use std::time::{Duration, Instant};

use super::p2p::P2pFeed;
use super::plan::{Compiling, Plan};
use super::reading::{Inbound, Target};
use super::task::{Span, StepBufs, StepRun};
use super::{Bufs, Ctx, Engine, failure};
use crate::error::{Error, Result};
use crate::frame::OpDesc;
use crate::reduce::{self, ReduceOp};
use crate::schedule::{Buf, Region};
use crate::transport::{Interest, Polling, Spell};

/// How often a waiting step asks whether a peer's host stopped answering.
const LIVENESS_LOOK: Duration = Duration::from_secs(1);

impl Engine {
    pub(super) fn run_program(&mut self, desc: &OpDesc, plan: &Plan, bufs: &Bufs) -> Result<()> {
        let esize = desc.dtype.size();
        let words = (plan.program.scratch * esize).div_ceil(8);
        if self.scratch.len() < words {
            self.scratch.resize(words, 0);
        }
        let scratch = self.scratch.as_mut_ptr().cast::<u8>();
        let span = |r: &Region| {
            let base = match r.buf {
                Buf::Input => bufs.input.cast_mut(),
                Buf::Output => bufs.output,
                Buf::Scratch => scratch,
            };
            // SAFETY: `Plan::new` checked that the region lies inside buffers of the plan's
            // lengths, and `collective` that the buffers are at least that long.
            Span { ptr: unsafe { base.add(r.off * esize) }, len: r.len * esize }
        };
        // Input and output are either the same memory or disjoint (they come from one
        // mutable slice, or from a shared and a mutable one).
        let how = Compiling {
            rank: self.rank,
            peers: &self.peers,
            policy: &self.tuning.protocols,
            pull_min: self.tuning.pull_min,
            spinning: matches!(self.links.polling(), Some(Polling::Spin(_))),
        };
        let steps = plan.steps(std::ptr::eq(bufs.input, bufs.output), &how)?;
        for (s, step) in steps.iter().enumerate() {
            let mut run = StepRun::new(Ctx::Coll { desc, step: s as u32 }, self.nranks, self.take_bufs());
            run.load(step, span);
            self.load_ahead(&mut run, s as u32)?;
            if self.express(&run) {
                self.run_express(&mut run)?;
            } else {
                self.run_step(&mut run, None)?;
            }
            self.spare = Some(run.into_bufs());
        }
        // Only an average needs a last pass over the result.
        if let (Some(op @ ReduceOp::Avg), Some(r)) = (desc.op, plan.result) {
            let sp = span(&r);
            // SAFETY: the region is inside its buffer (see `span`) and every task of the
            // program has finished, so nothing else views this memory.
            reduce::finalize(desc.dtype, op, unsafe { sp.bytes_mut(0, sp.len) }, self.nranks)?;
        }
        Ok(())
    }

    /// The step buffers kept from the last step (new ones after a failed step).
    pub(super) fn take_bufs(&mut self) -> Box<StepBufs> {
        self.spare.take().unwrap_or_default()
    }

    /// Runs a step to completion. With a `feed` (point-to-point batches), operations issued
    /// while it runs join it, and each one's completion is reported as it happens.
    pub(super) fn run_step(
        &mut self,
        run: &mut StepRun<'_>,
        mut feed: Option<&mut dyn P2pFeed>,
    ) -> Result<()> {
        let mut reported = 0;
        // When the step last stopped moving.
        let mut idle_since: Option<Instant> = None;
        // How the links are polled while the step does not move (memory links only).
        let mut spell: Option<Spell> = None;
        let mut last_look = Instant::now();
        loop {
            let mut progress = false;
            if let Some(feed) = feed.as_deref_mut() {
                progress |= self.take_issued(run, feed)?;
            }
            progress |= self.pump_all(run)?;
            if let Some(feed) = feed.as_deref_mut() {
                // Messages complete in any order; report each once.
                for (i, t) in run.tasks.iter().enumerate().skip(reported) {
                    if t.complete && !t.reported {
                        feed.complete(i, Ok(()));
                    }
                }
                for t in run.tasks.iter_mut().skip(reported) {
                    t.reported |= t.complete;
                }
                while run.tasks.get(reported).is_some_and(|t| t.reported) {
                    reported += 1;
                }
            }
            if run.tasks.iter().all(|t| t.complete) && self.acks_written() {
                // A batch ends when everything taken has completed and nothing new came.
                let more = match feed.as_deref_mut() {
                    Some(feed) => self.take_issued(run, feed)?,
                    None => false,
                };
                if !more {
                    return Ok(());
                }
                continue;
            }
            if progress {
                idle_since = None;
                spell = None;
                continue;
            }
            let idle = *idle_since.get_or_insert_with(Instant::now);
            // Poll memory links for a while (spinning, or yielding to a peer that needs this
            // core; see `transport::idle`), then sleep.
            if spell.is_none() {
                spell = self.links.spell(&run.touched);
            }
            if let Some(s) = spell.as_mut()
                && self.links.pause(s, &run.touched, run.copy_wait())
            {
                continue;
            }
            // A message on the channel this rank does not expect it on will never be read.
            for k in 0..run.touched.len() {
                if let Some(e) = self.ll_unexpected(run, run.touched[k]) {
                    return Err(e);
                }
            }
            let want = self.interest(run);
            if want.iter().all(|w| !w.read && !w.write) {
                return Err(Error::Internal(format!("{}: step stalled with nothing to wait for", run.op())));
            }
            self.check_cancel(|| run.op())?;
            let idle_for = idle.elapsed();
            if idle_for >= self.tuning.timeout {
                return Err(self.timeout_error(run, idle_for));
            }
            // Arm, then one last look: a peer that published before it saw the arm did not
            // ring.
            let token = self.links.arm();
            if self.pump_all(run)? {
                self.links.disarm();
                idle_since = None;
                spell = None;
                continue;
            }
            let nap = (self.tuning.timeout - idle_for).min(Duration::from_secs(1));
            // A peer that ended is not fatal yet: what it sent before may be all this step
            // needs. Reading past its last byte, or writing to it, fails at once.
            self.links.wait(&want, token, nap).map_err(|e| Error::io(format!("{}: waiting", run.op()), e))?;
            // A host that stopped answering while this rank holds bytes for it.
            if last_look.elapsed() >= LIVENESS_LOOK {
                last_look = Instant::now();
                if let Some((peer, e)) = self.links.unanswered() {
                    return Err(failure::lost(run.op(), peer, e));
                }
            }
        }
    }

    /// Whether every acknowledgement owed to a peer has been written (a step may not end
    /// before: the peer waits for it).
    fn acks_written(&self) -> bool {
        self.peers.iter().all(|p| p.owes_nothing())
    }

    /// One pass over local copies and the outgoing and incoming streams of every peer the
    /// step talks to.
    fn pump_all(&mut self, run: &mut StepRun<'_>) -> Result<bool> {
        let mut progress = false;
        for k in 0..run.touched.len() {
            let peer = run.touched[k];
            progress |= self.pump_ll(run, peer)?;
            progress |= self.pump_out(run, peer)?;
            progress |= self.pump_in(run, peer)?;
        }
        // Local copies last: the messages a pass can send go out first, and peers work on
        // them while this rank copies.
        progress |= run.local_copies();
        Ok(progress)
    }

    fn interest(&self, run: &StepRun<'_>) -> Vec<Interest> {
        (0..self.nranks)
            .map(|peer| {
                let p = &self.peers[peer];
                let write = p.has_output()
                    || run.next_send(peer).is_some_and(|i| run.send_ready(i, p.facts.seg) > 0)
                    || run.next_ll_send(peer).is_some_and(|i| run.limit(i) >= run.tasks[i].span.len);
                let read = match &p.inbound {
                    Inbound::Idle => run.expects_from(peer) || run.next_ll_recv(peer).is_some(),
                    Inbound::Header { .. } | Inbound::Pad { .. } | Inbound::Control { .. } => true,
                    Inbound::Pulling { target: Target::Task(i), .. } => run.limit(*i) > run.tasks[*i].done,
                    Inbound::Pulling { .. } | Inbound::Pushing { .. } => true,
                    Inbound::Payload { target: Target::Task(i), .. } => run.limit(*i) > run.tasks[*i].done,
                    Inbound::Payload { .. } => true,
                };
                Interest { read, write, idle: matches!(p.inbound, Inbound::Idle) }
            })
            .collect()
    }
}
