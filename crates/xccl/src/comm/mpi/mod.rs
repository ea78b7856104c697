//! The MPI backend (feature `mpi`): a [`Communicator`](super::Communicator) whose
//! collectives and messages are the MPI library's, for clusters where MPI is the way
//! between nodes (InfiniBand through MPI, say). See `docs/MPI.md`.
//!
//! A communicator of this backend holds a duplicate of `MPI_COMM_WORLD` (or a split or
//! duplicate of one) with `MPI_ERRORS_RETURN`, so that MPI's errors become [`Error`]s, and
//! a stream that runs its operations in issue order on its own thread (`backend.rs`: MPI as
//! the stream's backend). Arguments are
//! checked by the same code as for the native backend (`ops.rs`) before anything reaches
//! MPI; each collective then becomes one MPI call ([`Coll::run`]).
//!
//! What differs from the native backend: MPI chooses its algorithms (no `XCCL_ALGO`, no
//! tuner); a lost rank is handled by mpirun, which ends the job, rather than by xccl's
//! failure detection; operations have no deadline (`XCCL_TIMEOUT` does not apply).

mod backend;
mod env;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use mpi::ffi;

use self::backend::MpiBackend;
pub(super) use self::backend::Task;
use self::env::Handle;
use super::{Group, PlanArgs, hash_str, mix};
use crate::algo::Shape;
use crate::bootstrap::host;
use crate::coll::CollKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::exec::Bufs;
use crate::flight::{FlightConfig, Recorder};
use crate::reduce::{self, ReduceOp};
use crate::schedule::Blocks;
use crate::stream::{JobOp, Stream};
use crate::work::SpanOp;

/// One MPI communicator and its stream.
pub(super) struct MpiComm {
    /// Runs the operations; dropping it waits for what was issued, then frees the
    /// communicator.
    pub stream: Stream<MpiBackend>,
    /// The largest tag MPI accepts on this communicator.
    pub tag_ub: u32,
    /// Splits and duplicates made of this communicator so far, counted in issue order (the
    /// same on every member).
    splits: Arc<AtomicU64>,
}

/// `n` as an MPI count (a C `int`), or an error naming `api`.
pub(super) fn count(api: &'static str, n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| {
        Error::invalid(
            api,
            format!("{n} elements: MPI counts and offsets are C ints, at most {}", c_int::MAX),
        )
    })
}

/// Counts and offsets of one block per rank, as the `v` collectives of MPI take them.
fn blocks(api: &'static str, b: &Blocks) -> Result<(Vec<c_int>, Vec<c_int>)> {
    let mut counts = Vec::with_capacity(b.count());
    let mut offsets = Vec::with_capacity(b.count());
    let mut at = 0usize;
    for i in 0..b.count() {
        counts.push(count(api, b.len_of(i))?);
        offsets.push(count(api, at)?);
        at += b.len_of(i);
    }
    Ok((counts, offsets))
}

impl MpiComm {
    /// A communicator of every process of the MPI job (a duplicate of `MPI_COMM_WORLD`) and
    /// its group.
    pub fn world() -> Result<(MpiComm, Group)> {
        static WORLDS: AtomicU64 = AtomicU64::new(0);
        env::library()?;
        // SAFETY: reading an exported constant.
        let mut comm = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: MPI is initialised (`library`); the output pointer is valid.
        let rc = unsafe { ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm) };
        env::check(rc, || "MPI_Comm_dup(MPI_COMM_WORLD)".into())?;
        let world = MpiComm::start(comm)?;
        let generation = WORLDS.fetch_add(1, Ordering::Relaxed);
        let group = world.setup("world setup", move |comm| {
            let (rank, size) = rank_size(comm)?;
            let id = mix(&[hash_str("mpi"), generation, size as u64]);
            let hosts = host_indices(comm)?;
            let cores = all_gather_int(comm, host::cores())?;
            Ok(Group { rank, size, id, members: (0..size).collect(), hosts, cores })
        })?;
        Ok((world, group))
    }

    /// Takes over `comm` (a new communicator of this process): errors return instead of
    /// aborting, and a stream runs its operations.
    fn start(comm: ffi::MPI_Comm) -> Result<MpiComm> {
        // SAFETY: `comm` is a valid communicator; reading an exported constant.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) };
        if let Err(e) = env::check(rc, || "MPI_Comm_set_errhandler".into()) {
            let mut comm = comm;
            // SAFETY: `comm` is ours and unused.
            unsafe { ffi::MPI_Comm_free(&mut comm) };
            return Err(e);
        }
        let (rank, size) = rank_size(comm)?;
        let tag_ub = env::tag_ub(comm)?;
        // MPI's operations are not in the flight recorder, which keeps xccl's plans: it is off
        // (no records, no file), so the id it would name its file by does not matter.
        let off = FlightConfig { records: 0, ..FlightConfig::default() };
        let flight = Recorder::new(off, rank, size, 0);
        let stream = Stream::start(rank, MpiBackend::new(comm, rank), flight)?;
        Ok(MpiComm { stream, tag_ub, splits: Arc::new(AtomicU64::new(0)) })
    }

    /// Runs `work`, named `name`, on the communicator after what was issued on it, and
    /// returns its result.
    fn setup<R: Send + 'static>(
        &self,
        name: &'static str,
        work: impl Fn(ffi::MPI_Comm) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let slot = Arc::new(Mutex::new(None));
        let out = slot.clone();
        let task = Task::Setup(
            name,
            Box::new(move |comm| {
                let r = work(comm)?;
                *out.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
                Ok(())
            }),
        );
        self.stream.run(|seq| JobOp::Task { task, seq }).1?;
        let r = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        r.ok_or_else(|| Error::Internal(format!("MPI {name} finished without its result")))
    }

    /// `MPI_Comm_split` of this communicator (whose group is `parent`), after what was issued
    /// on it: ranks with the same `color` form a group ordered by `key`, then by rank here;
    /// `None` for ranks passing no color.
    pub fn split(&self, parent: &Group, color: Option<u32>, key: i32) -> Result<Option<(MpiComm, Group)>> {
        let splits = self.splits.clone();
        let (parent_id, members, hosts, cores) =
            (parent.id, parent.members.clone(), parent.hosts.clone(), parent.cores.clone());
        let (made, nth) = self.setup("split", move |comm| {
            // Colors are u32, MPI's are non-negative ints: split by the color's index among
            // the colors in use.
            let mine = color.map_or(-1, i64::from);
            let all = all_gather_i64(comm, mine)?;
            let mut used: Vec<i64> = all.iter().copied().filter(|&c| c >= 0).collect();
            used.sort_unstable();
            used.dedup();
            let index = match color {
                // SAFETY: reading an exported constant.
                None => unsafe { ffi::RSMPI_UNDEFINED },
                Some(_) => count("split", used.partition_point(|&c| c < mine))?,
            };
            // SAFETY: reading an exported constant.
            let mut new = unsafe { ffi::RSMPI_COMM_NULL };
            // SAFETY: `comm` is valid; the output pointer is valid.
            let rc = unsafe { ffi::MPI_Comm_split(comm, index, key, &mut new) };
            env::check(rc, || format!("MPI_Comm_split(color {mine}, key {key})"))?;
            Ok((Handle(new), splits.fetch_add(1, Ordering::Relaxed)))
        })?;
        let Some(color) = color else { return Ok(None) };
        let child = MpiComm::start(made.0)?;
        let parent_rank = parent.rank;
        let group = child.setup("split setup", move |comm| {
            let (rank, size) = rank_size(comm)?;
            let old: Vec<usize> = all_gather_int(comm, parent_rank)?;
            // What the parent knew of each member, by its rank there.
            let pick = |of: &[usize]| -> Result<Vec<usize>> {
                old.iter()
                    .map(|&r| of.get(r).copied())
                    .collect::<Option<_>>()
                    .ok_or_else(|| Error::Internal(format!("split: parent ranks {old:?} out of range")))
            };
            let id = mix(&[parent_id, nth, u64::from(color)]);
            Ok(Group { rank, size, id, members: pick(&members)?, hosts: pick(&hosts)?, cores: pick(&cores)? })
        })?;
        Ok(Some((child, group)))
    }

    /// `MPI_Comm_dup` of this communicator (whose group is `parent`), after what was issued
    /// on it: the same members, a communicator of their own.
    pub fn dup(&self, parent: &Group) -> Result<(MpiComm, Group)> {
        let splits = self.splits.clone();
        let (made, nth) = self.setup("dup", move |comm| {
            // SAFETY: reading an exported constant.
            let mut new = unsafe { ffi::RSMPI_COMM_NULL };
            // SAFETY: `comm` is valid; the output pointer is valid.
            env::check(unsafe { ffi::MPI_Comm_dup(comm, &mut new) }, || "MPI_Comm_dup".into())?;
            Ok((Handle(new), splits.fetch_add(1, Ordering::Relaxed)))
        })?;
        let child = MpiComm::start(made.0)?;
        // Not a color (those are u32): duplicates and splits never share an id.
        let id = mix(&[parent.id, nth, 1 << 32]);
        Ok((child, Group { id, ..parent.clone() }))
    }
}

/// This process's rank in `comm` and its size.
fn rank_size(comm: ffi::MPI_Comm) -> Result<(usize, usize)> {
    let (mut rank, mut size) = (0, 0);
    // SAFETY: `comm` is valid; the output pointers are valid.
    unsafe {
        env::check(ffi::MPI_Comm_rank(comm, &mut rank), || "MPI_Comm_rank".into())?;
        env::check(ffi::MPI_Comm_size(comm, &mut size), || "MPI_Comm_size".into())?;
    }
    let bad = || Error::Internal(format!("MPI gave rank {rank} of {size}"));
    Ok((usize::try_from(rank).map_err(|_| bad())?, usize::try_from(size).map_err(|_| bad())?))
}

/// Every member's `mine`, by rank.
fn all_gather_i64(comm: ffi::MPI_Comm, mine: i64) -> Result<Vec<i64>> {
    let (_, size) = rank_size(comm)?;
    let mut all = vec![0i64; size];
    // SAFETY: one i64 in, one per member out; `all` holds `size`.
    let rc = unsafe {
        ffi::MPI_Allgather(
            (&raw const mine).cast(),
            1,
            ffi::RSMPI_INT64_T,
            all.as_mut_ptr().cast(),
            1,
            ffi::RSMPI_INT64_T,
            comm,
        )
    };
    env::check(rc, || "MPI_Allgather".into())?;
    Ok(all)
}

/// Every member's `mine` (a count or rank), by rank.
fn all_gather_int(comm: ffi::MPI_Comm, mine: usize) -> Result<Vec<usize>> {
    let all = all_gather_i64(comm, i64::try_from(mine).unwrap_or(i64::MAX))?;
    all.into_iter()
        .map(|v| usize::try_from(v).map_err(|_| Error::Internal(format!("gathered {v}"))))
        .collect()
}

/// The host index of each member: members that share memory (`MPI_COMM_TYPE_SHARED`) share
/// one, numbered in order of their lowest rank.
fn host_indices(comm: ffi::MPI_Comm) -> Result<Vec<usize>> {
    let (rank, _) = rank_size(comm)?;
    // SAFETY: reading an exported constant.
    let mut local = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: `comm` is valid; the output pointer is valid.
    let rc = unsafe {
        ffi::MPI_Comm_split_type(
            comm,
            ffi::RSMPI_COMM_TYPE_SHARED,
            count("host discovery", rank)?,
            ffi::RSMPI_INFO_NULL,
            &mut local,
        )
    };
    env::check(rc, || "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)".into())?;
    let lowest = all_gather_int(local, rank).map(|v| v.into_iter().min().unwrap_or(rank));
    // SAFETY: `local` is ours and nothing is pending on it.
    unsafe { ffi::MPI_Comm_free(&mut local) };
    let leaders = all_gather_int(comm, lowest?)?;
    let mut order: Vec<usize> = leaders.clone();
    order.sort_unstable();
    order.dedup();
    Ok(leaders.iter().map(|l| order.partition_point(|x| x < l)).collect())
}

/// Buffers that may cross to the stream's thread.
#[derive(Copy, Clone)]
pub(crate) struct SendBufs(Bufs);

// SAFETY: the buffers' issuer keeps them valid and untouched until the operation completed
// (blocking calls wait for it; async calls park the owned buffers in the completion); only
// the thread running the operation uses them.
unsafe impl Send for SendBufs {}

/// `ptr`, or for an empty buffer a pointer to a dummy byte: the dangling pointer of an empty
/// slice of bytes is 1, which is `MPI_IN_PLACE` in Open MPI.
pub(super) fn real(ptr: *mut u8, len: usize) -> *mut c_void {
    static DUMMY: u64 = 0;
    if len == 0 { (&raw const DUMMY).cast_mut().cast() } else { ptr.cast() }
}

/// How the data of a collective is laid out, in MPI's terms.
enum Layout {
    /// One count (per rank, or per block).
    Count(c_int),
    /// One block per rank: counts and offsets (`Allgatherv`, `Reduce_scatter`, `Gatherv`,
    /// `Scatterv`).
    Blocks(Vec<c_int>, Vec<c_int>),
    /// Blocks to send and to receive (`Alltoallv`).
    Exchange { send: (Vec<c_int>, Vec<c_int>), recv: (Vec<c_int>, Vec<c_int>) },
}

/// A checked collective, ready to become one MPI call.
pub(crate) struct Coll {
    kind: CollKind,
    dtype: DType,
    op: Option<ReduceOp>,
    root: c_int,
    /// This rank.
    rank: usize,
    /// Whether this rank is the root (of rooted collectives).
    is_root: bool,
    layout: Layout,
    /// Ranks in the group (for `Avg`).
    size: usize,
    /// Whether this rank's output holds reduced values (finalised for `Avg`).
    result: bool,
}

impl Coll {
    /// What a span of this collective records, for an input of `input_len` bytes.
    fn what(&self, input_len: usize) -> SpanOp {
        SpanOp::Collective { kind: self.kind, dtype: self.dtype, count: input_len / self.dtype.size() }
    }

    /// The MPI form of a collective whose arguments `ops.rs` has checked.
    pub fn new(p: PlanArgs, dtype: DType, rank: usize, size: usize) -> Result<Coll> {
        let api = "MPI collective";
        let layout = match &p.shape {
            Shape::Count(n) => Layout::Count(count(api, *n)?),
            Shape::Gather(b) | Shape::Scatter(b) => {
                let (c, o) = blocks(api, b)?;
                Layout::Blocks(c, o)
            }
            Shape::Exchange { send, recv } => {
                Layout::Exchange { send: blocks(api, send)?, recv: blocks(api, recv)? }
            }
        };
        let root = p.root.unwrap_or(0);
        Ok(Coll {
            kind: p.kind,
            dtype,
            op: p.op,
            root: count(api, root)?,
            rank,
            is_root: rank == root,
            layout,
            size,
            result: p.result.is_some(),
        })
    }

    fn name(&self) -> String {
        let op = self.op.map_or(String::new(), |o| format!(", {o}"));
        let n = match &self.layout {
            Layout::Count(n) => n.to_string(),
            Layout::Blocks(..) | Layout::Exchange { .. } => "v".into(),
        };
        format!("{} ({} x {n}{op}, mpi)", self.kind, self.dtype)
    }

    /// Runs the collective on `comm` over `bufs`.
    fn run(&self, comm: ffi::MPI_Comm, SendBufs(b): SendBufs) -> Result<()> {
        let lib = env::library()?;
        let t = lib.datatype(self.dtype);
        let op = || lib.operator(self.dtype, self.op.unwrap_or(ReduceOp::Sum));
        let in_place = b.input == b.output.cast_const();
        let (input, output) =
            (real(b.input.cast_mut(), b.input_len).cast_const(), real(b.output, b.output_len));
        let send = if in_place { lib.in_place().cast_const() } else { input };
        let root = self.root;
        let wrong = || Error::Internal(format!("{} with an unexpected layout", self.kind));
        // SAFETY: for every call below, `ops.rs` checked the buffers' lengths against the layout
        // (input and output hold what each call reads and writes); the buffers stay valid
        // and untouched until this returns (`SendBufs`); counts and offsets are in range
        // (`count`); `comm` is this communicator's.
        let rc = unsafe {
            match (self.kind, &self.layout) {
                (CollKind::AllReduce, Layout::Count(n)) => {
                    ffi::MPI_Allreduce(send, output, *n, t, op(), comm)
                }
                (CollKind::Broadcast, Layout::Count(n)) => ffi::MPI_Bcast(output, *n, t, root, comm),
                (CollKind::Reduce, Layout::Count(n)) => {
                    let send = if in_place && self.is_root { lib.in_place().cast_const() } else { input };
                    ffi::MPI_Reduce(send, output, *n, t, op(), root, comm)
                }
                (CollKind::AllGather, Layout::Count(n)) => {
                    ffi::MPI_Allgather(input, *n, t, output, *n, t, comm)
                }
                (CollKind::AllGather, Layout::Blocks(counts, offsets)) => {
                    let mine = counts.get(self.rank).copied().ok_or_else(wrong)?;
                    ffi::MPI_Allgatherv(input, mine, t, output, counts.as_ptr(), offsets.as_ptr(), t, comm)
                }
                (CollKind::ReduceScatter, Layout::Count(n)) => {
                    ffi::MPI_Reduce_scatter_block(input, output, *n, t, op(), comm)
                }
                (CollKind::ReduceScatter, Layout::Blocks(counts, _)) => {
                    ffi::MPI_Reduce_scatter(input, output, counts.as_ptr(), t, op(), comm)
                }
                (CollKind::AllToAll, Layout::Count(n)) => {
                    ffi::MPI_Alltoall(input, *n, t, output, *n, t, comm)
                }
                (CollKind::AllToAll, Layout::Exchange { send: (sc, so), recv: (rc, ro) }) => {
                    ffi::MPI_Alltoallv(
                        input,
                        sc.as_ptr(),
                        so.as_ptr(),
                        t,
                        output,
                        rc.as_ptr(),
                        ro.as_ptr(),
                        t,
                        comm,
                    )
                }
                (CollKind::Scatter, Layout::Count(n)) => {
                    ffi::MPI_Scatter(input, *n, t, output, *n, t, root, comm)
                }
                (CollKind::Scatter, Layout::Blocks(counts, offsets)) => {
                    let mine = counts.get(self.rank).copied().ok_or_else(wrong)?;
                    let (c, o) = (counts.as_ptr(), offsets.as_ptr());
                    ffi::MPI_Scatterv(input, c, o, t, output, mine, t, root, comm)
                }
                (CollKind::Gather, Layout::Count(n)) => {
                    ffi::MPI_Gather(input, *n, t, output, *n, t, root, comm)
                }
                (CollKind::Gather, Layout::Blocks(counts, offsets)) => {
                    let mine = counts.get(self.rank).copied().ok_or_else(wrong)?;
                    let (c, o) = (counts.as_ptr(), offsets.as_ptr());
                    ffi::MPI_Gatherv(input, mine, t, output, c, o, t, root, comm)
                }
                (CollKind::Barrier, _) => ffi::MPI_Barrier(comm),
                _ => return Err(wrong()),
            }
        };
        env::check(rc, || self.name())?;
        if self.op.is_some() {
            env::kernel_failure()?;
        }
        if self.op == Some(ReduceOp::Avg) && self.result {
            // SAFETY: the output is this rank's result, `output_len` bytes, now written.
            let out = unsafe { std::slice::from_raw_parts_mut(b.output, b.output_len) };
            reduce::finalize(self.dtype, ReduceOp::Avg, out, self.size)?;
        }
        Ok(())
    }
}
