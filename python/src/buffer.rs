//! Python buffers as xccl buffers, without copies: a buffer-protocol export ([`Held`]) keeps
//! the exporter's memory alive and in place, and [`Lent`] is that memory as elements of one
//! type, which xccl reads and writes directly.
//!
//! Element types come from the buffer's struct-module format (`f`, `d`, `e`, `b`, `B`, `i`,
//! `l`, `q`, `I`, `L`, `Q`, ...) or from a `dtype=` name that overrides it with a type of the
//! same size (`bfloat16` bits arrive as an `int16` / `uint16` view: NumPy has no bfloat16).

use std::marker::PhantomData;
use std::ptr::NonNull;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use xccl::{Buffer, DType, Element};

use crate::error::invalid;

/// The names `dtype=` accepts, for messages.
const DTYPES: &str = "float32 float64 float16 bfloat16 int8 int32 int64 uint8 uint32 uint64";

/// The name `dtype=` and NumPy give `d`.
pub(crate) fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
    }
}

/// A buffer exported by a Python object for the duration of a call (or of an asynchronous
/// operation): while it lives, the exporter keeps its memory where it is (NumPy and
/// `bytearray` refuse to resize an exported buffer) and alive (the export holds a reference
/// to the object). Dropping it releases the export, which needs the GIL: it is only ever
/// dropped on a Python thread.
pub(crate) struct Held {
    buf: PyUntypedBuffer,
    /// The element type the call reads the memory as.
    pub dtype: DType,
}

impl Held {
    /// Start of the memory.
    fn addr(&self) -> usize {
        self.buf.buf_ptr() as usize
    }

    /// Bytes of the memory.
    pub fn bytes(&self) -> usize {
        self.buf.len_bytes()
    }

    /// Whether `self` and `other` share at least one byte.
    pub fn overlaps(&self, other: &Held) -> bool {
        let (a, b) = (self.addr(), other.addr());
        self.bytes() > 0 && other.bytes() > 0 && a < b + other.bytes() && b < a + self.bytes()
    }

    /// Whether `self` and `other` are exactly the same memory.
    pub fn same_memory(&self, other: &Held) -> bool {
        self.addr() == other.addr() && self.bytes() == other.bytes()
    }

    /// The memory as elements of `T` (the element type of `self.dtype`).
    ///
    /// # Safety
    /// The caller keeps `self` alive, and does not drop it, until xccl no longer uses the
    /// returned memory: the call returned, or the asynchronous operation completed.
    pub unsafe fn lend<T: Element>(&self) -> Lent<T> {
        let len = self.bytes() / size_of::<T>();
        let ptr = match NonNull::new(self.buf.buf_ptr().cast::<T>()) {
            Some(p) if len > 0 => p,
            _ => NonNull::dangling(),
        };
        Lent { ptr, len, _elems: PhantomData }
    }
}

/// Exports `obj` as argument `what` of `api`: a C-contiguous buffer (writable when
/// `writable`) whose elements are of a type xccl knows, as the buffer's format says or as
/// `dtype` overrides it.
pub(crate) fn export(
    py: Python<'_>,
    api: &'static str,
    what: &str,
    obj: &Bound<'_, PyAny>,
    dtype: Option<DType>,
    writable: bool,
) -> PyResult<Held> {
    let buf = PyUntypedBuffer::get(obj).map_err(|e| {
        let t = obj.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string());
        invalid(
            py,
            api,
            format!(
                "{what} ({t}) does not export a buffer ({e}): pass a NumPy array, a memoryview or a \
                 bytearray"
            ),
        )
    })?;
    if writable && buf.readonly() {
        return Err(invalid(py, api, format!("{what} is read-only, but the call writes into it")));
    }
    if !buf.is_c_contiguous() {
        return Err(invalid(
            py,
            api,
            format!(
                "{what} is not C-contiguous (strides {:?}): pass a contiguous array \
                 (numpy.ascontiguousarray) and copy results back",
                buf.strides()
            ),
        ));
    }
    let format = buf.format().to_string_lossy().into_owned();
    let size = buf.item_size();
    let dtype = match dtype {
        Some(d) if d.size() == size => d,
        Some(d) => {
            return Err(invalid(
                py,
                api,
                format!(
                    "dtype {} has {}-byte elements, but {what} has {size}-byte elements (format \
                     '{format}'): dtype= only reinterprets elements of the same size",
                    dtype_name(d),
                    d.size()
                ),
            ));
        }
        None => from_format(&format, size).ok_or_else(|| {
            invalid(
                py,
                api,
                format!(
                    "{what} has elements of format '{format}' ({size} bytes), which xccl does not \
                     handle: use one of {DTYPES} (bfloat16 as an int16/uint16 view with \
                     dtype=\"bfloat16\")"
                ),
            )
        })?,
    };
    if buf.len_bytes() > 0 && !(buf.buf_ptr() as usize).is_multiple_of(dtype.size()) {
        return Err(invalid(
            py,
            api,
            format!("{what} is not aligned to its {}-byte elements: pass an aligned copy", dtype.size()),
        ));
    }
    Ok(Held { buf, dtype })
}

/// The element type of a buffer format (struct-module syntax) with items of `size` bytes.
fn from_format(format: &str, size: usize) -> Option<DType> {
    // Native or little-endian byte order only ('>' and '!' are big-endian).
    let code = match format.as_bytes() {
        [c] => *c,
        [b'@' | b'=' | b'<', c] if cfg!(target_endian = "little") => *c,
        [b'@' | b'=', c] => *c,
        _ => return None,
    };
    let d = match (code, size) {
        (b'f', 4) => DType::F32,
        (b'd', 8) => DType::F64,
        (b'e', 2) => DType::F16,
        (b'b', 1) => DType::I8,
        (b'B', 1) => DType::U8,
        (b'i' | b'l' | b'q' | b'n', 4) => DType::I32,
        (b'i' | b'l' | b'q' | b'n', 8) => DType::I64,
        (b'I' | b'L' | b'Q' | b'N', 4) => DType::U32,
        (b'I' | b'L' | b'Q' | b'N', 8) => DType::U64,
        _ => return None,
    };
    Some(d)
}

/// Parses a `dtype=` name.
pub(crate) fn parse_dtype(py: Python<'_>, api: &'static str, name: Option<&str>) -> PyResult<Option<DType>> {
    name.map(|n| {
        n.parse::<DType>()
            .map_err(|_| invalid(py, api, format!("unknown dtype '{n}': expected one of {DTYPES}")))
    })
    .transpose()
}

/// The memory of a [`Held`] export as `len` elements of `T`, lent to xccl.
pub(crate) struct Lent<T> {
    ptr: NonNull<T>,
    len: usize,
    _elems: PhantomData<T>,
}

impl<T> Lent<T> {
    /// No memory: the buffer a rank passes where it has none (`None`).
    pub fn empty() -> Lent<T> {
        Lent { ptr: NonNull::dangling(), len: 0, _elems: PhantomData }
    }
}

// SAFETY: a `Lent` is only made by `Held::lend` (or is empty), whose caller keeps the export (which pins
// and keeps alive the memory) until xccl is done with it; the memory belongs to no Rust
// object, so the thread that uses it does not matter.
unsafe impl<T: Element> Send for Lent<T> {}

// SAFETY: `as_slice` and `as_mut_slice` return the same memory, `len` aligned elements of
// `T` (`export` checked size and alignment), which is not inside the `Lent` value and so does
// not move with it; `Held::lend`'s caller keeps it valid until the operation is done. The
// Python program must not touch it meanwhile (the documented contract of every call: the
// memory is borrowed for the call, or until `Work.wait`).
unsafe impl<T: Element> Buffer<T> for Lent<T> {
    fn as_slice(&self) -> &[T] {
        // SAFETY: see the impl: valid, aligned, initialised (any bits are a valid `T`: `Pod`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as above; the export is writable wherever xccl writes (checked by `export`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// The input of a two-buffer call: the caller's memory, or a copy of it when it overlaps
/// the output (xccl reads an input while it writes the output).
pub(crate) enum Input<T> {
    /// The caller's memory.
    Lent(Lent<T>),
    /// A copy taken at the call.
    Copied(Vec<T>),
}

impl<T: Element> Input<T> {
    /// `input` as the input of a call whose output is `output`: lent, or copied if they
    /// overlap.
    ///
    /// # Safety
    /// As [`Held::lend`], for `input`.
    pub unsafe fn of(input: &Held, output: Option<&Held>) -> Input<T> {
        // SAFETY: forwarded to the caller.
        let lent = unsafe { input.lend::<T>() };
        if output.is_some_and(|o| o.overlaps(input)) {
            Input::Copied(lent.as_slice().to_vec())
        } else {
            Input::Lent(lent)
        }
    }
}

// SAFETY: both variants keep their elements outside the value (a `Vec` on the heap, a
// `Lent` in the Python exporter's memory) and return the same memory from both methods.
unsafe impl<T: Element> Buffer<T> for Input<T> {
    fn as_slice(&self) -> &[T] {
        match self {
            Input::Lent(l) => l.as_slice(),
            Input::Copied(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Input::Lent(l) => l.as_mut_slice(),
            Input::Copied(v) => v,
        }
    }
}
