//! The incoming stream of each peer: frame headers checked against what this rank expects,
//! payloads placed or reduced where they belong, pulls (single copies out of the peer's
//! memory) and their acknowledgements, split copies, and abort notices.

use super::failure::lost;
use super::fused;
use super::outbound::{Body, OutFrame};
use super::reading::{Control, Filled, Inbound, Target};
use super::task::{Act, Label, StepRun, fold, fold_kept};
use super::{Ctx, Engine};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::frame::{self, FrameKind, HEADER_LEN, Header, PULL_LEN};
use crate::protocol::{self, Incoming};
use crate::transport::Polling;
use crate::transport::pull::{self, Pull};

/// Bytes pulled per copy when combining: staged in L2, then reduced.
const PULL_CHUNK: usize = 256 << 10;

/// Where a split copy divides a message: a multiple of this many bytes (a page), so that
/// the two sides never write the same page.
const SPLIT_ALIGN: usize = 4096;

/// Bytes pulled per copy into a plain receive that a later operation of its step follows
/// (a forwarding rank passes the first piece on soon); one that nothing follows is copied in
/// one call, which amortises the kernel's work best.
pub(super) const PULL_PLAIN_CHUNK: usize = 4 << 20;

impl Engine {
    /// Whether the pull of segment `header` (`len` bytes) into receive task `i` from `peer`
    /// is split with its sender (`protocol::splits`).
    fn splits(&self, run: &StepRun<'_>, i: usize, peer: usize, header: &Header, len: usize) -> bool {
        let t = &run.tasks[i];
        let Ctx::Coll { desc, .. } = run.ctx else { return false };
        let m = Incoming {
            len,
            whole: header.offset == 0 && len as u64 == header.total,
            plain_and_last: matches!(t.act, Act::Recv { with: None, .. }) && !t.has_dependents,
            one_way: run.one_way() && matches!(self.links.polling(), Some(Polling::Spin(_))),
        };
        protocol::splits(&m, &self.peers[peer].facts, self.tuning.protocols.for_kind(desc.kind))
    }

    /// Reads from `peer` while bytes arrive and have somewhere to go; true if anything moved.
    pub(super) fn pump_in(&mut self, run: &mut StepRun<'_>, peer: usize) -> Result<bool> {
        let mut progress = false;
        loop {
            let moved = match std::mem::take(&mut self.peers[peer].inbound) {
                Inbound::Idle => {
                    // Frames are read when one is expected, and also when this rank waits only
                    // for LL messages but a frame came instead: the peer cannot have gone on
                    // without sending them, so that frame is a notice or a mismatch.
                    // The ring first: an LL message sent before that frame shows by then.
                    let look = run.expects_from(peer)
                        || (run.next_ll_recv(peer).is_some()
                            && self.links.link(peer).is_ok_and(|l| l.holds(HEADER_LEN) && !l.ll_pending()));
                    if look {
                        self.peers[peer].inbound = Inbound::Header { buf: [0; HEADER_LEN], have: 0 };
                    }
                    look
                }
                mut part @ (Inbound::Header { .. } | Inbound::Pad { .. } | Inbound::Control { .. }) => {
                    let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
                    let (n, filled) = part.fill(link).map_err(|e| lost(run.op(), peer, e))?;
                    self.peers[peer].inbound = match filled {
                        None => part,
                        Some(Filled::Header(buf)) => self.on_header(run, peer, &buf)?,
                        Some(Filled::Control(what, buf)) => self.on_control(run, peer, what, &buf)?,
                        Some(Filled::Pad) => Inbound::Idle,
                    };
                    n > 0
                }
                Inbound::Payload { target, remaining, pad } => {
                    let n = self.read_payload(run, peer, target, remaining)?;
                    self.peers[peer].inbound = if n < remaining {
                        Inbound::Payload { target, remaining: remaining - n, pad }
                    } else {
                        self.payload_done(run, peer, target)?;
                        if pad > 0 { Inbound::Pad { remaining: pad } } else { Inbound::Idle }
                    };
                    n > 0
                }
                Inbound::Pulling { target, from, addr, len, mut pos, header } => {
                    // `addr` is the peer's word: an address past the end of memory is refused
                    // by the copy, never wrapped around.
                    let at = addr.checked_add(pos as u64).ok_or_else(|| Error::Protocol {
                        op: run.ctx.describe(),
                        peer,
                        detail: format!("pull at {addr:#x}+{pos} runs past the end of memory"),
                    })?;
                    let n = self.pull(run, peer, target, from, at, len - pos)?;
                    pos += n;
                    self.peers[peer].inbound = if pos < len {
                        Inbound::Pulling { target, from, addr, len, pos, header }
                    } else {
                        // Copied: the sender may reuse the segment.
                        self.peers[peer].acks.push_back(OutFrame::reply(header, FrameKind::Ack, len));
                        self.payload_done(run, peer, target)?;
                        if let Target::Task(i) = target {
                            self.folded_ahead(run, i, peer);
                        }
                        Inbound::Idle
                    };
                    n > 0
                }
                Inbound::Pushing { task, to, from, addr, mut pos, header } => {
                    let t = &run.tasks[task];
                    let len = t.span.len - from;
                    let n = (len - pos).min(PULL_PLAIN_CHUNK);
                    let at = addr.checked_add(pos as u64).ok_or_else(|| Error::Protocol {
                        op: run.ctx.describe(),
                        peer,
                        detail: format!("push to {addr:#x}+{pos} runs past the end of memory"),
                    })?;
                    // SAFETY: the bytes lie in the send's span (`from + pos + n <= span.len`),
                    // which only sends read; the receiver named `addr..addr + len` as the tail
                    // of its own receive buffer, which it leaves alone until it is told below
                    // that the tail is written.
                    unsafe { pull::write(to, at, t.span.bytes(from + pos, from + pos + n)) }
                        .map_err(|e| lost(run.op(), peer, e))?;
                    pos += n;
                    self.peers[peer].inbound = if pos < len {
                        Inbound::Pushing { task, to, from, addr, pos, header }
                    } else {
                        let t = &mut run.tasks[task];
                        t.pushed = len;
                        t.complete = t.done + t.pushed == t.span.len;
                        self.peers[peer].acks.push_back(OutFrame::reply(header, FrameKind::Pushed, len));
                        Inbound::Idle
                    };
                    n > 0
                }
            };
            if !moved {
                break;
            }
            progress = true;
        }
        Ok(progress)
    }

    /// Checks a complete header and decides where its payload goes.
    pub(super) fn on_header(
        &mut self,
        run: &mut StepRun<'_>,
        peer: usize,
        buf: &[u8; HEADER_LEN],
    ) -> Result<Inbound> {
        let ctx = run.ctx;
        let protocol = |detail: String| Error::Protocol { op: ctx.describe(), peer, detail };
        let h = Header::decode(buf).map_err(protocol)?;
        if h.comm != self.comm {
            return Err(protocol(format!(
                "frame of communicator {:#x} on a link of communicator {:#x}",
                h.comm, self.comm
            )));
        }
        let len = h.len as usize;
        let pad = frame::pad_for(len);
        let target = match h.kind {
            FrameKind::Goodbye => {
                return Err(Error::PeerLost {
                    op: ctx.describe(),
                    peer,
                    detail: "it closed its communicator while this rank still expected data from it \
                             (did it issue fewer operations?)"
                        .into(),
                });
            }
            FrameKind::Abort => {
                self.peers[peer].notice.clear();
                Target::Reason { origin: h.root as usize }
            }
            FrameKind::Ack | FrameKind::Push | FrameKind::Pushed | FrameKind::Grant => {
                let what = match h.kind {
                    FrameKind::Ack => Control::Ack { header: h },
                    FrameKind::Push => Control::Push { header: h },
                    FrameKind::Grant => Control::Grant { header: h },
                    _ => Control::Pushed { header: h },
                };
                return Ok(Inbound::Control { what, buf: [0; PULL_LEN], have: 0 });
            }
            FrameKind::Data | FrameKind::Pull => {
                let target = if h.coll == CollKind::SendRecv {
                    self.route_p2p(run, peer, &h)?
                } else {
                    Target::Task(self.coll_target(run, peer, &h)?)
                };
                if h.kind == FrameKind::Pull {
                    if self.peers[peer].pull_from.is_none() {
                        return Err(protocol(
                            "it sent a pull descriptor, but this rank cannot read its memory".into(),
                        ));
                    }
                    let what = Control::Pull { target, header: h };
                    return Ok(Inbound::Control { what, buf: [0; PULL_LEN], have: 0 });
                }
                if let Target::Task(i) = target
                    && run.tasks[i].push_to.is_some()
                {
                    return Err(protocol(
                        "it granted this rank its next receive for a message it folds, then streamed that message \
                         instead of describing it"
                            .into(),
                    ));
                }
                target
            }
        };
        if len == 0 {
            self.payload_done(run, peer, target)?;
            return Ok(Inbound::Idle);
        }
        Ok(Inbound::Payload { target, remaining: len, pad })
    }

    /// The receive task of the current collective step that a data or pull frame from `peer`
    /// belongs to, after checking that it is the frame expected.
    pub(super) fn coll_target(&self, run: &StepRun<'_>, peer: usize, h: &Header) -> Result<usize> {
        let ctx = run.ctx;
        let protocol = |detail: String| Error::Protocol { op: ctx.describe(), peer, detail };
        let Ctx::Coll { desc, step } = run.ctx else {
            return Err(Error::Mismatch {
                rank: self.rank,
                local: "send/recv (a point-to-point receive from it)".into(),
                peer,
                remote: h.describe(),
            });
        };
        if !h.matches(desc) {
            // A frame of an earlier operation: compare with what this rank ran then.
            let ours = self.fate.ran(|d| d.seq == h.seq && h.seq < desc.seq).unwrap_or(desc);
            return Err(Error::Mismatch {
                rank: self.rank,
                local: ours.to_string(),
                peer,
                remote: h.describe(),
            });
        }
        let Some(i) = run.next_recv(peer) else {
            if let Some(i) = run.next_ll_recv(peer) {
                let t = &run.tasks[i];
                return Err(Error::Mismatch {
                    rank: self.rank,
                    local: format!("{desc} expecting {} bytes by LL", t.span.len),
                    peer,
                    remote: format!(
                        "{} sending {} bytes as a frame (do the counts passed, or XCCL_PROTO, differ?)",
                        h.describe(),
                        h.total
                    ),
                });
            }
            return Err(protocol(format!("step {} message {} arrived but none was expected", h.step, h.msg)));
        };
        let t = &run.tasks[i];
        let Label::Coll { msg, .. } = t.label else { unreachable!("collective step has collective labels") };
        if h.step != step || h.msg != msg {
            return Err(protocol(format!(
                "got step {} message {}, expected step {step} message {msg}: the ranks' schedules disagree",
                h.step, h.msg
            )));
        }
        if h.total != t.span.len as u64 {
            return Err(Error::Mismatch {
                rank: self.rank,
                local: format!("{desc} expecting {} bytes in this message", t.span.len),
                peer,
                remote: format!("{} sending {} bytes (do the counts passed differ?)", h.describe(), h.total),
            });
        }
        if h.offset != t.done as u64 {
            return Err(protocol(format!(
                "frame at offset {} while {} bytes were received",
                h.offset, t.done
            )));
        }
        Ok(i)
    }

    /// Acts on a complete control payload: starts a pull, or applies an acknowledgement.
    fn on_control(
        &mut self,
        run: &mut StepRun<'_>,
        peer: usize,
        what: Control,
        buf: &[u8; PULL_LEN],
    ) -> Result<Inbound> {
        let ctx = run.ctx;
        let protocol = |detail: String| Error::Protocol { op: ctx.describe(), peer, detail };
        let word = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        match what {
            Control::Pull { target, header } => {
                let (addr, len) = (word(0), word(1));
                let room = header.total.saturating_sub(header.offset);
                if len == 0 || len > room || addr == 0 {
                    return Err(protocol(format!(
                        "pull of {len} bytes at {addr:#x} into {room} remaining bytes"
                    )));
                }
                let from = self.peers[peer]
                    .pull_from
                    .ok_or_else(|| protocol("pull from an unreadable peer".into()))?;
                let len = len as usize;
                let mine = match target {
                    Target::Task(i) if self.splits(run, i, peer, &header, len) => {
                        // Copy the head, and have the sender write the tail meanwhile.
                        let head = (len / 2) & !(SPLIT_ALIGN - 1);
                        let t = &mut run.tasks[i];
                        t.awaited = len - head;
                        let mut request = header;
                        request.kind = FrameKind::Push;
                        request.len = PULL_LEN as u32;
                        let mut desc = [0u8; PULL_LEN];
                        desc[..8].copy_from_slice(&(t.span.ptr as u64 + head as u64).to_le_bytes());
                        desc[8..].copy_from_slice(&(head as u64).to_le_bytes());
                        let frame = OutFrame {
                            task: None,
                            header: request.encode(),
                            body: Body::Push(desc),
                            written: 0,
                        };
                        self.peers[peer].acks.push_back(frame);
                        head
                    }
                    _ => len,
                };
                Ok(Inbound::Pulling { target, from, addr, len: mine, pos: 0, header })
            }
            Control::Push { header } => {
                let (addr, from) = (word(0), word(1) as usize);
                let i = run.acked_send(peer, &header).ok_or_else(|| {
                    protocol(format!(
                        "push request for a message this rank did not send ({})",
                        header.describe()
                    ))
                })?;
                let t = &run.tasks[i];
                if header.offset != 0
                    || t.sent != t.span.len
                    || from == 0
                    || from >= t.span.len
                    || addr == 0
                    || t.pushed > 0
                {
                    return Err(protocol(format!(
                        "push request of bytes {from}.. of a {}-byte message to {addr:#x}",
                        t.span.len
                    )));
                }
                let to = self.peers[peer]
                    .pull_from
                    .ok_or_else(|| protocol("push request from a peer this rank cannot write to".into()))?;
                Ok(Inbound::Pushing { task: i, to, from, addr, pos: 0, header })
            }
            Control::Grant { header } => {
                self.on_grant(run, peer, header, word(0), word(1))?;
                Ok(Inbound::Idle)
            }
            Control::Pushed { header } => {
                let pushed = word(0) as usize;
                if self.on_pushed_ahead(run, peer, &header, pushed)? {
                    return Ok(Inbound::Idle);
                }
                let i = run.pushed_recv(peer, &header).ok_or_else(|| {
                    protocol(format!(
                        "confirmation of a push this rank did not ask for ({})",
                        header.describe()
                    ))
                })?;
                let t = &mut run.tasks[i];
                if t.granted && pushed == 0 {
                    // The grant was declined: the message comes as usual.
                    (t.awaited, t.granted) = (0, false);
                    return Ok(Inbound::Idle);
                }
                if pushed != t.awaited {
                    return Err(protocol(format!(
                        "{pushed} bytes pushed where {} were asked for",
                        t.awaited
                    )));
                }
                (t.awaited, t.granted) = (0, false);
                t.done += pushed;
                t.complete = t.done == t.span.len;
                Ok(Inbound::Idle)
            }
            Control::Ack { header } => {
                let acked = word(0) as usize;
                let i = run.acked_send(peer, &header).ok_or_else(|| {
                    protocol(format!(
                        "acknowledgement of a message this rank did not send ({})",
                        header.describe()
                    ))
                })?;
                let t = &mut run.tasks[i];
                // `acked` is the peer's word: checked, so that no value of it overflows.
                let within = t.done.checked_add(t.pushed).and_then(|n| n.checked_add(acked));
                if header.offset != t.done as u64 || within.is_none_or(|n| n > t.sent) {
                    return Err(protocol(format!(
                        "acknowledgement of bytes {}..+{acked} while {} of {} sent bytes were acknowledged",
                        header.offset, t.done, t.sent
                    )));
                }
                t.done += acked;
                t.complete = t.done + t.pushed == t.span.len;
                Ok(Inbound::Idle)
            }
        }
    }

    /// Pulls up to `left` bytes at `addr` of `peer` (`from`) into `target`, as far as the
    /// ordering rule allows; returns how many.
    fn pull(
        &mut self,
        run: &mut StepRun<'_>,
        peer: usize,
        target: Target,
        from: Pull,
        addr: u64,
        left: usize,
    ) -> Result<usize> {
        let ctx = run.ctx;
        let fail = |e: std::io::Error| lost(ctx.describe(), peer, e);
        match target {
            Target::Stash(id) => {
                let s = self
                    .stash
                    .get_mut(id)
                    .ok_or_else(|| Error::Internal("pull into a dropped message".into()))?;
                // SAFETY: the sender keeps the segment valid and unwritten until acknowledged.
                unsafe { pull::copy(from, addr, &mut s.data[s.filled..s.filled + left]) }.map_err(fail)?;
                s.filled += left;
                Ok(left)
            }
            Target::Reason { .. } => Err(Error::Internal("pull into an abort reason".into())),
            Target::Task(i) => {
                let t = &run.tasks[i];
                let combining = matches!(t.act, Act::Recv { with: Some(_), .. });
                let chunk = match (combining, t.has_dependents) {
                    (true, _) => PULL_CHUNK,
                    (false, true) => PULL_PLAIN_CHUNK,
                    (false, false) => usize::MAX,
                };
                let n = run.limit(i).saturating_sub(t.done).min(left).min(chunk);
                if n == 0 {
                    return Ok(0);
                }
                let (done, dst) = (t.done, t.span);
                match (t.act, run.ctx.combine()) {
                    (Act::Recv { with: Some(with), .. }, Some((dtype, rop))) => {
                        let words = PULL_CHUNK / 8;
                        if self.stage.len() < words {
                            self.stage.resize(words, 0);
                        }
                        let stage = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.stage)[..n];
                        // SAFETY: the sender keeps the segment valid and unwritten until
                        // acknowledged; `stage` is our own memory.
                        unsafe { pull::copy(from, addr, stage) }.map_err(fail)?;
                        match run.tasks[i].push_to {
                            // SAFETY: [done, done + n) lies in the destination (n <= limit -
                            // done) and, by the ordering rule, no other view of it is alive.
                            None => unsafe { fold(dtype, rop, dst, with, done, stage) }?,
                            Some(to) => {
                                // SAFETY: as above.
                                let result = unsafe { fold_kept(dtype, rop, dst, with, done, stage) }?;
                                // Written ahead while in cache (`exec/fused.rs`).
                                fused::write_ahead(&to, done, result).map_err(fail)?;
                            }
                        }
                    }
                    _ => {
                        // SAFETY: as above; the pull writes only the destination range.
                        unsafe { pull::copy(from, addr, dst.bytes_mut(done, done + n)) }.map_err(fail)?;
                    }
                }
                run.tasks[i].done += n;
                Ok(n)
            }
        }
    }

    /// Reads up to `remaining` payload bytes from `peer` into `target`; returns how many.
    pub(super) fn read_payload(
        &mut self,
        run: &mut StepRun<'_>,
        peer: usize,
        target: Target,
        remaining: usize,
    ) -> Result<usize> {
        let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
        let ctx = run.ctx;
        let n = match target {
            Target::Reason { .. } => {
                let mut buf = [0u8; 512];
                let n =
                    link.read(&mut buf[..remaining.min(512)]).map_err(|e| lost(ctx.describe(), peer, e))?;
                self.peers[peer].notice.extend_from_slice(&buf[..n]);
                n
            }
            Target::Stash(id) => {
                let s = self
                    .stash
                    .get_mut(id)
                    .ok_or_else(|| Error::Internal("frame for a dropped message".into()))?;
                let n = link
                    .read(&mut s.data[s.filled..s.filled + remaining])
                    .map_err(|e| lost(ctx.describe(), peer, e))?;
                s.filled += n;
                n
            }
            Target::Task(i) => {
                let allowed = run.limit(i).saturating_sub(run.tasks[i].done).min(remaining);
                if allowed == 0 {
                    return Ok(0);
                }
                let t = &run.tasks[i];
                let (done, dst) = (t.done, t.span);
                let n = match (t.act, run.ctx.combine()) {
                    (Act::Recv { with: Some(with), .. }, Some((dtype, rop))) => {
                        let mut at = done;
                        let mut failure = None;
                        let n = link
                            .read_with(allowed, dtype.size(), &mut |piece| {
                                let end = at + piece.len();
                                // SAFETY: [at, end) lies in the destination (end <= done +
                                // allowed <= span.len) and, by the ordering rule, no other view
                                // of it is alive; `with` has the same length as `dst`.
                                let res = unsafe { fold(dtype, rop, dst, with, at, piece) };
                                if let Err(e) = res {
                                    failure.get_or_insert(e);
                                }
                                at = end;
                            })
                            .map_err(|e| lost(ctx.describe(), peer, e))?;
                        if let Some(e) = failure {
                            return Err(e);
                        }
                        n
                    }
                    _ => {
                        // SAFETY: as above, for a plain receive: [done, done + allowed) lies in
                        // the destination and no other view of it is alive.
                        let dst = unsafe { dst.bytes_mut(done, done + allowed) };
                        link.read(dst).map_err(|e| lost(ctx.describe(), peer, e))?
                    }
                };
                run.tasks[i].done += n;
                n
            }
        };
        Ok(n)
    }

    /// The last payload byte of a frame has arrived.
    pub(super) fn payload_done(&mut self, run: &mut StepRun<'_>, peer: usize, target: Target) -> Result<()> {
        match target {
            Target::Reason { origin } => {
                let reason = String::from_utf8_lossy(&self.peers[peer].notice).into_owned();
                Err(Error::RemoteAbort { op: run.op(), peer, origin, reason })
            }
            Target::Task(i) => {
                let t = &mut run.tasks[i];
                t.complete = t.done == t.span.len;
                if t.complete && matches!(t.label, Label::P2p { .. }) {
                    self.peers[peer].continuing = None;
                }
                Ok(())
            }
            Target::Stash(id) => {
                if let Some(tag) = self.stash.full_tag(id) {
                    self.peers[peer].continuing = None;
                    if let Some(i) = run.matching_recv(peer, tag) {
                        self.claim_stashed(run, i)?;
                    }
                }
                Ok(())
            }
        }
    }
}
