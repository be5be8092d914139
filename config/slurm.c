/* The Slurm job environment: which job, which step, which nodes, which node we are, and where the
 * rendezvous lives. Pure: it reads an environ-style list and nothing else. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "slurm.h"

#define MAX_JOB_ID 4294967295L /* Slurm job and step ids are 32-bit */
#define MAX_COUNT 1000000L     /* nodes, tasks, CPUs: far above any real machine */
#define MAX_GPUS 1024

/* The first of the names that is set; *ret_name says which. */
static const char *env_first(char *const *envp, const char *a, const char *b, const char *c,
                             const char **ret_name)
{
    const char *names[] = {a, b, c};

    for (size_t i = 0; i < 3; i++) {
        const char *v = names[i] ? dl_env_get(envp, names[i]) : NULL;
        if (v != NULL) {
            *ret_name = names[i];
            return v;
        }
    }
    *ret_name = a;
    return NULL;
}

/* The value for a message: at most 64 characters, control characters as '?'. */
static void show(const char *value, char *buf, size_t len)
{
    size_t i, n = 0;

    for (i = 0; value[i] != '\0' && i < 64 && n + 4 < len; i++)
        buf[n++] = (unsigned char)value[i] < 0x20 || value[i] == 0x7f ? '?' : value[i];
    if (value[i] != '\0' && n + 4 < len) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
}

#if defined(__GNUC__)
__attribute__((format(printf, 6, 7)))
#endif
static int
bad(char *err, size_t errlen, int code, const char *name, const char *value, const char *fmt, ...)
{
    char what[160], shown[72];
    va_list ap;

    if (errlen == 0)
        return code;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (value == NULL) {
        snprintf(err, errlen, "%s: %s", name, what);
    } else {
        show(value, shown, sizeof(shown));
        snprintf(err, errlen, "%s='%s': %s", name, shown, what);
    }
    return code;
}

static int parse_count(const char *name, const char *value, long min, long max, long *ret,
                       char *err, size_t errlen)
{
    int r = dl_parse_int(value, min, max, ret);

    if (r == -ERANGE)
        return bad(err, errlen, r, name, value, "out of range %ld..%ld", min, max);
    if (r < 0)
        return bad(err, errlen, -EINVAL, name, value, "not a number");
    return 0;
}

/* An optional variable: *ret keeps its default when the variable is not set. */
static int parse_optional(char *const *envp, const char *name, long min, long max, int *ret,
                          char *err, size_t errlen)
{
    const char *v = dl_env_get(envp, name);
    long n;
    int r;

    if (v == NULL)
        return 0;
    r = parse_count(name, v, min, max, &n, err, errlen);
    if (r < 0)
        return r;
    *ret = (int)n;
    return 0;
}

int dl_slurm_rdzv_port(long job_id)
{
    return DL_SLURM_PORT_BASE + (int)(job_id % DL_SLURM_PORT_SPAN);
}

static int is_name_char(char c)
{
    return c != '\0' && c != ':' && c != ',' && c != '(' && c != ')' && c != ' ' && c != '\t' &&
           c != '\n';
}

/* One item of a GPU list between p and end: "[gpu:][type:]count[(xN)]". */
static int parse_gpu_item(const char *p, const char *end, long *ret)
{
    const char *stop = end, *num = p;
    long v = 0;
    int fields = 0;

    /* "(xN)": the same count on N nodes, which changes nothing per node. */
    if (stop > p && stop[-1] == ')') {
        const char *paren = stop - 1;
        while (paren > p && *paren != '(')
            paren--;
        if (*paren != '(' || paren[1] != 'x' || paren + 2 >= stop - 1 || paren[2] == '0')
            return -EINVAL;
        for (const char *q = paren + 2; q < stop - 1; q++)
            if (*q < '0' || *q > '9')
                return -EINVAL;
        stop = paren;
    }
    /* Names before the count: up to two ("gpu:a100:4"), none empty. */
    for (const char *q = p; q < stop; q++) {
        if (*q != ':')
            continue;
        if (q == num || ++fields > 2)
            return -EINVAL;
        for (const char *s = num; s < q; s++)
            if (!is_name_char(*s))
                return -EINVAL;
        num = q + 1;
    }
    if (num == stop)
        return -EINVAL;
    for (const char *q = num; q < stop; q++) {
        if (*q < '0' || *q > '9')
            return -EINVAL;
        v = v * 10 + (*q - '0');
        if (v > MAX_GPUS)
            return -ERANGE;
    }
    *ret = v;
    return 0;
}

int dl_slurm_parse_gpus(const char *text, int *ret)
{
    const char *p = text;
    long total = 0;

    if (text == NULL || *text == '\0')
        return -EINVAL;
    for (;;) {
        const char *end = strchr(p, ',');
        long v;
        int r;

        if (end == NULL)
            end = p + strlen(p);
        r = parse_gpu_item(p, end, &v);
        if (r < 0)
            return r;
        total += v;
        if (total > MAX_GPUS)
            return -ERANGE;
        if (*end == '\0')
            break;
        p = end + 1;
    }
    *ret = (int)total;
    return 0;
}

static int parse_gpus_var(char *const *envp, int *ret, char *err, size_t errlen)
{
    const char *v = dl_env_get(envp, "SLURM_GPUS_ON_NODE");
    const char *name = "SLURM_GPUS_ON_NODE";
    long n;
    int r;

    if (v != NULL) {
        r = parse_count(name, v, 0, MAX_GPUS, &n, err, errlen);
        if (r < 0)
            return r;
        *ret = (int)n;
        return 0;
    }
    name = "SLURM_GPUS_PER_NODE";
    v = dl_env_get(envp, name);
    if (v == NULL)
        return 0;
    r = dl_slurm_parse_gpus(v, ret);
    if (r == -ERANGE)
        return bad(err, errlen, r, name, v, "more than %d GPUs", MAX_GPUS);
    if (r < 0)
        return bad(err, errlen, r, name, v,
                   "expected [type:]count[(xN)], comma-separated (e.g. 4, a100:4, gpu:a100:4)");
    return 0;
}

static int parse_nodes(char *const *envp, dl_slurm_env_t *e, char *err, size_t errlen)
{
    const char *name, *list, *nn;
    char why[DL_CONFIG_ERRLEN];
    long n;
    int r;

    if (e->in_step)
        list =
            env_first(envp, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", &name);
    else
        list = env_first(envp, "SLURM_JOB_NODELIST", "SLURM_NODELIST", NULL, &name);
    if (list == NULL)
        return bad(err, errlen, -ENOENT, "SLURM_JOB_NODELIST", NULL,
                   "not set, although SLURM_JOB_ID=%ld is", e->job_id);
    e->nodelist_var = name;
    r = dl_hostlist_expand(list, &e->hosts, &e->nhosts, why, sizeof(why));
    if (r < 0) {
        if (errlen > 0)
            snprintf(err, errlen, "%s: %s", name, why);
        return r;
    }
    if (e->nhosts == 0)
        return bad(err, errlen, -EINVAL, name, list, "names no host");
    e->rdzv_host = e->hosts[0];

    if (e->in_step)
        nn = env_first(envp, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", NULL, &name);
    else
        nn = env_first(envp, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", NULL, &name);
    if (nn == NULL) {
        e->nnodes = (int)e->nhosts;
        return 0;
    }
    r = parse_count(name, nn, 1, DL_HOSTLIST_MAX_HOSTS, &n, err, errlen);
    if (r < 0)
        return r;
    if ((size_t)n != e->nhosts)
        return bad(err, errlen, -EINVAL, name, nn, "does not match %s (%zu host%s)",
                   e->nodelist_var, e->nhosts, e->nhosts == 1 ? "" : "s");
    e->nnodes = (int)n;
    return 0;
}

static int parse_ids(char *const *envp, dl_slurm_env_t *e, char *err, size_t errlen)
{
    const char *name = "SLURM_NODEID", *v = dl_env_get(envp, name);
    long n;
    int r;

    if (v == NULL) {
        if (e->in_step)
            return bad(err, errlen, -ENOENT, name, NULL, "not set, although SLURM_STEP_ID=%ld is",
                       e->step_id);
    } else {
        r = parse_count(name, v, 0, MAX_COUNT, &n, err, errlen);
        if (r < 0)
            return r;
        if (n >= e->nnodes)
            return bad(err, errlen, -ERANGE, name, v, "out of range 0..%d (%s names %d hosts)",
                       e->nnodes - 1, e->nodelist_var, e->nnodes);
        e->node_id = (int)n;
    }

    r = parse_optional(envp, "SLURM_PROCID", 0, MAX_COUNT, &e->proc_id, err, errlen);
    if (r >= 0)
        r = parse_optional(envp, "SLURM_LOCALID", 0, MAX_COUNT, &e->local_id, err, errlen);
    if (r < 0)
        return r;
    v = env_first(envp, "SLURM_NTASKS", "SLURM_NPROCS", NULL, &name);
    if (v != NULL) {
        r = parse_count(name, v, 1, MAX_COUNT, &n, err, errlen);
        if (r < 0)
            return r;
        e->ntasks = (int)n;
    }
    if (e->in_step && e->proc_id >= 0 && e->ntasks > 0 && e->proc_id >= e->ntasks)
        return bad(err, errlen, -ERANGE, "SLURM_PROCID", dl_env_get(envp, "SLURM_PROCID"),
                   "out of range 0..%d (%s=%d)", e->ntasks - 1, name, e->ntasks);
    return 0;
}

int dl_slurm_env_parse(char *const *envp, dl_slurm_env_t *ret, char *err, size_t errlen)
{
    dl_slurm_env_t e = {
        .step_id = -1,
        .node_id = -1,
        .gpus_per_node = -1,
        .cpus_on_node = -1,
        .proc_id = -1,
        .local_id = -1,
        .ntasks = -1,
    };
    const char *name, *v;
    int r;

    v = env_first(envp, "SLURM_JOB_ID", "SLURM_JOBID", NULL, &name);
    if (v == NULL) {
        *ret = e;
        return 0;
    }
    r = parse_count(name, v, 1, MAX_JOB_ID, &e.job_id, err, errlen);
    if (r < 0)
        return r;
    e.in_allocation = true;
    e.rdzv_port = dl_slurm_rdzv_port(e.job_id);

    v = env_first(envp, "SLURM_STEP_ID", "SLURM_STEPID", NULL, &name);
    if (v != NULL) {
        r = parse_count(name, v, 0, MAX_JOB_ID, &e.step_id, err, errlen);
        if (r < 0)
            return r;
        e.in_step = true;
    }

    r = parse_nodes(envp, &e, err, errlen);
    if (r >= 0)
        r = parse_ids(envp, &e, err, errlen);
    if (r >= 0)
        r = parse_gpus_var(envp, &e.gpus_per_node, err, errlen);
    if (r >= 0)
        r = parse_optional(envp, "SLURM_CPUS_ON_NODE", 1, MAX_COUNT, &e.cpus_on_node, err, errlen);
    if (r >= 0)
        r = parse_optional(envp, "SLURM_RESTART_COUNT", 0, MAX_COUNT, &e.restart_count, err,
                           errlen);
    if (r < 0)
        goto fail;

    v = dl_env_get(envp, "SLURM_SUBMIT_DIR");
    if (v != NULL) {
        e.submit_dir = strdup(v);
        if (e.submit_dir == NULL) {
            r = bad(err, errlen, -ENOMEM, "SLURM_SUBMIT_DIR", NULL, "out of memory");
            goto fail;
        }
    }
    *ret = e;
    return 0;

fail:
    dl_slurm_env_free(&e);
    return r;
}

void dl_slurm_env_free(dl_slurm_env_t *env)
{
    if (env == NULL)
        return;
    dl_hostlist_free(env->hosts);
    free(env->submit_dir);
    *env = (dl_slurm_env_t){.step_id = -1,
                            .node_id = -1,
                            .gpus_per_node = -1,
                            .cpus_on_node = -1,
                            .proc_id = -1,
                            .local_id = -1,
                            .ntasks = -1};
}
