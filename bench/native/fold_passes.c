/* The fold of xccl's fused 64 MiB all-reduce for one rank's 32 MiB half, written out three
 * ways (docs/PERFORMANCE.md, "The memory limit, one pass"): each 256 KiB piece of the stage
 * (in L2, as a pull leaves it) is added to the rank's own input (from memory), the sum
 * streamed to the output with non-temporal stores and kept in the stage for the push.
 *
 *   cc -O3 -o /tmp/fold_passes bench/native/fold_passes.c && /tmp/fold_passes
 *
 * tiled:   as xccl before 2026-11-28: per 4 KiB, SSE2 sums into an L1 tile, the tile copied
 *          into the stage, then streamed out (three passes);
 * one pass: AVX2, each vector summed, stored to the stage and streamed out at once;
 * chunked: the form crates/xccl/src/reduce.rs now has (16 elements computed, then stored
 *          and streamed), compiled for AVX2.
 * One thread, buffers advised MADV_HUGEPAGE; the best of 8 passes, three rounds. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define HALF (8u << 20) /* floats: 32 MiB */
#define PIECE (64u << 10) /* floats: 256 KiB */

static float stage[PIECE] __attribute__((aligned(64)));

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("sse2"))) static void tiled(float *dst, const float *a, float *b, size_t n) {
  float tile[1024] __attribute__((aligned(64)));
  for (size_t at = 0; at < n; at += 1024) {
    for (size_t i = 0; i < 1024; i++) tile[i] = a[at + i] + b[at + i];
    memcpy(b + at, tile, sizeof tile);
    for (size_t i = 0; i < 1024; i += 4)
      _mm_stream_si128((__m128i *)(dst + at + i), _mm_load_si128((__m128i *)(tile + i)));
  }
  _mm_sfence();
}

__attribute__((target("avx2"))) static void one_pass(float *dst, const float *a, float *b, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_load_ps(b + i));
    _mm256_store_ps(b + i, v);
    _mm256_stream_ps(dst + i, v);
  }
  _mm_sfence();
}

__attribute__((target("avx2"))) static void chunked(float *dst, const float *a, float *b, size_t n) {
  for (size_t at = 0; at < n; at += 16) {
    float r[16] __attribute__((aligned(32)));
    for (int i = 0; i < 16; i++) r[i] = a[at + i] + b[at + i];
    memcpy(b + at, r, sizeof r);
    for (int i = 0; i < 16; i += 4)
      _mm_stream_si128((__m128i *)(dst + at + i), _mm_load_si128((__m128i *)(r + i)));
  }
  _mm_sfence();
}

int main(void) {
  float *a = aligned_alloc(1 << 21, HALF * 4), *d = aligned_alloc(1 << 21, HALF * 4);
  if (!a || !d) return 1;
  madvise(a, HALF * 4, MADV_HUGEPAGE);
  madvise(d, HALF * 4, MADV_HUGEPAGE);
  for (size_t i = 0; i < HALF; i++) a[i] = i % 5, d[i] = 0;
  for (size_t i = 0; i < PIECE; i++) stage[i] = 1;
  void (*f[])(float *, const float *, float *, size_t) = {tiled, one_pass, chunked};
  const char *name[] = {"tiled (before)", "one pass", "chunked (now)"};
  for (int round = 0; round < 3; round++)
    for (int k = 0; k < 3; k++) {
      double best = 1e9;
      for (int rep = 0; rep < 8; rep++) {
        double t0 = now();
        for (size_t p = 0; p < HALF; p += PIECE) f[k](d + p, a + p, stage, PIECE);
        double t = now() - t0;
        if (t < best) best = t;
      }
      printf("%-16s %.2f ms\n", name[k], best * 1e3);
    }
  return 0;
}
