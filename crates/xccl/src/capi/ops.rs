//! Collectives and point-to-point calls of the C API, NCCL-shaped: caller buffers with a
//! count, an [`xcclDataType_t`], an operator and a root where they apply, and a last argument
//! `work` (NULL: blocking; else the call starts the operation and returns its handle).
//!
//! Counts are elements. An input that overlaps the output (other than the exact in-place
//! forms each call names) is copied first, so any layout is correct.

use std::ffi::c_void;
use std::ptr::NonNull;

use super::comm::{comm_ref, xcclComm_t};
use super::work::{xcclWork, xcclWork_t};
use super::{dtype, guard, invalid, red_op, xcclDataType_t, xcclRedOp_t, xcclResult_t};
use crate::comm::Communicator;
use crate::dtype::Element;
use crate::error::Result;
use crate::with_element;
use crate::work::{Buffer, Work};

/// Caller memory lent to one operation: `len` elements at `ptr`.
pub(crate) struct Raw<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: the memory is the caller's, lent for the operation; the C API's contract is that it
// stays valid and untouched by the caller until the operation completes, whichever thread runs
// it.
unsafe impl<T> Send for Raw<T> {}

// SAFETY: `ptr`/`len` never change, so both views are the same memory; it is the caller's,
// not inline, so it does not move with the value; the caller keeps it valid and untouched
// until the operation completes (the C API's contract).
unsafe impl<T: Element> Buffer<T> for Raw<T> {
    fn as_slice(&self) -> &[T] {
        // SAFETY: `len` valid elements at `ptr` (checked non-NULL and aligned in `raw`; a
        // dangling pointer only for `len` 0), valid per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as above; the operation is the memory's only user while it runs.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Raw<T> {
    fn span(&self) -> (usize, usize) {
        let a = self.ptr.as_ptr() as usize;
        (a, a + self.len * size_of::<T>())
    }

    fn overlaps(&self, other: &Raw<T>) -> bool {
        let ((a0, a1), (b0, b1)) = (self.span(), other.span());
        a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
    }
}

/// `count` elements of `T` at `ptr`, named `what` in errors; NULL is allowed only for 0.
fn raw<T: Element>(api: &'static str, what: &str, ptr: *const c_void, count: usize) -> Result<Raw<T>> {
    if count.checked_mul(size_of::<T>()).is_none_or(|b| b > isize::MAX as usize) {
        return Err(invalid(api, format!("{what}: {count} elements of {} do not fit in memory", T::DTYPE)));
    }
    if count == 0 {
        return Ok(Raw { ptr: NonNull::dangling(), len: 0 });
    }
    let ptr = NonNull::new(ptr.cast_mut().cast::<T>())
        .ok_or_else(|| invalid(api, format!("{what} is NULL, but the call has {count} elements for it")))?;
    if !(ptr.as_ptr() as usize).is_multiple_of(align_of::<T>()) {
        return Err(invalid(api, format!("{what} ({ptr:p}) is not aligned for {}", T::DTYPE)));
    }
    Ok(Raw { ptr, len: count })
}

/// An input: the caller's memory, or a copy of it when it overlaps the output.
enum Src<T> {
    Lent(Raw<T>),
    Copied(Vec<T>),
}

// SAFETY: either the caller's memory (see `Raw`) or a vector's heap memory, which does not
// move with the value.
unsafe impl<T: Element> Buffer<T> for Src<T> {
    fn as_slice(&self) -> &[T] {
        match self {
            Src::Lent(r) => r.as_slice(),
            Src::Copied(v) => v,
        }
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Src::Lent(r) => r.as_mut_slice(),
            Src::Copied(v) => v,
        }
    }
}

/// Input `what` of `count` elements at `ptr`, copied if it overlaps `out`.
fn src<T: Element>(
    api: &'static str,
    what: &str,
    ptr: *const c_void,
    count: usize,
    out: &Raw<T>,
) -> Result<Src<T>> {
    let r = raw::<T>(api, what, ptr, count)?;
    Ok(if r.overlaps(out) { Src::Copied(r.as_slice().to_vec()) } else { Src::Lent(r) })
}

/// `n` counts at `ptr` (one per rank).
fn counts<'a>(api: &'static str, what: &str, ptr: *const usize, n: usize) -> Result<&'a [usize]> {
    if ptr.is_null() {
        return Err(invalid(api, format!("{what} is NULL; it needs one count per rank ({n})")));
    }
    // SAFETY: the caller passes one count per rank of the communicator (the documented
    // contract), valid during the call (the operation copies what it needs).
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

/// The handle slot of an asynchronous call, or `None` for a blocking one.
fn slot<'a>(work: *mut xcclWork_t) -> Option<&'a mut xcclWork_t> {
    // SAFETY: NULL (blocking) or the caller's pointer to a handle to fill.
    unsafe { work.as_mut() }
}

/// Hands `w`'s operation to the caller as a handle; an operation that failed before it
/// started (a wrong argument) fails the call instead.
fn launch<B: Send + 'static>(slot: &mut xcclWork_t, w: Work<B>) -> Result<()> {
    let done = w.completion();
    if done.is_done() {
        done.wait_result()?;
    }
    *slot = Box::into_raw(Box::new(xcclWork { done }));
    Ok(())
}

/// Runs `f` with the communicator behind `comm`, the call's element type as `T`.
macro_rules! typed {
    ($api:expr, $comm:expr, $datatype:expr, |$c:ident, $T:ident| $body:expr) => {
        guard(|| {
            let $c: &Communicator = comm_ref($api, $comm)?;
            with_element!(dtype($api, $datatype)?, $T => $body)
        })
    };
}

/// All-reduce of `count` elements: `recvbuff` gets the reduction by `op` of every rank's
/// `sendbuff`. In place when `sendbuff == recvbuff`.
///
/// # Safety
/// Buffers of `count` elements, valid until the operation completes; `comm` live; `work` NULL
/// or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: xcclDataType_t,
    op: xcclRedOp_t,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    const API: &str = "xcclAllReduce";
    typed!(API, comm, datatype, |c, T| {
        let op = red_op(API, op)?;
        let mut out = raw::<T>(API, "recvbuff", recvbuff, count)?;
        if sendbuff == recvbuff.cast_const() {
            match slot(work) {
                None => c.all_reduce(out.as_mut_slice(), op),
                Some(s) => launch(s, c.all_reduce_async(out, op)),
            }
        } else {
            let inp = src::<T>(API, "sendbuff", sendbuff, count, &out)?;
            match slot(work) {
                None => c.all_reduce_into(inp.as_slice(), out.as_mut_slice(), op),
                Some(s) => launch(s, c.all_reduce_into_async(inp, out, op)),
            }
        }
    })
}

/// Broadcast of `count` elements from `root`'s `sendbuff` into every rank's `recvbuff` (the
/// root's too); `sendbuff` is read on the root only. In place when `sendbuff == recvbuff`.
///
/// # Safety
/// As [`xcclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: xcclDataType_t,
    root: i32,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    const API: &str = "xcclBroadcast";
    typed!(API, comm, datatype, |c, T| {
        let root = root_of(API, c, root)?;
        let mut out = raw::<T>(API, "recvbuff", recvbuff, count)?;
        if c.rank() == root && sendbuff != recvbuff.cast_const() {
            let inp = src::<T>(API, "sendbuff", sendbuff, count, &out)?;
            out.as_mut_slice().copy_from_slice(inp.as_slice());
        }
        match slot(work) {
            None => c.broadcast(out.as_mut_slice(), root),
            Some(s) => launch(s, c.broadcast_async(out, root)),
        }
    })
}

/// Reduce of `count` elements by `op` into `root`'s `recvbuff` (ignored, may be NULL, on the
/// other ranks). In place when `sendbuff == recvbuff`.
///
/// # Safety
/// As [`xcclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: xcclDataType_t,
    op: xcclRedOp_t,
    root: i32,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    const API: &str = "xcclReduce";
    typed!(API, comm, datatype, |c, T| {
        let (op, root) = (red_op(API, op)?, root_of(API, c, root)?);
        if sendbuff == recvbuff.cast_const() {
            let mut buf = raw::<T>(API, "sendbuff", sendbuff, count)?;
            return match slot(work) {
                None => c.reduce_in_place(buf.as_mut_slice(), op, root),
                Some(s) => launch(s, c.reduce_in_place_async(buf, op, root)),
            };
        }
        let mut out = raw::<T>(API, "recvbuff", recvbuff, if c.rank() == root { count } else { 0 })?;
        let inp = src::<T>(API, "sendbuff", sendbuff, count, &out)?;
        match slot(work) {
            None => c.reduce(inp.as_slice(), out.as_mut_slice(), op, root),
            Some(s) => launch(s, c.reduce_async(inp, out, op, root)),
        }
    })
}

/// The root as an index, checked against the group.
fn root_of(api: &'static str, c: &Communicator, root: i32) -> Result<usize> {
    usize::try_from(root).ok().filter(|&r| r < c.size()).ok_or_else(|| {
        invalid(api, format!("root {root} is outside the communicator's ranks 0..{}", c.size()))
    })
}

/// The body of a C function over an input of `$in_len` and an output of `$out_len` elements
/// (expressions of the communicator `c` and the function's arguments): runs `$block`
/// (blocking, on `inp` and `out` as slices) or `$start` (on the buffers `inp` and `out`,
/// giving a `Work`).
macro_rules! two_buffer {
    (
        $api:expr, $send:ident, $recv:ident, $datatype:ident, $comm:ident, $work:ident;
        in $in_len:expr, out $out_len:expr;
        block |$c:ident, $inp:ident, $out:ident| $block:expr;
        start $start:expr $(;)?
    ) => {{
        const API: &str = $api;
        typed!(API, $comm, $datatype, |$c, T| {
            let out_len: usize = $out_len;
            let mut $out = raw::<T>(API, "recvbuff", $recv, out_len)?;
            let $inp = src::<T>(API, "sendbuff", $send, $in_len, &$out)?;
            match slot($work) {
                None => {
                    let ($inp, $out) = ($inp.as_slice(), $out.as_mut_slice());
                    $block
                }
                Some(s) => launch(s, $start),
            }
        })
    }};
}

/// The sum of a rank-indexed count array, checked.
fn total(api: &'static str, what: &str, counts: &[usize]) -> Result<usize> {
    counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or_else(|| invalid(api, format!("{what} add up to more elements than memory holds")))
}

/// `count × ranks`, checked.
fn times(api: &'static str, count: usize, c: &Communicator) -> Result<usize> {
    count.checked_mul(c.size()).ok_or_else(|| invalid(api, format!("{count} × {} ranks overflows", c.size())))
}

/// All-gather: every rank's `sendcount` elements, in rank order, into every rank's
/// `recvbuff` (`sendcount × nranks` elements).
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: xcclDataType_t,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclAllGather", sendbuff, recvbuff, datatype, comm, work;
        in sendcount, out times(API, sendcount, c)?;
        block |c, inp, out| c.all_gather(inp, out);
        start c.all_gather_async::<T, _, _>(inp, out)
    )
}

/// Reduce-scatter: the reduction by `op` of every rank's `sendbuff` (`recvcount × nranks`
/// elements), of which rank r gets block r (`recvcount` elements).
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: xcclDataType_t,
    op: xcclRedOp_t,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclReduceScatter", sendbuff, recvbuff, datatype, comm, work;
        in times(API, recvcount, c)?, out recvcount;
        block |c, inp, out| c.reduce_scatter(inp, out, red_op(API, op)?);
        start c.reduce_scatter_async::<T, _, _>(inp, out, red_op(API, op)?)
    )
}

/// All-to-all: block q (`count` elements) of rank r's `sendbuff` goes to block r of rank
/// q's `recvbuff` (both `count × nranks` elements).
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclAllToAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: xcclDataType_t,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclAllToAll", sendbuff, recvbuff, datatype, comm, work;
        in times(API, count, c)?, out times(API, count, c)?;
        block |c, inp, out| c.all_to_all(inp, out);
        start c.all_to_all_async::<T, _, _>(inp, out)
    )
}

/// Gather: every rank's `sendcount` elements, in rank order, into `root`'s `recvbuff`
/// (`sendcount × nranks` elements; ignored, may be NULL, elsewhere).
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: xcclDataType_t,
    root: i32,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclGather", sendbuff, recvbuff, datatype, comm, work;
        in sendcount, out if c.rank() == root_of(API, c, root)? { times(API, sendcount, c)? } else { 0 };
        block |c, inp, out| c.gather(inp, out, root_of(API, c, root)?);
        start c.gather_async::<T, _, _>(inp, out, root_of(API, c, root)?)
    )
}

/// Scatter: block r (`recvcount` elements) of `root`'s `sendbuff` (`recvcount × nranks`
/// elements; ignored, may be NULL, elsewhere) into rank r's `recvbuff`.
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: xcclDataType_t,
    root: i32,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclScatter", sendbuff, recvbuff, datatype, comm, work;
        in if c.rank() == root_of(API, c, root)? { times(API, recvcount, c)? } else { 0 }, out recvcount;
        block |c, inp, out| c.scatter(inp, out, root_of(API, c, root)?);
        start c.scatter_async::<T, _, _>(inp, out, root_of(API, c, root)?)
    )
}

/// Uneven all-gather (`MPI_Allgatherv` with packed blocks): rank r contributes `sendcount`
/// elements, which must equal `recvcounts[r]`; every rank's `recvbuff` gets them all in
/// rank order.
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclAllGatherV(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    recvcounts: *const usize,
    datatype: xcclDataType_t,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclAllGatherV", sendbuff, recvbuff, datatype, comm, work;
        in sendcount, out total(API, "recvcounts", counts(API, "recvcounts", recvcounts, c.size())?)?;
        block |c, inp, out| c.all_gather_v(inp, out, counts(API, "recvcounts", recvcounts, c.size())?);
        start c.all_gather_v_async::<T, _, _>(inp, out, counts(API, "recvcounts", recvcounts, c.size())?)
    )
}

/// Uneven reduce-scatter: the reduction by `op` of every rank's `sendbuff` (the sum of
/// `recvcounts` elements), cut in rank order into blocks of `recvcounts[r]`; rank r gets
/// block r in its `recvbuff`.
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclReduceScatterV(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    datatype: xcclDataType_t,
    op: xcclRedOp_t,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclReduceScatterV", sendbuff, recvbuff, datatype, comm, work;
        in total(API, "recvcounts", counts(API, "recvcounts", recvcounts, c.size())?)?, out counts(API, "recvcounts", recvcounts, c.size())?[c.rank()];
        block |c, inp, out| c.reduce_scatter_v(inp, out, counts(API, "recvcounts", recvcounts, c.size())?, red_op(API, op)?);
        start c.reduce_scatter_v_async::<T, _, _>(inp, out, counts(API, "recvcounts", recvcounts, c.size())?, red_op(API, op)?)
    )
}

/// Uneven all-to-all (`MPI_Alltoallv` with packed blocks): rank r sends `sendcounts[q]`
/// elements to rank q (its `sendbuff` holds them in rank order) and receives
/// `recvcounts[q]` from rank q (its `recvbuff` holds them in rank order).
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclAllToAllV(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcounts: *const usize,
    recvcounts: *const usize,
    datatype: xcclDataType_t,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclAllToAllV", sendbuff, recvbuff, datatype, comm, work;
        in total(API, "sendcounts", counts(API, "sendcounts", sendcounts, c.size())?)?, out total(API, "recvcounts", counts(API, "recvcounts", recvcounts, c.size())?)?;
        block |c, inp, out| c.all_to_all_v(inp, counts(API, "sendcounts", sendcounts, c.size())?, out, counts(API, "recvcounts", recvcounts, c.size())?);
        start c.all_to_all_v_async::<T, _, _>(inp, counts(API, "sendcounts", sendcounts, c.size())?, out, counts(API, "recvcounts", recvcounts, c.size())?)
    )
}

/// Uneven gather (`MPI_Gatherv` with packed blocks): rank r contributes `sendcount`
/// elements, which must equal `recvcounts[r]`; `root`'s `recvbuff` gets them all in rank
/// order (ignored, may be NULL, elsewhere).
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclGatherV(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    recvcounts: *const usize,
    datatype: xcclDataType_t,
    root: i32,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclGatherV", sendbuff, recvbuff, datatype, comm, work;
        in sendcount, out if c.rank() == root_of(API, c, root)? { total(API, "recvcounts", counts(API, "recvcounts", recvcounts, c.size())?)? } else { 0 };
        block |c, inp, out| c.gather_v(inp, out, counts(API, "recvcounts", recvcounts, c.size())?, root_of(API, c, root)?);
        start c.gather_v_async::<T, _, _>(inp, out, counts(API, "recvcounts", recvcounts, c.size())?, root_of(API, c, root)?)
    )
}

/// Uneven scatter (`MPI_Scatterv` with packed blocks): `root`'s `sendbuff` (the sum of
/// `sendcounts` elements; ignored, may be NULL, elsewhere) is cut in rank order into blocks
/// of `sendcounts[r]`; rank r gets block r in its `recvbuff` (`recvcount` elements, which
/// must equal `sendcounts[r]`).
///
/// # Safety
/// Buffers of the lengths described, valid until the operation completes; count arrays of
/// one entry per rank; `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclScatterV(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcounts: *const usize,
    recvcount: usize,
    datatype: xcclDataType_t,
    root: i32,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    two_buffer!(
        "xcclScatterV", sendbuff, recvbuff, datatype, comm, work;
        in if c.rank() == root_of(API, c, root)? { total(API, "sendcounts", counts(API, "sendcounts", sendcounts, c.size())?)? } else { 0 }, out recvcount;
        block |c, inp, out| c.scatter_v(inp, out, counts(API, "sendcounts", sendcounts, c.size())?, root_of(API, c, root)?);
        start c.scatter_v_async::<T, _, _>(inp, out, counts(API, "sendcounts", sendcounts, c.size())?, root_of(API, c, root)?)
    )
}

/// Sends `count` elements of `sendbuff` to rank `peer` with `tag` (messages between two ranks
/// with one tag arrive in order; the receive names the same count and type).
///
/// # Safety
/// As [`xcclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: xcclDataType_t,
    peer: i32,
    tag: u32,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    const API: &str = "xcclSend";
    typed!(API, comm, datatype, |c, T| {
        let peer = usize::try_from(peer).map_err(|_| invalid(API, format!("peer {peer} is negative")))?;
        let buf = raw::<T>(API, "sendbuff", sendbuff, count)?;
        match slot(work) {
            None => c.send(buf.as_slice(), peer, tag),
            Some(s) => launch(s, c.isend(buf, peer, tag)),
        }
    })
}

/// Receives `count` elements into `recvbuff` from rank `peer`, the next message with `tag`.
///
/// # Safety
/// As [`xcclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: xcclDataType_t,
    peer: i32,
    tag: u32,
    comm: xcclComm_t,
    work: *mut xcclWork_t,
) -> xcclResult_t {
    const API: &str = "xcclRecv";
    typed!(API, comm, datatype, |c, T| {
        let peer = usize::try_from(peer).map_err(|_| invalid(API, format!("peer {peer} is negative")))?;
        let mut buf = raw::<T>(API, "recvbuff", recvbuff, count)?;
        match slot(work) {
            None => c.recv(buf.as_mut_slice(), peer, tag),
            Some(s) => launch(s, c.irecv(buf, peer, tag)),
        }
    })
}

/// Waits until every rank has called it.
///
/// # Safety
/// `comm` live; `work` NULL or a pointer to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclBarrier(comm: xcclComm_t, work: *mut xcclWork_t) -> xcclResult_t {
    guard(|| {
        let c = comm_ref("xcclBarrier", comm)?;
        match slot(work) {
            None => c.barrier(),
            Some(s) => launch(s, c.barrier_async()),
        }
    })
}
