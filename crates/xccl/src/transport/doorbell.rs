//! A doorbell: how a rank that waits on memory-based links sleeps and is woken.
//!
//! One 32-bit word per rank, usable across processes (the futex calls are not private, so
//! the word may live in shared memory). Bit 0 says "the owner is asleep"; the rest count
//! rings. A writer that has just published data, or a reader that has just freed space,
//! rings the bell of the rank on the other side; the ring is a single atomic add unless
//! the owner sleeps, and only then a `futex_wake` system call.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rustix::thread::futex;

const ASLEEP: u32 = 1;
const ONE_RING: u32 = 2;

/// A futex word that peers ring to wake its owner.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(crate) struct Doorbell {
    word: AtomicU32,
}

impl Doorbell {
    /// The current ring count. Read it *before* checking links for progress, then pass it to
    /// [`Doorbell::sleep`]: a ring that lands in between makes the sleep return at once.
    pub fn token(&self) -> u32 {
        self.word.load(Ordering::SeqCst) & !ASLEEP
    }

    /// Whether the bell rang since `token` was taken.
    pub fn rang_since(&self, token: u32) -> bool {
        self.token() != token
    }

    /// Wakes the owner if it sleeps.
    pub fn ring(&self) {
        let before = self.word.fetch_add(ONE_RING, Ordering::SeqCst);
        if before & ASLEEP != 0 {
            self.word.fetch_and(!ASLEEP, Ordering::SeqCst);
            // An error here (EFAULT is impossible for a live reference) only means nobody woke.
            let _ = futex::wake(&self.word, futex::Flags::empty(), u32::MAX);
        }
    }

    /// Sleeps until a ring after `token`, or until `timeout` passes. Spurious returns are
    /// possible; callers re-check their links.
    pub fn sleep(&self, token: u32, timeout: Duration) {
        let seen = self.word.fetch_or(ASLEEP, Ordering::SeqCst);
        if seen & !ASLEEP == token {
            let ts = futex::Timespec {
                tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
                tv_nsec: i64::from(timeout.subsec_nanos()),
            };
            // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: go and look again.
            let _ = futex::wait(&self.word, futex::Flags::empty(), seen | ASLEEP, Some(&ts));
        }
        // Awake again: rings need no system call until the next sleep.
        self.word.fetch_and(!ASLEEP, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn ring_before_sleep_is_not_lost() {
        let bell = Doorbell::default();
        let t = bell.token();
        bell.ring();
        let start = Instant::now();
        bell.sleep(t, Duration::from_secs(5));
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(bell.rang_since(t));
    }

    #[test]
    fn ring_wakes_a_sleeper() {
        let bell = Arc::new(Doorbell::default());
        let t = bell.token();
        let b2 = bell.clone();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            b2.ring();
        });
        let start = Instant::now();
        while !bell.rang_since(t) {
            bell.sleep(t, Duration::from_secs(10));
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        waker.join().unwrap();
    }

    #[test]
    fn sleep_times_out() {
        let bell = Doorbell::default();
        let start = Instant::now();
        bell.sleep(bell.token(), Duration::from_millis(20));
        assert!(start.elapsed() >= Duration::from_millis(15));
    }
}
