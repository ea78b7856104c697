/* What waiting costs on this machine: two threads, each bound to its own core, pass a counter
 * back and forth N times, waiting by spinning, by sched_yield, or by sleeping on a futex (so
 * every hand-off wakes a sleeping thread on an idle core). Prints the round trip per mode;
 * a futex round trip is two wake-ups. With CORES=same both threads share core 0 (yield only).
 *
 *   gcc -O2 -pthread -o /tmp/wake_latency bench/native/wake_latency.c && /tmp/wake_latency
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { SPIN, YIELD, FUTEX };
static const char *names[] = {"spin", "yield", "futex"};
static _Atomic int word[2];
static int mode, n = 20000, same;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void bind(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  sched_setaffinity(0, sizeof s, &s);
}

static void wait_for(int i, int v) {
  int c;
  while ((c = atomic_load(&word[i])) != v) {
    if (mode == YIELD) sched_yield();
    if (mode == FUTEX) syscall(SYS_futex, &word[i], FUTEX_WAIT, c, NULL, NULL, 0);
  }
}

static void post(int i, int v) {
  atomic_store(&word[i], v);
  if (mode == FUTEX) syscall(SYS_futex, &word[i], FUTEX_WAKE, 1, NULL, NULL, 0);
}

static void *peer(void *arg) {
  (void)arg;
  bind(same ? 0 : 1);
  for (int k = 1; k <= n; k++) {
    wait_for(0, k);
    post(1, k);
  }
  return NULL;
}

int main(void) {
  same = getenv("CORES") && strcmp(getenv("CORES"), "same") == 0;
  for (mode = same ? YIELD : SPIN; mode <= (same ? YIELD : FUTEX); mode++) {
    atomic_store(&word[0], 0);
    atomic_store(&word[1], 0);
    bind(0);
    pthread_t t;
    pthread_create(&t, NULL, peer, NULL);
    usleep(1000);
    double start = now_us();
    for (int k = 1; k <= n; k++) {
      post(0, k);
      wait_for(1, k);
    }
    double took = now_us() - start;
    pthread_join(t, NULL);
    printf("%-5s round trip %8.2f us (%s)\n", names[mode], took / n, same ? "one core" : "two cores");
  }
  return 0;
}
