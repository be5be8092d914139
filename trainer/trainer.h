/* The bundled data-parallel trainer: an MLP on Fashion-MNIST with DDP semantics.
 *
 * Every rank holds a full copy of the model, takes a disjoint shard of each epoch's permutation,
 * computes gradients on its local batch and sums them across ranks through dl_train_comm_t before
 * an identical optimizer step, so all replicas stay bitwise equal. The communication backend is a
 * plug-in (the collective library provides one); dl_train_comm_init_local() is the world of one.
 *
 * The library never prints: progress goes to a log callback, failures come back as -errno with
 * one line in err that names the file, key or offset at fault.
 */
#ifndef DL_TRAINER_H
#define DL_TRAINER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "opt.h"

#define DL_TRAIN_ERRLEN 512
#define DL_TRAIN_MAX_LAYERS 16 /* weight layers; the shape has one more entry */
#define DL_TRAIN_DEFAULT_DATASET "/usr/share/datasets/fashion-mnist"

/* ---- Dataset: IDX files, gzip-compressed or plain ---------------------------------------- */

/* Pixels stay uint8 in memory (a quarter of the float size); batches are converted to float32
 * in [0, 1] (pixel / 255) as they are gathered. */
typedef struct dl_train_dataset_s {
    size_t n;         /* samples */
    size_t rows;      /* image height */
    size_t cols;      /* image width */
    size_t dim;       /* rows * cols */
    uint8_t *pixels;  /* n * dim, row-major, owned */
    uint8_t *labels;  /* n, owned */
    size_t n_classes; /* largest label + 1 */
} dl_train_dataset_t;

/* Reads an IDX file of unsigned bytes with `ndims` dimensions (3 for images, 1 for labels).
 * On success *ret_data (malloc'ed, caller frees) holds the payload and ret_dims[0..ndims) the
 * dimensions. Any fault (missing file, bad gzip stream, bad magic, wrong number of dimensions,
 * zero or oversized dimensions, short or trailing data) is -errno plus one line naming the file. */
int dl_train_idx_read(const char *path, unsigned ndims, uint8_t **ret_data, size_t *ret_dims,
                      char *err, size_t errlen);

/* Loads "<dir>/<prefix>-images-idx3-ubyte[.gz]" and "<dir>/<prefix>-labels-idx1-ubyte[.gz]",
 * prefix "train" or "t10k", and checks that the two agree on the number of samples.
 * ds is untouched on failure; free it with dl_train_dataset_free(). */
int dl_train_dataset_load(dl_train_dataset_t *ds, const char *dir, const char *prefix, char *err,
                          size_t errlen);
void dl_train_dataset_free(dl_train_dataset_t *ds);

/* Writes samples idx[0..k) as float32 rows of ds->dim into x and their labels into y. */
void dl_train_dataset_gather(const dl_train_dataset_t *ds, const uint32_t *idx, size_t k, float *x,
                             uint8_t *y);

/* ---- Distributed sampler (pure: no I/O, no clock) ---------------------------------------- */

/* Each epoch is a permutation of 0..n-1 seeded by (seed, epoch), the same on every rank. It is
 * padded by repeating from its start to a multiple of world (or cut down to one, drop_last), and
 * rank r takes positions r, r + world, r + 2 world, ... as torch's DistributedSampler does. */
typedef struct dl_train_sampler_s {
    size_t n;
    int rank;
    int world;
    uint64_t seed;
    bool drop_last;
    size_t num_samples; /* this rank's share of an epoch, the same on every rank */
    uint64_t epoch;
    size_t pos;     /* next position in this rank's share */
    uint32_t *perm; /* n entries, owned */
} dl_train_sampler_t;

int dl_train_sampler_init(dl_train_sampler_t *s, size_t n, int rank, int world, uint64_t seed,
                          bool drop_last);
void dl_train_sampler_free(dl_train_sampler_t *s);

/* Starts epoch `epoch` at its beginning. */
void dl_train_sampler_set_epoch(dl_train_sampler_t *s, uint64_t epoch);

/* Fills up to max indices from this rank's share and advances; returns how many (0: the epoch
 * is over). */
size_t dl_train_sampler_next(dl_train_sampler_t *s, size_t max, uint32_t *ret_idx);

/* The position to save: the epoch and how many entries of its padded permutation the whole world
 * has consumed (pos * world), so a resume with another world size continues where this one
 * stopped. */
void dl_train_sampler_tell(const dl_train_sampler_t *s, uint64_t *ret_epoch,
                           uint64_t *ret_consumed);

/* Restores a position from dl_train_sampler_tell(), possibly of another world size; a position
 * past this rank's share ends the epoch. Returns 0. */
int dl_train_sampler_seek(dl_train_sampler_t *s, uint64_t epoch, uint64_t consumed);

/* ---- The model: a multi-layer perceptron on CBLAS ---------------------------------------- */

typedef enum {
    DL_TRAIN_ACT_RELU = 0,
    DL_TRAIN_ACT_TANH,
    DL_TRAIN_ACT_GELU,
} dl_train_act_t;

typedef struct dl_train_mlp_s dl_train_mlp_t;

/* The parameter and gradient buffers hold this many spare floats after the parameters, zero at
 * first: the training loop sends its stop vote and its loss along with the gradients in them. */
#define DL_TRAIN_SPARE_FLOATS 2

/* Called during backward each time more gradients are final: the first `ready` floats of the
 * gradient buffer will not change again in this pass. */
typedef int (*dl_train_grad_ready_cb)(void *ud, size_t ready);

/* sizes[0..n_layers] are the widths (input first, classes last); max_batch bounds the batch
 * passed to every later call. Parameters and gradients each live in one contiguous buffer laid
 * out in the order backward produces them: last layer first, each layer as [bias | weight], the
 * weight row-major [out][in]. Weights are Kaiming-uniform from seed, biases zero.
 * *ret_mlp is owned by the caller (dl_train_mlp_free). */
int dl_train_mlp_new(const size_t *sizes, size_t n_layers, dl_train_act_t act, size_t max_batch,
                     uint64_t seed, dl_train_mlp_t **ret_mlp);
void dl_train_mlp_free(dl_train_mlp_t *m);

size_t dl_train_mlp_num_params(const dl_train_mlp_t *m);
float *dl_train_mlp_params(dl_train_mlp_t *m);
/* num_params + 1 floats: the gradients, then one spare float that backward never touches (the
 * training loop sends a control word in it along with the last bucket). The parameter buffer has
 * the same spare float. */
float *dl_train_mlp_grads(dl_train_mlp_t *m);
/* Grows the parameter and gradient buffers to at least `floats` floats each, zeros past the
 * model, which backward and the model never touch: room for collectives that cut a buffer into
 * equal blocks per rank. The buffers move; fetch them again. */
int dl_train_mlp_pad(dl_train_mlp_t *m, size_t floats);
/* Floats in the parameter buffer (and in the gradient buffer): the model, the spares, the pad. */
size_t dl_train_mlp_capacity(const dl_train_mlp_t *m);
/* Makes `other` (dl_train_mlp_capacity floats, 64-byte aligned, freed with free()) the parameter
 * buffer and returns the one it replaces, which the caller then owns: double-buffered updates
 * (in-job recovery keeps the parameters of the step before until a step is complete). */
float *dl_train_mlp_swap_params(dl_train_mlp_t *m, float *other);
/* The same for the gradient buffer: backward writes its next gradients into `other`. */
float *dl_train_mlp_swap_grads(dl_train_mlp_t *m, float *other);
/* Offsets of layer l's weight and bias in the parameter (and gradient) buffer. */
void dl_train_mlp_layer_offsets(const dl_train_mlp_t *m, size_t l, size_t *ret_w, size_t *ret_b);

/* Forward and backward on a batch of b rows. The gradient written is the gradient of
 * grad_scale * sum over the batch of the cross-entropy (grad_scale 1/b gives the mean).
 * *ret_loss is the batch's mean loss. ready (may be NULL) sees the gradient fill up; when it
 * returns < 0 the pass stops and that value is returned. split_bytes > 0 computes large weight
 * gradients in slices of about that size so ready fires more often (for overlapping
 * communication); 0 computes each layer in one call. */
int dl_train_mlp_train_step(dl_train_mlp_t *m, const float *x, const uint8_t *y, size_t b,
                            float grad_scale, size_t split_bytes, dl_train_grad_ready_cb ready,
                            void *ud, double *ret_loss);

/* Forward only: the sum of the losses and the number of correct predictions on b rows. */
void dl_train_mlp_evaluate(dl_train_mlp_t *m, const float *x, const uint8_t *y, size_t b,
                           double *ret_loss_sum, size_t *ret_correct);

/* ---- Optimizer and learning-rate schedule ------------------------------------------------ */

/* Stochastic gradient descent as torch.optim.SGD (no dampening, no Nesterov):
 * d = g + wd * p; m = momentum * m + d; p -= lr * m. */
void dl_train_sgd_step(float *p, float *m, const float *g, size_t n, float lr, float momentum,
                       float weight_decay);
/* The same step out of place, with the same bits: p_out and m_out get what dl_train_sgd_step
 * would leave in p_in and m_in, which stay as they were (in-job recovery keeps them until the
 * step is complete everywhere). */
void dl_train_sgd_step_to(float *p_out, float *m_out, const float *p_in, const float *m_in,
                          const float *g, size_t n, float lr, float momentum, float weight_decay);
/* dl_train_sgd_step_to with g = g_mine + g_theirs, two ranks' gradients of a block, each
 * replaced by the new parameters: the sum and the step in one pass, with the bits of the sum
 * followed by dl_train_sgd_step_to (a + b is b + a in IEEE arithmetic; only which NaN's payload
 * survives may differ, on a step that diverged anyway). */
void dl_train_sgd_step_pair(float *g_mine, float *g_theirs, float *m_out, const float *p_in,
                            const float *m_in, size_t n, float lr, float momentum,
                            float weight_decay);
/* Its momentum alone: m_out as dl_train_sgd_step_to leaves it (a replica of another rank's). */
void dl_train_sgd_momentum_to(float *m_out, const float *m_in, const float *p_in, const float *g,
                              size_t n, float momentum, float weight_decay);

typedef enum {
    DL_TRAIN_SCHED_CONSTANT = 0,
    DL_TRAIN_SCHED_STEP,
    DL_TRAIN_SCHED_COSINE,
} dl_train_sched_t;

typedef enum {
    DL_TRAIN_SCALE_NONE = 0,
    DL_TRAIN_SCALE_LINEAR,
    DL_TRAIN_SCALE_SQRT,
} dl_train_scaling_t;

typedef enum {
    DL_TRAIN_ON_DIVERGENCE_STOP = 0,
    DL_TRAIN_ON_DIVERGENCE_ROLLBACK,
} dl_train_on_divergence_t;

typedef enum {
    DL_TRAIN_OVERLAP_AUTO = 0, /* as the communication backend advises (overlap_pays) */
    DL_TRAIN_OVERLAP_ON,
    DL_TRAIN_OVERLAP_OFF,
} dl_train_overlap_t;

typedef struct dl_train_schedule_s {
    dl_train_sched_t kind;
    double lr;             /* peak rate, after scaling */
    double lr_min;         /* cosine floor */
    double gamma;          /* step: multiplier at each decay */
    uint64_t step_size;    /* step: steps between decays */
    uint64_t warmup_steps; /* linear ramp from lr / warmup_steps up to lr */
    uint64_t total_steps;
} dl_train_schedule_t;

/* The learning rate of optimizer step `step` (0-based). A pure function of its arguments, so a
 * resumed run follows the same curve. */
double dl_train_lr_at(const dl_train_schedule_t *s, uint64_t step);

/* ---- Divergence watch -------------------------------------------------------------------- */

#define DL_TRAIN_DIVERGENCE_HISTORY 64
#define DL_TRAIN_DIVERGENCE_WINDOW_MAX 4096

typedef enum {
    DL_TRAIN_LOSS_OK = 0,  /* within bounds: it joins the healthy history */
    DL_TRAIN_LOSS_HIGH,    /* above factor x the healthy median */
    DL_TRAIN_LOSS_DIVERGED /* non-finite, or high in more than half of the last window steps */
} dl_train_loss_verdict_t;

/* Watches the job-wide loss of each step. A non-finite loss is divergence at once. A loss above
 * factor x the median of the last healthy losses (up to DL_TRAIN_DIVERGENCE_HISTORY of them; none
 * are judged before 16), and above a quarter of where the run started (the mean of its first 16
 * losses), is high; more than half of the last `window` judged steps high is
 * divergence. High losses never join the history, so a run that blows up and then settles at
 * chance level is still measured against what it reached while it was well. factor 0: only
 * non-finite losses count. */
typedef struct dl_train_divergence_s {
    double factor;
    uint64_t window; /* 1..DL_TRAIN_DIVERGENCE_WINDOW_MAX */
    double healthy[DL_TRAIN_DIVERGENCE_HISTORY];
    size_t n, next;
    bool was_high[DL_TRAIN_DIVERGENCE_WINDOW_MAX]; /* of the last `window` judged steps */
    uint64_t high_in_window;
    uint64_t judged;
    double median; /* the healthy median the last loss was held against */
    double start;  /* the mean of the first losses fed */
    uint64_t fed;  /* losses fed, counted up to the first 16 */
} dl_train_divergence_t;

void dl_train_divergence_init(dl_train_divergence_t *d, double factor, uint64_t window);
dl_train_loss_verdict_t dl_train_divergence_feed(dl_train_divergence_t *d, double loss);
/* Clears the window (after a rollback) and keeps the healthy history. */
void dl_train_divergence_forgive(dl_train_divergence_t *d);

/* ---- Communication hook ------------------------------------------------------------------ */

/* Gradients are summed, not averaged: the trainer scales the loss gradient by 1 / world before
 * backward, so the sum of the ranks' gradients is the gradient of the global batch mean.
 *
 * Overlapping (see dl_train_config_t.overlap): buckets are numbered 0, 1, ... in backward order,
 * the same on every rank, and handed to start() as soon as backward has finished them; start()
 * may return before the sum is done (an asynchronous backend sums while backward goes on); after
 * wait_all() returns >= 0 every started bucket holds the sum of that slice over all ranks.
 * Not overlapping: the whole gradient is summed in one piece after backward. With
 * reduce_scatter() and allgather() the optimizer step is sharded: each rank receives the sum of
 * its 1/world block only, updates that block of the parameters, and allgather() puts the blocks
 * back together on every rank (less memory traffic than summing everything everywhere and every
 * rank updating everything). Else allreduce() (a blocking call, no hand-off to another thread)
 * or, lacking that, start() and wait_all() on one bucket sum the whole gradient.
 *
 * A world of one needs no hooks at all. broadcast() copies root's len bytes to every rank; it is
 * used to share the initial or restored state, and is required when world_size > 1. */
typedef struct dl_train_comm_s {
    int rank;
    int world_size;
    void *ctx;
    int (*allreduce_start)(void *ctx, size_t bucket, float *buf, size_t n);
    int (*allreduce_wait_all)(void *ctx);
    int (*broadcast)(void *ctx, void *buf, size_t len, int root);
    /* Optional: sums buf over all ranks in place and returns when done. */
    int (*allreduce)(void *ctx, float *buf, size_t n);
    /* Optional, blocking: send holds world_size blocks of count floats; rank r's recv (count
     * floats, not overlapping send) receives the sum over all ranks of block r. */
    int (*reduce_scatter)(void *ctx, const float *send, float *recv, size_t count);
    /* Optional, blocking: buf holds world_size blocks of count floats; every rank's block r
     * becomes rank r's block r. */
    int (*allgather)(void *ctx, float *buf, size_t count);
    /* The backend's advice for overlap "auto": summing alongside backward pays only when there
     * is a core to spare for it (more CPUs on the host than workers); else the two just take
     * turns on the same cores, and the hand-offs cost more than they save. */
    bool overlap_pays;
    /* After a hook failed: what happened, in words ("shm: rank 1 (pid 42) died ..."), for the
     * trainer's error line; NULL or "" when there is nothing more to say than the errno.
     * May be NULL. */
    const char *(*error)(void *ctx);

    /* ---- In-job recovery (docs/recovery.md); every field optional ---------------------- */
    /* This process replaces a failed rank of a running job: dl_train_run takes the whole state
     * (parameters, optimizer state, sampler position, RNG, step) from the living replicas
     * instead of from rank 0's start or a checkpoint. */
    bool joining;
    /* After a hook failed: waits for the launcher's word on the new membership, leaves the
     * broken group and forms the next one, updating rank and world_size. 0, or -errno with the
     * reason in error(). With rejoin set, a failed hook does not end the run: the ranks that
     * live on form the group again and the run goes on from the last step all of them
     * completed. */
    int (*rejoin)(void *ctx);
    /* Blocking: every rank's len bytes (a multiple of 4) at buf + rank * len go to every rank:
     * buf holds world_size x len bytes. Required with rejoin. */
    int (*allgather_bytes)(void *ctx, void *buf, size_t len);
    /* Collective: memory the host's other ranks can read in place, even after this rank died
     * (the sharded update keeps its block of the optimizer state there, so that a rank on its
     * host holds it for a replacement; with every rank on one host it also keeps the parameters
     * and gradients there and reads the other ranks' blocks in place: peer_reads). Optional:
     * without it a sharded run cannot recover a rank's block, and falls back to a restart. */
    int (*mem_alloc)(void *ctx, size_t bytes, void **ret_ptr);
    /* Rank `rank`'s block of the allocation that holds mine, when it is on this host (also
     * after it died, until rejoin): 0 with *ret_ptr and *ret_len, or -EXDEV. */
    int (*mem_peer)(void *ctx, const void *mine, int rank, const void **ret_ptr, size_t *ret_len);
    /* mem_peer mapped for writing (the first call for a block maps it; its rank must be alive
     * then): two ranks of the sharded step hand each other the new parameters there. 0 or
     * -errno. Optional: without it two ranks copy the new blocks after the update. */
    int (*mem_peer_rw)(void *ctx, const void *mine, int rank, void **ret_ptr, size_t *ret_len);
    /* The host rank `rank` is on (the same number for ranks that share one); optional. */
    int (*host_of)(void *ctx, int rank);
    /* reduce_scatter, and extra_recv (count floats) also gets block extra_block's sum, in the
     * bits its own rank gets: a replica of another rank's share of the sharded update (kept
     * for a rank on another host, where the sum of every block is at hand anyway). */
    int (*reduce_scatter_extra)(void *ctx, const float *send, float *recv, size_t count,
                                int extra_block, float *extra_recv);
    /* Tells the launcher that this rank trains again after a recovery: resumed at `step` with
     * the state of rank `source`, `ms` after the failure was seen here; `was` is the last step
     * this rank had completed before (-1: none, a replacement). May be NULL. */
    void (*recovered)(void *ctx, uint64_t step, int source, double ms, int64_t was);
} dl_train_comm_t;

/* Rank 0 of a world of one: every hook left NULL (identity). */
void dl_train_comm_init_local(dl_train_comm_t *c);

/* Cuts a gradient buffer of n floats into consecutive buckets of bucket_bytes (the last one
 * shorter; bucket_bytes 0 means one bucket). ret_ends[i] is the end of bucket i (its start is
 * the previous end); *ret_ends is malloc'ed, the caller frees it. */
int dl_train_buckets_plan(size_t n, size_t bucket_bytes, size_t **ret_ends, size_t *ret_count);

/* ---- Checkpoints ------------------------------------------------------------------------- */

/* What a checkpoint holds. For saving every field is read; for loading the caller fills the
 * shape (n_layers, sizes, act, n_params) and the two buffers, which receive the stored values
 * only if the file is valid and has that shape. */
typedef struct dl_train_ckpt_s {
    size_t n_layers;
    size_t sizes[DL_TRAIN_MAX_LAYERS + 1];
    dl_train_act_t act;
    size_t n_params;
    float *params;     /* n_params, not owned */
    float *momentum;   /* n_params, not owned */
    uint64_t step;     /* optimizer steps done */
    uint64_t epoch;    /* sampler position */
    uint64_t consumed; /* see dl_train_sampler_tell() */
    uint64_t seed;
    uint64_t rng[4];     /* the trainer's random state */
    uint32_t world_size; /* of the run that wrote it, for the record */
} dl_train_ckpt_t;

/* Writes "<dir>/ckpt-<step>.dlck" atomically: a temporary file in dir, fsync, rename, fsync of
 * dir. A reader never sees a partial checkpoint under the final name. The file is a header
 * (magic, version, byte order, shape, step, position, seed, RNG) followed by parameters and
 * momentum, and a CRC-32 of everything before it. If ret_path is not NULL it receives the name. */
int dl_train_ckpt_save(const char *dir, const dl_train_ckpt_t *ck, char *ret_path, size_t pathlen,
                       char *err, size_t errlen);

/* Reads one file into ck (see above). A bad magic, version, byte order, size, checksum or shape
 * is -EBADMSG (-EINVAL for a shape mismatch) and one line saying why. */
int dl_train_ckpt_load(const char *path, dl_train_ckpt_t *ck, char *err, size_t errlen);

/* Called for each checkpoint that load_latest skips, with the line saying why. */
typedef void (*dl_train_ckpt_skip_cb)(void *ud, const char *why);

/* Loads the newest valid checkpoint in dir, skipping (and reporting) invalid ones.
 * Returns 1 when one was loaded (its name in ret_path when not NULL), 0 when there is none
 * (or dir does not exist), -errno when dir cannot be read. */
int dl_train_ckpt_load_latest(const char *dir, dl_train_ckpt_t *ck, dl_train_ckpt_skip_cb skipped,
                              void *ud, char *ret_path, size_t pathlen, char *err, size_t errlen);

/* Checks the file at path as dl_train_ckpt_load would (header, size, shape, checksum) without
 * loading it: 0, or the same errors and line. Only shape's shape fields are read. */
int dl_train_ckpt_verify(const char *path, const dl_train_ckpt_t *shape, char *err, size_t errlen);

/* Keeps the newest `keep` checkpoints in dir that verify against shape (keep >= 1) and deletes
 * every checkpoint file older than the oldest of those, valid or not, and stale temporary files.
 * With fewer than `keep` valid ones nothing is deleted, so the newest valid checkpoint is never
 * lost; damaged files newer than it stay for inspection until newer good ones push them out.
 * invalid (may be NULL) hears, with the line saying why, each file found damaged on the way. */
int dl_train_ckpt_prune(const char *dir, unsigned keep, const dl_train_ckpt_t *shape,
                        dl_train_ckpt_skip_cb invalid, void *ud, char *err, size_t errlen);

/* ---- Configuration ----------------------------------------------------------------------- */

typedef struct dl_train_config_s {
    char *dataset_dir; /* owned, NULL: DL_TRAIN_DEFAULT_DATASET */
    size_t n_layers;   /* weight layers */
    size_t sizes[DL_TRAIN_MAX_LAYERS + 1];
    dl_train_act_t activation;
    size_t batch_size; /* per device */
    uint64_t epochs;
    uint64_t steps; /* > 0: train this many steps instead of `epochs` epochs */
    bool drop_last;
    double lr;
    double momentum;
    double weight_decay;
    dl_train_scaling_t lr_scaling;
    size_t base_batch; /* the global batch that lr is tuned for */
    dl_train_sched_t schedule;
    double lr_min;
    double lr_gamma;
    uint64_t lr_step_epochs;
    uint64_t warmup_steps;
    dl_train_on_divergence_t on_divergence;
    double divergence_factor;
    uint64_t divergence_window;
    uint64_t seed;
    size_t bucket_bytes;
    dl_train_overlap_t overlap; /* sum gradient buckets during backward */
    bool peer_reads;            /* sharded, every rank on one host: blocks read in place */
    char *checkpoint_dir;       /* owned, NULL: no checkpoints */
    uint64_t checkpoint_every;  /* steps; 0: at each epoch's end (and always at the end or stop) */
    unsigned keep_checkpoints;
    bool resume;
    uint64_t eval_every; /* steps; 0: at each epoch's end */
    uint64_t log_every;  /* steps; 0: about four progress lines an epoch */
    char *summary_file;  /* owned, NULL: none */
    int blas_threads;    /* 0: leave OpenBLAS as it is */
    /* Fault injection for testing restarts, acted on by the dlaunch-train program (the library
     * ignores them): rank fail_rank kills itself with SIGKILL once fail_at_step steps are done,
     * in a job's first attempt only. 0: never. */
    uint64_t fail_at_step;
    int fail_rank;
    /* Where in the step it dies: 0 after it (as above), else in step fail_at_step, fail_delay_us
     * after entering that DL_TRAIN_PHASE_* (compute, exchange, gather). */
    int fail_phase;
    uint64_t fail_delay_us;
    /* A replacement of the first in-job recovery kills itself once in the group. */
    bool fail_on_join;
    /* The same for hang reports: rank fail_rank stops itself (SIGSTOP) in step hang_at_step,
     * after computing its gradients and before summing them, in the first attempt only. */
    uint64_t hang_at_step;
    /* A straggler for the straggler rule's tests: rank slow_rank sleeps slow_ms_per_step in the
     * compute phase of every step that starts slow_after_s or more after its first, in every
     * attempt. 0 ms: never. */
    double slow_ms_per_step;
    int slow_rank;
    double slow_after_s;
} dl_train_config_t;

void dl_train_config_init(dl_train_config_t *cfg);
void dl_train_config_free(dl_train_config_t *cfg);

/* Sets one key from its text form, as a YAML loader or `--set key=value` has it. Unknown keys and
 * bad values are -EINVAL / -ERANGE with one line naming the key. cfg is untouched on failure. */
int dl_train_config_set(dl_train_config_t *cfg, const char *key, const char *value, char *err,
                        size_t errlen);

/* Checks the settings against each other (e.g. layer count, batch vs base batch). */
int dl_train_config_check(const dl_train_config_t *cfg, char *err, size_t errlen);

/* The table of settings (keys, types, defaults, help), for help texts, DLAUNCH_TRAIN_<KEY>
 * variables and typo hints; see config/opt.h. */
extern const dl_opt_table_t dl_train_settings;

/* The peak learning rate and the warmup steps a run of `world` ranks uses, from lr, warmup_steps,
 * lr_scaling, batch_size and base_batch (k = batch_size * world / base_batch): none keeps both;
 * linear multiplies the rate by k and the warmup by k (at most half of total_steps, never below
 * warmup_steps); sqrt multiplies the rate by sqrt(k) and keeps the warmup. */
void dl_train_scaled_lr(const dl_train_config_t *cfg, int world, uint64_t total_steps,
                        double *ret_lr, uint64_t *ret_warmup);

/* ---- The training loop ------------------------------------------------------------------- */

typedef struct dl_train_hooks_s {
    void *ud;
    /* One line of progress, without newline; called on rank 0 only. May be NULL. */
    void (*log)(void *ud, const char *line);
    /* Polled before each step with the number of steps done; nonzero on any rank makes that
     * step the last one on every rank, followed by a checkpoint. May be NULL. */
    int (*should_stop)(void *ud, uint64_t step);
    /* Called on every rank after each checkpoint (rank 0 wrote it; path is its name there and
     * NULL on the other ranks) and once at the end, with the CRC-32 of this rank's parameters
     * after `step` steps. Equal values on all ranks show that they are bitwise replicas.
     * May be NULL. */
    void (*params_crc)(void *ud, uint64_t step, uint32_t crc, const char *path);
    /* >= 0: a line of figures is written here every 0.1 s of steps and after the last step
     * (the agent's watchdog and straggler rule; docs/diagnostics.md: "step=S steps=K
     * compute_ms=C wait_ms=W loss=L samples=N"). The caller makes it nonblocking; EAGAIN is
     * ignored, a closed pipe ends the beats. */
    int health_fd;
    /* Called on every rank in each step once its gradients are computed and before they are
     * summed, with the step's number (1 for the first). May be NULL. */
    void (*mid_step)(void *ud, uint64_t step);
    /* Called on every rank as step `step` (1 for the first) enters each phase (fault injection
     * for the recovery tests). May be NULL. */
    void (*phase)(void *ud, uint64_t step, int phase);
} dl_train_hooks_t;

/* The phases dl_train_hooks_t.phase reports. */
enum {
    DL_TRAIN_PHASE_COMPUTE = 1, /* the step starts: batch, forward, backward */
    DL_TRAIN_PHASE_EXCHANGE,    /* the gradients are about to be summed */
    DL_TRAIN_PHASE_GATHER,      /* sharded: the updated blocks are about to be gathered */
    DL_TRAIN_PHASE_UPDATE,      /* sharded: this rank's block is about to be updated (two ranks
                                   in place: and its new parameters handed to the other) */
};

typedef struct dl_train_result_s {
    uint64_t steps;        /* optimizer steps done in total, including before a resume */
    uint64_t resumed_from; /* step of the checkpoint resumed from, 0 if none */
    bool stopped;          /* should_stop ended the run early */
    double train_loss;     /* mean job-wide loss of the last logging window */
    double test_loss;      /* rank 0; NaN where not evaluated */
    double test_accuracy;
    double train_seconds; /* time in steps, excluding evaluation and checkpoints */
    double wall_seconds;
    double samples_per_sec; /* global samples per training second */
    double lr;              /* peak learning rate after scaling */
    bool overlapped;        /* gradients were summed during backward (see overlap) */
    bool sharded;           /* each rank updated 1/world of the parameters (see the comm hooks) */
    bool peer_reads;        /* the sharded step read the other ranks' blocks in place */
    unsigned recoveries;    /* in-job recoveries this rank took part in (joining counts) */
    uint32_t params_crc;    /* CRC-32 of the final parameters: equal on every rank */
    unsigned rollbacks;     /* on_divergence: rollback: how often the run went back */
} dl_train_result_t;

/* dl_train_run's return when the loss diverged (see dl_train_divergence_t). */
#define DL_TRAIN_DIVERGED 2

/* hooks may be NULL. Loads the data, resumes from the newest valid checkpoint when resume is set,
 * trains, evaluates, checkpoints and writes the summary. Returns 0 (done), 1 (stopped by
 * should_stop), DL_TRAIN_DIVERGED with the one line saying so in err (every rank at the same step;
 * no checkpoint is written of the diverged state), or -errno with one line in err. */
int dl_train_run(const dl_train_config_t *cfg, const dl_train_comm_t *comm,
                 const dl_train_hooks_t *hooks, dl_train_result_t *ret_result, char *err,
                 size_t errlen);

#endif
