/* The workers' credential: the job's worker key, derived from the agent's token and written to a
 * file of the user's own that workers find in DLAUNCH_TOKEN_FILE. A worker that holds it can use
 * its job's store and nothing else; the agent's token itself never reaches a worker. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "workercred.h"

/* Whether path is a folder of ours closed to others; fills err when not. */
static int closed_dir(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        int r = -errno;
        snprintf(err, errlen, "'%s': %s", path, strerror(-r));
        return r;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        snprintf(err, errlen, "'%s' is not a folder of ours closed to others (mode %04o, uid %u)",
                 path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        return -EACCES;
    }
    return 0;
}

/* A folder only we can enter: $XDG_RUNTIME_DIR/dlaunch, else $TMPDIR/dlaunch-UID (/tmp by
 * default). One that exists must be ours, a real folder, and closed to others, or a local user
 * could have made it to read or swap what we put there; when another user took that name first,
 * a fresh folder of a random name (mkdtemp makes it ours, mode 0700), said in note. */
static int runtime_dir(char *buf, size_t len, char *note, size_t notelen, char *err, size_t errlen)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR"), *tmp = getenv("TMPDIR");
    struct stat st;

    if (tmp == NULL || tmp[0] != '/')
        tmp = "/tmp";
    if (xdg != NULL && xdg[0] == '/' && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) &&
        st.st_uid == geteuid())
        snprintf(buf, len, "%s/dlaunch", xdg);
    else
        snprintf(buf, len, "%s/dlaunch-%u", tmp, (unsigned)geteuid());
    if (mkdir(buf, 0700) < 0 && errno != EEXIST) {
        int r = -errno;
        snprintf(err, errlen, "cannot create '%s' for the workers' key: %s", buf, strerror(-r));
        return r;
    }
    if (closed_dir(buf, err, errlen) == 0)
        return 0;
    char taken[512];
    snprintf(taken, sizeof(taken), "%s", err);
    snprintf(buf, len, "%s/dlaunch-%u.XXXXXX", tmp, (unsigned)geteuid());
    if (mkdtemp(buf) == NULL) {
        int r = -errno;
        snprintf(err, errlen, "%s; and no folder of our own in '%s' instead: %s", taken, tmp,
                 strerror(-r));
        return r;
    }
    snprintf(note, notelen, "%s: the workers' key is kept in '%s' instead", taken, buf);
    return 0;
}

int dl__worker_cred_write(const dl_proto_token_t *token, const char *run_id, char **ret_path,
                          char *note, size_t notelen, char *err, size_t errlen)
{
    dl_proto_token_t *worker = NULL;
    char dir[4096], *path = NULL, *text = NULL;
    int fd = -1, r;

    /* From a master: a key issued now that lasts DL_PROTO_KEY_LIFETIME_S, so that a worker key
     * read off a node ends, as a job key handed out does. From a job key: the job key's span. */
    int64_t now = dl_proto_unix_now();
    dl_proto_key_life_t life = {now, now + DL_PROTO_KEY_LIFETIME_S};
    r = dl_proto_token_derive(token, DL_PROTO_TOKEN_WORKER, run_id, &life, &worker);
    if (r < 0) {
        snprintf(err, errlen, "cannot derive the workers' key for job '%s' from a %s key: %s",
                 run_id, dl_proto_token_kind_name(dl_proto_token_kind(token)), strerror(-r));
        return r;
    }
    r = dl_proto_token_text(worker, &text);
    dl_proto_token_free(worker);
    if (r < 0) {
        snprintf(err, errlen, "cannot write the workers' key: %s", strerror(-r));
        return r;
    }
    note[0] = '\0';
    char tmp[4200];
    bool renew = *ret_path != NULL; /* a new key in the file the workers were told of */
    if (!renew) {
        r = runtime_dir(dir, sizeof(dir), note, notelen, err, errlen);
        if (r == 0 && asprintf(&path, "%s/%s.%d.worker-key", dir, run_id, (int)getpid()) < 0) {
            path = NULL;
            r = -ENOMEM;
            snprintf(err, errlen, "out of memory");
        }
    } else {
        path = *ret_path;
    }
    if (r == 0 && snprintf(tmp, sizeof(tmp), "%s.new", path) >= (int)sizeof(tmp)) {
        r = -ENAMETOOLONG;
        snprintf(err, errlen, "cannot write the workers' key: '%s' is too long a name", path);
    }
    if (r == 0) {
        /* Written aside and renamed over, so that a worker reading the file as it is renewed
         * reads the old key or the new one, whole. A leftover of an earlier agent with our pid
         * is ours to replace. */
        unlink(tmp);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        size_t len = strlen(text);
        errno = 0;
        if (fd < 0 || write(fd, text, len) != (ssize_t)len || write(fd, "\n", 1) != 1 ||
            rename(tmp, path) < 0) {
            r = errno != 0 ? -errno : -EIO;
            snprintf(err, errlen, "cannot write the workers' key to '%s': %s", path, strerror(-r));
            if (fd >= 0)
                unlink(tmp);
        }
    }
    if (fd >= 0)
        close(fd);
    explicit_bzero(text, strlen(text));
    free(text);
    if (renew)
        return r;
    if (r < 0) {
        free(path);
        return r;
    }
    *ret_path = path;
    return 0;
}

void dl__worker_cred_remove(const char *path)
{
    if (path == NULL)
        return;
    unlink(path);
    /* A folder of a random name (runtime_dir's second choice) is this agent's alone. */
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (slash != NULL && (size_t)(slash - path) < sizeof(dir)) {
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
        const char *base = strrchr(dir, '/');
        if (base != NULL && strncmp(base + 1, "dlaunch-", 8) == 0 && strchr(base, '.') != NULL)
            rmdir(dir);
    }
}
