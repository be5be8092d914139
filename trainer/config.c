/* The trainer's settings: one table gives each key its type, range, default and help, and drives
 * the defaults, the key/value setter (for YAML and --set) and the help text alike. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "internal.h"

typedef enum {
    T_STR,
    T_U64,
    T_SIZE,
    T_INT,
    T_UINT,
    T_DOUBLE,
    T_BOOL,
    T_ENUM,
    T_LAYERS,
} type_t;

typedef struct {
    const char *key;
    type_t type;
    size_t offset;
    const char *def; /* the default, in the text form set() takes; NULL for none */
    double min, max;
    const char *const *names; /* T_ENUM: the values' names, in enum order */
    const char *help;
} option_t;

static const char *const act_names[] = {"relu", "tanh", "gelu", NULL};
static const char *const sched_names[] = {"constant", "step", "cosine", NULL};
static const char *const scaling_names[] = {"none", "linear", NULL};
static const char *const overlap_names[] = {"auto", "on", "off", NULL};

#define OFF(field) offsetof(dl_train_config_t, field)

static const option_t options[] = {
    {"dataset_dir", T_STR, OFF(dataset_dir), DL_TRAIN_DEFAULT_DATASET, 0, 0, NULL,
     "folder with the IDX files (train-*-ubyte, t10k-*-ubyte, gzip or plain)"},
    {"layers", T_LAYERS, OFF(sizes), "784-256-128-10", 0, 0, NULL,
     "layer widths, input first, classes last (784-256-128-10 or 784,256,128,10)"},
    {"activation", T_ENUM, OFF(activation), "relu", 0, 0, act_names,
     "hidden activation: relu, tanh or gelu"},
    {"batch_size", T_SIZE, OFF(batch_size), "64", 1, 1 << 20, NULL,
     "samples a step on each device (the global batch is this times the world size)"},
    {"epochs", T_U64, OFF(epochs), "10", 0, 1e9, NULL, "passes over the training set"},
    {"steps", T_U64, OFF(steps), "0", 0, 1e15, NULL,
     "optimizer steps to train; > 0 overrides epochs"},
    {"drop_last", T_BOOL, OFF(drop_last), "false", 0, 0, NULL,
     "drop the tail of the data that does not divide evenly (else pad by repeating)"},
    {"lr", T_DOUBLE, OFF(lr), "0.05", 1e-12, 1e6, NULL,
     "peak learning rate for base_batch samples a step"},
    {"momentum", T_DOUBLE, OFF(momentum), "0.9", 0, 0.999999, NULL, "SGD momentum"},
    {"weight_decay", T_DOUBLE, OFF(weight_decay), "0.0005", 0, 1, NULL, "L2 penalty"},
    {"lr_scaling", T_ENUM, OFF(lr_scaling), "none", 0, 0, scaling_names,
     "none, or linear: lr * global_batch / base_batch"},
    {"base_batch", T_SIZE, OFF(base_batch), "64", 1, 1 << 30, NULL,
     "the global batch lr is tuned for (for lr_scaling: linear)"},
    {"schedule", T_ENUM, OFF(schedule), "cosine", 0, 0, sched_names,
     "learning-rate schedule after warmup: constant, step or cosine"},
    {"lr_min", T_DOUBLE, OFF(lr_min), "0", 0, 1e6, NULL, "cosine: the rate at the last step"},
    {"lr_gamma", T_DOUBLE, OFF(lr_gamma), "0.1", 0, 1, NULL, "step: factor at each decay"},
    {"lr_step_epochs", T_U64, OFF(lr_step_epochs), "3", 1, 1e9, NULL,
     "step: epochs between decays"},
    {"warmup_steps", T_U64, OFF(warmup_steps), "200", 0, 1e15, NULL,
     "steps of linear warmup to the peak rate"},
    {"seed", T_U64, OFF(seed), "1", 0, 9.2e18, NULL,
     "seed of the initial weights and of the data order"},
    {"bucket_bytes", T_SIZE, OFF(bucket_bytes), "262144", 0, 1 << 30, NULL,
     "gradient all-reduce bucket size in bytes (0: one bucket)"},
    {"overlap", T_ENUM, OFF(overlap), "auto", 0, 0, overlap_names,
     "sum gradient buckets during backward: on, off, or auto (on when the host has more CPUs "
     "than workers)"},
    {"checkpoint_dir", T_STR, OFF(checkpoint_dir), NULL, 0, 0, NULL,
     "where rank 0 writes checkpoints (empty: none)"},
    {"checkpoint_every", T_U64, OFF(checkpoint_every), "0", 0, 1e15, NULL,
     "steps between checkpoints (0: at epoch ends)"},
    {"keep_checkpoints", T_UINT, OFF(keep_checkpoints), "3", 1, 1e6, NULL,
     "newest checkpoints kept"},
    {"resume", T_BOOL, OFF(resume), "true", 0, 0, NULL,
     "resume from the newest valid checkpoint in checkpoint_dir"},
    {"eval_every", T_U64, OFF(eval_every), "0", 0, 1e15, NULL,
     "steps between test-set evaluations (0: at epoch ends)"},
    {"log_every", T_U64, OFF(log_every), "0", 0, 1e15, NULL,
     "steps between progress lines (0: four an epoch)"},
    {"summary_file", T_STR, OFF(summary_file), NULL, 0, 0, NULL,
     "JSON summary written by rank 0 at the end (empty: none)"},
    {"blas_threads", T_INT, OFF(blas_threads), "1", 0, 1024, NULL,
     "OpenBLAS threads a worker (0: leave OpenBLAS's own choice)"},
    {"fail_at_step", T_U64, OFF(fail_at_step), "0", 0, 1e15, NULL,
     "testing restarts: rank fail_rank kills itself after this many steps, first attempt only "
     "(0: never)"},
    {"fail_rank", T_INT, OFF(fail_rank), "0", 0, 1 << 20, NULL,
     "testing restarts: the rank that fail_at_step kills (and hang_at_step stops)"},
    {"hang_at_step", T_U64, OFF(hang_at_step), "0", 0, 1e15, NULL,
     "testing hang reports: rank fail_rank stops itself (SIGSTOP) in this step, before summing "
     "its gradients, first attempt only (0: never)"},
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static int parse_bool(const char *s, bool *ret)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};

    for (size_t i = 0; i < 4; i++) {
        if (strcmp(s, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcmp(s, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    return -EINVAL;
}

static int parse_layers(const char *s, size_t *sizes, size_t *ret_n, char *err, size_t errlen,
                        const char *key)
{
    size_t tmp[DL_TRAIN_MAX_LAYERS + 1], n = 0;
    char part[32];
    const char *p = s;

    for (;;) {
        size_t len = strcspn(p, "-,x");
        long v;
        if (len == 0 || len >= sizeof(part))
            return dl__train_err(-EINVAL, err, errlen, "%s: '%s': expected widths like 784-256-10",
                                 key, s);
        memcpy(part, p, len);
        part[len] = '\0';
        if (dl_parse_int(part, 1, 1 << 20, &v) < 0)
            return dl__train_err(-EINVAL, err, errlen, "%s: '%s': bad width '%s' (1..1048576)", key,
                                 s, part);
        if (n == DL_TRAIN_MAX_LAYERS + 1)
            return dl__train_err(-ERANGE, err, errlen, "%s: more than %d layers", key,
                                 DL_TRAIN_MAX_LAYERS);
        tmp[n++] = (size_t)v;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    if (n < 2)
        return dl__train_err(-EINVAL, err, errlen,
                             "%s: '%s': need at least an input and an output width", key, s);
    memcpy(sizes, tmp, n * sizeof(*tmp));
    *ret_n = n - 1;
    return 0;
}

static int range_err(const option_t *o, const char *value, int r, char *err, size_t errlen)
{
    if (r == -ERANGE && o->type == T_DOUBLE)
        return dl__train_err(-ERANGE, err, errlen, "%s: '%s' is out of range [%g, %g]", o->key,
                             value, o->min, o->max);
    if (r == -ERANGE)
        return dl__train_err(-ERANGE, err, errlen, "%s: '%s' is out of range [%.0f, %.0f]", o->key,
                             value, o->min, o->max);
    return dl__train_err(-EINVAL, err, errlen, "%s: '%s' is not a number", o->key, value);
}

static int apply(dl_train_config_t *cfg, const option_t *o, const char *value, char *err,
                 size_t errlen)
{
    char *base = (char *)cfg;
    void *field = base + o->offset;
    long lv;
    double dv;
    bool bv;
    int r;

    switch (o->type) {
    case T_STR: {
        char *copy = NULL;
        if (value[0] != '\0' && (copy = strdup(value)) == NULL)
            return dl__train_err(-ENOMEM, err, errlen, "%s: out of memory", o->key);
        free(*(char **)field);
        *(char **)field = copy;
        return 0;
    }
    case T_U64:
    case T_SIZE:
    case T_INT:
    case T_UINT:
        r = dl_parse_int(value, (long)o->min, o->max >= (double)LONG_MAX ? LONG_MAX : (long)o->max,
                         &lv);
        if (r < 0)
            return range_err(o, value, r, err, errlen);
        if (o->type == T_U64)
            *(uint64_t *)field = (uint64_t)lv;
        else if (o->type == T_SIZE)
            *(size_t *)field = (size_t)lv;
        else if (o->type == T_INT)
            *(int *)field = (int)lv;
        else
            *(unsigned *)field = (unsigned)lv;
        return 0;
    case T_DOUBLE:
        r = dl_parse_double(value, o->min, o->max, &dv);
        if (r < 0)
            return range_err(o, value, r, err, errlen);
        *(double *)field = dv;
        return 0;
    case T_BOOL:
        if (parse_bool(value, &bv) < 0)
            return dl__train_err(-EINVAL, err, errlen, "%s: '%s': expected true or false", o->key,
                                 value);
        *(bool *)field = bv;
        return 0;
    case T_ENUM:
        for (int i = 0; o->names[i] != NULL; i++) {
            if (strcmp(value, o->names[i]) == 0) {
                /* All the enums here are plain ints. */
                *(int *)field = i;
                return 0;
            }
        }
        return dl__train_err(-EINVAL, err, errlen, "%s: '%s' is not one of %s%s%s%s%s", o->key,
                             value, o->names[0], o->names[1] ? ", " : "",
                             o->names[1] ? o->names[1] : "", o->names[2] ? ", " : "",
                             o->names[2] ? o->names[2] : "");
    case T_LAYERS:
        return parse_layers(value, cfg->sizes, &cfg->n_layers, err, errlen, o->key);
    }
    return -EINVAL;
}

void dl_train_config_init(dl_train_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (options[i].def != NULL && options[i].type != T_STR)
            (void)apply(cfg, &options[i], options[i].def, NULL, 0);
}

void dl_train_config_free(dl_train_config_t *cfg)
{
    if (cfg == NULL)
        return;
    free(cfg->dataset_dir);
    free(cfg->checkpoint_dir);
    free(cfg->summary_file);
    cfg->dataset_dir = cfg->checkpoint_dir = cfg->summary_file = NULL;
}

int dl_train_config_set(dl_train_config_t *cfg, const char *key, const char *value, char *err,
                        size_t errlen)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strcmp(options[i].key, key) == 0)
            return apply(cfg, &options[i], value, err, errlen);
    return dl__train_err(-EINVAL, err, errlen, "unknown trainer setting '%s'", key);
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
    if (cfg->schedule == DL_TRAIN_SCHED_COSINE && cfg->lr_min > cfg->lr)
        return dl__train_err(-EINVAL, err, errlen, "lr_min %g is above lr %g", cfg->lr_min,
                             cfg->lr);
    if (cfg->keep_checkpoints == 0)
        return dl__train_err(-EINVAL, err, errlen, "keep_checkpoints: must be at least 1");
    return 0;
}

bool dl_train_config_key(size_t i, const char **ret_key, const char **ret_default,
                         const char **ret_help)
{
    if (i >= N_OPTIONS)
        return false;
    *ret_key = options[i].key;
    *ret_default = options[i].def != NULL ? options[i].def : "";
    *ret_help = options[i].help;
    return true;
}
