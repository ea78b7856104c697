//! The shared-memory transport: ranks that are processes on one host talk through rings in a
//! shared mapping, the same rings, doorbells and status words as the local transport.
//!
//! One segment per communicator and host: a file in `/dev/shm` named after the job, the
//! communicator and the pid of the member that creates it (the host's first member). The
//! others open and map it; the last to arrive unlinks it, so once a communicator is built
//! no file is left behind whatever happens to its processes. A segment whose creator died
//! before that is swept by the next creation on the host, and by `xccl run` when its job ends.
//! Zeroed memory is a valid initial state for every shared structure, so the creator only
//! sizes the file and writes the header.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};

use super::doorbell::Doorbell;
use super::pull::{self, Pull};
use super::ring::{PeerStatus, RingControl, RingHost, RingLink, RingMem, RingRx, RingTx};
use crate::error::{Error, Result};

const MAGIC: u64 = u64::from_le_bytes(*b"XCCLSHM1");
const PAGE: usize = 4096;
const DIR: &str = "/dev/shm";

/// The header at offset 0.
#[repr(C)]
struct Header {
    /// `MAGIC` once the creator has filled in the rest.
    ready: AtomicU64,
    members: AtomicU64,
    cap: AtomicU64,
    /// Members that have mapped the segment; the last one unlinks the file.
    attached: AtomicU32,
    /// Members that have tested whether they can read the others' memory.
    probed: AtomicU32,
}

/// Per-member state.
#[repr(C)]
#[derive(Default)]
struct Slot {
    bell: Doorbell,
    status: PeerStatus,
    pid: AtomicU32,
    /// Address of the member's `pull::PROBE`, for its peers to test reading its memory.
    probe: AtomicU64,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Where things are in a segment of `m` members with rings of `cap` bytes.
#[derive(Copy, Clone, Debug)]
struct Layout {
    m: usize,
    cap: usize,
    slots: usize,
    /// `m x m` bytes: whether member `r` can read member `w`'s memory, at `r * m + w`.
    pulls: usize,
    controls: usize,
    data: usize,
    len: usize,
}

impl Layout {
    fn new(m: usize, cap: usize) -> Layout {
        let slots = PAGE;
        let pulls = slots + m * size_of::<Slot>();
        let controls = round_up(pulls + m * m, PAGE);
        let data = round_up(controls + m * m * size_of::<RingControl>(), PAGE);
        Layout { m, cap, slots, pulls, controls, data, len: data + m * m * cap }
    }
}

/// A mapped segment.
pub(crate) struct ShmSegment {
    base: *mut u8,
    layout: Layout,
}

// SAFETY: the mapping stays valid until `drop`; everything in it that several threads or
// processes touch is an atomic, except ring data, which the rings' SPSC protocol guards.
unsafe impl Send for ShmSegment {}
// SAFETY: as above.
unsafe impl Sync for ShmSegment {}

/// The file name prefix of a job's segments (`xccl run` removes leftovers by it).
pub fn segment_prefix(job: &str) -> String {
    let h =
        job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("xccl-{h:016x}-")
}

/// Removes the job's segment files that are still in `/dev/shm` (after all its ranks ended).
pub fn remove_job_segments(job: &str) {
    let prefix = segment_prefix(job);
    if let Ok(dir) = std::fs::read_dir(DIR) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Removes segments whose creator process no longer exists.
fn sweep_orphans() {
    let Ok(dir) = std::fs::read_dir(DIR) else { return };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) =
            name.strip_prefix("xccl-").and_then(|r| r.rsplit('-').next()).and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if !process_alive(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether process `pid` exists (signal 0 probes without signalling).
pub(crate) fn process_alive(pid: i32) -> bool {
    match rustix::process::Pid::from_raw(pid) {
        Some(p) => !matches!(rustix::process::test_kill_process(p), Err(rustix::io::Errno::SRCH)),
        None => false,
    }
}

/// Waits until the file behind `fd` is at least `len` bytes long. A joiner can open the file
/// between its creation and its sizing; touching a mapping beyond the end of a file raises
/// SIGBUS, so nothing is mapped before the creator has sized it.
fn wait_until_sized(fd: &OwnedFd, len: usize, timeout: Duration, path: &str) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let size = rustix::fs::fstat(fd)
            .map_err(|e| Error::io(format!("inspecting shared memory {path}"), e.into()))?
            .st_size;
        if usize::try_from(size).is_ok_and(|s| s >= len) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Bootstrap(format!(
                "shared memory {path} has {size} bytes, expected {len}: its creator never sized it \
                 (did it die, or run with another XCCL_SHM_RING_BYTES?)"
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl ShmSegment {
    /// Creates (member 0) or joins (the others) segment `name` for `m` members; `members`
    /// gives each member's rank and process id when known (empty: not), so that a member
    /// that dies or never comes is named. On failure the file is unlinked: the communicator
    /// will not be built, and the name must not outlive the attempt.
    pub fn join(
        name: &str,
        m: usize,
        me: usize,
        cap: usize,
        timeout: Duration,
        members: &[(usize, i32)],
    ) -> Result<Arc<ShmSegment>> {
        let path = format!("{DIR}/{name}");
        let cpath =
            CString::new(path.clone()).map_err(|_| Error::Internal("segment name with a NUL".into()))?;
        Self::attach(&path, &cpath, m, me, cap, timeout, members).inspect_err(|_| {
            let _ = rustix::fs::unlink(&cpath);
        })
    }

    fn attach(
        path: &str,
        cpath: &CString,
        m: usize,
        me: usize,
        cap: usize,
        timeout: Duration,
        members: &[(usize, i32)],
    ) -> Result<Arc<ShmSegment>> {
        let layout = Layout::new(m, cap);
        let fd: OwnedFd = if me == 0 {
            sweep_orphans();
            let _ = rustix::fs::unlink(cpath);
            let fd = rustix::fs::open(
                cpath,
                OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC,
                Mode::RUSR | Mode::WUSR,
            )
            .map_err(|e| Error::io(format!("creating shared memory {path}"), e.into()))?;
            rustix::fs::ftruncate(&fd, layout.len as u64).map_err(|e| {
                let _ = rustix::fs::unlink(cpath);
                Error::io(
                    format!(
                        "sizing shared memory {path} to {} bytes (is /dev/shm large enough?)",
                        layout.len
                    ),
                    e.into(),
                )
            })?;
            fd
        } else {
            let deadline = Instant::now() + timeout;
            loop {
                match rustix::fs::open(cpath, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()) {
                    Ok(fd) => break fd,
                    Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                    Err(e) => {
                        return Err(Error::io(
                            format!("opening shared memory {path} (did its creator start?)"),
                            e.into(),
                        ));
                    }
                }
            }
        };
        if me != 0 {
            wait_until_sized(&fd, layout.len, timeout, path)?;
        }
        // SAFETY: mapping a file we opened read-write, of at least `layout.len` bytes (the
        // creator sized it; joiners waited above until it was), so no access through the
        // mapping falls beyond its end.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                layout.len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| Error::io(format!("mapping shared memory {path}"), e.into()))?
        .cast::<u8>();
        let seg = ShmSegment { base, layout };
        let header = seg.header();
        if me == 0 {
            header.members.store(m as u64, Ordering::Relaxed);
            header.cap.store(cap as u64, Ordering::Relaxed);
            header.ready.store(MAGIC, Ordering::Release);
        } else {
            let deadline = Instant::now() + timeout;
            while header.ready.load(Ordering::Acquire) != MAGIC {
                if Instant::now() > deadline {
                    return Err(Error::Bootstrap(format!(
                        "shared memory {path} was never filled in by its creator"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let (hm, hc) = (header.members.load(Ordering::Relaxed), header.cap.load(Ordering::Relaxed));
            if hm != m as u64 || hc != cap as u64 {
                return Err(Error::Bootstrap(format!(
                    "shared memory {path} is laid out for {hm} members with {hc}-byte rings, this rank expects {m} and {cap}: \
                     do the ranks of this host run with the same XCCL_SHM_RING_BYTES?"
                )));
            }
        }
        seg.populate(me);
        let slot = seg.slot(me);
        slot.pid.store(std::process::id(), Ordering::Relaxed);
        slot.probe.store(&raw const pull::PROBE as u64, Ordering::Relaxed);
        if header.attached.fetch_add(1, Ordering::AcqRel) + 1 == m as u32 {
            // Everyone has it mapped: the name is no longer needed.
            let _ = rustix::fs::unlink(cpath);
        }
        // Once all members are here, test which of them this one can read directly.
        seg.wait_for(&header.attached, m, timeout, path, members)?;
        for peer in (0..m).filter(|&p| p != me) {
            let ps = seg.slot(peer);
            let (pid, addr) = (ps.pid.load(Ordering::Relaxed) as i32, ps.probe.load(Ordering::Relaxed));
            seg.pull_flag(me, peer).store(u8::from(pull::probe(pid, addr)), Ordering::Relaxed);
        }
        header.probed.fetch_add(1, Ordering::AcqRel);
        seg.wait_for(&header.probed, m, timeout, path, members)?;
        Ok(Arc::new(seg))
    }

    /// Waits until `counter` reaches `m` (every member has done something).
    /// A member that died while the others wait for it fails the wait at once, naming it;
    /// a timeout names the members that never came.
    fn wait_for(
        &self,
        counter: &AtomicU32,
        m: usize,
        timeout: Duration,
        path: &str,
        members: &[(usize, i32)],
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut looked = Instant::now();
        while (counter.load(Ordering::Acquire) as usize) < m {
            if looked.elapsed() >= Duration::from_millis(10) {
                looked = Instant::now();
                if let Some(&(rank, pid)) = members.iter().find(|&&(_, pid)| !process_alive(pid)) {
                    return Err(Error::Bootstrap(format!(
                        "rank {rank} (pid {pid}) exited while the ranks of this host were joining shared memory {path}"
                    )));
                }
            }
            if Instant::now() > deadline {
                let missing: Vec<String> = (0..m.min(members.len()))
                    .filter(|&i| self.slot(i).pid.load(Ordering::Relaxed) == 0)
                    .map(|i| format!("rank {}", members[i].0))
                    .collect();
                return Err(Error::Bootstrap(format!(
                    "only {} of {m} ranks of this host joined shared memory {path}{}",
                    counter.load(Ordering::Acquire),
                    if missing.is_empty() {
                        String::new()
                    } else {
                        format!("; never came: {}", missing.join(", "))
                    }
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    fn pull_flag(&self, reader: usize, writer: usize) -> &AtomicU8 {
        assert!(reader < self.layout.m && writer < self.layout.m);
        // SAFETY: the matrix of `m * m` bytes lies inside the mapping (layout); `AtomicU8` has
        // no alignment requirement.
        unsafe { &*self.base.add(self.layout.pulls + reader * self.layout.m + writer).cast::<AtomicU8>() }
    }

    fn header(&self) -> &Header {
        // SAFETY: offset 0 of the mapping holds the header, 8-byte aligned (page aligned).
        unsafe { &*self.base.cast::<Header>() }
    }

    fn slot(&self, i: usize) -> &Slot {
        assert!(i < self.layout.m, "member {i} outside segment");
        // SAFETY: slot i lies inside the mapping (layout), aligned to its 64-byte alignment
        // since slots start on a page and each is a multiple of 64 bytes long.
        unsafe { &*self.base.add(self.layout.slots + i * size_of::<Slot>()).cast::<Slot>() }
    }

    /// Maps in, ahead of use, every page of the rings member `me` writes and reads (and the
    /// first pages, with the headers and control blocks). Otherwise the first pass over each
    /// ring faults in a page every few dozen small messages: with 4 MiB rings the first 50 000
    /// or so 8-byte all-reduces took 10-25% longer. Contents are not changed; a kernel without
    /// `MADV_POPULATE_WRITE` (before 5.14) just faults the pages in on use.
    fn populate(&self, me: usize) {
        let advise = |off: usize, len: usize| {
            // SAFETY: the range lies inside the mapping (layout); populating does not change
            // its contents, so it is harmless while peers use it.
            let _ = unsafe {
                rustix::mm::madvise(self.base.add(off).cast(), len, rustix::mm::Advice::LinuxPopulateWrite)
            };
        };
        advise(0, self.layout.data);
        for peer in (0..self.layout.m).filter(|&p| p != me) {
            for idx in [me * self.layout.m + peer, peer * self.layout.m + me] {
                advise(self.layout.data + idx * self.layout.cap, self.layout.cap);
            }
        }
    }

    /// The ring from member `from` to member `to`.
    fn ring(&self, from: usize, to: usize) -> RingMem {
        let idx = from * self.layout.m + to;
        // SAFETY: control block and data of ring `idx` lie inside the mapping (layout); the
        // segment outlives every ring end (links hold an `Arc` to it); each member makes only
        // the producer end of its outgoing rings and the consumer end of its incoming ones.
        unsafe {
            RingMem::new(
                self.base.add(self.layout.controls + idx * size_of::<RingControl>()).cast::<RingControl>(),
                self.base.add(self.layout.data + idx * self.layout.cap),
                self.layout.cap,
            )
        }
    }

    /// Member `me`'s link to member `peer`.
    pub fn link(self: &Arc<Self>, me: usize, peer: usize) -> RingLink {
        let host: Arc<dyn RingHost> = self.clone();
        RingLink::new(RingTx::new(self.ring(me, peer)), RingRx::new(self.ring(peer, me)), me, peer, host)
    }
}

impl RingHost for ShmSegment {
    fn members(&self) -> usize {
        self.layout.m
    }

    fn bell(&self, member: usize) -> &Doorbell {
        &self.slot(member).bell
    }

    fn status(&self, member: usize) -> &PeerStatus {
        &self.slot(member).status
    }

    fn pull(&self, reader: usize, writer: usize) -> Option<Pull> {
        (self.pull_flag(reader, writer).load(Ordering::Acquire) == 1)
            .then(|| Pull::Process(self.slot(writer).pid.load(Ordering::Relaxed) as i32))
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `join`; no reference into it outlives
        // `self` (links hold an `Arc<ShmSegment>`).
        let _ = unsafe { rustix::mm::munmap(self.base.cast(), self.layout.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;

    /// Joins a 2-member segment from two threads, as two ranks would.
    fn pair(name: &str, caps: [usize; 2], timeout: Duration) -> [Result<Arc<ShmSegment>>; 2] {
        std::thread::scope(|s| {
            let a = s.spawn(|| ShmSegment::join(name, 2, 0, caps[0], timeout, &[]));
            std::thread::sleep(Duration::from_millis(20));
            let b = s.spawn(|| ShmSegment::join(name, 2, 1, caps[1], timeout, &[]));
            [a.join().unwrap(), b.join().unwrap()]
        })
    }

    #[test]
    fn members_share_rings_and_the_file_is_gone_after_all_attach() {
        let name = format!("{}test-{}", segment_prefix("shm-unit"), std::process::id());
        let [a, b] = pair(&name, [1 << 16; 2], Duration::from_secs(5));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(!std::path::Path::new(&format!("{DIR}/{name}")).exists(), "unlinked once both mapped");
        let mut tx = RingTx::new(a.ring(0, 1));
        let mut rx = RingRx::new(b.ring(0, 1));
        assert_eq!(tx.write(&[IoSlice::new(b"hello shm")]), 9);
        let mut got = [0u8; 9];
        assert_eq!(rx.read(&mut got), 9);
        assert_eq!(&got, b"hello shm");
        let t = b.bell(1).token();
        a.bell(1).ring();
        assert!(b.bell(1).rang_since(t));
        // Both are this process: each can read the other's memory.
        assert_eq!(a.pull(0, 1), Some(Pull::Process(std::process::id() as i32)));
    }

    #[test]
    fn layout_mismatch_is_reported() {
        let name = format!("{}mismatch-{}", segment_prefix("shm-unit"), std::process::id());
        let [a, b] = pair(&name, [1 << 16, 1 << 17], Duration::from_millis(500));
        assert!(b.err().unwrap().to_string().contains("XCCL_SHM_RING_BYTES"));
        // The creator gives up waiting for a partner that never arrives.
        assert!(a.err().unwrap().to_string().contains("joined"));
        assert!(!std::path::Path::new(&format!("{DIR}/{name}")).exists(), "a failed join removes the file");
    }

    #[test]
    fn a_joiner_does_not_map_a_segment_before_it_is_sized() {
        // The creator has made the file but not sized it yet (or died in between): mapping
        // it and reading the header would raise SIGBUS and kill this test process.
        let name = format!("{}unsized-{}", segment_prefix("shm-unit"), std::process::id());
        let path = format!("{DIR}/{name}");
        std::fs::write(&path, b"").unwrap();
        let err = ShmSegment::join(&name, 2, 1, 1 << 16, Duration::from_millis(100), &[]).err().unwrap();
        assert!(err.to_string().contains("never sized"), "{err}");
        assert!(!std::path::Path::new(&path).exists(), "a failed join removes the file");
    }
}
