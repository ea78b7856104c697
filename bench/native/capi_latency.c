/* The C API's blocking all-reduce, timed as `xccl bench` times the Rust call: per size, warm-up
 * runs, then back-to-back runs between two barriers; the time per run averaged over ranks.
 *
 *   xccl run -n 2 -- ./capi_latency 8 20000      (bytes, runs)
 *
 * Rank 0 prints "capi all_reduce <bytes> B <us> us". bench/native.sh runs it beside
 * `xccl bench all_reduce` in the same job, interleaved. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "xccl.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CALL(e)                                                                       \
    do {                                                                              \
        if ((e) != xcclSuccess) {                                                     \
            fprintf(stderr, "%s: %s\n", #e, xcclGetLastError());                      \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

int main(int argc, char **argv) {
    size_t bytes = argc > 1 ? strtoul(argv[1], NULL, 10) : 8;
    long runs = argc > 2 ? strtol(argv[2], NULL, 10) : 20000;
    size_t n = bytes / sizeof(float) ? bytes / sizeof(float) : 1;
    xcclComm_t comm;
    CALL(xcclCommInitFromEnv(&comm));
    int rank, size;
    CALL(xcclCommUserRank(comm, &rank));
    CALL(xcclCommCount(comm, &size));
    float *in = calloc(n, sizeof(float)), *out = calloc(n, sizeof(float));
    for (int i = 0; i < 100; i++) CALL(xcclAllReduce(in, out, n, xcclFloat32, xcclSum, comm, NULL));
    CALL(xcclBarrier(comm, NULL));
    double t0 = now();
    for (long i = 0; i < runs; i++) CALL(xcclAllReduce(in, out, n, xcclFloat32, xcclSum, comm, NULL));
    double per = (now() - t0) / runs;
    CALL(xcclBarrier(comm, NULL));
    double sum = per;
    CALL(xcclAllReduce(&sum, &sum, 1, xcclFloat64, xcclSum, comm, NULL));
    if (rank == 0) printf("capi all_reduce %zu B %.3f us\n", n * sizeof(float), sum / size * 1e6);
    CALL(xcclCommDestroy(comm));
    free(in);
    free(out);
    return 0;
}
