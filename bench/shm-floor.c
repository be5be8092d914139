/* What this machine allows a two-process shared-memory all-reduce, measured without the
 * collective library, so that bench/allreduce's shm figures can be read against it:
 *
 *   memcpy      one process copies BYTES between two private buffers;
 *   cross-core  one process copies a chunk into a double-buffered shared slot, the other reads
 *               it as it arrives: how fast data written by one core reaches the other;
 *   zero-copy   both inputs already in one shared mapping; each process sums both into its own
 *               output, with a barrier before and after: an all-reduce that copies nothing;
 *   halves      inputs and outputs in shared mappings; each process sums its half of both inputs
 *               into its output, then copies the other half from the other's output.
 *   copy        private inputs and outputs, as malloc'd buffers are: each process copies its
 *               input into its own shared slot (two, used in turn), sets a flag, waits for the
 *               other's and sums its input and the other's slot into its output, with the same
 *               barriers as zero-copy: the least an all-reduce pays that reads nothing of the
 *               other process's memory but what was copied into shared memory for it.
 *
 * Ordinary user buffers allow neither zero-copy nor halves: their data must first cross into
 * shared memory (copy), unless the pages themselves are made shared.
 *
 * Figures are GB/s of BYTES (for zero-copy that is busbw with 2 ranks); each is the best of
 * --runs timings.
 *
 * --fresh-inputs: zero-copy, halves and copy rewrite each process's input (a memset, its byte
 * changing from run to run) before the barrier that starts each timed run, as bench/allreduce
 * --fresh-inputs does, so that the other process reads lines this one just wrote, as after a
 * backward pass; without it the inputs stay clean in both cores' caches from run to run.
 *
 * --mean: zero-copy, halves and copy give the fastest of three batches' mean time a run (the runs
 * split in three), bench/allreduce's own figure, instead of the fastest single run, which on a
 * busy machine flatters the floor against a mean. */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE 128

/* --mean: batches whose mean time a run is taken (0: the fastest single run). */
static int mean_batches;

/* The same kernel build as collective/reduce.c: -O3 (meson.build) and a copy per vector ISA. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL
#endif

typedef struct {
    _Atomic uint32_t posted; /* writer: chunks written, or barrier generation */
    char pad[LINE - 4];
    _Atomic uint32_t taken; /* reader: chunks read, or barrier generation */
    char pad2[LINE - 4];
} sync_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void wait_reach(_Atomic uint32_t *word, uint32_t k)
{
    while ((int32_t)(atomic_load_explicit(word, memory_order_acquire) - k) < 0)
        ;
}

static void *map_shared(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "shm-floor: mmap %zu bytes: %s\n", bytes, strerror(errno));
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

static float *private_floats(size_t bytes, int fill)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes) != 0) {
        fprintf(stderr, "shm-floor: out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, fill, bytes);
    return p;
}

/* Kept out of line so that the compiler cannot drop the loads. */
/* XOR of the words: a reduction the compiler vectorizes without reassociating floats. Out of
 * line so that the loads cannot be dropped. */
KERNEL __attribute__((noinline)) static uint64_t xor_words(const uint64_t *a, size_t n)
{
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++)
        x ^= a[i];
    return x;
}

KERNEL static void add_floats(float *restrict out, const float *restrict a, const float *restrict b,
                              size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static double bench_memcpy(size_t bytes, int runs)
{
    float *a = private_floats(bytes, 1), *b = private_floats(bytes, 2);
    double best = 1e30;
    for (int r = 0; r < runs; r++) {
        double t = now_s();
        memcpy(b, a, bytes);
        t = now_s() - t;
        best = t < best ? t : best;
    }
    free(a);
    free(b);
    return (double)bytes / best / 1e9;
}

static pid_t fork_or_die(void)
{
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "shm-floor: fork: %s\n", strerror(errno));
        exit(1);
    }
    return pid;
}

static void reap(pid_t pid)
{
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "shm-floor: helper process failed\n");
        exit(1);
    }
}

static double bench_cross_core(size_t bytes, size_t chunk, int runs)
{
    sync_t *sy = map_shared(sizeof(*sy));
    char *slots = map_shared(2 * chunk);
    uint32_t chunks = (uint32_t)(bytes / chunk), total = chunks * (uint32_t)runs;
    pid_t pid = fork_or_die();
    if (pid == 0) {
        float *src = private_floats(chunk, 3);
        for (uint32_t k = 1; k <= total; k++) {
            wait_reach(&sy->taken, k < 2 ? 0 : k - 2); /* the slot's last reader is done */
            memcpy(slots + (k & 1) * chunk, src, chunk);
            atomic_store_explicit(&sy->posted, k, memory_order_release);
        }
        _exit(0);
    }
    volatile uint64_t sink = 0;
    double best = 1e30;
    uint32_t k = 0;
    for (int r = 0; r < runs; r++) {
        double t = now_s();
        for (uint32_t c = 0; c < chunks; c++) {
            k++;
            wait_reach(&sy->posted, k);
            sink ^= xor_words((const uint64_t *)(slots + (k & 1) * chunk), chunk / 8);
            atomic_store_explicit(&sy->taken, k, memory_order_release);
        }
        t = now_s() - t;
        best = t < best ? t : best;
    }
    (void)sink;
    reap(pid);
    munmap(slots, 2 * chunk);
    munmap(sy, sizeof(*sy));
    return (double)chunks * (double)chunk / best / 1e9;
}

static void barrier(sync_t *sy, int me, uint32_t *gen)
{
    atomic_store_explicit(me == 0 ? &sy->posted : &sy->taken, ++*gen, memory_order_release);
    wait_reach(me == 0 ? &sy->taken : &sy->posted, *gen);
}

enum { FORM_ZERO_COPY, FORM_HALVES, FORM_COPY };

/* copy: member me's input, private, copied into its slot of run r (slots: both members' two),
 * then summed with the other's slot of the same run; posted counts the runs copied in. */
static void copy_member(sync_t *sy, int me, const float *in, char *slots, float *out, size_t n,
                        uint32_t r)
{
    size_t bytes = n * sizeof(float);
    _Atomic uint32_t *mine = me == 0 ? &sy->posted : &sy->taken;
    _Atomic uint32_t *theirs = me == 0 ? &sy->taken : &sy->posted;
    char *slot = slots + ((size_t)me * 2 + (r & 1)) * bytes;
    memcpy(slot, in, bytes);
    atomic_store_explicit(mine, r, memory_order_release);
    wait_reach(theirs, r);
    add_floats(out, in, (const float *)(slots + ((size_t)(1 - me) * 2 + (r & 1)) * bytes), n);
}

/* Both members, runs times: barrier, the all-reduce, barrier. in holds both inputs (for copy,
 * this member's private one), outs both outputs (halves), the slots (copy) or NULL (out is
 * private). Returns the best time. */
static double zero_copy_member(sync_t *sy, int me, int form, float *in, float *outs, float *out,
                               size_t n, int runs, int fresh)
{
    uint32_t gen = 0;
    size_t h = n / 2;
    double best = 1e30, sum = 0;
    int per = mean_batches > 0 ? (runs + mean_batches - 1) / mean_batches : 1, in_batch = 0;
    for (int r = 0; r < runs; r++) {
        /* Normal floats' patterns (0x3f3f3f3f, 0x40404040): no denormals to slow the sums. */
        float *mine_in = form == FORM_COPY ? in : in + (size_t)me * n;
        if (fresh)
            memset(mine_in, r & 1 ? 0x40 : 0x3f, n * sizeof(float));
        barrier(sy, me, &gen);
        double t = now_s();
        if (form == FORM_COPY) {
            /* The barriers are two counts a run on the same words: the copy's flag comes
             * between, one above the opening barrier's generation. */
            copy_member(sy, me, in, (char *)outs, out, n, ++gen);
        } else if (form == FORM_ZERO_COPY) {
            add_floats(out, in, in + n, n);
        } else {
            float *mine = outs + (size_t)me * n;
            const float *theirs = outs + (size_t)(1 - me) * n;
            size_t lo = me == 0 ? 0 : h, hi = me == 0 ? h : n;
            add_floats(mine + lo, in + lo, in + n + lo, hi - lo);
            barrier(sy, me, &gen);
            lo = me == 0 ? h : 0, hi = me == 0 ? n : h;
            memcpy(mine + lo, theirs + lo, (hi - lo) * sizeof(float));
        }
        barrier(sy, me, &gen);
        sum += now_s() - t;
        if (++in_batch == per || r == runs - 1) {
            best = sum / in_batch < best ? sum / in_batch : best;
            sum = 0;
            in_batch = 0;
        }
    }
    return best;
}

static double bench_zero_copy(size_t bytes, int runs, int form, int fresh)
{
    sync_t *sy = map_shared(sizeof(*sy));
    /* copy: the inputs are private (below); `outs` holds the four slots instead. */
    size_t in_len = form == FORM_COPY ? 0 : 2 * bytes;
    size_t outs_len = form == FORM_HALVES ? 2 * bytes : form == FORM_COPY ? 4 * bytes : 0;
    float *in = in_len > 0 ? map_shared(in_len) : NULL;
    float *outs = outs_len > 0 ? map_shared(outs_len) : NULL;
    size_t n = bytes / sizeof(float);
    if (in != NULL)
        memset(in, 1, in_len);
    pid_t pid = fork_or_die();
    if (pid == 0) {
        float *out = form == FORM_HALVES ? NULL : private_floats(bytes, 0);
        float *own = form == FORM_COPY ? private_floats(bytes, 1) : in;
        zero_copy_member(sy, 1, form, own, outs, out, n, runs, fresh);
        _exit(0);
    }
    float *out = form == FORM_HALVES ? NULL : private_floats(bytes, 0);
    float *own = form == FORM_COPY ? private_floats(bytes, 1) : in;
    double best = zero_copy_member(sy, 0, form, own, outs, out, n, runs, fresh);
    reap(pid);
    free(out);
    if (own != in)
        free(own);
    if (outs != NULL)
        munmap(outs, outs_len);
    if (in != NULL)
        munmap(in, in_len);
    munmap(sy, sizeof(*sy));
    return (double)bytes / best / 1e9;
}

static int parse_size(const char *s, size_t *ret)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    if (*end != '\0' || v < 4096)
        return -1;
    *ret = (size_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    size_t bytes = 64 << 20, chunk = 512 << 10;
    int runs = 10, json = 0, fresh = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        if (strcmp(a, "--fresh-inputs") == 0) {
            fresh = 1;
            continue;
        }
        if (strcmp(a, "--mean") == 0) {
            mean_batches = 3;
            continue;
        }
        int bad = v == NULL;
        if (!bad && strcmp(a, "--bytes") == 0)
            bad = parse_size(v, &bytes) < 0;
        else if (!bad && strcmp(a, "--chunk") == 0)
            bad = parse_size(v, &chunk) < 0;
        else if (!bad && strcmp(a, "--runs") == 0)
            bad = (runs = atoi(v)) < 1 || runs > 1000;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr,
                    "usage: %s [--bytes N[K|M]] [--chunk N[K|M]] [--runs N] [--json] "
                    "[--fresh-inputs] [--mean]\n",
                    argv[0]);
            return 2;
        }
        i++;
    }
    if (chunk > bytes || bytes % chunk != 0 || chunk % 64 != 0) {
        fprintf(stderr, "shm-floor: --chunk must divide --bytes and be a multiple of 64\n");
        return 2;
    }
    struct {
        const char *name;
        double gbs;
    } rows[] = {{"memcpy", bench_memcpy(bytes, runs)},
                {"cross-core", bench_cross_core(bytes, chunk, runs)},
                {"zero-copy", bench_zero_copy(bytes, runs, FORM_ZERO_COPY, fresh)},
                {"halves", bench_zero_copy(bytes, runs, FORM_HALVES, fresh)},
                {"copy", bench_zero_copy(bytes, runs, FORM_COPY, fresh)}};
    if (!json)
        printf("%zu bytes, best of %d runs (cross-core in %zu-byte chunks)\n%-12s %8s\n", bytes,
               runs, chunk, "floor", "GB/s");
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        if (json)
            printf("{\"floor\": \"%s\", \"bytes\": %zu, \"gbs\": %.3f}\n", rows[i].name, bytes,
                   rows[i].gbs);
        else
            printf("%-12s %8.2f\n", rows[i].name, rows[i].gbs);
    }
    return 0;
}
