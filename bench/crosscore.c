/* bench/crosscore: what moving data between two cores costs on this machine, the floor under
 * every exchange between two ranks (the trainer's gradient sum, the all-reduce):
 *
 *   bench/crosscore [--cpus A,B] [--bytes N]
 *
 * Two threads pinned to cpus A and B (default 0 and 1): the round trip of one cache line written
 * in turn by each, and the rate at which B reads N bytes (default 1 MiB) that A has just written,
 * as a rank reads its peer's freshly computed gradient. Medians of 200 rounds of each. Measures
 * and prints; asserts nothing. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUNDS 200
#define TRIPS 20000

static _Atomic long turn __attribute__((aligned(64)));
static unsigned char *buf;
static size_t nbytes = 1 << 20;
static int cpu_a = 0, cpu_b = 1;
static volatile long sink;

static int pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* B's side: answers each ping, then reads the buffer each time A hands it over. */
static void *side_b(void *arg)
{
    (void)arg;
    if (pin(cpu_b) != 0)
        return (void *)1;
    for (long i = 0; i < (long)ROUNDS * TRIPS; i++) {
        while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * i + 1)
            ;
        atomic_store_explicit(&turn, 2 * i + 2, memory_order_release);
    }
    for (long r = 0; r < ROUNDS; r++) {
        while (atomic_load_explicit(&turn, memory_order_acquire) != -(2 * r + 1))
            ;
        long sum = 0;
        for (size_t k = 0; k < nbytes; k += sizeof(long))
            sum += *(const long *)(buf + k);
        sink = sum;
        atomic_store_explicit(&turn, -(2 * r + 2), memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    double trip[ROUNDS], rate[ROUNDS];
    pthread_t t;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cpus") == 0 && i + 1 < argc &&
            sscanf(argv[i + 1], "%d,%d", &cpu_a, &cpu_b) == 2) {
            i++;
        } else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc &&
                   (nbytes = strtoul(argv[i + 1], NULL, 10)) >= 4096) {
            nbytes &= ~(size_t)63;
            i++;
        } else {
            fprintf(stderr, "usage: %s [--cpus A,B] [--bytes N (4096 or more)]\n", argv[0]);
            return 2;
        }
    }
    buf = aligned_alloc(64, nbytes);
    if (buf == NULL) {
        fprintf(stderr, "crosscore: %zu bytes: %s\n", nbytes, strerror(errno));
        return 1;
    }
    memset(buf, 1, nbytes);
    /* Both cpus asked for first: B's thread failing to pin would leave A waiting for ever. */
    int r = pin(cpu_b);
    if (r == 0)
        r = pin(cpu_a);
    if (r != 0 || (r = pthread_create(&t, NULL, side_b, NULL)) != 0) {
        fprintf(stderr, "crosscore: cpus %d,%d: %s\n", cpu_a, cpu_b, strerror(r));
        return 1;
    }
    for (long k = 0; k < ROUNDS; k++) {
        double t0 = now_s();
        for (long i = k * TRIPS; i < (k + 1) * TRIPS; i++) {
            atomic_store_explicit(&turn, 2 * i + 1, memory_order_release);
            while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * i + 2)
                ;
        }
        trip[k] = (now_s() - t0) / TRIPS * 1e9;
    }
    for (long k = 0; k < ROUNDS; k++) {
        memset(buf, (int)k, nbytes); /* freshly written, as a gradient */
        double t0 = now_s();
        atomic_store_explicit(&turn, -(2 * k + 1), memory_order_release);
        while (atomic_load_explicit(&turn, memory_order_acquire) != -(2 * k + 2))
            ;
        rate[k] = (double)nbytes / (now_s() - t0) / 1e9;
    }
    void *failed = NULL;
    pthread_join(t, &failed);
    if (failed != NULL) {
        fprintf(stderr, "crosscore: cannot run on cpu %d\n", cpu_b);
        return 1;
    }
    qsort(trip, ROUNDS, sizeof(double), cmp_double);
    qsort(rate, ROUNDS, sizeof(double), cmp_double);
    printf("cpus %d,%d: a cache line's round trip %.0f ns (fastest round %.0f); cpu %d reads "
           "%zu bytes cpu %d has just written at %.2f GB/s (best round %.2f)\n",
           cpu_a, cpu_b, trip[ROUNDS / 2], trip[0], cpu_b, nbytes, cpu_a, rate[ROUNDS / 2],
           rate[ROUNDS - 1]);
    free(buf);
    return 0;
}
