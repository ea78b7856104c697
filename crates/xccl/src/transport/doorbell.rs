//! A doorbell: how a rank that waits on memory-based links sleeps and is woken.
//!
//! One 32-bit word per rank, usable across processes (the futex calls are not private, so
//! the word may live in shared memory). Bit 0 says "the owner is going to sleep", bit 1
//! "always ring" (the owner cannot look at its links itself); the rest count rings.
//!
//! A waiting rank first polls its links; before it sleeps it *arms* the bell and looks at
//! its links once more. A writer that has just published data, or a reader that has just
//! freed space, *notifies* the rank on the other side: after a full fence it reads the
//! bell and rings it only if it is armed, so a rank that is busy polling costs its peers one
//! read instead of an atomic read-modify-write. Either the writer sees the arm, or the
//! sleeper's last look sees the data: no wake-up is lost.

use std::sync::atomic::{AtomicU32, Ordering, fence};
use std::time::Duration;

use rustix::thread::futex;

const ASLEEP: u32 = 1;
const ALWAYS: u32 = 2;
const FLAGS: u32 = ASLEEP | ALWAYS;
const ONE_RING: u32 = 4;

/// A futex word that peers ring to wake its owner.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(crate) struct Doorbell {
    word: AtomicU32,
}

impl Doorbell {
    /// The current ring count.
    pub fn token(&self) -> u32 {
        self.word.load(Ordering::SeqCst) & !FLAGS
    }

    /// Whether the bell rang since `token` was taken.
    #[cfg(test)]
    pub fn rang_since(&self, token: u32) -> bool {
        self.token() != token
    }

    /// Marks the owner as going to sleep and returns the ring count to pass to
    /// [`Doorbell::sleep`]. The owner must look at its links once more after arming.
    pub fn arm(&self) -> u32 {
        self.word.fetch_or(ASLEEP, Ordering::SeqCst) & !FLAGS
    }

    /// Takes the mark back (the last look found work).
    pub fn disarm(&self) {
        self.word.fetch_and(!ASLEEP, Ordering::SeqCst);
    }

    /// Makes every [`Doorbell::notify`] ring, for an owner that sleeps without looking at
    /// its links (the bridge of a rank that also waits on sockets).
    pub fn ring_always(&self) {
        self.word.fetch_or(ALWAYS, Ordering::SeqCst);
    }

    /// Wakes the owner, unconditionally.
    pub fn ring(&self) {
        let before = self.word.fetch_add(ONE_RING, Ordering::SeqCst);
        if before & ASLEEP != 0 {
            self.word.fetch_and(!ASLEEP, Ordering::SeqCst);
            // An error here (EFAULT is impossible for a live reference) only means nobody woke.
            let _ = futex::wake(&self.word, futex::Flags::empty(), u32::MAX);
        }
    }

    /// Wakes the owner if it is going to sleep: what writers call after publishing.
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.word.load(Ordering::Relaxed) & FLAGS != 0 {
            self.ring();
        }
    }

    /// Sleeps until a ring after `token` (from [`Doorbell::arm`]), or until `timeout`
    /// passes. Spurious returns are possible; callers look again.
    pub fn sleep(&self, token: u32, timeout: Duration) {
        let now = self.word.load(Ordering::SeqCst);
        if now & !FLAGS == token && now & ASLEEP != 0 {
            let ts = futex::Timespec {
                tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
                tv_nsec: i64::from(timeout.subsec_nanos()),
            };
            // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: go and look again.
            let _ = futex::wait(&self.word, futex::Flags::empty(), now, Some(&ts));
        }
        self.disarm();
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
        let t = bell.arm();
        bell.notify();
        let start = Instant::now();
        bell.sleep(t, Duration::from_secs(5));
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(bell.rang_since(t));
    }

    #[test]
    fn notify_costs_nothing_unless_armed() {
        let bell = Doorbell::default();
        let t = bell.token();
        bell.notify();
        assert!(!bell.rang_since(t), "an unarmed bell is only read");
        bell.ring_always();
        bell.notify();
        assert!(bell.rang_since(t));
    }

    #[test]
    fn ring_wakes_a_sleeper() {
        let bell = Arc::new(Doorbell::default());
        let t = bell.token();
        let b2 = bell.clone();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            b2.notify();
        });
        let start = Instant::now();
        while !bell.rang_since(t) {
            let armed = bell.arm();
            bell.sleep(armed, Duration::from_secs(10));
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        waker.join().unwrap();
    }

    #[test]
    fn sleep_times_out() {
        let bell = Doorbell::default();
        let start = Instant::now();
        bell.sleep(bell.arm(), Duration::from_millis(20));
        assert!(start.elapsed() >= Duration::from_millis(15));
    }
}
