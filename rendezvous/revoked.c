/* The revocations table (revoked.h): a JSON object of run id -> time, so that the file and the
 * table are one thing. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto.h"
#include "revoked.h"

struct dl__revoked_s {
    json_t *runs; /* run id -> before */
    char *path;   /* NULL: in memory only */
};

void dl__revoked_free(dl__revoked_t *t)
{
    if (t == NULL)
        return;
    json_decref(t->runs);
    free(t->path);
    free(t);
}

/* Checks every entry of a table read from a file. */
static int check_loaded(const json_t *runs, const char *path, char *err, size_t errlen)
{
    const char *run_id;
    json_t *v;

    if (!json_is_object(runs)) {
        snprintf(err, errlen, "revocations file '%s': not a JSON object", path);
        return -EINVAL;
    }
    if (json_object_size(runs) > DL__REVOKED_MAX) {
        snprintf(err, errlen, "revocations file '%s': more than %d run ids", path, DL__REVOKED_MAX);
        return -EINVAL;
    }
    json_object_foreach ((json_t *)runs, run_id, v) {
        char safe[DL_PROTO_RUN_ID_MAX * 4 + 1];
        if (!dl_proto_run_id_valid(run_id)) {
            snprintf(err, errlen, "revocations file '%s': '%s' is not a run id", path,
                     dl_proto_escape(run_id, safe, sizeof(safe)));
            return -EINVAL;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > DL_PROTO_KEY_TIME_MAX) {
            snprintf(err, errlen,
                     "revocations file '%s': run '%s': not a time in Unix seconds from 1 to %lld",
                     path, run_id, (long long)DL_PROTO_KEY_TIME_MAX);
            return -EINVAL;
        }
    }
    return 0;
}

int dl__revoked_new(const char *path, dl__revoked_t **ret, char *err, size_t errlen)
{
    dl__revoked_t *t = calloc(1, sizeof(*t));
    json_error_t jerr;
    int r = 0;

    if (t == NULL)
        return -ENOMEM;
    if (path != NULL && (t->path = strdup(path)) == NULL) {
        free(t);
        return -ENOMEM;
    }
    if (path != NULL && access(path, F_OK) == 0) {
        t->runs = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
        if (t->runs == NULL) {
            r = -EINVAL;
            snprintf(err, errlen, "revocations file '%s': %s (line %d)", path, jerr.text,
                     jerr.line);
        } else {
            r = check_loaded(t->runs, path, err, errlen);
        }
    } else if (path != NULL && errno != ENOENT) {
        r = -errno;
        snprintf(err, errlen, "revocations file '%s': %s", path, strerror(-r));
    } else if ((t->runs = json_object()) == NULL) {
        r = -ENOMEM;
        snprintf(err, errlen, "out of memory");
    }
    if (r < 0) {
        dl__revoked_free(t);
        return r;
    }
    *ret = t;
    return 0;
}

int64_t dl__revoked_before(const dl__revoked_t *t, const char *run_id)
{
    json_t *v = t != NULL && run_id != NULL ? json_object_get(t->runs, run_id) : NULL;
    return v != NULL ? (int64_t)json_integer_value(v) : 0;
}

/* Writes the table to path.new, flushes it to disk, and renames it over path. */
static int save(const dl__revoked_t *t, char *err, size_t errlen)
{
    char tmp[4200];
    int fd, r = 0;

    if (snprintf(tmp, sizeof(tmp), "%s.new", t->path) >= (int)sizeof(tmp)) {
        snprintf(err, errlen, "revocations file '%s': the name is too long", t->path);
        return -ENAMETOOLONG;
    }
    char *text = json_dumps(t->runs, JSON_SORT_KEYS | JSON_INDENT(1));
    if (text == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    size_t len = strlen(text);
    errno = 0;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len || write(fd, "\n", 1) != 1 ||
        fsync(fd) < 0 || rename(tmp, t->path) < 0) {
        r = errno != 0 ? -errno : -EIO;
        snprintf(err, errlen, "revocations file '%s': cannot write it: %s", t->path, strerror(-r));
        if (fd >= 0)
            unlink(tmp);
    }
    if (fd >= 0)
        close(fd);
    free(text);
    return r;
}

int dl__revoked_add(dl__revoked_t *t, const char *run_id, int64_t before, int64_t *ret_before,
                    char *err, size_t errlen)
{
    int64_t old = dl__revoked_before(t, run_id);

    if (old == 0 && json_object_size(t->runs) >= DL__REVOKED_MAX) {
        snprintf(err, errlen, "the server keeps revocations for %d run ids already, the limit",
                 DL__REVOKED_MAX);
        return -ENOSPC;
    }
    *ret_before = before > old ? before : old;
    if (before <= old)
        return 0;
    if (json_object_set_new(t->runs, run_id, json_integer((json_int_t)before)) < 0) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    return t->path != NULL ? save(t, err, errlen) : 0;
}
