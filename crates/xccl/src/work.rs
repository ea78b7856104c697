//! Handles on asynchronous operations: [`Work`] for one operation and its buffers, [`Event`]
//! for "everything issued so far"; [`Buffer`], what an asynchronous operation can own.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::coll::CollKind;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// Memory that an asynchronous operation takes over until it completes: a `Vec<T>`, a
/// `Box<[T]>`, or a handle on memory owned elsewhere (an array lent by another runtime, such
/// as a Python buffer). The operation reads (and, for its output, writes) the memory in place:
/// nothing is copied.
///
/// # Safety
///
/// The operation takes the slices once, when it is issued, and then moves the buffer into
/// its [`Work`], which keeps it untouched until the operation has completed. An implementor
/// guarantees that
/// - `as_slice` and `as_mut_slice` return the same memory (address and length), and
/// - that memory does not move when the value moves, and stays valid, with no other reader
///   or writer, until the value is dropped or given back by [`Work::wait`]:
///
/// true of heap memory the value owns (`Vec`, `Box<[T]>`), false of an array held inline.
pub unsafe trait Buffer<T>: Send + 'static {
    /// The elements, to read.
    fn as_slice(&self) -> &[T];
    /// The elements, to write.
    fn as_mut_slice(&mut self) -> &mut [T];
}

// SAFETY: a vector's elements live on the heap: moving the `Vec` moves only its pointer, and
// nothing reallocates them while the operation owns the vector.
unsafe impl<T: Element> Buffer<T> for Vec<T> {
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

// SAFETY: a boxed slice lives on the heap and never reallocates.
unsafe impl<T: Element> Buffer<T> for Box<[T]> {
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

/// The shared completion slot of one queued operation.
#[derive(Default)]
pub(crate) struct Completion {
    state: Mutex<Slot>,
    cv: Condvar,
}

#[derive(Default)]
struct Slot {
    result: Option<Result<()>>,
    /// Buffers the operation owns until it completes.
    keep: Option<Box<dyn Any + Send>>,
}

impl Completion {
    /// A slot that already holds `result`.
    pub fn finished(result: Result<()>) -> Arc<Completion> {
        let c = Arc::new(Completion::default());
        c.finish(result);
        c
    }

    /// Parks owned buffers here until the operation completes.
    pub fn keep(&self, keep: Box<dyn Any + Send>) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).keep = Some(keep);
    }

    /// Records the outcome and wakes waiters.
    pub fn finish(&self, result: Result<()>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.result = Some(result);
        self.cv.notify_all();
    }

    /// Records `result` unless an outcome is already known.
    pub fn finish_if_pending(&self, result: Result<()>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.result.is_none() {
            s.result = Some(result);
            self.cv.notify_all();
        }
    }

    pub fn is_done(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).result.is_some()
    }

    /// Blocks until the outcome is known; returns it and the parked buffers.
    fn wait(&self) -> (Result<()>, Option<Box<dyn Any + Send>>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(r) = &s.result {
                return (r.clone(), s.keep.take());
            }
            // The progress thread always finishes an operation (each wait inside it has a
            // deadline), so this wakes; the timeout only bounds a lost notification.
            s = self.cv.wait_timeout(s, Duration::from_secs(1)).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Blocks until done; the outcome.
    pub fn wait_result(&self) -> Result<()> {
        self.wait().0
    }

    /// Blocks until done or until `timeout` has passed; whether it is done.
    pub(crate) fn wait_for(&self, timeout: Duration) -> bool {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (s, _) = self
            .cv
            .wait_timeout_while(s, timeout, |s| s.result.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        s.result.is_some()
    }
}

/// A handle on one asynchronous operation; [`Work::wait`] gives its buffers back.
///
/// Dropping a `Work` does not cancel the operation: it still runs (the collective needs
/// every rank), and its buffers are freed when it completes.
#[must_use = "an operation's buffers come back from Work::wait"]
pub struct Work<B> {
    done: Arc<Completion>,
    _buffers: PhantomData<fn() -> B>,
}

impl<B: Send + 'static> Work<B> {
    pub(crate) fn new(done: Arc<Completion>) -> Work<B> {
        Work { done, _buffers: PhantomData }
    }

    /// Blocks until the operation has completed and returns its buffers. On failure the
    /// buffers are dropped: their contents would be undefined.
    pub fn wait(self) -> Result<B> {
        let (result, keep) = self.done.wait();
        result?;
        keep.and_then(|k| k.downcast::<B>().ok())
            .map(|b| *b)
            .ok_or_else(|| Error::Internal("completed operation lost its buffers".into()))
    }

    /// Whether the operation has completed (successfully or not).
    pub fn is_completed(&self) -> bool {
        self.done.is_done()
    }

    /// The operation's completion slot, for handles that outlive the typed `Work` (the C API).
    #[cfg(feature = "capi")]
    pub(crate) fn completion(&self) -> Arc<Completion> {
        self.done.clone()
    }

    /// Blocks until the operation has completed or `timeout` has passed, and says whether
    /// it has: a thread that must also watch something else (a stop flag) waits in slices
    /// without polling. [`Work::wait`] then returns at once.
    pub fn wait_for(&self, timeout: Duration) -> bool {
        self.done.wait_for(timeout)
    }
}

/// Completes when every operation issued on a communicator before it has completed: the
/// counterpart of recording an event on a CUDA stream. Cheap to clone and wait on from any
/// thread.
#[derive(Clone)]
pub struct Event {
    done: Arc<Completion>,
}

impl Event {
    pub(crate) fn new(done: Arc<Completion>) -> Event {
        Event { done }
    }

    /// Blocks until the event has completed; fails if the communicator failed before it.
    pub fn wait(&self) -> Result<()> {
        self.done.wait_result()
    }

    /// Whether the event has completed.
    pub fn is_completed(&self) -> bool {
        self.done.is_done()
    }
}

/// What a recorded operation was, typed for the tools that count operations (bus bytes,
/// the simulator's calibration); [`OpSpan::name`] says the same in words.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SpanOp {
    /// A collective with `count` elements of `dtype` in this rank's input.
    Collective {
        /// Which collective.
        kind: CollKind,
        /// The element type.
        dtype: DType,
        /// Elements of this rank's input.
        count: usize,
    },
    /// A point-to-point message of `count` elements of `dtype`, sent to (`send`) or received
    /// from `peer`.
    Message {
        /// Sent (`true`) or received.
        send: bool,
        /// The other rank.
        peer: usize,
        /// The element type.
        dtype: DType,
        /// Elements of the message.
        count: usize,
    },
    /// The communicator's own work: creating it, splitting or duplicating it.
    Setup,
}

/// When one operation ran on this rank: for timelines and traces
/// ([`Communicator::record_timeline`](crate::Communicator::record_timeline)).
#[derive(Clone, Debug)]
pub struct OpSpan {
    /// The operation, as errors name it: `all_reduce #17 (f32 x 1024, sum, ring)`,
    /// `send to 3 (tag 1)`.
    pub name: String,
    /// The operation, typed.
    pub op: SpanOp,
    /// Bytes of this rank's input (collectives) or of the message (point-to-point).
    pub bytes: usize,
    /// When the call was made.
    pub issued: std::time::Instant,
    /// When the operation started to run.
    pub started: std::time::Instant,
    /// When it completed (or failed).
    pub finished: std::time::Instant,
}

#[cfg(test)]
mod tests {
    use crate::{Communicator, ReduceOp};

    /// Asynchronous operations on any `Buffer` run in its own memory and give it back.
    #[test]
    fn async_operations_use_the_buffers_memory() {
        let comms = Communicator::local(2).unwrap();
        std::thread::scope(|s| {
            for c in comms {
                s.spawn(move || {
                    let r = c.rank();
                    let boxed: Box<[f32]> = vec![r as f32 + 1.0; 1000].into_boxed_slice();
                    let at = boxed.as_ptr();
                    let back = c.all_reduce_async(boxed, ReduceOp::Sum).wait().unwrap();
                    assert_eq!(back.as_ptr(), at, "the result is in another allocation");
                    assert!(back.iter().all(|&x| x == 3.0));

                    let v = vec![r as u64 + 1; 7];
                    let at = v.as_ptr();
                    let back = c.reduce_in_place_async(v, ReduceOp::Max, 1).wait().unwrap();
                    assert_eq!(back.as_ptr(), at);
                    assert_eq!(back, vec![if r == 1 { 2 } else { 1 }; 7]);
                });
            }
        });
    }
}
