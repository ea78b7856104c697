/* xccl's 64 MiB all-reduce between two processes, written out by hand: what cross-memory
 * attach (process_vm_readv / process_vm_writev) costs on 4 KiB and on 2 MiB pages, and what
 * folding and pushing in one pass would gain (docs/PERFORMANCE.md, "The memory limit").
 *
 *   cc -O3 -march=native -o /tmp/cma_allreduce bench/native/cma_allreduce.c
 *   /tmp/cma_allreduce PAGES VARIANT
 *
 * PAGES: small   (buffers advised MADV_NOHUGEPAGE)
 *        huge    (advised MADV_HUGEPAGE before their first touch, as xccl::HostBuffer)
 *        collapse (touched on small pages, then MADV_COLLAPSE; prints what that costs)
 * VARIANT: pull  (xccl's Rabenseifner: each rank pulls the peer's half of the input in 256 KiB
 *                 pieces into a stage, folds it into its half of the output, then pulls the
 *                 peer's folded half)
 *          push  (each folded piece is also written into the peer's output at once, while
 *                 it is in cache; no second pull)
 * Forks two processes; prints the best and mean time of 17 runs after 3, and checks the
 * result. */
#define _GNU_SOURCE
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
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define BYTES (64 << 20)
#define PIECE (256 << 10)
#define RUNS 20
#define SKIP 3

typedef struct {
    _Atomic long arrived;
    float *in[2], *out[2];
    int pid[2];
} Shared;
static Shared *sh;

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s small|huge|collapse pull|push\n", argv[0]);
        return 2;
    }
    const char *pages = argv[1];
    int push = strcmp(argv[2], "push") == 0;
    sh = mmap(0, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int me = fork() == 0;
    size_t n = BYTES / sizeof(float), half = n / 2, piece = PIECE / sizeof(float);
    float *in = aligned_alloc(2 << 20, BYTES), *out = aligned_alloc(2 << 20, BYTES), *stage = aligned_alloc(64, PIECE);
    int advice = strcmp(pages, "huge") == 0 ? MADV_HUGEPAGE : strcmp(pages, "small") == 0 ? MADV_NOHUGEPAGE : -1;
    if (advice >= 0) {
        madvise(in, BYTES, advice);
        madvise(out, BYTES, advice);
    }
    for (size_t i = 0; i < n; i++) in[i] = (float)(me + 1), out[i] = 0;
    if (advice < 0) {
        double t = now();
        int a = madvise(in, BYTES, MADV_COLLAPSE), b = madvise(out, BYTES, MADV_COLLAPSE);
        printf("rank %d: MADV_COLLAPSE of both buffers: %s, %.1f ms\n", me, a || b ? "failed" : "ok", (now() - t) * 1e3);
    }
    sh->in[me] = in, sh->out[me] = out, sh->pid[me] = getpid();
    long round = 0;
    barrier(&sh->arrived, &round);
    int peer = 1 - me, pid = sh->pid[peer];
    float *their_in = sh->in[peer], *their_out = sh->out[peer];
    double best = 1e9, sum = 0;
    for (int run = 0; run < RUNS; run++) {
        barrier(&sh->arrived, &round);
        double t0 = now();
        for (size_t at = me * half; at < me * half + half; at += piece) {
            cross(pid, stage, their_in + at, PIECE, 0);
            for (size_t j = 0; j < piece; j++) out[at + j] = in[at + j] + stage[j];
            if (push) cross(pid, out + at, their_out + at, PIECE, 1);
        }
        barrier(&sh->arrived, &round);
        if (!push) cross(pid, out + peer * half, their_out + peer * half, half * sizeof(float), 0);
        barrier(&sh->arrived, &round);
        double t = now() - t0;
        if (run >= SKIP) sum += t, best = t < best ? t : best;
    }
    if (!all_are(out, n, 3, me)) return 1;
    if (me == 0) {
        printf("%s pages, %s: best %.2f ms, mean %.2f ms, %.2f GB/s (best)\n", pages, argv[2], best * 1e3,
               sum / (RUNS - SKIP) * 1e3, BYTES / best / 1e9);
        wait(NULL);
    }
    return 0;
}
