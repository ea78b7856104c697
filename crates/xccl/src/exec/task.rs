//! Tasks: the operations of the step being run, with their memory resolved, their
//! progress, and the queries the loop asks of them (how far may this one go, which send to a
//! peer is next, which receive does this frame fill).

use std::time::Duration;

use super::Ctx;
use super::fused::PushTo;
use super::plan::{CompiledStep, PlannedAct};
use crate::coll::CollKind;
use crate::dtype::DType;
use crate::error::Result;
use crate::frame::Header;
use crate::protocol::Protocol;
use crate::reduce::{self, ReduceOp};
use crate::schedule::Region;
use crate::schedule::order::{self, Access, Channel, Extent, Follow};

/// A byte range in memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Span {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Span {
    /// Bytes `[from, to)` of the span, shared.
    ///
    /// # Safety
    /// The span must be valid memory, and no mutable view of these bytes may be alive.
    pub unsafe fn bytes<'a>(&self, from: usize, to: usize) -> &'a [u8] {
        debug_assert!(from <= to && to <= self.len);
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts(self.ptr.add(from), to - from) }
    }

    /// Bytes `[from, to)` of the span, exclusive.
    ///
    /// # Safety
    /// The span must be valid, writable memory, and no other view of these bytes may be alive.
    pub unsafe fn bytes_mut<'a>(&self, from: usize, to: usize) -> &'a mut [u8] {
        debug_assert!(from <= to && to <= self.len);
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(from), to - from) }
    }
}

/// What an operation is, with its memory resolved.
#[derive(Copy, Clone, Debug)]
pub(super) enum Act {
    /// Send the span to `peer`.
    Send { peer: usize },
    /// Receive into the span from `peer`, combined with `with` if given.
    Recv { peer: usize, with: Option<Span> },
    /// Copy `src` into the span.
    Copy { src: Span },
}

/// How an operation's messages are labelled on the wire.
#[derive(Copy, Clone, Debug)]
pub(super) enum Label {
    /// The `msg`-th message between this pair of ranks in this step of a collective; an LL
    /// message also carries its signature (`ll::signature`).
    Coll { msg: u32, sig: u64 },
    /// A point-to-point message.
    P2p { tag: u32, dtype: DType, seq: u64 },
}

/// One operation of the step being run.
pub(super) struct Task {
    pub act: Act,
    /// Sends read it; receives and copies write it.
    pub span: Span,
    pub label: Label,
    /// How its message travels: LL, eager, stream or pull for sends (a point-to-point send
    /// chooses between stream and pull when its first frame goes); LL, eager or stream for
    /// receives; stream for copies.
    pub proto: Protocol,
    /// Sends: bytes whose frames are out (for a pulled message, announced but perhaps not
    /// yet acknowledged).
    pub sent: usize,
    /// Bytes finished: received and placed, or (sends) written or acknowledged, so that the
    /// region may be touched again.
    pub done: usize,
    pub complete: bool,
    /// A point-to-point receive already bound to an incoming message.
    pub bound: bool,
    /// Where in `StepRun::deps` the earlier tasks it must follow are listed.
    pub deps: std::ops::Range<usize>,
    /// Its completion was reported to the feed.
    pub reported: bool,
    /// A later task of the step must wait for it.
    pub has_dependents: bool,
    /// Sends: bytes of the message this rank wrote into the receiver's memory itself (a
    /// split pull).
    pub pushed: usize,
    /// Receives: bytes the sender is writing into this receive's memory, not yet confirmed.
    pub awaited: usize,
    /// Sends (protocol `fused`): the receive of the next step from the same peer whose
    /// memory this send's pull descriptor grants the peer (its message index and span).
    pub grant: Option<(u32, Span)>,
    /// Folding receives (protocol `fused`): the message index of the next step's send back to
    /// the same peer of exactly this receive's span, which a grant may let it write ahead.
    pub fold_ahead: Option<u32>,
    /// Folding receives: the grant taken, where each folded piece is written.
    pub push_to: Option<PushTo>,
    /// Receives: `awaited` is the answer to a grant (0 then means: received as usual).
    pub granted: bool,
}

impl Task {
    pub fn new(act: Act, span: Span, label: Label, proto: Protocol) -> Task {
        Task {
            act,
            span,
            label,
            proto,
            sent: 0,
            done: 0,
            complete: false,
            bound: false,
            deps: 0..0,
            reported: false,
            has_dependents: false,
            pushed: 0,
            awaited: 0,
            grant: None,
            fold_ahead: None,
            push_to: None,
            granted: false,
        }
    }

    /// What the task reads and writes, by address, and its channel.
    fn access(&self) -> Access {
        let at = |s: Span| Extent { space: 0, off: s.ptr as usize, len: s.len };
        let (reads, writes, channel) = match self.act {
            Act::Send { peer } => (Some(self.span), None, Some(Channel::To(peer))),
            Act::Recv { with, peer } => (with, Some(self.span), Some(Channel::From(peer))),
            Act::Copy { src } => (Some(src), Some(self.span), None),
        };
        Access { reads: reads.map(at), writes: writes.map(at), len: self.span.len, channel }
    }

    /// Marks the task done in one piece (a message written or placed whole).
    pub fn finish(&mut self) {
        (self.sent, self.done, self.complete) = (self.span.len, self.span.len, true);
    }

    /// Whether its message goes by LL.
    pub fn ll(&self) -> bool {
        self.proto == Protocol::Ll
    }
}

/// Results at least this large are written around the caches (see
/// [`reduce::combine_into_uncached`]): they cannot stay cached until they are read again.
const UNCACHED_MIN: usize = 16 << 20;

/// Combines `piece`, received for bytes `at..` of the receive into `dst`, with the same bytes
/// of `with` (which may be `dst` itself).
///
/// # Safety
/// `at + piece.len()` must lie within `dst` and `with` (of equal length), and no other view
/// of those bytes of `dst` may be alive.
pub(super) unsafe fn fold(
    dtype: DType,
    op: ReduceOp,
    dst: Span,
    with: Span,
    at: usize,
    piece: &[u8],
) -> Result<()> {
    let end = at + piece.len();
    // SAFETY: forwarded to the caller.
    let out = unsafe { dst.bytes_mut(at, end) };
    if with.ptr == dst.ptr {
        return reduce::combine(dtype, op, out, piece);
    }
    // SAFETY: as above; `with` is a different buffer, only read.
    let with = unsafe { with.bytes(at, end) };
    if dst.len >= UNCACHED_MIN {
        reduce::combine_into_uncached(dtype, op, out, with, piece)
    } else {
        reduce::combine_into(dtype, op, out, with, piece)
    }
}

/// Like [`fold`], for a piece whose result is passed on at once (written ahead into the peer,
/// `exec/fused.rs`): returns the bytes that hold the result in cache, `dst`'s where it is
/// written through the caches (in place, or a result small enough to stay cached), else
/// `piece`, which is then overwritten with the result too.
///
/// # Safety
/// As for [`fold`].
pub(super) unsafe fn fold_kept(
    dtype: DType,
    op: ReduceOp,
    dst: Span,
    with: Span,
    at: usize,
    piece: &mut [u8],
) -> Result<&[u8]> {
    let end = at + piece.len();
    if with.ptr == dst.ptr || dst.len < UNCACHED_MIN {
        // SAFETY: forwarded to the caller.
        unsafe { fold(dtype, op, dst, with, at, piece) }?;
        // SAFETY: as above; the mutable view of these bytes ended with `fold`.
        return Ok(unsafe { dst.bytes(at, end) });
    }
    // SAFETY: forwarded to the caller; `with` is a different buffer, only read.
    let (out, with) = unsafe { (dst.bytes_mut(at, end), with.bytes(at, end)) };
    reduce::combine_into_uncached_keeping(dtype, op, out, with, piece)?;
    Ok(piece)
}

/// The buffers of a step being run, kept by the engine between steps so that running one
/// allocates nothing. Boxed, and handed from step to step as one pointer: moving the
/// vectors themselves in and out of the engine made the processor read back, in pieces of
/// other widths, stores it had just made, and such a load waits until every earlier store
/// has reached the cache, also those that just put a message on the peer's LL line.
#[derive(Default)]
pub(super) struct StepBufs {
    pub tasks: Vec<Task>,
    /// The ordering dependencies of all tasks: (earlier task, segment by segment?).
    deps: Vec<(usize, bool)>,
    /// Per peer, its send and receive tasks in order.
    sends: Vec<Vec<usize>>,
    recvs: Vec<Vec<usize>>,
    /// Peers the step talks to (those whose lists above need clearing).
    pub touched: Vec<usize>,
}

/// One step being run: what it is part of, and its buffers (reached through it: `run.tasks`).
pub(super) struct StepRun<'a> {
    pub ctx: Ctx<'a>,
    bufs: Box<StepBufs>,
}

impl std::ops::Deref for StepRun<'_> {
    type Target = StepBufs;
    fn deref(&self) -> &StepBufs {
        &self.bufs
    }
}

impl std::ops::DerefMut for StepRun<'_> {
    fn deref_mut(&mut self) -> &mut StepBufs {
        &mut self.bufs
    }
}

impl<'a> StepRun<'a> {
    /// An empty step over `nranks` ranks, in the buffers of an earlier one.
    pub fn new(ctx: Ctx<'a>, nranks: usize, mut bufs: Box<StepBufs>) -> Self {
        let b = &mut *bufs;
        b.tasks.clear();
        b.deps.clear();
        for &p in &b.touched {
            b.sends[p].clear();
            b.recvs[p].clear();
        }
        b.touched.clear();
        b.sends.resize_with(nranks, Vec::new);
        b.recvs.resize_with(nranks, Vec::new);
        StepRun { ctx, bufs }
    }

    /// Whether this is a step of a collective whose data flows one way (broadcast, scatter,
    /// gather): a sender has nothing to do but send.
    pub fn one_way(&self) -> bool {
        matches!(self.ctx, Ctx::Coll { desc, .. } if desc.kind.one_way())
    }

    /// Gives the buffers back for the next step.
    pub fn into_bufs(self) -> Box<StepBufs> {
        self.bufs
    }

    /// Adds task `t` after the others, with the dependencies given.
    fn add(&mut self, mut t: Task, deps: impl IntoIterator<Item = (usize, bool)>) -> usize {
        let start = self.deps.len();
        self.deps.extend(deps);
        t.deps = start..self.deps.len();
        let i = self.tasks.len();
        match t.act {
            Act::Send { peer } | Act::Recv { peer, .. } => {
                if self.sends[peer].is_empty() && self.recvs[peer].is_empty() {
                    self.touched.push(peer);
                }
                if matches!(t.act, Act::Send { .. }) {
                    self.sends[peer].push(i);
                } else {
                    self.recvs[peer].push(i);
                }
            }
            Act::Copy { .. } => {}
        }
        self.tasks.push(t);
        i
    }

    /// Places compiled step `plan` on the operation's buffers (`span` resolves a region).
    pub fn load(&mut self, plan: &CompiledStep, span: impl Fn(&Region) -> Span) {
        for tp in &plan.tasks {
            let act = match tp.act {
                PlannedAct::Send { peer } => Act::Send { peer },
                PlannedAct::Recv { peer, with } => Act::Recv { peer, with: with.map(|w| span(&w)) },
                PlannedAct::Copy { src } => Act::Copy { src: span(&src) },
            };
            let mut t = Task::new(act, span(&tp.region), Label::Coll { msg: tp.msg, sig: tp.sig }, tp.proto);
            t.has_dependents = tp.has_dependents;
            t.grant = tp.grant.map(|(m, r)| (m, span(&r)));
            t.fold_ahead = tp.fold_ahead;
            if tp.noop {
                t.complete = true;
                t.done = t.span.len;
            }
            self.add(t, tp.deps.iter().map(|&(d, fine)| (d as usize, fine)));
        }
    }

    /// Adds a point-to-point task after the others, working out what it must follow.
    /// Returns its index.
    pub fn push(&mut self, t: Task) -> usize {
        let mut deps = Vec::new();
        let earlier: Vec<Access> = self.tasks.iter().map(Task::access).collect();
        order::follows(&earlier, &t.access(), |i, how| match how {
            Follow::Segments => deps.push((i, true)),
            Follow::Whole => deps.push((i, false)),
            // Messages on one channel pair up in order through the per-peer queues.
            Follow::InOrder => {}
        });
        for &(i, _) in &deps {
            self.tasks[i].has_dependents = true;
        }
        self.add(t, deps)
    }

    /// How long the peers may still be busy copying this rank's pulled messages (or writing
    /// into its memory what it awaits): a rank waiting for those acknowledgements keeps polling that much longer rather than sleep,
    /// since being woken costs more than the wait (assumes a copy rate of 4 GB/s; at most
    /// 10 ms).
    pub fn copy_wait(&self) -> Duration {
        let unacked: usize =
            self.tasks.iter().map(|t| t.sent.saturating_sub(t.done + t.pushed) + t.awaited).sum();
        Duration::from_nanos((unacked / 4) as u64).min(Duration::from_millis(10))
    }

    /// The operation, described for error messages.
    pub fn op(&self) -> String {
        self.ctx.describe()
    }

    /// How far task `i` may go: the least progress among what it follows.
    pub fn limit(&self, i: usize) -> usize {
        let t = &self.tasks[i];
        self.deps[t.deps.clone()].iter().fold(t.span.len, |lim, &(d, fine)| {
            let dep = &self.tasks[d];
            let allowed = if dep.complete {
                usize::MAX
            } else if fine {
                dep.done
            } else {
                0
            };
            lim.min(allowed)
        })
    }

    /// Bytes send task `i` may put in its next frame now: a full segment, or the rest of
    /// its message, once that much is ready (0: wait).
    pub fn send_ready(&self, i: usize, seg: usize) -> usize {
        let t = &self.tasks[i];
        let want = (t.span.len - t.sent).min(seg);
        if self.limit(i).saturating_sub(t.sent) >= want { want } else { 0 }
    }

    /// The first send to `peer` with bytes not yet out.
    pub fn next_send(&self, peer: usize) -> Option<usize> {
        self.sends[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            !t.ll() && (t.sent < t.span.len || (t.span.len == 0 && !t.complete))
        })
    }

    /// The first LL send to `peer` not yet written (LL messages pair up in order on their
    /// own channel).
    pub fn next_ll_send(&self, peer: usize) -> Option<usize> {
        self.sends[peer].iter().copied().find(|&i| self.tasks[i].ll() && !self.tasks[i].complete)
    }

    /// The first LL receive from `peer` not yet complete.
    pub fn next_ll_recv(&self, peer: usize) -> Option<usize> {
        self.recvs[peer].iter().copied().find(|&i| self.tasks[i].ll() && !self.tasks[i].complete)
    }

    /// The send to `peer` that acknowledgement (or push request) `h` is for.
    pub fn acked_send(&self, peer: usize, h: &Header) -> Option<usize> {
        self.sends[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            t.sent > t.done + t.pushed
                && match (self.ctx, t.label) {
                    (Ctx::Coll { step, .. }, Label::Coll { msg, .. }) => h.step == step && h.msg == msg,
                    (_, Label::P2p { seq, .. }) => h.coll == CollKind::SendRecv && h.seq == seq,
                    (Ctx::P2p, Label::Coll { .. }) => false,
                }
        })
    }

    /// The receive from `peer` that its next data or pull frame is for: the first not
    /// complete, passing over those that only wait for the peer to confirm a push (their one
    /// descriptor has come).
    pub fn next_recv(&self, peer: usize) -> Option<usize> {
        self.recvs[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            !t.ll() && !t.complete && t.awaited == 0
        })
    }

    /// The receive from `peer` that push confirmation `h` is for.
    pub fn pushed_recv(&self, peer: usize, h: &Header) -> Option<usize> {
        let Ctx::Coll { step, .. } = self.ctx else { return None };
        self.recvs[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            t.awaited > 0 && h.step == step && matches!(t.label, Label::Coll { msg, .. } if msg == h.msg)
        })
    }

    /// Whether a frame from `peer` is awaited: data, acknowledgements of pulled segments,
    /// push requests or confirmations.
    pub fn expects_from(&self, peer: usize) -> bool {
        self.recvs[peer].iter().any(|&i| !self.tasks[i].ll() && !self.tasks[i].complete)
            || self.sends[peer].iter().any(|&i| {
                let t = &self.tasks[i];
                t.sent > t.done + t.pushed
            })
    }

    /// The first unbound point-to-point receive from `peer` with `tag`.
    pub fn matching_recv(&self, peer: usize, tag: u32) -> Option<usize> {
        self.recvs[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            !t.complete && !t.bound && matches!(t.label, Label::P2p { tag: tg, .. } if tg == tag)
        })
    }

    /// Runs local copies as far as they may go; true if anything moved.
    pub fn local_copies(&mut self) -> bool {
        let mut progress = false;
        for j in 0..self.tasks.len() {
            let Act::Copy { src } = self.tasks[j].act else {
                continue;
            };
            if self.tasks[j].complete {
                continue;
            }
            let lim = self.limit(j);
            let t = &mut self.tasks[j];
            if lim > t.done {
                // SAFETY: both ranges lie in the operation's buffers, do not overlap (checked
                // in `StepRun::push`), and the ordering rule keeps other views away from them.
                unsafe { crate::copy::copy(t.span.bytes_mut(t.done, lim), src.bytes(t.done, lim)) };
                t.done = lim;
                t.complete = t.done == t.span.len;
                progress = true;
            }
        }
        progress
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algorithm;
    use crate::exec::plan::TaskPlan;
    use crate::frame::OpDesc;
    use crate::schedule::Buf;

    fn span(buf: &mut [u8], from: usize, to: usize) -> Span {
        Span { ptr: buf[from..].as_mut_ptr(), len: to - from }
    }

    fn p2p(dtype: DType) -> Label {
        Label::P2p { tag: 0, dtype, seq: 0 }
    }

    #[test]
    fn a_forwarding_send_goes_as_far_as_its_receive_has_come() {
        let mut mem = vec![0u8; 64];
        let mut run = StepRun::new(Ctx::P2p, 3, Box::default());
        let recv = run.push(Task::new(
            Act::Recv { peer: 1, with: None },
            span(&mut mem, 0, 32),
            p2p(DType::U8),
            Protocol::Stream,
        ));
        let send = run.push(Task::new(
            Act::Send { peer: 2 },
            span(&mut mem, 0, 32),
            p2p(DType::U8),
            Protocol::Stream,
        ));
        let other = run.push(Task::new(
            Act::Send { peer: 2 },
            span(&mut mem, 16, 48),
            p2p(DType::U8),
            Protocol::Stream,
        ));
        assert_eq!(run.limit(recv), 32);
        assert_eq!(run.limit(send), 0);
        run.tasks[recv].done = 20;
        // Identical regions: segment by segment; overlapping ones: only once it is complete.
        assert_eq!(run.limit(send), 20);
        assert_eq!(run.limit(other), 0);
        // A full segment of 16 bytes is ready, one of 32 is not yet.
        assert_eq!(run.send_ready(send, 16), 16);
        assert_eq!(run.send_ready(send, 32), 0);
        run.tasks[recv].done = 32;
        run.tasks[recv].complete = true;
        assert_eq!((run.limit(send), run.limit(other)), (32, 32));
        // Sends to one peer go in order: the second waits until the first is all out.
        assert_eq!(run.next_send(2), Some(send));
        run.tasks[send].sent = 32;
        assert_eq!(run.next_send(2), Some(other));
        assert!(run.tasks[recv].has_dependents && !run.tasks[other].has_dependents);
    }

    #[test]
    fn ll_messages_keep_their_own_order_beside_the_framed_ones() {
        let mut mem = vec![0u8; 64];
        let desc = OpDesc {
            kind: CollKind::AllReduce,
            seq: 0,
            dtype: DType::U8,
            op: None,
            count: 0,
            root: None,
            algo: Algorithm::Direct,
        };
        let planned = |act, off: usize, msg: u32, proto| TaskPlan {
            act,
            region: Region::new(Buf::Output, off, 8),
            msg,
            sig: 1,
            proto,
            deps: Vec::new(),
            has_dependents: false,
            noop: false,
            grant: None,
            fold_ahead: None,
        };
        let step = CompiledStep {
            tasks: vec![
                planned(PlannedAct::Send { peer: 1 }, 0, 0, Protocol::Stream),
                planned(PlannedAct::Send { peer: 1 }, 8, 1, Protocol::Ll),
                planned(PlannedAct::Recv { peer: 1, with: None }, 16, 0, Protocol::Ll),
                planned(PlannedAct::Recv { peer: 1, with: None }, 24, 1, Protocol::Stream),
            ],
        };
        let mut run = StepRun::new(Ctx::Coll { desc: &desc, step: 0 }, 2, Box::default());
        let base = mem.as_mut_ptr();
        // Every region lies inside `mem`, which outlives the run.
        run.load(&step, |r| Span { ptr: base.wrapping_add(r.off), len: r.len });
        assert_eq!((run.next_send(1), run.next_ll_send(1)), (Some(0), Some(1)));
        assert_eq!((run.next_recv(1), run.next_ll_recv(1)), (Some(3), Some(2)));
        // Only the framed receive makes a frame expected from the peer.
        assert!(run.expects_from(1));
        run.tasks[3].complete = true;
        assert!(!run.expects_from(1) && run.next_ll_recv(1) == Some(2));
        run.tasks[2].finish();
        assert_eq!(run.next_ll_recv(1), None);
    }
}
