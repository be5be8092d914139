/* Group options: defaults, and the launcher's environment read over them with checked parsing. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern char **environ;

/* Defaults come from bench/allreduce runs on a 2-core machine (docs/performance.md, "All-reduce":
 * the switch points and chunk sizes were measured, not guessed). */
#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_TCP_SMALL (256 << 10)
#define DEFAULT_SHM_CHUNK (512 << 10)
#define DEFAULT_TCP_CHUNK (1 << 20)
#define DEFAULT_SPIN_US 1000
#define DEFAULT_RECORDER_TIMED (64 << 10)
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
    o->timeout_ms = DEFAULT_TIMEOUT_MS;
    o->shm_small_bytes = DL_COLL_SMALL_AUTO;
    o->tcp_small_bytes = DEFAULT_TCP_SMALL;
    o->shm_chunk_bytes = DEFAULT_SHM_CHUNK;
    o->tcp_chunk_bytes = DEFAULT_TCP_CHUNK;
    o->spin_us = DEFAULT_SPIN_US;
    o->recorder = 1;
    o->recorder_timed_bytes = DEFAULT_RECORDER_TIMED;
}

const char *dl__coll_transport_str(dl_coll_transport_t t)
{
    switch (t) {
    case DL_COLL_TRANSPORT_TCP:
        return "tcp";
    case DL_COLL_TRANSPORT_SHM:
        return "shm";
    default:
        return "auto";
    }
}

const char *dl__coll_algo_str(dl_coll_algo_t a)
{
    switch (a) {
    case DL_COLL_ALGO_LATENCY:
        return "latency";
    case DL_COLL_ALGO_BANDWIDTH:
        return "bandwidth";
    default:
        return "auto";
    }
}

static const char *env_get(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

static int parse_long(const char *s, long min, long max, long *ret)
{
    if (s == NULL || *s == '\0')
        return -EINVAL;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -EINVAL;
    *ret = v;
    return 0;
}

/* "65536", "64K", "4M", "1G" (binary multiples). */
static int parse_bytes(const char *s, size_t min, size_t max, size_t *ret)
{
    if (s == NULL || *s < '0' || *s > '9')
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
    if (v < min || v > max)
        return -EINVAL;
    *ret = (size_t)v;
    return 0;
}

static int parse_small(const char *s, size_t *ret)
{
    if (strcmp(s, "auto") == 0) {
        *ret = DL_COLL_SMALL_AUTO;
        return 0;
    }
    return parse_bytes(s, 0, MAX_CHUNK, ret);
}

static int parse_seconds_ms(const char *s, int *ret_ms)
{
    if (s == NULL || *s == '\0')
        return -EINVAL;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v) || v <= 0 || v > 86400.0 * 7)
        return -EINVAL;
    int ms = (int)ceil(v * 1000.0);
    *ret_ms = ms < 1 ? 1 : ms;
    return 0;
}

static int copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        return -EINVAL;
    memcpy(dst, src, n + 1);
    return 0;
}

static int apply_int(const char *v, long min, long max, int *field)
{
    long x;
    int r = parse_long(v, min, max, &x);
    if (r == 0)
        *field = (int)x;
    return r;
}

int dl_coll_options_from_env(dl_coll_options_t *opts, char **envp, char *err, size_t errlen)
{
    if (envp == NULL)
        envp = environ;
    dl_coll_options_t o = *opts;
    const char *bad = NULL, *v;
    const char *why = "";

    if ((v = env_get(envp, "WORLD_SIZE")) != NULL && apply_int(v, 1, 1 << 24, &o.world_size) < 0)
        bad = "WORLD_SIZE", why = "an integer from 1";
    else if ((v = env_get(envp, "RANK")) != NULL && apply_int(v, 0, INT_MAX, &o.rank) < 0)
        bad = "RANK", why = "an integer from 0";
    else if ((v = env_get(envp, "LOCAL_RANK")) != NULL &&
             apply_int(v, 0, INT_MAX, &o.local_rank) < 0)
        bad = "LOCAL_RANK", why = "an integer from 0";
    else if ((v = env_get(envp, "LOCAL_WORLD_SIZE")) != NULL &&
             apply_int(v, 1, INT_MAX, &o.local_world_size) < 0)
        bad = "LOCAL_WORLD_SIZE", why = "an integer from 1";
    else if ((v = env_get(envp, "MASTER_ADDR")) != NULL &&
             (*v == '\0' || copy_str(o.master_addr, sizeof(o.master_addr), v) < 0))
        bad = "MASTER_ADDR", why = "a host name or address";
    else if ((v = env_get(envp, "MASTER_PORT")) != NULL &&
             apply_int(v, 1, 65535, &o.master_port) < 0)
        bad = "MASTER_PORT", why = "a port from 1 to 65535";
    else if ((v = env_get(envp, "TORCHELASTIC_RUN_ID")) != NULL &&
             copy_str(o.run_id, sizeof(o.run_id), v) < 0)
        bad = "TORCHELASTIC_RUN_ID", why = "at most 127 characters";
    else if ((v = env_get(envp, "DLAUNCH_STORE")) != NULL &&
             copy_str(o.store, sizeof(o.store), v) < 0)
        bad = "DLAUNCH_STORE", why = "HOST:PORT";
    else if ((v = env_get(envp, "DLAUNCH_TOKEN_FILE")) != NULL &&
             copy_str(o.token_file, sizeof(o.token_file), v) < 0)
        bad = "DLAUNCH_TOKEN_FILE", why = "a path";
    else if ((v = env_get(envp, "DLAUNCH_COLL_HOST_ID")) != NULL &&
             copy_str(o.host_id, sizeof(o.host_id), v) < 0)
        bad = "DLAUNCH_COLL_HOST_ID", why = "at most 127 characters";
    else if ((v = env_get(envp, "DLAUNCH_COLL_TIMEOUT")) != NULL &&
             parse_seconds_ms(v, &o.timeout_ms) < 0)
        bad = "DLAUNCH_COLL_TIMEOUT", why = "seconds, more than 0";
    else if ((v = env_get(envp, "DLAUNCH_COLL_SHM_SMALL")) != NULL &&
             parse_small(v, &o.shm_small_bytes) < 0)
        bad = "DLAUNCH_COLL_SHM_SMALL", why = "auto or a byte count such as 65536 or 64K";
    else if ((v = env_get(envp, "DLAUNCH_COLL_TCP_SMALL")) != NULL &&
             parse_bytes(v, 0, SIZE_MAX >> 1, &o.tcp_small_bytes) < 0)
        bad = "DLAUNCH_COLL_TCP_SMALL", why = "a byte count such as 65536 or 64K";
    else if ((v = env_get(envp, "DLAUNCH_COLL_SHM_CHUNK")) != NULL &&
             parse_bytes(v, 4096, MAX_CHUNK, &o.shm_chunk_bytes) < 0)
        bad = "DLAUNCH_COLL_SHM_CHUNK", why = "a byte count from 4K to 1G";
    else if ((v = env_get(envp, "DLAUNCH_COLL_TCP_CHUNK")) != NULL &&
             parse_bytes(v, 4096, MAX_CHUNK, &o.tcp_chunk_bytes) < 0)
        bad = "DLAUNCH_COLL_TCP_CHUNK", why = "a byte count from 4K to 1G";
    else if ((v = env_get(envp, "DLAUNCH_COLL_SPIN_US")) != NULL &&
             apply_int(v, 0, 10000000, &o.spin_us) < 0)
        bad = "DLAUNCH_COLL_SPIN_US", why = "microseconds from 0 to 10000000";
    else if ((v = env_get(envp, "DLAUNCH_COLL_RECORDER_TIMED")) != NULL &&
             parse_bytes(v, 0, SIZE_MAX >> 1, &o.recorder_timed_bytes) < 0)
        bad = "DLAUNCH_COLL_RECORDER_TIMED", why = "a byte count such as 0 or 64K";

    if (bad == NULL && (v = env_get(envp, "DLAUNCH_COLL_TRANSPORT")) != NULL) {
        if (strcmp(v, "auto") == 0 || *v == '\0')
            o.transport = DL_COLL_TRANSPORT_AUTO;
        else if (strcmp(v, "tcp") == 0)
            o.transport = DL_COLL_TRANSPORT_TCP;
        else if (strcmp(v, "shm") == 0)
            o.transport = DL_COLL_TRANSPORT_SHM;
        else
            bad = "DLAUNCH_COLL_TRANSPORT", why = "auto, tcp or shm";
    }
    if (bad == NULL && (v = env_get(envp, "DLAUNCH_COLL_ALGO")) != NULL) {
        if (strcmp(v, "auto") == 0 || *v == '\0')
            o.algo = DL_COLL_ALGO_AUTO;
        else if (strcmp(v, "latency") == 0)
            o.algo = DL_COLL_ALGO_LATENCY;
        else if (strcmp(v, "bandwidth") == 0)
            o.algo = DL_COLL_ALGO_BANDWIDTH;
        else
            bad = "DLAUNCH_COLL_ALGO", why = "auto, latency or bandwidth";
    }
    if (bad == NULL) {
        /* auto: where the agent looks for it, DLAUNCH_ATTEMPT_DIR/rank_R.rec. */
        const char *dir = env_get(envp, "DLAUNCH_ATTEMPT_DIR");
        v = env_get(envp, "DLAUNCH_COLL_RECORDER");
        o.recorder = v == NULL || strcmp(v, "off") != 0;
        o.recorder_path[0] = '\0';
        if (v != NULL && *v != '\0' && strcmp(v, "auto") != 0 && strcmp(v, "off") != 0) {
            if (copy_str(o.recorder_path, sizeof(o.recorder_path), v) < 0)
                bad = "DLAUNCH_COLL_RECORDER", why = "auto, off or a file name";
        } else if (o.recorder && dir != NULL && *dir != '\0' &&
                   (size_t)snprintf(o.recorder_path, sizeof(o.recorder_path), "%s/rank_%d.rec",
                                    dir, o.rank) >= sizeof(o.recorder_path)) {
            o.recorder_path[0] = '\0'; /* a folder name this long gets no file */
        }
    }
    if (bad != NULL) {
        snprintf(err, errlen, "environment %s='%s': expected %s", bad, v, why);
        return -EINVAL;
    }
    o.token = env_get(envp, "DLAUNCH_TOKEN");
    if (o.rank >= o.world_size) {
        snprintf(err, errlen, "environment RANK=%d: not below WORLD_SIZE=%d", o.rank, o.world_size);
        return -EINVAL;
    }
    *opts = o;
    return 0;
}
