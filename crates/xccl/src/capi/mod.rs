//! The C API (feature `capi`): xccl as a C library, NCCL-shaped. The crate `xccl-c` builds
//! it as `libxccl.so` and `libxccl.a` with the header `xccl.h`, which cbindgen generates from
//! this module; the Python package exports the same symbols from its extension module, so
//! the native PyTorch backend (`ProcessGroupXCCL`) calls them.
//!
//! Conventions, for every function:
//! - The result is an [`xcclResult_t`]: [`xcclSuccess`] or an error code. After an error,
//!   [`xcclGetLastError`] gives the message (which names the operation and, where one is at
//!   fault, the rank) and [`xcclGetLastErrorRank`] that rank, on the calling thread.
//! - Collectives and point-to-point calls take caller buffers and a last argument `work`:
//!   `NULL` runs the call to completion (blocking); otherwise the call only starts it and
//!   stores a handle in `*work` to [`xcclTest`], [`xcclWait`] and [`xcclWorkFree`]. The
//!   buffers must stay valid and untouched until the operation has completed.
//! - Operations on one communicator run in issue order on its progress thread; several
//!   threads may issue on one communicator (the order is the order of the calls).
//! - Nothing panics across the boundary: a bug inside xccl returns [`xcclInternalError`].
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

mod comm;
mod mem;
mod ops;
mod work;

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

pub use comm::*;
pub use mem::*;
pub use ops::*;
pub use work::*;

use crate::dtype::DType;
use crate::error::Error;
use crate::reduce::ReduceOp;

/// What a call returned: [`xcclSuccess`] (0) or an error code.
pub type xcclResult_t = c_int;
/// The call succeeded.
pub const xcclSuccess: xcclResult_t = 0;
/// An argument was wrong (a NULL pointer, a length, a root or peer outside the group, an
/// unknown type or operator); nothing was communicated.
pub const xcclInvalidArgument: xcclResult_t = 1;
/// The environment or the settings are wrong (a malformed `XCCL_*` variable, a missing
/// secret, ranks that disagree on their settings).
pub const xcclInvalidUsage: xcclResult_t = 2;
/// The operating system failed a call, or ranks could not meet (rendezvous).
pub const xcclSystemError: xcclResult_t = 3;
/// Another rank failed, disappeared, called another collective or broke the protocol;
/// [`xcclGetLastErrorRank`] names it.
pub const xcclRemoteError: xcclResult_t = 4;
/// No progress before the deadline (`XCCL_TIMEOUT`); the message names the silent rank.
pub const xcclTimeout: xcclResult_t = 5;
/// The communicator was aborted ([`xcclCommAbort`]) or failed earlier; make a new one.
pub const xcclAborted: xcclResult_t = 6;
/// A bug inside xccl; please report it with the message.
pub const xcclInternalError: xcclResult_t = 7;
/// [`xcclWait`] with a timeout: the operation has not completed yet (the handle stays valid).
pub const xcclInProgress: xcclResult_t = 8;

/// An element type.
pub type xcclDataType_t = c_int;
/// `float`
pub const xcclFloat32: xcclDataType_t = 0;
/// `double`
pub const xcclFloat64: xcclDataType_t = 1;
/// IEEE 754 half precision (`_Float16`).
pub const xcclFloat16: xcclDataType_t = 2;
/// bfloat16 (the upper half of a `float`).
pub const xcclBfloat16: xcclDataType_t = 3;
/// `int8_t`
pub const xcclInt8: xcclDataType_t = 4;
/// `int32_t`
pub const xcclInt32: xcclDataType_t = 5;
/// `int64_t`
pub const xcclInt64: xcclDataType_t = 6;
/// `uint8_t`
pub const xcclUint8: xcclDataType_t = 7;
/// `uint32_t`
pub const xcclUint32: xcclDataType_t = 8;
/// `uint64_t`
pub const xcclUint64: xcclDataType_t = 9;

/// A reduction operator.
pub type xcclRedOp_t = c_int;
/// Sum (wrapping for integers).
pub const xcclSum: xcclRedOp_t = 0;
/// Product (wrapping for integers).
pub const xcclProd: xcclRedOp_t = 1;
/// Minimum.
pub const xcclMin: xcclRedOp_t = 2;
/// Maximum.
pub const xcclMax: xcclRedOp_t = 3;
/// Sum divided by the number of ranks (truncating for integers).
pub const xcclAvg: xcclRedOp_t = 4;

/// The version of this library: `major * 10000 + minor * 100 + patch`.
pub const XCCL_VERSION_CODE: c_int = 100;

thread_local! {
    static LAST: RefCell<(CString, c_int)> = RefCell::new((CString::default(), -1));
}

/// The code of `e`.
fn code(e: &Error) -> xcclResult_t {
    match e {
        Error::InvalidArgument { .. } => xcclInvalidArgument,
        Error::Config(_) => xcclInvalidUsage,
        Error::Timeout { .. } => xcclTimeout,
        Error::PeerLost { .. }
        | Error::Mismatch { .. }
        | Error::RemoteAbort { .. }
        | Error::Protocol { .. }
        | Error::Handshake { .. } => xcclRemoteError,
        Error::Bootstrap(_) | Error::Io { .. } | Error::Mpi { .. } => xcclSystemError,
        Error::Cancelled { .. } | Error::Aborted(_) => xcclAborted,
        _ => xcclInternalError,
    }
}

/// Records `e` as the calling thread's last error; its code.
pub(crate) fn fail(e: &Error) -> xcclResult_t {
    let text = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
    let rank = e.culprit().and_then(|r| c_int::try_from(r).ok()).unwrap_or(-1);
    LAST.with(|l| *l.borrow_mut() = (text, rank));
    code(e)
}

/// Runs `f` at the boundary: its error recorded, a panic turned into [`xcclInternalError`].
pub(crate) fn guard(f: impl FnOnce() -> crate::Result<()>) -> xcclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => xcclSuccess,
        Ok(Err(e)) => fail(&e),
        Err(_) => fail(&Error::Internal("a panic inside xccl's C API".into())),
    }
}

/// An argument error of C function `api`.
pub(crate) fn invalid(api: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument { op: api, msg: msg.into() }
}

/// The element type of code `t`.
pub(crate) fn dtype(api: &'static str, t: xcclDataType_t) -> crate::Result<DType> {
    Ok(match t {
        xcclFloat32 => DType::F32,
        xcclFloat64 => DType::F64,
        xcclFloat16 => DType::F16,
        xcclBfloat16 => DType::BF16,
        xcclInt8 => DType::I8,
        xcclInt32 => DType::I32,
        xcclInt64 => DType::I64,
        xcclUint8 => DType::U8,
        xcclUint32 => DType::U32,
        xcclUint64 => DType::U64,
        other => return Err(invalid(api, format!("datatype {other} is not an xcclDataType_t (0..=9)"))),
    })
}

/// The operator of code `op`.
pub(crate) fn red_op(api: &'static str, op: xcclRedOp_t) -> crate::Result<ReduceOp> {
    usize::try_from(op)
        .ok()
        .and_then(|i| ReduceOp::ALL.get(i).copied())
        .ok_or_else(|| invalid(api, format!("op {op} is not an xcclRedOp_t (0..=4)")))
}

/// The message of a result code (not of a particular failure: see [`xcclGetLastError`]).
#[unsafe(no_mangle)]
pub extern "C" fn xcclGetErrorString(result: xcclResult_t) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        xcclSuccess => c"no error",
        xcclInvalidArgument => c"invalid argument",
        xcclInvalidUsage => c"invalid usage or settings",
        xcclSystemError => c"system error",
        xcclRemoteError => c"remote error (another rank failed)",
        xcclTimeout => c"timed out",
        xcclAborted => c"communicator aborted",
        xcclInternalError => c"internal error",
        xcclInProgress => c"operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// The message of the last error on this thread ("" if none): what failed, why, and which
/// rank is at fault. Valid until the next failing xccl call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn xcclGetLastError() -> *const c_char {
    LAST.with(|l| l.borrow().0.as_ptr())
}

/// The rank the last error on this thread blames (a lost, misbehaving, silent or aborting
/// peer), or -1 if it names none.
#[unsafe(no_mangle)]
pub extern "C" fn xcclGetLastErrorRank() -> c_int {
    LAST.with(|l| l.borrow().1)
}

/// Stores [`XCCL_VERSION_CODE`] in `*version`.
///
/// # Safety
/// `version` is NULL or points to an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclGetVersion(version: *mut c_int) -> xcclResult_t {
    guard(|| {
        // SAFETY: the caller passes NULL or a valid pointer to an int.
        let v = unsafe { version.as_mut() }.ok_or_else(|| invalid("xcclGetVersion", "version is NULL"))?;
        *v = XCCL_VERSION_CODE;
        Ok(())
    })
}
