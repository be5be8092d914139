/* A container or a Slurm step may cap CPU time with a quota while every CPU stays in the
 * affinity mask; the quota is what a worker count must respect. The kernel enforces the
 * smallest quota on the way from a cgroup to its hierarchy's root, so every level is read. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgroup.h"
#include "sysfile.h"
#include "config.h"

/* One hierarchy this process is in: where its cgroup lies in the hierarchy, and whether the
 * hierarchy is v2 or a v1 one with the cpu controller. */
typedef struct {
    bool v2;
    char path[4096];
} membership_t;

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
static bool read_level(const char *dir, bool v2, long long *quota, long long *period,
                       char *file, size_t flen, char *warn, size_t warnlen)
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
        if (!parse_ll(sp + 1, 1, &p) ||
            (strcmp(buf, "max") != 0 && !parse_ll(buf, 1, quota))) {
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
            set_warn(warn, warnlen, ppath,
                     r < 0 ? strerror(-r) : "is not a count of microseconds");
            return false;
        }
        *quota = q;
        *period = p;
    }
    if (snprintf(file, flen, "%s", path) >= (int)flen)
        file[0] = '\0'; /* only a message loses it */
    return true;
}

/* Walks from the cgroup's folder up to the mount point, keeping the smallest quota in *ret. */
static void walk_up(const char *top, const char *rel, bool v2, dl_cpu_quota_t *ret, char *warn,
                    size_t warnlen)
{
    char dir[4600];
    size_t top_len = strlen(top);
    snprintf(dir, sizeof(dir), "%s%s", top, strcmp(rel, "/") == 0 ? "" : rel);
    for (;;) {
        long long q, p;
        char file[sizeof(ret->file)];
        if (read_level(dir, v2, &q, &p, file, sizeof(file), warn, warnlen) && q > 0 &&
            (ret->quota_us < 0 ||
             (long double)q * ret->period_us < (long double)ret->quota_us * p)) {
            ret->quota_us = q;
            ret->period_us = p;
            snprintf(ret->file, sizeof(ret->file), "%s", file);
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= top_len || slash == NULL || (size_t)(slash - dir) < top_len)
            break;
        *slash = '\0';
    }
}

/* The hierarchies this process belongs to that can hold a CPU quota. */
static int read_memberships(const char *root, membership_t *ms, int max, int *ret_n)
{
    char path[4200], line[4200];
    snprintf(path, sizeof(path), "%s/proc/self/cgroup", root);
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
        if (!v2 && !has_word(c1 + 1, "cpu"))
            continue;
        ms[n].v2 = v2;
        snprintf(ms[n].path, sizeof(ms[n].path), "%s", c2 + 1);
        n++;
    }
    fclose(f);
    *ret_n = n;
    return 0;
}

int dl_cgroup_cpu_quota(const char *root, dl_cpu_quota_t *ret, char *warn, size_t warnlen)
{
    membership_t ms[4];
    char path[4200], line[8192];
    int n = 0, r;
    dl_cpu_quota_t q = {-1, 0, ""};

    if (warn != NULL && warnlen > 0)
        warn[0] = '\0';
    r = read_memberships(root, ms, 4, &n);
    if (r < 0)
        return r;
    snprintf(path, sizeof(path), "%s/proc/self/mountinfo", root);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -errno;
    while (fgets(line, sizeof(line), f) != NULL) {
        char *mroot, *mnt, *fstype, *opts;
        if (!split_mount(line, &mroot, &mnt, &fstype, &opts))
            continue;
        bool v2 = strcmp(fstype, "cgroup2") == 0;
        if (!v2 && (strcmp(fstype, "cgroup") != 0 || !has_word(opts, "cpu")))
            continue;
        for (int i = 0; i < n; i++) {
            size_t rl = strcmp(mroot, "/") == 0 ? 0 : strlen(mroot);
            /* A cgroup outside what is mounted (another namespace's) cannot be read here. */
            if (ms[i].v2 != v2 || strncmp(ms[i].path, mroot, rl) != 0 ||
                (ms[i].path[rl] != '/' && ms[i].path[rl] != '\0'))
                continue;
            char top[4600];
            snprintf(top, sizeof(top), "%s%s", root, strcmp(mnt, "/") == 0 ? "" : mnt);
            walk_up(top, ms[i].path[rl] == '\0' ? "/" : ms[i].path + rl, v2, &q, warn,
                    warnlen);
        }
    }
    fclose(f);
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
