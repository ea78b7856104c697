//! The outgoing stream of each peer: the frames of send tasks (streamed segments, or pull
//! descriptors), and the acknowledgements and push requests owed to the peer.

use std::io::{self, IoSlice};

use super::failure::lost;
use super::peer::Peer;
use super::task::{Label, Span, StepRun};
use super::{Ctx, Engine};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::frame::{self, ACK_LEN, FrameKind, HEADER_LEN, Header, PULL_LEN};
use crate::protocol::{self, Outgoing, Protocol};
use crate::transport::Link;

/// What follows an outgoing frame's header.
#[derive(Copy, Clone, Debug)]
pub(super) enum Body {
    /// Bytes of a send task's message, streamed.
    Data(Span),
    /// Where to read a segment of `len` bytes: the receiver pulls it and acknowledges it.
    Pull { desc: [u8; PULL_LEN], len: usize },
    /// The acknowledgement of a pulled segment of the peer's, or the confirmation that a
    /// pushed tail is written.
    Ack([u8; ACK_LEN]),
    /// Where the peer may write into this rank's memory: a request to the sender of a pulled
    /// message to write its tail there (`Push`), or a grant (`Grant`).
    Push([u8; PULL_LEN]),
}

/// An outgoing frame being written.
pub(super) struct OutFrame {
    /// The send task it belongs to (none for an acknowledgement).
    pub task: Option<usize>,
    pub header: [u8; HEADER_LEN],
    pub body: Body,
    /// Bytes of it written so far.
    pub written: usize,
}

impl OutFrame {
    /// A reply of `kind` (an acknowledgement of a copy, or the news that a pushed tail is
    /// written) to the frame with `header`, saying that `len` bytes were done.
    pub(super) fn reply(mut header: Header, kind: FrameKind, len: usize) -> OutFrame {
        header.kind = kind;
        header.len = ACK_LEN as u32;
        OutFrame {
            task: None,
            header: header.encode(),
            body: Body::Ack((len as u64).to_le_bytes()),
            written: 0,
        }
    }

    fn body_len(&self) -> usize {
        match self.body {
            Body::Data(s) => s.len,
            Body::Pull { .. } | Body::Push(_) => PULL_LEN,
            Body::Ack(_) => ACK_LEN,
        }
    }

    pub(super) fn total(&self) -> usize {
        HEADER_LEN + self.body_len() + frame::pad_for(self.body_len())
    }

    /// The unwritten rest of the frame, as slices for one vectored write.
    pub(super) fn rest<'a>(&'a self, pad: &'a [u8; 8]) -> ([IoSlice<'a>; 3], usize) {
        let mut parts = [IoSlice::new(&[]), IoSlice::new(&[]), IoSlice::new(&[])];
        let mut n = 0;
        let blen = self.body_len();
        if self.written < HEADER_LEN {
            parts[n] = IoSlice::new(&self.header[self.written..]);
            n += 1;
        }
        let body_at = self.written.saturating_sub(HEADER_LEN);
        if body_at < blen {
            let body: &[u8] = match &self.body {
                // SAFETY: the payload lies in a buffer of the running operation and, by the
                // step's ordering rule, nothing writes these bytes until the frame is done.
                Body::Data(s) => unsafe { s.bytes(body_at, blen) },
                Body::Pull { desc, .. } => &desc[body_at..],
                Body::Ack(a) => &a[body_at..],
                Body::Push(p) => &p[body_at..],
            };
            parts[n] = IoSlice::new(body);
            n += 1;
        }
        let total = self.total();
        let pad_at = self.written.max(HEADER_LEN + blen);
        if pad_at < total {
            parts[n] = IoSlice::new(&pad[..total - pad_at]);
            n += 1;
        }
        (parts, n)
    }
}
/// What one write of a peer's outgoing frame did.
pub(super) enum Written {
    /// The link took nothing (it is full), or no frame was in progress.
    Nothing,
    /// Part of the frame went; the rest stays in progress.
    Part,
    /// The frame went whole (its last bytes in this write) and is no longer in progress.
    Whole(OutFrame),
}

impl Peer {
    /// Writes the frame in progress (`out`) as far as `link` takes it without blocking.
    pub(super) fn write_out(&mut self, link: &mut dyn Link) -> io::Result<Written> {
        let Some(f) = self.out.as_mut() else { return Ok(Written::Nothing) };
        let pad = [0u8; 8];
        let (parts, n) = f.rest(&pad);
        let wrote = link.write(&parts[..n])?;
        f.written += wrote;
        Ok(match wrote {
            0 => Written::Nothing,
            _ if f.written == f.total() => self.out.take().map_or(Written::Nothing, Written::Whole),
            _ => Written::Part,
        })
    }
}

impl Engine {
    /// How send task `i` to `peer` goes: as compiled for a collective; chosen when its
    /// first frame goes for a point-to-point message (which never goes by LL: its receiver
    /// matches by tag, out of order).
    fn send_protocol(&self, run: &StepRun<'_>, i: usize, peer: usize) -> Protocol {
        let t = &run.tasks[i];
        match t.label {
            Label::Coll { .. } => t.proto,
            Label::P2p { .. } => {
                let m = Outgoing {
                    len: t.span.len,
                    has_dependents: t.has_dependents,
                    sole_one_way: false,
                    // Messages keep the threshold of combining receives: a 48 KiB send/recv
                    // around a ring of 2 (`xccl bench sendrecv`, 4 launches each) took
                    // 8.5-9.7 µs streamed and 13-67 µs pulled (`XCCL_PULL_BYTES=32K`).
                    plain: false,
                    pull_min: self.tuning.pull_min,
                };
                let allowed = self.tuning.protocols.for_kind(CollKind::SendRecv).without(Protocol::Ll);
                protocol::for_send(&m, &self.peers[peer].facts, allowed)
            }
        }
    }

    /// Writes frames to `peer` while the link takes them; true if anything moved.
    pub(super) fn pump_out(&mut self, run: &mut StepRun<'_>, peer: usize) -> Result<bool> {
        let mut progress = false;
        loop {
            // Acknowledgements first: the peer waits on them.
            if !self.peers[peer].start_owed() {
                let Some(i) = run.next_send(peer) else { break };
                let t = &run.tasks[i];
                let pull = self.send_protocol(run, i, peer) == Protocol::Pull;
                // A descriptor costs no ring space: a message that is all there goes in one,
                // and the receiver copies it in large pieces. One that is still arriving
                // (forwarded) is described segment by segment as it comes.
                let seg = if pull && t.deps.is_empty() { usize::MAX } else { self.peers[peer].facts.seg };
                let ready = run.send_ready(i, seg);
                // An empty message still goes out, as a bare header.
                if ready == 0 && run.tasks[i].span.len > 0 {
                    break;
                }
                if let Some(how) = self.links.gone(peer) {
                    let detail =
                        format!("it ended its communicator ({how:?}) before this rank sent it everything");
                    return Err(Error::PeerLost { op: run.op(), peer, detail });
                }
                let frame = self.frame_for(run, i, ready, pull);
                // A grant goes just before the first descriptor it comes with.
                let grant = if pull { self.grant_frame(run, i, peer) } else { None };
                let p = &mut self.peers[peer];
                match grant {
                    Some(g) => {
                        p.out = Some(g);
                        p.acks.push_front(frame);
                    }
                    None => p.out = Some(frame),
                }
            }
            let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
            let written = self.peers[peer].write_out(link).map_err(|e| lost(run.op(), peer, e))?;
            match written {
                Written::Nothing => break,
                Written::Part => progress = true,
                Written::Whole(f) => {
                    progress = true;
                    if let Some(i) = f.task {
                        let task = &mut run.tasks[i];
                        match f.body {
                            Body::Data(s) => {
                                task.sent += s.len;
                                task.done += s.len;
                                task.complete = task.done == task.span.len;
                            }
                            // Done when the peer acknowledges it.
                            Body::Pull { len, .. } => task.sent += len,
                            Body::Ack(_) | Body::Push(_) => {}
                        }
                    }
                }
            }
        }
        Ok(progress)
    }

    /// The next frame of send task `i`, covering its next `len` bytes: streamed, or (`pull`)
    /// as a descriptor for the receiver to pull.
    pub(super) fn frame_for(&self, run: &StepRun<'_>, i: usize, len: usize, pull: bool) -> OutFrame {
        let t = &run.tasks[i];
        let mut h = match (run.ctx, t.label) {
            (Ctx::Coll { desc, step }, Label::Coll { msg, .. }) => Header::data(self.comm, desc, step, msg),
            (_, Label::P2p { tag, dtype, seq }) => {
                let mut h = Header::control(FrameKind::Data, self.comm, 0);
                h.seq = seq;
                h.step = tag;
                h.dtype = dtype;
                h.count = (t.span.len / dtype.size()) as u64;
                h
            }
            (Ctx::P2p, Label::Coll { .. }) => {
                unreachable!("collective task in a point-to-point batch")
            }
        };
        h.total = t.span.len as u64;
        h.offset = t.sent as u64;
        // SAFETY: `sent + len <= span.len`, so the segment stays inside the task's span.
        let segment = Span { ptr: unsafe { t.span.ptr.add(t.sent) }, len };
        let body = if pull {
            h.kind = FrameKind::Pull;
            let mut desc = [0u8; PULL_LEN];
            desc[..8].copy_from_slice(&(segment.ptr as u64).to_le_bytes());
            desc[8..].copy_from_slice(&(len as u64).to_le_bytes());
            Body::Pull { desc, len }
        } else {
            Body::Data(segment)
        };
        h.len = match body {
            Body::Data(_) => len as u32,
            _ => PULL_LEN as u32,
        };
        OutFrame { task: Some(i), header: h.encode(), body, written: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::scripted::Scripted;

    fn data_frame(payload: &[u8]) -> OutFrame {
        let mut h = Header::control(FrameKind::Data, 5, payload.len());
        h.total = payload.len() as u64;
        let span = Span { ptr: payload.as_ptr().cast_mut(), len: payload.len() };
        OutFrame { task: Some(3), header: h.encode(), body: Body::Data(span), written: 0 }
    }

    #[test]
    fn a_frame_goes_out_in_whatever_pieces_the_link_takes() {
        let payload: Vec<u8> = (1..=13).collect();
        let mut want = data_frame(&payload).header.to_vec();
        want.extend_from_slice(&payload);
        want.extend_from_slice(&[0, 0, 0]); // padded to 8 bytes
        for takes in [vec![1000], vec![1, 71, 1, 12, 3], vec![72, 13, 2, 1], vec![5; 18]] {
            let mut link = Scripted::writes(&takes);
            let mut peer = Peer::new(None);
            peer.out = Some(data_frame(&payload));
            let mut whole = None;
            for _ in 0..takes.len() {
                match peer.write_out(&mut link).unwrap() {
                    Written::Whole(f) => whole = Some(f),
                    Written::Part => assert!(whole.is_none() && peer.out.is_some(), "{takes:?}"),
                    Written::Nothing => panic!("the link took bytes ({takes:?})"),
                }
            }
            assert_eq!(link.written, want, "{takes:?}");
            let f = whole.expect("the frame went whole");
            assert_eq!((f.task, f.written, f.total()), (Some(3), want.len(), want.len()));
            assert!(peer.out.is_none() && peer.quiet());
            assert!(matches!(peer.write_out(&mut link).unwrap(), Written::Nothing));
        }
    }

    #[test]
    fn a_full_link_takes_nothing_and_a_broken_one_fails() {
        let payload = [7u8; 8];
        let mut peer = Peer::new(None);
        peer.out = Some(data_frame(&payload));
        let mut full = Scripted::writes(&[0, 10]);
        assert!(matches!(peer.write_out(&mut full).unwrap(), Written::Nothing));
        assert!(matches!(peer.write_out(&mut full).unwrap(), Written::Part));
        assert_eq!(peer.out.as_ref().map(|f| f.written), Some(10));
        let mut broken = Scripted::broken();
        let failed = peer.write_out(&mut broken).err().map(|e| e.kind());
        assert_eq!(failed, Some(io::ErrorKind::BrokenPipe));
        assert_eq!(peer.out.as_ref().map(|f| f.written), Some(10), "a failed write moves nothing");
    }
}
