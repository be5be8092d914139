/* The trainer's settings: one table, read by the option engine (config/opt.h), gives each key its
 * type, range, default and help, and drives the defaults, the key/value setter (for YAML, --set
 * and DLAUNCH_TRAIN_<KEY>), the help text and typo hints alike. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "internal.h"

static const char *const act_names[] = {"relu", "tanh", "gelu", NULL};
static const char *const sched_names[] = {"constant", "step", "cosine", NULL};
static const char *const scaling_names[] = {"none", "linear", "sqrt", NULL};
static const char *const divergence_names[] = {"stop", "rollback", NULL};
static const char *const overlap_names[] = {"auto", "on", "off", NULL};
static const char *const phase_names[] = {"after", "compute", "exchange", "gather", "update", NULL};

static int parse_layers(const dl_opt_t *o, void *obj, const char *s, char *why, size_t whylen)
{
    dl_train_config_t *cfg = obj;
    size_t tmp[DL_TRAIN_MAX_LAYERS + 1], n = 0;
    char part[32];
    const char *p = s;

    for (;;) {
        size_t len = strcspn(p, "-,x");
        long v;
        if (len == 0 || len >= sizeof(part)) {
            snprintf(why, whylen, "is not a list of widths like 784-256-10");
            return -EINVAL;
        }
        memcpy(part, p, len);
        part[len] = '\0';
        if (dl_parse_int(part, 1, 1 << 20, &v) < 0) {
            snprintf(why, whylen, "has a bad width '%s' (1 to 1048576)", part);
            return -EINVAL;
        }
        if (n == DL_TRAIN_MAX_LAYERS + 1) {
            snprintf(why, whylen, "has more than %d layers", DL_TRAIN_MAX_LAYERS);
            return -ERANGE;
        }
        tmp[n++] = (size_t)v;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    if (n < 2) {
        snprintf(why, whylen, "needs at least an input and an output width");
        return -EINVAL;
    }
    memcpy(cfg->sizes, tmp, n * sizeof(*tmp));
    cfg->n_layers = n - 1;
    return 0;
}

static const dl_opt_type_t t_layers = {"a list of widths", parse_layers, NULL, false};

#define OFF(field) offsetof(dl_train_config_t, field)
#define T(type) &dl_opt_##type

/* Each key once: type, field, range, choices, default, help. The trainer's keys are YAML keys
 * (with '_'); they have no flags of their own but --set KEY=VALUE. */
static const dl_opt_t options[] = {
    {"dataset_dir", NULL, 0, T(path), OFF(dataset_dir), 0, 0, NULL, DL_TRAIN_DEFAULT_DATASET, "DIR",
     "folder with the IDX files (train-*-ubyte, t10k-*-ubyte, gzip or plain)", 0, 0},
    {"layers", NULL, 0, &t_layers, 0, 0, 0, NULL, "784-256-128-10", "W-W-...",
     "layer widths, input first, classes last (784-256-128-10 or 784,256,128,10)", 0, 0},
    {"activation", NULL, 0, T(enum), OFF(activation), 0, 0, act_names, "relu", "NAME",
     "hidden activation: relu, tanh or gelu", 0, 0},
    {"batch_size", NULL, 0, T(size), OFF(batch_size), 1, 1 << 20, NULL, "64", "N",
     "samples a step on each device (the global batch is this times the world size)", 0, 0},
    {"epochs", NULL, 0, T(u64), OFF(epochs), 0, 1e9, NULL, "10", "N",
     "passes over the training set", 0, 0},
    {"steps", NULL, 0, T(u64), OFF(steps), 0, 1e15, NULL, "0", "N",
     "optimizer steps to train; > 0 overrides epochs", 0, 0},
    {"drop_last", NULL, 0, T(bool), OFF(drop_last), 0, 0, NULL, "false", "BOOL",
     "drop the tail of the data that does not divide evenly (else pad by repeating)", 0, 0},
    {"lr", NULL, 0, T(double), OFF(lr), 1e-12, 1e6, NULL, "0.05", "RATE",
     "peak learning rate for base_batch samples a step", 0, 0},
    {"momentum", NULL, 0, T(double), OFF(momentum), 0, 0.999999, NULL, "0.9", "M", "SGD momentum",
     0, 0},
    {"weight_decay", NULL, 0, T(double), OFF(weight_decay), 0, 1, NULL, "0.0005", "WD",
     "L2 penalty", 0, 0},
    {"lr_scaling", NULL, 0, T(enum), OFF(lr_scaling), 0, 0, scaling_names, "none", "RULE",
     "none; linear: lr * k, with warmup_steps * k steps of warmup; sqrt: lr * sqrt(k) "
     "(k = global batch / base_batch)",
     0, 0},
    {"base_batch", NULL, 0, T(size), OFF(base_batch), 1, 1 << 30, NULL, "64", "N",
     "the global batch lr is tuned for (for lr_scaling)", 0, 0},
    {"schedule", NULL, 0, T(enum), OFF(schedule), 0, 0, sched_names, "cosine", "NAME",
     "learning-rate schedule after warmup: constant, step or cosine", 0, 0},
    {"lr_min", NULL, 0, T(double), OFF(lr_min), 0, 1e6, NULL, "0", "RATE",
     "cosine: the rate at the last step", 0, 0},
    {"lr_gamma", NULL, 0, T(double), OFF(lr_gamma), 0, 1, NULL, "0.1", "G",
     "step: factor at each decay", 0, 0},
    {"lr_step_epochs", NULL, 0, T(u64), OFF(lr_step_epochs), 1, 1e9, NULL, "3", "N",
     "step: epochs between decays", 0, 0},
    {"warmup_steps", NULL, 0, T(u64), OFF(warmup_steps), 0, 1e15, NULL, "200", "N",
     "steps of linear warmup to the peak rate", 0, 0},
    {"on_divergence", NULL, 0, T(enum), OFF(on_divergence), 0, 0, divergence_names, "stop",
     "ACTION",
     "when the loss diverges: stop (exit 3), or rollback to the last checkpoint with half the "
     "learning rate (at most 3 times)",
     0, 0},
    {"divergence_factor", NULL, 0, T(double), OFF(divergence_factor), 0, 1e12, NULL, "3", "F",
     "a job-wide loss above this times the median of the recent healthy losses is high; 0: only "
     "a non-finite loss is divergence",
     0, 0},
    {"divergence_window", NULL, 0, T(u64), OFF(divergence_window), 1, 4096, NULL, "20", "N",
     "divergence: more than half of the last this many steps were high", 0, 0},
    {"seed", NULL, 0, T(u64), OFF(seed), 0, 9.2e18, NULL, "1", "N",
     "seed of the initial weights and of the data order", 0, 0},
    {"bucket_bytes", NULL, 0, T(size), OFF(bucket_bytes), 0, 1 << 30, NULL, "262144", "BYTES",
     "gradient all-reduce bucket size in bytes (0: one bucket)", 0, 0},
    {"overlap", NULL, 0, T(enum), OFF(overlap), 0, 0, overlap_names, "auto", "MODE",
     "sum gradient buckets during backward: on, off, or auto (on when the host has more CPUs "
     "than workers)",
     0, 0},
    {"peer_reads", NULL, 0, T(bool), OFF(peer_reads), 0, 0, NULL, "true", "BOOL",
     "sharded update with in-job recovery, every rank on one host: read the other ranks' "
     "gradient and parameter blocks where they lie (shared memory), not through the collective",
     0, 0},
    {"checkpoint_dir", NULL, 0, T(path), OFF(checkpoint_dir), 0, 0, NULL, NULL, "DIR",
     "where rank 0 writes checkpoints (empty: none)", 0, 0},
    {"checkpoint_every", NULL, 0, T(u64), OFF(checkpoint_every), 0, 1e15, NULL, "0", "N",
     "steps between checkpoints (0: at epoch ends)", 0, 0},
    {"keep_checkpoints", NULL, 0, T(uint), OFF(keep_checkpoints), 1, 1e6, NULL, "3", "N",
     "newest valid checkpoints kept", 0, 0},
    {"resume", NULL, 0, T(bool), OFF(resume), 0, 0, NULL, "true", "BOOL",
     "resume from the newest valid checkpoint in checkpoint_dir", 0, 0},
    {"eval_every", NULL, 0, T(u64), OFF(eval_every), 0, 1e15, NULL, "0", "N",
     "steps between test-set evaluations (0: at epoch ends)", 0, 0},
    {"log_every", NULL, 0, T(u64), OFF(log_every), 0, 1e15, NULL, "0", "N",
     "steps between progress lines (0: four an epoch)", 0, 0},
    {"summary_file", NULL, 0, T(path), OFF(summary_file), 0, 0, NULL, NULL, "FILE",
     "JSON summary written by rank 0 at the end (empty: none)", 0, 0},
    {"blas_threads", NULL, 0, T(int), OFF(blas_threads), 0, 1024, NULL, "1", "N",
     "OpenBLAS threads a worker (0: leave OpenBLAS's own choice)", 0, 0},
    {"fail_at_step", NULL, 0, T(u64), OFF(fail_at_step), 0, 1e15, NULL, "0", "N",
     "testing restarts: rank fail_rank kills itself after this many steps, first attempt only "
     "(0: never)",
     0, 0},
    {"fail_rank", NULL, 0, T(int), OFF(fail_rank), 0, 1 << 20, NULL, "0", "N",
     "testing restarts: the rank that fail_at_step kills (and hang_at_step stops)", 0, 0},
    {"fail_phase", NULL, 0, T(enum), OFF(fail_phase), 0, 0, phase_names, "after", "PHASE",
     "testing recovery: where fail_at_step kills: after the step (after), or inside it: in its "
     "compute, its gradient exchange, its update or its parameter gather (sharded), "
     "fail_delay_us in",
     0, 0},
    {"fail_delay_us", NULL, 0, T(u64), OFF(fail_delay_us), 0, 1e9, NULL, "0", "US",
     "testing recovery: how long after entering fail_phase the kill comes", 0, 0},
    {"fail_on_join", NULL, 0, T(bool), OFF(fail_on_join), 0, 0, NULL, "false", "BOOL",
     "testing recovery: a replacement joining a running job (DLAUNCH_GROUP_GEN 1) kills itself "
     "as soon as it is in the group, a second failure during the recovery",
     0, 0},
    {"hang_at_step", NULL, 0, T(u64), OFF(hang_at_step), 0, 1e15, NULL, "0", "N",
     "testing hang reports: rank fail_rank stops itself (SIGSTOP) in this step, before summing "
     "its gradients, first attempt only (0: never)",
     0, 0},
    {"slow_ms_per_step", NULL, 0, T(double), OFF(slow_ms_per_step), 0, 1e6, NULL, "0", "MS",
     "testing the straggler rule: rank slow_rank sleeps this long in each step's compute, every "
     "attempt (0: never)",
     0, 0},
    {"slow_rank", NULL, 0, T(int), OFF(slow_rank), 0, 1 << 20, NULL, "0", "N",
     "testing the straggler rule: the rank slow_ms_per_step slows (none if not in the job)", 0, 0},
    {"slow_after_s", NULL, 0, T(double), OFF(slow_after_s), 0, 1e6, NULL, "0", "SEC",
     "testing the straggler rule: the slowdown starts this long after the first step", 0, 0},
};

const dl_opt_table_t dl_train_settings = {options, sizeof(options) / sizeof(options[0]),
                                          "DLAUNCH_TRAIN_", NULL, true};

void dl_train_config_init(dl_train_config_t *cfg)
{
    char err[256];

    memset(cfg, 0, sizeof(*cfg));
    /* The defaults are the table's own; a failure here is a bug in the table. */
    if (dl_opt_defaults(&dl_train_settings, cfg, err, sizeof(err)) < 0)
        abort();
}

void dl_train_config_free(dl_train_config_t *cfg)
{
    dl_opt_release(&dl_train_settings, cfg);
}

int dl_train_config_set(dl_train_config_t *cfg, const char *key, const char *value, char *err,
                        size_t errlen)
{
    const dl_opt_t *o = dl_opt_by_key(&dl_train_settings, key);

    if (o == NULL) {
        const dl_opt_t *c = dl_opt_closest(&dl_train_settings, key, true);
        char shown[128];
        dl_opt_escape(key, shown, sizeof(shown));
        if (c != NULL)
            return dl__train_err(-EINVAL, err, errlen,
                                 "unknown trainer setting '%s' (did you mean '%s'?)", shown,
                                 c->name);
        return dl__train_err(-EINVAL, err, errlen, "unknown trainer setting '%s'", shown);
    }
    return dl_opt_set(o, cfg, value, key, err, errlen);
}

int dl_train_config_check(const dl_train_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->n_layers < 1 || cfg->n_layers > DL_TRAIN_MAX_LAYERS)
        return dl__train_err(-EINVAL, err, errlen, "layers: need 2 to %d widths",
                             DL_TRAIN_MAX_LAYERS + 1);
    if (cfg->epochs == 0 && cfg->steps == 0)
        return dl__train_err(-EINVAL, err, errlen, "epochs and steps are both 0: nothing to do");
    if (cfg->batch_size == 0)
        return dl__train_err(-EINVAL, err, errlen, "batch_size: must be at least 1");
    if (cfg->schedule == DL_TRAIN_SCHED_COSINE && cfg->lr_min > cfg->lr) {
        char lo[32], hi[32];
        return dl__train_err(-EINVAL, err, errlen, "lr_min %s is above lr %s",
                             dl_opt_num_text(cfg->lr_min, lo, sizeof(lo)),
                             dl_opt_num_text(cfg->lr, hi, sizeof(hi)));
    }
    if (cfg->keep_checkpoints == 0)
        return dl__train_err(-EINVAL, err, errlen, "keep_checkpoints: must be at least 1");
    return 0;
}
