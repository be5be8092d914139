/* IDX files (the MNIST family's format) read through zlib.
 *
 * An IDX file is a 4-byte magic (two zero bytes, a type code, the number of dimensions), one
 * big-endian 32-bit size a dimension, then the payload. zlib's gzread reads gzip and plain files
 * alike, so an uncompressed copy of the data works too. Every check names the file: a training job
 * that dies on "bad magic" without saying which of four files is at fault wastes a cluster slot.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "internal.h"

#define IDX_TYPE_UBYTE 0x08
#define IDX_MAX_DIMS 4
/* Far above Fashion-MNIST's 47 MB, far below what would make size arithmetic overflow. */
#define IDX_MAX_BYTES ((size_t)1 << 32)

/* Reads exactly len bytes. Returns len, a shorter count at end of file, or -1 with *ret_why set. */
static long long read_full(gzFile f, void *buf, size_t len, const char **ret_why)
{
    size_t done = 0;

    while (done < len) {
        size_t chunk = len - done;
        if (chunk > (1u << 30))
            chunk = 1u << 30;
        int n = gzread(f, (char *)buf + done, (unsigned)chunk);
        if (n < 0) {
            int zerr;
            *ret_why = gzerror(f, &zerr);
            return -1;
        }
        if (n == 0) {
            /* zlib reports a gzip stream cut short as a quiet end of file with Z_BUF_ERROR
             * (for readers of growing files); for us it is damage. */
            int zerr;
            const char *msg = gzerror(f, &zerr);
            if (zerr != Z_OK) {
                *ret_why =
                    zerr == Z_BUF_ERROR ? "unexpected end of file (truncated gzip stream)" : msg;
                return -1;
            }
            break;
        }
        done += (size_t)n;
    }
    return (long long)done;
}

static int errno_or(int fallback)
{
    return errno != 0 ? -errno : fallback;
}

static int read_header(gzFile f, const char *path, unsigned ndims, size_t *dims, size_t *ret_total,
                       char *err, size_t errlen)
{
    unsigned char head[4 + 4 * IDX_MAX_DIMS];
    const char *why = NULL;
    long long n = read_full(f, head, 4, &why);

    if (n < 0)
        return dl__train_err(-EBADMSG, err, errlen, "%s: bad gzip stream: %s", path, why);
    if (n < 4)
        return dl__train_err(-EBADMSG, err, errlen,
                             "%s: truncated: %lld bytes, shorter than the 4-byte IDX magic", path,
                             n);
    if (head[0] != 0 || head[1] != 0)
        return dl__train_err(-EBADMSG, err, errlen,
                             "%s: bad magic %02x%02x%02x%02x: not an IDX file", path, head[0],
                             head[1], head[2], head[3]);
    if (head[2] != IDX_TYPE_UBYTE)
        return dl__train_err(-EBADMSG, err, errlen,
                             "%s: IDX element type 0x%02x, expected 0x08 (unsigned byte)", path,
                             head[2]);
    if (head[3] != ndims)
        return dl__train_err(-EBADMSG, err, errlen, "%s: %u dimensions, expected %u", path, head[3],
                             ndims);

    n = read_full(f, head + 4, 4 * (size_t)ndims, &why);
    if (n < 0)
        return dl__train_err(-EBADMSG, err, errlen, "%s: bad gzip stream: %s", path, why);
    if (n < 4 * (long long)ndims)
        return dl__train_err(-EBADMSG, err, errlen,
                             "%s: truncated in the header at offset %lld of %u", path, 4 + n,
                             4 + 4 * ndims);

    size_t total = 1;
    for (unsigned i = 0; i < ndims; i++) {
        const unsigned char *p = head + 4 + 4 * i;
        size_t d = (size_t)p[0] << 24 | (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
        if (d == 0)
            return dl__train_err(-EBADMSG, err, errlen, "%s: dimension %u is zero", path, i);
        if (d > IDX_MAX_BYTES / total)
            return dl__train_err(-EBADMSG, err, errlen, "%s: dimensions too large (over %zu bytes)",
                                 path, (size_t)IDX_MAX_BYTES);
        total *= d;
        dims[i] = d;
    }
    *ret_total = total;
    return 0;
}

int dl_train_idx_read(const char *path, unsigned ndims, uint8_t **ret_data, size_t *ret_dims,
                      char *err, size_t errlen)
{
    size_t dims[IDX_MAX_DIMS];
    size_t total = 0;
    uint8_t *data = NULL;
    const char *why = NULL;
    int r;

    if (ndims == 0 || ndims > IDX_MAX_DIMS)
        return dl__train_err(-EINVAL, err, errlen, "%s: cannot read %u dimensions", path, ndims);

    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (f == NULL) {
        r = errno_or(-ENOMEM);
        return dl__train_err(r, err, errlen, "%s: %s", path, strerror(-r));
    }
    /* Bigger than the default 8 KiB: fewer read calls on a 26 MB file. */
    gzbuffer(f, 256 * 1024);

    r = read_header(f, path, ndims, dims, &total, err, errlen);
    if (r < 0)
        goto fail;

    data = malloc(total);
    if (data == NULL) {
        r = dl__train_err(-ENOMEM, err, errlen, "%s: out of memory for %zu bytes", path, total);
        goto fail;
    }
    long long n = read_full(f, data, total, &why);
    if (n < 0) {
        r = dl__train_err(-EBADMSG, err, errlen, "%s: bad gzip stream: %s", path, why);
        goto fail;
    }
    if ((size_t)n < total) {
        r = dl__train_err(-EBADMSG, err, errlen,
                          "%s: truncated: %zu bytes of data, the header promises %zu", path,
                          (size_t)n, total);
        goto fail;
    }
    /* Reading past the payload also makes zlib check the gzip trailer (CRC and length), which
     * is what catches a corrupted stream whose damage happens to inflate cleanly. */
    unsigned char extra;
    n = read_full(f, &extra, 1, &why);
    if (n < 0) {
        r = dl__train_err(-EBADMSG, err, errlen, "%s: bad gzip stream: %s", path, why);
        goto fail;
    }
    if (n > 0) {
        r = dl__train_err(-EBADMSG, err, errlen, "%s: trailing bytes after %zu bytes of data", path,
                          total);
        goto fail;
    }
    gzclose(f);
    memcpy(ret_dims, dims, ndims * sizeof(*dims));
    *ret_data = data;
    return 0;

fail:
    free(data);
    gzclose(f);
    return r;
}

/* Finds "<dir>/<name>.gz", else "<dir>/<name>". When neither is there, the error says which
 * folder and which names were looked for, since that is what the user has to fix. */
static int data_path(char *buf, size_t len, const char *dir, const char *name, char *err,
                     size_t errlen)
{
    struct stat st;

    snprintf(buf, len, "%s/%s.gz", dir, name);
    if (access(buf, F_OK) == 0)
        return 0;
    snprintf(buf, len, "%s/%s", dir, name);
    if (access(buf, F_OK) == 0)
        return 0;
    if (stat(dir, &st) < 0) {
        int e = errno;
        return dl__train_err(-e, err, errlen, "dataset_dir %s: %s (looking for %s.gz)%s", dir,
                             strerror(e), name,
                             strcmp(dir, DL_TRAIN_DEFAULT_DATASET) == 0
                                 ? "; install dataset-fashion-mnist or set dataset_dir"
                                 : "");
    }
    if (!S_ISDIR(st.st_mode))
        return dl__train_err(-ENOTDIR, err, errlen, "dataset_dir %s: not a folder", dir);
    return dl__train_err(-ENOENT, err, errlen, "%s/%s.gz: no such file (nor %s)", dir, name, name);
}

int dl_train_dataset_load(dl_train_dataset_t *ds, const char *dir, const char *prefix, char *err,
                          size_t errlen)
{
    char ipath[4096], lpath[4096], name[256];
    uint8_t *pixels = NULL, *labels = NULL;
    size_t idims[3], ldims[1];
    int r;

    snprintf(name, sizeof(name), "%s-images-idx3-ubyte", prefix);
    r = data_path(ipath, sizeof(ipath), dir, name, err, errlen);
    if (r < 0)
        return r;
    snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", prefix);
    r = data_path(lpath, sizeof(lpath), dir, name, err, errlen);
    if (r < 0)
        return r;

    r = dl_train_idx_read(ipath, 3, &pixels, idims, err, errlen);
    if (r < 0)
        return r;
    r = dl_train_idx_read(lpath, 1, &labels, ldims, err, errlen);
    if (r < 0)
        goto fail;
    if (idims[0] != ldims[0]) {
        r = dl__train_err(-EBADMSG, err, errlen, "%s: %zu labels, but %s has %zu images", lpath,
                          ldims[0], ipath, idims[0]);
        goto fail;
    }

    size_t classes = 0;
    for (size_t i = 0; i < ldims[0]; i++)
        if ((size_t)labels[i] + 1 > classes)
            classes = (size_t)labels[i] + 1;

    ds->n = idims[0];
    ds->rows = idims[1];
    ds->cols = idims[2];
    ds->dim = idims[1] * idims[2];
    ds->pixels = pixels;
    ds->labels = labels;
    ds->n_classes = classes;
    return 0;

fail:
    free(pixels);
    free(labels);
    return r;
}

void dl_train_dataset_free(dl_train_dataset_t *ds)
{
    if (ds == NULL)
        return;
    free(ds->pixels);
    free(ds->labels);
    memset(ds, 0, sizeof(*ds));
}

DL__TRAIN_HOT
void dl_train_dataset_gather(const dl_train_dataset_t *ds, const uint32_t *idx, size_t k, float *x,
                             uint8_t *y)
{
    const size_t dim = ds->dim;
    const float scale = 1.0f / 255.0f;

    for (size_t i = 0; i < k; i++) {
        const uint8_t *restrict src = ds->pixels + (size_t)idx[i] * dim;
        /* Rows are scattered over the whole data set: ask for a later row's lines early. */
        if (i + 4 < k) {
            const uint8_t *ahead = ds->pixels + (size_t)idx[i + 4] * dim;
            for (size_t off = 0; off < dim; off += 64)
                __builtin_prefetch(ahead + off);
        }
        float *restrict dst = x + i * dim;
        for (size_t j = 0; j < dim; j++)
            dst[j] = (float)src[j] * scale;
        y[i] = ds->labels[idx[i]];
    }
}
