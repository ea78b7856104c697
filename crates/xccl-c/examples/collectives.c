/* Every collective of the C API, checked against a reference computed here from what each
 * rank contributes: blocking and asynchronous forms, in place and out of place, three element
 * types, the uneven forms, point-to-point, split and dup, a timed wait, memory from
 * xcclMemAlloc, and errors.
 *
 *   cc collectives.c $(pkg-config --cflags --libs xccl) -o collectives
 *   xccl run -n 3 -- ./collectives
 *
 * Prints "collectives: N checks passed on rank R of S" and exits 0, or names the first
 * wrong element and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xccl.h"

static int rank, size, checks;
static xcclComm_t comm;

#define CALL(expr)                                                                          \
    do {                                                                                    \
        xcclResult_t rc_ = (expr);                                                          \
        if (rc_ != xcclSuccess) {                                                           \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #expr,                    \
                    xcclGetErrorString(rc_), xcclGetLastError());                           \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* What rank r contributes at index i: distinct, exact in every type used. */
static double value(int r, size_t i) { return (double)(r * 100 + (int)(i % 97)); }

static void expect(const char *what, size_t i, double got, double want) {
    checks++;
    if (got != want) {
        fprintf(stderr, "rank %d: %s: element %zu is %g, expected %g\n", rank, what, i, got, want);
        exit(1);
    }
}

/* Element i of a buffer of type t, and storing one. */
static double get(xcclDataType_t t, const void *b, size_t i) {
    switch (t) {
    case xcclFloat32: return ((const float *)b)[i];
    case xcclFloat64: return ((const double *)b)[i];
    default: return ((const int32_t *)b)[i];
    }
}
static void put(xcclDataType_t t, void *b, size_t i, double v) {
    switch (t) {
    case xcclFloat32: ((float *)b)[i] = (float)v; break;
    case xcclFloat64: ((double *)b)[i] = v; break;
    default: ((int32_t *)b)[i] = (int32_t)v; break;
    }
}
static size_t width(xcclDataType_t t) { return t == xcclFloat64 ? 8 : 4; }

/* A buffer of n elements holding rank r's contribution from index `from` on. */
static void *filled(xcclDataType_t t, size_t n, int r, size_t from) {
    void *b = calloc(n ? n : 1, width(t));
    for (size_t i = 0; i < n; i++) put(t, b, i, value(r, from + i));
    return b;
}

/* Runs a call either blocking (work == NULL) or started and then waited on. */
static void finish(xcclWork_t w) {
    if (w) {
        CALL(xcclWait(w, -1));
        CALL(xcclWorkFree(w));
    }
}

static void reductions(xcclDataType_t t, size_t n, int async) {
    xcclWork_t w = NULL, *wp = async ? &w : NULL;
    /* all-reduce sum, out of place */
    void *in = filled(t, n, rank, 0), *out = calloc(n, width(t));
    CALL(xcclAllReduce(in, out, n, t, xcclSum, comm, wp));
    finish(w);
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < size; r++) s += value(r, i);
        expect("all_reduce sum", i, get(t, out, i), s);
    }
    /* all-reduce max, in place */
    CALL(xcclAllReduce(in, in, n, t, xcclMax, comm, wp));
    finish(w);
    for (size_t i = 0; i < n; i++) expect("all_reduce max", i, get(t, in, i), value(size - 1, i));
    free(in);
    /* reduce to the last rank */
    int root = size - 1;
    in = filled(t, n, rank, 0);
    memset(out, 0, n * width(t));
    CALL(xcclReduce(in, rank == root ? out : NULL, n, t, xcclSum, root, comm, wp));
    finish(w);
    if (rank == root)
        for (size_t i = 0; i < n; i++) {
            double s = 0;
            for (int r = 0; r < size; r++) s += value(r, i);
            expect("reduce", i, get(t, out, i), s);
        }
    free(in);
    free(out);
    /* reduce-scatter: rank r gets the sum of block r */
    in = filled(t, n * size, rank, 0);
    out = calloc(n, width(t));
    CALL(xcclReduceScatter(in, out, n, t, xcclSum, comm, wp));
    finish(w);
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < size; r++) s += value(r, rank * n + i);
        expect("reduce_scatter", i, get(t, out, i), s);
    }
    free(in);
    free(out);
    /* uneven reduce-scatter: rank r gets r + 1 elements */
    size_t counts[64], total = 0, offset = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = (size_t)r + 1;
        if (r < rank) offset += counts[r];
        total += counts[r];
    }
    in = filled(t, total, rank, 0);
    out = calloc(counts[rank], width(t));
    CALL(xcclReduceScatterV(in, out, counts, t, xcclSum, comm, wp));
    finish(w);
    for (size_t i = 0; i < counts[rank]; i++) {
        double s = 0;
        for (int r = 0; r < size; r++) s += value(r, offset + i);
        expect("reduce_scatter_v", i, get(t, out, i), s);
    }
    free(in);
    free(out);
}

static void movement(xcclDataType_t t, size_t n, int async) {
    xcclWork_t w = NULL, *wp = async ? &w : NULL;
    int root = size > 1 ? 1 : 0;
    /* broadcast from rank 1, out of place */
    void *in = filled(t, n, rank, 0), *out = calloc(n, width(t));
    CALL(xcclBroadcast(in, out, n, t, root, comm, wp));
    finish(w);
    for (size_t i = 0; i < n; i++) expect("broadcast", i, get(t, out, i), value(root, i));
    free(in);
    free(out);
    /* all-gather */
    in = filled(t, n, rank, 0);
    out = calloc(n * size, width(t));
    CALL(xcclAllGather(in, out, n, t, comm, wp));
    finish(w);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++) expect("all_gather", r * n + i, get(t, out, r * n + i), value(r, i));
    free(out);
    /* gather to rank 0, scatter from rank 0 */
    out = rank == 0 ? calloc(n * size, width(t)) : NULL;
    CALL(xcclGather(in, out, n, t, 0, comm, wp));
    finish(w);
    if (rank == 0)
        for (int r = 0; r < size; r++)
            for (size_t i = 0; i < n; i++) expect("gather", r * n + i, get(t, out, r * n + i), value(r, i));
    free(in);
    free(out);
    in = rank == 0 ? filled(t, n * size, 0, 0) : NULL;
    out = calloc(n, width(t));
    CALL(xcclScatter(in, out, n, t, 0, comm, wp));
    finish(w);
    for (size_t i = 0; i < n; i++) expect("scatter", i, get(t, out, i), value(0, rank * n + i));
    free(in);
    free(out);
    /* all-to-all: block q of rank r goes to block r of rank q */
    in = filled(t, n * size, rank, 0);
    out = calloc(n * size, width(t));
    CALL(xcclAllToAll(in, out, n, t, comm, wp));
    finish(w);
    for (int q = 0; q < size; q++)
        for (size_t i = 0; i < n; i++) expect("all_to_all", q * n + i, get(t, out, q * n + i), value(q, rank * n + i));
    free(in);
    free(out);
    /* uneven forms: rank r holds r * 2 elements (rank 0 none) */
    size_t counts[64], displs[64], total = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = (size_t)r * 2;
        displs[r] = total;
        total += counts[r];
    }
    in = filled(t, counts[rank], rank, 0);
    out = calloc(total + 1, width(t));
    CALL(xcclAllGatherV(in, out, counts[rank], counts, t, comm, wp));
    finish(w);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < counts[r]; i++) expect("all_gather_v", displs[r] + i, get(t, out, displs[r] + i), value(r, i));
    memset(out, 0, (total + 1) * width(t));
    root = size - 1;
    CALL(xcclGatherV(in, rank == root ? out : NULL, counts[rank], counts, t, root, comm, wp));
    finish(w);
    if (rank == root)
        for (int r = 0; r < size; r++)
            for (size_t i = 0; i < counts[r]; i++) expect("gather_v", displs[r] + i, get(t, out, displs[r] + i), value(r, i));
    free(in);
    free(out);
    in = rank == root ? filled(t, total, root, 0) : NULL;
    out = calloc(counts[rank] + 1, width(t));
    CALL(xcclScatterV(in, out, counts, counts[rank], t, root, comm, wp));
    finish(w);
    for (size_t i = 0; i < counts[rank]; i++) expect("scatter_v", i, get(t, out, i), value(root, displs[rank] + i));
    free(in);
    free(out);
    /* uneven all-to-all: rank r sends q + 1 elements to rank q */
    size_t send[64], recv[64], stotal = 0, rtotal = 0;
    for (int q = 0; q < size; q++) {
        send[q] = (size_t)q + 1;
        recv[q] = (size_t)rank + 1;
        stotal += send[q];
        rtotal += recv[q];
    }
    in = filled(t, stotal, rank, 0);
    out = calloc(rtotal, width(t));
    CALL(xcclAllToAllV(in, out, send, recv, t, comm, wp));
    finish(w);
    /* from rank q: its block for this rank starts at sum_{p < rank} (p + 1) */
    size_t from = (size_t)rank * (rank + 1) / 2;
    for (int q = 0; q < size; q++)
        for (size_t i = 0; i < recv[q]; i++)
            expect("all_to_all_v", q * recv[q] + i, get(t, out, q * recv[q] + i), value(q, from + i));
    free(in);
    free(out);
}

/* A ring of sends and receives, two tags in flight. */
static void point_to_point(void) {
    if (size < 2) return;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    double a[5], b[5], got_a[5], got_b[5];
    for (int i = 0; i < 5; i++) {
        a[i] = value(rank, i);
        b[i] = -value(rank, i);
    }
    xcclWork_t s1, s2, r1, r2;
    CALL(xcclRecv(got_b, 5, xcclFloat64, prev, 2, comm, &r2));
    CALL(xcclSend(a, 5, xcclFloat64, next, 1, comm, &s1));
    CALL(xcclSend(b, 5, xcclFloat64, next, 2, comm, &s2));
    CALL(xcclRecv(got_a, 5, xcclFloat64, prev, 1, comm, &r1));
    finish(s1);
    finish(s2);
    finish(r1);
    finish(r2);
    for (int i = 0; i < 5; i++) {
        expect("recv tag 1", i, got_a[i], value(prev, i));
        expect("recv tag 2", i, got_b[i], -value(prev, i));
    }
}

/* A receive nobody has sent yet: a test and a timed wait say "not yet"; rank 1 sends only
 * once rank 0 tells it so, on a duplicate communicator (operations of one communicator run
 * in issue order, so the signal cannot travel on the first). */
static void timed_wait(void) {
    if (size < 2) return;
    xcclComm_t side = NULL;
    CALL(xcclCommDup(comm, &side));
    int32_t x = -1, one = 42, go = 1;
    if (rank == 0) {
        xcclWork_t w = NULL;
        CALL(xcclRecv(&x, 1, xcclInt32, 1, 9, comm, &w));
        int done = 1;
        CALL(xcclTest(w, &done));
        xcclResult_t rc = xcclWait(w, 50);
        checks++;
        if (done || rc != xcclInProgress) {
            fprintf(stderr, "rank 0: a receive completed before its send (test %d, wait %d)\n", done, rc);
            exit(1);
        }
        CALL(xcclSend(&go, 1, xcclInt32, 1, 0, side, NULL));
        finish(w);
        expect("timed receive", 0, x, 42);
    } else if (rank == 1) {
        CALL(xcclRecv(&go, 1, xcclInt32, 0, 0, side, NULL));
        CALL(xcclSend(&one, 1, xcclInt32, 0, 9, comm, NULL));
    }
    CALL(xcclCommDestroy(side));
}

/* Split into even and odd ranks, a duplicate, each with its own all-reduce. */
static void groups(void) {
    xcclComm_t half = NULL, dup = NULL;
    CALL(xcclCommSplit(comm, rank % 2, -rank, &half));
    int hrank, hsize;
    CALL(xcclCommUserRank(half, &hrank));
    CALL(xcclCommCount(half, &hsize));
    checks++;
    if (hsize != (size + 1 - rank % 2) / 2) {
        fprintf(stderr, "rank %d: split group of %d ranks\n", rank, hsize);
        exit(1);
    }
    int64_t v = rank, sum = 0;
    CALL(xcclAllReduce(&v, &v, 1, xcclInt64, xcclSum, half, NULL));
    for (int r = rank % 2; r < size; r += 2) sum += r;
    expect("split all_reduce", 0, (double)v, (double)sum);
    /* key -rank: the highest rank comes first */
    int before = 0;
    for (int r = rank % 2; r < size; r += 2) before += r > rank;
    expect("split order", 0, hrank, before);
    CALL(xcclCommDup(comm, &dup));
    v = 1;
    CALL(xcclAllReduce(&v, &v, 1, xcclInt64, xcclSum, dup, NULL));
    expect("dup all_reduce", 0, (double)v, size);
    xcclComm_t none = half;
    CALL(xcclCommSplit(comm, rank == 0 ? XCCL_SPLIT_NOCOLOR : 0, 0, &none));
    checks++;
    if ((rank == 0) != (none == NULL)) {
        fprintf(stderr, "rank %d: XCCL_SPLIT_NOCOLOR\n", rank);
        exit(1);
    }
    CALL(xcclCommDestroy(none));
    CALL(xcclCommDestroy(dup));
    CALL(xcclCommDestroy(half));
}

/* Memory from xcclMemAlloc: zeroed, aligned to 2 MiB, usable by every call (an all-reduce
 * large enough to be copied between processes straight out of the peer's memory), freed
 * once; a pointer it did not return is refused. */
static void memory(void) {
    size_t n = 3 << 20; /* floats: 12 MiB */
    float *in = NULL, *out = NULL;
    CALL(xcclMemAlloc((void **)&in, n * sizeof(float)));
    CALL(xcclMemAlloc((void **)&out, n * sizeof(float)));
    checks++;
    if ((uintptr_t)in % (2u << 20) != 0 || out == in) {
        fprintf(stderr, "rank %d: xcclMemAlloc returned %p and %p\n", rank, (void *)in, (void *)out);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        expect("xcclMemAlloc zeroed", i, out[i], 0);
        in[i] = (float)value(rank, i);
    }
    CALL(xcclAllReduce(in, out, n, xcclFloat32, xcclSum, comm, NULL));
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < size; r++) s += value(r, i);
        expect("all_reduce on xcclMemAlloc memory", i, out[i], s);
    }
    CALL(xcclMemFree(in));
    CALL(xcclMemFree(out));
    CALL(xcclMemFree(NULL));
    void *none = (void *)1;
    CALL(xcclMemAlloc(&none, 0));
    checks++;
    xcclResult_t rc = xcclMemFree(out);
    if (none != NULL || rc != xcclInvalidArgument || !strstr(xcclGetLastError(), "freed already")) {
        fprintf(stderr, "rank %d: xcclMemFree twice: %d %s\n", rank, rc, xcclGetLastError());
        exit(1);
    }
}

/* Wrong arguments fail at once, on the rank that passed them, with a message. */
static void errors(void) {
    float x = 0;
    xcclResult_t rc = xcclBroadcast(&x, &x, 1, xcclFloat32, size, comm, NULL);
    checks++;
    if (rc != xcclInvalidArgument || !strstr(xcclGetLastError(), "root")) {
        fprintf(stderr, "rank %d: broadcast from root %d: %d %s\n", rank, size, rc, xcclGetLastError());
        exit(1);
    }
    rc = xcclAllReduce(&x, &x, 1, 77, xcclSum, comm, NULL);
    checks++;
    if (rc != xcclInvalidArgument || !strstr(xcclGetLastError(), "datatype 77")) {
        fprintf(stderr, "rank %d: datatype 77: %d %s\n", rank, rc, xcclGetLastError());
        exit(1);
    }
    rc = xcclAllReduce(NULL, NULL, 4, xcclFloat32, xcclSum, comm, NULL);
    checks++;
    if (rc != xcclInvalidArgument || !strstr(xcclGetLastError(), "NULL")) {
        fprintf(stderr, "rank %d: NULL buffers: %d %s\n", rank, rc, xcclGetLastError());
        exit(1);
    }
}

int main(void) {
    int version = 0;
    CALL(xcclGetVersion(&version));
    CALL(xcclCommInitFromEnv(&comm));
    CALL(xcclCommUserRank(comm, &rank));
    CALL(xcclCommCount(comm, &size));
    if (size > 64) {
        fprintf(stderr, "at most 64 ranks\n");
        return 1;
    }
    xcclDataType_t types[] = {xcclFloat32, xcclFloat64, xcclInt32};
    size_t sizes[] = {1, 1000, 70000};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 3; s++)
            for (int async = 0; async < 2; async++) {
                reductions(types[t], sizes[s], async);
                movement(types[t], sizes[s], async);
            }
    point_to_point();
    timed_wait();
    groups();
    memory();
    errors();
    CALL(xcclBarrier(comm, NULL));
    CALL(xcclCommDestroy(comm));
    printf("collectives: %d checks passed on rank %d of %d (xccl %d)\n", checks, rank, size, version);
    return 0;
}
