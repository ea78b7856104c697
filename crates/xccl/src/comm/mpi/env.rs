//! The MPI library as the backend uses it: initialisation with `MPI_THREAD_MULTIPLE` and
//! finalisation at process exit, MPI error codes as [`Error`]s, element types as MPI
//! datatypes and reduction operators as MPI operators.
//!
//! MPI's own operators serve where their result is xccl's bit for bit (sums, products,
//! integer minima and maxima); xccl's kernels ([`crate::reduce`]), as user-defined MPI
//! operators, serve the rest: `f16`/`bf16` arithmetic (MPI has none) and float minima and
//! maxima (xccl's ignore NaN operands). `Avg` is a sum divided once at the end, as in the
//! native backend.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use mpi::ffi;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce::{self, ReduceOp};

/// An MPI handle (communicator, datatype, operator) that may cross threads.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(super) struct Handle<H>(pub H);

// SAFETY: an MPI handle names a process-wide MPI object, not memory of one thread; the
// library is initialised with MPI_THREAD_MULTIPLE (checked in `init`), so any thread may
// pass it to MPI.
unsafe impl<H> Send for Handle<H> {}
// SAFETY: as for `Send`: handles are plain values that MPI itself synchronises.
unsafe impl<H> Sync for Handle<H> {}

unsafe extern "C" {
    /// `MPI_IN_PLACE` of this MPI library (`shim.c`).
    fn xccl_mpi_in_place() -> *mut c_void;
    /// The attribute key `MPI_TAG_UB` of this MPI library (`shim.c`).
    fn xccl_mpi_tag_ub_key() -> c_int;
}

/// What the backend set up in the MPI library, once per process.
pub(super) struct Library {
    /// The MPI datatype of each element type, by [`DType`] tag.
    types: [Handle<ffi::MPI_Datatype>; 10],
    /// xccl's kernels as MPI operators, by combining operator (`Sum`, `Prod`, `Min`, `Max`).
    kernels: [Handle<ffi::MPI_Op>; 4],
    /// `MPI_IN_PLACE`.
    in_place: Handle<*mut c_void>,
}

static LIBRARY: OnceLock<Result<Library>> = OnceLock::new();

/// An MPI call failed in this process: the job is aborted at exit instead of finalised,
/// since peers may be waiting in an operation this process will never join.
static FAILED: AtomicBool = AtomicBool::new(false);

/// A kernel called by MPI failed (it cannot return an error itself); the next check of a
/// reducing operation reports it.
static KERNEL_FAILURE: Mutex<Option<Error>> = Mutex::new(None);

/// The MPI library, initialised on first use.
pub(super) fn library() -> Result<&'static Library> {
    LIBRARY.get_or_init(init).as_ref().map_err(Clone::clone)
}

/// The thread level names of the MPI standard.
fn thread_level(level: c_int) -> String {
    // SAFETY: reading the values the MPI library exports as constants.
    let names = unsafe {
        [
            (ffi::RSMPI_THREAD_SINGLE, "MPI_THREAD_SINGLE"),
            (ffi::RSMPI_THREAD_FUNNELED, "MPI_THREAD_FUNNELED"),
            (ffi::RSMPI_THREAD_SERIALIZED, "MPI_THREAD_SERIALIZED"),
            (ffi::RSMPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE"),
        ]
    };
    names.iter().find(|(l, _)| *l == level).map_or_else(|| format!("level {level}"), |(_, n)| n.to_string())
}

fn init() -> Result<Library> {
    let (mut initialized, mut finalized, mut provided) = (0, 0, 0);
    // SAFETY: MPI_Initialized and MPI_Finalized may be called at any time, from any thread.
    unsafe {
        ffi::MPI_Initialized(&mut initialized);
        ffi::MPI_Finalized(&mut finalized);
    }
    if finalized != 0 {
        return Err(Error::Config(
            "MPI was already finalised in this process; it cannot be used again".into(),
        ));
    }
    // SAFETY: reading an exported constant.
    let multiple = unsafe { ffi::RSMPI_THREAD_MULTIPLE };
    if initialized == 0 {
        // SAFETY: MPI is not initialised (checked above, and `LIBRARY` runs this once); null
        // argc/argv are allowed by the standard.
        let rc = unsafe {
            ffi::MPI_Init_thread(std::ptr::null_mut(), std::ptr::null_mut(), multiple, &mut provided)
        };
        check(rc, || "MPI_Init_thread".into())?;
        // SAFETY: `finalize` is a plain `extern "C" fn()` that stays valid for the process.
        if unsafe { libc::atexit(finalize) } != 0 {
            return Err(Error::Internal("cannot register MPI_Finalize at exit".into()));
        }
    } else {
        // Someone else (the program, through rsmpi say) initialised MPI and finalises it.
        // SAFETY: MPI is initialised.
        check(unsafe { ffi::MPI_Query_thread(&mut provided) }, || "MPI_Query_thread".into())?;
    }
    if provided < multiple {
        return Err(Error::Config(format!(
            "the MPI library provides {} but xccl's MPI backend needs MPI_THREAD_MULTIPLE \
             (communicators progress on threads of their own): use an MPI built with thread \
             support (Open MPI and MPICH of Debian and Ubuntu are)",
            thread_level(provided)
        )));
    }
    // SAFETY: reading exported constants; MPI is initialised.
    let base = unsafe {
        [
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_DOUBLE,
            ffi::RSMPI_DATATYPE_NULL,
            ffi::RSMPI_DATATYPE_NULL,
            ffi::RSMPI_INT8_T,
            ffi::RSMPI_INT32_T,
            ffi::RSMPI_INT64_T,
            ffi::RSMPI_UINT8_T,
            ffi::RSMPI_UINT32_T,
            ffi::RSMPI_UINT64_T,
        ]
    };
    let mut types = base.map(Handle);
    // f16 and bf16: two datatypes of their own, so that a kernel can tell them apart.
    for d in [DType::F16, DType::BF16] {
        // SAFETY: MPI is initialised; the output pointer is valid.
        let t = unsafe {
            let mut t = ffi::RSMPI_DATATYPE_NULL;
            check(ffi::MPI_Type_contiguous(1, ffi::RSMPI_UINT16_T, &mut t), || "MPI_Type_contiguous".into())?;
            check(ffi::MPI_Type_commit(&mut t), || "MPI_Type_commit".into())?;
            t
        };
        types[d as usize] = Handle(t);
    }
    let kernels = [
        user_op(kernel::<{ ReduceOp::Sum as u8 }>)?,
        user_op(kernel::<{ ReduceOp::Prod as u8 }>)?,
        user_op(kernel::<{ ReduceOp::Min as u8 }>)?,
        user_op(kernel::<{ ReduceOp::Max as u8 }>)?,
    ];
    // SAFETY: the shim returns a constant of mpi.h.
    let in_place = Handle(unsafe { xccl_mpi_in_place() });
    Ok(Library { types, kernels, in_place })
}

type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype);

fn user_op(f: UserFn) -> Result<Handle<ffi::MPI_Op>> {
    // SAFETY: MPI is initialised; `f` has the signature of MPI_User_function and lives for
    // the process; every xccl operator is commutative.
    unsafe {
        let mut op = ffi::RSMPI_SUM;
        check(ffi::MPI_Op_create(Some(f), 1, &mut op), || "MPI_Op_create".into())?;
        Ok(Handle(op))
    }
}

/// Finalises MPI at process exit (registered with `atexit` when xccl initialised it), after
/// `main` returned and every communicator was dropped; aborts the job instead if an MPI call
/// failed in this process.
extern "C" fn finalize() {
    let mut finalized = 0;
    // SAFETY: MPI was initialised (this is registered only after that); MPI_Finalized may be
    // called at any time, MPI_Finalize and MPI_Abort once, which the check ensures.
    unsafe {
        ffi::MPI_Finalized(&mut finalized);
        if finalized == 0 {
            if FAILED.load(Ordering::Relaxed) {
                ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1);
            } else {
                ffi::MPI_Finalize();
            }
        }
    }
}

/// Whether MPI has been finalised (communicators dropped after that have nothing to free).
pub(super) fn finalized() -> bool {
    let mut f = 0;
    // SAFETY: MPI_Finalized may be called at any time.
    unsafe { ffi::MPI_Finalized(&mut f) };
    f != 0
}

/// `Ok` for `MPI_SUCCESS`, else the error with MPI's own description of `rc`.
pub(super) fn check(rc: c_int, call: impl FnOnce() -> String) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    FAILED.store(true, Ordering::Relaxed);
    let mut text = [0 as c_char; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds more than MPI_MAX_ERROR_STRING (256 in Open MPI and MPICH)
    // characters; MPI_Error_string may be called before MPI_Init and after MPI_Finalize.
    let known = unsafe { ffi::MPI_Error_string(rc, text.as_mut_ptr(), &mut len) } == 0;
    let len = usize::try_from(len).unwrap_or(0).min(text.len());
    let detail = if known {
        String::from_utf8_lossy(&text[..len].iter().map(|&c| c as u8).collect::<Vec<_>>()).into_owned()
    } else {
        "unknown MPI error".into()
    };
    Err(Error::Mpi { call: call(), code: rc, detail })
}

/// The failure of a kernel MPI called since the last look, if any.
pub(super) fn kernel_failure() -> Result<()> {
    match KERNEL_FAILURE.lock().unwrap_or_else(PoisonError::into_inner).take() {
        Some(e) => {
            FAILED.store(true, Ordering::Relaxed);
            Err(e)
        }
        None => Ok(()),
    }
}

impl Library {
    /// The MPI datatype of `dtype`.
    pub fn datatype(&self, dtype: DType) -> ffi::MPI_Datatype {
        self.types[dtype as usize].0
    }

    /// The MPI operator that combines `dtype` values as `op` does in xccl (`Avg` sums; the
    /// caller divides the result, see [`reduce::finalize`]).
    pub fn operator(&self, dtype: DType, op: ReduceOp) -> ffi::MPI_Op {
        let combiner = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let half = matches!(dtype, DType::F16 | DType::BF16);
        let float_min_max = dtype.is_float() && matches!(combiner, ReduceOp::Min | ReduceOp::Max);
        if half || float_min_max {
            return self.kernels[combiner as usize].0;
        }
        // SAFETY: reading exported constants.
        unsafe {
            match combiner {
                ReduceOp::Prod => ffi::RSMPI_PROD,
                ReduceOp::Min => ffi::RSMPI_MIN,
                ReduceOp::Max => ffi::RSMPI_MAX,
                ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            }
        }
    }

    /// `MPI_IN_PLACE`.
    pub fn in_place(&self) -> *mut c_void {
        self.in_place.0
    }

    fn dtype_of(&self, t: ffi::MPI_Datatype) -> Option<DType> {
        DType::ALL.into_iter().find(|&d| self.types[d as usize].0 == t)
    }
}

/// The largest message tag of communicator `comm` (`MPI_TAG_UB`).
pub(super) fn tag_ub(comm: ffi::MPI_Comm) -> Result<u32> {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag = 0;
    // SAFETY: for MPI_TAG_UB, MPI stores a pointer to an int it owns into `value`.
    let rc =
        unsafe { ffi::MPI_Comm_get_attr(comm, xccl_mpi_tag_ub_key(), (&raw mut value).cast(), &mut flag) };
    check(rc, || "MPI_Comm_get_attr(MPI_TAG_UB)".into())?;
    if flag == 0 || value.is_null() {
        return Ok(32767); // the least the standard allows
    }
    // SAFETY: MPI set `flag`, so `value` points to the attribute's int.
    Ok(u32::try_from(unsafe { *value }).unwrap_or(32767))
}

/// xccl's kernel for `OP` as an MPI user function: `inout = in ⊕ inout` on `len` elements.
///
/// # Safety
/// Called by MPI only: `invec` and `inoutvec` hold `*len` elements of `*datatype`.
unsafe extern "C" fn kernel<const OP: u8>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    datatype: *mut ffi::MPI_Datatype,
) {
    let outcome = (|| {
        let lib = library()?;
        // SAFETY: MPI passes valid pointers to the count and the datatype.
        let (len, t) = unsafe { (*len, *datatype) };
        let dtype = lib
            .dtype_of(t)
            .ok_or_else(|| Error::Internal("MPI called an xccl kernel on a foreign datatype".into()))?;
        let op = ReduceOp::from_tag(OP).ok_or_else(|| Error::Internal(format!("no operator {OP}")))?;
        let bytes = usize::try_from(len).unwrap_or(0) * dtype.size();
        // SAFETY: MPI passes `len` elements of `dtype` at both (the caller's contract); the
        // two buffers do not overlap.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(invec.cast::<u8>(), bytes),
                std::slice::from_raw_parts_mut(inoutvec.cast::<u8>(), bytes),
            )
        };
        combine_unaligned(dtype, op, dst, src)
    })();
    if let Err(e) = outcome {
        KERNEL_FAILURE.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(e);
    }
}

/// `dst = dst ⊕ src`, through aligned copies where MPI's buffers are not aligned for the type.
fn combine_unaligned(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<()> {
    let align = dtype.size();
    if (dst.as_ptr() as usize).is_multiple_of(align) && (src.as_ptr() as usize).is_multiple_of(align) {
        return reduce::combine(dtype, op, dst, src);
    }
    let words = dst.len().div_ceil(8);
    let (mut d, mut s) = (vec![0u64; words], vec![0u64; words]);
    let (d8, s8): (&mut [u8], &mut [u8]) =
        (bytemuck::cast_slice_mut(&mut d), bytemuck::cast_slice_mut(&mut s));
    d8[..dst.len()].copy_from_slice(dst);
    s8[..src.len()].copy_from_slice(src);
    reduce::combine(dtype, op, &mut d8[..dst.len()], &s8[..src.len()])?;
    dst.copy_from_slice(&d8[..dst.len()]);
    Ok(())
}
