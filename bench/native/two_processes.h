/* What bench/native/cma_allreduce.c and ring_push.c share: two forked processes that meet at
 * a barrier in shared memory, time with the monotonic clock, and copy between each other with
 * cross-memory attach. Include it after defining _GNU_SOURCE (process_vm_readv needs it). */
#ifndef XCCL_BENCH_TWO_PROCESSES_H
#define XCCL_BENCH_TWO_PROCESSES_H

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Waits until both processes arrived at their `++*round`-th barrier on the shared counter. */
static void barrier(_Atomic long *arrived, long *round) {
  long r = ++*round;
  atomic_fetch_add(arrived, 1);
  while (atomic_load(arrived) < 2 * r) sched_yield();
}

/* Copies n bytes between this process (local) and process pid (remote), either way. */
static void cross(int pid, void *local, void *remote, size_t n, int write) {
  for (size_t done = 0; done < n;) {
    struct iovec l = {(char *)local + done, n - done}, r = {(char *)remote + done, n - done};
    ssize_t k = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (k <= 0) {
      perror(write ? "process_vm_writev" : "process_vm_readv");
      exit(1);
    }
    done += (size_t)k;
  }
}

/* Whether every one of the n elements of out is want (process me says which is not). */
static int all_are(const float *out, size_t n, float want, int me) {
  for (size_t i = 0; i < n; i++)
    if (out[i] != want) {
      fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", me, i, out[i], want);
      return 0;
    }
  return 1;
}

#endif
