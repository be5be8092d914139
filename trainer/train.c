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
    double wait_time; /* this step's time inside collective calls */
    double win_compute; /* the progress window's time outside them */
    float *figs;        /* world x 2: each rank's compute and step ms, for the progress line */
    bool overlap; /* gradient buckets summed during backward */
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
} run_t;

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

static int load_data(run_t *r)
{
    const dl_train_config_t *cfg = r->cfg;
    const char *dir = cfg->dataset_dir != NULL ? cfg->dataset_dir : DL_TRAIN_DEFAULT_DATASET;
    int rc = dl_train_dataset_load(&r->train, dir, "train", r->err, r->errlen);

    if (rc < 0)
        return rc;
    if (is_root(r)) {
        rc = dl_train_dataset_load(&r->test, dir, "t10k", r->err, r->errlen);
        if (rc < 0)
            return rc;
    }
    const dl_train_dataset_t *sets[2] = {&r->train, &r->test};
    for (int i = 0; i < 2; i++) {
        const dl_train_dataset_t *d = sets[i];
        if (d->n == 0)
            continue;
        if (d->dim != cfg->sizes[0])
            return dl__train_err(-EINVAL, r->err, r->errlen,
                                 "%s: %s images are %zux%zu = %zu values, layers start at %zu", dir,
                                 i == 0 ? "train" : "t10k", d->rows, d->cols, d->dim,
                                 cfg->sizes[0]);
        if (d->n_classes > cfg->sizes[cfg->n_layers])
            return dl__train_err(
                -EINVAL, r->err, r->errlen, "%s: %s labels go up to %zu, layers end at %zu classes",
                dir, i == 0 ? "train" : "t10k", d->n_classes - 1, cfg->sizes[cfg->n_layers]);
    }
    return 0;
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
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) < 0 && errno != EEXIST ? -1 : 0;
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

static int setup(run_t *r)
{
    const dl_train_config_t *cfg = r->cfg;
    const int world = r->comm->world_size;
    size_t cap = cfg->batch_size > EVAL_CHUNK ? cfg->batch_size : EVAL_CHUNK;
    int rc;

    rc = dl_train_sampler_init(&r->sampler, r->train.n, r->comm->rank, world, cfg->seed,
                               cfg->drop_last);
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

    dl__train_rng_seed(&r->rng, cfg->seed);
    rc = dl_train_mlp_new(cfg->sizes, cfg->n_layers, cfg->activation, cap,
                          dl__train_rng_next(&r->rng), &r->mlp);
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen, "model: %s", strerror(-rc));
    r->n_params = dl_train_mlp_num_params(r->mlp);

    r->overlap = world > 1 && (cfg->overlap == DL_TRAIN_OVERLAP_ON ||
                               (cfg->overlap == DL_TRAIN_OVERLAP_AUTO && r->comm->overlap_pays));
    r->sharded = world > 1 && !r->overlap && r->comm->reduce_scatter != NULL &&
                 r->comm->allgather != NULL;
    size_t padded = r->n_params + DL_TRAIN_SPARE_FLOATS;
    if (r->sharded) {
        /* Whole cache lines a shard: a block starting mid-line makes every 64-byte load of the
         * update and of the collective's copies straddle two lines (rank 1's update took 29 us
         * against rank 0's 20, and rank 0 waited for it). */
        r->shard_len = (r->n_params + DL_TRAIN_SPARE_FLOATS + (size_t)world - 1) / (size_t)world;
        r->shard_len = (r->shard_len + 15) & ~(size_t)15;
        r->shard_lo = r->shard_len * (size_t)r->comm->rank;
        padded = r->shard_len * (size_t)world;
        rc = dl_train_mlp_pad(r->mlp, padded);
        r->shard_grad = aligned_alloc(64, r->shard_len * sizeof(float));
        if (rc < 0 || r->shard_grad == NULL)
            return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for the shards");
    }

    /* Padded too: checkpoints gather the momentum's shards into it. */
    padded = (padded + 15) & ~(size_t)15;
    r->momentum = aligned_alloc(64, padded * sizeof(float));
    if (r->momentum != NULL)
        memset(r->momentum, 0, padded * sizeof(float));
    r->figs = world > 1 ? calloc(3 * (size_t)world, sizeof(float)) : NULL;
    r->x = malloc(cap * cfg->sizes[0] * sizeof(float));
    r->y = malloc(cap);
    r->idx = malloc(cap * sizeof(uint32_t));
    if (r->momentum == NULL || r->x == NULL || r->y == NULL || r->idx == NULL)
        return dl__train_err(-ENOMEM, r->err, r->errlen, "out of memory for the batch buffers");
    rc = dl__train_reducer_init(&r->reducer, r->comm, dl_train_mlp_grads(r->mlp),
                                r->n_params + DL_TRAIN_SPARE_FLOATS, cfg->bucket_bytes,
                                r->overlap);
    if (rc < 0)
        return dl__train_err(rc, r->err, r->errlen, "buckets: %s", strerror(-rc));

    dl_train_scaled_lr(cfg, world, r->total_steps, &r->sched.lr, &r->sched.warmup_steps);
    r->sched.kind = cfg->schedule;
    r->sched.lr_min = cfg->lr_min;
    r->sched.gamma = cfg->lr_gamma;
    r->sched.step_size = cfg->lr_step_epochs * r->steps_per_epoch;
    r->sched.total_steps = r->total_steps;
    dl_train_divergence_init(&r->watch, cfg->divergence_factor, cfg->divergence_window);
    return 0;
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
                fresh_start ? cfg->checkpoint_dir : "",
                fresh_start ? " or set resume: false" : "");
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
        rc = c->allgather(c->ctx, r->momentum, r->shard_len);
        if (rc < 0)
            return dl__train_err(rc, r->err, r->errlen,
                                 "step %llu: gathering the momentum for a checkpoint: %s",
                                 (unsigned long long)r->step, comm_error(r, rc));
    }
    if (is_root(r)) {
        fill_ckpt(r, &ck);
        rc = dl_train_ckpt_save(r->cfg->checkpoint_dir, &ck, path, sizeof(path), r->err,
                                r->errlen);
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
        return; /* the next step's sum fails too, and says why */
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
    dl_train_sgd_step(p + lo, r->momentum + lo, r->shard_grad, mine, lr, (float)r->cfg->momentum,
                      (float)r->cfg->weight_decay);
    for (size_t i = n; i < n + DL_TRAIN_SPARE_FLOATS; i++)
        if (i >= lo && i < lo + len)
            p[i] = r->shard_grad[i - lo];
    t = now();
    rc = c->allgather(c->ctx, p, len);
    r->wait_time += now() - t;
    *ret_vote = p[VOTE_AT(r)];
    *ret_loss = p[LOSS_AT(r)];
    return rc;
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
    size_t k = dl_train_sampler_next(&r->sampler, cfg->batch_size, r->idx);
    dl_train_dataset_gather(&r->train, r->idx, k, r->x, r->y);

    grads[VOTE_AT(r)] = stop_vote ? 1.0f : 0.0f;
    int rc = dl_train_mlp_train_step(r->mlp, r->x, r->y, k, 1.0f / (float)(k * (size_t)world),
                                     r->overlap ? cfg->bucket_bytes : 0,
                                     r->overlap ? dl__train_reducer_ready : NULL, &r->reducer,
                                     &loss);
    /* The spares sit in the last bucket, which starts only after backward: the loss is known. */
    grads[LOSS_AT(r)] = (float)(loss / world);
    if (rc == 0 && h != NULL && h->mid_step != NULL)
        h->mid_step(h->ud, r->step + 1);
    if (rc == 0 && r->sharded) {
        rc = sharded_update(r, lr, &vote, &job_loss);
    } else if (rc == 0) {
        double tw = now();
        rc = dl__train_reducer_finish(&r->reducer);
        r->wait_time += now() - tw;
        if (rc == 0)
            dl_train_sgd_step(dl_train_mlp_params(r->mlp), r->momentum, grads, r->n_params, lr,
                              (float)cfg->momentum, (float)cfg->weight_decay);
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
        "s:s, s:b, s:b, s:b, s:i, s:I}",
        "model", shape, "activation", acts[cfg->activation], "world_size", r->comm->world_size,
        "batch_size", (json_int_t)cfg->batch_size, "global_batch",
        (json_int_t)(cfg->batch_size * (size_t)r->comm->world_size), "lr", number(res->lr),
        "steps", (json_int_t)res->steps, "epochs_done",
        (json_int_t)(res->steps / (r->steps_per_epoch ? r->steps_per_epoch : 1)), "resumed_from",
        (json_int_t)res->resumed_from, "stopped", res->stopped, "test_accuracy",
        number(res->test_accuracy), "test_loss", number(res->test_loss), "train_loss",
        number(res->train_loss), "train_seconds", number(res->train_seconds), "wall_seconds",
        number(res->wall_seconds), "samples_per_sec", number(res->samples_per_sec),
        "params_crc32", crc, "blas_kernels", openblas_get_corename(), "overlap", res->overlapped,
        "sharded_update", res->sharded, "diverged", diverged, "rollbacks", (int)res->rollbacks,
        "warmup_steps", (json_int_t)r->sched.warmup_steps);
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
                 (unsigned long long)r->watch.high_in_window,
                 (unsigned long long)r->watch.window);
    else
        snprintf(what, sizeof(what), "the loss became %s", isnan(loss) ? "NaN" : "infinite");
    if (cfg->on_divergence == DL_TRAIN_ON_DIVERGENCE_ROLLBACK && cfg->checkpoint_dir != NULL &&
        r->rollbacks < MAX_ROLLBACKS) {
        say(r, "diverged at step %llu (%s, learning rate %.4g): rolling back to the newest "
               "checkpoint with the peak learning rate halved to %.4g (rollback %u of %d)",
            (unsigned long long)r->step, what, lr, r->sched.lr * 0.5, r->rollbacks + 1,
            MAX_ROLLBACKS);
        int rc = restore(r, true);
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
                      : cfg->checkpoint_dir == NULL ? " (no checkpoint_dir to roll back to)"
                      : r->rollbacks >= MAX_ROLLBACKS ? " (rolled back too often already)"
                                                      : " (no checkpoint to roll back to yet)";
    return dl__train_err(DL_TRAIN_DIVERGED, r->err, r->errlen,
                         "training diverged at step %llu: %s, learning rate %.4g%s; try a lower "
                         "lr, more warmup_steps, lr_scaling: sqrt, or on_divergence: rollback",
                         (unsigned long long)r->step, what, lr, why);
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
            ckpt_due = ckpt_due || (cfg->checkpoint_every > 0
                                        ? r->step % cfg->checkpoint_every == 0
                                        : epoch_done);
        else if (!last && !stop &&
                 (ckpt_due ||
                  (cfg->checkpoint_every > 0 ? r->step % cfg->checkpoint_every == 0 : epoch_done))) {
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
    dl_train_dataset_free(&r->train);
    dl_train_dataset_free(&r->test);
    dl_train_sampler_free(&r->sampler);
    dl_train_mlp_free(r->mlp);
    dl__train_reducer_free(&r->reducer);
    free(r->momentum);
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
    if (rc == 0)
        rc = restore(&r, cfg->resume);
    if (rc < 0)
        goto fail;

    shape_text(cfg, shape, sizeof(shape));
    char lr_text[32];
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
            "updating 1/%d of the parameters",
            (r.n_params + DL_TRAIN_SPARE_FLOATS) * sizeof(float) / 1024, comm->world_size);
    else if (comm->world_size > 1)
        say(&r, "gradients: summed in one piece of %zu KiB after backward (overlap off)",
            (r.n_params + DL_TRAIN_SPARE_FLOATS) * sizeof(float) / 1024);

    rc = loop(&r, &stopped);
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
    res.train_seconds = r.train_time;
    res.samples_per_sec = r.train_time > 0 ? r.samples / r.train_time : 0.0;
    res.params_crc = params_crc(&r);
    res.rollbacks = r.rollbacks;
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
