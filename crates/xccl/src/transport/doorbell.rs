//! A doorbell: how a rank that waits on memory-based links sleeps and is woken.
//!
//! One 32-bit word per rank, usable across processes (the futex calls are not private, so
//! the word may live in shared memory). Bit 0 says "the owner is going to sleep", bit 1
//! "always ring" (the owner cannot look at its links itself); the rest count rings.
//!
//! A waiting rank first polls its links; before it sleeps it *arms* the bell and looks at
//! its links once more. A writer that has just published data, or a reader that has just
//! freed space, *notifies* the rank on the other side: it reads the bell and rings it only
//! if it is armed, so a rank that is busy polling costs its peers one read instead of an
//! atomic read-modify-write. Either the writer sees the arm, or the sleeper's last look sees
//! the data: no wake-up is lost.
//!
//! That needs a full barrier between the notifier's store (the data) and its load (the bell),
//! and one between the sleeper's store (the arm) and its load (the data). Notifying happens on
//! every message and sleeping rarely, so the cost goes to the sleeper: where the kernel offers
//! it, arming issues `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, which runs a barrier on every
//! CPU that runs a registered process, and notifiers (registered) need no fence of their own.
//! Without it, notifiers fence.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering, compiler_fence, fence};
use std::time::Duration;

use rustix::thread::{MembarrierCommand, futex, membarrier, membarrier_query};

/// Whether this process runs the asymmetric protocol: registered for, and able to issue,
/// expedited global memory barriers.
fn asymmetric() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let q = membarrier_query();
        q.contains_command(MembarrierCommand::GlobalExpedited)
            && q.contains_command(MembarrierCommand::RegisterGlobalExpedited)
            && membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok()
    })
}

/// The sleeper's side of the barrier: after this, every store a notifier made before its
/// (unfenced) read of the bell is visible here. With the asymmetric protocol unavailable,
/// the atomic read-modify-write of arming was barrier enough.
fn sleeper_barrier() -> bool {
    !asymmetric() || membarrier(MembarrierCommand::GlobalExpedited).is_ok()
}

/// What [`Doorbell::arm`] returns, for [`Doorbell::sleep`]: the ring count when armed, and
/// whether the barrier protocol holds (if not, notifications may be missed, so the sleep is
/// kept short).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Armed {
    token: u32,
    sound: bool,
}

impl Armed {
    /// The ring count when the bell was armed.
    pub fn token(self) -> u32 {
        self.token
    }
}

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

    /// Marks the owner as going to sleep; pass the result to [`Doorbell::sleep`]. The owner
    /// must look at its links once more after arming.
    pub fn arm(&self) -> Armed {
        let token = self.word.fetch_or(ASLEEP, Ordering::SeqCst) & !FLAGS;
        Armed { token, sound: sleeper_barrier() }
    }

    /// Whether the owner is asleep, or about to be (armed).
    pub fn armed(&self) -> bool {
        self.word.load(Ordering::Relaxed) & ASLEEP != 0
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
        if asymmetric() {
            // The sleeper's membarrier orders our earlier stores before this load.
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        if self.word.load(Ordering::Relaxed) & FLAGS != 0 {
            self.ring();
        }
    }

    /// Sleeps until a ring after `armed` (from [`Doorbell::arm`]), or until `timeout`
    /// passes (at most a millisecond if the barrier protocol failed). Spurious returns are
    /// possible; callers look again.
    pub fn sleep(&self, armed: Armed, timeout: Duration) {
        let Armed { token, sound } = armed;
        let timeout = if sound { timeout } else { timeout.min(Duration::from_millis(1)) };
        let now = self.word.load(Ordering::SeqCst);
        if now & !FLAGS == token && now & ASLEEP != 0 {
            let ts = super::timespec(timeout);
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
        assert!(bell.rang_since(t.token()));
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
