/* Shared between the trainer's files; not part of the public API. */
#ifndef DL_TRAINER_INTERNAL_H
#define DL_TRAINER_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer.h"

/* Hot loops get AVX2 and AVX-512 versions picked at load time. The library is built with
 * -ffp-contract=off, so every version rounds exactly alike: ranks on different CPUs still apply
 * bitwise identical optimizer steps and stay replicas. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
#define DL__TRAIN_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DL__TRAIN_HOT
#endif

/* xoshiro256**: small, fast, and its whole state fits in a checkpoint. */
typedef struct dl__train_rng_s {
    uint64_t s[4];
} dl__train_rng_t;

/* Seeds the four words from splitmix64(seed), as the xoshiro authors recommend. */
void dl__train_rng_seed(dl__train_rng_t *r, uint64_t seed);
uint64_t dl__train_rng_next(dl__train_rng_t *r);
/* Uniform in [0, bound) without modulo bias (Lemire); bound > 0. */
uint64_t dl__train_rng_below(dl__train_rng_t *r, uint64_t bound);
/* Uniform float in [0, 1) from the top 24 bits. */
float dl__train_rng_float(dl__train_rng_t *r);

/* splitmix64's finalizer, to derive independent seeds from (seed, epoch). */
uint64_t dl__train_mix64(uint64_t x);

/* snprintf into err when err is not NULL; always returns rc, for `return dl__train_err(...)`. */
int dl__train_err(int rc, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The sharded step's blocks read in place from the buffers of the host's other ranks (see
 * peers.c): the parameters, the gradients and the step before them live in DL__TRAIN_PEER_BUFS
 * buffers every rank of the host maps, which the kept step rotates alike on every rank. */
#define DL__TRAIN_PEER_BUFS 3
typedef struct dl__train_peers_s {
    int world, rank;
    float *mine[DL__TRAIN_PEER_BUFS]; /* this rank's buffers, in the group's memory */
    float **theirs;                   /* [buffer * world + rank]: each rank's mapping */
    float *sync;                      /* world floats for the all-gather that orders reads */
} dl__train_peers_t;

/* Collective over the group: allocates the buffers (floats each) with mem_alloc and finds every
 * rank's mapping of them. 0, or -errno: the allocations' failures come alike on every rank (or
 * the group broke), the others are this rank's own, after every allocation was made. Every rank
 * on this host is the caller's to check. */
int dl__train_peers_open(dl__train_peers_t *p, const dl_train_comm_t *c, size_t floats);
/* Forgets the tables; the buffers go with the group that holds them. */
void dl__train_peers_close(dl__train_peers_t *p);
bool dl__train_peers_on(const dl__train_peers_t *p);
/* Returns once every rank has come here: what each wrote before, the others may read after. */
int dl__train_peers_meet(dl__train_peers_t *p, const dl_train_comm_t *c);
/* Rank `rank`'s mapping of the buffer this rank knows as q (one of p->mine); writable with two
 * ranks (mem_peer_rw), else for reading only. */
float *dl__train_peers_of(const dl__train_peers_t *p, const float *q, int rank);
/* After a meet that followed every rank's writing its gradient into its buffer q: out = the sum
 * over the ranks, in rank order, of [lo, lo + len) of theirs. */
int dl__train_peers_sum(const dl__train_peers_t *p, const float *q, float *out, size_t lo,
                        size_t len);
/* After a meet that followed every rank's writing its block of q (block j is [j * len,
 * (j + 1) * len)): every other rank's block copied from its owner's q into this rank's. */
int dl__train_peers_copy(const dl__train_peers_t *p, float *q, size_t len);

/* Drives the communication hooks from backward's progress reports (see comm.c). */
typedef struct dl__train_reducer_s {
    const dl_train_comm_t *comm;
    float *grads;
    size_t *ends; /* bucket i is [ends[i - 1], ends[i]) */
    size_t count;
    size_t next;  /* first bucket not started in this step */
    bool overlap; /* false: one sum of the whole buffer in finish() */
} dl__train_reducer_t;

/* With overlap, buckets of bucket_bytes are started as backward finishes them; without, the
 * whole buffer is summed in one piece once backward is done. */
int dl__train_reducer_init(dl__train_reducer_t *r, const dl_train_comm_t *comm, float *grads,
                           size_t n, size_t bucket_bytes, bool overlap);
void dl__train_reducer_free(dl__train_reducer_t *r);
/* A dl_train_grad_ready_cb: starts every bucket inside the ready prefix (with overlap). */
int dl__train_reducer_ready(void *ud, size_t ready);
/* Starts what is left, waits for all buckets and rearms for the next step. */
int dl__train_reducer_finish(dl__train_reducer_t *r);

/* Health beats with figures (beat.c). */
typedef struct dl__train_beat_s {
    int fd; /* -1: no watchdog */
    double last;
    uint64_t lines;
    uint64_t steps; /* since the last line, and their sums: */
    double compute_s, wait_s, loss, samples;
} dl__train_beat_t;

void dl__train_beat_init(dl__train_beat_t *b, int fd);
/* One step done: its time outside and inside collective calls, its loss and this rank's
 * samples. Writes a line when the last one is BEAT_EVERY_S old (or force). */
void dl__train_beat_step(dl__train_beat_t *b, uint64_t step, double compute_s, double wait_s,
                         double loss, size_t samples, double now, bool force);

#endif
