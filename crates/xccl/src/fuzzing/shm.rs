//! The shared-memory link under a peer that may write anything into the memory the two
//! share: rank 0's real [`RingLink`] reads its ring, LL channel and the peer's status while
//! a script plays rank 1, sometimes through its own link (honest sends and reads),
//! sometimes by storing any value into any word. What rank 0 is handed must keep the
//! link's promises: no more bytes than asked, pieces of whole elements, LL messages whole.

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::exec::fuzzing::ll_label;
use crate::transport::doorbell::Doorbell;
use crate::transport::ll::{LL_MAX_BYTES, LL_WORDS};
use crate::transport::pull::Pull;
use crate::transport::ring::{PeerStatus, RingControl, RingHost, RingLink, RingMem, RingRx, RingTx};
use crate::transport::{Farewell, Link, LlRecv, Within};

/// Bytes in each ring: small, so that scripts wrap around it.
const CAP: usize = 256;
/// Most script steps run per input.
const STEPS: usize = 4096;

/// The memory two ranks share: per rank a doorbell and a status, per direction a ring
/// (`rings[r]` carries rank `r`'s bytes to the other).
#[derive(Default)]
struct Shared {
    bells: [Doorbell; 2],
    status: [PeerStatus; 2],
    rings: [RingControl; 2],
    data: [[AtomicU64; CAP / 8]; 2],
}

impl RingHost for Shared {
    fn members(&self) -> usize {
        2
    }
    fn bell(&self, rank: usize) -> &Doorbell {
        &self.bells[rank]
    }
    fn status(&self, rank: usize) -> &PeerStatus {
        &self.status[rank]
    }
    fn pull(&self, _reader: usize, _writer: usize) -> Option<Pull> {
        None
    }
}

/// The link of `rank` over `shared`.
fn link(shared: &Arc<Shared>, rank: usize) -> RingLink {
    let ring = |from: usize| {
        let data = shared.data[from].as_ptr().cast::<u8>().cast_mut();
        // SAFETY: the control block and the `CAP` bytes of ring `from` live in `shared`, which
        // each link keeps alive through its `Arc`; the memory is atomics, written only
        // through them or the ring's views. `CAP` is a power of two and a multiple of 8.
        // Ring `from` gets one producer (rank `from`'s link) and one consumer (the other's).
        unsafe { RingMem::new(&shared.rings[from], data, CAP) }
    };
    let host: Arc<dyn RingHost> = shared.clone();
    RingLink::new(RingTx::new(ring(rank)), RingRx::new(ring(1 - rank)), rank, 1 - rank, host)
}

/// The script, read a field at a time; zeros once it is spent.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> usize {
        usize::from(u16::from_le_bytes([self.u8(), self.u8()]))
    }
    fn u64(&mut self) -> u64 {
        let mut w = [0u8; 8];
        let b = self.bytes(8);
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    }
    fn label(&mut self) -> [u64; 2] {
        [self.u64(), self.u64()]
    }
}

/// The peer stores anything in a word of either ring's control block: the head and LL
/// lines of its ring to this side, the tail and LL counter of this side's ring to it.
fn forge_word(shared: &Shared, s: &mut Script<'_>) {
    let ring = usize::from(s.u8() & 1);
    let i = s.u16() % (2 + LL_WORDS);
    let v = s.u64();
    if let Some(w) = shared.rings[ring].word(i) {
        w.store(v, Ordering::Release);
    }
}

/// Runs one script (see [`super::ll`]): its first byte says how many words the peer forges
/// before this side attaches (its counters start from what it finds), then steps.
pub(super) fn run(data: &[u8]) {
    let shared = Arc::new(Shared::default());
    let mut s = Script(data);
    for _ in 0..s.u8() % 4 {
        forge_word(&shared, &mut s);
    }
    let (mut ours, mut theirs) = (link(&shared, 0), link(&shared, 1));
    // The label of the peer's last honest LL message, and of ours.
    let (mut sent_by_peer, mut sent_by_us) = ([0u64; 2], [0u64; 2]);
    let mut buf = vec![0u8; 4096];
    // Where this side stands in its ring (from the `tail` it found, forged or not): pieces
    // are whole elements only from an aligned position (the executor reads frames, which
    // keep it 8-aligned from the zero an honest peer leaves).
    let mut pos = shared.rings[1].word(1).map_or(0, |w| w.load(Ordering::Relaxed) as usize);
    for _ in 0..STEPS {
        if s.0.is_empty() {
            break;
        }
        match s.u8() % 16 {
            0 => forge_word(&shared, &mut s),
            // Or in the data of its ring to us.
            1 => {
                let (i, v) = (s.u16() % (CAP / 8), s.u64());
                shared.data[1][i].store(v, Ordering::Relaxed);
            }
            2 => {
                let n = usize::from(s.u8());
                let _ = theirs.write(&[IoSlice::new(s.bytes(n))]);
            }
            3 => {
                let label = s.label();
                let n = usize::from(s.u8()) % (LL_MAX_BYTES + 1);
                if theirs.ll_send(label, s.bytes(n)).unwrap_or(false) {
                    sent_by_peer = label;
                }
            }
            4 => match s.u8() % 3 {
                0 => shared.status[1].set(&Farewell::Goodbye),
                1 => {
                    let origin = usize::from(s.u8());
                    let n = usize::from(s.u8());
                    let reason = String::from_utf8_lossy(s.bytes(n)).into_owned();
                    shared.status[1].set(&Farewell::Abort { origin, reason });
                }
                _ => {
                    let (state, origin, len) = (s.u8().into(), s.u8().into(), s.u16() as u32 * 64);
                    let n = usize::from(s.u8());
                    shared.status[1].forge(state, origin, len, s.bytes(n));
                }
            },
            5 => {
                let n = s.u16() % buf.len();
                if let Ok(got) = ours.read(&mut buf[..n]) {
                    assert!(got <= n, "a read of {n} bytes gave {got}");
                    pos = pos.wrapping_add(got);
                }
            }
            6 => {
                let align = 1 << (s.u8() % 4);
                let max = (s.u16() % buf.len()) & !(align - 1);
                let (mut total, whole) = (0, pos % align == 0);
                let got = ours.read_with(max, align, &mut |piece| {
                    assert!(
                        !whole || piece.len() % align == 0,
                        "a piece of {} bytes, elements of {align}",
                        piece.len()
                    );
                    total += piece.len();
                });
                if let Ok(got) = got {
                    assert!(
                        got == total && got <= max && got % align == 0,
                        "read {got} of at most {max}, handed {total}"
                    );
                    pos = pos.wrapping_add(got);
                }
            }
            7 => {
                let n = s.u16();
                let _ = ours.holds(n);
            }
            8 => {
                let label = if s.u8() & 1 == 0 { sent_by_peer } else { s.label() };
                let len = usize::from(s.u8()) % (LL_MAX_BYTES + 1);
                let mut pieces = Vec::new();
                match ours.ll_recv(label, len, &mut |p| pieces.push(p.len())) {
                    Ok(LlRecv::Done) => {
                        assert_eq!(pieces, [len], "an LL message of {len} bytes came as {pieces:?}")
                    }
                    Ok(LlRecv::Other(label)) => {
                        let _ = ll_label(label);
                    }
                    _ => {}
                }
            }
            9 => {
                let _ = ours.ll_pending();
            }
            10 => {
                let label = s.label();
                let n = usize::from(s.u8()) % (LL_MAX_BYTES + 1);
                if ours.ll_send(label, s.bytes(n)).unwrap_or(false) {
                    sent_by_us = label;
                }
            }
            11 => {
                let n = usize::from(s.u8());
                let _ = ours.write(&[IoSlice::new(s.bytes(n))]);
            }
            12 => {
                let n = s.u16();
                let _ = ours.room_for(n);
            }
            13 => {
                let _ = ours.hangup(Within::BOUNDARY);
            }
            14 => {
                let n = s.u16() % buf.len();
                let _ = theirs.read(&mut buf[..n]);
            }
            _ => {
                let len = usize::from(s.u8()) % (LL_MAX_BYTES + 1);
                let _ = theirs.ll_recv(sent_by_us, len, &mut |_| {});
            }
        }
    }
    ours.close(&Farewell::Goodbye, true, Duration::ZERO);
}
