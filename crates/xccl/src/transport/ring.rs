//! Memory links: lock-free single-producer/single-consumer byte rings.
//!
//! A ring is a control block (two monotonically increasing byte counters, each on its own
//! cache line) and a power-of-two data array. The producer copies bytes in and publishes
//! them by advancing `head` (release); the consumer reads them in place, then frees them by
//! advancing `tail` (release). A consumer that reduces straight out of the ring saves the
//! copy a socket would need. The memory may be an ordinary heap allocation (ranks that are
//! threads) or a shared mapping (ranks that are processes): the ring only needs it to stay
//! put and to be touched by exactly one producer and one consumer.

use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::doorbell::Doorbell;
use super::ll::{LL_MAX_BYTES, LlChannel, LlRecv, LlRx, LlTx};
use super::pull::Pull;
use super::{Closed, Farewell, Link, PeerAborted, Within};

#[repr(C, align(64))]
#[derive(Debug, Default)]
struct Padded(AtomicU64);

/// Cursors of one ring, and the LL channel beside it.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct RingControl {
    /// Bytes ever written.
    head: Padded,
    /// Bytes ever read.
    tail: Padded,
    /// Small messages with their flags in the same cache lines.
    ll: LlChannel,
}

impl RingControl {
    /// Word `i` of the control block (0: `head`, 1: `tail`, then the LL channel's words),
    /// which a peer sharing the memory may write with anything: for the fuzzer, which plays
    /// such a peer.
    pub(crate) fn word(&self, i: usize) -> Option<&AtomicU64> {
        match i {
            0 => Some(&self.head.0),
            1 => Some(&self.tail.0),
            _ => self.ll.word(i - 2),
        }
    }
}

/// Longest abort reason kept in a [`PeerStatus`].
const REASON_CAP: usize = 1024;
const ALIVE: u32 = 0;
const CLOSED: u32 = 1;
const ABORTED: u32 = 2;
/// Set by a peer that found the process gone.
const VANISHED: u32 = 3;

/// Whether a rank on memory links is alive, closed or aborted (and why), in memory its peers
/// can read.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct PeerStatus {
    state: AtomicU32,
    origin: AtomicU32,
    len: AtomicU32,
    reason: [AtomicU8; REASON_CAP],
    /// The core the rank last waited on, plus one (0: not known).
    cpu: AtomicU32,
}

impl Default for PeerStatus {
    fn default() -> Self {
        PeerStatus {
            state: AtomicU32::new(ALIVE),
            origin: AtomicU32::new(0),
            len: AtomicU32::new(0),
            reason: [const { AtomicU8::new(0) }; REASON_CAP],
            cpu: AtomicU32::new(0),
        }
    }
}

impl PeerStatus {
    /// Records how this rank ends; the first call wins.
    pub fn set(&self, how: &Farewell) {
        match how {
            Farewell::Goodbye => self.store(CLOSED, 0, ""),
            Farewell::Abort { origin, reason } => self.store(ABORTED, *origin, reason),
        }
    }

    fn store(&self, state: u32, origin: usize, reason: &str) {
        if self.state.load(Ordering::Acquire) != ALIVE {
            return;
        }
        let bytes = reason.as_bytes();
        let n = bytes.len().min(REASON_CAP);
        for (slot, b) in self.reason.iter().zip(&bytes[..n]) {
            slot.store(*b, Ordering::Relaxed);
        }
        self.len.store(n as u32, Ordering::Relaxed);
        self.origin.store(origin as u32, Ordering::Relaxed);
        // Release: the reason is visible to whoever sees the new state.
        let _ = self.state.compare_exchange(ALIVE, state, Ordering::Release, Ordering::Relaxed);
    }

    /// Writes the status as a peer sharing the memory may, whatever it says (the reason's
    /// bytes from the first): for the fuzzer, which plays such a peer.
    pub(crate) fn forge(&self, state: u32, origin: u32, len: u32, reason: &[u8]) {
        for (slot, b) in self.reason.iter().zip(reason) {
            slot.store(*b, Ordering::Relaxed);
        }
        self.len.store(len, Ordering::Relaxed);
        self.origin.store(origin, Ordering::Relaxed);
        self.state.store(state, Ordering::Release);
    }

    /// Records, on behalf of a rank whose process is gone, that it vanished; unless it said
    /// how it ended first.
    pub fn set_vanished(&self, reason: &str) {
        self.store(VANISHED, 0, reason);
    }

    /// Records the core the rank waits on (see `transport::idle`).
    pub fn set_cpu(&self, cpu: Option<usize>) {
        let word = cpu.and_then(|c| u32::try_from(c + 1).ok()).unwrap_or(0);
        self.cpu.store(word, Ordering::Relaxed);
    }

    /// The core the rank last waited on, if known.
    pub fn cpu(&self) -> Option<usize> {
        (self.cpu.load(Ordering::Relaxed) as usize).checked_sub(1)
    }

    /// How the rank ended, or `None` while it is alive.
    pub fn get(&self) -> Option<Closed> {
        match self.state.load(Ordering::Acquire) {
            ALIVE => None,
            CLOSED => Some(Closed::Goodbye),
            state => {
                let n = (self.len.load(Ordering::Relaxed) as usize).min(REASON_CAP);
                let bytes: Vec<u8> = self.reason[..n].iter().map(|b| b.load(Ordering::Relaxed)).collect();
                let origin = self.origin.load(Ordering::Relaxed) as usize;
                let reason = String::from_utf8_lossy(&bytes).into_owned();
                if state == VANISHED {
                    Some(Closed::Vanished(reason))
                } else {
                    Some(Closed::Aborted { origin, reason })
                }
            }
        }
    }
}

/// Owner of the memory that rings, doorbells and statuses live in.
pub(crate) trait RingHost: Send + Sync {
    /// How many members share the host's memory.
    fn members(&self) -> usize;
    /// The doorbell of `rank`.
    fn bell(&self, rank: usize) -> &Doorbell;
    /// The status of `rank`.
    fn status(&self, rank: usize) -> &PeerStatus;
    /// Whether, and how, member `reader` can read member `writer`'s memory.
    fn pull(&self, reader: usize, writer: usize) -> Option<Pull>;
}

/// Raw view of one ring's memory.
#[derive(Copy, Clone, Debug)]
pub(crate) struct RingMem {
    ctrl: *const RingControl,
    data: *mut u8,
    cap: usize,
}

impl RingMem {
    /// # Safety
    /// `ctrl` must point to an initialised `RingControl` and `data` to `cap` bytes, both
    /// valid, and left in place, for as long as any `RingTx`/`RingRx` made from this view is
    /// used; `cap` must be a power of two and a multiple of 8. At most one `RingTx` and one
    /// `RingRx` may ever be made from one ring.
    pub unsafe fn new(ctrl: *const RingControl, data: *mut u8, cap: usize) -> RingMem {
        debug_assert!(cap.is_power_of_two() && cap >= 8);
        RingMem { ctrl, data, cap }
    }

    fn ctrl(&self) -> &RingControl {
        // SAFETY: `RingMem::new`'s contract keeps the control block valid while views are used.
        unsafe { &*self.ctrl }
    }
}

/// The producer end of a ring.
pub(crate) struct RingTx {
    mem: RingMem,
    head: u64,
    tail_seen: u64,
    ll: LlTx,
}

// SAFETY: the producer end is used by one thread at a time (it is moved, not shared); the
// memory it points to outlives it by `RingMem::new`'s contract.
unsafe impl Send for RingTx {}

impl RingTx {
    /// Bytes the ring holds.
    pub fn capacity(&self) -> usize {
        self.mem.cap
    }

    pub fn new(mem: RingMem) -> RingTx {
        let head = mem.ctrl().head.0.load(Ordering::Relaxed);
        // SAFETY: the channel lies in the control block, valid as long as this end by
        // `RingMem::new`'s contract, which also allows only one producer per ring.
        let ll = unsafe { LlTx::new(&raw const mem.ctrl().ll) };
        RingTx { mem, head, tail_seen: mem.ctrl().tail.0.load(Ordering::Acquire), ll }
    }

    /// Bytes free as the consumer's `tail` last seen says. The consumer shares the memory
    /// and may write anything there: a `tail` ahead of `head`, or more than a ring behind,
    /// leaves no room (the counters wrap rather than overflow, whatever their values).
    fn free(&self) -> u64 {
        (self.mem.cap as u64).saturating_sub(self.head.wrapping_sub(self.tail_seen))
    }

    /// Whether `bytes` fit now.
    pub fn room_for(&mut self, bytes: usize) -> bool {
        if self.free() < bytes as u64 {
            self.tail_seen = self.mem.ctrl().tail.0.load(Ordering::Acquire);
        }
        self.free() >= bytes as u64
    }

    /// Copies as much of `parts` as fits; returns the bytes written.
    pub fn write(&mut self, parts: &[IoSlice<'_>]) -> usize {
        let want: usize = parts.iter().map(|p| p.len()).sum();
        let cap = self.mem.cap as u64;
        if self.free() < want as u64 {
            self.tail_seen = self.mem.ctrl().tail.0.load(Ordering::Acquire);
        }
        let room = self.free() as usize;
        let mut left = want.min(room);
        let total = left;
        let mut pos = self.head;
        for part in parts {
            if left == 0 {
                break;
            }
            let mut src = &part[..part.len().min(left)];
            left -= src.len();
            while !src.is_empty() {
                let at = (pos % cap) as usize;
                let n = src.len().min(self.mem.cap - at);
                // SAFETY: `at + n <= cap`, so the destination lies in the data array; these
                // bytes are free (head - tail <= cap after this write), so the consumer does
                // not read them until `head` is published below.
                unsafe { crate::copy::copy_raw(self.mem.data.add(at), src.as_ptr(), n) };
                src = &src[n..];
                pos = pos.wrapping_add(n as u64);
            }
        }
        self.head = self.head.wrapping_add(total as u64);
        self.mem.ctrl().head.0.store(self.head, Ordering::Release);
        total
    }
}

/// The consumer end of a ring.
pub(crate) struct RingRx {
    mem: RingMem,
    tail: u64,
    head_seen: u64,
    ll: LlRx,
}

// SAFETY: as for `RingTx`.
unsafe impl Send for RingRx {}

impl RingRx {
    pub fn new(mem: RingMem) -> RingRx {
        let tail = mem.ctrl().tail.0.load(Ordering::Relaxed);
        // SAFETY: as for the producer's end; one consumer per ring.
        let ll = unsafe { LlRx::new(&raw const mem.ctrl().ll) };
        RingRx { mem, tail, head_seen: mem.ctrl().head.0.load(Ordering::Acquire), ll }
    }

    /// Hints the processor to fetch the first bytes the next message will occupy, so that when
    /// the producer has written them they are read from this core's cache instead of missing
    /// once more after `head` shows they are there. Called by a consumer that found nothing:
    /// it is polling anyway.
    fn prefetch_next(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let at = (self.tail % self.mem.cap as u64) as usize;
            // A frame header spans two cache lines.
            for line in [at, (at + 64) % self.mem.cap] {
                // SAFETY: `line < cap`, so the address lies in the data array; a prefetch only
                // hints the cache and never faults or changes memory.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(self.mem.data.add(line).cast::<i8>()) };
            }
        }
    }

    /// Bytes readable as the producer's `head` last seen says. The producer shares the
    /// memory and may write anything there: never more than the ring holds is read, so a
    /// `head` behind `tail` or more than a ring ahead yields at most a ring of its bytes.
    fn published(&self) -> usize {
        self.head_seen.wrapping_sub(self.tail).min(self.mem.cap as u64) as usize
    }

    fn available(&mut self, want: usize) -> usize {
        if self.published() < want {
            self.head_seen = self.mem.ctrl().head.0.load(Ordering::Acquire);
        }
        self.published()
    }

    /// Hands up to `max` readable bytes to `f` in at most two contiguous pieces and frees them.
    fn consume(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        let n = self.available(max).min(max);
        if n == 0 {
            self.prefetch_next();
            return 0;
        }
        let at = (self.tail % self.mem.cap as u64) as usize;
        let first = n.min(self.mem.cap - at);
        // SAFETY: bytes [tail, tail + n) were published by the producer (n <= head - tail, read
        // with acquire) and are not overwritten until `tail` is advanced below.
        unsafe {
            f(std::slice::from_raw_parts(self.mem.data.add(at), first));
            if n > first {
                f(std::slice::from_raw_parts(self.mem.data, n - first));
            }
        }
        self.tail = self.tail.wrapping_add(n as u64);
        self.mem.ctrl().tail.0.store(self.tail, Ordering::Release);
        n
    }

    /// Copies up to `dst.len()` bytes out.
    pub fn read(&mut self, dst: &mut [u8]) -> usize {
        let mut filled = 0;
        self.consume(dst.len(), &mut |piece| {
            crate::copy::copy(&mut dst[filled..filled + piece.len()], piece);
            filled += piece.len();
        })
    }

    /// Hands up to `max` bytes, rounded down to a multiple of `align`, to `f` in place.
    pub fn read_with(&mut self, max: usize, align: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        let n = self.available(max).min(max);
        self.consume(n - n % align, f)
    }
}

/// A link to a peer over two rings in memory.
pub(crate) struct RingLink {
    tx: RingTx,
    rx: RingRx,
    me: usize,
    peer: usize,
    host: Arc<dyn RingHost>,
}

impl RingLink {
    pub fn new(tx: RingTx, rx: RingRx, me: usize, peer: usize, host: Arc<dyn RingHost>) -> RingLink {
        RingLink { tx, rx, me, peer, host }
    }

    fn peer_gone(&self) -> Option<Closed> {
        self.host.status(self.peer).get()
    }

    fn eof(&self, how: &Closed) -> io::Error {
        match how {
            Closed::Goodbye => io::Error::new(io::ErrorKind::UnexpectedEof, "closed its communicator"),
            Closed::Aborted { origin, reason } => io::Error::new(
                io::ErrorKind::ConnectionAborted,
                PeerAborted { origin: *origin, reason: reason.clone() },
            ),
            Closed::Vanished(r) => io::Error::new(io::ErrorKind::UnexpectedEof, r.clone()),
        }
    }

    /// Reads with `f`; at the end of the stream (nothing left and the peer gone) an error.
    fn read_or_eof(&mut self, mut f: impl FnMut(&mut RingRx) -> usize) -> io::Result<usize> {
        let n = f(&mut self.rx);
        if n > 0 {
            self.host.bell(self.peer).notify();
            return Ok(n);
        }
        if let Some(how) = self.peer_gone() {
            // The peer may have written its last bytes just before it left: look once more.
            let n = f(&mut self.rx);
            if n == 0 {
                return Err(self.eof(&how));
            }
            return Ok(n);
        }
        Ok(0)
    }
}

impl Link for RingLink {
    fn write(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        let n = self.tx.write(parts);
        if n > 0 {
            self.host.bell(self.peer).notify();
            return Ok(n);
        }
        // A full ring stays full if the peer is gone: say so. (Bytes written to a peer that
        // has just gone are harmless; its absence shows at the next read or wait.)
        match self.peer_gone() {
            Some(how) => Err(self.eof(&how)),
            None => Ok(0),
        }
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.read_or_eof(|rx| rx.read(dst))
    }

    fn read_with(&mut self, max: usize, align: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.read_or_eof(|rx| rx.read_with(max, align, f))
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn max_frame(&self) -> usize {
        // A quarter ring: the reader drains one frame while the writer fills the next.
        self.tx.capacity() / 4
    }

    fn room_for(&mut self, bytes: usize) -> bool {
        self.tx.room_for(bytes)
    }

    fn holds(&mut self, bytes: usize) -> bool {
        let there = self.rx.available(bytes) >= bytes;
        if !there {
            self.rx.prefetch_next();
        }
        there
    }

    fn pull_from_peer(&self) -> Option<Pull> {
        self.host.pull(self.me, self.peer)
    }

    fn peer_pulls(&self) -> bool {
        self.host.pull(self.peer, self.me).is_some()
    }

    fn hangup(&mut self, _at: Within<'_>) -> io::Result<Option<Closed>> {
        Ok(self.peer_gone())
    }

    fn close(&mut self, farewell: &Farewell, _at_boundary: bool, _patience: Duration) {
        self.host.status(self.me).set(farewell);
        self.host.bell(self.peer).ring();
    }

    fn ll_max(&self) -> usize {
        LL_MAX_BYTES
    }

    fn ll_send(&mut self, label: [u64; 2], payload: &[u8]) -> io::Result<bool> {
        if payload.len() > LL_MAX_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("LL message longer than {LL_MAX_BYTES} bytes"),
            ));
        }
        if self.tx.ll.send(label, payload) {
            self.host.bell(self.peer).notify();
            return Ok(true);
        }
        // A full channel stays full if the peer is gone: say so.
        match self.peer_gone() {
            Some(how) => Err(self.eof(&how)),
            None => Ok(false),
        }
    }

    fn ll_recv(&mut self, label: [u64; 2], len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<LlRecv> {
        if len > LL_MAX_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("LL message longer than {LL_MAX_BYTES} bytes"),
            ));
        }
        match self.rx.ll.recv(label, len, f) {
            LlRecv::Done => {
                self.host.bell(self.peer).notify();
                Ok(LlRecv::Done)
            }
            LlRecv::Empty => match self.peer_gone() {
                // The peer may have written its last message just before it left.
                Some(how) => match self.rx.ll.recv(label, len, f) {
                    LlRecv::Empty => Err(self.eof(&how)),
                    found => Ok(found),
                },
                None => Ok(LlRecv::Empty),
            },
            other => Ok(other),
        }
    }

    fn ll_pending(&mut self) -> bool {
        self.rx.ll.pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem {
        ctrl: RingControl,
        data: Vec<u64>,
    }

    fn ring(cap: usize) -> (Box<Mem>, RingTx, RingRx) {
        let mut m = Box::new(Mem { ctrl: RingControl::default(), data: vec![0u64; cap / 8] });
        // SAFETY: the boxed memory outlives the two ends in every test, which make one each.
        let mem = unsafe { RingMem::new(&m.ctrl, m.data.as_mut_ptr().cast(), cap) };
        (m, RingTx::new(mem), RingRx::new(mem))
    }

    #[test]
    fn counters_a_peer_forged_never_reach_outside_the_ring() {
        // Found by the fuzzer (`fuzz/fuzz_targets/ll.rs`): the counters live in memory the
        // peer shares. A producer's `head` more than a ring ahead of the consumer made a read
        // run past the ring's end; one behind it, or a consumer's `tail` ahead of `head`, an
        // arithmetic overflow. Now every read stays within the ring, and a forged `tail`
        // leaves no room.
        let (m, _tx, mut rx) = ring(64);
        let mut buf = [0u8; 200];
        for head in [1000, 3, u64::MAX] {
            m.ctrl.head.0.store(head, Ordering::Release);
            assert!(rx.read(&mut buf) <= 64);
            let mut total = 0;
            rx.read_with(200, 8, &mut |p| total += p.len());
            assert!(total <= 64);
        }
        let (m, mut tx2, mut rx2) = ring(64);
        for _ in 0..2 {
            assert_eq!(tx2.write(&[IoSlice::new(&[1; 64])]), 64);
            assert_eq!(rx2.read(&mut buf), 64);
        }
        // Ahead of `head`, then more than a ring behind it.
        for tail in [u64::MAX, 200, 0] {
            m.ctrl.tail.0.store(tail, Ordering::Release);
            assert!(!tx2.room_for(1), "tail {tail}");
            assert_eq!(tx2.write(&[IoSlice::new(&[1; 8])]), 0, "tail {tail}");
        }
        m.ctrl.tail.0.store(128, Ordering::Release);
        assert!(tx2.room_for(64), "honest again");
    }

    #[test]
    fn bytes_come_out_in_order_across_wraps() {
        let (_m, mut tx, mut rx) = ring(64);
        let mut next_in = 0u8;
        let mut next_out = 0u8;
        for round in 0..200 {
            let chunk: Vec<u8> = (0..(round % 50) as u8).map(|i| next_in.wrapping_add(i)).collect();
            let n =
                tx.write(&[IoSlice::new(&chunk[..chunk.len() / 2]), IoSlice::new(&chunk[chunk.len() / 2..])]);
            next_in = next_in.wrapping_add(n as u8);
            let mut buf = [0u8; 40];
            let got = rx.read(&mut buf[..(round % 40) + 1]);
            for b in &buf[..got] {
                assert_eq!(*b, next_out);
                next_out = next_out.wrapping_add(1);
            }
        }
    }

    #[test]
    fn writer_stops_when_full_and_reader_sees_aligned_pieces() {
        let (_m, mut tx, mut rx) = ring(32);
        assert_eq!(tx.write(&[IoSlice::new(&[1u8; 24])]), 24);
        assert_eq!(tx.write(&[IoSlice::new(&[2u8; 24])]), 8);
        assert_eq!(tx.write(&[IoSlice::new(&[3u8; 1])]), 0);
        let mut pieces = Vec::new();
        assert_eq!(rx.read_with(20, 8, &mut |p| pieces.push(p.len())), 16);
        assert_eq!(tx.write(&[IoSlice::new(&[4u8; 16])]), 16);
        // 16 bytes unread before the wrap, 16 after it.
        assert_eq!(rx.read_with(64, 8, &mut |p| pieces.push(p.len())), 32);
        assert_eq!(pieces, vec![16, 16, 16]);
    }

    #[test]
    fn status_keeps_the_first_farewell() {
        let s = PeerStatus::default();
        assert_eq!(s.get(), None);
        s.set(&Farewell::Abort { origin: 3, reason: "disk on fire".into() });
        s.set(&Farewell::Goodbye);
        let want = Closed::Aborted { origin: 3, reason: "disk on fire".into() };
        assert_eq!(s.get(), Some(want));
    }
}
