//! Bulk copies at memory's rate whatever the distance between source and destination.
//!
//! On CPUs with fast short `rep movsb` (FSRM), both glibc's `memcpy` (from a few KiB up to its
//! non-temporal threshold) and the kernel's copies between processes (`process_vm_readv`,
//! `process_vm_writev`) copy with `rep movsb`. On this project's AMD EPYC (Zen 3) guest that
//! loses most of its rate when the destination lies a few bytes past the source within a
//! 4 KiB page (each store falls where the next loads look 4 KiB apart): a 512 KiB copy in the
//! kernel moved 1.7–1.9 GB/s at such a distance against 4.4–5.3 GB/s at others, and glibc's
//! `memcpy` of 64 KiB 0.5–1.3 against 27 GB/s (`bench/native/copy_distance.c`). Buffers from
//! `malloc` often lie 16 bytes off each other's alignment, so collectives meet it: a 2-rank
//! 1 MiB all-gather ran at a quarter of its rate, in one launch and not in the next.
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

/// Copies with vector moves, 32-byte ones where the CPU has AVX2 (faster: 17–19 against
/// 7.5–13 GB/s for 64 KiB at short distances on the AMD guest, `bench/native/copy_distance.c`)
/// and 16-byte ones otherwise.
///
/// # Safety
/// As [`copy_raw`].
#[cfg(target_arch = "x86_64")]
unsafe fn vector_copy(dst: *mut u8, src: *const u8, n: usize) {
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above); the rest is forwarded to the caller.
        unsafe { vector_copy_avx2(dst, src, n) }
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { vector_copy_sse2(dst, src, n) }
    }
}

/// Four loads then four stores per round: no `rep movsb`, and a loop the compiler does not
/// turn back into a call to `memcpy` (no store moves by its own size each round). `$load`
/// and `$store` move one `$vec` of `$width` bytes at any alignment.
macro_rules! rounds {
    ($dst:ident, $src:ident, $n:ident, $vec:ty, $width:literal, $load:ident, $store:ident) => {{
        let round = 4 * $width;
        let body = $n / round * round;
        let mut at = 0;
        while at < body {
            // SAFETY: `at + round <= body <= n`, so every load and store lies in the regions
            // the caller vouched for; unaligned loads and stores take any address.
            unsafe {
                let (s, d) = ($src.add(at).cast::<$vec>(), $dst.add(at).cast::<$vec>());
                let (a, b, c, e) = ($load(s), $load(s.add(1)), $load(s.add(2)), $load(s.add(3)));
                $store(d, a);
                $store(d.add(1), b);
                $store(d.add(2), c);
                $store(d.add(3), e);
            }
            at += round;
        }
        // SAFETY: the last `n - body` (< one round) bytes of both regions; `memcpy` copies so
        // few with vector moves.
        unsafe { std::ptr::copy_nonoverlapping($src.add(body), $dst.add(body), $n - body) };
    }};
}

/// [`vector_copy`] with AVX2's 32-byte moves.
///
/// # Safety
/// As [`copy_raw`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vector_copy_avx2(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    rounds!(dst, src, n, __m256i, 32, _mm256_loadu_si256, _mm256_storeu_si256)
}

/// [`vector_copy`] with SSE2's 16-byte moves (every x86-64 CPU has them).
///
/// # Safety
/// As [`copy_raw`].
#[cfg(target_arch = "x86_64")]
unsafe fn vector_copy_sse2(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
    rounds!(dst, src, n, __m128i, 16, _mm_loadu_si128, _mm_storeu_si128)
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
                #[cfg(target_arch = "x86_64")]
                {
                    // The SSE2 loop too, where `copy` takes the AVX2 one.
                    let mut other = vec![0u8; len];
                    // SAFETY: both regions hold `len` bytes and are disjoint.
                    unsafe { vector_copy_sse2(other.as_mut_ptr(), src[40..].as_ptr(), len) };
                    assert!(other == src[40..40 + len], "SSE2, {len} bytes");
                }
            }
        }
    }
}
