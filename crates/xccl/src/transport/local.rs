//! The local transport: ranks are threads of one process, linked by rings in heap memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::doorbell::Doorbell;
use super::pull::Pull;
use super::ring::{PeerStatus, RingControl, RingHost, RingLink, RingMem, RingRx, RingTx};
use super::{Link, Links, Memory};
use crate::error::{Error, Result};

#[derive(Debug, Default)]
struct Slot {
    bell: Doorbell,
    status: PeerStatus,
    claimed: AtomicBool,
}

/// All rings between `n` thread ranks. Ring `i → j` is number `i * n + j`; the diagonal is
/// never touched, so its pages are never backed by memory.
pub(crate) struct LocalMesh {
    n: usize,
    cap: usize,
    slots: Vec<Slot>,
    controls: Vec<RingControl>,
    data: *mut u64,
    words: usize,
}

// SAFETY: the only raw pointer, `data`, owns a heap allocation that lives until `drop`; ring
// memory is reached only through one `RingTx` and one `RingRx` per ring, which each rank's
// claim (below) hands out exactly once, and those follow the ring's SPSC protocol.
unsafe impl Send for LocalMesh {}
// SAFETY: see `Send`; everything else is atomics.
unsafe impl Sync for LocalMesh {}

impl LocalMesh {
    /// A mesh for `n` ranks.
    pub fn new(n: usize) -> Arc<LocalMesh> {
        // Fewer bytes per ring as the mesh grows: n² rings share a budget of address space
        // (untouched pages cost nothing, but large meshes are mostly sparse anyway).
        let cap: usize = match n {
            0..=8 => 1 << 20,
            9..=32 => 256 << 10,
            _ => 64 << 10,
        };
        let words = n * n * cap / 8;
        // A zeroed allocation comes straight from fresh, lazily mapped pages.
        let data = Box::into_raw(vec![0u64; words].into_boxed_slice()).cast::<u64>();
        Arc::new(LocalMesh {
            n,
            cap,
            slots: (0..n).map(|_| Slot::default()).collect(),
            controls: (0..n * n).map(|_| RingControl::default()).collect(),
            data,
            words,
        })
    }

    fn ring(&self, from: usize, to: usize) -> RingMem {
        let idx = from * self.n + to;
        // SAFETY: the control block and `cap` bytes at ring `idx` lie inside allocations owned
        // by `self`, which every link keeps alive through its `Arc`; `claim` ensures a single
        // producer (rank `from`) and a single consumer (rank `to`).
        unsafe { RingMem::new(&self.controls[idx], self.data.add(idx * self.cap / 8).cast(), self.cap) }
    }

    /// The links of `rank`; each rank can claim them once.
    pub fn claim(self: &Arc<Self>, rank: usize) -> Result<Links> {
        let slot =
            self.slots.get(rank).ok_or_else(|| Error::Internal(format!("rank {rank} outside mesh")))?;
        if slot.claimed.swap(true, Ordering::AcqRel) {
            return Err(Error::Internal(format!("rank {rank} of a local mesh claimed twice")));
        }
        let host: Arc<dyn RingHost> = self.clone();
        let links = (0..self.n)
            .map(|peer| {
                (peer != rank).then(|| {
                    let tx = RingTx::new(self.ring(rank, peer));
                    let rx = RingRx::new(self.ring(peer, rank));
                    Box::new(RingLink::new(tx, rx, rank, peer, host.clone())) as Box<dyn Link>
                })
            })
            .collect();
        let memory = Memory::new(host, rank, (0..self.n).map(Some).collect(), Vec::new());
        Links::new(rank, links, Some(memory)).map_err(|e| Error::io("setting up links", e))
    }
}

impl RingHost for LocalMesh {
    fn members(&self) -> usize {
        self.n
    }

    fn bell(&self, rank: usize) -> &Doorbell {
        &self.slots[rank].bell
    }

    fn status(&self, rank: usize) -> &PeerStatus {
        &self.slots[rank].status
    }

    fn pull(&self, _reader: usize, _writer: usize) -> Option<Pull> {
        // Every rank is a thread of this process.
        Some(Pull::Local)
    }
}

impl Drop for LocalMesh {
    fn drop(&mut self) {
        // SAFETY: `data` came from `Box::into_raw` of a boxed slice of `words` u64s, and no
        // link remains (each holds an `Arc` to `self`).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.data, self.words)) });
    }
}

/// Meshes being assembled by splits: by new communicator id, the mesh and how many members
/// have taken it.
type Forming = HashMap<u64, (Arc<LocalMesh>, usize)>;

static FORMING: Mutex<Option<Forming>> = Mutex::new(None);

/// The mesh of communicator `id` with `n` members: the first member to ask creates it, the
/// `n`-th takes it out of the registry.
pub(crate) fn rendezvous(id: u64, n: usize) -> Arc<LocalMesh> {
    let mut guard = FORMING.lock().unwrap_or_else(PoisonError::into_inner);
    let map = guard.get_or_insert_with(HashMap::new);
    let entry = map.entry(id).or_insert_with(|| (LocalMesh::new(n), 0));
    entry.1 += 1;
    let mesh = entry.0.clone();
    if entry.1 == n {
        map.remove(&id);
    }
    mesh
}
