/* A container or a Slurm step may cap CPU time with a quota while every CPU stays in the
 * affinity mask; the quota is what a worker count must respect. The kernel enforces the
 * smallest quota on the way from a cgroup to its hierarchy's root, so every level is read. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "cgroup.h"
#include "config.h"
#include "sysfile.h"

/* Names the first malformed or unreadable file only: one warning line is enough. */
static void set_warn(char *warn, size_t len, const char *file, const char *why)
{
    if (warn != NULL && len > 0 && warn[0] == '\0')
        snprintf(warn, len, "%s: %s", file, why);
}

static bool has_word(const char *list, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = list; *p != '\0';) {
        size_t l = strcspn(p, ",");
        if (l == wl && strncmp(p, word, wl) == 0)
            return true;
        p += l;
        if (*p == ',')
            p++;
    }
    return false;
}

/* mountinfo escapes blanks and backslashes in paths as \ooo. */
static void unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p != '\0'; p++) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
            p[3] >= '0' && p[3] <= '7') {
            *o++ = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 3;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
}

/* Splits a mountinfo line into its mount root, mount point, file system type and super
 * options. Returns false for a line of another shape. */
static bool split_mount(char *line, char **root, char **mnt, char **fstype, char **opts)
{
    char *save = NULL, *f[5];
    int n = 0;
    char *tok = strtok_r(line, " \n", &save);
    for (; tok != NULL && n < 5; tok = strtok_r(NULL, " \n", &save))
        f[n++] = tok;
    if (n < 5)
        return false;
    /* Optional fields run until a lone "-". */
    while (tok != NULL && strcmp(tok, "-") != 0)
        tok = strtok_r(NULL, " \n", &save);
    if (tok == NULL)
        return false;
    *fstype = strtok_r(NULL, " \n", &save);
    char *source = strtok_r(NULL, " \n", &save);
    *opts = strtok_r(NULL, " \n", &save);
    if (*fstype == NULL || source == NULL || *opts == NULL)
        return false;
    *root = f[3];
    *mnt = f[4];
    unescape(*root);
    unescape(*mnt);
    return true;
}

/* Parses a decimal count; false for anything else. */
static bool parse_ll(const char *text, long long lo, long long *ret)
{
    long v;
    if (dl_parse_int(text, (long)lo, 1L << 62, &v) < 0)
        return false;
    *ret = v;
    return true;
}

/* Reads one level's quota into *q, -1 for none. Returns false when its file is malformed
 * (named in warn); a missing file is no limit. */
static bool read_level(const char *dir, bool v2, long long *quota, long long *period, char *file,
                       size_t flen, char *warn, size_t warnlen)
{
    char buf[128], path[4600];
    *quota = -1;
    *period = 0;
    if (v2) {
        if (snprintf(path, sizeof(path), "%s/cpu.max", dir) >= (int)sizeof(path))
            return true; /* deeper than any cgroup can be */
        int r = dl_sysfile_read(path, buf, sizeof(buf));
        if (r == -ENOENT)
            return true;
        if (r < 0) {
            set_warn(warn, warnlen, path, strerror(-r));
            return false;
        }
        char *sp = strchr(buf, ' ');
        if (sp == NULL) {
            set_warn(warn, warnlen, path, "is not 'QUOTA PERIOD' or 'max PERIOD'");
            return false;
        }
        *sp = '\0';
        long long p;
        if (!parse_ll(sp + 1, 1, &p) || (strcmp(buf, "max") != 0 && !parse_ll(buf, 1, quota))) {
            *quota = -1;
            set_warn(warn, warnlen, path, "is not 'QUOTA PERIOD' or 'max PERIOD'");
            return false;
        }
        if (*quota > 0)
            *period = p;
    } else {
        char ppath[4600];
        if (snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", dir) >= (int)sizeof(path) ||
            snprintf(ppath, sizeof(ppath), "%s/cpu.cfs_period_us", dir) >= (int)sizeof(ppath))
            return true;
        int r = dl_sysfile_read(path, buf, sizeof(buf));
        if (r == -ENOENT)
            return true;
        long long q;
        if (r < 0 || (strcmp(buf, "-1") != 0 && !parse_ll(buf, 1, &q))) {
            set_warn(warn, warnlen, path,
                     r < 0 ? strerror(-r) : "is not -1 or a count of microseconds");
            return false;
        }
        if (strcmp(buf, "-1") == 0)
            return true;
        r = dl_sysfile_read(ppath, buf, sizeof(buf));
        long long p;
        if (r < 0 || !parse_ll(buf, 1, &p)) {
            set_warn(warn, warnlen, ppath, r < 0 ? strerror(-r) : "is not a count of microseconds");
            return false;
        }
        *quota = q;
        *period = p;
    }
    if (snprintf(file, flen, "%s", path) >= (int)flen)
        file[0] = '\0'; /* only a message loses it */
    return true;
}

bool dl_cgroup_parent(char *dir, const char *mount)
{
    size_t ml = strlen(mount);
    char *slash = strrchr(dir, '/');
    if (strcmp(dir, mount) == 0 || strlen(dir) <= ml || slash == NULL)
        return false;
    if ((size_t)(slash - dir) < ml) /* only for a hierarchy mounted at / */
        snprintf(dir, ml + 1, "%s", mount);
    else
        *slash = '\0';
    return true;
}

/* The lines of /proc/PID/cgroup for the v2 hierarchy and for the v1 ones holding controller. */
static int read_memberships(const char *root, const char *proc, const char *controller,
                            dl_cgroup_place_t *ms, int max, int *ret_n)
{
    char path[4200], line[4200];
    snprintf(path, sizeof(path), "%s/proc/%s/cgroup", root, proc);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -errno;
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL && n < max) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL || c2[1] != '/')
            continue;
        *c1 = *c2 = '\0';
        bool v2 = strcmp(line, "0") == 0 && c1[1] == '\0';
        if (!v2 && !has_word(c1 + 1, controller))
            continue;
        ms[n].v2 = v2;
        snprintf(ms[n].dir, sizeof(ms[n].dir), "%s", c2 + 1);
        n++;
    }
    fclose(f);
    *ret_n = n;
    return 0;
}

int dl_cgroup_places(const char *root, pid_t pid, const char *controller, dl_cgroup_place_t *ret,
                     int max, int *ret_n)
{
    dl_cgroup_place_t ms[DL_CGROUP_PLACES];
    char proc[32], path[4200], line[8192], vbuf[16384];
    int n = 0, found = 0;

    if (pid > 0)
        snprintf(proc, sizeof(proc), "%d", (int)pid);
    else
        snprintf(proc, sizeof(proc), "self");
    int r = read_memberships(root, proc, controller, ms, DL_CGROUP_PLACES, &n);
    if (r < 0)
        return r;
    snprintf(path, sizeof(path), "%s/proc/%s/mountinfo", root, proc);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -errno;
    /* stdio reads /proc files 1 KB at a time (their st_blksize), and the kernel walks the mount
     * table again from its start for every read: a host's hundreds of mounts cost many walks. */
    setvbuf(f, vbuf, _IOFBF, sizeof(vbuf));
    while (fgets(line, sizeof(line), f) != NULL && found < max) {
        char *mroot, *mnt, *fstype, *opts;
        if (!split_mount(line, &mroot, &mnt, &fstype, &opts))
            continue;
        bool v2 = strcmp(fstype, "cgroup2") == 0;
        if (!v2 && (strcmp(fstype, "cgroup") != 0 || !has_word(opts, controller)))
            continue;
        for (int i = 0; i < n && found < max; i++) {
            size_t rl = strcmp(mroot, "/") == 0 ? 0 : strlen(mroot);
            /* A cgroup outside what is mounted (another namespace's) cannot be read here. */
            if (ms[i].v2 != v2 || strncmp(ms[i].dir, mroot, rl) != 0 ||
                (ms[i].dir[rl] != '/' && ms[i].dir[rl] != '\0'))
                continue;
            const char *rel = ms[i].dir + rl;
            dl_cgroup_place_t *p = &ret[found];
            p->v2 = v2;
            if (snprintf(p->mount, sizeof(p->mount), "%s", mnt) >= (int)sizeof(p->mount) ||
                snprintf(p->dir, sizeof(p->dir), "%s%s", strcmp(mnt, "/") == 0 ? "" : mnt,
                         strcmp(rel, "/") == 0 ? "" : rel) >= (int)sizeof(p->dir))
                continue; /* deeper than any cgroup can be */
            if (p->dir[0] == '\0')
                snprintf(p->dir, sizeof(p->dir), "/");
            found++;
        }
    }
    fclose(f);
    *ret_n = found;
    return 0;
}

const dl_cgroup_place_t *dl_cgroup_charging(const dl_cgroup_place_t *places, int n)
{
    const dl_cgroup_place_t *p = NULL;
    for (int i = 0; i < n; i++)
        if (p == NULL || (p->v2 && !places[i].v2))
            p = &places[i];
    return p;
}

/* Whether path (under root) is a cgroup file system of that version. */
static bool is_cgroupfs(const char *root, const char *path, bool v2)
{
    char full[4200];
    struct statfs sf;
    snprintf(full, sizeof(full), "%s%s", root, path);
    /* CGROUP_SUPER_MAGIC and CGROUP2_SUPER_MAGIC of linux/magic.h */
    return statfs(full, &sf) == 0 && sf.f_type == (v2 ? 0x63677270 : 0x27e0eb);
}

static bool exists(const char *root, const char *dir, const char *file)
{
    char full[4200];
    snprintf(full, sizeof(full), "%s%s/%s", root, dir, file);
    return access(full, F_OK) == 0;
}

int dl_cgroup_place_quick(const char *root, const char *controller, const char *v1_file,
                          dl_cgroup_place_t *ret)
{
    dl_cgroup_place_t ms[DL_CGROUP_PLACES];
    char path[4200], ns[64];
    int n = 0;

    int r = read_memberships(root, "self", controller, ms, DL_CGROUP_PLACES, &n);
    if (r < 0)
        return r;
    /* Read after /proc/self/cgroup, which makes the kernel look up /proc/self once for both.
     * In the first cgroup namespace, /proc/self/cgroup's paths start at each hierarchy's root;
     * in another they start at the namespace's, which only mountinfo relates to a folder. */
    snprintf(path, sizeof(path), "%s/proc/self/ns/cgroup", root);
    ssize_t len = readlink(path, ns, sizeof(ns) - 1);
    if (len < 0 || (size_t)len != strlen("cgroup:[4026531835]") ||
        memcmp(ns, "cgroup:[4026531835]", (size_t)len) != 0)
        return 0;
    /* A v1 hierarchy is taken before the v2 one, as dl_memcg_open takes it: its mount point
     * must hold the controller's file and be the hierarchy's root (only that has
     * release_agent), not a folder of it mounted alone. */
    const dl_cgroup_place_t *m = dl_cgroup_charging(ms, n);
    if (m == NULL)
        return 0;
    char mount[256];
    snprintf(mount, sizeof(mount), "/sys/fs/cgroup%s%s", m->v2 ? "" : "/", m->v2 ? "" : controller);
    if (!is_cgroupfs(root, mount, m->v2))
        return 0;
    /* v2's root is the one folder without cgroup.type. */
    if (m->v2 ? exists(root, mount, "cgroup.type")
              : !exists(root, mount, "release_agent") || !exists(root, mount, v1_file))
        return 0;
    ret->v2 = m->v2;
    snprintf(ret->mount, sizeof(ret->mount), "%s", mount);
    if (snprintf(ret->dir, sizeof(ret->dir), "%s%s", mount,
                 strcmp(m->dir, "/") == 0 ? "" : m->dir) >= (int)sizeof(ret->dir))
        return 0;
    return 1;
}

int dl_cgroup_cpu_quota(const char *root, dl_cpu_quota_t *ret, char *warn, size_t warnlen)
{
    dl_cgroup_place_t places[DL_CGROUP_PLACES];
    dl_cpu_quota_t q = {-1, 0, ""};
    int n = 0;

    if (warn != NULL && warnlen > 0)
        warn[0] = '\0';
    int r = dl_cgroup_places(root, 0, "cpu", places, DL_CGROUP_PLACES, &n);
    if (r < 0)
        return r;
    /* The kernel enforces the smallest quota of any level up to the mount's root. */
    for (int i = 0; i < n; i++) {
        do {
            char dir[sizeof(places[i].dir) + 512], file[sizeof(q.file)];
            long long lq, lp;
            snprintf(dir, sizeof(dir), "%s%s", root, places[i].dir);
            if (read_level(dir, places[i].v2, &lq, &lp, file, sizeof(file), warn, warnlen) &&
                lq > 0 &&
                (q.quota_us < 0 || (long double)lq * q.period_us < (long double)q.quota_us * lp)) {
                q.quota_us = lq;
                q.period_us = lp;
                snprintf(q.file, sizeof(q.file), "%s", file);
            }
        } while (dl_cgroup_parent(places[i].dir, places[i].mount));
    }
    *ret = q;
    return 0;
}

int dl_cgroup_cpu_workers(int affinity_cpus, const dl_cpu_quota_t *q)
{
    int n = affinity_cpus > 0 ? affinity_cpus : 1;
    if (q != NULL && q->quota_us > 0 && q->period_us > 0) {
        long long whole = q->quota_us / q->period_us;
        if (whole < 1)
            whole = 1;
        if (whole < n)
            n = (int)whole;
    }
    return n;
}
