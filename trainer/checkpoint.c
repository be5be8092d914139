/* Checkpoints: one file a save, written atomically, verified on load.
 *
 * Layout (native byte order, which the header records so a foreign file is refused):
 *   0  magic "DLTRCKPT"            8 bytes
 *   8  version                     u32
 *  12  byte-order mark 0x01020304  u32
 *  16  header length               u32 (fixed part + sizes)
 *  20  weight layers               u32
 *  24  activation                  u32
 *  28  world size when written     u32
 *  32  parameters                  u64
 *  40  step, epoch, consumed, seed u64 x 4
 *  72  RNG state                   u64 x 4
 * 104  layer widths                u32 x (layers + 1)
 *      parameters                  f32 x n
 *      momentum                    f32 x n
 *      CRC-32 of all of the above  u32
 *
 * A crash can leave a temporary ".ckpt-*.tmp-<pid>" file behind, never a partial "ckpt-*.dlck":
 * the final name appears only by rename() after the data is on disk.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "internal.h"

#define CKPT_MAGIC "DLTRCKPT"
#define CKPT_VERSION 1u
#define CKPT_BOM 0x01020304u
#define CKPT_FIXED 104u
#define CKPT_HEADER_MAX (CKPT_FIXED + 4u * (DL_TRAIN_MAX_LAYERS + 1))

static void put32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static size_t encode_header(const dl_train_ckpt_t *ck, unsigned char *h)
{
    size_t len = CKPT_FIXED + 4 * (ck->n_layers + 1);

    memset(h, 0, len);
    memcpy(h, CKPT_MAGIC, 8);
    put32(h + 8, CKPT_VERSION);
    put32(h + 12, CKPT_BOM);
    put32(h + 16, (uint32_t)len);
    put32(h + 20, (uint32_t)ck->n_layers);
    put32(h + 24, (uint32_t)ck->act);
    put32(h + 28, ck->world_size);
    put64(h + 32, ck->n_params);
    put64(h + 40, ck->step);
    put64(h + 48, ck->epoch);
    put64(h + 56, ck->consumed);
    put64(h + 64, ck->seed);
    for (int i = 0; i < 4; i++)
        put64(h + 72 + 8 * i, ck->rng[i]);
    for (size_t l = 0; l <= ck->n_layers; l++)
        put32(h + CKPT_FIXED + 4 * l, (uint32_t)ck->sizes[l]);
    return len;
}

static int write_all(int fd, const void *buf, size_t len, uLong *crc)
{
    const unsigned char *p = buf;

    if (crc != NULL)
        *crc = crc32_z(*crc, p, len);
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int r = 0;

    if (fd < 0)
        return -errno;
    if (fsync(fd) < 0 && errno != EINVAL)
        r = -errno;
    close(fd);
    return r;
}

int dl_train_ckpt_save(const char *dir, const dl_train_ckpt_t *ck, char *ret_path, size_t pathlen,
                       char *err, size_t errlen)
{
    unsigned char header[CKPT_HEADER_MAX], trailer[4];
    char tmp[4096], final[4096];
    uLong crc = crc32_z(0L, Z_NULL, 0);
    int fd, r;

    if (ck->n_layers == 0 || ck->n_layers > DL_TRAIN_MAX_LAYERS)
        return dl__train_err(-EINVAL, err, errlen, "checkpoint: %zu layers", ck->n_layers);
    if (mkdir(dir, 0750) < 0 && errno != EEXIST) {
        r = -errno;
        return dl__train_err(r, err, errlen, "%s: cannot create: %s", dir, strerror(-r));
    }
    snprintf(final, sizeof(final), "%s/ckpt-%012" PRIu64 ".dlck", dir, ck->step);
    snprintf(tmp, sizeof(tmp), "%s/.ckpt-%012" PRIu64 ".tmp-%ld", dir, ck->step, (long)getpid());

    (void)unlink(tmp);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    if (fd < 0) {
        r = -errno;
        return dl__train_err(r, err, errlen, "%s: %s", tmp, strerror(-r));
    }
    size_t hlen = encode_header(ck, header);
    r = write_all(fd, header, hlen, &crc);
    if (r == 0)
        r = write_all(fd, ck->params, ck->n_params * sizeof(float), &crc);
    if (r == 0)
        r = write_all(fd, ck->momentum, ck->n_params * sizeof(float), &crc);
    if (r == 0) {
        put32(trailer, (uint32_t)crc);
        r = write_all(fd, trailer, 4, NULL);
    }
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r < 0) {
        (void)unlink(tmp);
        return dl__train_err(r, err, errlen, "%s: write: %s", tmp, strerror(-r));
    }
    if (rename(tmp, final) < 0) {
        r = -errno;
        (void)unlink(tmp);
        return dl__train_err(r, err, errlen, "%s: rename to %s: %s", tmp, final, strerror(-r));
    }
    /* Without this the rename itself may not survive a power cut. */
    r = fsync_dir(dir);
    if (r < 0)
        return dl__train_err(r, err, errlen, "%s: fsync: %s", dir, strerror(-r));
    if (ret_path != NULL)
        snprintf(ret_path, pathlen, "%s", final);
    return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
    unsigned char *p = buf;

    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EBADMSG;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void shape_text(char *buf, size_t len, const size_t *sizes, size_t n_layers, uint32_t act)
{
    static const char *const acts[] = {"relu", "tanh", "gelu"};
    size_t off = 0;

    buf[0] = '\0';
    for (size_t l = 0; l <= n_layers && off < len; l++)
        off += (size_t)snprintf(buf + off, len - off, "%s%zu", l ? "-" : "", sizes[l]);
    if (off < len)
        snprintf(buf + off, len - off, " %s", act < 3 ? acts[act] : "?");
}

/* Checks the header against the file size and the expected shape. */
static int check_header(const char *path, const unsigned char *h, size_t hlen, off_t fsize,
                        const dl_train_ckpt_t *ck, char *err, size_t errlen)
{
    size_t n_layers = get32(h + 20), sizes[DL_TRAIN_MAX_LAYERS + 1];
    uint64_t n_params = get64(h + 32);
    uint32_t act = get32(h + 24);
    char have[256], want[256];

    for (size_t l = 0; l <= n_layers; l++)
        sizes[l] = get32(h + CKPT_FIXED + 4 * l);
    if (n_params > ((uint64_t)1 << 40))
        return dl__train_err(-EBADMSG, err, errlen, "%s: bad header: %" PRIu64 " parameters", path,
                             n_params);
    uint64_t want_size = hlen + 8 * n_params + 4;
    if ((uint64_t)fsize != want_size)
        return dl__train_err(-EBADMSG, err, errlen,
                             "%s: truncated or padded: %lld bytes, the header implies %" PRIu64,
                             path, (long long)fsize, want_size);

    bool same = n_layers == ck->n_layers && n_params == ck->n_params && act == (uint32_t)ck->act;
    for (size_t l = 0; same && l <= n_layers; l++)
        same = sizes[l] == ck->sizes[l];
    if (!same) {
        shape_text(have, sizeof(have), sizes, n_layers, act);
        shape_text(want, sizeof(want), ck->sizes, ck->n_layers, (uint32_t)ck->act);
        return dl__train_err(-EINVAL, err, errlen, "%s: model shape %s, expected %s", path, have,
                             want);
    }
    return 0;
}

/* Reads and checks the file at path against ck's shape. With out (2 * n_params floats) the
 * parameters and momentum land there and the header's fields in ck; without it the file is only
 * checked, through a small buffer. Either way ck's own buffers are never touched. */
static int read_checked(const char *path, dl_train_ckpt_t *ck, float *out, char *err, size_t errlen)
{
    unsigned char h[CKPT_HEADER_MAX], trailer[4], chunk[64 * 1024];
    struct stat st;
    int r;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        r = -errno;
        return dl__train_err(r, err, errlen, "%s: %s", path, strerror(-r));
    }
    if (fstat(fd, &st) < 0) {
        r = dl__train_err(-errno, err, errlen, "%s: stat: %s", path, strerror(errno));
        goto fail;
    }
    r = read_all(fd, h, CKPT_FIXED);
    if (r < 0) {
        r = dl__train_err(r, err, errlen, "%s: truncated header (%lld bytes)", path,
                          (long long)st.st_size);
        goto fail;
    }
    if (memcmp(h, CKPT_MAGIC, 8) != 0) {
        r = dl__train_err(-EBADMSG, err, errlen, "%s: bad magic: not a trainer checkpoint", path);
        goto fail;
    }
    if (get32(h + 8) != CKPT_VERSION || get32(h + 12) != CKPT_BOM) {
        r = dl__train_err(-EBADMSG, err, errlen,
                          "%s: version %u (byte-order mark %08x), this build reads version %u",
                          path, get32(h + 8), get32(h + 12), CKPT_VERSION);
        goto fail;
    }
    size_t n_layers = get32(h + 20), hlen = get32(h + 16);
    if (n_layers == 0 || n_layers > DL_TRAIN_MAX_LAYERS ||
        hlen != CKPT_FIXED + 4 * (n_layers + 1)) {
        r = dl__train_err(-EBADMSG, err, errlen, "%s: bad header: %zu layers, %zu header bytes",
                          path, n_layers, hlen);
        goto fail;
    }
    r = read_all(fd, h + CKPT_FIXED, hlen - CKPT_FIXED);
    if (r < 0) {
        r = dl__train_err(r, err, errlen, "%s: truncated header (%lld bytes)", path,
                          (long long)st.st_size);
        goto fail;
    }
    r = check_header(path, h, hlen, st.st_size, ck, err, errlen);
    if (r < 0)
        goto fail;

    uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), h, hlen);
    size_t left = 2 * ck->n_params * sizeof(float);
    unsigned char *dst = (unsigned char *)out;
    while (left > 0 && r == 0) {
        size_t k = out != NULL ? left : left < sizeof(chunk) ? left : sizeof(chunk);
        unsigned char *p = out != NULL ? dst : chunk;
        r = read_all(fd, p, k);
        if (r == 0) {
            crc = crc32_z(crc, p, k);
            left -= k;
            dst += out != NULL ? k : 0;
        }
    }
    if (r == 0)
        r = read_all(fd, trailer, 4);
    if (r < 0) {
        r = dl__train_err(r, err, errlen, "%s: read: %s", path,
                          r == -EBADMSG ? "file shrank while reading" : strerror(-r));
        goto fail;
    }
    if ((uint32_t)crc != get32(trailer)) {
        r = dl__train_err(-EBADMSG, err, errlen, "%s: bad checksum: stored %08x, computed %08x",
                          path, get32(trailer), (uint32_t)crc);
        goto fail;
    }
    if (out != NULL) {
        ck->world_size = get32(h + 28);
        ck->step = get64(h + 40);
        ck->epoch = get64(h + 48);
        ck->consumed = get64(h + 56);
        ck->seed = get64(h + 64);
        for (int i = 0; i < 4; i++)
            ck->rng[i] = get64(h + 72 + 8 * i);
    }
    r = 0;

fail:
    close(fd);
    return r;
}

int dl_train_ckpt_load(const char *path, dl_train_ckpt_t *ck, char *err, size_t errlen)
{
    size_t n = ck->n_params;

    /* Read into a scratch buffer: the caller's model must not change unless the file is good. */
    if (n > ((size_t)1 << 40))
        return dl__train_err(-EINVAL, err, errlen, "%s: %zu parameters", path, n);
    float *buf = malloc((2 * n + 1) * sizeof(float));
    if (buf == NULL)
        return dl__train_err(-ENOMEM, err, errlen, "%s: out of memory", path);
    dl_train_ckpt_t got = *ck;
    int r = read_checked(path, &got, buf, err, errlen);
    if (r == 0) {
        memcpy(ck->params, buf, n * sizeof(float));
        memcpy(ck->momentum, buf + n, n * sizeof(float));
        got.params = ck->params;
        got.momentum = ck->momentum;
        *ck = got;
    }
    free(buf);
    return r;
}

int dl_train_ckpt_verify(const char *path, const dl_train_ckpt_t *shape, char *err, size_t errlen)
{
    dl_train_ckpt_t probe = *shape;
    return read_checked(path, &probe, NULL, err, errlen);
}

/* ---- Directory scan --------------------------------------------------------------------- */

typedef struct {
    uint64_t step;
    char name[64];
} entry_t;

/* "ckpt-<digits>.dlck", digits only; returns false for anything else. */
static bool parse_name(const char *name, uint64_t *ret_step)
{
    const char *p = name + 5;
    uint64_t v = 0;

    if (strncmp(name, "ckpt-", 5) != 0 || *p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (strcmp(p, ".dlck") != 0)
        return false;
    *ret_step = v;
    return true;
}

static int by_step_desc(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

/* A temporary file of a writer that died, not of this process (which never leaves one between
 * calls). */
static bool stale_temp(const char *name)
{
    char mine[32];
    const char *tail = strstr(name, ".tmp-");

    if (strncmp(name, ".ckpt-", 6) != 0 || tail == NULL)
        return false;
    snprintf(mine, sizeof(mine), ".tmp-%ld", (long)getpid());
    return strcmp(tail, mine) != 0;
}

/* Lists the checkpoints in dir, newest first. *ret is malloc'ed (may be NULL when empty).
 * With unlink_stale, also deletes stale temporary files. */
static int scan(const char *dir, bool unlink_stale, entry_t **ret, size_t *ret_n)
{
    entry_t *list = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;

    DIR *d = opendir(dir);
    if (d == NULL)
        return -errno;
    while ((de = readdir(d)) != NULL) {
        uint64_t step;
        if (unlink_stale && stale_temp(de->d_name))
            (void)unlinkat(dirfd(d), de->d_name, 0);
        if (!parse_name(de->d_name, &step) || strlen(de->d_name) >= sizeof(list->name))
            continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            entry_t *grown = realloc(list, ncap * sizeof(*list));
            if (grown == NULL) {
                free(list);
                closedir(d);
                return -ENOMEM;
            }
            list = grown;
            cap = ncap;
        }
        list[n].step = step;
        snprintf(list[n].name, sizeof(list[n].name), "%s", de->d_name);
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(list, n, sizeof(*list), by_step_desc);
    *ret = list;
    *ret_n = n;
    return 0;
}

int dl_train_ckpt_load_latest(const char *dir, dl_train_ckpt_t *ck, dl_train_ckpt_skip_cb skipped,
                              void *ud, char *ret_path, size_t pathlen, char *err, size_t errlen)
{
    entry_t *list = NULL;
    size_t n = 0;
    char path[4096], why[DL_TRAIN_ERRLEN];
    int r = scan(dir, false, &list, &n);

    if (r == -ENOENT)
        return 0;
    if (r < 0)
        return dl__train_err(r, err, errlen, "%s: %s", dir, strerror(-r));
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, list[i].name);
        if (dl_train_ckpt_load(path, ck, why, sizeof(why)) == 0) {
            if (ret_path != NULL)
                snprintf(ret_path, pathlen, "%s", path);
            free(list);
            return 1;
        }
        if (skipped != NULL)
            skipped(ud, why);
    }
    free(list);
    return 0;
}

int dl_train_ckpt_prune(const char *dir, unsigned keep, const dl_train_ckpt_t *shape,
                        dl_train_ckpt_skip_cb invalid, void *ud, char *err, size_t errlen)
{
    entry_t *list = NULL;
    size_t n = 0, valid = 0, i;
    char path[4096], why[DL_TRAIN_ERRLEN];
    int r = scan(dir, true, &list, &n);

    if (r < 0)
        return dl__train_err(r, err, errlen, "%s: %s", dir, strerror(-r));
    /* Find the keep-th newest checkpoint that would load; a file that would not is no
     * checkpoint, whatever its name says. */
    for (i = 0; i < n && valid < keep; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, list[i].name);
        if (dl_train_ckpt_verify(path, shape, why, sizeof(why)) == 0)
            valid++;
        else if (invalid != NULL)
            invalid(ud, why);
    }
    /* Fewer than keep good ones: nothing is surplus. */
    if (valid < keep)
        i = n;
    for (; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, list[i].name);
        if (unlink(path) < 0 && errno != ENOENT && r == 0)
            r = dl__train_err(-errno, err, errlen, "%s: unlink: %s", path, strerror(errno));
    }
    free(list);
    return r;
}
