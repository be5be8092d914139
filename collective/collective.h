/* Collective operations for the workers dlaunch starts: a process group built from torchrun's
 * environment, all-reduce, broadcast, all-gather, reduce-scatter and barrier over shared memory
 * between workers on one host and TCP between hosts, and an asynchronous all-reduce run by a
 * communication thread.
 *
 * Every rank of a group must call the same operations in the same order with the same count,
 * type, operator and root; a group is used from one thread at a time. Results are bitwise
 * identical on every rank, and by default (DL_COLL_ORDER_RANK) equal to a loop over the ranks in
 * rank order, whatever the transport and host layout. Functions return >= 0 on success or a negative errno. After a
 * communication failure (a peer died, stopped answering, or sent garbage) the group is broken:
 * that call and every later one return the same error, and dl_coll_group_error() says what
 * happened; the only thing left to do with it is dl_coll_group_destroy(). */
#ifndef DL_COLLECTIVE_H
#define DL_COLLECTIVE_H

#include <stddef.h>

typedef enum {
    DL_COLL_FLOAT32,
    DL_COLL_FLOAT64,
    DL_COLL_INT32,
    DL_COLL_INT64,
} dl_coll_dtype_t;

/* Integer SUM wraps around (two's complement) instead of overflowing; integer AVG is the sum
 * divided by the world size, rounded toward zero. MIN and MAX of floats follow `a < b ? a : b`
 * in rank order, so a NaN does not always win. */
typedef enum {
    DL_COLL_SUM,
    DL_COLL_AVG,
    DL_COLL_MIN,
    DL_COLL_MAX,
} dl_coll_op_t;

typedef enum {
    DL_COLL_TRANSPORT_AUTO, /* shared memory within a host, TCP between hosts */
    DL_COLL_TRANSPORT_TCP,  /* TCP between every pair of ranks, even on one host */
    DL_COLL_TRANSPORT_SHM,  /* shared memory only: every rank must be on one host */
} dl_coll_transport_t;

typedef enum {
    DL_COLL_ALGO_AUTO,      /* by message size (docs/performance.md); shm with 2 ranks: latency */
    DL_COLL_ALGO_LATENCY,   /* TCP: recursive doubling; shm: every rank reduces everything */
    DL_COLL_ALGO_BANDWIDTH, /* TCP: pipelined ring; shm: each rank reduces one slice */
} dl_coll_algo_t;

/* In which order an all-reduce combines the ranks' values: what decides its last bits. */
typedef enum {
    /* Every element is a left fold over ranks 0, 1, ..., n-1, as a loop over the ranks would
     * compute it, whatever the transport, algorithm and host layout: a world of n ranks gives
     * the same bits on one host or on n. */
    DL_COLL_ORDER_RANK,
    /* Whatever order the fastest algorithm takes (a ring, recursive doubling, host by host):
     * every rank still gets the same bits, but a change of transport or layout may change
     * them. Only differs from RANK across hosts. */
    DL_COLL_ORDER_ANY,
} dl_coll_order_t;

#define DL_COLL_SMALL_AUTO ((size_t)-1)
#define DL_COLL_HOST_ID_MAX 128
#define DL_COLL_IFNAME_MAX 64
#define DL_COLL_ADDR_MAX 256
#define DL_COLL_RUN_ID_MAX 128
#define DL_COLL_PATH_MAX 4096

/* Everything a group needs; dl_coll_options_init() fills defaults and dl_coll_options_from_env()
 * reads the launcher's variables over them. */
typedef struct {
    int rank;             /* RANK */
    int world_size;       /* WORLD_SIZE */
    int local_rank;       /* LOCAL_RANK, informative: hosts are told apart by host_id */
    int local_world_size; /* LOCAL_WORLD_SIZE, informative */
    char master_addr[DL_COLL_ADDR_MAX]; /* MASTER_ADDR: where rank 0 hosts the bootstrap */
    int master_port;                    /* MASTER_PORT */
    char run_id[DL_COLL_RUN_ID_MAX];    /* TORCHELASTIC_RUN_ID, keeps jobs apart; may be "" */
    /* DLAUNCH_STORE: the job's key-value store (HOST:PORT). When set, ranks meet through it
     * instead of through rank 0 at MASTER_ADDR:MASTER_PORT. Its job token comes from
     * DLAUNCH_TOKEN_FILE, else DLAUNCH_TOKEN (token points into the environment given). */
    char store[DL_COLL_ADDR_MAX + 8];
    char token_file[DL_COLL_PATH_MAX];
    const char *token;
    /* DLAUNCH_SOCKET_IFNAME: the network interface whose address this rank listens on for TCP
     * peers (dlaunch sets it to the one that reaches MASTER_ADDR, as it sets
     * GLOO_SOCKET_IFNAME). "" means the address the route to MASTER_ADDR leaves from. */
    char ifname[DL_COLL_IFNAME_MAX];
    /* DLAUNCH_COLL_HOST_ID: ranks with equal ids share memory. "" means hostname + boot id. */
    char host_id[DL_COLL_HOST_ID_MAX];
    dl_coll_transport_t transport; /* DLAUNCH_COLL_TRANSPORT=auto|tcp|shm */
    dl_coll_algo_t algo;           /* DLAUNCH_COLL_ALGO=auto|latency|bandwidth */
    dl_coll_order_t order;         /* DLAUNCH_COLL_ORDER=rank|any */
    /* DLAUNCH_COLL_TIMEOUT (seconds): the longest any wait may go without progress, and the
     * deadline for the bootstrap. A dead or silent peer makes every rank's call fail within
     * about this long. */
    int timeout_ms;
    /* DLAUNCH_COLL_SHM_SMALL: latency algorithm up to this size; DL_COLL_SMALL_AUTO (the
     * default) picks by the number of ranks on the host. */
    size_t shm_small_bytes;
    size_t tcp_small_bytes; /* DLAUNCH_COLL_TCP_SMALL */
    size_t shm_chunk_bytes; /* DLAUNCH_COLL_SHM_CHUNK: bytes per shared-memory round */
    size_t tcp_chunk_bytes; /* DLAUNCH_COLL_TCP_CHUNK: receive and reduce granularity */
    /* DLAUNCH_COLL_SPIN_US: how long a wait polls before it sleeps, when the machine has a core
     * for every rank (otherwise a wait spins 2 us and yields). Sleeping gives the core away, and
     * getting it back on a busy machine costs far more than a small message; spinning costs CPU
     * time that a thread computing beside an asynchronous all-reduce might want. 0: sleep at once.
     */
    int spin_us;
    /* DLAUNCH_COLL_RECORDER: the flight recorder (below). recorder 0: off; else in the file
     * recorder_path, or in process memory when that is "". */
    int recorder;
    char recorder_path[DL_COLL_PATH_MAX];
    /* DLAUNCH_COLL_RECORDER_TIMED: operations of at least this many bytes get start and end
     * times (default 64K; 0 times all of them, at about 11 ns an operation). */
    size_t recorder_timed_bytes;
    /* DLAUNCH_GROUP_GEN: the generation of the group (0 for a job's first workers). After an
     * in-job recovery (docs/recovery.md) the survivors and their replacements form the group
     * again with the next generation: its bootstrap keys, shared-memory name and TCP handshake
     * are its own, so nothing of a broken group's meeting is mistaken for the new one's. With
     * a generation above 0, a process makes one group of that generation (the store's keys are
     * named by it, not by how many groups the process made before). */
    int generation;
    /* DLAUNCH_COLL_ADOPT_MIN: two ranks on a host read each other's ordinary (malloc'd) buffers
     * of at least this many bytes in place, as they do dl_coll_mem_alloc memory, by turning
     * their whole pages into shared memory on first use (docs/collective.md); 0 ("off"):
     * never. Default 128 KiB. */
    size_t adopt_min_bytes;
} dl_coll_options_t;

typedef struct dl_coll_group_s dl_coll_group_t;
typedef struct dl_coll_request_s dl_coll_request_t;

void dl_coll_options_init(dl_coll_options_t *opts);

/* Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
 * TORCHELASTIC_RUN_ID and the DLAUNCH_COLL_* variables from envp (environ-style, NULL means the
 * process's environment) into opts. A missing RANK/WORLD_SIZE means a world of one. Returns 0,
 * or -EINVAL with a message naming the variable in err. */
int dl_coll_options_from_env(dl_coll_options_t *opts, char **envp, char *err, size_t errlen);

/* Builds the group: rank 0 listens at MASTER_ADDR:MASTER_PORT, the others connect to it (retrying
 * until the timeout, so start order does not matter), every rank learns where the others are,
 * maps shared memory with the ranks on its host and connects to the TCP peers it needs. Blocks
 * until every rank got here. On success the caller owns *ret_group (dl_coll_group_destroy). */
int dl_coll_group_create(const dl_coll_options_t *opts, dl_coll_group_t **ret_group, char *err,
                         size_t errlen);

/* dl_coll_options_from_env(environ) then dl_coll_group_create(). */
int dl_coll_group_from_env(dl_coll_group_t **ret_group, char *err, size_t errlen);

/* Waits for outstanding asynchronous operations, then closes everything. Accepts NULL. Peers
 * still inside a collective see this rank as gone. */
void dl_coll_group_destroy(dl_coll_group_t *g);

/* Breaks the group from any thread, at any time (the group must not be being destroyed): every
 * operation in progress on this rank returns promptly with an error, later ones too, and the
 * peers' waits on this rank end at once (the shared-memory abort flag, shut TCP connections), as
 * after a failure. why (may be NULL) becomes dl_coll_group_error()'s text unless a failure came
 * first. Used to leave a group that the launcher says is broken (docs/recovery.md). */
void dl_coll_group_abort(dl_coll_group_t *g, const char *why);

int dl_coll_rank(const dl_coll_group_t *g);
int dl_coll_world_size(const dl_coll_group_t *g);
/* This rank's index among the ranks on its host, and how many share the host. */
int dl_coll_local_rank(const dl_coll_group_t *g);
int dl_coll_local_size(const dl_coll_group_t *g);
int dl_coll_num_hosts(const dl_coll_group_t *g);
/* "self", "shm", "tcp" or "shm+tcp": what this group's operations travel over. Static string. */
const char *dl_coll_transport_name(const dl_coll_group_t *g);
/* The first failure in words ("tcp recv from rank 3 (10.0.0.4:41234): Connection reset by peer");
 * "" while the group is healthy. Owned by the group. */
const char *dl_coll_group_error(const dl_coll_group_t *g);

size_t dl_coll_dtype_size(dl_coll_dtype_t dtype);
const char *dl_coll_dtype_name(dl_coll_dtype_t dtype);
const char *dl_coll_op_name(dl_coll_op_t op);

/* recvbuf[i] = op over ranks of sendbuf[i], for i < count. sendbuf == recvbuf works in place;
 * otherwise the two must not overlap. */
int dl_coll_allreduce(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                      dl_coll_dtype_t dtype, dl_coll_op_t op);

/* Copies root's buf (count elements) into every rank's buf. */
int dl_coll_broadcast(dl_coll_group_t *g, void *buf, size_t count, dl_coll_dtype_t dtype, int root);

/* recvbuf (count * world_size elements) gets every rank's sendbuf (count elements) in rank order.
 * sendbuf may be recvbuf + rank * count (in place); otherwise they must not overlap. */
int dl_coll_allgather(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                      dl_coll_dtype_t dtype);

/* sendbuf holds world_size blocks of recvcount elements; rank r's recvbuf gets block r reduced
 * over all ranks. The buffers must not overlap. */
int dl_coll_reduce_scatter(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t recvcount,
                           dl_coll_dtype_t dtype, dl_coll_op_t op);

/* The same, and extra_recv (recvcount elements, not overlapping the others) also gets block
 * extra_block reduced over all ranks, in the same bits as that block's own rank receives:
 * a rank can keep a replica of another rank's share of a sharded update. Free across hosts,
 * where a reduce-scatter sums everything and keeps its block; on one host it costs a second
 * block's reduction. extra_block < 0: a plain reduce-scatter. */
int dl_coll_reduce_scatter_extra(dl_coll_group_t *g, const void *sendbuf, void *recvbuf,
                                 size_t recvcount, dl_coll_dtype_t dtype, dl_coll_op_t op,
                                 int extra_block, void *extra_recv);

/* The host (numbered by their lowest rank, 0 up) that rank is on, or -1 out of range. */
int dl_coll_host_of(const dl_coll_group_t *g, int rank);

/* Returns once every rank has entered the barrier. */
int dl_coll_barrier(dl_coll_group_t *g);

/* Memory the other ranks on this host map and read in place: a two-rank shared-memory
 * all-reduce whose send buffers lie in the same allocation on both ranks reads each input where
 * it is instead of copying it through the shared segment, like NCCL's registered buffers (when
 * an output is its input, both outputs must share an allocation too; docs/collective.md has the
 * rules). Collective: every rank of the group calls it, in the same order, each with its own
 * size. *ret_ptr gets bytes (rounded up to pages) of zeroed memory. The outcome is the same for
 * every rank on a host: if any of them could not allocate or map, all get an error (the message
 * in err). Any buffer works with every operation. */
int dl_coll_mem_alloc(dl_coll_group_t *g, size_t bytes, void **ret_ptr, char *err, size_t errlen);

/* The block that the rank `rank` (on this host, another rank or this one) holds of the allocation
 * that contains `mine` (this rank's memory from dl_coll_mem_alloc): *ret_ptr (read-only; this
 * rank's own block is writable) and its length. Works on a broken group too, until it is
 * destroyed: a rank that died leaves its block readable here, as it was when it died (the pages
 * live as long as a mapping does). Not collective. Returns 0, -ENOENT when mine is no such
 * memory, -EXDEV when rank is on another host or out of range. */
int dl_coll_mem_peer(const dl_coll_group_t *g, const void *mine, int rank, const void **ret_ptr,
                     size_t *ret_len);

/* dl_coll_mem_peer with the block mapped for writing here: a second mapping of the same pages,
 * made by the first call for that block (open and mmap; the rank must be alive then, though the
 * mapping outlives it). Which rank writes where, and when, is the callers' protocol: the library
 * orders nothing. Not collective. 0, -ENOENT or -EXDEV as dl_coll_mem_peer, -ESTALE when the
 * rank's block is no longer the file mapped at the allocation, or the errno of opening
 * (/proc/PID/fd/FD for writing) or mapping it. */
int dl_coll_mem_peer_rw(dl_coll_group_t *g, const void *mine, int rank, void **ret_ptr,
                        size_t *ret_len);

/* Frees memory from dl_coll_mem_alloc (NULL is ignored) once no operation uses it; not
 * collective. dl_coll_group_destroy frees what is left. */
void dl_coll_mem_free(dl_coll_group_t *g, void *ptr);

/* ---- The flight recorder ---------------------------------------------------------------------
 *
 * Every group keeps its last DL_COLL_REC_CAPACITY operations (sequence number, operation, bytes,
 * algorithm, state, start and end times) in a small ring of shared memory, written with plain
 * stores and no lock or system call. Under dlaunch the ring is the file
 * DLAUNCH_ATTEMPT_DIR/rank_R.rec, which the agent reads when a rank hangs or fails, or when asked,
 * even while the rank is stopped or after it died (docs/diagnostics.md has the layout).
 * DLAUNCH_COLL_RECORDER: "auto" (that file, else process memory), "off", or a file to use. */

#define DL_COLL_REC_CAPACITY 64

typedef enum {
    DL_COLL_REC_OP_NONE = 0,
    DL_COLL_REC_ALLREDUCE,
    DL_COLL_REC_BROADCAST,
    DL_COLL_REC_ALLGATHER,
    DL_COLL_REC_REDUCE_SCATTER,
    DL_COLL_REC_BARRIER,
    DL_COLL_REC_MEM_ALLOC,
    DL_COLL_REC_SEND, /* point to point: written by the Python package (docs/python.md) */
    DL_COLL_REC_RECV,
} dl_coll_rec_op_t;

typedef enum {
    DL_COLL_REC_QUEUED = 1, /* an asynchronous all-reduce waiting for the communication thread */
    DL_COLL_REC_RUNNING,    /* entered: moving data, or waiting for the other ranks */
    DL_COLL_REC_DONE,
    DL_COLL_REC_FAILED,
} dl_coll_rec_state_t;

typedef enum {
    DL_COLL_REC_ALGO_NONE = 0,     /* the operation has one way on its transport */
    DL_COLL_REC_ALGO_LOCAL,        /* nothing to exchange: one rank, or nothing to send */
    DL_COLL_REC_ALGO_SHM_SMALL,    /* shared memory: every rank reduces the whole message */
    DL_COLL_REC_ALGO_SHM_PAIR,     /* shared memory, two ranks: each reads the other's input */
    DL_COLL_REC_ALGO_SHM_SLICE,    /* shared memory: each rank reduces one slice */
    DL_COLL_REC_ALGO_TCP_DOUBLING, /* TCP: recursive doubling */
    DL_COLL_REC_ALGO_TCP_RING,     /* TCP: pipelined ring */
    DL_COLL_REC_ALGO_HIER,         /* within the host, across hosts' leaders, within the host */
} dl_coll_rec_algo_t;

typedef struct {
    unsigned long long seq; /* 1 for the group's first operation */
    dl_coll_rec_op_t op;
    dl_coll_rec_state_t state;
    dl_coll_rec_algo_t algo;
    dl_coll_dtype_t dtype;
    unsigned long long bytes; /* per rank: what it sends (all-gather: its own block) */
    int root;                 /* broadcast's root, else -1 */
    int error;                /* -errno when failed */
    /* CLOCK_MONOTONIC seconds; 0 before it started or ended, and 0 for operations below
     * recorder_timed_bytes (reading the clock would cost about 1% of a 4 KiB all-reduce). */
    double start, end;
} dl_coll_rec_entry_t;

typedef struct {
    int rank, world_size, pid;
    char transport[16];        /* "self", "shm", "tcp", "shm+tcp" */
    unsigned long long issued; /* newest operation issued, queued ones included */
    double created;            /* Unix seconds when the group set the recorder up */
} dl_coll_rec_info_t;

typedef struct dl_coll_rec_reader_s dl_coll_rec_reader_t;

/* Maps a recorder file read-only. Returns 0 with *ret (dl_coll_rec_close), -ENOENT when there is
 * no file yet, -ENODATA while its rank has not set it up, -EBADMSG for something else, or
 * another -errno. */
int dl_coll_rec_open(const char *path, dl_coll_rec_reader_t **ret);

/* The same, and when the file holds no ring because its rank could not reserve the space for it
 * (a full disk), the ring that rank pid keeps in memory instead (a memfd named after the file,
 * found among pid's open files). Returns 0 (the file), 1 (pid's memory), or dl_coll_rec_open's
 * errors. */
int dl_coll_rec_open_pid(const char *path, int pid, dl_coll_rec_reader_t **ret);

/* 0, or the errno for which the ring's file could not hold it (it is then read from memory). */
int dl_coll_rec_file_error(const dl_coll_rec_reader_t *r);

/* Copies up to max of the newest entries into v, oldest first, and the header into *ret_info
 * (may be NULL). Entries the writer is changing at that moment are read again; one still
 * changing after a few tries (its writer stopped half way) is left out. Returns how many. */
size_t dl_coll_rec_read(const dl_coll_rec_reader_t *r, dl_coll_rec_info_t *ret_info,
                        dl_coll_rec_entry_t *v, size_t max);

/* Accepts NULL. */
void dl_coll_rec_close(dl_coll_rec_reader_t *r);

/* "all-reduce", "broadcast", ...; "queued", "running", "done", "failed"; "shm-small", ... ("" for
 * DL_COLL_REC_ALGO_NONE). Static strings. */
const char *dl_coll_rec_op_name(dl_coll_rec_op_t op);
const char *dl_coll_rec_state_name(dl_coll_rec_state_t state);
const char *dl_coll_rec_algo_name(dl_coll_rec_algo_t algo);

/* Queues an all-reduce for the group's communication thread and returns at once; the buffers
 * must stay untouched until dl_coll_wait() returns. Operations run in the order they were
 * issued, synchronous ones included, on every rank. On success *ret_req must be waited on. */
int dl_coll_allreduce_async(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                            dl_coll_dtype_t dtype, dl_coll_op_t op, dl_coll_request_t **ret_req);

/* Sets *ret_done to 1 when the request has finished (then dl_coll_wait returns at once). */
int dl_coll_test(dl_coll_request_t *req, int *ret_done);

/* Blocks until the request is done, frees it and returns its result. */
int dl_coll_wait(dl_coll_request_t *req);

#endif
