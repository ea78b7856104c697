//! [`HostBuffer`]: memory for large messages, on 2 MiB pages where the system has them.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::work::Buffer;

/// The size of a transparent huge page on x86-64 and of the common arm64 setting: the
/// alignment and the granularity of a mapping.
const HUGE_PAGE: usize = 2 << 20;

/// A buffer of `T` in its own mapping on 2 MiB pages: a slice to read and write, and a
/// [`Buffer`] that asynchronous operations may own.
///
/// Between processes of one host, xccl copies a large message in one copy, straight out of
/// (or into) the peer's memory: the kernel's cross-memory attach (`process_vm_readv`). For
/// every such copy the kernel finds and pins each page of the peer's buffer. On ordinary
/// 4 KiB pages that is 16 384 page-table walks and pins per 64 MiB, and the copy goes page
/// by page; on 2 MiB pages it is 32 of each. On this project's machine (`docs/PERFORMANCE.md`)
/// a 64 MiB all-reduce of 2 processes ran at 3.4–3.6 GB/s out of ordinary memory and at
/// 4.6–5.0 GB/s out of a `HostBuffer`; in place, 3.8–3.9 and 5.9–6.7 GB/s. NCCL's `ncclMemAlloc` plays the
/// same part for GPU memory.
///
/// A `HostBuffer` is a private anonymous mapping, aligned to 2 MiB and advised
/// `MADV_HUGEPAGE` before its first touch, so transparent huge pages back it whenever the
/// system's setting is `always` or `madvise` (the usual default). Where huge pages are off
/// or none is free, it is ordinary memory and everything works as before, only without the
/// speed. Messages between threads of one process, small messages and TCP gain nothing.
///
/// ```
/// use xccl::{Communicator, HostBuffer, ReduceOp};
///
/// # fn main() -> xccl::Result<()> {
/// let comms = Communicator::local(2)?;
/// let sums = std::thread::scope(|s| {
///     let handles: Vec<_> = comms
///         .into_iter()
///         .map(|comm| {
///             s.spawn(move || -> xccl::Result<HostBuffer<f32>> {
///                 let mut grads = HostBuffer::<f32>::zeroed(1 << 20)?;
///                 grads.fill(comm.rank() as f32 + 1.0);
///                 // In place, as a slice; or owned by an asynchronous operation.
///                 comm.all_reduce(&mut grads, ReduceOp::Sum)?;
///                 comm.all_reduce_async(grads, ReduceOp::Sum).wait()
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect::<xccl::Result<Vec<_>>>()
/// })?;
/// assert!(sums.iter().all(|g| g.iter().all(|x| *x == 6.0)));
/// # Ok(())
/// # }
/// ```
pub struct HostBuffer<T> {
    /// The first element; dangling when empty.
    ptr: NonNull<T>,
    /// Elements.
    len: usize,
    /// Bytes mapped at `ptr` (a multiple of [`HUGE_PAGE`]; 0 when empty).
    mapped: usize,
}

// SAFETY: a `HostBuffer` owns its mapping alone, as a `Vec` owns its heap block.
unsafe impl<T: Send> Send for HostBuffer<T> {}
// SAFETY: shared access only reads, through `&[T]`.
unsafe impl<T: Sync> Sync for HostBuffer<T> {}

impl<T: Element> HostBuffer<T> {
    /// `len` zeros.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `len` elements overflow the address space;
    /// [`Error::Io`] if the system refuses the mapping (out of memory, `ulimit -v`).
    pub fn zeroed(len: usize) -> Result<Self> {
        let bytes = len.checked_mul(size_of::<T>()).and_then(|b| b.checked_next_multiple_of(HUGE_PAGE));
        let Some(mapped) = bytes else {
            return Err(Error::InvalidArgument {
                op: "HostBuffer::zeroed",
                msg: format!("{len} elements of {} bytes do not fit in the address space", size_of::<T>()),
            });
        };
        if mapped == 0 {
            return Ok(Self::default());
        }
        let ptr = map_aligned(mapped).map_err(|e| Error::Io {
            context: format!("HostBuffer: mapping {mapped} bytes"),
            source: Arc::new(e),
        })?;
        Ok(Self { ptr: ptr.cast(), len, mapped })
    }

    /// A copy of `data`.
    ///
    /// # Errors
    /// As [`zeroed`](Self::zeroed).
    pub fn from_slice(data: &[T]) -> Result<Self> {
        let mut b = Self::zeroed(data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    }
}

/// Maps `bytes` (a multiple of [`HUGE_PAGE`]) of zeroed private memory at an address aligned
/// to [`HUGE_PAGE`], advised for huge pages.
fn map_aligned(bytes: usize) -> std::io::Result<NonNull<u8>> {
    let over =
        bytes.checked_add(HUGE_PAGE).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
    // SAFETY: a new private anonymous mapping at an address the kernel chooses; it touches no
    // existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let start = (raw as usize).next_multiple_of(HUGE_PAGE);
    let (head, tail) = (start - raw as usize, raw as usize + over - (start + bytes));
    // SAFETY: both ranges lie inside the mapping just made and outside `start..start + bytes`,
    // which is what this function keeps; nothing else refers to them.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((start + bytes) as *mut libc::c_void, tail);
        }
        // Advice only: a kernel without transparent huge pages refuses it (EINVAL), and the
        // memory stays ordinary, which is correct, only slower.
        libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
    }
    NonNull::new(start as *mut u8).ok_or_else(|| std::io::Error::other("mmap returned address 0"))
}

impl<T> Default for HostBuffer<T> {
    /// An empty buffer (no mapping).
    fn default() -> Self {
        Self { ptr: NonNull::dangling(), len: 0, mapped: 0 }
    }
}

impl<T> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        if self.mapped > 0 {
            // SAFETY: `ptr..ptr + mapped` is the mapping this value made and owns alone; no
            // borrow of it outlives the value.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
        }
    }
}

impl<T> Deref for HostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is aligned (a page, or dangling for an empty buffer) and the first of
        // `len` initialised elements (zeroed memory is a valid `Element`), owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for HostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: the elements live in the buffer's own mapping, which does not move when the value
// moves and is unmapped only when the value is dropped.
unsafe impl<T: Element> Buffer<T> for HostBuffer<T> {
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: fmt::Debug> fmt::Debug for HostBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's page size backing `addr`, from `/proc/self/smaps`: the `AnonHugePages`
    /// of the mapping holding it.
    fn huge_bytes_at(addr: usize) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = (a..b).contains(&addr);
            } else if inside && let Some(kb) = line.strip_prefix("AnonHugePages:") {
                return kb.trim().trim_end_matches(" kB").trim().parse::<usize>().ok().map(|k| k << 10);
            }
        }
        None
    }

    #[test]
    fn a_buffer_is_zeroed_aligned_writable_and_copies_exactly() {
        let mut b = HostBuffer::<f64>::zeroed(3 << 20).unwrap();
        assert_eq!(b.len(), 3 << 20);
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        assert!(b.iter().all(|x| *x == 0.0));
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as f64;
        }
        assert!(b.iter().enumerate().all(|(i, x)| *x == i as f64));
        let c = HostBuffer::from_slice(&b[5..9]).unwrap();
        assert_eq!(&c[..], &[5.0, 6.0, 7.0, 8.0]);
        let e = HostBuffer::<u8>::zeroed(0).unwrap();
        assert!(e.is_empty());
        assert_eq!(format!("{c:?}"), "[5.0, 6.0, 7.0, 8.0]");
    }

    #[test]
    fn an_impossible_length_is_an_error() {
        let e = HostBuffer::<u64>::zeroed(usize::MAX / 4).unwrap_err();
        assert!(e.to_string().contains("do not fit"), "{e}");
        // Representable, but no room for the alignment, or for the mapping.
        for len in [usize::MAX - HUGE_PAGE, usize::MAX / 2] {
            let e = HostBuffer::<u8>::zeroed(len).unwrap_err();
            assert!(e.to_string().contains("HostBuffer: mapping"), "{e}");
        }
    }

    #[test]
    fn where_the_system_offers_huge_pages_the_buffer_gets_them() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        let offered = mode.contains("[always]") || mode.contains("[madvise]");
        let mut b = HostBuffer::<u8>::zeroed(8 << 20).unwrap();
        b.fill(1);
        let huge = huge_bytes_at(b.as_ptr() as usize).unwrap_or(0);
        if offered {
            // Huge pages may run out on a fragmented host; at least one must have been given.
            assert!(huge >= HUGE_PAGE, "THP {mode:?}: {huge} bytes of the buffer on huge pages");
        } else {
            eprintln!("transparent huge pages off ({mode:?}): nothing to check");
        }
    }
}
