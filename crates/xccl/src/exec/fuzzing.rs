//! The executor with its peer played from bytes, for the fuzzer: rank 0 of two runs an
//! operation twice (a collective by one of its algorithms, or point-to-point receives)
//! while everything rank 1 sends it is given up front ([`Replay`]), so that whatever a
//! peer's frames carry (headers, payloads, control frames, continuations, abort notices,
//! last words) meets the real executor. [`record`] runs a scenario on two ranks and keeps
//! what rank 1 sent: a valid input to start from.
//!
//! An input is three scenario bytes, then rank 1's stream. Byte 0 picks the operation,
//! byte 1 its algorithm and root, byte 2 the count and how the stream arrives: whole, with
//! `holds` telling the truth (as a memory ring), or in short reads (as a socket).

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{Bufs, Engine, P2p, P2pFeed, Plan, Tuning};
use crate::algo::{self, Algorithm, Shape};
use crate::coll::CollKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::frame::{Farewells, OpDesc};
use crate::protocol::ProtocolPolicy;
use crate::reduce::ReduceOp;
use crate::transport::tcp::LastWords;
use crate::transport::{Closed, Farewell, Link, Links, Within};

/// The communicator id in every scenario.
const COMM: u64 = 0x00f0_22ed;
/// Largest frame payload on the scenarios' links: small, so that messages come in pieces.
const FRAME: usize = 1024;
/// Bytes of scenario before the stream.
pub(crate) const SCENARIO_BYTES: usize = 3;
/// Element counts byte 2 picks from.
const COUNTS: [usize; 4] = [1, 6, 64, 300];
/// Short-read sizes byte 2 picks from (0: the whole stream is there, as in a ring).
const CHUNKS: [usize; 4] = [0, 1, 13, 200];
// The largest messages span several frames.
const _: () = assert!(COUNTS[3] * 8 > 2 * FRAME);

/// What rank 0 runs, picked by byte 0.
#[derive(Copy, Clone, Debug)]
enum Op {
    Coll(CollKind, DType, Option<ReduceOp>),
    /// Receives of tags 7 and 3 from rank 1, posted together.
    Recv,
    /// A receive of tag 3, then one of tag 5, which rank 1 sends first (it waits unasked).
    Stashed,
}

const OPS: [Op; 11] = [
    Op::Coll(CollKind::AllReduce, DType::F32, Some(ReduceOp::Sum)),
    Op::Coll(CollKind::Broadcast, DType::U8, None),
    Op::Coll(CollKind::Reduce, DType::I32, Some(ReduceOp::Max)),
    Op::Coll(CollKind::AllGather, DType::F64, None),
    Op::Coll(CollKind::ReduceScatter, DType::BF16, Some(ReduceOp::Avg)),
    Op::Coll(CollKind::AllToAll, DType::U64, None),
    Op::Coll(CollKind::Scatter, DType::I8, None),
    Op::Coll(CollKind::Gather, DType::U32, None),
    Op::Coll(CollKind::Barrier, DType::U8, None),
    Op::Recv,
    Op::Stashed,
];

/// A scenario decoded from its three bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Scenario {
    op: usize,
    algo: Option<Algorithm>,
    root: usize,
    count: usize,
    chunk: usize,
}

impl Scenario {
    /// The scenario `bytes` name; every three bytes name one.
    pub fn decode(bytes: [u8; SCENARIO_BYTES]) -> Scenario {
        let op = usize::from(bytes[0]) % OPS.len();
        let barrier = matches!(OPS[op], Op::Coll(CollKind::Barrier, ..));
        let count = if barrier { 0 } else { COUNTS[usize::from(bytes[2] & 3)] };
        let root = usize::from(bytes[1] >> 7);
        let algo = match OPS[op] {
            Op::Coll(kind, ..) => {
                let shape = Shape::Count(count);
                let algos: Vec<_> = Algorithm::for_collective(kind)
                    .iter()
                    .copied()
                    .filter(|a| a.supports(kind, 2, &shape))
                    .collect();
                algos.get(usize::from(bytes[1] & 0x7f) % algos.len().max(1)).copied()
            }
            _ => None,
        };
        Scenario { op, algo, root, count, chunk: CHUNKS[usize::from((bytes[2] >> 2) & 3)] }
    }

    /// Every scenario with its bytes (the stream arriving whole), for seeds.
    pub fn all() -> Vec<[u8; SCENARIO_BYTES]> {
        let mut out = Vec::new();
        for op in 0..OPS.len() as u8 {
            for count in 0..COUNTS.len() as u8 {
                let algos = match OPS[usize::from(op)] {
                    Op::Coll(CollKind::Barrier, ..) if count > 0 => 0,
                    Op::Coll(kind, ..) => {
                        let s = Scenario::decode([op, 0, count]);
                        Algorithm::for_collective(kind)
                            .iter()
                            .filter(|a| a.supports(kind, 2, &Shape::Count(s.count)))
                            .count()
                    }
                    _ => 1,
                };
                let rooted = matches!(
                    OPS[usize::from(op)],
                    Op::Coll(
                        CollKind::Broadcast | CollKind::Reduce | CollKind::Scatter | CollKind::Gather,
                        ..
                    )
                );
                for root in 0..=u8::from(rooted) {
                    for algo in 0..algos as u8 {
                        out.push([op, algo | (root << 7), count]);
                    }
                }
            }
        }
        out
    }
}

/// The plans of the scenarios run so far, by scenario and rank.
type Plans = HashMap<(Scenario, usize), Arc<Plan>>;

/// The plan of `s` on `rank`, built once per process.
fn plan(s: &Scenario, rank: usize) -> Result<Arc<Plan>> {
    static PLANS: Mutex<Option<Plans>> = Mutex::new(None);
    let mut plans = PLANS.lock().unwrap_or_else(PoisonError::into_inner);
    let plans = plans.get_or_insert_with(HashMap::new);
    if let Some(p) = plans.get(&(*s, rank)) {
        return Ok(p.clone());
    }
    let (Op::Coll(kind, dtype, op), Some(algo)) = (OPS[s.op], s.algo) else {
        return Err(Error::Internal("not a collective scenario".into()));
    };
    let root = matches!(kind, CollKind::Broadcast | CollKind::Reduce | CollKind::Scatter | CollKind::Gather)
        .then_some(s.root);
    let program = algo::build(kind, algo, rank, &[0, 1], root.unwrap_or(0), &Shape::Count(s.count))?;
    let desc = OpDesc { kind, seq: 0, dtype, op, count: s.count as u64, root: root.map(|r| r as u32), algo };
    let elems = 2 * s.count;
    let p = Arc::new(Plan::new(desc, program, rank, 2, (elems, elems), None)?);
    plans.insert((*s, rank), p.clone());
    Ok(p)
}

/// An engine of rank `rank` of two whose link to the other rank is `link`.
fn engine(rank: usize, link: Box<dyn Link>, timeout: Duration) -> Result<Engine> {
    let mut links: Vec<Option<Box<dyn Link>>> = vec![None, None];
    links[1 - rank] = Some(link);
    let links = Links::new(rank, links, None).map_err(|e| Error::io("links", e))?;
    let tuning = Tuning {
        timeout,
        // The stash's budget is a setting; a small one here shows that it holds.
        max_stash: 1 << 20,
        pull_min: crate::protocol::PullMin { combining: usize::MAX, plain: usize::MAX },
        // No LL: the links have no LL channel (the `ll` target fuzzes it).
        protocols: ProtocolPolicy::parse("eager,stream")?,
        board: None,
    };
    Ok(Engine::new(rank, 2, COMM, links, tuning))
}

/// A point-to-point batch: its messages, handed out once.
struct Feed(Vec<P2p>);

impl P2pFeed for Feed {
    fn fetch(&mut self, into: &mut Vec<P2p>) {
        into.append(&mut self.0);
    }
    fn complete(&mut self, _index: usize, _result: Result<()>) {}
}

/// Runs scenario `s` on `rank` of two over `engine`, twice; then closes it.
fn run(s: &Scenario, rank: usize, mut engine: Engine) -> Result<()> {
    let res = run_ops(s, rank, &mut engine);
    engine.close(Farewell::Goodbye);
    res
}

fn run_ops(s: &Scenario, rank: usize, engine: &mut Engine) -> Result<()> {
    // Room for the largest output (two blocks of 8-byte elements), or two messages.
    let mut buf = vec![0u64; 2 * s.count + 1];
    let bytes = s.count * 4;
    for seq in 0..2u64 {
        match OPS[s.op] {
            Op::Coll(..) => {
                let plan = plan(s, rank)?;
                let mut input = vec![rank as u64 + seq; plan.input_len.div_ceil(8)];
                let bufs = Bufs {
                    input: input.as_mut_ptr().cast::<u8>(),
                    input_len: plan.input_len,
                    output: buf.as_mut_ptr().cast::<u8>(),
                    output_len: plan.output_len,
                };
                engine.collective(&plan, seq, &bufs)?;
            }
            Op::Recv | Op::Stashed => {
                let (a, b) = buf.split_at_mut(s.count);
                let (a, b) = (a.as_mut_ptr().cast::<u8>(), b.as_mut_ptr().cast::<u8>());
                let m = |send, tag, ptr, len| P2p { send, peer: 1 - rank, tag, dtype: DType::U8, ptr, len };
                let stashed = matches!(OPS[s.op], Op::Stashed);
                if rank == 1 {
                    let first = if stashed { m(true, 5, a, 8) } else { m(true, 7, a, bytes) };
                    engine.p2p(&mut Feed(vec![first, m(true, 3, b, bytes)]))?;
                } else if stashed {
                    engine.p2p(&mut Feed(vec![m(false, 3, b, bytes)]))?;
                    engine.p2p(&mut Feed(vec![m(false, 5, a, 8)]))?;
                } else {
                    engine.p2p(&mut Feed(vec![m(false, 7, a, bytes), m(false, 3, b, bytes)]))?;
                }
            }
        }
    }
    Ok(())
}

/// Runs rank 0 of the scenario `input` begins with, rank 1's stream being the rest of it.
/// The operation's result: an error for almost every input.
pub(crate) fn replay(input: &[u8]) -> Result<()> {
    let Some((head, stream)) = input.split_first_chunk::<SCENARIO_BYTES>() else { return Ok(()) };
    let s = Scenario::decode(*head);
    let link = Replay::new(stream, s.chunk);
    run(&s, 0, engine(0, Box::new(link), Duration::from_secs(1))?)
}

/// Runs scenario `bytes` on two ranks and returns the input that replays it: the scenario
/// bytes and what rank 1 sent, ending with its goodbye.
pub(crate) fn record(bytes: [u8; SCENARIO_BYTES]) -> Result<Vec<u8>> {
    let s = Scenario::decode(bytes);
    let (to0, to1) = (Arc::new(Mutex::new(Pipe::default())), Arc::new(Mutex::new(Pipe::default())));
    let rank1 = engine(1, Box::new(PipeEnd { out: to0.clone(), inc: to1.clone() }), Duration::from_secs(10))?;
    let rank0 = engine(0, Box::new(PipeEnd { out: to1, inc: to0.clone() }), Duration::from_secs(10))?;
    let other = std::thread::spawn(move || run(&s, 1, rank1));
    let mine = run(&s, 0, rank0);
    let theirs = other.join().map_err(|_| Error::Internal("rank 1 panicked".into()))?;
    mine.and(theirs)?;
    let mut out = bytes.to_vec();
    out.extend(&to0.lock().unwrap_or_else(PoisonError::into_inner).sent);
    Ok(out)
}

/// What an LL label says of its call, as the executor describes a label it did not expect.
pub(crate) fn ll_label(label: [u64; 2]) -> String {
    super::ll::describe(label)
}

/// A link whose incoming stream is all there, the peer having closed its side after it:
/// what the fuzzer plays. Writes are taken whole and dropped.
struct Replay {
    /// The stream, in words so that it is aligned as a socket link's staging buffer is.
    words: Vec<u64>,
    len: usize,
    at: usize,
    /// Most bytes one read gives (0: all there are, and `holds` tells the truth).
    chunk: usize,
}

impl Replay {
    fn new(stream: &[u8], chunk: usize) -> Replay {
        let mut words = vec![0u64; stream.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..stream.len()].copy_from_slice(stream);
        Replay { words, len: stream.len(), at: 0, chunk }
    }

    fn rest(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[self.at..self.len]
    }

    /// How many of `want` bytes the next read gives.
    fn give(&self, want: usize) -> usize {
        let n = want.min(self.len - self.at);
        if self.chunk == 0 { n } else { n.min(self.chunk) }
    }
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")
}

impl Link for Replay {
    fn write(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        Ok(parts.iter().map(|p| p.len()).sum())
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.at == self.len {
            return Err(eof());
        }
        let n = self.give(dst.len());
        dst[..n].copy_from_slice(&self.rest()[..n]);
        self.at += n;
        Ok(n)
    }

    fn read_with(&mut self, max: usize, align: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let align = align.max(1);
        let n = self.give(max).max(max.min(self.len - self.at).min(align));
        let n = n - n % align;
        if n == 0 {
            // Nothing, or less than an element, and nothing more will come.
            return Err(eof());
        }
        f(&self.rest()[..n]);
        self.at += n;
        Ok(n)
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn max_frame(&self) -> usize {
        FRAME
    }

    fn room_for(&mut self, _bytes: usize) -> bool {
        self.chunk == 0
    }

    fn holds(&mut self, bytes: usize) -> bool {
        self.chunk == 0 && self.len - self.at >= bytes
    }

    fn hangup(&mut self, _at: Within<'_>) -> io::Result<Option<Closed>> {
        Ok(Some(Farewells { comm: COMM }.read(self.rest())))
    }

    fn close(&mut self, _farewell: &Farewell, _at_boundary: bool, _patience: Duration) {}
}

/// One direction between the two ranks of [`record`]: the bytes not yet read, all bytes
/// sent, and whether the writer closed.
#[derive(Default)]
struct Pipe {
    queue: VecDeque<u8>,
    sent: Vec<u8>,
    closed: bool,
}

/// One rank's end of two pipes: what it writes (`out`) and reads (`inc`).
struct PipeEnd {
    out: Arc<Mutex<Pipe>>,
    inc: Arc<Mutex<Pipe>>,
}

impl Link for PipeEnd {
    fn write(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut p = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let mut n = 0;
        for part in parts {
            p.queue.extend(part.iter());
            p.sent.extend_from_slice(part);
            n += part.len();
        }
        Ok(n)
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.read_with(dst.len(), 1, &mut |piece| dst[..piece.len()].copy_from_slice(piece))
    }

    fn read_with(&mut self, max: usize, align: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut p = self.inc.lock().unwrap_or_else(PoisonError::into_inner);
        let n = max.min(p.queue.len());
        let n = n - n % align.max(1);
        if n == 0 && p.closed && max > 0 {
            return Err(eof());
        }
        // Aligned, as a socket link's staging buffer is.
        let mut words = vec![0u64; n.div_ceil(8)];
        let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..n];
        for (d, s) in bytes.iter_mut().zip(p.queue.drain(..n)) {
            *d = s;
        }
        drop(p);
        if n > 0 {
            f(bytes);
        }
        Ok(n)
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn max_frame(&self) -> usize {
        FRAME
    }

    fn room_for(&mut self, _bytes: usize) -> bool {
        true
    }

    fn holds(&mut self, bytes: usize) -> bool {
        self.inc.lock().unwrap_or_else(PoisonError::into_inner).queue.len() >= bytes
    }

    fn hangup(&mut self, _at: Within<'_>) -> io::Result<Option<Closed>> {
        let mut p = self.inc.lock().unwrap_or_else(PoisonError::into_inner);
        let closed = p.closed;
        Ok(closed.then(|| Farewells { comm: COMM }.read(p.queue.make_contiguous())))
    }

    fn close(&mut self, farewell: &Farewell, at_boundary: bool, _patience: Duration) {
        let words = if at_boundary { Farewells { comm: COMM }.say(farewell) } else { Vec::new() };
        let _ = self.write(&[IoSlice::new(&words)]);
        self.out.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
    }
}
