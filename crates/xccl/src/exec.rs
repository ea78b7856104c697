//! The executor: runs any [`Program`] (or a batch of point-to-point messages) over any
//! [`Links`].
//!
//! A step is run by one loop. Each pass writes as many outgoing frames as the links accept
//! and the step's ordering rule allows, reads and places (or reduces) as many incoming bytes
//! as have arrived, and runs local copies; when a pass makes no progress the loop sleeps on
//! the links until something changes. Messages are cut into segments of at most `seg` bytes,
//! so a rank reduces segment `k` while its peer is already sending segment `k + 1`, and a
//! forwarding rank passes segment `k` on while segment `k + 1` is still arriving.
//!
//! Progress is measured per operation in bytes done from the start of its region. Op `j`
//! may touch byte `b` of its region once every earlier conflicting op of the step has done
//! `b` bytes of an identical region (or has finished, for a merely overlapping one).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::frame::{self, ACK_LEN, CollKind, FrameKind, HEADER_LEN, Header, OpDesc, PULL_LEN};
use crate::reduce::{self, ReduceOp};
use crate::schedule::{Buf, Op, Program, Region};
use crate::transport::pull::{self, Pull};
use crate::transport::{Closed, Farewell, Interest, Links, PeerAborted, Polling};

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

/// A collective ready to run on one rank: its identity (under sequence number 0), its
/// schedule, checked against the buffer lengths it was built for, and the region that holds
/// this rank's final reduced values (finalised for `Avg`).
#[derive(Debug)]
pub(crate) struct Plan {
    pub desc: OpDesc,
    pub program: Program,
    /// Bytes of input and output the program was checked against.
    pub input_len: usize,
    pub output_len: usize,
    pub result: Option<Region>,
    /// The steps compiled for separate (index 0) and shared (index 1) input and output
    /// memory, made on first use.
    compiled: [OnceLock<std::result::Result<Vec<CompiledStep>, String>>; 2],
}

impl Plan {
    /// Builds the plan, checking the schedule against the buffers once for all its runs.
    pub fn new(
        desc: OpDesc,
        program: Program,
        rank: usize,
        nranks: usize,
        elems: (usize, usize),
        result: Option<Region>,
    ) -> Result<Plan> {
        program
            .check(rank, nranks, elems.0, elems.1)
            .map_err(|e| Error::Internal(format!("{desc}: bad schedule: {e}")))?;
        let esize = desc.dtype.size();
        Ok(Plan {
            desc,
            program,
            input_len: elems.0 * esize,
            output_len: elems.1 * esize,
            result,
            compiled: [OnceLock::new(), OnceLock::new()],
        })
    }

    /// The compiled steps for input and output that are the same memory (`aliased`) or not.
    fn steps(&self, aliased: bool) -> Result<&[CompiledStep]> {
        self.compiled[usize::from(aliased)]
            .get_or_init(|| compile(&self.program, aliased))
            .as_deref()
            .map_err(|e| Error::Internal(format!("{}: bad schedule: {e}", self.desc)))
    }
}

/// Where an operation's bytes lie, for ordering operations: a byte range of one memory
/// space. Compiled steps use one space per buffer (input and output share one when they are
/// the same memory); point-to-point batches use the address space itself.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Extent {
    space: usize,
    off: usize,
    len: usize,
}

impl Extent {
    fn overlaps(&self, other: &Extent) -> bool {
        self.space == other.space && self.off < other.off + other.len && other.off < self.off + self.len
    }
}

/// The bytes an operation reads and writes.
#[derive(Copy, Clone, Debug)]
struct Access {
    reads: Option<Extent>,
    writes: Option<Extent>,
    len: usize,
}

/// The ordering rule of a step: calls `dep(i, fine)` for every earlier operation `i` that
/// `t` must follow, where `fine` means segment by segment (their regions are identical).
fn dependencies(earlier: impl IntoIterator<Item = Access>, t: &Access, mut dep: impl FnMut(usize, bool)) {
    for (i, a) in earlier.into_iter().enumerate() {
        let pairs = [(a.writes, t.reads), (a.writes, t.writes), (a.reads, t.writes)];
        let mut clash = false;
        let mut identical = true;
        for (x, y) in pairs {
            if let (Some(x), Some(y)) = (x, y) {
                if x.overlaps(&y) {
                    clash = true;
                    identical &= x == y;
                }
            }
        }
        if clash {
            dep(i, identical && a.len == t.len);
        }
    }
}

/// One operation of a compiled step: what it does on which regions, and what it follows.
#[derive(Clone, Debug)]
struct TaskPlan {
    act: PlannedAct,
    region: Region,
    msg: u32,
    /// Earlier operations of the step to follow: (index, segment by segment?).
    deps: Vec<(u32, bool)>,
    has_dependents: bool,
    /// Nothing to do (an empty copy, or one onto itself).
    noop: bool,
}

#[derive(Copy, Clone, Debug)]
enum PlannedAct {
    Send { peer: usize },
    Recv { peer: usize, with: Option<Region> },
    Copy { src: Region },
}

/// A step with its ordering worked out once for all runs of the plan.
#[derive(Clone, Debug)]
struct CompiledStep {
    tasks: Vec<TaskPlan>,
}

/// Compiles a program's steps: message labels, no-op copies and the ordering rule.
fn compile(program: &Program, aliased: bool) -> std::result::Result<Vec<CompiledStep>, String> {
    let extent = |r: &Region| {
        let space = match r.buf {
            Buf::Input => 0,
            Buf::Output => usize::from(!aliased),
            Buf::Scratch => 2,
        };
        Extent { space, off: r.off, len: r.len }
    };
    let mut steps = Vec::with_capacity(program.steps.len());
    for step in &program.steps {
        let mut msgs: Vec<(usize, u32, u32)> = Vec::new();
        let mut count = |peer: usize, send: bool| {
            let at = match msgs.iter().position(|m| m.0 == peer) {
                Some(at) => at,
                None => {
                    msgs.push((peer, 0, 0));
                    msgs.len() - 1
                }
            };
            let slot = if send { &mut msgs[at].1 } else { &mut msgs[at].2 };
            *slot += 1;
            *slot - 1
        };
        let mut tasks: Vec<TaskPlan> = Vec::with_capacity(step.ops.len());
        let mut accesses: Vec<Access> = Vec::with_capacity(step.ops.len());
        for op in &step.ops {
            let (act, region, msg, reads) = match *op {
                Op::Send { peer, src } => (PlannedAct::Send { peer }, src, count(peer, true), Some(src)),
                Op::Recv { peer, dst, with } => {
                    (PlannedAct::Recv { peer, with }, dst, count(peer, false), with)
                }
                Op::Copy { src, dst } => (PlannedAct::Copy { src }, dst, 0, Some(src)),
            };
            let writes = op.writes();
            let mut noop = false;
            if let PlannedAct::Copy { src } = act {
                let (a, b) = (extent(&src), extent(&region));
                if a == b || region.len == 0 {
                    noop = true;
                } else if a.overlaps(&b) {
                    return Err(format!("{op:?}: a local copy between overlapping regions"));
                }
            }
            let access = Access {
                reads: reads.map(|r| extent(&r)),
                writes: writes.map(|w| extent(&w)),
                len: region.len,
            };
            let mut deps = Vec::new();
            if !noop {
                dependencies(accesses.iter().copied(), &access, |i, fine| {
                    deps.push((i as u32, fine));
                    tasks[i].has_dependents = true;
                });
            }
            tasks.push(TaskPlan { act, region, msg, deps, has_dependents: false, noop });
            accesses.push(access);
        }
        steps.push(CompiledStep { tasks });
    }
    Ok(steps)
}

/// One point-to-point message of a batch.
#[derive(Copy, Clone, Debug)]
pub(crate) struct P2p {
    pub send: bool,
    pub peer: usize,
    pub tag: u32,
    pub dtype: DType,
    /// The message (read for sends, written for receives), valid as for [`Bufs`].
    pub ptr: *mut u8,
    pub len: usize,
}

/// The source of a point-to-point batch: messages as they are issued, and where to report
/// each one's completion (by its index in the order fetched).
pub(crate) trait P2pFeed {
    /// Appends the messages issued since the last call.
    fn fetch(&mut self, into: &mut Vec<P2p>);
    /// Message `index` has completed successfully.
    fn complete(&mut self, index: usize);
}

/// A byte range in memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Span {
    ptr: *mut u8,
    len: usize,
}

impl Span {
    /// Bytes `[from, to)` of the span, shared.
    ///
    /// # Safety
    /// The span must be valid memory, and no mutable view of these bytes may be alive.
    unsafe fn bytes<'a>(&self, from: usize, to: usize) -> &'a [u8] {
        debug_assert!(from <= to && to <= self.len);
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts(self.ptr.add(from), to - from) }
    }

    /// Bytes `[from, to)` of the span, exclusive.
    ///
    /// # Safety
    /// The span must be valid, writable memory, and no other view of these bytes may be alive.
    unsafe fn bytes_mut<'a>(&self, from: usize, to: usize) -> &'a mut [u8] {
        debug_assert!(from <= to && to <= self.len);
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(from), to - from) }
    }
}

/// What an operation is, with its memory resolved.
#[derive(Copy, Clone, Debug)]
enum Act {
    Send { peer: usize },
    Recv { peer: usize, with: Option<Span> },
    Copy { src: Span },
}

/// How an operation's messages are labelled on the wire.
#[derive(Copy, Clone, Debug)]
enum Label {
    /// The `msg`-th message between this pair of ranks in this step of a collective.
    Coll { msg: u32 },
    /// A point-to-point message.
    P2p { tag: u32, dtype: DType, seq: u64 },
}

struct Task {
    act: Act,
    /// Sends read it; receives and copies write it.
    span: Span,
    label: Label,
    /// Sends: bytes whose frames are out (for a pulled message, announced but perhaps not
    /// yet acknowledged).
    sent: usize,
    /// Bytes finished: received and placed, or (sends) written or acknowledged, so that the
    /// region may be touched again.
    done: usize,
    complete: bool,
    /// A point-to-point receive already bound to an incoming message.
    bound: bool,
    /// Where in `StepRun::deps` the earlier tasks it must follow are listed.
    deps: std::ops::Range<usize>,
    /// Its completion was reported to the feed.
    reported: bool,
    /// A later task of the step must wait for it.
    has_dependents: bool,
    /// Sends: bytes of the message this rank wrote into the receiver's memory itself (a
    /// cooperative pull; see [`Engine::cooperates`]).
    pushed: usize,
    /// Receives: bytes the sender is writing into this receive's memory, not yet confirmed.
    awaited: usize,
}

impl Task {
    fn new(act: Act, span: Span, label: Label) -> Task {
        Task {
            act,
            span,
            label,
            sent: 0,
            done: 0,
            complete: false,
            bound: false,
            deps: 0..0,
            reported: false,
            has_dependents: false,
            pushed: 0,
            awaited: 0,
        }
    }

    /// What the task reads and writes, by address.
    fn access(&self) -> Access {
        let at = |s: Span| Extent { space: 0, off: s.ptr as usize, len: s.len };
        let (reads, writes) = match self.act {
            Act::Send { .. } => (Some(self.span), None),
            Act::Recv { with, .. } => (with, Some(self.span)),
            Act::Copy { src } => (Some(src), Some(self.span)),
        };
        Access { reads: reads.map(at), writes: writes.map(at), len: self.span.len }
    }
}

/// What follows an outgoing frame's header.
#[derive(Copy, Clone, Debug)]
enum Body {
    /// Bytes of a send task's message, streamed.
    Data(Span),
    /// Where to read a segment of `len` bytes: the receiver pulls it and acknowledges it.
    Pull { desc: [u8; PULL_LEN], len: usize },
    /// The acknowledgement of a pulled segment of the peer's, or the confirmation that a
    /// pushed tail is written.
    Ack([u8; ACK_LEN]),
    /// A request to the sender of a pulled message to write its tail into this rank's memory.
    Push([u8; PULL_LEN]),
}

/// An outgoing frame being written.
struct OutFrame {
    /// The send task it belongs to (none for an acknowledgement).
    task: Option<usize>,
    header: [u8; HEADER_LEN],
    body: Body,
    written: usize,
}

impl OutFrame {
    /// A reply of `kind` (an acknowledgement of a copy, or the news that a pushed tail is
    /// written) to the frame with `header`, saying that `len` bytes were done.
    fn reply(mut header: Header, kind: FrameKind, len: usize) -> OutFrame {
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

    fn total(&self) -> usize {
        HEADER_LEN + self.body_len() + frame::pad_for(self.body_len())
    }

    /// The unwritten rest of the frame, as slices for one vectored write.
    fn rest<'a>(&'a self, pad: &'a [u8; 8]) -> ([IoSlice<'a>; 3], usize) {
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

/// Where the payload of an incoming frame goes.
#[derive(Copy, Clone, Debug)]
enum Target {
    Task(usize),
    /// A point-to-point message nobody has asked for yet: kept in `Engine::stash`.
    Stash(usize),
    /// The reason of an abort frame.
    Reason,
}

/// Reading state of one incoming stream, kept across operations.
#[derive(Clone, Debug, Default)]
enum Inbound {
    #[default]
    Idle,
    Header {
        buf: [u8; HEADER_LEN],
        have: usize,
    },
    Payload {
        target: Target,
        remaining: usize,
        pad: usize,
    },
    Pad {
        remaining: usize,
    },
    /// A fixed-size control payload being read (a pull descriptor, an acknowledgement).
    Control {
        what: Control,
        buf: [u8; PULL_LEN],
        have: usize,
    },
    /// A segment being pulled out of the peer's memory.
    Pulling {
        target: Target,
        from: Pull,
        addr: u64,
        len: usize,
        pos: usize,
        /// The pull frame's header, echoed in the acknowledgement.
        header: Header,
    },
    /// The tail of send task `task`, from byte `from`, being written into the peer's memory
    /// at `addr`.
    Pushing {
        task: usize,
        to: Pull,
        from: usize,
        addr: u64,
        pos: usize,
        /// The push request's header, echoed in the confirmation.
        header: Header,
    },
}

/// What a control payload is for.
#[derive(Copy, Clone, Debug)]
enum Control {
    /// The descriptor of a pull frame with this header, for `target`.
    Pull { target: Target, header: Header },
    /// An acknowledgement with this header.
    Ack { header: Header },
    /// A request to write the tail of a pulled message into the peer's memory.
    Push { header: Header },
    /// The peer has written the tail of a message into this rank's memory.
    Pushed { header: Header },
}

impl Control {
    fn len(&self) -> usize {
        match self {
            Control::Pull { .. } | Control::Push { .. } => PULL_LEN,
            Control::Ack { .. } | Control::Pushed { .. } => ACK_LEN,
        }
    }
}

/// Messages up to this many bytes, over memory links, may take the express lane.
const EXPRESS_MAX: usize = 4096;

/// Looks the express lane makes at links that have nothing for it before it hands the step
/// to the general loop, which spins some more and then sleeps.
const EXPRESS_POLLS: u32 = 2000;

/// Bytes pulled per copy when combining: staged in L2, then reduced.
const PULL_CHUNK: usize = 256 << 10;

/// Pulled messages at least this long, and at most `COOP_MAX`, are copied by both sides at
/// once: the receiver copies the head while the sender writes the tail into the receiver's
/// memory.
const COOP_MIN: usize = 1 << 20;

/// Below `COOP_MIN` the round trip of the request costs more than the half copy saves;
/// beyond `COOP_MAX` a copy is bound by memory bandwidth rather than by the core doing it,
/// and a write into another process's memory costs more than a read from it (measured on
/// the reference machine: a 1 MiB broadcast between two processes gains 40%, 512 KiB and
/// 8 MiB lose a little; beyond 2 MiB streaming through the ring does better still, see
/// [`Engine::streams_one_way`]).
const COOP_MAX: usize = 2 << 20;

/// Where a cooperative copy splits a message: a multiple of this many bytes (a page), so
/// that the two sides never write the same page.
const COOP_ALIGN: usize = 4096;

/// Bytes pulled per copy into a plain receive that a later operation of its step follows
/// (a forwarding rank passes the first piece on soon); one that nothing follows is copied in
/// one call, which amortises the kernel's work best.
const PULL_PLAIN_CHUNK: usize = 4 << 20;

/// A point-to-point message that arrived before its receive was posted.
struct Stashed {
    peer: usize,
    tag: u32,
    dtype: DType,
    seq: u64,
    data: Vec<u8>,
    filled: usize,
}

/// How the executor behaves; fixed per communicator.
#[derive(Clone, Debug)]
pub(crate) struct Tuning {
    /// Longest wait without progress before an operation fails.
    pub timeout: Duration,
    /// Most bytes of unexpected point-to-point messages kept at once.
    pub max_stash: usize,
    /// Messages at least this long are pulled by receivers that can read this rank's memory
    /// (`usize::MAX`: never).
    pub pull_min: usize,
}

/// One rank's executor in one communicator: its links and all state that outlives a step.
pub(crate) struct Engine {
    rank: usize,
    nranks: usize,
    comm: u64,
    links: Links,
    /// Largest frame payload per peer, as its link prefers.
    seg: Vec<usize>,
    /// Per peer: whether the link is a memory link.
    memory: Vec<bool>,
    /// Per peer: whether and how this rank can read its memory.
    pull_from: Vec<Option<Pull>>,
    /// Per peer: whether it can read this rank's memory.
    pulled_by: Vec<bool>,
    /// Per peer: acknowledgements of its pulled segments, still to be written.
    acks: Vec<VecDeque<OutFrame>>,
    /// Staging for pulled segments that are combined.
    stage: Vec<u64>,
    tuning: Tuning,
    inbound: Vec<Inbound>,
    /// Partial point-to-point message per peer: where its further frames go.
    continuing: Vec<Option<Target>>,
    out: Vec<Option<OutFrame>>,
    scratch: Vec<u64>,
    /// Step buffers kept between steps.
    spare: StepBufs,
    stash: Vec<Stashed>,
    stash_bytes: usize,
    abort_reason: Vec<u8>,
    /// The rank named by the abort notice being read.
    abort_origin: usize,
    p2p_sent: Vec<u64>,
    dead: Option<Error>,
    /// The last collectives this rank ran, newest last: a frame of an earlier sequence
    /// number is then reported against what this rank called under that number.
    history: VecDeque<OpDesc>,
}

/// Collectives remembered in `Engine::history`.
const HISTORY: usize = 32;

/// How long an aborting rank tries to finish half-written frames so that its abort notice
/// can follow them.
const ABORT_PATIENCE: Duration = Duration::from_millis(200);

// SAFETY: the raw pointers in `out` frames point into buffers of the operation being run,
// which the submitter keeps valid until the operation completes; frames never outlive it.
unsafe impl Send for Engine {}

/// What the step is part of, for labels, checks and messages.
#[derive(Copy, Clone)]
enum Ctx<'a> {
    Coll { desc: &'a OpDesc, step: u32 },
    P2p,
}

impl Ctx<'_> {
    fn describe(&self) -> String {
        match self {
            Ctx::Coll { desc, .. } => desc.to_string(),
            Ctx::P2p => "send/recv".to_string(),
        }
    }

    fn combine(&self) -> Option<(DType, ReduceOp)> {
        match self {
            Ctx::Coll { desc, .. } => desc.op.map(|op| (desc.dtype, op)),
            Ctx::P2p => None,
        }
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
unsafe fn fold(dtype: DType, op: ReduceOp, dst: Span, with: Span, at: usize, piece: &[u8]) -> Result<()> {
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

/// A link's I/O error: the peer aborted (memory links say so and why), or it was lost.
fn lost(op: String, peer: usize, e: std::io::Error) -> Error {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<PeerAborted>()) {
        Some(a) => Error::RemoteAbort { op, peer, origin: a.origin, reason: a.reason.clone() },
        None => Error::PeerLost { op, peer, detail: e.to_string() },
    }
}

impl Engine {
    pub fn new(rank: usize, nranks: usize, comm: u64, mut links: Links, tuning: Tuning) -> Engine {
        let seg = (0..nranks).map(|p| links.link(p).map_or(0, |l| l.max_frame())).collect();
        let pull_from = (0..nranks).map(|p| links.link(p).ok().and_then(|l| l.pull_from_peer())).collect();
        let pulled_by = (0..nranks).map(|p| links.link(p).is_ok_and(|l| l.peer_pulls())).collect();
        let memory = (0..nranks).map(|p| links.link(p).is_ok_and(|l| l.fd().is_none())).collect();
        Engine {
            seg,
            memory,
            pull_from,
            pulled_by,
            acks: (0..nranks).map(|_| VecDeque::new()).collect(),
            stage: Vec::new(),
            rank,
            nranks,
            comm,
            links,
            tuning,
            inbound: vec![Inbound::Idle; nranks],
            continuing: vec![None; nranks],
            out: (0..nranks).map(|_| None).collect(),
            scratch: Vec::new(),
            spare: StepBufs::default(),
            stash: Vec::new(),
            stash_bytes: 0,
            abort_reason: Vec::new(),
            abort_origin: 0,
            p2p_sent: vec![0; nranks],
            dead: None,
            history: VecDeque::with_capacity(HISTORY),
        }
    }

    /// A waker for this engine's waits.
    pub fn waker(&self) -> crate::transport::Waker {
        self.links.waker()
    }

    /// The error that killed this communicator, if one did.
    pub fn dead(&self) -> Option<&Error> {
        self.dead.as_ref()
    }

    /// Fails every operation from now on with `err`, and tells the peers.
    pub fn fail(&mut self, err: Error) {
        self.abort(&err);
    }

    fn abort(&mut self, err: &Error) {
        if self.dead.is_some() {
            return;
        }
        self.dead = Some(err.clone());
        // A notice can only follow a complete frame: finish half-written ones first (their
        // buffers are still those of the failing operation), giving up after a moment.
        self.finish_frames(Instant::now() + ABORT_PATIENCE);
        let mid: Vec<bool> = self.out.iter().map(Option::is_some).collect();
        // Relay news from elsewhere unchanged; otherwise the failure began here or at the
        // peer the error blames.
        let farewell = match err {
            Error::RemoteAbort { origin, reason, .. } => {
                Farewell::Abort { origin: *origin, reason: reason.clone() }
            }
            other => Farewell::Abort {
                origin: other.culprit().unwrap_or(self.rank),
                reason: format!("rank {}: {other}", self.rank),
            },
        };
        self.links.close_all(&farewell, &mid, Duration::ZERO);
    }

    /// Writes the rest of every half-written outgoing frame, until `deadline`. Frames on
    /// broken links stay half-written (so no notice is attempted there).
    fn finish_frames(&mut self, deadline: Instant) {
        let mut broken = vec![false; self.nranks];
        loop {
            let mut want = vec![Interest::default(); self.nranks];
            for peer in 0..self.nranks {
                if broken[peer] {
                    continue;
                }
                let Some(f) = self.out[peer].as_mut() else {
                    continue;
                };
                let Ok(link) = self.links.link(peer) else {
                    continue;
                };
                let pad = [0u8; 8];
                let total = f.total();
                // The failing operation's buffers are valid until it returns, after this.
                let (parts, n) = f.rest(&pad);
                match link.write(&parts[..n]) {
                    Ok(n) => f.written += n,
                    Err(_) => broken[peer] = true,
                }
                if f.written == total {
                    self.out[peer] = None;
                }
                want[peer].write = self.out[peer].is_some() && !broken[peer];
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if want.iter().all(|w| !w.write) || left.is_zero() {
                return;
            }
            // Without a last look after arming, a wake-up may be missed: the short nap bounds it.
            let token = self.links.arm();
            let _ = self.links.wait(&want, token, left.min(Duration::from_millis(10)));
        }
    }

    /// The recent collectives, oldest first, for error reports.
    fn recent(&self) -> String {
        self.history.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    }

    /// Closes the links cleanly (after the last operation).
    pub fn close(&mut self, farewell: Farewell) {
        if self.dead.is_some() {
            return;
        }
        let mid: Vec<bool> = self.out.iter().map(Option::is_some).collect();
        self.links.close_all(&farewell, &mid, Duration::from_secs(2));
        self.dead = Some(Error::Internal("communicator used after it was closed".into()));
    }

    /// Fails if the communicator is dead, or if a peer is known to have failed: no new
    /// operation starts after that. A peer's failure found here aborts this rank too, so its
    /// other peers hear who failed first rather than a clean goodbye.
    fn ensure_alive(&mut self, op: impl Fn() -> String) -> Result<()> {
        let res = self.check_alive(op);
        if let Err(e) = &res {
            self.abort(e);
        }
        res
    }

    fn check_alive(&self, op: impl Fn() -> String) -> Result<()> {
        if let Some(e) = &self.dead {
            return Err(Error::Aborted(Box::new(e.clone())));
        }
        match self.links.first_failed() {
            Some((peer, Closed::Aborted { origin, reason })) => {
                Err(Error::RemoteAbort { op: op(), peer, origin: *origin, reason: reason.clone() })
            }
            Some((peer, Closed::Vanished(detail))) => {
                Err(Error::PeerLost { op: op(), peer, detail: detail.clone() })
            }
            _ => Ok(()),
        }
    }

    /// Makes a lost-peer error as informative as the links allow: a peer that left an abort
    /// notice aborted (and says why); a peer that merely hung up may have been brought down by
    /// others that vanished first.
    fn explain(&mut self, e: Error) -> Error {
        let Error::PeerLost { op, peer, detail } = e else { return e };
        // The broken link may still hold the peer's last word, unread.
        if matches!(self.inbound[peer], Inbound::Idle) {
            self.links.probe(peer);
        }
        if let Some(Closed::Aborted { origin, reason }) = self.links.gone(peer) {
            return Error::RemoteAbort { op, peer, origin: *origin, reason: reason.clone() };
        }
        let vanished: Vec<String> = (0..self.nranks)
            .filter(|&q| q != peer && matches!(self.links.gone(q), Some(Closed::Vanished(_))))
            .map(|q| format!("rank {q}"))
            .collect();
        let detail = if vanished.is_empty() {
            detail
        } else {
            format!("{detail}; before it, {} vanished", vanished.join(", "))
        };
        Error::PeerLost { op, peer, detail }
    }

    /// Runs collective `plan` as operation number `seq` on `bufs`.
    pub fn collective(&mut self, plan: &Plan, seq: u64, bufs: &Bufs) -> Result<()> {
        let desc = plan.desc.with_seq(seq);
        self.ensure_alive(|| desc.to_string())?;
        if bufs.input_len < plan.input_len || bufs.output_len < plan.output_len {
            return Err(Error::Internal(format!("{desc}: buffers smaller than the plan's")));
        }
        let res = self.run_program(&desc, plan, bufs).map_err(|e| self.explain(e));
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(desc);
        if let Err(e) = &res {
            tracing::error!(rank = self.rank, comm = self.comm, "{e}; recent operations: {}", self.recent());
            self.abort(e);
        }
        res
    }

    fn run_program(&mut self, desc: &OpDesc, plan: &Plan, bufs: &Bufs) -> Result<()> {
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
        let steps = plan.steps(std::ptr::eq(bufs.input, bufs.output))?;
        for (s, step) in steps.iter().enumerate() {
            let mut run = StepRun::new(Ctx::Coll { desc, step: s as u32 }, self.nranks, self.take_bufs());
            run.load(step, span);
            if self.express(&run) {
                self.run_express(&mut run)?;
            } else {
                self.run_step(&mut run, None)?;
            }
            self.spare = run.into_bufs();
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

    /// Whether a step may take the express lane: every message of it is small, goes over a
    /// memory link and fits in one frame, and those links have nothing in flight.
    fn express(&self, run: &StepRun<'_>) -> bool {
        run.touched.iter().all(|&p| {
            self.memory[p]
                && matches!(self.inbound[p], Inbound::Idle)
                && self.out[p].is_none()
                && self.acks[p].is_empty()
        }) && run.tasks.iter().all(|t| match t.act {
            Act::Send { peer } | Act::Recv { peer, .. } => {
                t.span.len <= EXPRESS_MAX && t.span.len < self.tuning.pull_min && t.span.len <= self.seg[peer]
            }
            Act::Copy { .. } => true,
        })
    }

    /// Runs a step of small messages on memory links without the general loop's machinery:
    /// an operation goes as soon as what it follows is complete, a frame is written only
    /// when the ring takes it whole and read only when it has arrived whole, and it is
    /// placed straight from the ring. Anything else (a frame that is not the one expected,
    /// a full ring, a wait longer than a moment) hands the step, as it stands, to
    /// [`Engine::run_step`], which checks, waits and reports exactly as for any step.
    fn run_express(&mut self, run: &mut StepRun<'_>) -> Result<()> {
        // With more ranks than cores, looking again only keeps the awaited rank off the core.
        let patience = match self.links.polling() {
            Some(Polling::Spin(_)) => EXPRESS_POLLS,
            _ => 0,
        };
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
                let moved = match run.tasks[i].act {
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
                        unsafe { t.span.bytes_mut(0, t.span.len).copy_from_slice(src.bytes(0, src.len)) };
                        true
                    }
                };
                if moved {
                    let t = &mut run.tasks[i];
                    (t.sent, t.done, t.complete) = (t.span.len, t.span.len, true);
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
            self.inbound[peer] = self.on_header(run, peer, &buf)?;
            return Ok(None);
        };
        if self.coll_target(run, peer, &h)? != i {
            self.inbound[peer] = self.on_header(run, peer, &buf)?;
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

    /// Whether the pull of message segment `header` (of `len` bytes) into receive task `i`
    /// from `peer` is shared with the sender: the sender writes the tail into this rank's
    /// memory while this rank copies the head, so two cores copy instead of one. That pays
    /// where the sender has nothing else to do: in collectives whose data flows one way
    /// (broadcast, scatter, gather), with a core per rank; in exchanges both sides are busy
    /// copying already, and measured slower. Only for a whole message that lands in a receive
    /// buffer which nothing later in the step reads before it completes, and only where the
    /// sender may write this rank's memory.
    fn cooperates(&self, run: &StepRun<'_>, i: usize, peer: usize, header: &Header, len: usize) -> bool {
        let t = &run.tasks[i];
        run.one_way()
            && matches!(self.links.polling(), Some(Polling::Spin(_)))
            && matches!(t.act, Act::Recv { with: None, .. })
            && !t.has_dependents
            && header.offset == 0
            && len as u64 == header.total
            && (COOP_MIN..=COOP_MAX).contains(&len)
            && self.pulled_by[peer]
    }

    /// Whether a send of `len` bytes that the peer could pull goes through the ring instead,
    /// so that the sender's core copies it in while the receiver's copies it out. Beyond
    /// `COOP_MAX` a pull runs at the speed of one core copying between two memory-bound
    /// buffers, with the sender idle; through the ring (which stays in cache) each side makes
    /// one pass over main memory, in parallel: a 64 MiB broadcast between two processes took
    /// 7.2-7.8 ms instead of 13.4-13.7 ms. Only where the sender has nothing else to do: data
    /// flowing one way, a core per rank, and this the step's only send or copy (a root that
    /// sends to several ranks, or also copies its own block, lets them pull in parallel).
    fn streams_one_way(&self, run: &StepRun<'_>, len: usize) -> bool {
        len > COOP_MAX
            && run.one_way()
            && matches!(self.links.polling(), Some(Polling::Spin(_)))
            && run.tasks.iter().filter(|t| !matches!(t.act, Act::Recv { .. })).count() == 1
    }

    /// The step buffers kept from the last step (empty after a failed one).
    fn take_bufs(&mut self) -> StepBufs {
        std::mem::take(&mut self.spare)
    }

    /// Runs point-to-point messages from `feed` concurrently, taking in those issued
    /// meanwhile, until every message taken has completed and none is waiting.
    pub fn p2p(&mut self, feed: &mut dyn P2pFeed) -> Result<()> {
        self.ensure_alive(|| "send/recv".to_string())?;
        let mut run = StepRun::new(Ctx::P2p, self.nranks, self.take_bufs());
        let res = self.run_step(&mut run, Some(feed)).map_err(|e| self.explain(e));
        self.spare = run.into_bufs();
        if let Err(e) = &res {
            self.abort(e);
        }
        res
    }

    /// Runs a step to completion. With a `feed` (point-to-point batches), operations issued
    /// while it runs join it, and each one's completion is reported as it happens.
    fn run_step(&mut self, run: &mut StepRun<'_>, mut feed: Option<&mut dyn P2pFeed>) -> Result<()> {
        let mut reported = 0;
        // When the step last stopped moving, and how many idle passes it has polled since.
        let mut idle_since: Option<Instant> = None;
        let mut polls = 0u32;
        let polling = self.links.polling();
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
                        feed.complete(i);
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
                polls = 0;
                continue;
            }
            let idle = *idle_since.get_or_insert_with(Instant::now);
            // Poll memory links for a while: a peer that is about to answer is cheaper to
            // catch by looking than by sleeping and being woken (the clock is read only
            // every 64 looks).
            match polling {
                Some(Polling::Spin(spin)) => {
                    polls += 1;
                    std::hint::spin_loop();
                    if polls % 64 != 0 || idle.elapsed() < spin + run.copy_wait() {
                        continue;
                    }
                }
                Some(Polling::Yield(budget)) => {
                    std::thread::yield_now();
                    if idle.elapsed() < budget + run.copy_wait() {
                        continue;
                    }
                }
                None => {}
            }
            let want = self.interest(run);
            if want.iter().all(|w| !w.read && !w.write) {
                return Err(Error::Internal(format!("{}: step stalled with nothing to wait for", run.op())));
            }
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
                polls = 0;
                continue;
            }
            let nap = (self.tuning.timeout - idle_for).min(Duration::from_secs(1));
            // A peer that ended is not fatal yet: what it sent before may be all this step
            // needs. Reading past its last byte, or writing to it, fails at once.
            self.links.wait(&want, token, nap).map_err(|e| Error::io(format!("{}: waiting", run.op()), e))?;
        }
    }

    /// Whether every acknowledgement owed to a peer has been written (a step may not end
    /// before: the peer waits for it).
    fn acks_written(&self) -> bool {
        self.acks.iter().all(VecDeque::is_empty)
            && self.out.iter().all(|f| !matches!(f, Some(OutFrame { body: Body::Ack(_), .. })))
    }

    /// One pass over local copies and the outgoing and incoming streams of every peer the
    /// step talks to.
    fn pump_all(&mut self, run: &mut StepRun<'_>) -> Result<bool> {
        let mut progress = false;
        for k in 0..run.touched.len() {
            let peer = run.touched[k];
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
                let write = self.out[peer].is_some()
                    || !self.acks[peer].is_empty()
                    || run.next_send(peer).is_some_and(|i| run.send_ready(i, self.seg[peer]) > 0);
                let read = match &self.inbound[peer] {
                    Inbound::Idle => run.expects_from(peer),
                    Inbound::Header { .. } | Inbound::Pad { .. } | Inbound::Control { .. } => true,
                    Inbound::Pulling { target: Target::Task(i), .. } => run.limit(*i) > run.tasks[*i].done,
                    Inbound::Pulling { .. } | Inbound::Pushing { .. } => true,
                    Inbound::Payload { target: Target::Task(i), .. } => run.limit(*i) > run.tasks[*i].done,
                    Inbound::Payload { .. } => true,
                };
                Interest { read, write, idle: matches!(self.inbound[peer], Inbound::Idle) }
            })
            .collect()
    }

    fn timeout_error(&self, run: &StepRun<'_>, idle_for: Duration) -> Error {
        let mut silent = Vec::new();
        let mut deaf = Vec::new();
        for t in run.tasks.iter().filter(|t| !t.complete) {
            match t.act {
                Act::Recv { peer, .. } => {
                    silent.push(format!("rank {peer} ({} of {} bytes received)", t.done, t.span.len))
                }
                Act::Send { peer } => {
                    deaf.push(format!("rank {peer} ({} of {} bytes sent)", t.done, t.span.len))
                }
                Act::Copy { .. } => {}
            }
        }
        let mut detail = String::new();
        if !silent.is_empty() {
            detail += &format!("not heard from {}", silent.join(", "));
        }
        if !deaf.is_empty() {
            if !detail.is_empty() {
                detail += "; ";
            }
            detail += &format!("not read by {}", deaf.join(", "));
        }
        Error::Timeout { op: run.op(), rank: self.rank, secs: idle_for.as_secs_f64(), detail }
    }

    /// Writes frames to `peer` while the link takes them; true if anything moved.
    fn pump_out(&mut self, run: &mut StepRun<'_>, peer: usize) -> Result<bool> {
        let mut progress = false;
        loop {
            if self.out[peer].is_none() {
                // Acknowledgements first: the peer waits on them.
                if let Some(ack) = self.acks[peer].pop_front() {
                    self.out[peer] = Some(ack);
                } else {
                    let Some(i) = run.next_send(peer) else { break };
                    // A pulled send is done only when the peer has copied it; if a later task of
                    // the step waited for that, two ranks exchanging in place would each wait
                    // for the other's copy: such sends are streamed.
                    let t = &run.tasks[i];
                    let pull = self.pulled_by[peer]
                        && t.span.len >= self.tuning.pull_min
                        && !t.has_dependents
                        && !self.streams_one_way(run, t.span.len);
                    // A descriptor costs no ring space: a message that is all there goes in one,
                    // and the receiver copies it in large pieces. One that is still arriving
                    // (forwarded) is described segment by segment as it comes.
                    let seg = if pull && t.deps.is_empty() { usize::MAX } else { self.seg[peer] };
                    let ready = run.send_ready(i, seg);
                    // An empty message still goes out, as a bare header.
                    if ready == 0 && run.tasks[i].span.len > 0 {
                        break;
                    }
                    if let Some(how) = self.links.gone(peer) {
                        let detail = format!(
                            "it ended its communicator ({how:?}) before this rank sent it everything"
                        );
                        return Err(Error::PeerLost { op: run.op(), peer, detail });
                    }
                    self.out[peer] = Some(self.frame_for(run, i, ready, pull));
                }
            }
            let f = self.out[peer].as_mut().expect("frame present");
            let pad = [0u8; 8];
            let (parts, n) = f.rest(&pad);
            let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
            let wrote = link.write(&parts[..n]).map_err(|e| lost(run.op(), peer, e))?;
            if wrote == 0 {
                break;
            }
            progress = true;
            f.written += wrote;
            if f.written == f.total() {
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
                self.out[peer] = None;
            }
        }
        Ok(progress)
    }

    /// The next frame of send task `i`, covering its next `len` bytes: streamed, or (`pull`)
    /// as a descriptor for the receiver to pull.
    fn frame_for(&self, run: &StepRun<'_>, i: usize, len: usize, pull: bool) -> OutFrame {
        let t = &run.tasks[i];
        let mut h = match (run.ctx, t.label) {
            (Ctx::Coll { desc, step }, Label::Coll { msg }) => Header::data(self.comm, desc, step, msg),
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

    /// Reads from `peer` while bytes arrive and have somewhere to go; true if anything moved.
    fn pump_in(&mut self, run: &mut StepRun<'_>, peer: usize) -> Result<bool> {
        let mut progress = false;
        loop {
            let moved = match std::mem::take(&mut self.inbound[peer]) {
                Inbound::Idle => {
                    if !run.expects_from(peer) {
                        false
                    } else {
                        self.inbound[peer] = Inbound::Header { buf: [0; HEADER_LEN], have: 0 };
                        true
                    }
                }
                Inbound::Header { mut buf, mut have } => {
                    let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
                    let n = link.read(&mut buf[have..]).map_err(|e| lost(run.op(), peer, e))?;
                    have += n;
                    if have == HEADER_LEN {
                        self.inbound[peer] = self.on_header(run, peer, &buf)?;
                    } else {
                        self.inbound[peer] = Inbound::Header { buf, have };
                    }
                    n > 0
                }
                Inbound::Payload { target, remaining, pad } => {
                    let n = self.read_payload(run, peer, target, remaining)?;
                    self.inbound[peer] = if n < remaining {
                        Inbound::Payload { target, remaining: remaining - n, pad }
                    } else {
                        self.payload_done(run, peer, target)?;
                        if pad > 0 { Inbound::Pad { remaining: pad } } else { Inbound::Idle }
                    };
                    n > 0
                }
                Inbound::Pad { remaining } => {
                    let mut sink = [0u8; 8];
                    let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
                    let n = link.read(&mut sink[..remaining]).map_err(|e| lost(run.op(), peer, e))?;
                    self.inbound[peer] = if n == remaining {
                        Inbound::Idle
                    } else {
                        Inbound::Pad { remaining: remaining - n }
                    };
                    n > 0
                }
                Inbound::Control { what, mut buf, mut have } => {
                    let need = what.len();
                    let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
                    let n = link.read(&mut buf[have..need]).map_err(|e| lost(run.op(), peer, e))?;
                    have += n;
                    self.inbound[peer] = if have < need {
                        Inbound::Control { what, buf, have }
                    } else {
                        self.on_control(run, peer, what, &buf)?
                    };
                    n > 0
                }
                Inbound::Pulling { target, from, addr, len, mut pos, header } => {
                    let n = self.pull(run, peer, target, from, addr + pos as u64, len - pos)?;
                    pos += n;
                    self.inbound[peer] = if pos < len {
                        Inbound::Pulling { target, from, addr, len, pos, header }
                    } else {
                        // Copied: the sender may reuse the segment.
                        self.acks[peer].push_back(OutFrame::reply(header, FrameKind::Ack, len));
                        self.payload_done(run, peer, target)?;
                        Inbound::Idle
                    };
                    n > 0
                }
                Inbound::Pushing { task, to, from, addr, mut pos, header } => {
                    let t = &run.tasks[task];
                    let len = t.span.len - from;
                    let n = (len - pos).min(PULL_PLAIN_CHUNK);
                    // SAFETY: the bytes lie in the send's span (`from + pos + n <= span.len`),
                    // which only sends read; the receiver named `addr..addr + len` as the tail
                    // of its own receive buffer, which it leaves alone until it is told below
                    // that the tail is written.
                    unsafe { pull::write(to, addr + pos as u64, t.span.bytes(from + pos, from + pos + n)) }
                        .map_err(|e| lost(run.op(), peer, e))?;
                    pos += n;
                    self.inbound[peer] = if pos < len {
                        Inbound::Pushing { task, to, from, addr, pos, header }
                    } else {
                        let t = &mut run.tasks[task];
                        t.pushed = len;
                        t.complete = t.done + t.pushed == t.span.len;
                        self.acks[peer].push_back(OutFrame::reply(header, FrameKind::Pushed, len));
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
    fn on_header(&mut self, run: &mut StepRun<'_>, peer: usize, buf: &[u8; HEADER_LEN]) -> Result<Inbound> {
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
                self.abort_reason.clear();
                self.abort_origin = h.root as usize;
                Target::Reason
            }
            FrameKind::Ack | FrameKind::Push | FrameKind::Pushed => {
                let what = match h.kind {
                    FrameKind::Ack => Control::Ack { header: h },
                    FrameKind::Push => Control::Push { header: h },
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
                    if self.pull_from[peer].is_none() {
                        return Err(protocol(
                            "it sent a pull descriptor, but this rank cannot read its memory".into(),
                        ));
                    }
                    let what = Control::Pull { target, header: h };
                    return Ok(Inbound::Control { what, buf: [0; PULL_LEN], have: 0 });
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
    fn coll_target(&self, run: &StepRun<'_>, peer: usize, h: &Header) -> Result<usize> {
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
            let ours = self.history.iter().rev().find(|d| d.seq == h.seq && h.seq < desc.seq).unwrap_or(desc);
            return Err(Error::Mismatch {
                rank: self.rank,
                local: ours.to_string(),
                peer,
                remote: h.describe(),
            });
        }
        let Some(i) = run.next_recv(peer) else {
            return Err(protocol(format!("step {} message {} arrived but none was expected", h.step, h.msg)));
        };
        let t = &run.tasks[i];
        let Label::Coll { msg } = t.label else { unreachable!("collective step has collective labels") };
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
                let from =
                    self.pull_from[peer].ok_or_else(|| protocol("pull from an unreadable peer".into()))?;
                let len = len as usize;
                let mine = match target {
                    Target::Task(i) if self.cooperates(run, i, peer, &header, len) => {
                        // Copy the head, and have the sender write the tail meanwhile.
                        let head = (len / 2) & !(COOP_ALIGN - 1);
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
                        self.acks[peer].push_back(frame);
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
                let to = self.pull_from[peer]
                    .ok_or_else(|| protocol("push request from a peer this rank cannot write to".into()))?;
                Ok(Inbound::Pushing { task: i, to, from, addr, pos: 0, header })
            }
            Control::Pushed { header } => {
                let pushed = word(0) as usize;
                let i = run.pushed_recv(peer, &header).ok_or_else(|| {
                    protocol(format!(
                        "confirmation of a push this rank did not ask for ({})",
                        header.describe()
                    ))
                })?;
                let t = &mut run.tasks[i];
                if pushed != t.awaited {
                    return Err(protocol(format!(
                        "{pushed} bytes pushed where {} were asked for",
                        t.awaited
                    )));
                }
                t.awaited = 0;
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
                if header.offset != t.done as u64 || t.done + t.pushed + acked > t.sent {
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
            Target::Stash(k) => {
                let s = &mut self.stash[k];
                // SAFETY: the sender keeps the segment valid and unwritten until acknowledged.
                unsafe { pull::copy(from, addr, &mut s.data[s.filled..s.filled + left]) }.map_err(fail)?;
                s.filled += left;
                Ok(left)
            }
            Target::Reason => Err(Error::Internal("pull into an abort reason".into())),
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
                        // SAFETY: [done, done + n) lies in the destination (n <= limit - done)
                        // and, by the ordering rule, no other view of it is alive.
                        unsafe { fold(dtype, rop, dst, with, done, stage) }?;
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

    /// Finds where the payload of a point-to-point frame goes: the posted receive it
    /// matches, or the stash.
    fn route_p2p(&mut self, run: &mut StepRun<'_>, peer: usize, h: &Header) -> Result<Target> {
        let ctx = run.ctx;
        if h.offset > 0 {
            return self.continuing[peer].ok_or_else(|| Error::Protocol {
                op: ctx.describe(),
                peer,
                detail: format!("continuation of message #{} without its start", h.seq),
            });
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
                let total = h.total as usize;
                if self.stash_bytes + total > self.tuning.max_stash {
                    return Err(Error::Protocol {
                        op: ctx.describe(),
                        peer,
                        detail: format!(
                            "it sent {} that no receive has asked for, and unexpected messages already \
                             hold {} bytes (XCCL_MAX_UNEXPECTED_BYTES={}): post the matching recv earlier",
                            h.describe(),
                            self.stash_bytes,
                            self.tuning.max_stash
                        ),
                    });
                }
                self.stash_bytes += total;
                self.stash.push(Stashed {
                    peer,
                    tag: h.step,
                    dtype: h.dtype,
                    seq: h.seq,
                    data: vec![0u8; total],
                    filled: 0,
                });
                Target::Stash(self.stash.len() - 1)
            }
        };
        self.continuing[peer] = (h.total > u64::from(h.len)).then_some(target);
        Ok(target)
    }

    /// Reads up to `remaining` payload bytes from `peer` into `target`; returns how many.
    fn read_payload(
        &mut self,
        run: &mut StepRun<'_>,
        peer: usize,
        target: Target,
        remaining: usize,
    ) -> Result<usize> {
        let link = self.links.link(peer).map_err(|e| Error::Internal(e.to_string()))?;
        let ctx = run.ctx;
        let n = match target {
            Target::Reason => {
                let mut buf = [0u8; 512];
                let n =
                    link.read(&mut buf[..remaining.min(512)]).map_err(|e| lost(ctx.describe(), peer, e))?;
                self.abort_reason.extend_from_slice(&buf[..n]);
                n
            }
            Target::Stash(k) => {
                let s = &mut self.stash[k];
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
    fn payload_done(&mut self, run: &mut StepRun<'_>, peer: usize, target: Target) -> Result<()> {
        match target {
            Target::Reason => {
                let reason = String::from_utf8_lossy(&self.abort_reason).into_owned();
                Err(Error::RemoteAbort { op: run.op(), peer, origin: self.abort_origin, reason })
            }
            Target::Task(i) => {
                let t = &mut run.tasks[i];
                t.complete = t.done == t.span.len;
                if t.complete && matches!(t.label, Label::P2p { .. }) {
                    self.continuing[peer] = None;
                }
                Ok(())
            }
            Target::Stash(k) => {
                let s = &self.stash[k];
                if s.filled == s.data.len() {
                    self.continuing[peer] = None;
                    if let Some(i) = run.matching_recv(peer, s.tag) {
                        self.claim_stashed(run, i)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Adds the messages issued since the last look; true if there were any.
    fn take_issued(&mut self, run: &mut StepRun<'_>, feed: &mut dyn P2pFeed) -> Result<bool> {
        let mut new = Vec::new();
        feed.fetch(&mut new);
        for m in &new {
            let (act, label) = if m.send {
                let seq = self.p2p_sent[m.peer];
                self.p2p_sent[m.peer] += 1;
                (Act::Send { peer: m.peer }, Label::P2p { tag: m.tag, dtype: m.dtype, seq })
            } else {
                (Act::Recv { peer: m.peer, with: None }, Label::P2p { tag: m.tag, dtype: m.dtype, seq: 0 })
            };
            let span = Span { ptr: m.ptr, len: m.len };
            let i = run.push(Task::new(act, span, label));
            self.claim_stashed(run, i)?;
        }
        Ok(!new.is_empty())
    }

    /// Completes point-to-point receive `i` from a fully stashed message, if one matches.
    fn claim_stashed(&mut self, run: &mut StepRun<'_>, i: usize) -> Result<()> {
        let t = &run.tasks[i];
        let (Act::Recv { peer, .. }, Label::P2p { tag, dtype, .. }) = (t.act, t.label) else {
            return Ok(());
        };
        if t.bound {
            return Ok(());
        }
        // Non-overtaking: the oldest message with this tag from this peer.
        let Some(k) = self.stash.iter().position(|s| s.peer == peer && s.tag == tag) else {
            return Ok(());
        };
        if self.stash[k].filled < self.stash[k].data.len() {
            return Ok(());
        }
        let s = self.stash.remove(k);
        self.stash_bytes -= s.data.len();
        // Stashed targets after `k` moved down by one.
        for c in self.continuing.iter_mut() {
            if let Some(Target::Stash(j)) = c {
                if *j > k {
                    *j -= 1;
                }
            }
        }
        for b in self.inbound.iter_mut() {
            if let Inbound::Payload { target: Target::Stash(j), .. } = b {
                if *j > k {
                    *j -= 1;
                }
            }
        }
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
        unsafe { t.span.bytes_mut(0, t.span.len) }.copy_from_slice(&s.data);
        t.done = t.span.len;
        t.complete = true;
        t.bound = true;
        Ok(())
    }
}

/// The buffers of a step being run, kept by the engine between steps so that running one
/// allocates nothing.
#[derive(Default)]
struct StepBufs {
    tasks: Vec<Task>,
    /// The ordering dependencies of all tasks: (earlier task, segment by segment?).
    deps: Vec<(usize, bool)>,
    /// Per peer, its send and receive tasks in order.
    sends: Vec<Vec<usize>>,
    recvs: Vec<Vec<usize>>,
    /// Peers with tasks, whose lists above need clearing.
    touched: Vec<usize>,
}

/// One step being run.
struct StepRun<'a> {
    ctx: Ctx<'a>,
    tasks: Vec<Task>,
    deps: Vec<(usize, bool)>,
    sends: Vec<Vec<usize>>,
    recvs: Vec<Vec<usize>>,
    touched: Vec<usize>,
}

impl<'a> StepRun<'a> {
    /// An empty step over `nranks` ranks, reusing `bufs`.
    fn new(ctx: Ctx<'a>, nranks: usize, bufs: StepBufs) -> Self {
        let StepBufs { mut tasks, mut deps, mut sends, mut recvs, mut touched } = bufs;
        tasks.clear();
        deps.clear();
        for &p in &touched {
            sends[p].clear();
            recvs[p].clear();
        }
        touched.clear();
        sends.resize_with(nranks, Vec::new);
        recvs.resize_with(nranks, Vec::new);
        StepRun { ctx, tasks, deps, sends, recvs, touched }
    }

    /// Whether this is a step of a collective whose data flows one way (broadcast, scatter,
    /// gather): a sender has nothing to do but send.
    fn one_way(&self) -> bool {
        matches!(
            self.ctx,
            Ctx::Coll { desc, .. } if matches!(desc.kind, CollKind::Broadcast | CollKind::Scatter | CollKind::Gather)
        )
    }

    /// Gives the buffers back for the next step.
    fn into_bufs(self) -> StepBufs {
        let StepRun { tasks, deps, sends, recvs, touched, .. } = self;
        StepBufs { tasks, deps, sends, recvs, touched }
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
    fn load(&mut self, plan: &CompiledStep, span: impl Fn(&Region) -> Span) {
        for tp in &plan.tasks {
            let act = match tp.act {
                PlannedAct::Send { peer } => Act::Send { peer },
                PlannedAct::Recv { peer, with } => Act::Recv { peer, with: with.map(|w| span(&w)) },
                PlannedAct::Copy { src } => Act::Copy { src: span(&src) },
            };
            let mut t = Task::new(act, span(&tp.region), Label::Coll { msg: tp.msg });
            t.has_dependents = tp.has_dependents;
            if tp.noop {
                t.complete = true;
                t.done = t.span.len;
            }
            self.add(t, tp.deps.iter().map(|&(d, fine)| (d as usize, fine)));
        }
    }

    /// Adds a point-to-point task after the others, working out what it must follow.
    /// Returns its index.
    fn push(&mut self, t: Task) -> usize {
        let mut deps = Vec::new();
        dependencies(self.tasks.iter().map(Task::access), &t.access(), |i, fine| deps.push((i, fine)));
        for &(i, _) in &deps {
            self.tasks[i].has_dependents = true;
        }
        self.add(t, deps)
    }

    /// How long the peers may still be busy copying this rank's pulled messages: a rank
    /// waiting for those acknowledgements keeps polling that much longer rather than sleep,
    /// since being woken costs more than the wait (assumes a copy rate of 4 GB/s; at most
    /// 10 ms).
    fn copy_wait(&self) -> Duration {
        let unacked: usize = self.tasks.iter().map(|t| t.sent.saturating_sub(t.done + t.pushed)).sum();
        Duration::from_nanos((unacked / 4) as u64).min(Duration::from_millis(10))
    }

    /// The operation, described for error messages.
    fn op(&self) -> String {
        self.ctx.describe()
    }

    /// How far task `i` may go: the least progress among what it follows.
    fn limit(&self, i: usize) -> usize {
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
    fn send_ready(&self, i: usize, seg: usize) -> usize {
        let t = &self.tasks[i];
        let want = (t.span.len - t.sent).min(seg);
        if self.limit(i).saturating_sub(t.sent) >= want { want } else { 0 }
    }

    /// The first send to `peer` with bytes not yet out.
    fn next_send(&self, peer: usize) -> Option<usize> {
        self.sends[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            t.sent < t.span.len || (t.span.len == 0 && !t.complete)
        })
    }

    /// The send to `peer` that acknowledgement (or push request) `h` is for.
    fn acked_send(&self, peer: usize, h: &Header) -> Option<usize> {
        self.sends[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            t.sent > t.done + t.pushed
                && match (self.ctx, t.label) {
                    (Ctx::Coll { step, .. }, Label::Coll { msg }) => h.step == step && h.msg == msg,
                    (_, Label::P2p { seq, .. }) => h.coll == CollKind::SendRecv && h.seq == seq,
                    (Ctx::P2p, Label::Coll { .. }) => false,
                }
        })
    }

    /// The receive from `peer` that its next data or pull frame is for: the first not
    /// complete, passing over those that only wait for the peer to confirm a push (their one
    /// descriptor has come).
    fn next_recv(&self, peer: usize) -> Option<usize> {
        self.recvs[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            !t.complete && t.awaited == 0
        })
    }

    /// The receive from `peer` that push confirmation `h` is for.
    fn pushed_recv(&self, peer: usize, h: &Header) -> Option<usize> {
        let Ctx::Coll { step, .. } = self.ctx else { return None };
        self.recvs[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            t.awaited > 0 && h.step == step && matches!(t.label, Label::Coll { msg } if msg == h.msg)
        })
    }

    /// Whether a frame from `peer` is awaited: data, acknowledgements of pulled segments,
    /// push requests or confirmations.
    fn expects_from(&self, peer: usize) -> bool {
        self.recvs[peer].iter().any(|&i| !self.tasks[i].complete)
            || self.sends[peer].iter().any(|&i| {
                let t = &self.tasks[i];
                t.sent > t.done + t.pushed
            })
    }

    /// The first unbound point-to-point receive from `peer` with `tag`.
    fn matching_recv(&self, peer: usize, tag: u32) -> Option<usize> {
        self.recvs[peer].iter().copied().find(|&i| {
            let t = &self.tasks[i];
            !t.complete && !t.bound && matches!(t.label, Label::P2p { tag: tg, .. } if tg == tag)
        })
    }

    /// Runs local copies as far as they may go; true if anything moved.
    fn local_copies(&mut self) -> bool {
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
                unsafe { t.span.bytes_mut(t.done, lim).copy_from_slice(src.bytes(t.done, lim)) };
                t.done = lim;
                t.complete = t.done == t.span.len;
                progress = true;
            }
        }
        progress
    }
}
