//! The LL channel: a small channel beside each ring in which flag and data share a cache
//! line, so that a receiver polls the data itself and a small message costs about one
//! cache-line transfer, with no header and no separate counter to publish (the idea of
//! NCCL's LL protocol).
//!
//! A channel is [`LL_LINES`] lines of 64 bytes and a `consumed` counter on a line of its own.
//! Words 0-6 of a line carry data, word 7 its flag: the line's sequence number on the
//! channel (the `k`-th line ever written carries `k`, from 1, so the zeroed memory of a new
//! channel matches nothing). The writer stores the data words, then the flag with release
//! ordering; the reader loads the flag with acquire ordering, then the data. Line `k` lives
//! at index `(k - 1) % LL_LINES` and may be written once the reader has consumed line
//! `k - LL_LINES` and published it (`consumed` moves in batches of `PUBLISH` lines).
//!
//! A message is a label of two words (opaque here: the executor's operation signature)
//! and its payload: its first line carries the label and 40 payload bytes, each further line
//! 56. A message is written whole or not at all, and read only once its last line has
//! arrived; it is handed to the reader in one piece.

use std::sync::atomic::{AtomicU64, Ordering};

/// Lines per channel.
pub(crate) const LL_LINES: usize = 64;
/// The reader publishes `consumed` once per this many lines read, not after every message:
/// a writer that keeps the channel full would otherwise reload the counter on every send
/// and the reader store it again, moving its cache line between the two cores once per
/// message. A writer waits at most this many lines more for room, and the channel never
/// deadlocks: what the reader holds back (under `PUBLISH` lines) and the longest message
/// (`lines_for(LL_MAX_BYTES)`) fit in it together (checked below).
const PUBLISH: u64 = 16;
/// The most payload bytes one LL message may carry.
pub(crate) const LL_MAX_BYTES: usize = crate::protocol::LL_MAX;

/// Payload bytes in the first line of a message (after the two label words).
const FIRST: usize = 40;
/// Payload bytes in every further line.
const REST: usize = 56;

/// One cache line: seven data words and the flag.
#[repr(C, align(64))]
#[derive(Debug, Default)]
struct Line([AtomicU64; 8]);

/// The shared memory of one channel (one direction between two ranks).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct LlChannel {
    lines: [Line; LL_LINES],
    /// Lines ever read, written by the reader.
    consumed: Line,
}

impl Default for LlChannel {
    fn default() -> Self {
        LlChannel { lines: std::array::from_fn(|_| Line::default()), consumed: Line::default() }
    }
}

/// What [`LlRx::recv`] found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum LlRecv {
    /// Nothing, or not the whole message yet.
    Empty,
    /// The message was read and handed over.
    Done,
    /// The next message carries this other label; nothing was consumed.
    Other([u64; 2]),
}

/// Lines a message of `len` payload bytes takes.
fn lines_for(len: usize) -> u64 {
    1 + len.saturating_sub(FIRST).div_ceil(REST) as u64
}

// Held-back lines and the longest message fit in the channel together (see `PUBLISH`).
const _: () = assert!(PUBLISH + 1 + (LL_MAX_BYTES - FIRST).div_ceil(REST) as u64 <= LL_LINES as u64);

/// Words in a channel's memory (its lines, then `consumed`'s line).
pub(crate) const LL_WORDS: usize = (LL_LINES + 1) * 8;

impl LlChannel {
    fn line(&self, seq: u64) -> &Line {
        &self.lines[(seq.wrapping_sub(1) % LL_LINES as u64) as usize]
    }

    /// Word `i` of the channel's memory (word `i % 8` of line `i / 8`, `consumed`'s line
    /// last), which a peer sharing the memory may write with anything: for the fuzzer,
    /// which plays such a peer.
    pub(crate) fn word(&self, i: usize) -> Option<&AtomicU64> {
        let line = if i / 8 == LL_LINES { &self.consumed } else { self.lines.get(i / 8)? };
        Some(&line.0[i % 8])
    }
}

/// The writing end of a channel.
pub(crate) struct LlTx {
    chan: *const LlChannel,
    /// Lines ever written.
    written: u64,
    /// The reader's `consumed`, as last seen.
    consumed_seen: u64,
}

// SAFETY: the writing end is used by one thread at a time (it is moved, not shared); the
// channel it points to outlives it by `LlTx::new`'s contract.
unsafe impl Send for LlTx {}

impl LlTx {
    /// # Safety
    /// `chan` must point to a channel that stays valid for as long as this end is used, and
    /// at most one writing end may ever be made for it.
    pub unsafe fn new(chan: *const LlChannel) -> LlTx {
        // SAFETY: forwarded to the caller.
        let consumed = unsafe { &*chan }.consumed.0[0].load(Ordering::Acquire);
        LlTx { chan, written: consumed, consumed_seen: consumed }
    }

    fn chan(&self) -> &LlChannel {
        // SAFETY: `new`'s contract keeps the channel valid while this end is used.
        unsafe { &*self.chan }
    }

    /// Writes one message labelled `label` with `payload` (at most [`LL_MAX_BYTES`]) if the
    /// channel has room for all of it; false, having written nothing, otherwise.
    pub fn send(&mut self, label: [u64; 2], payload: &[u8]) -> bool {
        if payload.len() > LL_MAX_BYTES {
            return false;
        }
        let need = lines_for(payload.len());
        // The reader shares the memory and may write anything in `consumed`: one ahead of
        // what was written, or more than a channel behind, leaves no room (the counters
        // wrap rather than overflow, whatever their values).
        let full = |seen: u64| self.written.wrapping_add(need).wrapping_sub(seen) > LL_LINES as u64;
        if full(self.consumed_seen) {
            self.consumed_seen = self.chan().consumed.0[0].load(Ordering::Acquire);
            if full(self.consumed_seen) {
                return false;
            }
        }
        let mut words = payload.chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        });
        for k in 0..need {
            let seq = self.written.wrapping_add(1 + k);
            let line = &self.chan().line(seq).0;
            let first = if k == 0 {
                line[0].store(label[0], Ordering::Relaxed);
                line[1].store(label[1], Ordering::Relaxed);
                2
            } else {
                0
            };
            for w in &line[first..7] {
                w.store(words.next().unwrap_or(0), Ordering::Relaxed);
            }
            line[7].store(seq, Ordering::Release);
        }
        self.written = self.written.wrapping_add(need);
        true
    }
}

/// The reading end of a channel.
pub(crate) struct LlRx {
    chan: *const LlChannel,
    /// Lines ever read.
    read: u64,
    /// Where a message is gathered before it is handed over.
    gather: Vec<u64>,
}

// SAFETY: as for `LlTx`.
unsafe impl Send for LlRx {}

impl LlRx {
    /// # Safety
    /// As for [`LlTx::new`], for the reading end.
    pub unsafe fn new(chan: *const LlChannel) -> LlRx {
        // SAFETY: forwarded to the caller.
        let read = unsafe { &*chan }.consumed.0[0].load(Ordering::Acquire);
        LlRx { chan, read, gather: Vec::with_capacity(LL_LINES * 7) }
    }

    fn chan(&self) -> &LlChannel {
        // SAFETY: `new`'s contract keeps the channel valid while this end is used.
        unsafe { &*self.chan }
    }

    /// Whether a message has begun to arrive and has not been read.
    pub fn pending(&self) -> bool {
        let seq = self.read.wrapping_add(1);
        self.chan().line(seq).0[7].load(Ordering::Acquire) == seq
    }

    /// Reads the next message if it is labelled `label`, has `len` payload bytes (at most
    /// [`LL_MAX_BYTES`]) and has arrived whole, handing its payload to `f` in one piece.
    pub fn recv(&mut self, label: [u64; 2], len: usize, f: &mut dyn FnMut(&[u8])) -> LlRecv {
        // `read` began as the shared `consumed`, which a peer may have set to anything:
        // the counters wrap rather than overflow.
        let first = self.read.wrapping_add(1);
        let head = &self.chan().line(first).0;
        if head[7].load(Ordering::Acquire) != first {
            return LlRecv::Empty;
        }
        let theirs = [head[0].load(Ordering::Relaxed), head[1].load(Ordering::Relaxed)];
        if theirs != label {
            return LlRecv::Other(theirs);
        }
        let need = lines_for(len);
        let last = first.wrapping_add(need - 1);
        if need > 1 && self.chan().line(last).0[7].load(Ordering::Acquire) != last {
            return LlRecv::Empty;
        }
        // Gathered first, then handed over in one piece: one call to reduce, not one per line.
        // SAFETY: `new`'s contract keeps the channel valid while this end is used; taken
        // apart from `self` so that `gather` can be filled meanwhile.
        let chan = unsafe { &*self.chan };
        self.gather.clear();
        for k in 0..need {
            let line = &chan.line(first.wrapping_add(k)).0;
            let from = if k == 0 { 2 } else { 0 };
            self.gather.extend(line[from..7].iter().map(|w| w.load(Ordering::Relaxed)));
        }
        let bytes: &[u8] = bytemuck::cast_slice(&self.gather);
        f(&bytes[..len]);
        let before = self.read;
        self.read = self.read.wrapping_add(need);
        if before / PUBLISH != self.read / PUBLISH {
            self.chan().consumed.0[0].store(self.read, Ordering::Release);
        }
        LlRecv::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Box<LlChannel>, LlTx, LlRx) {
        let chan = Box::new(LlChannel::default());
        let p: *const LlChannel = &*chan;
        // SAFETY: the boxed channel outlives both ends in every test, which make one each.
        unsafe { (chan, LlTx::new(p), LlRx::new(p)) }
    }

    fn message(len: usize, salt: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + salt * 7) as u8).collect()
    }

    fn take(rx: &mut LlRx, label: [u64; 2], len: usize) -> (LlRecv, Vec<u8>, Vec<usize>) {
        let (mut got, mut pieces) = (Vec::new(), Vec::new());
        let r = rx.recv(label, len, &mut |p| {
            pieces.push(p.len());
            got.extend_from_slice(p);
        });
        (r, got, pieces)
    }

    #[test]
    fn messages_of_every_size_come_out_in_order_across_many_wraps() {
        let (_c, mut tx, mut rx) = pair();
        for round in 0..400usize {
            let len = [0, 1, 8, 40, 41, 96, 97, 200, LL_MAX_BYTES][round % 9];
            let msg = message(len, round);
            let label = [round as u64, 1 << 63];
            assert!(tx.send(label, &msg), "round {round}");
            assert!(rx.pending());
            let (r, got, pieces) = take(&mut rx, label, len);
            assert_eq!(r, LlRecv::Done);
            assert_eq!(got, msg, "round {round}");
            assert_eq!(pieces, vec![len], "one piece");
            assert!(!rx.pending());
        }
    }

    #[test]
    fn counters_a_peer_forged_wrap_instead_of_overflowing() {
        // Found by the fuzzer (`fuzz/fuzz_targets/ll.rs`): `consumed` lives in memory the peer
        // shares, and both ends start from it. Near the end of the counters' range, messages
        // still pass across the wrap; a `consumed` ahead of what was written, or far behind,
        // leaves no room; nothing overflows.
        let chan = Box::new(LlChannel::default());
        chan.consumed.0[0].store(u64::MAX, Ordering::Release);
        let p: *const LlChannel = &*chan;
        // SAFETY: the boxed channel outlives both ends, made once each.
        let (mut tx, mut rx) = unsafe { (LlTx::new(p), LlRx::new(p)) };
        for k in 0..3u64 {
            assert!(tx.send([k, 1], &[k as u8; 50]));
            assert_eq!(take(&mut rx, [k, 1], 50), (LlRecv::Done, vec![k as u8; 50], vec![50]));
        }
        assert_eq!(tx.written, 5, "wrapped");
        // The writer looks at `consumed` again when the channel seems full: then it finds
        // no room, never a channel more.
        for forged in [tx.written + 100, tx.written.wrapping_sub(100), u64::MAX] {
            chan.consumed.0[0].store(forged, Ordering::Release);
            let sent = (0..2 * LL_LINES).take_while(|_| tx.send([9, 9], &[1; 8])).count();
            assert!(sent <= LL_LINES, "consumed {forged}: {sent} lines sent");
            assert!(!tx.send([9, 9], &[1; 8]));
        }
        chan.consumed.0[0].store(tx.written, Ordering::Release);
        assert!(tx.send([9, 9], &[1; 8]), "honest again");
    }

    #[test]
    fn the_reader_publishes_in_batches_and_an_emptied_channel_always_has_room() {
        let (chan, mut tx, mut rx) = pair();
        let published = || chan.consumed.0[0].load(Ordering::Acquire);
        // Single lines read one by one: `consumed` moves once per PUBLISH lines.
        for k in 0..PUBLISH - 1 {
            assert!(tx.send([k, 0], &[1; 8]));
            assert_eq!(take(&mut rx, [k, 0], 8).0, LlRecv::Done);
        }
        assert_eq!(published(), 0, "held back");
        assert!(tx.send([7, 7], &[1; 8]));
        assert_eq!(take(&mut rx, [7, 7], 8).0, LlRecv::Done);
        assert_eq!(published(), PUBLISH);
        // Filled until refused, then emptied, with messages of every length across many
        // wraps: whatever the reader holds back, the longest message always fits again.
        for round in 0..200usize {
            let len = [1, 41, 97, 200, LL_MAX_BYTES][round % 5];
            let mut sent = 0u64;
            while tx.send([round as u64, sent], &message(len, round)) {
                sent += 1;
            }
            assert!(sent > 0, "round {round}: an empty channel refused a message");
            for k in 0..sent {
                assert_eq!(take(&mut rx, [round as u64, k], len).1, message(len, round));
            }
            assert!(tx.send([1, 1], &message(LL_MAX_BYTES, 3)), "round {round}: no room");
            assert_eq!(take(&mut rx, [1, 1], LL_MAX_BYTES).1, message(LL_MAX_BYTES, 3));
        }
    }

    #[test]
    fn a_full_channel_refuses_and_a_wrong_label_consumes_nothing() {
        let (_c, mut tx, mut rx) = pair();
        let big = message(LL_MAX_BYTES, 1);
        // Twelve messages of five lines fill sixty of the sixty-four lines: another of the
        // same size does not fit, a two-line one does.
        for k in 0..12 {
            assert!(tx.send([1, k], &big), "{k}");
        }
        assert!(!tx.send([2, 2], &big));
        assert!(tx.send([3, 3], &message(60, 2)));
        for k in 0..11 {
            assert_eq!(take(&mut rx, [1, k], LL_MAX_BYTES).1, big);
        }
        assert_eq!(take(&mut rx, [9, 9], LL_MAX_BYTES).0, LlRecv::Other([1, 11]));
        assert_eq!(take(&mut rx, [1, 11], LL_MAX_BYTES).1, big);
        assert!(tx.send([2, 2], &big));
        assert_eq!(take(&mut rx, [3, 3], 60).1, message(60, 2));
        assert_eq!(take(&mut rx, [2, 2], LL_MAX_BYTES).1, big);
        assert_eq!(take(&mut rx, [2, 2], 8).0, LlRecv::Empty);
    }

    #[test]
    fn two_threads_pass_many_messages_intact() {
        let (chan, mut tx, mut rx) = pair();
        let n = 100_000usize;
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..n {
                    let msg = message((i * 37) % (LL_MAX_BYTES + 1), i);
                    while !tx.send([i as u64, 7], &msg) {
                        std::hint::spin_loop();
                    }
                }
            });
            for i in 0..n {
                let len = (i * 37) % (LL_MAX_BYTES + 1);
                loop {
                    let (r, got, _) = take(&mut rx, [i as u64, 7], len);
                    if r == LlRecv::Done {
                        assert_eq!(got, message(len, i), "message {i}");
                        break;
                    }
                    assert_eq!(r, LlRecv::Empty, "message {i}");
                    std::hint::spin_loop();
                }
            }
        });
        drop(chan);
    }
}
