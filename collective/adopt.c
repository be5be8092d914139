/* Ordinary memory made readable by the host's other rank on first use, so that a two-rank
 * all-reduce from malloc'd buffers reads the other's input where it lies, as it does for
 * dl_coll_mem_alloc memory, instead of copying it through the shared segment.
 *
 * The whole pages inside the buffer are "adopted": their contents are written into a memfd, which
 * is then mapped over them with MAP_FIXED. The addresses and the contents stay the same for the
 * program; the pages are now a file the peer maps read-only through /proc/PID/fd/FD, like a
 * dl_coll_mem_alloc block. The partial pages at either end are never touched: other objects of
 * the heap may live there, written by other threads at any time, while the buffer's own pages
 * belong to the all-reduce during the call.
 *
 * Only private anonymous memory is adopted (the heap, mmap'd malloc chunks): a file mapping would
 * stop reaching its file. The registry is per process, not per group, since the pages are: a
 * later group finds them adopted already, and a fork must see them all (below). Each call checks
 * that an adoption still stands, that the mapping at exactly its bounds is its memfd: a buffer
 * freed and unmapped, or mapped anew at the same place, is another file or none. The kernel's
 * PROCMAP_QUERY (Linux 6.11) answers that in 0.5-1.8 us under load, where the name
 * /proc/self/map_files gives the mapping took 2.5-6.5 us (as long as a whole registered
 * all-reduce of 64 KiB); the name is the fallback on older kernels.
 *
 * A check without a system call was weighed and not taken (2026-12-07): a second mapping of the
 * memfd kept here, a word written through it at the start of a call and looked for at the
 * buffer's address (where the memfd no longer lies the write is not seen), then restored. The
 * written value is visible while it lasts to whoever reads the buffer, which a const input
 * allows: another thread, or the other rank of a second group all-reducing the same buffer at
 * the same time, which reads the memfd itself. Where realloc moved the pages elsewhere (mremap)
 * and new memory lies at the old address, the word written is the moved buffer's, which another
 * thread may write meanwhile: the restore would undo its write. And the first and last pages
 * alone miss a page in the middle unmapped and mapped anew, while every page is 128 of them at
 * 512 KiB, each through two mappings (test-group's
 * adopted_buffer_with_a_page_mapped_anew_is_read_anew holds any check to every page).
 *
 * fork: a child would share adopted pages with its parent instead of getting a copy; the child's
 * handler maps each of them privately (copy-on-write from the memfd), so the child's writes stay
 * its own. Unlike a real fork's copy, pages the child has not written yet still show the parent's
 * later writes. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "internal.h"

/* Adoptions kept at once, retired ones included; beyond it nothing more is adopted. */
#define MAX_ADOPTED 64
/* An adoption that served fewer calls than this before its buffer went away was wasted (a
 * buffer freed and allocated anew every call); after MAX_WASTED of them, adoption stops. */
#define MIN_USES 3
#define MAX_WASTED 16

typedef struct {
    char *base;
    size_t len;
    int fd;
    uint32_t serial;
    uint64_t uses;
    dev_t dev; /* the memfd's, for PROCMAP_QUERY */
    ino_t ino;
    /* 0: retired, its bounds broken (a later adoption over part of it, or the buffer gone): kept
     * with its fd while any piece of it may still be mapped, for the fork handler. */
    int active;
} adopted_t;

/* Process-wide on purpose (see the top): guarded by mu, which fork's handlers hold across it. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static adopted_t tab[MAX_ADOPTED];
static size_t ntab;
static uint32_t next_serial;
static int wasted;
/* /proc/self/maps, for PROCMAP_QUERY: -1 not opened yet, -2 the kernel has no such query. */
static int maps_fd = -1;

/* linux/fs.h's, which older headers lack. */
struct dl_procmap_query {
    uint64_t size, query_flags, query_addr;
    uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
    uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
    uint64_t vma_name_addr, build_id_addr;
};
#define DL_PROCMAP_QUERY _IOWR('f', 17, struct dl_procmap_query)
#define DL_PROCMAP_VMA_SHARED 0x08

static void fmt_hex(char *p, unsigned long v)
{
    char tmp[2 * sizeof(v)];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v != 0);
    while (n > 0)
        *p++ = tmp[--n];
    *p = '\0';
}

static void memfd_name(uint32_t serial, char *buf, size_t len)
{
    snprintf(buf, len, "dlaunch-adopt-%u", (unsigned)serial);
}

/* Whether e's pages are still its memfd, mapped at exactly its bounds. No stdio: the fork
 * handler calls it too. */
static int still_adopted(const adopted_t *e)
{
    char path[64] = "/proc/self/map_files/", link[96];
    size_t n = strlen(path);
    fmt_hex(path + n, (unsigned long)e->base);
    n = strlen(path);
    path[n++] = '-';
    fmt_hex(path + n, (unsigned long)(e->base + e->len));
    ssize_t m = readlink(path, link, sizeof(link) - 1);
    if (m < 0)
        return 0;
    link[m] = '\0';
    char want[64] = "/memfd:dlaunch-adopt-";
    n = strlen(want);
    /* The serial in decimal, by hand for the same reason. */
    char dec[12];
    int d = 0;
    uint32_t v = e->serial;
    do {
        dec[d++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (d > 0)
        want[n++] = dec[--d];
    want[n] = '\0';
    return strncmp(link, want, n) == 0 && (link[n] == '\0' || link[n] == ' ');
}

/* Whether e's pages are still its memfd, by PROCMAP_QUERY: 1 or 0; -1 when the kernel cannot
 * say (then the name is asked). */
static int query_adopted(const adopted_t *e)
{
    if (maps_fd == -1) {
        maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
        if (maps_fd < 0)
            maps_fd = -2;
    }
    if (maps_fd < 0)
        return -1;
    struct dl_procmap_query q = {.size = sizeof(q), .query_addr = (uintptr_t)e->base};
    if (ioctl(maps_fd, DL_PROCMAP_QUERY, &q) < 0) {
        if (errno == ENOENT) /* nothing mapped there */
            return 0;
        if (errno == ENOTTY || errno == EINVAL) {
            close(maps_fd);
            maps_fd = -2;
        }
        return -1;
    }
    return q.vma_start == (uintptr_t)e->base && q.vma_end == (uintptr_t)e->base + e->len &&
           q.vma_offset == 0 && (q.vma_flags & DL_PROCMAP_VMA_SHARED) != 0 && q.inode == e->ino &&
           makedev(q.dev_major, q.dev_minor) == e->dev;
}

static int adoption_stands(const adopted_t *e)
{
    int r = query_adopted(e);
    return r >= 0 ? r : still_adopted(e);
}

/* gone: its buffer went away (else it only makes room). */
static void forget(size_t i, int gone)
{
    if (gone && tab[i].uses < MIN_USES)
        wasted++;
    close(tab[i].fd);
    tab[i] = tab[--ntab];
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&mu);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&mu);
}

static unsigned long parse_hex(const char **p)
{
    unsigned long v = 0;
    for (;; (*p)++) {
        char c = **p;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return v;
        v = v * 16 + (unsigned long)d;
    }
}

/* One line of /proc/self/maps in the child: a piece of an adoption becomes a private mapping of
 * its memfd at the same offset. No stdio or malloc here. */
static void privatize_line(const char *line)
{
    static const char tag[] = "/memfd:dlaunch-adopt-";
    const char *name = strstr(line, tag);
    if (name == NULL)
        return;
    const char *p = line;
    unsigned long lo = parse_hex(&p);
    p++;
    unsigned long hi = parse_hex(&p);
    p = strchr(p, ' ');
    p = p != NULL ? strchr(p + 1, ' ') : NULL;
    if (p == NULL)
        return;
    p++;
    unsigned long off = parse_hex(&p);
    uint32_t serial = 0;
    for (const char *q = name + sizeof(tag) - 1; *q >= '0' && *q <= '9'; q++)
        serial = serial * 10 + (uint32_t)(*q - '0');
    for (size_t i = 0; i < ntab; i++)
        if (tab[i].serial == serial)
            (void)mmap((void *)lo, hi - lo, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED,
                       tab[i].fd, (off_t)off);
}

/* The child's copies of adopted pages become private: its writes no longer reach the parent. */
static void atfork_child(void)
{
    int fd = ntab > 0 ? open("/proc/self/maps", O_RDONLY | O_CLOEXEC) : -1;
    static char buf[8192];
    size_t have = 0;
    for (;;) {
        ssize_t got = fd >= 0 ? read(fd, buf + have, sizeof(buf) - 1 - have) : 0;
        if (got <= 0)
            break;
        have += (size_t)got;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            privatize_line(line);
            line = nl + 1;
        }
        have = (size_t)(buf + have - line);
        memmove(buf, line, have);
        if (have == sizeof(buf) - 1)
            have = 0; /* a line longer than the buffer: no adoption's */
    }
    if (fd >= 0)
        close(fd);
    for (size_t i = 0; i < ntab; i++)
        close(tab[i].fd);
    ntab = 0;
    /* The parent's: its queries would answer for the parent's memory. */
    if (maps_fd >= 0)
        close(maps_fd);
    maps_fd = -1;
    pthread_mutex_unlock(&mu);
}

static void install_fork_handlers(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* Whether [a, b) is covered by private anonymous writable mappings, or by earlier adoptions
 * (a buffer reusing part of an adopted one's memory), per /proc/self/maps; and which adoptions
 * still have pages mapped anywhere (live[i] for tab[i]). */
static int scan_maps(const char *a, const char *b, int *live, char *why, size_t whylen)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (f == NULL) {
        int e = errno;
        snprintf(why, whylen, "reading /proc/self/maps: %s", strerror(e));
        return -e;
    }
    char line[512];
    uintptr_t want = (uintptr_t)a, end = (uintptr_t)b;
    int ok = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi, off, inode;
        char perms[8] = "", dev[16] = "";
        int name_at = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &lo, &hi, perms, &off, dev, &inode,
                   &name_at) < 6)
            continue;
        const char *name = line + name_at;
        size_t nl = strcspn(name, "\n");
        int ours = strncmp(name, "/memfd:dlaunch-adopt-", 21) == 0;
        if (ours) {
            uint32_t serial = (uint32_t)strtoul(name + 21, NULL, 10);
            for (size_t i = 0; i < ntab; i++)
                live[i] |= tab[i].serial == serial;
        }
        if (ok != 0 || want >= end || hi <= want || lo > want)
            continue;
        int anon =
            (nl == 0 || strncmp(name, "[heap]", nl) == 0 || strncmp(name, "[anon:", 6) == 0) &&
            strcmp(perms, "rw-p") == 0 && inode == 0;
        if (!anon && !(ours && strcmp(perms, "rw-s") == 0)) {
            snprintf(why, whylen, "its memory is not private anonymous memory (%.*s %s)",
                     (int)(nl > 60 ? 60 : nl), name, perms);
            ok = 1;
            continue;
        }
        want = hi;
    }
    fclose(f);
    if (ok == 0 && want < end) {
        snprintf(why, whylen, "part of it is not mapped");
        ok = 1;
    }
    return ok;
}

static int adopt_new(char *a, size_t len, dl__coll_adoption_t *ret, char *why, size_t whylen)
{
    char name[32];
    uint32_t serial = DL__COLL_ADOPTED | (++next_serial & ~DL__COLL_ADOPTED);
    memfd_name(serial, name, sizeof(name));
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(why, whylen, "memfd_create: %s", strerror(e));
        return -e;
    }
    int e = ftruncate(fd, (off_t)len) < 0 ? errno : 0;
    for (size_t done = 0; e == 0 && done < len;) {
        ssize_t w = pwrite(fd, a + done, len - done, (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            e = w < 0 ? errno : EIO;
        else
            done += (size_t)w;
    }
    if (e != 0) {
        snprintf(why, whylen, "copying %zu bytes into a memfd: %s", len, strerror(e));
        close(fd);
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        e = errno;
        snprintf(why, whylen, "fstat of the memfd: %s", strerror(e));
        close(fd);
        return -e;
    }
    /* Since Linux 6.12 a failed MAP_FIXED leaves the old mapping in place. */
    void *p = mmap(a, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        e = errno;
        snprintf(why, whylen, "mapping the memfd over %zu bytes: %s", len, strerror(e));
        close(fd);
        return -e;
    }
    tab[ntab++] = (adopted_t){.base = a,
                              .len = len,
                              .fd = fd,
                              .serial = serial,
                              .dev = st.st_dev,
                              .ino = st.st_ino,
                              .active = 1};
    *ret = (dl__coll_adoption_t){.base = a, .len = len, .fd = fd, .serial = serial};
    return 0;
}

int dl__coll_adopt(const void *p, size_t bytes, dl__coll_adoption_t *ret, char *why, size_t whylen)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page;
    uintptr_t b = ((uintptr_t)p + bytes) / page * page;
    if (b <= a) {
        snprintf(why, whylen, "it holds no whole page");
        return 1;
    }
    pthread_once(&once, install_fork_handlers);
    pthread_mutex_lock(&mu);
    int r = 1;
    for (size_t i = 0; i < ntab; i++) {
        adopted_t *e = &tab[i];
        uintptr_t lo = (uintptr_t)e->base, hi = lo + e->len;
        if (!e->active || hi <= a || lo >= b)
            continue;
        if (!adoption_stands(e)) {
            e->active = 0;
            if (e->uses < MIN_USES)
                wasted++;
            continue;
        }
        if (lo <= a && hi >= b) {
            e->uses++;
            *ret = (dl__coll_adoption_t){
                .base = e->base, .len = e->len, .fd = e->fd, .serial = e->serial};
            r = 0;
            goto out;
        }
        /* A buffer over part of an adopted one (the heap reused its memory): adopted anew
         * below, which retires the old one. */
    }
    if (wasted >= MAX_WASTED) {
        snprintf(why, whylen,
                 "%d buffers were freed within %d calls of being adopted (buffers "
                 "allocated anew for every call)",
                 wasted, MIN_USES);
        goto out;
    }
    /* A new adoption: first let go of the retired ones none of whose pages are mapped. */
    int live[MAX_ADOPTED] = {0};
    r = scan_maps((char *)a, (char *)b, live, why, whylen);
    for (size_t i = ntab; i-- > 0;)
        if (!live[i] && !tab[i].active)
            forget(i, 0);
    if (r == 0 && ntab == MAX_ADOPTED) {
        snprintf(why, whylen, "%d adoptions are mapped already", MAX_ADOPTED);
        r = 1;
    }
    if (r == 0)
        r = adopt_new((char *)a, b - a, ret, why, whylen);
    for (size_t i = 0; r == 0 && i + 1 < ntab; i++) {
        uintptr_t lo = (uintptr_t)tab[i].base, hi = lo + tab[i].len;
        if (tab[i].active && hi > a && lo < b)
            tab[i].active = 0;
    }
out:
    pthread_mutex_unlock(&mu);
    return r;
}
