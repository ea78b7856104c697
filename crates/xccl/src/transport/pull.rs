//! Pulling: a receiver copies a message straight out of the sender's memory, in one copy,
//! instead of the sender copying it through a ring (and, for a large message, the sender
//! writes the tail straight into the receiver's memory meanwhile). Ranks that are threads of
//! one process copy directly; processes of one host use cross-memory attach
//! (`process_vm_readv`, `process_vm_writev`) where the kernel allows it (same user, no
//! restrictive ptrace policy), which is probed when the shared-memory segment is set up.

use std::io;

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
            unsafe { std::ptr::copy_nonoverlapping(addr as usize as *const u8, dst.as_mut_ptr(), dst.len()) };
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
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as usize as *mut u8, src.len()) };
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

/// Moves `len` bytes between `local` (this process) and `addr` of process `pid`, retrying
/// partial transfers.
fn cross(pid: i32, local: *mut u8, len: usize, addr: u64, dir: Direction) -> io::Result<()> {
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
}
