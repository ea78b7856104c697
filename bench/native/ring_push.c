/* The fused 64 MiB all-reduce between two processes, its all-gather half two ways
 * (docs/PERFORMANCE.md, "The memory limit, one pass"): does handing each folded piece to the
 * peer through a small ring of shared slots, which the peer streams into its output with
 * non-temporal stores, beat writing it straight into the peer's output with
 * process_vm_writev (whose kernel copy fetches every destination line before writing it)?
 *
 *   cc -O3 -o /tmp/ring_push bench/native/ring_push.c
 *   /tmp/ring_push push|ring [SLOTS [PIECE_KIB]]     (default 4 slots, pieces of 256 KiB; push
 *                                                     ignores SLOTS)
 *
 * Both variants: each rank pulls the peer's half of the input in pieces (process_vm_readv into
 * a stage), adds its own input with AVX2 and streams the sum into its output (as
 * crates/xccl/src/reduce.rs does). push: the sum is also kept in the stage and written into the
 * peer's output with process_vm_writev. ring: the sum is stored into the next free slot of a
 * ring shared with the peer; between pieces, and after its own half, each rank streams the
 * peer's filled slots into its output and frees them. Buffers advised MADV_HUGEPAGE; prints the
 * best and mean of 17 runs after 3, and checks the result. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "two_processes.h"

#define BYTES (64 << 20)
#define RUNS 20
#define SKIP 3

/* Per rank, as the writer of its ring: pieces written, and pieces its peer has consumed. */
typedef struct {
  _Alignas(128) _Atomic long written;
  _Alignas(128) _Atomic long consumed;
} Ring;

typedef struct {
  _Alignas(128) _Atomic long arrived;
  float *in[2], *out[2];
  int pid[2];
  Ring ring[2];
} Shared;

static Shared *sh;

/* out = a + b streamed; the sum also stored to keep (if any). */
__attribute__((target("avx2"))) static void fold(float *out, const float *a, const float *b, float *keep, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_add_ps(_mm256_load_ps(a + i), _mm256_load_ps(b + i));
    if (keep) _mm256_store_ps(keep + i, v);
    _mm256_stream_ps(out + i, v);
  }
}

__attribute__((target("avx2"))) static void stream(float *out, const float *src, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(out + i, _mm256_load_ps(src + i));
}

int main(int argc, char **argv) {
  if (argc < 2 || (strcmp(argv[1], "push") && strcmp(argv[1], "ring"))) {
    fprintf(stderr, "usage: %s push|ring [SLOTS [PIECE_KIB]]\n", argv[0]);
    return 2;
  }
  int ring = strcmp(argv[1], "ring") == 0;
  size_t slots = argc > 2 ? strtoul(argv[2], 0, 10) : 4, piece_bytes = (argc > 3 ? strtoul(argv[3], 0, 10) : 256) << 10;
  if ((ring && slots == 0) || piece_bytes == 0 || (BYTES / 2) % piece_bytes) {
    fprintf(stderr, "SLOTS must be positive for ring, and PIECE_KIB divide 32768\n");
    return 2;
  }
  sh = mmap(0, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float *slot_mem[2];
  for (int w = 0; w < 2; w++)
    slot_mem[w] = mmap(0, slots * piece_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int me = fork() == 0, peer = 1 - me;
  size_t n = BYTES / sizeof(float), half = n / 2, piece = piece_bytes / sizeof(float);
  long pieces = (long)(half / piece);
  float *in = aligned_alloc(2 << 20, BYTES), *out = aligned_alloc(2 << 20, BYTES), *stage = aligned_alloc(64, piece_bytes);
  madvise(in, BYTES, MADV_HUGEPAGE);
  madvise(out, BYTES, MADV_HUGEPAGE);
  for (size_t i = 0; i < n; i++) in[i] = (float)(me + 1), out[i] = 0;
  sh->in[me] = in, sh->out[me] = out, sh->pid[me] = getpid();
  long round = 0;
  barrier(&sh->arrived, &round);
  int pid = sh->pid[peer];
  float *their_in = sh->in[peer], *their_out = sh->out[peer];
  Ring *mine = &sh->ring[me], *theirs = &sh->ring[peer];
  double best = 1e9, sum = 0;
  for (int run = 0; run < RUNS; run++) {
    atomic_store(&mine->written, 0);
    atomic_store(&theirs->consumed, 0);
    barrier(&sh->arrived, &round);
    double t0 = now();
    long wrote = 0, got = 0;
    /* Streams the peer's filled slots into this rank's output; true if one was there. */
#define DRAIN_ONE()                                                                                     \
  (got < atomic_load_explicit(&theirs->written, memory_order_acquire)                                  \
       ? (stream(out + peer * half + got * piece, slot_mem[peer] + (got % slots) * piece, piece), \
          atomic_store_explicit(&theirs->consumed, ++got, memory_order_release), 1)                    \
       : 0)
    for (size_t at = me * half; at < me * half + half; at += piece) {
      cross(pid, stage, their_in + at, piece_bytes, 0);
      if (ring) {
        while (wrote - atomic_load_explicit(&mine->consumed, memory_order_acquire) >= (long)slots)
          if (!DRAIN_ONE()) sched_yield();
        fold(out + at, in + at, stage, slot_mem[me] + (wrote % slots) * piece, piece);
        atomic_store_explicit(&mine->written, ++wrote, memory_order_release);
        while (DRAIN_ONE()) {
        }
      } else {
        fold(out + at, in + at, stage, stage, piece);
        cross(pid, stage, their_out + at, piece_bytes, 1);
      }
    }
    while (ring && got < pieces)
      if (!DRAIN_ONE()) sched_yield();
    _mm_sfence();
    barrier(&sh->arrived, &round);
    double t = now() - t0;
    if (run >= SKIP) sum += t, best = t < best ? t : best;
  }
  if (!all_are(out, n, 3, me)) return 1;
  if (me == 0) {
    printf("%s, %zu slots, pieces of %zu KiB: best %.2f ms, mean %.2f ms\n", argv[1], ring ? slots : 0, piece_bytes >> 10,
           best * 1e3, sum / (RUNS - SKIP) * 1e3);
    wait(NULL);
  }
  return 0;
}
