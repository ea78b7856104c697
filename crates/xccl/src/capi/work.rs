//! Handles on asynchronous operations of the C API: test, wait (with a timeout), free.

use std::sync::Arc;
use std::time::Duration;

use super::{guard, invalid, xcclInProgress, xcclResult_t, xcclSuccess};
use crate::work::Completion;

/// An operation started with a non-NULL `work` argument (opaque).
pub struct xcclWork {
    pub(crate) done: Arc<Completion>,
}

/// A handle on an asynchronous operation.
pub type xcclWork_t = *mut xcclWork;

fn work_ref<'a>(api: &'static str, work: xcclWork_t) -> crate::Result<&'a xcclWork> {
    // SAFETY: a non-NULL handle came from this library and was not freed (the caller's
    // contract for every function taking an xcclWork_t).
    unsafe { work.as_ref() }.ok_or_else(|| invalid(api, "work is NULL"))
}

/// Stores in `*done` 1 if the operation has completed (successfully or not), else 0; never
/// blocks. The operation's own result comes from [`xcclWait`].
///
/// # Safety
/// `work` is a live handle; `done` points to an int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclTest(work: xcclWork_t, done: *mut std::ffi::c_int) -> xcclResult_t {
    guard(|| {
        let w = work_ref("xcclTest", work)?;
        // SAFETY: NULL or the caller's int.
        let d = unsafe { done.as_mut() }.ok_or_else(|| invalid("xcclTest", "done is NULL"))?;
        *d = w.done.is_done().into();
        Ok(())
    })
}

/// Waits for the operation: for at most `timeoutMs` milliseconds (negative: without limit).
/// Returns the operation's result once it has completed ([`xcclSuccess`] or its error, with
/// the message in `xcclGetLastError`), or [`xcclInProgress`] if the time ran out first (the
/// operation goes on; wait again, or abort the communicator).
///
/// # Safety
/// `work` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclWait(work: xcclWork_t, timeoutMs: i64) -> xcclResult_t {
    let w = match work_ref("xcclWait", work) {
        Ok(w) => w,
        Err(e) => return super::fail(&e),
    };
    if let Ok(ms) = u64::try_from(timeoutMs)
        && !w.done.wait_for(Duration::from_millis(ms))
    {
        return xcclInProgress;
    }
    guard(|| w.done.wait_result())
}

/// Frees the handle. An operation still in progress goes on (the collective needs every
/// rank) and keeps using its buffers until it completes: free a handle only once
/// [`xcclTest`] or [`xcclWait`] saw it complete, or keep the buffers until the communicator is
/// destroyed. NULL is ignored.
///
/// # Safety
/// `work` is a live handle (or NULL), not used after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclWorkFree(work: xcclWork_t) -> xcclResult_t {
    if !work.is_null() {
        // SAFETY: the handle came from Box::into_raw and is freed once (the caller's contract).
        drop(unsafe { Box::from_raw(work) });
    }
    xcclSuccess
}
