//! Bulk copies at memory's rate whatever the distance between source and destination.
//!
//! On CPUs with fast short `rep movsb` (FSRM: AMD Zen 3 and later, recent Intel cores), both
//! glibc's `memcpy` (above a few KiB) and the kernel's copies between processes
//! (`process_vm_readv`, `process_vm_writev`) copy with `rep movsb`, which loses most of its
//! rate when the destination lies a few bytes past the source within a 4 KiB page: each store
//! then falls where the next loads look 4 KiB apart, and they stall. On this project's AMD
//! EPYC guest a 512 KiB copy at such a distance moved 1.6–2.5 GB/s in the kernel against
//! 8.4–10.9 GB/s at any other distance. Buffers from `malloc` often lie 16 bytes off each
//! other's alignment, so collectives meet it: a 2-rank 1 MiB all-gather ran at a quarter of
//! its rate, in one launch and not in the next.
//!
//! [`copy`] and [`copy_raw`] take glibc's `memcpy` at every other distance and a vector loop
//! at short ones; `transport::pull` moves a short-distance cross-process copy through a
//! bounce buffer ([`short_distance`] decides both).

/// A page as the stall sees it: what matters is the distance modulo 4 KiB, whatever size
/// the pages are.
pub(crate) const PAGE: usize = 4096;

/// Distances (destination past source, modulo a [`PAGE`]) below which `rep movsb` stalls.
const SHORT: usize = 64;

/// Copies shorter than this take `memcpy` whatever their distance: glibc copies them with
/// vector moves, and the kernel's stall costs little in absolute terms.
pub(crate) const SHORT_MIN: usize = 4096;

/// Whether the destination lies less than 64 bytes past the source, modulo a page (and not
/// at the same offset), where `rep movsb` loses its rate (see the module's documentation).
pub(crate) fn short_distance(dst: usize, src: usize) -> bool {
    let d = dst.wrapping_sub(src) % PAGE;
    d != 0 && d < SHORT
}

/// `dst.copy_from_slice(src)` at memory's rate at every distance.
///
/// # Panics
/// If the lengths differ, as `copy_from_slice` does (a caller's invariant, never input).
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy between slices of different lengths");
    // SAFETY: both slices hold `src.len()` bytes and cannot overlap (`dst` is a unique borrow).
    unsafe { copy_raw(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// Copies `n` bytes from `src` to `dst` at memory's rate at every distance.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for `n` bytes of reads, `dst` for `n`
/// bytes of writes, the two regions disjoint.
pub(crate) unsafe fn copy_raw(dst: *mut u8, src: *const u8, n: usize) {
    if n < SHORT_MIN || !short_distance(dst as usize, src as usize) {
        // SAFETY: forwarded to the caller.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        return;
    }
    // SAFETY: forwarded to the caller.
    unsafe { vector_copy(dst, src, n) }
}

/// Copies with 16-byte vector moves, four loads then four stores per 64 bytes: no `rep
/// movsb`, and a loop the compiler does not turn back into a call to `memcpy` (no store
/// moves by its own size each iteration).
///
/// # Safety
/// As [`copy_raw`].
#[cfg(target_arch = "x86_64")]
unsafe fn vector_copy(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
    let body = n / 64 * 64;
    let mut at = 0;
    while at < body {
        // SAFETY: `at + 64 <= body <= n`, so all four loads and stores lie in the regions
        // the caller vouched for; unaligned loads and stores take any address.
        unsafe {
            let (s, d) = (src.add(at).cast::<__m128i>(), dst.add(at).cast::<__m128i>());
            let (a, b, c, e) = (
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            );
            _mm_storeu_si128(d, a);
            _mm_storeu_si128(d.add(1), b);
            _mm_storeu_si128(d.add(2), c);
            _mm_storeu_si128(d.add(3), e);
        }
        at += 64;
    }
    // SAFETY: the last `n - body` (< 64) bytes of both regions; `memcpy` copies so few with
    // vector moves.
    unsafe { std::ptr::copy_nonoverlapping(src.add(body), dst.add(body), n - body) };
}

/// Elsewhere `memcpy` (the stall is an x86 one).
///
/// # Safety
/// As [`copy_raw`].
#[cfg(not(target_arch = "x86_64"))]
unsafe fn vector_copy(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded to the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_distances_are_those_just_past_the_source_within_a_page() {
        assert!(short_distance(0x1010, 0x1000));
        assert!(short_distance(0x5008, 0x8000), "pages apart, 8 bytes past within a page");
        assert!(short_distance(0x1000 + 63, 0x1000));
        assert!(!short_distance(0x1000 + 64, 0x1000));
        assert!(!short_distance(0x1000, 0x1010), "the destination before the source is fast");
        assert!(!short_distance(0x3000, 0x1000), "the same offset in a page is fast");
        assert!(short_distance(0x10, usize::MAX - 4095), "wraps around the address space");
    }

    #[test]
    fn copies_are_exact_at_every_distance_and_length() {
        let src: Vec<u8> = (0..3 * PAGE + 200).map(|i| (i * 7 % 251) as u8).collect();
        for len in [0, 1, 63, 64, 65, SHORT_MIN - 1, SHORT_MIN, SHORT_MIN + 17, 3 * PAGE + 100] {
            for gap in [0usize, 1, 16, 63, 64, 2048] {
                let mut dst = vec![0u8; src.len() + 2 * PAGE];
                let at = (src.as_ptr() as usize + 40 + gap).wrapping_sub(dst.as_ptr() as usize) % PAGE;
                assert_eq!(
                    short_distance(dst[at..].as_ptr() as usize, src[40..].as_ptr() as usize),
                    gap != 0 && gap < SHORT
                );
                copy(&mut dst[at..at + len], &src[40..40 + len]);
                assert!(dst[at..at + len] == src[40..40 + len], "{len} bytes, {gap} past");
                assert!(dst[..at].iter().chain(&dst[at + len..]).all(|b| *b == 0), "{len} bytes, {gap} past");
            }
        }
    }
}
