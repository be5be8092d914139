/* The flight recorder's shared layout: what a rank writes and what the agent (or any tool) reads,
 * in the file DLAUNCH_ATTEMPT_DIR/rank_R.rec. docs/diagnostics.md describes the same layout for
 * people; change both together. Native byte order; every field naturally aligned. */
#ifndef DL_COLL_RECORDER_H
#define DL_COLL_RECORDER_H

#include <stdint.h>

#define DL__REC_MAGIC 0x3130434552464c44ull /* "DLFREC01" read as little-endian bytes */
#define DL__REC_VERSION 1
#define DL__REC_CAPACITY 64 /* entries: a power of two */
#define DL__REC_HEADER_BYTES 256
#define DL__REC_ENTRY_BYTES 64
#define DL__REC_FILE_BYTES (DL__REC_HEADER_BYTES + DL__REC_CAPACITY * DL__REC_ENTRY_BYTES)
#define DL__REC_MEMFD_PREFIX "dlaunch-rec:"

/* How entries count time. */
#define DL__REC_TICK_TSC 1 /* the x86 time-stamp counter (constant rate, all cores) */
#define DL__REC_TICK_NS 2  /* nanoseconds of CLOCK_MONOTONIC */

typedef struct {
    uint64_t magic; /* written last, so a reader never takes a half-made header */
    uint32_t version;
    uint32_t header_bytes;
    uint32_t entry_bytes;
    uint32_t capacity;
    int32_t rank;
    int32_t world_size;
    int32_t pid;
    uint32_t tick_kind;
    /* One instant in three clocks, taken when the file was set up: ticks convert to
     * CLOCK_MONOTONIC through it (a reader takes a second pair for the rate). */
    uint64_t anchor_tick;
    uint64_t anchor_mono_ns;
    uint64_t anchor_real_ns;
    char transport[16]; /* "self", "shm", "tcp", "shm+tcp" */
    /* 0, or the errno for which the file could not take the ring (a full disk): the rank then
     * keeps it in a memfd named DL__REC_MEMFD_PREFIX + the file's name, and the file stays
     * empty. */
    int32_t file_error;
    uint8_t pad[128 - 84];
    /* Its own cache line: the caller's thread writes it for every asynchronous operation it
     * queues, while the communication thread writes the entries. */
    uint64_t issued; /* sequence number of the newest operation issued */
    uint8_t pad2[DL__REC_HEADER_BYTES - 136];
} dl__rec_header_t;

/* The first 8 bytes of an entry: the writer stores them in one go, the version and what changes
 * with it. */
typedef union {
    uint64_t word;
    struct {
        uint32_t ver; /* odd while the writer changes the entry (a sequence lock) */
        uint8_t op;   /* dl_coll_rec_op_t */
        uint8_t state;
        uint8_t algo; /* dl_coll_rec_algo_t */
        uint8_t dtype;
    };
} dl__rec_head_t;

/* Entry for operation seq (1, 2, ...) at index seq % capacity. */
typedef struct {
    dl__rec_head_t h;
    uint64_t seq;
    uint64_t bytes;
    uint64_t t_start; /* ticks; 0 before it started */
    uint64_t t_end;   /* ticks; 0 before it ended */
    union {
        struct {
            int32_t error; /* -errno once failed */
            int32_t root;  /* broadcast's root, else -1 */
        };
        uint64_t error_root;
    };
    uint64_t reserved[2];
} dl__rec_entry_t;

_Static_assert(sizeof(dl__rec_header_t) == DL__REC_HEADER_BYTES, "recorder header layout");
_Static_assert(sizeof(dl__rec_entry_t) == DL__REC_ENTRY_BYTES, "recorder entry layout");

#endif
