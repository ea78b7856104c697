//! The express lane: a step whose messages are all small (LL or eager) and whose links have
//! nothing in flight runs in a tight loop without the general loop's machinery. Anything
//! unusual hands the step, as it stands, to the general loop.

use super::Engine;
use super::reading::Target;
use super::task::{Act, StepRun};
use crate::error::{Error, Result};
use crate::frame::{self, FrameKind, HEADER_LEN, Header};
use crate::protocol::Protocol;

use super::failure::lost;

/// Looks the express lane makes at links that have nothing for it before it hands the step
/// to the general loop, which spins some more and then sleeps.
const EXPRESS_POLLS: u32 = 2000;

impl Engine {
    /// Whether a step may take the express lane: every message of it goes by LL or eager,
    /// and the links it uses have nothing in flight.
    pub(super) fn express(&self, run: &StepRun<'_>) -> bool {
        run.touched.iter().all(|&p| self.peers[p].quiet())
            && run.tasks.iter().all(|t| {
                matches!(t.act, Act::Copy { .. }) || matches!(t.proto, Protocol::Ll | Protocol::Eager)
            })
    }

    /// Runs a step of small messages on memory links without the general loop's machinery:
    /// an operation goes as soon as what it follows is complete, a frame is written only
    /// when the ring takes it whole and read only when it has arrived whole, and it is
    /// placed straight from the ring. Anything else (a frame that is not the one expected,
    /// a full ring, a wait longer than a moment) hands the step, as it stands, to
    /// [`Engine::run_step`], which checks, waits and reports exactly as for any step.
    pub(super) fn run_express(&mut self, run: &mut StepRun<'_>) -> Result<()> {
        // Looking again only keeps the awaited rank off the core when it waits for this one.
        let patience = if self.links.may_spin(&run.touched) { EXPRESS_POLLS } else { 0 };
        let mut polls = 0u32;
        loop {
            let mut progress = false;
            let mut done = true;
            for i in 0..run.tasks.len() {
                if run.tasks[i].complete {
                    continue;
                }
                done = false;
                if run.limit(i) < run.tasks[i].span.len {
                    continue;
                }
                let ll = run.tasks[i].ll();
                let moved = match run.tasks[i].act {
                    Act::Send { peer } if ll => self.ll_send(run, i, peer)?,
                    Act::Recv { peer, .. } if ll => self.ll_recv(run, i, peer)?,
                    Act::Send { peer } => self.express_send(run, i, peer)?,
                    Act::Recv { peer, .. } => match self.express_recv(run, i, peer)? {
                        Some(moved) => moved,
                        None => return self.run_step(run, None),
                    },
                    Act::Copy { src } => {
                        let t = &mut run.tasks[i];
                        // SAFETY: both regions lie in the operation's buffers and do not overlap
                        // (checked when the step was compiled); everything this copy follows
                        // is complete, so no other view of them is alive.
                        unsafe { crate::copy::copy(t.span.bytes_mut(0, t.span.len), src.bytes(0, src.len)) };
                        true
                    }
                };
                if moved {
                    run.tasks[i].finish();
                    progress = true;
                }
            }
            if done {
                return Ok(());
            }
            if !progress {
                polls += 1;
                if polls > patience {
                    return self.run_step(run, None);
                }
                std::hint::spin_loop();
            }
        }
    }

    /// Writes send task `i` to `peer` as one frame if the ring takes it whole (and the
    /// messages to `peer` before it have gone: they pair up with receives in order).
    fn express_send(&mut self, run: &StepRun<'_>, i: usize, peer: usize) -> Result<bool> {
        if run.next_send(peer) != Some(i) {
            return Ok(false);
        }
        let f = self.frame_for(run, i, run.tasks[i].span.len, false);
        let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
        if !link.room_for(f.total()) {
            return Ok(false);
        }
        let pad = [0u8; 8];
        let (parts, n) = f.rest(&pad);
        let wrote = link.write(&parts[..n]).map_err(|e| lost(run.op(), peer, e))?;
        if wrote != f.total() {
            return Err(Error::Internal(format!(
                "{}: a ring took {wrote} of a {}-byte frame",
                run.op(),
                f.total()
            )));
        }
        Ok(true)
    }

    /// Reads receive task `i`'s frame from `peer` if it has arrived whole and is the one
    /// expected: `Some(true)` when placed, `Some(false)` when not there yet, `None` when the
    /// general loop must take over (the header read is then in `inbound`).
    fn express_recv(&mut self, run: &mut StepRun<'_>, i: usize, peer: usize) -> Result<Option<bool>> {
        let len = run.tasks[i].span.len;
        if run.next_recv(peer) != Some(i) {
            return Ok(Some(false));
        }
        let whole = HEADER_LEN + len + frame::pad_for(len);
        let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
        if !link.holds(whole) {
            return Ok(Some(false));
        }
        let mut buf = [0u8; HEADER_LEN];
        let n = link.read(&mut buf).map_err(|e| lost(run.op(), peer, e))?;
        if n != HEADER_LEN {
            return Err(Error::Internal(format!(
                "{}: a ring held {n} of {HEADER_LEN} header bytes",
                run.op()
            )));
        }
        let expected = Header::decode(&buf).ok().filter(|h| {
            h.kind == FrameKind::Data
                && h.comm == self.comm
                && h.len as usize == len
                && h.total as usize == len
        });
        let Some(h) = expected else {
            self.peers[peer].inbound = self.on_header(run, peer, &buf)?;
            return Ok(None);
        };
        if self.coll_target(run, peer, &h)? != i {
            self.peers[peer].inbound = self.on_header(run, peer, &buf)?;
            return Ok(None);
        }
        let n = self.read_payload(run, peer, Target::Task(i), len)?;
        let pad = frame::pad_for(len);
        let mut sink = [0u8; 8];
        let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
        let padded =
            if pad > 0 { link.read(&mut sink[..pad]).map_err(|e| lost(run.op(), peer, e))? } else { 0 };
        if n != len || padded != pad {
            return Err(Error::Internal(format!("{}: a ring held part of a frame it had whole", run.op())));
        }
        Ok(Some(true))
    }
}
