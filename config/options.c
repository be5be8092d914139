/* The job spec's option table: every flag of dlaunch (and of torchrun, by its own names), its
 * YAML key, its variables, its type, default and help. The engine (opt.c) does the rest. */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

#define OFF(field) offsetof(dl_job_spec_t, field)
#define SPEC(obj) ((dl_job_spec_t *)(obj))

/* ---- Types of the job spec's own ------------------------------------------------------------ */

static int parse_nodes(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    int lo, hi, r = dl_parse_nodes(text, &lo, &hi);
    if (r < 0) {
        snprintf(why, whylen, "%s",
                 r == -ERANGE ? "is out of range (want N or MIN:MAX, 1 <= MIN <= MAX)"
                              : "is not N or MIN:MAX");
        return -EINVAL;
    }
    SPEC(obj)->nodes_min = lo;
    SPEC(obj)->nodes_max = hi;
    return 0;
}

static int parse_count(const dl_opt_t *o, const char *text, int *ret)
{
    long v;
    int r = dl_parse_int(text, (long)o->min, (long)o->max, &v);
    if (r == 0)
        *ret = (int)v;
    return r;
}

/* --gpus-per-node N|auto: auto (the default) is one worker per GPU found, else one. */
static int parse_gpus(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    int n = DL_GPUS_DEFAULT;
    if (strcmp(text, "auto") != 0 && parse_count(o, text, &n) < 0) {
        snprintf(why, whylen, "is not a count (1 to 4096) or 'auto'");
        return -EINVAL;
    }
    SPEC(obj)->gpus_per_node = n;
    SPEC(obj)->gpus_from_nproc = false;
    return 0;
}

/* torchrun's --nproc-per-node N|auto|cpu|gpu. */
static int parse_nproc(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    int n = 0;
    if (strcmp(text, "auto") == 0)
        n = DL_GPUS_AUTO;
    else if (strcmp(text, "cpu") == 0)
        n = DL_GPUS_CPU;
    else if (strcmp(text, "gpu") == 0)
        n = DL_GPUS_GPU;
    else if (strcmp(text, "xpu") == 0)
        n = DL_GPUS_XPU;
    else if (parse_count(o, text, &n) < 0) {
        /* torchrun also takes the name of a torch plug-in's device (privateuse1): only that
         * plug-in can count its devices. */
        snprintf(why, whylen,
                 "is not a count (1 to 4096), auto, cpu, gpu or xpu (for a "
                 "plug-in's device, give the count)");
        return -EINVAL;
    }
    SPEC(obj)->gpus_per_node = n;
    SPEC(obj)->gpus_from_nproc = true;
    return 0;
}

static int set_string(char **field, const char *text)
{
    char *copy = strdup(text);
    if (copy == NULL)
        return -ENOMEM;
    free(*field);
    *field = copy;
    return 0;
}

/* The run id names log folders, goes in environment variables and on the wire. */
static int parse_run_id(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    size_t n = strlen(text);
    if (n == 0) {
        snprintf(why, whylen, "must not be empty");
        return -EINVAL;
    }
    if (n > 128 ||
        strspn(text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") != n ||
        strcmp(text, ".") == 0 || strcmp(text, "..") == 0) {
        snprintf(why, whylen,
                 "is not a run id (1 to 128 letters, digits, '.', '_', ':', '-'; "
                 "not '.' or '..')");
        return -EINVAL;
    }
    return set_string(&SPEC(obj)->run_id, text);
}

static int parse_std(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    if (dl_std_spec_for(text, 0) < 0) {
        snprintf(why, whylen,
                 "is not 0-3 or LOCAL_RANK:N,... (N: 0 none, 1 stdout, 2 stderr, "
                 "3 both)");
        return -EINVAL;
    }
    return set_string((char **)((char *)obj + o->offset), text);
}

static int parse_rank_list(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    if (*text == '\0' || dl_int_list_has(text, 0) < 0) {
        snprintf(why, whylen, "is not a comma-separated list of local ranks (0,3)");
        return -EINVAL;
    }
    return set_string((char **)((char *)obj + o->offset), text);
}

static void no_signal(void *ctx, int sig)
{
    (void)ctx;
    (void)sig;
}

static int parse_signals(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    char bad[64];
    if (dl_signal_list_each(text, no_signal, NULL, bad, sizeof(bad)) < 0) {
        snprintf(why, whylen, "names no signal in '%s' (a list like SIGTERM,SIGINT,SIGUSR1)", bad);
        return -EINVAL;
    }
    return set_string((char **)((char *)obj + o->offset), text);
}

static int parse_forward_signals(const dl_opt_t *o, void *obj, const char *text, char *why,
                                 size_t whylen)
{
    if (strcmp(text, "none") == 0)
        return set_string((char **)((char *)obj + o->offset), text);
    return parse_signals(o, obj, text, why, whylen);
}

/* --rdzv-conf k=v,...: torchrun's keys, and etcd's. Each is set as it is read, so a flag given
 * later (--join-timeout) still wins. */
typedef enum {
    K_DOUBLE,
    K_BOOL,
    K_STRING,
    K_ATTEMPTS,
    K_ACCEPTED,
    K_STORE,
    K_STORE_TYPE
} conf_kind_t;

static const struct {
    const char *key;
    conf_kind_t kind;
    size_t offset;
} conf_keys[] = {
    {"join_timeout", K_DOUBLE, OFF(join_timeout)},
    {"timeout", K_DOUBLE, OFF(join_timeout)},
    {"last_call_timeout", K_DOUBLE, OFF(last_call)},
    {"close_timeout", K_DOUBLE, OFF(close_timeout)},
    {"read_timeout", K_DOUBLE, OFF(read_timeout)},
    {"is_host", K_BOOL, OFF(is_host)},
    {"store", K_STORE, OFF(store_worker)},
    /* torchrun's c10d keep-alive: a heartbeat each interval, dead after max_attempt missed. */
    {"keep_alive_interval", K_DOUBLE, OFF(heartbeat)},
    {"keep_alive_max_attempt", K_ATTEMPTS, OFF(dead_after)},
    /* torchrun: how long one keep-alive write may take before it is logged as failed. */
    {"heartbeat_timeout", K_ACCEPTED, 0},
    {"store_type", K_STORE_TYPE, 0},
    {"user", K_STRING, OFF(etcd_user)},
    {"password_file", K_STRING, OFF(etcd_password_file)},
    {"protocol", K_STRING, OFF(etcd_protocol)},
    {"cacert", K_STRING, OFF(etcd_cacert)},
    {"cert", K_STRING, OFF(etcd_cert)},
    {"key", K_STRING, OFF(etcd_key)},
    {"prefix", K_STRING, OFF(etcd_prefix)},
};

static int conf_pair(dl_job_spec_t *tmp, const char *k, const char *v, char *why, size_t whylen)
{
    for (size_t i = 0; i < sizeof(conf_keys) / sizeof(conf_keys[0]); i++) {
        if (strcmp(conf_keys[i].key, k) != 0)
            continue;
        void *field = (char *)tmp + conf_keys[i].offset;
        double d;
        bool b;
        switch (conf_keys[i].kind) {
        case K_DOUBLE:
            if (dl_parse_double(v, 0.001, 86400 * 7, &d) < 0) {
                snprintf(why, whylen, "has %s=%s: want seconds (0.001 to 604800)", k, v);
                return -EINVAL;
            }
            *(double *)field = d;
            return 0;
        case K_BOOL:
            if (dl_opt_parse_bool(v, &b) < 0) {
                snprintf(why, whylen, "has %s=%s: want %s", k, v, DL_OPT_BOOL_WORDS);
                return -EINVAL;
            }
            *(int *)field = b ? 1 : 0;
            return 0;
        case K_ATTEMPTS:
            if (dl_parse_double(v, 1, 1000, &d) < 0 || d != (double)(long)d) {
                snprintf(why, whylen, "has %s=%s: want a whole number (1 to 1000)", k, v);
                return -EINVAL;
            }
            /* Applied once every key is read, with the interval then in force. */
            *(double *)field = -d;
            return 0;
        case K_ACCEPTED:
            if (dl_parse_double(v, 0.001, 86400 * 7, &d) < 0) {
                snprintf(why, whylen, "has %s=%s: want seconds (0.001 to 604800)", k, v);
                return -EINVAL;
            }
            return 0;
        case K_STORE_TYPE:
            if (strcasecmp(v, "tcp") == 0)
                return 0;
            snprintf(why, whylen,
                     "has %s=%s: dlaunch's rendezvous is always served over TCP "
                     "(tcp; torchrun's file store has no equivalent)",
                     k, v);
            return -EINVAL;
        case K_STRING:
            if (*v == '\0') {
                snprintf(why, whylen, "has an empty %s", k);
                return -EINVAL;
            }
            return set_string((char **)field, v) < 0 ? -ENOMEM : 0;
        case K_STORE:
            /* Where the workers' torch store lives: the agent (as torchrun since 2.4), or the
             * workers' rank 0 as before (docs/store.md). */
            if (strcmp(v, "agent") != 0 && strcmp(v, "worker") != 0) {
                snprintf(why, whylen, "has store=%s: want agent or worker", v);
                return -EINVAL;
            }
            *(bool *)field = strcmp(v, "worker") == 0;
            return 0;
        }
    }
    snprintf(why, whylen,
             "has an unknown key '%s' (known: join_timeout, last_call_timeout, "
             "close_timeout, timeout, read_timeout, is_host, store, "
             "keep_alive_interval, keep_alive_max_attempt, heartbeat_timeout, "
             "store_type, user, "
             "password_file, protocol, cacert, cert, key, prefix)",
             k);
    return -EINVAL;
}

static void conf_release(dl_job_spec_t *s)
{
    free(s->etcd_user);
    free(s->etcd_password_file);
    free(s->etcd_protocol);
    free(s->etcd_cacert);
    free(s->etcd_cert);
    free(s->etcd_key);
    free(s->etcd_prefix);
}

static int parse_rdzv_conf(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    dl_job_spec_t *spec = obj, tmp = *spec;
    size_t n = strlen(text);
    /* keep_alive_max_attempt comes back as a negative count in dead_after. */
    tmp.dead_after = 0;
    int r = 0;

    /* The string fields are copied as they change, so a failure halfway leaves spec alone. */
    tmp.etcd_user = tmp.etcd_password_file = tmp.etcd_protocol = tmp.etcd_cacert = NULL;
    tmp.etcd_cert = tmp.etcd_key = tmp.etcd_prefix = NULL;
    /* Quotes that a list of arguments carried through no shell ("'a=1,b=2'"). */
    if (n >= 2 && (text[0] == '\'' || text[0] == '"') && text[n - 1] == text[0]) {
        text++;
        n -= 2;
    }
    char *buf = strndup(text, n), *save = NULL;
    if (buf == NULL)
        return -ENOMEM;
    for (char *item = strtok_r(buf, ",", &save); item != NULL && r == 0;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        while (*item == ' ')
            item++;
        if (eq == NULL || eq == item) {
            snprintf(why, whylen, "has '%s': want KEY=VALUE,...", item);
            r = -EINVAL;
            break;
        }
        *eq = '\0';
        r = conf_pair(&tmp, item, eq + 1, why, whylen);
    }
    free(buf);
    if (r == 0 && tmp.dead_after < 0)
        tmp.dead_after = -tmp.dead_after * tmp.heartbeat;
    else if (r == 0)
        tmp.dead_after = spec->dead_after;
    if (r < 0) {
        conf_release(&tmp);
        return r;
    }
    /* Keep the strings not set here. */
#define TAKE(f)                                                                                    \
    do {                                                                                           \
        if (tmp.f != NULL) {                                                                       \
            free(spec->f);                                                                         \
            spec->f = tmp.f;                                                                       \
        }                                                                                          \
        tmp.f = spec->f;                                                                           \
    } while (0)
    TAKE(etcd_user);
    TAKE(etcd_password_file);
    TAKE(etcd_protocol);
    TAKE(etcd_cacert);
    TAKE(etcd_cert);
    TAKE(etcd_key);
    TAKE(etcd_prefix);
#undef TAKE
    if (set_string(&tmp.rdzv_conf, text) < 0)
        return -ENOMEM;
    free(spec->rdzv_conf);
    *spec = tmp;
    return 0;
}

static void release_string(const dl_opt_t *o, void *obj)
{
    char **field = (char **)((char *)obj + o->offset);
    free(*field);
    *field = NULL;
}

static void release_run_id(const dl_opt_t *o, void *obj)
{
    free(SPEC(obj)->run_id);
    SPEC(obj)->run_id = NULL;
}

static void release_conf(const dl_opt_t *o, void *obj)
{
    conf_release(obj);
    free(SPEC(obj)->rdzv_conf);
    SPEC(obj)->rdzv_conf = NULL;
    SPEC(obj)->etcd_user = SPEC(obj)->etcd_password_file = SPEC(obj)->etcd_protocol = NULL;
    SPEC(obj)->etcd_cacert = SPEC(obj)->etcd_cert = SPEC(obj)->etcd_key = NULL;
    SPEC(obj)->etcd_prefix = NULL;
}

static const dl_opt_type_t t_nodes = {"N or MIN:MAX", parse_nodes, NULL, false};
static const dl_opt_type_t t_gpus = {"a count or auto", parse_gpus, NULL, false};
static const dl_opt_type_t t_nproc = {"a count, auto, cpu, gpu or xpu", parse_nproc, NULL, false};
static const dl_opt_type_t t_run_id = {"a run id", parse_run_id, release_run_id, false};
static const dl_opt_type_t t_std = {"a std spec", parse_std, release_string, false};
static const dl_opt_type_t t_ranks = {"a list of local ranks", parse_rank_list, release_string,
                                      false};
static const dl_opt_type_t t_signals = {"a list of signals", parse_signals, release_string, false};
static const dl_opt_type_t t_forward = {"a list of signals, or none", parse_forward_signals,
                                        release_string, false};
static const dl_opt_type_t t_conf = {"KEY=VALUE,...", parse_rdzv_conf, release_conf, false};

/* A word of choices[], kept as the word itself. */
static int parse_word(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    for (int i = 0; o->choices[i] != NULL; i++)
        if (strcmp(text, o->choices[i]) == 0)
            return set_string((char **)((char *)obj + o->offset), text);
    size_t off = (size_t)snprintf(why, whylen, "is not one of ");
    for (int i = 0; o->choices[i] != NULL && off < whylen; i++)
        off += (size_t)snprintf(why + off, whylen - off, "%s%s", i ? ", " : "", o->choices[i]);
    return -EINVAL;
}

static const dl_opt_type_t t_word = {"one of the choices", parse_word, release_string, false};
static const char *const straggler_actions[] = {"warn", "exclude", "off", NULL};
static const char *const recoveries[] = {"restart", "in-job", NULL};

static const char *const backends[] = {"c10d", "static", "etcd", "etcd-v2", NULL};
static const char *const start_methods[] = {"spawn", "fork", "forkserver", NULL};
static const char *const numa_modes[] = {"auto",      "none",         "node", "socket",
                                         "exclusive", "core-complex", NULL};

/* ---- The table ------------------------------------------------------------------------------ */

#define INT_OPT &dl_opt_int
#define DBL &dl_opt_double
#define STR &dl_opt_string
#define BOOL &dl_opt_bool

const dl_opt_t dl__options[] = {
    /* What and how many. */
    {"nodes", "nnodes", 0, &t_nodes, 0, 1, 1e6, NULL, "1", "N|MIN:MAX",
     "number of nodes, or an elastic range (default 1)", DL_OPT_PET | DL_OPT_MARKS, OFF(nodes_set)},
    {"gpus-per-node", NULL, 0, &t_gpus, 0, 1, 4096, NULL, "auto", "N|auto",
     "workers per node, one per GPU; auto = one per GPU found, else 1 (default auto)", DL_OPT_MARKS,
     OFF(gpus_set)},
    {"nproc-per-node", NULL, 0, &t_nproc, 0, 1, 4096, NULL, NULL, "N|auto|cpu|gpu",
     "torchrun's count of workers per node: auto = GPUs found, else usable CPUs; cpu = usable "
     "CPUs (the affinity mask, lowered to the cgroup's CPU quota rounded down, at least 1); "
     "gpu = GPUs found (an error if none)",
     DL_OPT_PET | DL_OPT_MARKS, OFF(gpus_set)},
    {"max-restarts", NULL, 0, INT_OPT, OFF(max_restarts), 0, 1e6, NULL, "0", "N",
     "restarts of the whole job after a worker fails (default 0)", DL_OPT_PET, 0},
    {"max-same-failures", NULL, 0, INT_OPT, OFF(max_same_failures), 0, 1e6, NULL, "3", "N",
     "end the job (exit 5: do not requeue) once this many attempts in a row failed the same way "
     "(same rank, same exit code or signal) with no worker past the step the last one reached "
     "(default 3; 0: never)",
     0, 0},
    {"run-id", "rdzv-id", 0, &t_run_id, 0, 0, 0, NULL, NULL, "ID",
     "job name, shared by its nodes; names the log folder (default: made up)", DL_OPT_PET, 0},
    {"log-dir", NULL, 0, STR, OFF(log_dir), 0, 0, NULL, NULL, "DIR",
     "where LOGDIR/RUN_ID/attempt_K/rank_N.{out,err} go (default dlaunch_logs)", DL_OPT_PET, 0},
    {"events", NULL, 0, STR, OFF(events), 0, 0, NULL, NULL, "FILE|-",
     "write one JSON object per line for every state change", 0, 0},
    {"stop-timeout", "shutdown-timeout", 0, DBL, OFF(stop_timeout), 0, 86400, NULL, "10", "SEC",
     "grace between SIGTERM and SIGKILL when stopping workers (default 10)", 0, 0},
    {"recovery", NULL, 0, &t_word, OFF(recovery), 0, 0, recoveries, NULL, "restart|in-job",
     "what a failed or hung worker costs: restart stops every worker and restarts the job from "
     "its last checkpoint; in-job keeps the others alive, starts a replacement that takes the "
     "state from a living replica, and falls back to a restart when it cannot "
     "(docs/recovery.md; default in-job for the bundled trainer, restart for any other command)",
     0, 0},
    {"spares", NULL, 0, INT_OPT, OFF(spares), 0, 64, NULL, "0", "N",
     "with --recovery in-job: N extra workers per node, started once every worker said hello, "
     "that load the program and wait; a failed rank's place goes to one of them at once and "
     "another is started behind it (docs/recovery.md; default 0)",
     0, 0},
    {"health-timeout", NULL, 0, DBL, OFF(health_timeout), 0, 86400, NULL, "0", "SEC",
     "a worker that beat on DLAUNCH_HEALTH_FD and then fell silent this long is hung: it is "
     "killed and the job restarts (default 0: off)",
     0, 0},
    {"dry-run", NULL, 0, BOOL, OFF(dry_run), 0, 0, NULL, NULL, NULL,
     "print the plan (ranks, environment, commands) and exit", DL_OPT_FLAG, 0},
    {"quiet", NULL, 'q', BOOL, OFF(quiet), 0, 0, NULL, NULL, NULL,
     "do not echo worker output (it still goes to the log files)", DL_OPT_FLAG, 0},
    {"verbose", NULL, 'v', BOOL, OFF(verbose), 0, 0, NULL, NULL, NULL,
     "report every worker start and exit on stderr", DL_OPT_FLAG, 0},

    /* The rendezvous. */
    {"rdzv-backend", NULL, 0, &dl_opt_enum, OFF(rdzv_backend), 0, 0, backends, "c10d",
     "c10d|static|etcd",
     "c10d: our rendezvous at --rdzv-endpoint; static: --master-addr/--master-port with a fixed "
     "--node-rank; etcd: an etcd v3 cluster (default c10d)",
     DL_OPT_PET, 0},
    {"rdzv-endpoint", NULL, 0, STR, OFF(rdzv_endpoint), 0, 0, NULL, NULL, "HOST:PORT",
     "the rendezvous of a job over several nodes; the agent that can bind it hosts it", DL_OPT_PET,
     0},
    {"rdzv-conf", NULL, 0, &t_conf, 0, 0, 0, NULL, NULL, "K=V,...",
     "rendezvous settings: join_timeout, last_call_timeout, close_timeout, timeout, "
     "read_timeout, is_host, store (agent: the agent serves torch's store, the default; worker: "
     "rank 0 does), keep_alive_interval, keep_alive_max_attempt, heartbeat_timeout, store_type; "
     "for etcd also user, password_file, protocol, cacert, cert, key, "
     "prefix",
     DL_OPT_PET, 0},
    {"duplicate-stdout-filters", NULL, 0, STR, OFF(duplicate_stdout_filters), 0, 0, NULL, NULL,
     "A,B", "copy console stdout lines that contain A or B to attempt_K/filtered_stdout.log",
     DL_OPT_PET, 0},
    {"duplicate-stderr-filters", NULL, 0, STR, OFF(duplicate_stderr_filters), 0, 0, NULL, NULL,
     "A,B", "copy console stderr lines that contain A or B to attempt_K/filtered_stderr.log",
     DL_OPT_PET, 0},
    {"merge-output", NULL, 0, BOOL, OFF(merge_output), 0, 0, NULL, NULL, NULL,
     "print a console line that several ranks print within --merge-window once, with its ranks "
     "([ranks 0-7] ...); the log files keep every rank's lines",
     DL_OPT_FLAG, 0},
    {"merge-window", NULL, 0, DBL, OFF(merge_window), 0.001, 60, NULL, "0.1", "SEC",
     "with --merge-output: how long a line waits for the same line from other ranks; a busy "
     "machine may start some ranks' lines later than that (default 0.1)",
     0, 0},
    {"virtual-local-rank", NULL, 0, BOOL, OFF(virtual_local_rank), 0, 0, NULL, NULL, NULL,
     "every worker sees LOCAL_RANK=0 and, in CUDA_VISIBLE_DEVICES, only its own device",
     DL_OPT_FLAG | DL_OPT_PET, 0},
    {"standalone", NULL, 0, BOOL, OFF(standalone), 0, 0, NULL, NULL, NULL,
     "one node with a rendezvous of its own on a free port (the rdzv options are ignored)",
     DL_OPT_FLAG | DL_OPT_PET, 0},
    {"node-rank", NULL, 0, INT_OPT, OFF(node_rank), 0, 1e6, NULL, NULL, "N",
     "this node's rank (default: the rendezvous decides; 0 hosts the rendezvous)", DL_OPT_PET, 0},
    {"master-addr", NULL, 0, STR, OFF(master_addr), 0, 0, NULL, NULL, "ADDR",
     "static backend: node 0's address (default 127.0.0.1)", DL_OPT_PET, 0},
    {"master-port", NULL, 0, INT_OPT, OFF(master_port), 1, 65535, NULL, NULL, "PORT",
     "static backend: node 0's port; one node: the workers' MASTER_PORT (default: a free one)",
     DL_OPT_PET, 0},
    {"local-addr", NULL, 0, STR, OFF(local_addr), 0, 0, NULL, NULL, "ADDR",
     "the address this node advertises to the others, and whose interface its workers bind "
     "(default: the one that reaches the rendezvous)",
     DL_OPT_PET, 0},
    {"join-timeout", NULL, 0, DBL, OFF(join_timeout), 0.1, 86400, NULL, "600", "SEC",
     "give up (exit 3) when the nodes have not gathered by then (default 600)", 0, 0},
    {"last-call", NULL, 0, DBL, OFF(last_call), 0, 86400, NULL, "5", "SEC",
     "with --nodes MIN:MAX, wait this long for more nodes once MIN joined (default 5)", 0, 0},
    {"heartbeat", NULL, 0, DBL, OFF(heartbeat), 0.01, 3600, NULL, "1", "SEC",
     "seconds between heartbeats to the rendezvous (default 1)", 0, 0},
    {"dead-after", NULL, 0, DBL, OFF(dead_after), 0.05, 86400, NULL, "5", "SEC",
     "a node silent this long is dead and the job restarts without it (default 5)", 0, 0},
    {"token-file", NULL, 0, STR, OFF(token_file), 0, 0, NULL, NULL, "FILE",
     "the job token (mode 0600) proving agents and workers belong to the job", 0, 0},
    {"straggler-action", NULL, 0, &t_word, OFF(straggler_action), 0, 0, straggler_actions, "warn",
     "warn|exclude|off",
     "what to do about a rank slower than the others: name it (warn), or with --nodes MIN:MAX "
     "also drop its node from the job for --straggler-cooldown (exclude) (default warn)",
     0, 0},
    {"straggler-threshold", NULL, 0, DBL, OFF(straggler_threshold), 0.01, 100, NULL, "0.3", "F",
     "a straggler's compute time a step exceeds the median by this fraction (default 0.3)", 0, 0},
    {"straggler-window", NULL, 0, INT_OPT, OFF(straggler_window), 1, 1e9, NULL, "100", "STEPS",
     "... summed over this many steps, and 3 reports at least (default 100)", 0, 0},
    {"straggler-cooldown", NULL, 0, DBL, OFF(straggler_cooldown), 0, 1e7, NULL, "300", "SEC",
     "an excluded node joins the job again after this long (default 300)", 0, 0},
    {"http", NULL, 0, STR, OFF(http), 0, 0, NULL, NULL, "ADDR:PORT",
     "the node that hosts the rendezvous serves metrics, a status page and JSON there "
     "(docs/operations.md); not loopback: requests need the job token",
     0, 0},

    /* What runs, as torchrun says it. */
    {"role", NULL, 0, STR, OFF(role), 0, 0, NULL, "default", "NAME",
     "the workers' ROLE_NAME (default 'default')", DL_OPT_PET, 0},
    {"module", NULL, 'm', BOOL, OFF(module), 0, 0, NULL, NULL, NULL,
     "the script is a Python module: python3 -u -m SCRIPT", DL_OPT_FLAG | DL_OPT_PET, 0},
    {"no-python", NULL, 0, BOOL, OFF(no_python), 0, 0, NULL, NULL, NULL,
     "run the script as a program, not through python3", DL_OPT_FLAG | DL_OPT_PET, 0},
    {"run-path", NULL, 0, BOOL, OFF(run_path), 0, 0, NULL, NULL, NULL,
     "run the script by its path with python3 (wins over --no-python)", DL_OPT_FLAG | DL_OPT_PET,
     0},
    {"redirects", NULL, 'r', &t_std, OFF(redirects), 0, 0, NULL, NULL, "0-3|R:N,...",
     "streams kept from the console (1 stdout, 2 stderr, 3 both; per local rank as 0:1,1:2); "
     "the log files keep everything",
     DL_OPT_PET, 0},
    {"tee", NULL, 't', &t_std, OFF(tee), 0, 0, NULL, NULL, "0-3|R:N,...",
     "streams shown on the console even when redirected (same form)", DL_OPT_PET, 0},
    {"local-ranks-filter", NULL, 0, &t_ranks, OFF(local_ranks_filter), 0, 0, NULL, NULL, "R,...",
     "show only these local ranks on the console (the log files keep every rank)", DL_OPT_PET, 0},
    {"signals-to-handle", NULL, 0, &t_signals, OFF(signals), 0, 0, NULL, DL_DEFAULT_SIGNALS,
     "SIG,...",
     "signals that stop the job: sent on to the workers, which are then stopped (default "
     "SIGTERM,SIGINT,SIGHUP,SIGQUIT)",
     DL_OPT_PET, 0},
    {"forward-signals", NULL, 0, &t_forward, OFF(forward_signals), 0, 0, NULL, NULL, "SIG,...|none",
     "signals passed on to every worker while the job goes on, such as a scheduler's warning "
     "before a time limit or preemption (default SIGUSR1,SIGUSR2 under Slurm, none elsewhere; "
     "SIGUSR1's rank report then moves to `dlaunch status --ranks`)",
     0, 0},
    {"monitor-interval", NULL, 0, DBL, OFF(monitor_interval), 0, 86400, NULL, "0.1", "SEC",
     "accepted for torchrun's sake: workers are watched by events, not polled", DL_OPT_PET, 0},
    {"start-method", NULL, 0, &dl_opt_enum, OFF(start_method), 0, 0, start_methods, "spawn",
     "spawn|fork|forkserver",
     "accepted for torchrun's sake: workers are always new processes (fork and exec)", DL_OPT_PET,
     0},
    {"numa-binding", NULL, 0, &dl_opt_enum, OFF(numa_binding), 0, 0, numa_modes, "auto",
     "auto|none|node|socket|exclusive|core-complex",
     "bind each worker near its GPU (local rank i: GPU i): its NUMA node's CPUs (node), its "
     "socket's (socket), a share of the node's cores (exclusive) or one L3 cache group "
     "(core-complex), memory preferred on that node; auto binds by node when the workers are "
     "as many as the GPUs, none never binds",
     DL_OPT_PET, 0},
    {"logs-specs", NULL, 0, STR, OFF(logs_specs), 0, 0, NULL, NULL, "NAME",
     "accepted and ignored, with a warning (torchrun's logging plug-ins)",
     DL_OPT_PET | DL_OPT_IGNORED, 0},
    {"event-log-handler", NULL, 0, STR, OFF(event_log_handler), 0, 0, NULL, NULL, "NAME",
     "accepted and ignored, with a warning (see --events for ours)", DL_OPT_PET | DL_OPT_IGNORED,
     0},
};
const size_t dl__options_count = sizeof(dl__options) / sizeof(dl__options[0]);

/* DLAUNCH_* variables that are no options here but are read by dlaunch, its control commands
 * (DLAUNCH_ENDPOINT), its workers, the trainer (DLAUNCH_TRAIN_*, its own table) and the
 * collective library; DLAUNCH_PLUGIN_DIR by the plugin loader (plugin/plugin.h). */
static const char *const other_vars[] = {
    "DLAUNCH_TOKEN",      "DLAUNCH_TOKEN_FILE",    "DLAUNCH_ENDPOINT",
    "DLAUNCH_NO_SLURM",   "DLAUNCH_NO_KUBERNETES", "DLAUNCH_STORE",
    "DLAUNCH_HEALTH_FD",  "DLAUNCH_ATTEMPT_DIR",   "DLAUNCH_VERBOSE",
    "DLAUNCH_TRAIN_*",    "DLAUNCH_COLL_*",        "DLAUNCH_SOCKET_IFNAME",
    "DLAUNCH_CONTROL_FD", "DLAUNCH_GROUP_GEN",     "DLAUNCH_SPARE",
    "DLAUNCH_SYSFS_ROOT", "DLAUNCH_PLUGIN_DIR",    NULL,
};

const dl_opt_table_t *dl_config_options(void)
{
    return &dl__job_table;
}

const dl_opt_table_t dl__job_table = {dl__options, sizeof(dl__options) / sizeof(dl__options[0]),
                                      "DLAUNCH_", other_vars, true};

void dl_config_unknown_vars(char *const *envp,
                            void (*warn)(void *ctx, const char *var, const char *closest),
                            void *ctx)
{
    dl_opt_unknown_vars(&dl__job_table, envp, warn, ctx);
}

/* ---- The spec ------------------------------------------------------------------------------- */

void dl__strv_free(char **v)
{
    if (v == NULL)
        return;
    for (char **p = v; *p != NULL; p++)
        free(*p);
    free(v);
}

void dl_job_spec_init(dl_job_spec_t *spec)
{
    char err[DL_CONFIG_ERRLEN];

    memset(spec, 0, sizeof(*spec));
    spec->node_rank = -1;
    spec->master_port = -1;
    spec->is_host = -1;
    spec->read_timeout = 60.0;
    spec->close_timeout = 30.0;
    /* The table's defaults are its own; a failure here is a bug in the table. */
    if (dl_opt_defaults(&dl__job_table, spec, err, sizeof(err)) < 0)
        abort();
}

void dl_job_spec_free(dl_job_spec_t *spec)
{
    if (spec == NULL)
        return;
    dl_opt_release(&dl__job_table, spec);
    free(spec->spec_path);
    free(spec->python_exec);
    dl__strv_free(spec->command);
    dl__strv_free(spec->env);
    dl__strv_free(spec->train);
    dl__strv_free(spec->train_where);
    dl__strv_free(spec->train_key_where);
    dl_job_spec_init(spec);
}

const char *dl_forward_signals(const dl_job_spec_t *spec, char *const *envp)
{
    const char *no_slurm = dl_env_get(envp, "DLAUNCH_NO_SLURM");
    bool slurm = dl_env_get(envp, "SLURM_JOB_ID") != NULL || dl_env_get(envp, "SLURM_JOBID");

    if (spec->forward_signals != NULL)
        return strcmp(spec->forward_signals, "none") == 0 ? "" : spec->forward_signals;
    return slurm && (no_slurm == NULL || *no_slurm == '\0') ? DL_SLURM_FORWARD_SIGNALS : "";
}

typedef struct {
    const char *stop_list;
    int clash; /* the first signal in both lists, or 0 */
} clash_t;

static void note_in_stop_list(void *ctx, int sig)
{
    clash_t *c = ctx;
    if (c->clash == sig)
        c->clash = -sig; /* found: negative until the next one is looked up */
}

static void look_up_forwarded(void *ctx, int sig)
{
    clash_t *c = ctx;
    char bad[64];
    if (c->clash < 0)
        return;
    c->clash = sig;
    dl_signal_list_each(c->stop_list, note_in_stop_list, c, bad, sizeof(bad));
    if (c->clash > 0)
        c->clash = 0;
}

int dl__signals_check(const dl_job_spec_t *spec, char *err, size_t errlen)
{
    clash_t c = {spec->signals != NULL ? spec->signals : DL_DEFAULT_SIGNALS, 0};
    char bad[64];

    /* Only an explicit --forward-signals can clash: Slurm's default gives way to the stop list. */
    if (spec->forward_signals == NULL || strcmp(spec->forward_signals, "none") == 0)
        return 0;
    dl_signal_list_each(spec->forward_signals, look_up_forwarded, &c, bad, sizeof(bad));
    if (c.clash == 0)
        return 0;
    const char *name = sigabbrev_np(-c.clash);
    snprintf(err, errlen,
             "--forward-signals %s: SIG%s also stops the job (--signals-to-handle "
             "%s); name it in one list only",
             spec->forward_signals, name != NULL ? name : "?", c.stop_list);
    return -EINVAL;
}
