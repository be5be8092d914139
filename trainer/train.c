/* The training loop: data, sampler, model, gradient reduction, optimizer, checkpoints, reports.
 *
 * DDP semantics: every rank starts from rank 0's state (initial or restored), trains on its own
 * shard, sums gradients through the comm hooks with the loss gradient pre-scaled by 1 / world, and
 * takes the same optimizer step. Only rank 0 evaluates, logs, checkpoints and writes the summary.
 *
 * Stopping is agreed, not local: a stop request rides in a spare float after the gradients, in
 * the last bucket, so every rank learns of it in the same step and none is left waiting in an
 * all-reduce that the others will never join. Each rank's loss rides in the next spare float, so
 * every rank holds the same job-wide loss, and the divergence watch fed with it reaches the same
 * verdict at the same step everywhere.
 */
#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "internal.h"

#define EVAL_CHUNK 1000

typedef struct {
    const dl_train_config_t *cfg;
    const dl_train_comm_t *comm;
    const dl_train_hooks_t *hooks;
    char *err;
    size_t errlen;

    dl_train_dataset_t train;
    dl_train_dataset_t test;
    dl_train_sampler_t sampler;
    dl_train_mlp_t *mlp;
    float *momentum;
    float *x;
    uint8_t *y;
    uint32_t *idx;
    dl__train_reducer_t reducer;
    dl__train_rng_t rng;
    dl_train_schedule_t sched;
    size_t n_params;

    uint64_t step;
    uint64_t total_steps;
    uint64_t steps_per_epoch;
    uint64_t log_every;
    uint64_t resumed_from;
    dl__train_beat_t beat;
    double wait_time;   /* this step's time inside collective calls */
    double win_compute; /* the progress window's time outside them */
    float *figs;        /* world x 2: each rank's compute and step ms, for the progress line */
    bool overlap;       /* gradient buckets summed during backward */
    /* Sharded update: this rank's block [shard_lo, shard_lo + shard_len) of the padded buffers
     * (world x shard_len floats) gets its summed gradient in shard_grad and is updated here. */
    bool sharded;
    size_t shard_lo;
    size_t shard_len;
    float *shard_grad;

    double t_begin;
    double train_time;
    double samples; /* global samples trained in this run */
    double win_loss;
    uint64_t win_steps;
    double win_time;
    double win_samples;
    double last_loss;
    dl_train_divergence_t watch;
    unsigned rollbacks;

    /* In-job recovery (docs/recovery.md): the state after the last complete step stays whole
     * while the next step is made, so that the group can go on from it whatever broke when. */
    bool rec;
    bool comm_failed; /* a hook failed: the group is broken */
    /* What the first of a series of recoveries recovers from: a recovery that fails names it
     * once, not inside every later attempt's message. */
    char rec_cause[DL_TRAIN_ERRLEN];
    bool state_valid; /* this rank holds a whole state (false until the start state is in) */
    int world;        /* the world the shards were cut for */
    float *p_alt;     /* the step before the last complete one (rec_step_back); unsharded, the
                         * next step is made in it */
    float *mbuf[2];   /* momentum: the whole (unsharded) or this rank's block (sharded) */
    float *mpriv;     /* unsharded: the allocation of both buffers */
    uint64_t *mstep;  /* mstep[b]: the step whose momentum mbuf[b] holds; REC_NONE: being made */
    uint64_t mstep_priv[2];
    void *mshared; /* sharded: the block the host's ranks can read: header, mbuf[0], [1] */
    int cur;       /* mbuf[cur] holds the momentum of the last complete step */
    struct snap_s {
        uint64_t step, epoch;
        size_t pos;
        dl_train_divergence_t watch;
    } snap[2];           /* snap[cur]: sampler and loss watch after the last complete step */
    float *momentum_own; /* r->momentum when this run allocated it (not one of mpriv's) */
    /* Across hosts (sharded): the momentum of the buddy rank's block, kept like the own one:
     * rmbuf[0..len) and [len..2 len) ping-pong with cur, then its summed gradient. */
    int buddy;
    /* Sharded with every rank on this host: the parameters, the gradients and p_alt live in the
     * group's memory (peers.c), and home[] keeps the private buffers they were copied from, which
     * take them back before the group goes (a recovery, the end). */
    dl__train_peers_t peers;
    float *home[DL__TRAIN_PEER_BUFS];
    float *rmbuf;
    float *rgrad;
    uint64_t rmstep[2];
    /* Sharded: every block of the old layout this rank can give, both buffers, as the broken
     * group left them (its own, its buddy's, those of the ranks on its host). */
    struct rescued_s {
        int block;
        uint64_t mstep[2];
        float *buf; /* 2 x len */
    } * rescued;
    size_t nrescued;
    int old_rank;     /* this rank's place in the layout the state was kept in, -1: none */
    size_t old_len;   /* that layout's block length */
    float *xfer;      /* shard_len floats: a block broadcast for another rank */
    double failed_at; /* when this rank saw the group break */
    unsigned recoveries;
} run_t;

/* A buffer of mstep being written: it holds no step. */
#define REC_NONE UINT64_MAX
/* The shared block's header before the two momentum buffers (whole cache lines). */
#define REC_HDR_FLOATS 16

/* Where the spare floats after the parameters sit (see DL_TRAIN_SPARE_FLOATS). */
#define VOTE_AT(r) ((r)->n_params)
#define LOSS_AT(r) ((r)->n_params + 1)
/* on_divergence: rollback gives up after this many. */
#define MAX_ROLLBACKS 3

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool is_root(const run_t *r)
{
    return r->comm->rank == 0;
}

/* The backend's own account of a failed hook when it has one (it names the peer), else errno. */
static const char *comm_error(const run_t *r, int rc)
{
    const dl_train_comm_t *c = r->comm;
    const char *why = c->error != NULL ? c->error(c->ctx) : NULL;

    return why != NULL && why[0] != '\0' ? why : strerror(-rc);
}

static void say(const run_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void phase(run_t *r, int which);
static int rec_shared_alloc(run_t *r);
static int peers_attach(run_t *r);

static void say(const run_t *r, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (!is_root(r) || r->hooks == NULL || r->hooks->log == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    r->hooks->log(r->hooks->ud, line);
}

static void shape_text(const dl_train_config_t *cfg, char *buf, size_t len)
{
    size_t off = 0;

    buf[0] = '\0';
    for (size_t l = 0; l <= cfg->n_layers && off < len; l++)
        off += (size_t)snprintf(buf + off, len - off, "%s%zu", l ? "-" : "", cfg->sizes[l]);
}

/* A set's images and labels must fit the layers. */
static int check_set(run_t *r, const char *dir, const dl_train_dataset_t *d, const char *name)
{
    const dl_train_config_t *cfg = r->cfg;
    if (d->n == 0)
        return 0;
    if (d->dim != cfg->sizes[0])
        return dl__train_err(-EINVAL, r->err, r->errlen,
                             "%s: %s images are %zux%zu = %zu values, layers start at %zu", dir,
                             name, d->rows, d->cols, d->dim, cfg->sizes[0]);
    if (d->n_classes > cfg->sizes[cfg->n_layers])
        return dl__train_err(-EINVAL, r->err, r->errlen,
                             "%s: %s labels go up to %zu, layers end at %zu classes", dir, name,
                             d->n_classes - 1, cfg->sizes[cfg->n_layers]);
    return 0;
}

static const char *dataset_dir(const run_t *r)
{
    return r->cfg->dataset_dir != NULL ? r->cfg->dataset_dir : DL_TRAIN_DEFAULT_DATASET;
}

/* Rank 0 evaluates: only it loads the test set. */
static int load_test(run_t *r)
{
    int rc = dl_train_dataset_load(&r->test, dataset_dir(r), "t10k", r->err, r->errlen);
    return rc < 0 ? rc : check_set(r, dataset_dir(r), &r->test, "t10k");
}

static int load_data(run_t *r)
{
    int rc = dl_train_dataset_load(&r->train, dataset_dir(r), "train", r->err, r->errlen);
    if (rc == 0)
        rc = check_set(r, dataset_dir(r), &r->train, "train");
    if (rc == 0 && is_root(r))
        rc = load_test(r);
    return rc;
}

/* Finds unwritable output places before training rather than after it. */
/* Like mkdir -p: a user naming runs/exp1/ckpt expects the folders made. Sets errno on failure. */
static int mkdir_parents(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0750) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0750) < 0 && errno != EEXIST ? -1 : 0;
}

static int check_outputs(run_t *r)
{
    const dl_train_config_t *cfg = r->cfg;
    char dir[4096];

    if (!is_root(r))
        return 0;
    if (cfg->checkpoint_dir != NULL && mkdir_parents(cfg->checkpoint_dir) < 0)
        return dl__train_err(-errno, r->err, r->errlen, "checkpoint_dir %s: %s",
                             cfg->checkpoint_dir, strerror(errno));
    if (cfg->checkpoint_dir != NULL && access(cfg->checkpoint_dir, W_OK | X_OK) < 0)
        return dl__train_err(-errno, r->err, r->errlen, "checkpoint_dir %s: %s",
                             cfg->checkpoint_dir, strerror(errno));
    if (cfg->summary_file != NULL) {
        snprintf(dir, sizeof(dir), "%s", cfg->summary_file);
        char *slash = strrchr(dir, '/');
        if (slash == NULL)
            snprintf(dir, sizeof(dir), ".");
        else if (slash == dir)
            slash[1] = '\0';
        else
            *slash = '\0';
        if (access(dir, W_OK | X_OK) < 0)
            return dl__train_err(-errno, r->err, r->errlen, "summary_file %s: %s: %s",
                                 cfg->summary_file, dir, strerror(errno));
    }
    return 0;
}

/* Everything that depends on the world's size and this rank's place in it: the sampler's share,
 * the steps, the shards of the sharded update and the buffers cut for them, the learning rate
 * (scaled for the global batch). Run at the start, and again after an in-job recovery (the
 * world may have changed: a node lost or come back). The model's parameters stay; momentum
 * starts at zero, the caller fills it. */
static int layout(run_t *r)
{
    const dl_train_config_t *cfg = r->cfg;
    const dl_train_comm_t *c = r->comm;
    const int world = c->world_size;
    int rc;

    dl_train_sampler_free(&r->sampler);
    rc = dl_train_sampler_init(&r->sampler, r->train.n, c->rank, world, cfg->seed, cfg->drop_last);
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen,
                             "sampler: %zu training samples cannot be shared by %d ranks",
                             r->train.n, world);
    size_t share = r->sampler.num_samples;
    r->steps_per_epoch =
        cfg->drop_last ? share / cfg->batch_size : (share + cfg->batch_size - 1) / cfg->batch_size;
    if (r->steps_per_epoch == 0)
        return dl__train_err(-EINVAL, r->err, r->errlen,
                             "batch_size %zu is larger than a rank's %zu samples and drop_last "
                             "is set: no step in an epoch",
                             cfg->batch_size, share);
    r->total_steps = cfg->steps > 0 ? cfg->steps : cfg->epochs * r->steps_per_epoch;
    r->log_every = cfg->log_every > 0 ? cfg->log_every : (r->steps_per_epoch + 3) / 4;

    size_t padded = r->n_params + DL_TRAIN_SPARE_FLOATS;
    if (r->sharded) {
        /* Whole cache lines a shard: a block starting mid-line makes every 64-byte load of the
         * update and of the collective's copies straddle two lines (rank 1's update took 29 us
         * against rank 0's 20, and rank 0 waited for it). */
        r->shard_len = (r->n_params + DL_TRAIN_SPARE_FLOATS + (size_t)world - 1) / (size_t)world;
        r->shard_len = (r->shard_len + 15) & ~(size_t)15;
        r->shard_lo = r->shard_len * (size_t)c->rank;
        padded = r->shard_len * (size_t)world;
        rc = dl_train_mlp_pad(r->mlp, padded);
        free(r->shard_grad);
        r->shard_grad = aligned_alloc(64, r->shard_len * sizeof(float));
        if (rc < 0 || r->shard_grad == NULL)
            return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for the shards");
    }

    /* Padded too: checkpoints gather the momentum's shards into it. */
    padded = (padded + 15) & ~(size_t)15;
    r->world = world;
    r->mstep = r->mstep_priv;
    r->mshared = NULL;
    r->mbuf[0] = r->mbuf[1] = NULL;
    free(r->mpriv);
    r->mpriv = NULL;
    free(r->rmbuf);
    r->rmbuf = r->rgrad = NULL;
    r->buddy = -1;
    r->cur = 0;
    r->mstep[0] = 0;
    r->mstep[1] = REC_NONE;
    if (r->rec) {
        size_t pcap = dl_train_mlp_capacity(r->mlp);
        free(r->p_alt);
        r->p_alt = aligned_alloc(64, ((pcap + 15) & ~(size_t)15) * sizeof(float));
        if (r->p_alt == NULL)
            return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for the parameters");
        memset(r->p_alt, 0, pcap * sizeof(float));
        if (!r->sharded) {
            /* Both momentum buffers whole: every rank holds all of it. */
            r->mpriv = aligned_alloc(64, 2 * padded * sizeof(float));
            if (r->mpriv == NULL)
                return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for momentum");
            memset(r->mpriv, 0, 2 * padded * sizeof(float));
            r->mbuf[0] = r->mpriv;
            r->mbuf[1] = r->mpriv + padded;
        } else {
            free(r->xfer);
            r->xfer = aligned_alloc(64, r->shard_len * sizeof(float));
            if (r->xfer == NULL)
                return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for momentum");
        }
        /* Across hosts a rank also keeps the momentum of one block on another host (its buddy:
         * the rank as far ahead as its own host has ranks), so that losing a whole host loses
         * no block; there the reduce-scatter sums everything anyway, so that block's sum is a
         * copy away. On one host the ranks' shared memory is the replica. */
        if (r->sharded && c->host_of != NULL && c->reduce_scatter_extra != NULL) {
            int host = c->host_of(c->ctx, c->rank), here = 0;
            for (int q = 0; q < world; q++)
                here += c->host_of(c->ctx, q) == host;
            int b = (c->rank + here) % world;
            if (b != c->rank && c->host_of(c->ctx, b) != host)
                r->buddy = b;
        }
        if (r->buddy >= 0) {
            r->rmbuf = aligned_alloc(64, 3 * r->shard_len * sizeof(float));
            if (r->rmbuf == NULL)
                return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for momentum");
            memset(r->rmbuf, 0, 3 * r->shard_len * sizeof(float));
            r->rgrad = r->rmbuf + 2 * r->shard_len;
        }
        r->rmstep[0] = 0;
        r->rmstep[1] = REC_NONE;
    }
    free(r->momentum_own);
    r->momentum_own = NULL;
    if (r->rec && !r->sharded) {
        r->momentum = r->mbuf[0];
    } else {
        r->momentum = r->momentum_own = aligned_alloc(64, padded * sizeof(float));
        if (r->momentum == NULL)
            return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for momentum");
        memset(r->momentum, 0, padded * sizeof(float));
    }
    free(r->figs);
    r->figs = world > 1 ? calloc(3 * (size_t)world, sizeof(float)) : NULL;

    dl_train_scaled_lr(cfg, world, r->total_steps, &r->sched.lr, &r->sched.warmup_steps);
    r->sched.lr_min = cfg->lr_min;
    /* A rolled-back run keeps its halved rate. */
    for (unsigned i = 0; i < r->rollbacks; i++) {
        r->sched.lr *= 0.5;
        r->sched.lr_min *= 0.5;
    }
    r->sched.kind = cfg->schedule;
    r->sched.gamma = cfg->lr_gamma;
    r->sched.step_size = cfg->lr_step_epochs * r->steps_per_epoch;
    r->sched.total_steps = r->total_steps;
    return 0;
}

/* A rank whose own setting is explicit and says otherwise than `whose` cannot follow it. */
static int overlap_conflict(run_t *r, bool on, const char *whose)
{
    if (r->cfg->overlap == DL_TRAIN_OVERLAP_AUTO || on == r->overlap)
        return 0;
    return dl__train_err(-EINVAL, r->err, r->errlen,
                         "overlap is %s on rank %d but %s sums the gradients with it %s: set it "
                         "alike on every rank",
                         r->overlap ? "on" : "off", r->comm->rank, whose, on ? "on" : "off");
}

/* Without overlap, and where the backend offers both halves, each rank updates its block. */
static bool shards(const run_t *r)
{
    const dl_train_comm_t *c = r->comm;
    return c->world_size > 1 && !r->overlap && c->reduce_scatter != NULL && c->allgather != NULL;
}

/* Whether the gradients are summed alongside backward (overlap) is one decision for the whole
 * job: ranks that differ would call different collectives and wait on each other for ever. With
 * "auto" it rests on the host (a core to spare for the sum), and hosts, or workers bound to
 * different NUMA nodes, can differ; so rank 0's decision is everyone's. A rank whose own setting
 * is explicit and says otherwise cannot follow it: that is an error in the job's settings. */
static int agree_on_overlap(run_t *r)
{
    const dl_train_comm_t *c = r->comm;
    int32_t theirs = r->overlap;
    /* Not a hook failure to recover from in-job: the run is not set up yet. */
    int rc = c->broadcast(c->ctx, &theirs, sizeof(theirs), 0);
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen, "agreeing on overlap: %s", comm_error(r, rc));
    rc = overlap_conflict(r, theirs != 0, "rank 0");
    if (rc == 0)
        r->overlap = theirs != 0;
    return rc;
}

static int setup(run_t *r)
{
    const dl_train_config_t *cfg = r->cfg;
    const int world = r->comm->world_size;
    size_t cap = cfg->batch_size > EVAL_CHUNK ? cfg->batch_size : EVAL_CHUNK;
    int rc;

    dl__train_rng_seed(&r->rng, cfg->seed);
    rc = dl_train_mlp_new(cfg->sizes, cfg->n_layers, cfg->activation, cap,
                          dl__train_rng_next(&r->rng), &r->mlp);
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen, "model: %s", strerror(-rc));
    r->n_params = dl_train_mlp_num_params(r->mlp);

    r->overlap = world > 1 && (cfg->overlap == DL_TRAIN_OVERLAP_ON ||
                               (cfg->overlap == DL_TRAIN_OVERLAP_AUTO && r->comm->overlap_pays));
    /* A replacement takes the running job's decision instead (rec_sync). */
    if (world > 1 && !r->comm->joining) {
        rc = agree_on_overlap(r);
        if (rc < 0)
            return rc;
    }
    r->sharded = shards(r);
    r->rec = world > 1 && r->comm->rejoin != NULL && r->comm->allgather_bytes != NULL;
    r->old_rank = -1;
    rc = layout(r);
    if (rc < 0)
        return rc;
    /* The host's shared memory, a collective of the group; a replacement makes it with the
     * others when the state is shared (rec_sync). */
    if (r->rec && r->sharded && !r->comm->joining) {
        rc = rec_shared_alloc(r);
        if (rc == 0)
            rc = peers_attach(r);
        if (rc < 0)
            return rc;
    }
    r->x = malloc(cap * cfg->sizes[0] * sizeof(float));
    r->y = malloc(cap);
    r->idx = malloc(cap * sizeof(uint32_t));
    if (r->x == NULL || r->y == NULL || r->idx == NULL)
        return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for the batch buffers");
    rc = dl__train_reducer_init(&r->reducer, r->comm, dl_train_mlp_grads(r->mlp),
                                r->n_params + DL_TRAIN_SPARE_FLOATS, cfg->bucket_bytes, r->overlap);
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen, "buckets: %s", strerror(-rc));
    dl_train_divergence_init(&r->watch, cfg->divergence_factor, cfg->divergence_window);
    return 0;
}
/* ---- In-job recovery: the state kept whole ------------------------------------------------ */

static int hook_failed(run_t *r, int rc)
{
    if (rc < 0 && !r->comm_failed) {
        r->comm_failed = true;
        r->failed_at = now();
    }
    return rc;
}

/* Sharded: this rank's block of the momentum, twice, in memory the host's other ranks can read
 * (also once this rank died), after a header saying which step each buffer holds. */
static int rec_shared_alloc(run_t *r)
{
    const dl_train_comm_t *c = r->comm;
    size_t bytes = (REC_HDR_FLOATS + 2 * r->shard_len) * sizeof(float);
    void *p = NULL;

    if (c->mem_alloc != NULL) {
        int rc = hook_failed(r, c->mem_alloc(c->ctx, bytes, &p));
        if (rc < 0)
            return dl__train_err(rc, r->err, r->errlen, "shared memory for the optimizer state: %s",
                                 comm_error(r, rc));
    } else {
        /* No replica on the host then: a lost block ends in a restart. */
        free(r->mpriv);
        r->mpriv = p = aligned_alloc(64, bytes);
        if (p == NULL)
            return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for momentum");
        memset(p, 0, bytes);
    }
    r->mshared = p;
    r->mstep = p;
    r->mbuf[0] = (float *)p + REC_HDR_FLOATS;
    r->mbuf[1] = r->mbuf[0] + r->shard_len;
    return 0;
}

/* Every rank's `mine` to every rank (allgather_bytes, present with rejoin): *ret_all when every
 * one was true. */
static int vote(run_t *r, bool mine, bool *ret_all)
{
    const dl_train_comm_t *c = r->comm;
    /* Every rank is on this host (peers_attach): a handful, as a rule. */
    int32_t few[64], *all = c->world_size <= 64 ? few : calloc((size_t)c->world_size, sizeof(*all));
    if (all == NULL)
        return -ENOMEM;
    memset(all, 0, (size_t)c->world_size * sizeof(*all));
    all[c->rank] = mine;
    int rc = hook_failed(r, c->allgather_bytes(c->ctx, all, sizeof(*all)));
    *ret_all = true;
    for (int q = 0; q < c->world_size; q++)
        *ret_all = *ret_all && all[q] != 0;
    if (all != few)
        free(all);
    return rc;
}

/* With every rank on this host: the parameters, the gradients and the step before them into
 * memory the host's ranks map, so that the kept sharded step reads the other ranks' blocks in
 * place (peers.c). Collective, like rec_shared_alloc. Every rank must take the same path (the
 * step's collectives differ): the ranks vote on the setting and then on whether each set the
 * buffers up, and copy through the collective unless all said yes. The plain step (no in-job
 * recovery) keeps copying: it updates its block of the parameters in place, into lines the
 * others read at the last gather, and measured 3% slower reading in place. */
static int peers_attach(run_t *r)
{
    const dl_train_comm_t *c = r->comm;
    bool all;

    if (!r->rec || !r->sharded || c->world_size < 2 || c->mem_alloc == NULL ||
        c->mem_peer == NULL || c->host_of == NULL)
        return 0;
    int host = c->host_of(c->ctx, 0);
    for (int q = 1; q < c->world_size; q++)
        if (c->host_of(c->ctx, q) != host)
            return 0;
    int rc = vote(r, r->cfg->peer_reads, &all);
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen, "agreeing on peer_reads: %s",
                             comm_error(r, rc));
    if (!all) {
        if (r->cfg->peer_reads)
            say(r, "peer_reads is off on another rank: every rank copies the blocks through the "
                   "collective");
        return 0;
    }
    size_t pcap = dl_train_mlp_capacity(r->mlp);
    int made = dl__train_peers_open(&r->peers, c, (pcap + 15) & ~(size_t)15);
    rc = vote(r, made == 0, &all);
    if (rc < 0) {
        dl__train_peers_close(&r->peers);
        return dl__train_err(rc, r->err, r->errlen, "shared memory for the parameters: %s",
                             comm_error(r, rc));
    }
    if (!all) {
        dl__train_peers_close(&r->peers);
        if (made < 0)
            say(r,
                "peer_reads: no shared memory for the parameters (%s): the blocks are copied "
                "through the collective",
                strerror(-made));
        else
            say(r, "peer_reads: another rank has no shared memory for the parameters: the "
                   "blocks are copied through the collective");
        return 0;
    }
    float *const *bufs = r->peers.mine;
    memcpy(bufs[0], dl_train_mlp_params(r->mlp), pcap * sizeof(float));
    memcpy(bufs[1], dl_train_mlp_grads(r->mlp), pcap * sizeof(float));
    memcpy(bufs[2], r->p_alt, pcap * sizeof(float));
    r->home[0] = dl_train_mlp_swap_params(r->mlp, bufs[0]);
    r->home[1] = dl_train_mlp_swap_grads(r->mlp, bufs[1]);
    r->home[2] = r->p_alt;
    r->p_alt = bufs[2];
    return 0;
}

/* The buffers back into private memory, before the group that holds them goes: the state of
 * the last step and of the one before stays the trainer's. */
static void peers_detach(run_t *r)
{
    if (!dl__train_peers_on(&r->peers))
        return;
    size_t bytes = dl_train_mlp_capacity(r->mlp) * sizeof(float);
    memcpy(r->home[0], dl_train_mlp_params(r->mlp), bytes);
    memcpy(r->home[1], dl_train_mlp_grads(r->mlp), bytes);
    memcpy(r->home[2], r->p_alt, bytes);
    (void)dl_train_mlp_swap_params(r->mlp, r->home[0]);
    (void)dl_train_mlp_swap_grads(r->mlp, r->home[1]);
    r->p_alt = r->home[2];
    dl__train_peers_close(&r->peers);
}

static void snap_take(run_t *r, struct snap_s *sn)
{
    sn->step = r->step;
    sn->epoch = r->sampler.epoch;
    sn->pos = r->sampler.pos;
    sn->watch = r->watch;
}

/* The state is whole as it is now (a start, a checkpoint restored, a recovery): both snapshots
 * say so, and the momentum buffer in use holds it. */
static void rec_reset(run_t *r)
{
    if (!r->rec)
        return;
    /* r->momentum holds all of it here (restored, or put together by a recovery). */
    if (r->sharded)
        memcpy(r->mbuf[r->cur], r->momentum + r->shard_lo, r->shard_len * sizeof(float));
    __atomic_store_n(&r->mstep[1 - r->cur], REC_NONE, __ATOMIC_RELEASE);
    __atomic_store_n(&r->mstep[r->cur], r->step, __ATOMIC_RELEASE);
    if (r->buddy >= 0) {
        memcpy(r->rmbuf + (size_t)r->cur * r->shard_len,
               r->momentum + (size_t)r->buddy * r->shard_len, r->shard_len * sizeof(float));
        r->rmstep[1 - r->cur] = REC_NONE;
        r->rmstep[r->cur] = r->step;
    }
    snap_take(r, &r->snap[r->cur]);
    r->snap[1 - r->cur] = r->snap[r->cur];
    r->state_valid = true;
}

/* A step is complete on this rank: its parameters and momentum are in use (train_step swapped
 * them in), the sampler and the loss watch have moved on. */
static void rec_commit(run_t *r)
{
    if (r->rec)
        snap_take(r, &r->snap[r->cur]);
}

/* Sampler and loss watch as they were after the last complete step (a step in progress has
 * drawn its batch already). */
static void rec_snap_restore(run_t *r)
{
    const struct snap_s *sn = &r->snap[r->cur];
    r->step = sn->step;
    if (sn->epoch != r->sampler.epoch)
        dl_train_sampler_set_epoch(&r->sampler, sn->epoch);
    r->sampler.pos = sn->pos;
    r->watch = sn->watch;
}

/* Back to the step before the last complete one: the buffers of that step were kept. */
static void rec_step_back(run_t *r)
{
    r->p_alt = dl_train_mlp_swap_params(r->mlp, r->p_alt);
    r->cur = 1 - r->cur;
    if (!r->sharded)
        r->momentum = r->mbuf[r->cur];
    rec_snap_restore(r);
}

static void fill_ckpt(run_t *r, dl_train_ckpt_t *ck)
{
    const dl_train_config_t *cfg = r->cfg;

    memset(ck, 0, sizeof(*ck));
    ck->n_layers = cfg->n_layers;
    memcpy(ck->sizes, cfg->sizes, sizeof(ck->sizes));
    ck->act = cfg->activation;
    ck->n_params = r->n_params;
    ck->params = dl_train_mlp_params(r->mlp);
    ck->momentum = r->momentum;
    ck->step = r->step;
    dl_train_sampler_tell(&r->sampler, &ck->epoch, &ck->consumed);
    ck->seed = cfg->seed;
    memcpy(ck->rng, r->rng.s, sizeof(ck->rng));
    ck->world_size = (uint32_t)r->comm->world_size;
}

static void skipped_cb(void *ud, const char *why)
{
    say(ud, "skipping checkpoint: %s", why);
}

static void damaged_cb(void *ud, const char *why)
{
    say(ud, "pruning checkpoints: not counting a damaged one: %s", why);
}

/* The part of the state that rank 0 shares with the others at the start. */
typedef struct {
    uint64_t found;
    uint64_t step;
    uint64_t epoch;
    uint64_t consumed;
    uint64_t rng[4];
} sync_t;

/* Rank 0 loads the newest valid checkpoint when `load` (and there is one) and every rank takes
 * rank 0's state, loaded or not. Returns 1 when a checkpoint was loaded, 0 when not, or -errno. */
static int restore(run_t *r, bool load)
{
    const dl_train_config_t *cfg = r->cfg;
    const dl_train_comm_t *c = r->comm;
    sync_t st = {0};
    char path[4096];
    int rc;

    if (is_root(r) && load && cfg->checkpoint_dir != NULL) {
        dl_train_ckpt_t ck;
        fill_ckpt(r, &ck);
        rc = dl_train_ckpt_load_latest(cfg->checkpoint_dir, &ck, skipped_cb, r, path, sizeof(path),
                                       r->err, r->errlen);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            st = (sync_t){1, ck.step, ck.epoch, ck.consumed, {0}};
            memcpy(st.rng, ck.rng, sizeof(st.rng));
            /* A rerun that picks up an old run's checkpoint must say so first, and how not to. */
            bool fresh_start = r->step == 0;
            say(r,
                "resuming from %s: step %llu, epoch %llu, %llu samples into it (written by "
                "%u rank%s)%s%s%s",
                path, (unsigned long long)ck.step, (unsigned long long)ck.epoch + 1,
                (unsigned long long)ck.consumed, ck.world_size, ck.world_size == 1 ? "" : "s",
                fresh_start ? "; to start afresh, remove " : "",
                fresh_start ? cfg->checkpoint_dir : "", fresh_start ? " or set resume: false" : "");
            if (ck.seed != cfg->seed)
                say(r, "note: the checkpoint was written with seed %llu, this run uses %llu",
                    (unsigned long long)ck.seed, (unsigned long long)cfg->seed);
        }
    }
    if (c->world_size > 1) {
        /* Every rank starts from rank 0's weights, restored or fresh, as DDP does. */
        rc = c->broadcast(c->ctx, &st, sizeof(st), 0);
        if (rc == 0)
            rc = c->broadcast(c->ctx, dl_train_mlp_params(r->mlp), r->n_params * sizeof(float), 0);
        if (rc == 0 && st.found)
            rc = c->broadcast(c->ctx, r->momentum, r->n_params * sizeof(float), 0);
        hook_failed(r, rc);
        if (rc < 0)
            return dl__train_err(rc, r->err, r->errlen, "broadcast of the initial state: %s",
                                 comm_error(r, rc));
    }
    if (st.found) {
        r->step = st.step;
        r->resumed_from = st.step;
        memcpy(r->rng.s, st.rng, sizeof(st.rng));
        dl_train_sampler_seek(&r->sampler, st.epoch, st.consumed);
    }
    rec_reset(r);
    return st.found ? 1 : 0;
}

static uint32_t params_crc(run_t *r)
{
    return (uint32_t)crc32_z(0L, (const unsigned char *)dl_train_mlp_params(r->mlp),
                             r->n_params * sizeof(float));
}

static void report_crc(run_t *r, const char *path)
{
    const dl_train_hooks_t *h = r->hooks;

    if (h != NULL && h->params_crc != NULL)
        h->params_crc(h->ud, r->step, params_crc(r), path);
}

/* Every rank comes here at the same steps; rank 0 writes, and all of them report their
 * parameters' CRC so that an observer can check the replicas against the file. */
static int checkpoint(run_t *r)
{
    dl_train_ckpt_t ck;
    char path[4096];
    int rc;

    if (r->cfg->checkpoint_dir == NULL)
        return 0;
    /* Each rank kept only its block of the momentum up to date. */
    if (r->sharded) {
        const dl_train_comm_t *c = r->comm;
        if (r->rec)
            memcpy(r->momentum + r->shard_lo, r->mbuf[r->cur], r->shard_len * sizeof(float));
        rc = hook_failed(r, c->allgather(c->ctx, r->momentum, r->shard_len));
        if (rc < 0)
            return dl__train_err(rc, r->err, r->errlen,
                                 "step %llu: gathering the momentum for a checkpoint: %s",
                                 (unsigned long long)r->step, comm_error(r, rc));
    }
    if (is_root(r)) {
        fill_ckpt(r, &ck);
        rc = dl_train_ckpt_save(r->cfg->checkpoint_dir, &ck, path, sizeof(path), r->err, r->errlen);
        if (rc == 0)
            rc = dl_train_ckpt_prune(r->cfg->checkpoint_dir, r->cfg->keep_checkpoints, &ck,
                                     damaged_cb, r, r->err, r->errlen);
        if (rc < 0)
            return rc;
    }
    report_crc(r, is_root(r) ? path : NULL);
    return 0;
}

static void evaluate(run_t *r, double *ret_loss, double *ret_acc)
{
    const dl_train_dataset_t *d = &r->test;
    double loss = 0.0;
    size_t correct = 0;

    for (size_t i = 0; i < d->n; i += EVAL_CHUNK) {
        size_t k = d->n - i < EVAL_CHUNK ? d->n - i : EVAL_CHUNK;
        double l;
        size_t c;
        for (size_t j = 0; j < k; j++)
            r->idx[j] = (uint32_t)(i + j);
        dl_train_dataset_gather(d, r->idx, k, r->x, r->y);
        dl_train_mlp_evaluate(r->mlp, r->x, r->y, k, &l, &c);
        loss += l;
        correct += c;
    }
    *ret_loss = loss / (double)d->n;
    *ret_acc = (double)correct / (double)d->n;
}

/* The job-wide figures for rank 0's progress line: every rank's compute time a step over the
 * window, gathered at the same steps on every rank. Empty when there is nothing to gather. */
static void job_figures(run_t *r, char *buf, size_t len)
{
    const dl_train_comm_t *c = r->comm;
    int world = c->world_size;
    buf[0] = '\0';
    if (world < 2 || c->allgather == NULL || r->figs == NULL || r->win_steps == 0)
        return;
    r->figs[2 * c->rank] = (float)(r->win_compute * 1e3 / (double)r->win_steps);
    r->figs[2 * c->rank + 1] = (float)(r->win_time * 1e3 / (double)r->win_steps);
    if (c->allgather(c->ctx, r->figs, 2) < 0)
        return;                                  /* the next step's sum fails too, and says why */
    float *sorted = r->figs + 2 * (size_t)world; /* world more floats */
    int slowest = 0;
    for (int i = 0; i < world; i++) {
        sorted[i] = r->figs[2 * i];
        if (r->figs[2 * i] > r->figs[2 * slowest])
            slowest = i;
    }
    for (int i = 1; i < world; i++)
        for (int k = i; k > 0 && sorted[k - 1] > sorted[k]; k--) {
            float t = sorted[k];
            sorted[k] = sorted[k - 1];
            sorted[k - 1] = t;
        }
    float median = sorted[(world - 1) / 2];
    snprintf(buf, len, "; compute a step: median %.3f ms, slowest rank %d %.3f ms (%+.0f%%)",
             median, slowest, r->figs[2 * slowest],
             median > 0 ? (r->figs[2 * slowest] / median - 1) * 100 : 0.0);
}

static void progress(run_t *r, uint64_t epoch)
{
    double rate = r->win_time > 0 ? r->win_samples / r->win_time : 0.0;
    double per_step = r->train_time / (double)(r->step - r->resumed_from);
    double eta = per_step * (double)(r->total_steps - r->step);
    char figures[160];

    job_figures(r, figures, sizeof(figures));
    r->last_loss = r->win_loss / (double)r->win_steps;
    say(r, "epoch %llu step %llu/%llu loss %.4f lr %.5f samples/s %.0f eta %.0fs%s",
        (unsigned long long)epoch + 1, (unsigned long long)r->step,
        (unsigned long long)r->total_steps, r->last_loss, dl_train_lr_at(&r->sched, r->step - 1),
        rate, eta, figures);
    r->win_compute = 0.0;
    r->win_loss = 0.0;
    r->win_steps = 0;
    r->win_time = 0.0;
    r->win_samples = 0.0;
}

/* The sharded step: this rank's block of the summed gradient, its block of the update, then
 * every rank's block to every rank. The stop vote's sum lands in the block that holds index
 * n_params; the parameters' spare float at that index carries it to the others. */
static int sharded_update(run_t *r, float lr, float *ret_vote, float *ret_loss)
{
    const dl_train_comm_t *c = r->comm;
    float *p = dl_train_mlp_params(r->mlp);
    size_t n = r->n_params, lo = r->shard_lo, len = r->shard_len;
    size_t mine = lo >= n ? 0 : lo + len > n ? n - lo : len;

    double t = now();
    int rc = c->reduce_scatter(c->ctx, dl_train_mlp_grads(r->mlp), r->shard_grad, len);
    r->wait_time += now() - t;
    if (rc < 0)
        return rc;
    phase(r, DL_TRAIN_PHASE_UPDATE);
    dl_train_sgd_step(p + lo, r->momentum + lo, r->shard_grad, mine, lr, (float)r->cfg->momentum,
                      (float)r->cfg->weight_decay);
    for (size_t i = n; i < n + DL_TRAIN_SPARE_FLOATS; i++)
        if (i >= lo && i < lo + len)
            p[i] = r->shard_grad[i - lo];
    phase(r, DL_TRAIN_PHASE_GATHER);
    t = now();
    rc = c->allgather(c->ctx, p, len);
    r->wait_time += now() - t;
    *ret_vote = p[VOTE_AT(r)];
    *ret_loss = p[LOSS_AT(r)];
    return rc;
}

static void phase(run_t *r, int which)
{
    const dl_train_hooks_t *h = r->hooks;
    if (h != NULL && h->phase != NULL)
        h->phase(h->ud, r->step + 1, which);
}

/* The sharded step kept whole (in-job recovery): the updated block and momentum go to other
 * buffers, the gathered parameters too, and only a step complete on this rank swaps them in.
 * Until then the last complete step's parameters and momentum stay as they were, and its
 * momentum buffer says which step it holds (mstep, in memory the host's ranks can read). The
 * same arithmetic as sharded_update, so the same bits.
 *
 * The new parameters are made in the gradient buffer, whose block the reduce-scatter has just
 * read: stores to lines in cache. Made in a buffer of their own they went to lines untouched
 * since the step before, and cost 5-6% of the samples/s with AVX-512 kernels. Three buffers
 * take turns: the step being made (the gradients' until then), the last complete step (in use)
 * and the one before it (p_alt, kept for rec_step_back), whose buffer takes the next step's
 * gradients once this step is complete. */
static int sharded_update_kept(run_t *r, float lr, float *ret_vote, float *ret_loss)
{
    const dl_train_comm_t *c = r->comm;
    float *p = dl_train_mlp_params(r->mlp), *q = dl_train_mlp_grads(r->mlp);
    size_t n = r->n_params, lo = r->shard_lo, len = r->shard_len;
    size_t mine = lo >= n ? 0 : lo + len > n ? n - lo : len;
    int nxt = 1 - r->cur;

    bool in_place = dl__train_peers_on(&r->peers);
    /* Two ranks in place: the other's gradient block goes straight into the update, and the new
     * parameters over both gradients, the own and the other's (its copy of them, as if
     * gathered), without the sum written to shard_grad and read back or a copy after. */
    float *other =
        in_place && c->world_size == 2 ? dl__train_peers_of(&r->peers, q, 1 - c->rank) : NULL;
    if (other != NULL)
        other += lo;
    double t = now();
    int rc = hook_failed(r, in_place        ? dl__train_peers_meet(&r->peers, c)
                            : r->buddy >= 0 ? c->reduce_scatter_extra(c->ctx, q, r->shard_grad, len,
                                                                      r->buddy, r->rgrad)
                                            : c->reduce_scatter(c->ctx, q, r->shard_grad, len));
    r->wait_time += now() - t;
    if (rc < 0)
        return rc;
    phase(r, DL_TRAIN_PHASE_UPDATE);
    if (in_place && other == NULL) {
        rc = dl__train_peers_sum(&r->peers, q, r->shard_grad, lo, len);
        if (rc < 0)
            return rc;
    }
    __atomic_store_n(&r->mstep[nxt], REC_NONE, __ATOMIC_RELEASE);
    if (other != NULL)
        dl_train_sgd_step_pair(q + lo, other, r->mbuf[nxt], p + lo, r->mbuf[r->cur], mine, lr,
                               (float)r->cfg->momentum, (float)r->cfg->weight_decay);
    else
        dl_train_sgd_step_to(q + lo, r->mbuf[nxt], p + lo, r->mbuf[r->cur], r->shard_grad, mine, lr,
                             (float)r->cfg->momentum, (float)r->cfg->weight_decay);
    __atomic_store_n(&r->mstep[nxt], r->step + 1, __ATOMIC_RELEASE);
    if (r->buddy >= 0) {
        /* The buddy's block of the momentum, as its rank computes it (the same bits). */
        size_t blo = (size_t)r->buddy * len;
        size_t bn = blo >= n ? 0 : blo + len > n ? n - blo : len;
        r->rmstep[nxt] = REC_NONE;
        dl_train_sgd_momentum_to(r->rmbuf + (size_t)nxt * len, r->rmbuf + (size_t)r->cur * len,
                                 p + blo, r->rgrad, bn, (float)r->cfg->momentum,
                                 (float)r->cfg->weight_decay);
        r->rmstep[nxt] = r->step + 1;
    }
    for (size_t i = n; i < n + DL_TRAIN_SPARE_FLOATS; i++) {
        if (i < lo || i >= lo + len)
            continue;
        if (other != NULL)
            q[i] = other[i - lo] = q[i] + other[i - lo];
        else
            q[i] = r->shard_grad[i - lo];
    }
    phase(r, DL_TRAIN_PHASE_GATHER);
    t = now();
    rc = hook_failed(r,
                     in_place ? dl__train_peers_meet(&r->peers, c) : c->allgather(c->ctx, q, len));
    if (rc == 0 && in_place && other == NULL)
        rc = dl__train_peers_copy(&r->peers, q, len);
    r->wait_time += now() - t;
    if (rc < 0)
        return rc;
    float *freed = r->p_alt;
    r->p_alt = dl_train_mlp_swap_params(r->mlp, q);
    dl_train_mlp_swap_grads(r->mlp, freed);
    r->cur = nxt;
    *ret_vote = q[VOTE_AT(r)];
    *ret_loss = q[LOSS_AT(r)];
    return 0;
}

/* One optimizer step on the next batch; *ret_epoch_done when it used up the epoch, *ret_loss
 * the job-wide mean loss of the step (the same on every rank). */
static int train_step(run_t *r, bool stop_vote, bool *ret_epoch_done, double *ret_loss)
{
    const dl_train_config_t *cfg = r->cfg;
    const int world = r->comm->world_size;
    float *grads = dl_train_mlp_grads(r->mlp);
    float lr = (float)dl_train_lr_at(&r->sched, r->step), vote = 0.0f, job_loss = 0.0f;
    double t0 = now(), loss;
    const dl_train_hooks_t *h = r->hooks;

    r->wait_time = 0.0;
    phase(r, DL_TRAIN_PHASE_COMPUTE);
    size_t k = dl_train_sampler_next(&r->sampler, cfg->batch_size, r->idx);
    dl_train_dataset_gather(&r->train, r->idx, k, r->x, r->y);

    grads[VOTE_AT(r)] = stop_vote ? 1.0f : 0.0f;
    int rc =
        dl_train_mlp_train_step(r->mlp, r->x, r->y, k, 1.0f / (float)(k * (size_t)world),
                                r->overlap ? cfg->bucket_bytes : 0,
                                r->overlap ? dl__train_reducer_ready : NULL, &r->reducer, &loss);
    /* The spares sit in the last bucket, which starts only after backward: the loss is known. */
    grads[LOSS_AT(r)] = (float)(loss / world);
    if (rc == 0 && h != NULL && h->mid_step != NULL)
        h->mid_step(h->ud, r->step + 1);
    if (rc == 0)
        phase(r, DL_TRAIN_PHASE_EXCHANGE);
    if (rc == 0 && r->sharded && r->rec) {
        rc = sharded_update_kept(r, lr, &vote, &job_loss);
    } else if (rc == 0 && r->sharded) {
        rc = hook_failed(r, sharded_update(r, lr, &vote, &job_loss));
    } else if (rc == 0) {
        double tw = now();
        /* Overlapped buckets started during backward are hooks too: a failure there shows
         * here, where every one of them is waited for. */
        rc = hook_failed(r, dl__train_reducer_finish(&r->reducer));
        r->wait_time += now() - tw;
        if (rc == 0 && r->rec) {
            /* Kept whole (in-job recovery): the step goes to the other buffers. */
            int nxt = 1 - r->cur;
            dl_train_sgd_step_to(r->p_alt, r->mbuf[nxt], dl_train_mlp_params(r->mlp),
                                 r->mbuf[r->cur], grads, r->n_params, lr, (float)cfg->momentum,
                                 (float)cfg->weight_decay);
            r->p_alt = dl_train_mlp_swap_params(r->mlp, r->p_alt);
            r->mstep[nxt] = r->step + 1;
            r->cur = nxt;
            r->momentum = r->mbuf[nxt];
        } else if (rc == 0) {
            dl_train_sgd_step(dl_train_mlp_params(r->mlp), r->momentum, grads, r->n_params, lr,
                              (float)cfg->momentum, (float)cfg->weight_decay);
        }
        vote = grads[VOTE_AT(r)];
        job_loss = grads[LOSS_AT(r)];
    }
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen, "step %llu: summing gradients: %s",
                             (unsigned long long)r->step + 1, comm_error(r, rc));
    r->step++;

    size_t left = r->sampler.num_samples - r->sampler.pos;
    *ret_epoch_done = left == 0 || (cfg->drop_last && left < cfg->batch_size);

    double t1 = now(), dt = t1 - t0;
    r->train_time += dt;
    r->win_time += dt;
    r->win_compute += dt - r->wait_time;
    r->samples += (double)(k * (size_t)world);
    r->win_samples += (double)(k * (size_t)world);
    r->win_loss += job_loss;
    r->win_steps++;
    *ret_loss = job_loss;
    dl__train_beat_step(&r->beat, r->step, dt - r->wait_time, r->wait_time, job_loss, k, t1,
                        r->step == r->total_steps);
    /* The vote was summed with the gradients: any rank asking stops them all, here. */
    return vote > 0.0f ? 1 : 0;
}

/* JSON has no NaN or infinity: a number that is not finite (a diverged loss, an evaluation not
 * made) is written as null. */
static json_t *number(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static int write_summary(run_t *r, const dl_train_result_t *res, bool diverged)
{
    const dl_train_config_t *cfg = r->cfg;
    static const char *const acts[] = {"relu", "tanh", "gelu"};
    char shape[256], tmp[4096], crc[16];

    if (!is_root(r) || cfg->summary_file == NULL)
        return 0;
    snprintf(crc, sizeof(crc), "%08x", res->params_crc);
    shape_text(cfg, shape, sizeof(shape));
    json_auto_t *j = json_pack(
        "{s:s, s:s, s:i, s:I, s:I, s:o, s:I, s:I, s:I, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:s, "
        "s:s, s:b, s:b, s:b, s:b, s:i, s:I}",
        "model", shape, "activation", acts[cfg->activation], "world_size", r->comm->world_size,
        "batch_size", (json_int_t)cfg->batch_size, "global_batch",
        (json_int_t)(cfg->batch_size * (size_t)r->comm->world_size), "lr", number(res->lr), "steps",
        (json_int_t)res->steps, "epochs_done",
        (json_int_t)(res->steps / (r->steps_per_epoch ? r->steps_per_epoch : 1)), "resumed_from",
        (json_int_t)res->resumed_from, "stopped", res->stopped, "test_accuracy",
        number(res->test_accuracy), "test_loss", number(res->test_loss), "train_loss",
        number(res->train_loss), "train_seconds", number(res->train_seconds), "wall_seconds",
        number(res->wall_seconds), "samples_per_sec", number(res->samples_per_sec), "params_crc32",
        crc, "blas_kernels", openblas_get_corename(), "overlap", res->overlapped, "sharded_update",
        res->sharded, "peer_reads", res->peer_reads, "diverged", diverged, "rollbacks",
        (int)res->rollbacks, "warmup_steps", (json_int_t)r->sched.warmup_steps);
    if (j == NULL)
        return dl__train_err(-ENOMEM, r->err, r->errlen, "%s: cannot build the summary",
                             cfg->summary_file);
    /* Written beside and renamed, so a script polling for the file never reads half of it. */
    snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", cfg->summary_file, (long)getpid());
    errno = 0;
    if (json_dump_file(j, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) < 0) {
        int e = errno ? errno : EIO;
        (void)unlink(tmp);
        return dl__train_err(-e, r->err, r->errlen, "summary_file %s: cannot write: %s",
                             cfg->summary_file, strerror(e));
    }
    if (rename(tmp, cfg->summary_file) < 0) {
        int e = errno;
        (void)unlink(tmp);
        return dl__train_err(-e, r->err, r->errlen, "%s: %s", cfg->summary_file, strerror(e));
    }
    return 0;
}

/* Every rank comes here at the same step with the same loss. Either rolls back to the newest
 * checkpoint with half the learning rate (returns 0: train on) or says why the run ends
 * (returns DL_TRAIN_DIVERGED with the line in err, or -errno). */
static int diverged(run_t *r, double loss)
{
    const dl_train_config_t *cfg = r->cfg;
    double lr = dl_train_lr_at(&r->sched, r->step - 1);
    char what[256];

    if (isfinite(loss))
        snprintf(what, sizeof(what),
                 "loss %.4g; above %g x the healthy median %.4g in %llu of the last %llu steps",
                 loss, cfg->divergence_factor, r->watch.median,
                 (unsigned long long)r->watch.high_in_window, (unsigned long long)r->watch.window);
    else
        snprintf(what, sizeof(what), "the loss became %s", isnan(loss) ? "NaN" : "infinite");
    if (cfg->on_divergence == DL_TRAIN_ON_DIVERGENCE_ROLLBACK && cfg->checkpoint_dir != NULL &&
        r->rollbacks < MAX_ROLLBACKS) {
        say(r,
            "diverged at step %llu (%s, learning rate %.4g): rolling back to the newest "
            "checkpoint with the peak learning rate halved to %.4g (rollback %u of %d)",
            (unsigned long long)r->step, what, lr, r->sched.lr * 0.5, r->rollbacks + 1,
            MAX_ROLLBACKS);
        /* Rank 0 reads the checkpoint into its parameters, whose block the others may still be
         * copying (peer_reads with more than two ranks): not before every rank is past it. */
        int rc = dl__train_peers_on(&r->peers)
                     ? hook_failed(r, dl__train_peers_meet(&r->peers, r->comm))
                     : 0;
        if (rc == 0)
            rc = restore(r, true);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            r->rollbacks++;
            r->sched.lr *= 0.5;
            r->sched.lr_min *= 0.5;
            /* The history stays: the losses of the healthy run are the yardstick, not those of
             * the first steps after going back. */
            dl_train_divergence_forgive(&r->watch);
            return 0;
        }
    }
    const char *why = cfg->on_divergence != DL_TRAIN_ON_DIVERGENCE_ROLLBACK ? ""
                      : cfg->checkpoint_dir == NULL   ? " (no checkpoint_dir to roll back to)"
                      : r->rollbacks >= MAX_ROLLBACKS ? " (rolled back too often already)"
                                                      : " (no checkpoint to roll back to yet)";
    return dl__train_err(DL_TRAIN_DIVERGED, r->err, r->errlen,
                         "training diverged at step %llu: %s, learning rate %.4g%s; try a lower "
                         "lr, more warmup_steps, lr_scaling: sqrt, or on_divergence: rollback",
                         (unsigned long long)r->step, what, lr, why);
}

/* ---- In-job recovery: the group forms again and the state goes where it is missing ---------- */

static void rescued_free(run_t *r)
{
    for (size_t i = 0; i < r->nrescued; i++)
        free(r->rescued[i].buf);
    free(r->rescued);
    r->rescued = NULL;
    r->nrescued = 0;
}

/* Keeps a copy of block `block`'s two buffers (hdr: the steps they hold, read before the copy
 * and checked after: a living rank may be writing its next step into one). */
static int rescue_one(run_t *r, int block, const uint64_t *hdr, const float *bufs)
{
    size_t len = r->shard_len;
    struct rescued_s *x = &r->rescued[r->nrescued];
    x->block = block;
    x->buf = malloc(2 * len * sizeof(float));
    if (x->buf == NULL)
        return -ENOMEM;
    for (int b = 0; b < 2; b++)
        x->mstep[b] = __atomic_load_n(&hdr[b], __ATOMIC_ACQUIRE);
    memcpy(x->buf, bufs, 2 * len * sizeof(float));
    for (int b = 0; b < 2; b++)
        if (__atomic_load_n(&hdr[b], __ATOMIC_ACQUIRE) != x->mstep[b])
            x->mstep[b] = REC_NONE;
    r->nrescued++;
    return 0;
}

/* Sharded: every block of the momentum this rank can give, before leaving the broken group
 * unmaps the host's shared memory: its own, its buddy's (across hosts), and those of the other
 * ranks on its host, dead ones included (their memory outlives them). */
static int rec_rescue(run_t *r)
{
    const dl_train_comm_t *c = r->comm;
    size_t len = r->shard_len, need = (REC_HDR_FLOATS + 2 * len) * sizeof(float);

    rescued_free(r);
    r->old_rank = r->state_valid ? c->rank : -1;
    r->old_len = len;
    if (!r->sharded || !r->state_valid || r->mshared == NULL)
        return 0;
    r->rescued = calloc((size_t)r->world + 1, sizeof(*r->rescued));
    if (r->rescued == NULL)
        return -ENOMEM;
    if (r->buddy >= 0 && rescue_one(r, r->buddy, r->rmstep, r->rmbuf) < 0)
        return -ENOMEM;
    for (int q = 0; q < r->world; q++) {
        const void *ptr = NULL;
        size_t plen = 0;
        if (q == c->rank) {
            ptr = r->mshared;
            plen = need;
        } else if (c->mem_peer == NULL || c->mem_peer(c->ctx, r->mshared, q, &ptr, &plen) < 0) {
            continue;
        }
        if (plen < need)
            continue;
        if (rescue_one(r, q, ptr, (const float *)ptr + REC_HDR_FLOATS) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* The rescued buffer of old block b that holds `step`, or NULL. */
static const float *rescued_block(const run_t *r, int b, uint64_t step)
{
    for (size_t i = 0; i < r->nrescued; i++) {
        const struct rescued_s *x = &r->rescued[i];
        if (x->block != b)
            continue;
        for (int k = 0; k < 2; k++)
            if (x->mstep[k] == step)
                return x->buf + (size_t)k * r->old_len;
    }
    return NULL;
}

/* What the ranks of a new group say of themselves. */
typedef struct {
    int64_t step;      /* the last step complete here; -1: no state (a replacement) */
    int64_t old_rank;  /* this rank's place in the layout its state was kept in */
    int64_t old_world; /* that layout's world */
    int64_t old_len;   /* its block length (sharded) */
    int64_t overlap;   /* its gradients summed alongside backward (agree_on_overlap) */
} rec_info_t;

/* What the source of the state sends besides parameters and momentum. */
typedef struct {
    uint64_t step, epoch, consumed;
    uint64_t rng[4];
    double lr, lr_min;
    uint64_t rollbacks;
} rec_sync_t;

static int rec_fail(run_t *r, int rc, const char *what)
{
    hook_failed(r, rc);
    return dl__train_err(rc, r->err, r->errlen, "in-job recovery: %s: %s", what, comm_error(r, rc));
}

/* A rank that joins a job (a replacement, or every rank of a restarted round of a multi-node
 * job) takes the job's overlap: the sharded step goes with it, the buckets are planned anew and
 * the layout made again. */
static int rec_follow_overlap(run_t *r, bool on, const char *whose)
{
    const dl_train_comm_t *c = r->comm;
    if (on == r->overlap)
        return 0;
    int rc = overlap_conflict(r, on, whose);
    if (rc < 0)
        return rc;
    r->overlap = on;
    r->sharded = shards(r);
    dl__train_reducer_free(&r->reducer);
    rc = dl__train_reducer_init(&r->reducer, c, dl_train_mlp_grads(r->mlp),
                                r->n_params + DL_TRAIN_SPARE_FLOATS, r->cfg->bucket_bytes, on);
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen, "in-job recovery: buckets: %s", strerror(-rc));
    return layout(r);
}

/* Every rank of the new group, replacements included, comes here in the same order: they agree
 * on the step to go on from (the last one every living rank completed: a rank one step ahead
 * steps back, having kept that step whole), then the state goes from the living ranks to all:
 * parameters, momentum (each block of the layout it was kept in from a rank that holds it, and
 * cut again for this group's layout), sampler position, RNG, step and loss watch. The group may
 * have another size than the one the state was kept in (a node lost, or one come back): the
 * sampler continues at the same sample position, the shards are cut for the new world.
 * Returns 0; 1 when no rank of the group holds any state (all are new: the job starts as it
 * would, from a checkpoint or from scratch); or -errno with the line in err: the run cannot go
 * on in-job (the launcher then restarts it from the last checkpoint). */
static int rec_sync(run_t *r)
{
    const dl_train_comm_t *c = r->comm;
    int world = c->world_size, me = c->rank, rc;
    double t0 = r->failed_at > 0 ? r->failed_at : now();
    float *full = NULL;
    uint8_t *can = NULL;
    int *provider = NULL;

    /* Who holds which step. */
    rec_info_t *all = calloc((size_t)world, sizeof(*all));
    if (all == NULL)
        return dl__train_err(-ENOMEM, r->err, r->errlen, "in-job recovery: out of memory");
    all[me] = (rec_info_t){r->state_valid ? (int64_t)r->step : -1, r->old_rank, r->world,
                           (int64_t)r->old_len, r->overlap};
    rc = c->allgather_bytes(c->ctx, all, sizeof(*all));
    if (rc < 0) {
        rc = rec_fail(r, rc, "telling the ranks apart");
        goto out;
    }
    int64_t target = -1;
    int src = -1, njoin = 0;
    for (int q = 0; q < world; q++) {
        if (all[q].step < 0) {
            njoin++;
            continue;
        }
        if (target < 0 || all[q].step < target)
            target = all[q].step;
        if (src < 0)
            src = q;
    }
    if (src < 0) {
        /* Everyone is new: the job starts, from its checkpoint or from scratch (restore), with
         * rank 0's overlap (nobody ran agree_on_overlap). */
        rc = rec_follow_overlap(r, all[0].overlap != 0, "rank 0");
        if (rc == 0 && r->sharded)
            rc = rec_shared_alloc(r);
        if (rc == 0)
            rc = peers_attach(r);
        if (rc == 0)
            rc = 1;
        goto out;
    }
    int old_world = (int)all[src].old_world;
    size_t old_len = (size_t)all[src].old_len;
    for (int q = 0; q < world; q++) {
        if (all[q].step < 0)
            continue;
        if (all[q].step > target + 1 || all[q].old_world != old_world ||
            (size_t)all[q].old_len != old_len) {
            rc = dl__train_err(-EPROTO, r->err, r->errlen,
                               "in-job recovery: the living ranks disagree: rank %d is at step "
                               "%lld of a world of %lld, rank %d at %lld of %d",
                               q, (long long)all[q].step, (long long)all[q].old_world, src,
                               (long long)target, old_world);
            goto out;
        }
    }
    /* A replacement sums the gradients as the running job does, whatever its own host would
     * have chosen: the collectives below and every step's depend on it. */
    if (all[me].step < 0) {
        rc = rec_follow_overlap(r, all[src].overlap != 0, "the running job");
        if (rc < 0)
            goto out;
    }
    uint64_t step = (uint64_t)target;
    /* One step ahead: that step was complete here but not everywhere; the one before is kept. */
    if (r->state_valid && r->step == step + 1)
        rec_step_back(r);
    else if (r->state_valid)
        rec_snap_restore(r);
    if (r->state_valid && r->step != step) {
        rc = dl__train_err(-EPROTO, r->err, r->errlen,
                           "in-job recovery: this rank cannot go back to step %llu",
                           (unsigned long long)step);
        goto out;
    }

    /* Sharded: which rank gives each block of the old layout. */
    provider = calloc((size_t)(old_world > 0 ? old_world : 1), sizeof(int));
    if (provider == NULL) {
        rc = dl__train_err(-ENOMEM, r->err, r->errlen, "in-job recovery: out of memory");
        goto out;
    }
    if (r->sharded) {
        size_t row = ((size_t)old_world + 3) & ~(size_t)3;
        can = calloc((size_t)world, row);
        if (can == NULL) {
            rc = dl__train_err(-ENOMEM, r->err, r->errlen, "in-job recovery: out of memory");
            goto out;
        }
        for (int b = 0; b < old_world && r->state_valid; b++)
            can[(size_t)me * row + (size_t)b] = rescued_block(r, b, step) != NULL;
        rc = c->allgather_bytes(c->ctx, can, row);
        if (rc < 0) {
            rc = rec_fail(r, rc, "finding the replicas of the optimizer state");
            goto out;
        }
        for (int b = 0; b < old_world; b++) {
            provider[b] = -1;
            /* Its own rank first, so that the common case moves the fewest bytes around. */
            for (int q = 0; q < world && provider[b] < 0; q++)
                if (all[q].old_rank == b && can[(size_t)q * row + (size_t)b])
                    provider[b] = q;
            for (int q = 0; q < world && provider[b] < 0; q++)
                if (can[(size_t)q * row + (size_t)b])
                    provider[b] = q;
            if (provider[b] < 0) {
                rc = dl__train_err(-ENODATA, r->err, r->errlen,
                                   "in-job recovery: no living rank holds block %d of %d of the "
                                   "optimizer state at step %llu (its rank and every replica "
                                   "of it are gone)",
                                   b, old_world, (unsigned long long)step);
                goto out;
            }
        }
    }

    /* The state, from the source (every living rank holds the same at this step). */
    rec_sync_t st = {0};
    if (me == src) {
        st.step = step;
        dl_train_sampler_tell(&r->sampler, &st.epoch, &st.consumed);
        memcpy(st.rng, r->rng.s, sizeof(st.rng));
        st.lr = r->sched.lr;
        st.lr_min = r->sched.lr_min;
        st.rollbacks = r->rollbacks;
    }
    rc = c->broadcast(c->ctx, &st, sizeof(st), src);
    if (rc == 0)
        rc = c->broadcast(c->ctx, &r->watch, sizeof(r->watch), src);
    if (rc == 0)
        rc = c->broadcast(c->ctx, dl_train_mlp_params(r->mlp), r->n_params * sizeof(float), src);
    /* The whole momentum on every rank: the blocks of the old layout from their holders (or,
     * not sharded, all of it from the source), to be cut for this group's. */
    size_t nfull = r->sharded ? (size_t)old_world * old_len : r->n_params;
    if (nfull < r->n_params)
        nfull = r->n_params;
    full = calloc(nfull, sizeof(float));
    if (full == NULL) {
        rc = dl__train_err(-ENOMEM, r->err, r->errlen, "in-job recovery: out of memory");
        goto out;
    }
    if (rc == 0 && !r->sharded) {
        if (me == src)
            memcpy(full, r->mbuf[r->cur], r->n_params * sizeof(float));
        rc = c->broadcast(c->ctx, full, r->n_params * sizeof(float), src);
    }
    for (int b = 0; rc == 0 && r->sharded && b < old_world; b++) {
        float *dst = full + (size_t)b * old_len;
        if (me == provider[b])
            memcpy(dst, rescued_block(r, b, step), old_len * sizeof(float));
        rc = c->broadcast(c->ctx, dst, old_len * sizeof(float), provider[b]);
    }
    if (rc < 0) {
        rc = rec_fail(r, rc, "sharing the state");
        goto out;
    }

    /* This group's layout (its world, this rank's place), and the state put in. */
    r->rollbacks = (unsigned)st.rollbacks;
    rc = layout(r);
    if (rc < 0)
        goto out;
    if (r->sharded) {
        rc = rec_shared_alloc(r);
        if (rc == 0)
            rc = peers_attach(r);
        if (rc < 0)
            goto out;
    }
    for (size_t i = r->n_params; i < nfull; i++)
        full[i] = 0.0f; /* the spares and padding have no momentum */
    memcpy(r->momentum, full, r->n_params * sizeof(float));
    r->step = st.step;
    dl_train_sampler_seek(&r->sampler, st.epoch, st.consumed);
    memcpy(r->rng.s, st.rng, sizeof(st.rng));
    if (world == old_world) {
        r->sched.lr = st.lr;
        r->sched.lr_min = st.lr_min;
    }
    /* Puts the momentum where the update reads it (and the buddy's block), both snapshots at
     * this step. */
    rec_reset(r);
    r->recoveries++;
    double ms = (now() - t0) * 1e3;
    char who[256];
    size_t off = 0;
    who[0] = '\0';
    for (int q = 0; q < world && off < sizeof(who); q++)
        if (all[q].step < 0)
            off += (size_t)snprintf(who + off, sizeof(who) - off, "%s%d", off ? "," : "", q);
    if (world != old_world)
        say(r,
            "in-job recovery: the world went from %d to %d ranks%s%s; going on at step %llu "
            "with the state of the living ranks (parameters, optimizer state, sampler position, "
            "RNG, step; no checkpoint read), %zu samples a step, in %.0f ms",
            old_world, world, njoin > 0 ? ", new: " : "", who, (unsigned long long)step,
            r->cfg->batch_size * (size_t)world, ms);
    else if (njoin > 0)
        say(r,
            "in-job recovery: rank%s %s joined at step %llu with the state of rank %d "
            "(parameters, optimizer state, sampler position, RNG, step; no checkpoint read) "
            "in %.0f ms",
            njoin > 1 ? "s" : "", who, (unsigned long long)step, src, ms);
    else
        say(r, "in-job recovery: the group formed again at step %llu in %.0f ms",
            (unsigned long long)step, ms);
    if (c->recovered != NULL)
        c->recovered(c->ctx, step, src, ms, all[me].step);
    r->failed_at = 0;
    rc = 0;
out:
    free(all);
    free(can);
    free(provider);
    free(full);
    rescued_free(r);
    return rc;
}

/* A hook failed: leave the broken group, form the next one and go on. */
static int recover(run_t *r)
{
    const dl_train_comm_t *c = r->comm;
    char why[DL_TRAIN_ERRLEN];

    snprintf(why, sizeof(why), "%s", r->err);
    /* The first of a series; cleared when a recovery succeeds. */
    if (r->rec_cause[0] == '\0')
        snprintf(r->rec_cause, sizeof(r->rec_cause), "%s", why);
    say(r, "%s; recovering in-job", why);
    int rc = rec_rescue(r);
    if (rc < 0) {
        r->comm_failed = false; /* as below: no recovering from this one */
        return dl__train_err(rc, r->err, r->errlen, "in-job recovery: out of memory");
    }
    peers_detach(r);
    if (r->sharded && r->mshared != r->mpriv) {
        /* Unmapped with the old group. */
        r->mshared = NULL;
        r->mstep = r->mstep_priv;
        r->mbuf[0] = r->mbuf[1] = NULL;
    }
    rc = c->rejoin(c->ctx);
    if (rc < 0) {
        /* The launcher said no, or the next group could not form: nothing left to recover
         * with, so no caller may take this for another hook failure and ask again (the start's
         * loop did, as fast as the launcher answered, until the job was killed). */
        r->comm_failed = false;
        return dl__train_err(rc, r->err, r->errlen, "in-job recovery: %s (after: %s)",
                             comm_error(r, rc), r->rec_cause);
    }
    r->comm_failed = false;
    rc = rec_sync(r);
    /* Every rank of the new group is new: nobody kept a state to go on from. */
    if (rc == 1)
        rc = dl__train_err(-ENODATA, r->err, r->errlen,
                           "in-job recovery: no rank of the group holds the training state");
    /* Rank 0 of the new group and not before (the old one was lost with its node, the
     * rendezvous's host say): it takes on rank 0's part, the outputs it writes and the test set
     * it evaluates on. */
    if (rc == 0 && is_root(r) && r->test.n == 0) {
        rc = check_outputs(r);
        if (rc == 0)
            rc = load_test(r);
    }
    if (rc == 0)
        r->rec_cause[0] = '\0';
    return rc;
}

static int loop(run_t *r, bool *ret_stopped)
{
    const dl_train_config_t *cfg = r->cfg;
    const dl_train_hooks_t *h = r->hooks;
    bool ckpt_due = false;
    int rc;

    while (r->step < r->total_steps) {
        bool vote = h != NULL && h->should_stop != NULL && h->should_stop(h->ud, r->step);
        bool epoch_done = false;
        size_t left = r->sampler.num_samples - r->sampler.pos;

        /* A resume into another world size can land at the very end of an epoch. */
        if (left == 0 || (cfg->drop_last && left < cfg->batch_size))
            dl_train_sampler_set_epoch(&r->sampler, r->sampler.epoch + 1);
        uint64_t epoch = r->sampler.epoch;

        double loss = 0.0;
        rc = train_step(r, vote, &epoch_done, &loss);
        if (rc < 0)
            return rc;
        bool stop = rc == 1;
        dl_train_loss_verdict_t verdict = dl_train_divergence_feed(&r->watch, loss);
        if (verdict == DL_TRAIN_LOSS_DIVERGED) {
            rc = diverged(r, loss);
            if (rc != 0)
                return rc;
            continue;
        }
        bool last = r->step == r->total_steps;
        if (epoch_done)
            dl_train_sampler_set_epoch(&r->sampler, epoch + 1);
        rec_commit(r);

        if (r->step % r->log_every == 0 || last || stop)
            progress(r, epoch);
        if (is_root(r) && !last && !stop &&
            (cfg->eval_every > 0 ? r->step % cfg->eval_every == 0 : epoch_done)) {
            double test_loss, acc;
            evaluate(r, &test_loss, &acc);
            say(r, "%s %llu: test accuracy %.2f%%, test loss %.4f", epoch_done ? "epoch" : "step",
                (unsigned long long)(epoch_done ? epoch + 1 : r->step), acc * 100.0, test_loss);
        }
        /* A checkpoint of a run whose loss is high may already be past saving: the next due
         * step with a healthy loss writes it, so a rollback lands before the trouble. */
        if (verdict == DL_TRAIN_LOSS_HIGH)
            ckpt_due = ckpt_due || (cfg->checkpoint_every > 0 ? r->step % cfg->checkpoint_every == 0
                                                              : epoch_done);
        else if (!last && !stop &&
                 (ckpt_due || (cfg->checkpoint_every > 0 ? r->step % cfg->checkpoint_every == 0
                                                         : epoch_done))) {
            ckpt_due = false;
            rc = checkpoint(r);
            if (rc < 0)
                return rc;
        }
        if (stop) {
            *ret_stopped = true;
            say(r, "stop requested: stopping after step %llu", (unsigned long long)r->step);
            break;
        }
    }
    return 0;
}

static void run_free(run_t *r)
{
    peers_detach(r);
    rescued_free(r);
    free(r->p_alt);
    free(r->mpriv);
    free(r->xfer);
    free(r->rmbuf);
    dl_train_dataset_free(&r->train);
    dl_train_dataset_free(&r->test);
    dl_train_sampler_free(&r->sampler);
    dl_train_mlp_free(r->mlp);
    dl__train_reducer_free(&r->reducer);
    free(r->momentum_own);
    free(r->shard_grad);
    free(r->figs);
    free(r->x);
    free(r->y);
    free(r->idx);
}

int dl_train_run(const dl_train_config_t *cfg, const dl_train_comm_t *comm,
                 const dl_train_hooks_t *hooks, dl_train_result_t *ret_result, char *err,
                 size_t errlen)
{
    dl_train_result_t res = {.test_loss = NAN, .test_accuracy = NAN};
    run_t r = {.cfg = cfg, .comm = comm, .hooks = hooks, .err = err, .errlen = errlen};
    bool stopped = false;
    char shape[256];
    int rc;

    dl__train_beat_init(&r.beat, hooks != NULL ? hooks->health_fd : -1);
    r.t_begin = now();
    rc = dl_train_config_check(cfg, err, errlen);
    if (rc < 0)
        return rc;
    if (comm->world_size < 1 || comm->rank < 0 || comm->rank >= comm->world_size ||
        (comm->world_size > 1 && comm->broadcast == NULL))
        return dl__train_err(-EINVAL, err, errlen,
                             "comm: rank %d of %d, or no broadcast hook for a world above one",
                             comm->rank, comm->world_size);
    if (cfg->blas_threads > 0)
        openblas_set_num_threads(cfg->blas_threads);

    rc = check_outputs(&r);
    if (rc == 0)
        rc = load_data(&r);
    if (rc == 0)
        rc = setup(&r);
    /* A replacement in a running job takes the living ranks' state, never a checkpoint's. */
    bool joined = false;
    if (rc == 0 && comm->joining && r.rec) {
        rc = rec_sync(&r);
        joined = rc == 0;
        /* Nobody holds a state: the job starts afresh (or from its checkpoint) together. */
        if (rc == 1)
            rc = restore(&r, cfg->resume);
    } else if (rc == 0) {
        rc = restore(&r, cfg->resume);
    }
    /* A failure while the ranks share the start state: the living ones may still recover. */
    while (rc < 0 && r.rec && r.comm_failed)
        rc = recover(&r);
    if (rc < 0)
        goto fail;

    shape_text(cfg, shape, sizeof(shape));
    char lr_text[32];
    if (joined)
        goto train;
    say(&r,
        "world size %d, batch %zu per device, %zu global; learning rate %s (%s, base batch "
        "%zu), %s schedule, %llu warmup steps",
        comm->world_size, cfg->batch_size, cfg->batch_size * (size_t)comm->world_size,
        dl_opt_num_text(r.sched.lr, lr_text, sizeof(lr_text)),
        cfg->lr_scaling == DL_TRAIN_SCALE_LINEAR ? "scaled linearly"
        : cfg->lr_scaling == DL_TRAIN_SCALE_SQRT ? "scaled by the square root"
                                                 : "not scaled",
        cfg->base_batch,
        cfg->schedule == DL_TRAIN_SCHED_COSINE ? "cosine"
        : cfg->schedule == DL_TRAIN_SCHED_STEP ? "step"
                                               : "constant",
        (unsigned long long)r.sched.warmup_steps);
    say(&r, "model %s (%zu parameters), %zu training samples, %llu steps an epoch, %llu steps",
        shape, r.n_params, r.train.n, (unsigned long long)r.steps_per_epoch,
        (unsigned long long)r.total_steps);
    /* Which kernels OpenBLAS picked decides the speed (OPENBLAS_CORETYPE can force others). */
    say(&r, "OpenBLAS %s kernels, %d thread%s a worker", openblas_get_corename(),
        openblas_get_num_threads(), openblas_get_num_threads() == 1 ? "" : "s");
    if (comm->world_size > 1 && r.overlap)
        say(&r, "gradients: %zu buckets of up to %zu KiB, summed during backward (overlap on)",
            r.reducer.count, cfg->bucket_bytes / 1024);
    else if (comm->world_size > 1 && r.sharded)
        say(&r,
            "gradients: summed in one piece of %zu KiB after backward (overlap off), each rank "
            "updating 1/%d of the parameters%s",
            (r.n_params + DL_TRAIN_SPARE_FLOATS) * sizeof(float) / 1024, comm->world_size,
            dl__train_peers_on(&r.peers) ? "; the other ranks' blocks read where they lie" : "");
    else if (comm->world_size > 1)
        say(&r, "gradients: summed in one piece of %zu KiB after backward (overlap off)",
            (r.n_params + DL_TRAIN_SPARE_FLOATS) * sizeof(float) / 1024);

train:
    rc = loop(&r, &stopped);
    /* In-job recovery: the group forms again and the loop goes on from the step every living
     * rank completed. */
    if (rc < 0 && r.rec && r.comm_failed) {
        rc = recover(&r);
        if (rc == 0)
            goto train;
    }
    if (rc < 0)
        goto fail;
    bool diverged = rc == DL_TRAIN_DIVERGED;

    res.steps = r.step;
    res.resumed_from = r.resumed_from;
    res.stopped = stopped;
    res.train_loss = r.last_loss;
    res.lr = r.sched.lr;
    res.overlapped = r.overlap;
    res.sharded = r.sharded;
    res.peer_reads = dl__train_peers_on(&r.peers);
    res.train_seconds = r.train_time;
    res.samples_per_sec = r.train_time > 0 ? r.samples / r.train_time : 0.0;
    res.params_crc = params_crc(&r);
    res.rollbacks = r.rollbacks;
    res.recoveries = r.recoveries;
    if (diverged) {
        /* The diverged state is worth no checkpoint: the last good one stays the newest. */
        res.wall_seconds = now() - r.t_begin;
        (void)write_summary(&r, &res, true);
        run_free(&r);
        if (ret_result != NULL)
            *ret_result = res;
        return DL_TRAIN_DIVERGED;
    }
    if (is_root(&r)) {
        evaluate(&r, &res.test_loss, &res.test_accuracy);
        say(&r, "%s after %llu steps: test accuracy %.2f%%, test loss %.4f, %.0f samples/s",
            stopped ? "stopped" : "done", (unsigned long long)r.step, res.test_accuracy * 100.0,
            res.test_loss, res.samples_per_sec);
    }
    rc = checkpoint(&r);
    if (rc < 0 && r.rec && r.comm_failed) {
        rc = recover(&r);
        if (rc == 0)
            goto train;
    }
    if (rc < 0)
        goto fail;
    if (cfg->checkpoint_dir == NULL)
        report_crc(&r, NULL);
    res.wall_seconds = now() - r.t_begin;
    rc = write_summary(&r, &res, false);
    if (rc < 0)
        goto fail;
    run_free(&r);
    if (ret_result != NULL)
        *ret_result = res;
    return stopped ? 1 : 0;

fail:
    run_free(&r);
    return rc;
}
