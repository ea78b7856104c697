// How fast a copy runs as a function of the distance between its destination and its source
// (modulo a 4 KiB page): the kernel's cross-memory copy (`process_vm_readv` of this process's
// own memory, as between two ranks), glibc's `memcpy`, and the vector loops of
// crates/xccl/src/copy.rs (16-byte SSE2 and 32-byte AVX2 moves). See docs/PERFORMANCE.md,
// "Copies at a short distance".
//
//   gcc -O2 -o /tmp/copy_distance bench/native/copy_distance.c && /tmp/copy_distance
//
// Each figure is the best of five passes; a pass copies between successive buffers of a
// 256 MiB region (at most 64 of them), so that large copies come from memory.
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((noinline)) static void sse2(char *d, const char *s, size_t n) {
    for (size_t i = 0; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const void *)(s + i)), b = _mm_loadu_si128((const void *)(s + i + 16)),
                c = _mm_loadu_si128((const void *)(s + i + 32)), e = _mm_loadu_si128((const void *)(s + i + 48));
        _mm_storeu_si128((void *)(d + i), a);
        _mm_storeu_si128((void *)(d + i + 16), b);
        _mm_storeu_si128((void *)(d + i + 32), c);
        _mm_storeu_si128((void *)(d + i + 48), e);
    }
}

__attribute__((noinline, target("avx2"))) static void avx2(char *d, const char *s, size_t n) {
    for (size_t i = 0; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const void *)(s + i)), b = _mm256_loadu_si256((const void *)(s + i + 32)),
                c = _mm256_loadu_si256((const void *)(s + i + 64)), e = _mm256_loadu_si256((const void *)(s + i + 96));
        _mm256_storeu_si256((void *)(d + i), a);
        _mm256_storeu_si256((void *)(d + i + 32), b);
        _mm256_storeu_si256((void *)(d + i + 64), c);
        _mm256_storeu_si256((void *)(d + i + 96), e);
    }
}

enum how { CMA, MEMCPY, SSE2, AVX2 };
static const char *names[] = {"process_vm_readv", "memcpy", "sse2 loop", "avx2 loop"};

int main(void) {
    size_t cap = 256u << 20;
    char *a = mmap(0, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = mmap(0, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED || b == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(a, 1, cap);
    memset(b, 2, cap);
    size_t sizes[] = {64u << 10, 512u << 10, 4u << 20};
    size_t dists[] = {0, 1, 8, 16, 24, 32, 48, 63, 64, 256, 2048, 4095};
    for (int z = 0; z < 3; z++) {
        size_t n = sizes[z];
        size_t slots = (cap - 8192) / n;
        if (slots > 64) slots = 64;
        for (unsigned k = 0; k < sizeof dists / sizeof *dists; k++) {
            size_t dist = dists[k];
            printf("%5zu KiB, destination %4zu B past the source:", n >> 10, dist);
            for (int h = CMA; h <= AVX2; h++) {
                double best = 1e9;
                for (int rep = 0; rep < 5; rep++) {
                    double t = now();
                    for (size_t i = 0; i < slots; i++) {
                        char *d = b + i * n + dist, *s = a + i * n;
                        if (h == CMA) {
                            struct iovec l = {d, n}, r = {s, n};
                            if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)n) {
                                perror("process_vm_readv");
                                return 1;
                            }
                        } else if (h == MEMCPY) {
                            memcpy(d, s, n);
                        } else if (h == SSE2) {
                            sse2(d, s, n);
                        } else {
                            avx2(d, s, n);
                        }
                    }
                    double e = (now() - t) / slots;
                    if (e < best) best = e;
                }
                printf("  %s %.2f GB/s", names[h], n / best / 1e9);
            }
            printf("\n");
        }
    }
    return 0;
}
