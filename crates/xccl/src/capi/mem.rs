//! Memory for large messages from C: [`xcclMemAlloc`] and [`xcclMemFree`], as NCCL's
//! `ncclMemAlloc`/`ncclMemFree`: a [`HostBuffer`] on 2 MiB pages, which the kernel copies
//! between processes much faster than ordinary memory (see `HostBuffer`).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use super::{guard, invalid, xcclResult_t};
use crate::host_buffer::HostBuffer;

/// The live allocations, by address: a `HostBuffer` knows its mapping's length, which
/// `xcclMemFree` is not given.
static LIVE: Mutex<BTreeMap<usize, HostBuffer<u8>>> = Mutex::new(BTreeMap::new());

/// Allocates `size` bytes of zeroed memory on 2 MiB pages (where the system has transparent
/// huge pages) and stores its address in `*ptr`; `size` 0 stores NULL. Free it with
/// [`xcclMemFree`]. Any xccl call accepts any memory; this memory makes large messages
/// between processes of one host faster.
///
/// # Safety
/// `ptr` points to a `void *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclMemAlloc(ptr: *mut *mut c_void, size: usize) -> xcclResult_t {
    guard(|| {
        // SAFETY: the caller passes NULL or a valid pointer to a pointer.
        let out = unsafe { ptr.as_mut() }.ok_or_else(|| invalid("xcclMemAlloc", "ptr is NULL"))?;
        *out = std::ptr::null_mut();
        if size == 0 {
            return Ok(());
        }
        let mut buf = HostBuffer::<u8>::zeroed(size)?;
        let addr = buf.as_mut_ptr();
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).insert(addr as usize, buf);
        *out = addr.cast();
        Ok(())
    })
}

/// Frees memory from [`xcclMemAlloc`]; NULL is ignored. A pointer that `xcclMemAlloc` did
/// not return, or one already freed, is [`xcclInvalidArgument`](super::xcclInvalidArgument)
/// and frees nothing.
///
/// # Safety
/// No operation still uses the memory, and nothing reads or writes it afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclMemFree(ptr: *mut c_void) -> xcclResult_t {
    guard(|| {
        if ptr.is_null() {
            return Ok(());
        }
        let freed = LIVE.lock().unwrap_or_else(|p| p.into_inner()).remove(&(ptr as usize));
        match freed {
            Some(buf) => {
                drop(buf);
                Ok(())
            }
            None => Err(invalid(
                "xcclMemFree",
                format!("{ptr:p} was not returned by xcclMemAlloc, or was freed already"),
            )),
        }
    })
}
