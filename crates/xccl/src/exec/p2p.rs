//! Point-to-point matching: messages of a batch pair up with receives by peer and tag,
//! oldest first (MPI's non-overtaking rule); a message that arrives before its receive is
//! posted waits in the [`Stash`], within a byte budget.

use super::Engine;
use super::reading::Target;
use super::task::{Act, Label, Span, StepRun, Task};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::frame::Header;
use crate::protocol::Protocol;

/// One point-to-point message of a batch.
#[derive(Copy, Clone, Debug)]
pub(crate) struct P2p {
    pub send: bool,
    pub peer: usize,
    pub tag: u32,
    pub dtype: DType,
    /// The message (read for sends, written for receives), valid as for [`Bufs`](super::Bufs).
    pub ptr: *mut u8,
    pub len: usize,
}

/// The source of a point-to-point batch: messages as they are issued, and where to report
/// each one's completion (by its index in the order fetched).
pub(crate) trait P2pFeed {
    /// Appends the messages issued since the last call.
    fn fetch(&mut self, into: &mut Vec<P2p>);
    /// Message `index` has completed, with `result` (an error for a message that failed
    /// alone, where the backend fails messages singly: MPI).
    fn complete(&mut self, index: usize, result: Result<()>);
}

/// A point-to-point message that arrived before its receive was posted.
pub(super) struct Stashed {
    /// Names it for the frames still filling it ([`Target::Stash`]); never reused.
    id: u64,
    peer: usize,
    tag: u32,
    dtype: DType,
    seq: u64,
    pub data: Vec<u8>,
    pub filled: usize,
}

/// The messages that arrived before their receives, oldest first.
#[derive(Default)]
pub(super) struct Stash {
    items: Vec<Stashed>,
    /// Bytes held by all of them.
    bytes: usize,
    next_id: u64,
}

impl Stash {
    /// Makes room for the message `h` announces from `peer`, unless that would hold more than
    /// `max` bytes; returns its id, or the bytes already held.
    fn admit(&mut self, peer: usize, h: &Header, max: usize) -> std::result::Result<u64, usize> {
        let total = h.total as usize;
        if self.bytes.saturating_add(total) > max {
            return Err(self.bytes);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.bytes += total;
        self.items.push(Stashed {
            id,
            peer,
            tag: h.step,
            dtype: h.dtype,
            seq: h.seq,
            data: vec![0u8; total],
            filled: 0,
        });
        Ok(id)
    }

    /// The message with this id, while it is held.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut Stashed> {
        self.items.iter_mut().find(|s| s.id == id)
    }

    /// The tag of message `id` if it has arrived whole (none once it is gone).
    pub fn full_tag(&self, id: u64) -> Option<u32> {
        self.items.iter().find(|s| s.id == id && s.filled == s.data.len()).map(|s| s.tag)
    }

    /// The oldest message from `peer` with `tag`, if it has arrived whole: a later one with
    /// the same tag never overtakes it.
    fn take(&mut self, peer: usize, tag: u32) -> Option<Stashed> {
        let k = self.items.iter().position(|s| s.peer == peer && s.tag == tag)?;
        if self.items[k].filled < self.items[k].data.len() {
            return None;
        }
        let s = self.items.remove(k);
        self.bytes -= s.data.len();
        Some(s)
    }
}

impl Engine {
    /// Finds where the payload of a point-to-point frame goes: the posted receive it
    /// matches, or the stash.
    pub(super) fn route_p2p(&mut self, run: &mut StepRun<'_>, peer: usize, h: &Header) -> Result<Target> {
        let ctx = run.ctx;
        let protocol = |detail: String| Error::Protocol { op: ctx.describe(), peer, detail };
        if h.offset > 0 {
            let target = self.peers[peer]
                .continuing
                .ok_or_else(|| protocol(format!("continuation of message #{} without its start", h.seq)))?;
            // The continuation must carry on where the message stands, with the message's
            // size: its payload is written straight after the bytes already received.
            let (received, total) = match target {
                Target::Task(i) => (run.tasks[i].done, run.tasks[i].span.len),
                Target::Stash(id) => {
                    let s = self
                        .stash
                        .get_mut(id)
                        .ok_or_else(|| protocol("continuation of a dropped message".into()))?;
                    (s.filled, s.data.len())
                }
                Target::Reason { .. } => return Err(protocol("continuation of an abort notice".into())),
            };
            if h.offset != received as u64 || h.total != total as u64 {
                return Err(protocol(format!(
                    "frame covers bytes {}..+{} of a {}-byte message, which stands at byte {received} of {total}",
                    h.offset, h.len, h.total
                )));
            }
            return Ok(target);
        }
        if self.peers[peer].continuing.is_some() {
            return Err(protocol(format!(
                "message #{} began before its previous message to this rank ended",
                h.seq
            )));
        }
        let target = match run.matching_recv(peer, h.step) {
            Some(i) => {
                let t = &mut run.tasks[i];
                let Label::P2p { dtype, .. } = t.label else { unreachable!("point-to-point receive") };
                if dtype != h.dtype || t.span.len as u64 != h.total {
                    return Err(Error::Mismatch {
                        rank: self.rank,
                        local: format!(
                            "recv from rank {peer} (tag {}, {} x {dtype})",
                            h.step,
                            t.span.len / dtype.size()
                        ),
                        peer,
                        remote: h.describe(),
                    });
                }
                t.bound = true;
                Target::Task(i)
            }
            None => {
                let id =
                    self.stash.admit(peer, h, self.tuning.max_stash).map_err(|held| Error::Protocol {
                        op: ctx.describe(),
                        peer,
                        detail: format!(
                            "it sent {} that no receive has asked for, and unexpected messages already \
                         hold {held} bytes (XCCL_MAX_UNEXPECTED_BYTES={}): post the matching recv earlier",
                            h.describe(),
                            self.tuning.max_stash
                        ),
                    })?;
                Target::Stash(id)
            }
        };
        self.peers[peer].continuing = (h.total > u64::from(h.len)).then_some(target);
        Ok(target)
    }

    /// Adds the messages issued since the last look; true if there were any.
    pub(super) fn take_issued(&mut self, run: &mut StepRun<'_>, feed: &mut dyn P2pFeed) -> Result<bool> {
        let mut new = Vec::new();
        feed.fetch(&mut new);
        for m in &new {
            let (act, label) = if m.send {
                let seq = self.peers[m.peer].p2p_sent;
                self.peers[m.peer].p2p_sent += 1;
                (Act::Send { peer: m.peer }, Label::P2p { tag: m.tag, dtype: m.dtype, seq })
            } else {
                (Act::Recv { peer: m.peer, with: None }, Label::P2p { tag: m.tag, dtype: m.dtype, seq: 0 })
            };
            let span = Span { ptr: m.ptr, len: m.len };
            let i = run.push(Task::new(act, span, label, Protocol::Stream));
            self.claim_stashed(run, i)?;
        }
        Ok(!new.is_empty())
    }

    /// Completes point-to-point receive `i` from a fully stashed message, if one matches.
    pub(super) fn claim_stashed(&mut self, run: &mut StepRun<'_>, i: usize) -> Result<()> {
        let t = &run.tasks[i];
        let (Act::Recv { peer, .. }, Label::P2p { tag, dtype, .. }) = (t.act, t.label) else {
            return Ok(());
        };
        if t.bound {
            return Ok(());
        }
        let Some(s) = self.stash.take(peer, tag) else {
            return Ok(());
        };
        let t = &mut run.tasks[i];
        if s.dtype != dtype || s.data.len() != t.span.len {
            return Err(Error::Mismatch {
                rank: self.rank,
                local: format!("recv from rank {peer} (tag {tag}, {} x {dtype})", t.span.len / dtype.size()),
                peer,
                remote: format!(
                    "send (message #{}, tag {tag}, {} x {})",
                    s.seq,
                    s.data.len() / s.dtype.size(),
                    s.dtype
                ),
            });
        }
        // SAFETY: the receive's buffer is valid for the batch and nothing else views it.
        crate::copy::copy(unsafe { t.span.bytes_mut(0, t.span.len) }, &s.data);
        t.done = t.span.len;
        t.complete = true;
        t.bound = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameKind;

    fn announce(tag: u32, seq: u64, bytes: u64) -> Header {
        let mut h = Header::control(FrameKind::Data, 1, 0);
        (h.step, h.seq, h.total, h.dtype) = (tag, seq, bytes, DType::U8);
        h
    }

    fn fill(stash: &mut Stash, id: u64) {
        let s = stash.get_mut(id).unwrap();
        s.filled = s.data.len();
    }

    #[test]
    fn the_oldest_message_with_a_tag_is_taken_first_and_only_when_whole() {
        let mut st = Stash::default();
        let a = st.admit(3, &announce(7, 0, 4), 100).unwrap();
        let b = st.admit(3, &announce(7, 1, 4), 100).unwrap();
        let other = st.admit(3, &announce(8, 2, 4), 100).unwrap();
        fill(&mut st, b);
        fill(&mut st, other);
        // The later message with tag 7 is whole, but the earlier one is not: nothing yet.
        assert!(st.take(3, 7).is_none());
        assert_eq!(st.take(3, 8).map(|s| s.seq), Some(2));
        fill(&mut st, a);
        assert_eq!(st.full_tag(a), Some(7));
        assert_eq!(st.take(3, 7).map(|s| s.seq), Some(0));
        assert_eq!(st.take(3, 7).map(|s| s.seq), Some(1));
        assert!(st.take(3, 7).is_none() && st.full_tag(a).is_none());
    }

    #[test]
    fn ids_survive_the_removal_of_other_messages_and_the_budget_holds() {
        let mut st = Stash::default();
        let a = st.admit(0, &announce(1, 0, 10), 25).unwrap();
        let b = st.admit(1, &announce(1, 0, 10), 25).unwrap();
        assert_eq!(st.admit(2, &announce(1, 0, 10), 25), Err(20));
        fill(&mut st, a);
        assert!(st.take(0, 1).is_some());
        // The message still arriving keeps its id after the one before it left.
        st.get_mut(b).unwrap().data[9] = 42;
        assert_eq!(st.get_mut(b).unwrap().data[9], 42);
        assert!(st.admit(2, &announce(1, 0, 15), 25).is_ok());
    }
}
