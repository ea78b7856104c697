//! The LL protocol in the executor: a small message of a collective step travels whole
//! through its link's LL channel (`transport::ll`), where flag and data share cache lines,
//! instead of as a frame. There is no header: each message carries a label of two words,
//! the operation's sequence number and a signature of everything the ranks must agree on
//! (the call, the step, the message's index and length), so that ranks whose calls differ
//! still get a mismatch error rather than each other's data.
//!
//! LL messages pair up in order on their own channel, beside the framed stream. Whether a
//! message goes by LL is decided alike on both ends (`protocol::ll`); if the ranks disagree
//! anyway (different counts or `XCCL_PROTO`), one side finds a frame where it expected an
//! LL message or the reverse, and says so.

use super::failure::lost;
use super::reading::Inbound;
use super::task::{Act, Label, StepRun, fold};
use super::{Ctx, Engine};
use crate::algo::Algorithm;
use crate::coll::CollKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::frame::OpDesc;
use crate::reduce::ReduceOp;
use crate::transport::LlRecv;

/// Set in every label's second word, so that a label is never all zeros.
const SIGNED: u64 = 1 << 63;

/// The first word of the label of every LL message of `desc`: its sequence number (48 bits),
/// its algorithm and its reduction.
fn head(desc: &OpDesc) -> u64 {
    let op = desc.op.map_or(u8::MAX, |o| o as u8);
    (desc.seq & 0xffff_ffff_ffff) | (u64::from(desc.algo as u8) << 48) | (u64::from(op) << 56)
}

/// The second word of the label of LL message `msg` (of `len` bytes) of step `step` of
/// `desc`: its kind, its element type, a hash of its count, root, message index and length,
/// and the step; worked out once per plan. With the first word, enough to tell any two calls
/// apart and to describe the other side's in an error.
pub(super) fn signature(desc: &OpDesc, step: u32, msg: u32, len: usize) -> u64 {
    // FNV-1a over the fields, the same on every rank (no random state).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in [desc.count, desc.root.map_or(u64::MAX, u64::from), u64::from(msg), len as u64] {
        for b in f.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    SIGNED | ((desc.kind as u64) << 56) | ((desc.dtype as u64) << 48) | ((h & 0xffff) << 32) | u64::from(step)
}

/// The label of LL message `msg` (of `len` bytes) of step `step` of `desc`.
#[cfg(test)]
fn label(desc: &OpDesc, step: u32, msg: u32, len: usize) -> [u64; 2] {
    [head(desc), signature(desc, step, msg, len)]
}

/// What a label says of its call, as far as it tells: `all_gather #3 (f32, ring) step 1`.
pub(super) fn describe(label: [u64; 2]) -> String {
    let seq = label[0] & 0xffff_ffff_ffff;
    let algo = Algorithm::from_tag((label[0] >> 48) as u8).map_or("unknown algorithm", Algorithm::name);
    let op = ReduceOp::from_tag((label[0] >> 56) as u8).map(|o| format!(", {o}")).unwrap_or_default();
    let kind =
        CollKind::from_tag(((label[1] >> 56) & 0x7f) as u8).map_or("an unknown operation", CollKind::name);
    let dtype = DType::from_tag((label[1] >> 48) as u8).map_or("unknown type", DType::name);
    format!("{kind} #{seq} ({dtype}{op}, {algo}) step {}", label[1] & 0xffff_ffff)
}

impl Engine {
    /// The label task `i`'s message carries.
    fn ll_label(run: &StepRun<'_>, i: usize) -> Result<[u64; 2]> {
        match (run.ctx, run.tasks[i].label) {
            (Ctx::Coll { desc, .. }, Label::Coll { sig, .. }) => Ok([head(desc), sig]),
            _ => Err(Error::Internal("an LL message outside a collective step".into())),
        }
    }

    /// Writes LL send task `i` to `peer` if the channel has room for all of it and the
    /// earlier LL sends to `peer` have gone; true when written.
    pub(super) fn ll_send(&mut self, run: &StepRun<'_>, i: usize, peer: usize) -> Result<bool> {
        if run.next_ll_send(peer) != Some(i) {
            return Ok(false);
        }
        let label = Self::ll_label(run, i)?;
        let t = &run.tasks[i];
        // SAFETY: the span lies in the operation's buffers and, by the ordering rule, nothing
        // writes it while this send reads it.
        let bytes = unsafe { t.span.bytes(0, t.span.len) };
        let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
        link.ll_send(label, bytes).map_err(|e| lost(run.op(), peer, e))
    }

    /// Reads LL receive task `i` from `peer` if its message has arrived and the earlier LL
    /// receives from `peer` are complete; true when placed. A message with another label is
    /// a mismatch.
    pub(super) fn ll_recv(&mut self, run: &StepRun<'_>, i: usize, peer: usize) -> Result<bool> {
        if run.next_ll_recv(peer) != Some(i) {
            return Ok(false);
        }
        let label = Self::ll_label(run, i)?;
        let t = &run.tasks[i];
        let (dst, act, len) = (t.span, t.act, t.span.len);
        let combine = run.ctx.combine();
        let mut at = 0;
        let mut failure = None;
        let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
        let found = link
            .ll_recv(label, len, &mut |piece| {
                let end = (at + piece.len()).min(len);
                let piece = &piece[..end - at];
                let res = match (act, combine) {
                    // SAFETY: [at, end) lies in the destination (end <= len), and by the
                    // ordering rule no other view of it is alive; `with` has the same length.
                    (Act::Recv { with: Some(with), .. }, Some((dtype, op))) => unsafe {
                        fold(dtype, op, dst, with, at, piece)
                    },
                    _ => {
                        // SAFETY: as above, for a plain receive.
                        unsafe { dst.bytes_mut(at, end) }.copy_from_slice(piece);
                        Ok(())
                    }
                };
                if let Err(e) = res {
                    failure.get_or_insert(e);
                }
                at = end;
            })
            .map_err(|e| lost(run.op(), peer, e))?;
        if let Some(e) = failure {
            return Err(e);
        }
        match found {
            LlRecv::Empty => Ok(false),
            LlRecv::Done => Ok(true),
            LlRecv::Other(theirs) => Err(self.ll_mismatch(run, i, peer, theirs)),
        }
    }

    /// Moves the LL messages to and from `peer` as far as they may go (the general loop's
    /// share of LL); true if anything moved.
    pub(super) fn pump_ll(&mut self, run: &mut StepRun<'_>, peer: usize) -> Result<bool> {
        let mut progress = false;
        while let Some(i) = run.next_ll_send(peer) {
            if run.limit(i) < run.tasks[i].span.len || !self.ll_send(run, i, peer)? {
                break;
            }
            run.tasks[i].finish();
            progress = true;
        }
        while let Some(i) = run.next_ll_recv(peer) {
            if run.limit(i) < run.tasks[i].span.len || !self.ll_recv(run, i, peer)? {
                break;
            }
            run.tasks[i].finish();
            progress = true;
        }
        Ok(progress)
    }

    /// Whether `peer` sent an LL message where this rank expects only frames from it (the
    /// ranks disagree on the protocol, or on the counts): the error saying so. Looked at by
    /// a step that is about to sleep.
    pub(super) fn ll_unexpected(&mut self, run: &StepRun<'_>, peer: usize) -> Option<Error> {
        if run.next_ll_recv(peer).is_some()
            || !matches!(self.peers[peer].inbound, Inbound::Idle | Inbound::Header { have: 0, .. })
        {
            return None;
        }
        let i = run.next_recv(peer)?;
        let link = self.links.link(peer).ok()?;
        // The LL message first: the peer wrote its frames before it, so a frame sent earlier
        // would show in the ring now.
        if !link.ll_pending() || link.holds(1) {
            return None;
        }
        // Ask for a label no message carries: the one waiting is described, not consumed.
        match link.ll_recv([0, 0], 0, &mut |_| {}) {
            Ok(LlRecv::Other(theirs)) => Some(self.ll_mismatch(run, i, peer, theirs)),
            _ => None,
        }
    }

    /// The mismatch of receive `i` from `peer` with a message labelled `theirs`.
    fn ll_mismatch(&self, run: &StepRun<'_>, i: usize, peer: usize, theirs: [u64; 2]) -> Error {
        let t = &run.tasks[i];
        let (local, ours) = match (run.ctx, t.label) {
            (Ctx::Coll { desc, step }, Label::Coll { msg, .. }) => {
                let how = if t.ll() { "by LL" } else { "as a frame" };
                let local =
                    format!("{desc} expecting step {step} message {msg} ({} bytes) {how}", t.span.len);
                (local, Some(desc.seq))
            }
            _ => (run.op(), None),
        };
        let seq = theirs[0] & 0xffff_ffff_ffff;
        let mut remote = format!("{} by LL", describe(theirs));
        match ours {
            Some(s) if s & 0xffff_ffff_ffff != seq => {
                if let Some(d) = self.fate.ran(|d| d.seq & 0xffff_ffff_ffff == seq) {
                    remote += &format!(" (this rank ran {d} under that number)");
                }
            }
            _ => {
                remote += " (do the ranks pass different types, counts, reductions or roots, or set XCCL_ALGO / XCCL_PROTO differently?)"
            }
        }
        Error::Mismatch { rank: self.rank, local, peer, remote }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> OpDesc {
        OpDesc {
            kind: CollKind::AllReduce,
            seq: 5,
            dtype: DType::F32,
            op: Some(ReduceOp::Sum),
            count: 2,
            root: None,
            algo: Algorithm::RecursiveDoubling,
        }
    }

    #[test]
    fn labels_tell_apart_what_ranks_must_agree_on() {
        let base = label(&desc(), 1, 0, 8);
        assert_eq!(base, label(&desc(), 1, 0, 8));
        assert_eq!(base[0] & 0xffff_ffff_ffff, 5);
        assert_eq!(base[1] & 0xffff_ffff, 1);
        assert_ne!(base[1] & SIGNED, 0);
        assert_eq!(describe(base), "all_reduce #5 (f32, sum, recursive_doubling) step 1");
        let others = [
            label(&OpDesc { count: 3, ..desc() }, 1, 0, 8),
            label(&OpDesc { kind: CollKind::AllGather, op: None, ..desc() }, 1, 0, 8),
            label(&OpDesc { root: Some(1), ..desc() }, 1, 0, 8),
            label(&OpDesc { dtype: DType::I32, ..desc() }, 1, 0, 8),
            label(&OpDesc { op: Some(ReduceOp::Max), ..desc() }, 1, 0, 8),
            label(&OpDesc { algo: Algorithm::Ring, ..desc() }, 1, 0, 8),
            label(&OpDesc { seq: 6, ..desc() }, 1, 0, 8),
            label(&desc(), 2, 0, 8),
            label(&desc(), 1, 1, 8),
            label(&desc(), 1, 0, 16),
        ];
        for (k, o) in others.iter().enumerate() {
            assert_ne!(*o, base, "variant {k}");
            assert_ne!(*o, [0, 0]);
        }
    }
}
