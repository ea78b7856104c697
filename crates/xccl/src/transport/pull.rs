//! Pulling: a receiver copies a message straight out of the sender's memory, in one copy,
//! instead of the sender copying it through a ring (and, for a large message, the sender
//! writes the tail straight into the receiver's memory meanwhile). Ranks that are threads of
//! one process copy directly; processes of one host use cross-memory attach
//! (`process_vm_readv`, `process_vm_writev`) where the kernel allows it (same user, no
//! restrictive ptrace policy), which is probed when the shared-memory segment is set up.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::copy::{self, PAGE, SHORT_MIN, short_distance};

/// Where a receiver can read a sender's memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pull {
    /// The sender is a thread of this process.
    Local,
    /// The sender is process `pid`, readable by cross-memory attach.
    Process(i32),
}

/// A word whose address ranks publish so that peers can test whether they can read them.
pub(crate) static PROBE: u64 = u64::from_le_bytes(*b"XCCLPULL");

/// Copies `dst.len()` bytes at address `addr` of `from` into `dst`.
///
/// # Safety
/// For [`Pull::Local`], `addr..addr + dst.len()` must be memory of this process that stays
/// valid and unwritten for the duration of the call (the pull protocol: a sender leaves a
/// segment alone until the receiver has acknowledged it).
pub(crate) unsafe fn copy(from: Pull, addr: u64, dst: &mut [u8]) -> io::Result<()> {
    match from {
        Pull::Local => {
            // SAFETY: forwarded to the caller; the ranges cannot overlap since `dst` is a
            // unique borrow.
            unsafe { copy::copy_raw(dst.as_mut_ptr(), addr as usize as *const u8, dst.len()) };
            Ok(())
        }
        Pull::Process(pid) => cross(pid, dst.as_mut_ptr(), dst.len(), addr, Direction::Read),
    }
}

/// Writes `src` at address `addr` of `to`.
///
/// # Safety
/// `addr..addr + src.len()` must be memory of the target that may take these bytes and that
/// nothing else touches during the call (the push protocol: a receiver names part of its own
/// receive buffer, and leaves it alone until the sender says it is written). For
/// [`Pull::Local`] it must moreover be valid memory of this process, disjoint from `src`.
pub(crate) unsafe fn write(to: Pull, addr: u64, src: &[u8]) -> io::Result<()> {
    match to {
        Pull::Local => {
            // SAFETY: forwarded to the caller.
            unsafe { copy::copy_raw(addr as usize as *mut u8, src.as_ptr(), src.len()) };
            Ok(())
        }
        // The kernel only reads `src` for a write.
        Pull::Process(pid) => cross(pid, src.as_ptr().cast_mut(), src.len(), addr, Direction::Write),
    }
}

/// Which way a cross-memory copy goes.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

/// Moves `len` bytes between `local` (this process) and `addr` of process `pid`: in one
/// call where the kernel copies at its rate, through [`bounced`] where the destination lies
/// a [short distance](short_distance) past the source (`rep movsb` stalls there: see
/// [`crate::copy`]).
fn cross(pid: i32, local: *mut u8, len: usize, addr: u64, dir: Direction) -> io::Result<()> {
    let (dst, src) = match dir {
        Direction::Read => (local as usize, addr as usize),
        Direction::Write => (addr as usize, local as usize),
    };
    if len >= SHORT_MIN && short_distance(dst, src) {
        say_bounced(dst.wrapping_sub(src) % PAGE);
        return bounced(pid, local, len, addr, dir);
    }
    cross_direct(pid, local, len, addr, dir)
}

/// Says once per process (`XCCL_DEBUG=info`) that copies between processes go through the
/// bounce buffer, why, and what keeps buffers off it: the user cannot see it otherwise, and
/// it can halve the rate of mid-size messages (docs/PERFORMANCE.md).
fn say_bounced(distance: usize) {
    static SAID: AtomicBool = AtomicBool::new(false);
    // Read first: every bounced copy passes here, and only the first need write the line.
    if !SAID.load(Ordering::Relaxed) && !SAID.swap(true, Ordering::Relaxed) {
        tracing::info!(
            "a copy between processes whose destination lies {distance} bytes past its source (modulo 4 KiB) \
             goes through a bounce buffer, twice the copying (rep movsb stalls at that distance); with \
             buffers aligned to 64 bytes (as PyTorch's tensors and xccl's HostBuffers are) and blocks of \
             whole 64-byte lines, no copy meets it"
        );
    }
}

/// Bytes moved through the bounce buffer at a time: the buffer stays in the core's L2.
const BOUNCE_CHUNK: usize = 64 << 10;

thread_local! {
    /// The bounce buffer of [`bounced`]: a chunk plus a page, so that a chunk can start at
    /// any offset within a page.
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`cross_direct`] through a bounce buffer placed half a page past the remote address
/// within a page, so that neither copy meets a short distance: the kernel's (between the
/// bounce buffer and the peer, half a page) nor this process's `memcpy` (between `local` and
/// the bounce buffer, from cache, half a page plus the short distance; glibc's `memcpy` uses
/// `rep movsb` too and loses its rate the same way).
fn bounced(pid: i32, local: *mut u8, len: usize, addr: u64, dir: Direction) -> io::Result<()> {
    BOUNCE.with(|cell| {
        let mut bounce = cell.borrow_mut();
        if bounce.len() < BOUNCE_CHUNK + PAGE {
            bounce.resize(BOUNCE_CHUNK + PAGE, 0);
        }
        let mut done = 0;
        while done < len {
            let n = (len - done).min(BOUNCE_CHUNK);
            let there = addr.wrapping_add(done as u64);
            let skew = stage_skew(there as usize, bounce.as_ptr() as usize);
            let stage = &mut bounce[skew..skew + n];
            let here = local.wrapping_add(done);
            match dir {
                Direction::Read => {
                    cross_direct(pid, stage.as_mut_ptr(), n, there, dir)?;
                    // SAFETY: the caller's `local` holds `len` bytes, written for a read;
                    // `stage` is this thread's own buffer, disjoint from it.
                    unsafe { std::ptr::copy_nonoverlapping(stage.as_ptr(), here, n) };
                }
                Direction::Write => {
                    // SAFETY: the caller's `local` holds `len` readable bytes; `stage` is
                    // this thread's own buffer, disjoint from it.
                    unsafe { std::ptr::copy_nonoverlapping(here.cast_const(), stage.as_mut_ptr(), n) };
                    cross_direct(pid, stage.as_mut_ptr(), n, there, dir)?;
                }
            }
            done += n;
        }
        Ok(())
    })
}

/// Where in a bounce buffer at address `base` a chunk for remote address `there` starts: half
/// a page past `there` within a page (below a page from `base`).
fn stage_skew(there: usize, base: usize) -> usize {
    (there + PAGE / 2).wrapping_sub(base) % PAGE
}

/// Moves `len` bytes between `local` (this process) and `addr` of process `pid`, retrying
/// partial transfers.
fn cross_direct(pid: i32, local: *mut u8, len: usize, addr: u64, dir: Direction) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let here = libc::iovec { iov_base: local.wrapping_add(done).cast(), iov_len: len - done };
        let there = libc::iovec {
            iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `here` describes `len - done` bytes of the caller's buffer (written for a
        // read, only read for a write); the kernel validates `there` against the other
        // process's address space and fails (EFAULT) rather than touching anything outside it.
        let n = unsafe {
            match dir {
                Direction::Read => libc::process_vm_readv(pid, &here, 1, &there, 1, 0),
                Direction::Write => libc::process_vm_writev(pid, &here, 1, &there, 1, 0),
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer memory ended"));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether this process can read process `pid`'s memory: reads its [`PROBE`] at `addr`.
pub(crate) fn probe(pid: i32, addr: u64) -> bool {
    let mut word = [0u8; 8];
    // SAFETY: a `Process` pull never touches our memory beyond `word`.
    unsafe { copy(Pull::Process(pid), addr, &mut word) }.is_ok() && u64::from_le_bytes(word) == PROBE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_own_process_pulls_copy_exactly() {
        let src: Vec<u8> = (0..=255).collect();
        let mut dst = vec![0u8; 256];
        // SAFETY: `src` is alive and not written during the copy.
        unsafe { copy(Pull::Local, src.as_ptr() as u64, &mut dst) }.unwrap();
        assert_eq!(src, dst);
        let mut dst2 = vec![0u8; 100];
        let me = std::process::id() as i32;
        // SAFETY: a process pull writes only `dst2`.
        unsafe { copy(Pull::Process(me), src[50..].as_ptr() as u64, &mut dst2) }.unwrap();
        assert_eq!(&dst2[..], &src[50..150]);
        assert!(probe(me, &raw const PROBE as u64));
        let mut target = [0u8; 64];
        // SAFETY: the write stays inside `target`, which nothing else touches.
        unsafe { write(Pull::Process(me), target[8..].as_mut_ptr() as u64, &src[..32]) }.unwrap();
        assert_eq!(&target[8..40], &src[..32]);
        assert!(target[..8].iter().chain(&target[40..]).all(|b| *b == 0));
        assert!(!probe(me, src.as_ptr() as u64));
    }

    #[test]
    fn the_bounce_buffer_keeps_both_copies_off_a_short_distance() {
        // For every short distance between a local and a remote address, reading and
        // writing, neither the kernel's copy (bounce buffer and remote) nor this process's
        // (local and bounce buffer) is at a short distance, wherever the buffer lies.
        for base in [0x7f00_0000_1000usize, 0x7f00_0000_1010, 0x7f00_0000_1ff8] {
            for remote in [0x5555_0000_0000usize, 0x5555_0000_0fc8, 0x5555_0000_0801] {
                for gap in 1..64 {
                    let stage = base + stage_skew(remote, base);
                    assert!(stage >= base && stage < base + PAGE);
                    // Reading: the kernel copies remote -> stage, this process stage -> local.
                    let local = remote + gap + 7 * PAGE;
                    assert!(short_distance(local, remote));
                    assert!(!short_distance(stage, remote) && !short_distance(local, stage));
                    // Writing: this process copies local -> stage, the kernel stage -> remote.
                    let local = remote.wrapping_sub(gap) + 3 * PAGE;
                    assert!(short_distance(remote, local));
                    assert!(!short_distance(stage, local) && !short_distance(remote, stage));
                }
            }
        }
    }

    #[test]
    fn bounced_cross_memory_copies_are_exact_in_both_directions() {
        // Lengths that end inside a chunk, on its end, and past several, at short distances
        // and at the ones either side of the band, reading and writing.
        let me = std::process::id() as i32;
        let total = 3 * BOUNCE_CHUNK + 1000;
        let src: Vec<u8> = (0..total + 2 * PAGE).map(|i| (i * 7 % 251) as u8).collect();
        for len in [SHORT_MIN, BOUNCE_CHUNK, total] {
            for gap in [1usize, 16, 63, 64, 0] {
                let mut dst = vec![0u8; total + 2 * PAGE];
                let s_at = 40;
                // The destination `gap` bytes past the source's offset within a page.
                let d_at = (src.as_ptr() as usize + s_at + gap).wrapping_sub(dst.as_ptr() as usize) % PAGE;
                assert_eq!(
                    short_distance(dst[d_at..].as_ptr() as usize, src[s_at..].as_ptr() as usize),
                    gap != 0 && gap < 64
                );
                // SAFETY: a process pull writes only `dst[d_at..d_at + len]`.
                unsafe { copy(Pull::Process(me), src[s_at..].as_ptr() as u64, &mut dst[d_at..d_at + len]) }
                    .unwrap();
                assert!(dst[d_at..d_at + len] == src[s_at..s_at + len], "read, {len} bytes, gap {gap}");
                assert!(dst[..d_at].iter().chain(&dst[d_at + len..]).all(|b| *b == 0));
                let mut target = vec![0u8; total + 2 * PAGE];
                // SAFETY: the write stays inside `target`, which nothing else touches.
                unsafe {
                    write(Pull::Process(me), target[d_at..].as_mut_ptr() as u64, &src[s_at..s_at + len])
                }
                .unwrap();
                assert!(target[d_at..d_at + len] == src[s_at..s_at + len], "write, {len} bytes, gap {gap}");
                assert!(target[..d_at].iter().chain(&target[d_at + len..]).all(|b| *b == 0));
            }
        }
    }
}
