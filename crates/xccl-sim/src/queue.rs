//! The event queue: events by time, those of one time in the order they were scheduled.
//!
//! Lock-step schedules schedule thousands of events for the very same instant, so events
//! are kept in one bucket per distinct time and only the times go through a heap: the
//! order is exactly that of a heap of `(time, sequence number)`, at a fraction of the cost.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

/// Events of type `E` by time (non-negative seconds).
pub(crate) struct Queue<E> {
    /// The distinct times pending, as the bits of non-negative floats (ordered as the
    /// floats are).
    times: BinaryHeap<Reverse<u64>>,
    buckets: FxHashMap<u64, Vec<E>>,
    /// Emptied buckets, for reuse.
    pool: Vec<Vec<E>>,
}

impl<E> Queue<E> {
    /// No events.
    pub(crate) fn new() -> Queue<E> {
        Queue { times: BinaryHeap::new(), buckets: FxHashMap::default(), pool: Vec::new() }
    }

    fn key(t: f64) -> u64 {
        // +0.0 and -0.0 are one instant; times are never negative.
        if t == 0.0 { 0 } else { t.to_bits() }
    }

    /// Schedules `ev` at `t`, after the events already scheduled then.
    pub(crate) fn push(&mut self, t: f64, ev: E) {
        let key = Self::key(t);
        let bucket = self.buckets.entry(key).or_insert_with(|| {
            self.times.push(Reverse(key));
            self.pool.pop().unwrap_or_default()
        });
        bucket.push(ev);
    }

    /// The earliest time with events.
    pub(crate) fn next_time(&self) -> Option<f64> {
        self.times.peek().map(|t| f64::from_bits(t.0))
    }

    /// Removes the events of the earliest time, in the order they were scheduled; hand the
    /// vector back with [`Queue::recycle`].
    pub(crate) fn pop_bucket(&mut self) -> Option<Vec<E>> {
        let Reverse(key) = self.times.pop()?;
        self.buckets.remove(&key)
    }

    /// Returns an emptied bucket for reuse.
    pub(crate) fn recycle(&mut self, mut v: Vec<E>) {
        v.clear();
        self.pool.push(v);
    }
}
