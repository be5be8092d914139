/* Hostlist expansion against the real `scontrol show hostnames`, run live on every form of
 * hostlist-forms.txt. Skipped (exit 77) where scontrol is not installed (apt-get install -y
 * slurm-client); test-hostlist covers the same forms from the checked-in corpus everywhere. */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dl-test.h"
#include "slurm.h"

extern char **environ;

static char conf_dir[] = "/tmp/dl-test-scontrol.XXXXXX";
static char conf_path[sizeof(conf_dir) + 16];

static int have_scontrol(void)
{
    const char *path = getenv("PATH");
    char buf[4096];

    while (path != NULL && *path) {
        size_t n = strcspn(path, ":");
        snprintf(buf, sizeof(buf), "%.*s/scontrol", (int)n, path);
        if (access(buf, X_OK) == 0)
            return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

/* stdout and stderr of scontrol show hostnames LIST, NUL-terminated; the caller frees it. */
static char *scontrol_hostnames(const char *list)
{
    int fds[2], status;
    size_t len = 0, cap = 1 << 16;
    char *out = malloc(cap);
    pid_t pid;

    ck_assert_ptr_nonnull(out);
    posix_spawn_file_actions_t fa;
    char *argv[] = {"scontrol", "show", "hostnames", (char *)list, NULL};

    ck_assert_int_eq(pipe(fds), 0);
    /* posix_spawn, not fork: copying a sanitizer build's address space costs ~0.5 s a call. */
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    ck_assert_int_eq(posix_spawnp(&pid, "scontrol", &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    for (;;) {
        if (len + 1 == cap) {
            cap *= 2;
            out = realloc(out, cap);
            ck_assert_ptr_nonnull(out);
        }
        ssize_t r = read(fds[0], out + len, cap - len - 1);
        if (r < 0 && errno == EINTR)
            continue;
        ck_assert_int_ge(r, 0);
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fds[0]);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "scontrol died");
    out[len] = '\0';
    return out;
}

static void unescape(char *s)
{
    char *o = s;

    if (strcmp(s, "\\e") == 0) {
        *s = '\0';
        return;
    }
    for (; *s; s++) {
        if (*s == '\\' && s[1]) {
            s++;
            *o++ = *s == 't' ? '\t' : *s == 'n' ? '\n' : *s;
        } else {
            *o++ = *s;
        }
    }
    *o = '\0';
}

static void compare(const char *list, int strict)
{
    char *want = scontrol_hostnames(list), err[512], **hosts;
    size_t n;
    int r = dl_hostlist_expand(list, &hosts, &n, err, sizeof(err));

    if (strict || strstr(want, "Invalid hostlist") != NULL) {
        ck_assert_msg(r < 0, "'%s': scontrol %s it, we accepted it", list,
                      strict ? "repairs" : "rejects");
        free(want);
        return;
    }
    ck_assert_msg(r == 0, "'%s': scontrol expands it, we fail: %s", list, err);
    char *line = want;
    for (size_t i = 0; i < n; i++) {
        /* Plain ifs: check's assertions do I/O on every call, too slow for 1,000,000 names. */
        char *nl = strchr(line, '\n');
        if (nl == NULL)
            ck_abort_msg("'%s': scontrol printed %zu names, we have %zu", list, i, n);
        *nl = '\0';
        if (strcmp(line, hosts[i]) != 0)
            ck_abort_msg("'%s' host %zu: '%s', scontrol '%s'", list, i, hosts[i], line);
        line = nl + 1;
    }
    ck_assert_msg(*line == '\0', "'%s': scontrol printed more than our %zu names", list, n);
    dl_hostlist_free(hosts);
    free(want);
}

DL_TEST(live_scontrol_agrees)
{
    const char *root = getenv("SOURCE_ROOT");
    char path[4096], line[8192];
    int forms = 0;
    FILE *f;

    ck_assert_msg(root != NULL, "SOURCE_ROOT is not set");
    snprintf(path, sizeof(path), "%s/tests/config/hostlist-forms.txt", root);
    f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    while (fgets(line, sizeof(line), f) != NULL) {
        char *tab;
        int strict = 0;

        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#')
            continue;
        tab = strchr(line, '\t');
        if (tab != NULL) {
            strict = strcmp(tab + 1, "strict") == 0;
            *tab = '\0';
        }
        unescape(line);
        compare(line, strict);
        forms++;
    }
    fclose(f);
    ck_assert_int_ge(forms, 80);
}

/* scontrol wants a slurm.conf, though `show hostnames` never talks to a controller. */
static int write_slurm_conf(int argc, char **argv)
{
    FILE *f;

    if (!have_scontrol()) {
        printf("scontrol not installed (apt-get install -y slurm-client): skipped\n");
        return 77;
    }
    if (mkdtemp(conf_dir) == NULL) {
        fprintf(stderr, "test-hostlist-scontrol: mkdtemp %s: %s\n", conf_dir, strerror(errno));
        return EXIT_FAILURE;
    }
    snprintf(conf_path, sizeof(conf_path), "%s/slurm.conf", conf_dir);
    f = fopen(conf_path, "w");
    if (f == NULL) {
        fprintf(stderr, "test-hostlist-scontrol: %s: %s\n", conf_path, strerror(errno));
        rmdir(conf_dir);
        return EXIT_FAILURE;
    }
    fputs("ClusterName=dltest\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\n"
          "PartitionName=p Nodes=n1\n",
          f);
    fclose(f);
    setenv("SLURM_CONF", conf_path, 1);
    return 0;
}

/* Whatever the outcome: the file only served scontrol. */
static int remove_slurm_conf(int failed)
{
    unlink(conf_path);
    rmdir(conf_dir);
    return 0;
}

DL_TEST_SUITE(.timeout = 60, .init = write_slurm_conf, .fini = remove_slurm_conf);
