/* Group options: defaults, and the launcher's environment read over them with checked parsing. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "internal.h"
#include "opt.h"

extern char **environ;

/* Defaults come from bench/allreduce runs on a 2-core machine (docs/performance.md, "All-reduce":
 * the switch points and chunk sizes were measured, not guessed). */
#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_TCP_SMALL (256 << 10)
#define DEFAULT_SHM_CHUNK (512 << 10)
#define DEFAULT_TCP_CHUNK (1 << 20)
#define DEFAULT_SPIN_US 1000
#define DEFAULT_RECORDER_TIMED (64 << 10)
/* Two ranks read malloc'd buffers in place from here. With inputs written just before the call
 * (gradients) and the pair form copying into the slot the other member did not just read,
 * copying is faster up to 96 KiB (64 KiB: 8.1 against 8.9-9.1 us; 96 KiB: 11.6-11.7 against
 * 12.1-13.1), even at 112 KiB and slower from 128 KiB (15.7-16.2 against 13.6-13.7; issue #27,
 * docs/performance.md, "The slot the other has just read"). */
#define DEFAULT_ADOPT_MIN (128 << 10)
#define MAX_CHUNK ((size_t)1 << 30)

void dl_coll_options_init(dl_coll_options_t *o)
{
    memset(o, 0, sizeof(*o));
    o->rank = 0;
    o->world_size = 1;
    o->local_rank = 0;
    o->local_world_size = 1;
    o->master_port = -1;
    o->transport = DL_COLL_TRANSPORT_AUTO;
    o->algo = DL_COLL_ALGO_AUTO;
    o->order = DL_COLL_ORDER_RANK;
    o->timeout_ms = DEFAULT_TIMEOUT_MS;
    o->shm_small_bytes = DL_COLL_SMALL_AUTO;
    o->tcp_small_bytes = DEFAULT_TCP_SMALL;
    o->shm_chunk_bytes = DEFAULT_SHM_CHUNK;
    o->tcp_chunk_bytes = DEFAULT_TCP_CHUNK;
    o->spin_us = DEFAULT_SPIN_US;
    o->recorder = 1;
    o->recorder_timed_bytes = DEFAULT_RECORDER_TIMED;
    o->adopt_min_bytes = DEFAULT_ADOPT_MIN;
}

const char *dl__coll_transport_str(dl_coll_transport_t t)
{
    switch (t) {
    case DL_COLL_TRANSPORT_TCP: return "tcp";
    case DL_COLL_TRANSPORT_SHM: return "shm";
    default: return "auto";
    }
}

const char *dl__coll_algo_str(dl_coll_algo_t a)
{
    switch (a) {
    case DL_COLL_ALGO_LATENCY: return "latency";
    case DL_COLL_ALGO_BANDWIDTH: return "bandwidth";
    default: return "auto";
    }
}

/* ---- The variables, as one table of the option engine (config/opt.h) ------------------------ */

/* A string into a fixed array: its capacity rides in the entry's max. */
static int parse_text(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    size_t n = strlen(text), cap = (size_t)o->max;
    if (n == 0 || n >= cap) {
        snprintf(why, whylen, "is not %s (1 to %zu bytes)", o->metavar, cap - 1);
        return -EINVAL;
    }
    memcpy((char *)obj + o->offset, text, n + 1);
    return 0;
}

/* "65536", "64K", "4M", "1G" (binary multiples) into a size_t within [min, max]. */
static int parse_bytes_text(const char *s, double min, double max, size_t *ret)
{
    if (*s < '0' || *s > '9')
        return -EINVAL;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return -EINVAL;
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    if (shift != 0)
        end++;
    if (*end != '\0' || v > (ULLONG_MAX >> shift))
        return -EINVAL;
    v <<= shift;
    if ((double)v < min || (double)v > max)
        return -ERANGE;
    *ret = (size_t)v;
    return 0;
}

static int parse_bytes(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    size_t v;
    int r = strcmp(text, "auto") == 0 && o->choices != NULL
                ? (v = DL_COLL_SMALL_AUTO, 0)
                : parse_bytes_text(text, o->min, o->max, &v);
    if (r < 0) {
        snprintf(why, whylen, "is not %s", o->metavar);
        return r;
    }
    *(size_t *)((char *)obj + o->offset) = v;
    return 0;
}

static int parse_seconds_ms(const dl_opt_t *o, void *obj, const char *text, char *why,
                            size_t whylen)
{
    double v;
    if (dl_parse_double(text, 0, 86400.0 * 7, &v) < 0 || !(v > 0)) {
        snprintf(why, whylen, "is not a number of seconds above 0 (at most 604800)");
        return -EINVAL;
    }
    int ms = (int)ceil(v * 1000.0);
    *(int *)((char *)obj + o->offset) = ms < 1 ? 1 : ms;
    return 0;
}

/* An enum where the empty word is the first choice (a launcher's way to say "the default"). */
static int parse_choice(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    return dl_opt_enum.parse(o, obj, *text == '\0' ? o->choices[0] : text, why, whylen);
}

/* "off" (0) or a byte count of at least a page. */
static int parse_adopt(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    size_t v = 0;
    if (strcmp(text, "off") != 0 && parse_bytes_text(text, 4096, (double)(SIZE_MAX >> 1), &v) < 0) {
        snprintf(why, whylen, "is not %s", o->metavar);
        return -EINVAL;
    }
    *(size_t *)((char *)obj + o->offset) = v;
    return 0;
}

static const dl_opt_type_t t_text = {"a name", parse_text, NULL, false};
static const dl_opt_type_t t_bytes = {"a byte count", parse_bytes, NULL, false};
static const dl_opt_type_t t_seconds = {"seconds", parse_seconds_ms, NULL, false};
static const dl_opt_type_t t_choice = {"one of the choices", parse_choice, NULL, false};
static const dl_opt_type_t t_adopt = {"off or a byte count", parse_adopt, NULL, false};

static const char *const transports[] = {"auto", "tcp", "shm", NULL};
static const char *const algos[] = {"auto", "latency", "bandwidth", NULL};
static const char *const orders[] = {"rank", "any", NULL};
static const char *const with_auto[] = {"auto", NULL};

#define OFF(f) offsetof(dl_coll_options_t, f)
#define CAP(f) (double)sizeof(((dl_coll_options_t *)0)->f)

/* Names are the variables themselves (the table's prefix is empty): torchrun's, then ours. */
static const dl_opt_t vars[] = {
    {"world-size", NULL, 0, &dl_opt_int, OFF(world_size), 1, 1 << 24, NULL, NULL, "N",
     "ranks in the group", 0, 0},
    {"rank", NULL, 0, &dl_opt_int, OFF(rank), 0, INT_MAX, NULL, NULL, "N", "this rank", 0, 0},
    {"local-rank", NULL, 0, &dl_opt_int, OFF(local_rank), 0, INT_MAX, NULL, NULL, "N",
     "this rank on its host", 0, 0},
    {"local-world-size", NULL, 0, &dl_opt_int, OFF(local_world_size), 1, INT_MAX, NULL, NULL, "N",
     "ranks on this host", 0, 0},
    {"master-addr", NULL, 0, &t_text, OFF(master_addr), 0, CAP(master_addr), NULL, NULL,
     "a host name or address", "where rank 0 hosts the bootstrap", 0, 0},
    {"master-port", NULL, 0, &dl_opt_int, OFF(master_port), 1, 65535, NULL, NULL, "PORT",
     "its port", 0, 0},
    {"torchelastic-run-id", NULL, 0, &t_text, OFF(run_id), 0, CAP(run_id), NULL, NULL, "a run id",
     "keeps jobs apart", 0, 0},
    {"dlaunch-store", NULL, 0, &t_text, OFF(store), 0, CAP(store), NULL, NULL, "HOST:PORT",
     "the job's key-value store, where ranks meet", 0, 0},
    {"dlaunch-token-file", NULL, 0, &t_text, OFF(token_file), 0, CAP(token_file), NULL, NULL,
     "a path", "the job token", 0, 0},
    {"dlaunch-socket-ifname", NULL, 0, &t_text, OFF(ifname), 0, CAP(ifname), NULL, NULL,
     "an interface name", "the interface to listen on", 0, 0},
    {"dlaunch-coll-host-id", NULL, 0, &t_text, OFF(host_id), 0, CAP(host_id), NULL, NULL,
     "a host id", "ranks with the same id share memory", 0, 0},
    {"dlaunch-coll-timeout", NULL, 0, &t_seconds, OFF(timeout_ms), 0, 0, NULL, NULL, "SEC",
     "how long an operation waits for a peer", 0, 0},
    {"dlaunch-coll-shm-small", NULL, 0, &t_bytes, OFF(shm_small_bytes), 0, MAX_CHUNK, with_auto,
     NULL, "auto or a byte count such as 65536 or 64K", "latency algorithm up to this size", 0, 0},
    {"dlaunch-coll-tcp-small", NULL, 0, &t_bytes, OFF(tcp_small_bytes), 0, (double)(SIZE_MAX >> 1),
     NULL, NULL, "a byte count such as 65536 or 64K", "latency algorithm up to this size", 0, 0},
    {"dlaunch-coll-shm-chunk", NULL, 0, &t_bytes, OFF(shm_chunk_bytes), 4096, MAX_CHUNK, NULL, NULL,
     "a byte count from 4K to 1G", "bytes per shared-memory round", 0, 0},
    {"dlaunch-coll-tcp-chunk", NULL, 0, &t_bytes, OFF(tcp_chunk_bytes), 4096, MAX_CHUNK, NULL, NULL,
     "a byte count from 4K to 1G", "receive and reduce granularity", 0, 0},
    {"dlaunch-coll-recorder-timed", NULL, 0, &t_bytes, OFF(recorder_timed_bytes), 0,
     (double)(SIZE_MAX >> 1), NULL, NULL, "a byte count such as 0 or 64K",
     "the flight recorder times operations of this size and above", 0, 0},
    {"dlaunch-coll-adopt-min", NULL, 0, &t_adopt, OFF(adopt_min_bytes), 0, 0, NULL, NULL,
     "off or a byte count of at least 4K such as 1M",
     "two ranks read each other's ordinary buffers of this size in place", 0, 0},
    {"dlaunch-coll-spin-us", NULL, 0, &dl_opt_int, OFF(spin_us), 0, 10000000, NULL, NULL, "US",
     "microseconds to spin before sleeping", 0, 0},
    {"dlaunch-group-gen", NULL, 0, &dl_opt_int, OFF(generation), 0, INT_MAX, NULL, NULL, "N",
     "the group's generation (in-job recovery)", 0, 0},
    {"dlaunch-coll-transport", NULL, 0, &t_choice, OFF(transport), 0, 0, transports, NULL,
     "auto|tcp|shm", "how ranks exchange data", 0, 0},
    {"dlaunch-coll-algo", NULL, 0, &t_choice, OFF(algo), 0, 0, algos, NULL,
     "auto|latency|bandwidth", "which algorithm", 0, 0},
    {"dlaunch-coll-order", NULL, 0, &t_choice, OFF(order), 0, 0, orders, NULL, "rank|any",
     "the reduction order", 0, 0},
};

/* Empty counts as a value here: a launcher that sets WORLD_SIZE to nothing is broken, and the
 * engine's parsers refuse it (the enums take it for their default). */
static const dl_opt_table_t table = {vars, sizeof(vars) / sizeof(vars[0]), "", NULL, false};

int dl_coll_options_from_env(dl_coll_options_t *opts, char **envp, char *err, size_t errlen)
{
    if (envp == NULL)
        envp = environ;
    /* On a copy, so that a bad variable leaves the caller's options as they were. */
    dl_coll_options_t o = *opts;
    int r = dl_opt_from_env(&table, &o, envp, err, errlen);
    if (r < 0)
        return -EINVAL;
    /* The recorder's file: auto, where the agent looks for it (DLAUNCH_ATTEMPT_DIR/rank_R.rec,
     * which needs the rank read above); off; or a file named outright. */
    const char *dir = dl_env_get(envp, "DLAUNCH_ATTEMPT_DIR");
    const char *v = dl_env_get(envp, "DLAUNCH_COLL_RECORDER");
    o.recorder = v == NULL || strcmp(v, "off") != 0;
    o.recorder_path[0] = '\0';
    if (v != NULL && *v != '\0' && strcmp(v, "auto") != 0 && strcmp(v, "off") != 0) {
        if (strlen(v) >= sizeof(o.recorder_path)) {
            snprintf(err, errlen,
                     "DLAUNCH_COLL_RECORDER: not auto, off or a file name of at "
                     "most %zu bytes",
                     sizeof(o.recorder_path) - 1);
            return -EINVAL;
        }
        snprintf(o.recorder_path, sizeof(o.recorder_path), "%s", v);
    } else if (o.recorder && dir != NULL && *dir != '\0' &&
               (size_t)snprintf(o.recorder_path, sizeof(o.recorder_path), "%s/rank_%d.rec", dir,
                                o.rank) >= sizeof(o.recorder_path)) {
        o.recorder_path[0] = '\0'; /* a folder name this long gets no file */
    }
    o.token = dl_env_get(envp, "DLAUNCH_TOKEN");
    if (o.rank >= o.world_size) {
        snprintf(err, errlen, "environment RANK=%d: not below WORLD_SIZE=%d", o.rank, o.world_size);
        return -EINVAL;
    }
    *opts = o;
    return 0;
}
