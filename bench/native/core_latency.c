/* The state of the machine, as the ranks of a job on two cores see it: the round trip of one
 * cache line between two threads bound to two cores. On a virtual machine whose host moves
 * its vCPUs, this changes for seconds at a time (on this project's AMD EPYC guest: about
 * 100 ns, then about 500 ns), and every shared-memory collective between the two cores with
 * it, xccl's and Open MPI's alike (docs/PERFORMANCE.md, "Dependability: launch to launch").
 * bench/launches.sh runs it before and after each launch to tell the machine's state from
 * the job's.
 *
 *   gcc -O2 -pthread -o /tmp/core_latency bench/native/core_latency.c
 *   /tmp/core_latency            one figure: the round trip (ns) over 30 ms
 *   /tmp/core_latency 200 50     fifty figures, one per 200 ms (the state over ten seconds)
 *   CORES=2,3 /tmp/core_latency  between cores 2 and 3 (default 0,1)
 *
 * A figure is the best batch of 100 round trips within its window, not the mean: a batch
 * whose thread was descheduled (a busy core, a timer tick) says nothing about the line's
 * round trip, and windows on a busy core still hold batches that ran whole.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BATCH = 100 };
static _Alignas(128) _Atomic long line;
static _Atomic int stop;
static int cores[2] = {0, 1};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int bind_to(int core) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(core, &s);
  return sched_setaffinity(0, sizeof s, &s);
}

/* Answers each odd value with the next even one until told to stop. */
static void *echo(void *arg) {
  (void)arg;
  bind_to(cores[1]);
  long want = 1;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    if (atomic_load_explicit(&line, memory_order_acquire) == want) {
      atomic_store_explicit(&line, want + 1, memory_order_release);
      want += 2;
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  double ms = argc > 1 ? atof(argv[1]) : 30;
  int count = argc > 2 ? atoi(argv[2]) : 1;
  const char *c = getenv("CORES");
  if (c && sscanf(c, "%d,%d", &cores[0], &cores[1]) != 2) {
    fprintf(stderr, "CORES=%s: expected two core numbers, as in CORES=0,1\n", c);
    return 2;
  }
  if (ms <= 0 || count < 1) {
    fprintf(stderr, "usage: core_latency [window ms > 0] [windows >= 1]\n");
    return 2;
  }
  if (bind_to(cores[0]) != 0) {
    fprintf(stderr, "cannot bind to core %d (does this machine have it?)\n", cores[0]);
    return 2;
  }
  pthread_t t;
  if (pthread_create(&t, NULL, echo, NULL) != 0) {
    perror("pthread_create");
    return 1;
  }
  long v = 0;
  for (int w = 0; w < count; w++) {
    double start = now(), best = 1e9;
    while (now() - start < ms * 1e-3) {
      double a = now();
      for (int i = 0; i < BATCH; i++) {
        atomic_store_explicit(&line, v + 1, memory_order_release);
        while (atomic_load_explicit(&line, memory_order_acquire) != v + 2) {
        }
        v += 2;
      }
      double per = (now() - a) / BATCH;
      if (per < best) best = per;
    }
    printf(w + 1 < count ? "%.0f " : "%.0f\n", best * 1e9);
    fflush(stdout);
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  return 0;
}
