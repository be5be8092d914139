/* A job spec with a train: section runs the bundled trainer: its settings are checked here,
 * where errors can still name file:line:column, and become the workers' command line. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train-command.h"
#include "trainer.h"

/* Installed, the trainer sits beside dlaunch; in the build tree, in ../trainer. */
static int find_trainer(char *buf, size_t len)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0)
        return -errno;
    self[n] = '\0';
    const char *dir = dirname(self);
    snprintf(buf, len, "%s/dlaunch-train", dir);
    if (access(buf, X_OK) == 0)
        return 0;
    snprintf(buf, len, "%s/../trainer/dlaunch-train", dir);
    if (access(buf, X_OK) == 0)
        return 0;
    return -ENOENT;
}

static void warn_unknown(void *ctx, const char *var, const char *closest)
{
    (void)ctx;
    fprintf(stderr, "dlaunch: warning: %s is no trainer setting%s%s%s; it is ignored\n", var,
            closest ? " (did you mean " : "", closest ? closest : "", closest ? "?)" : "");
}

/* The command runs the bundled trainer itself (`-- dlaunch-train ...`, any path to it). */
static bool runs_trainer(const dl_job_spec_t *spec)
{
    if (spec->command == NULL || spec->command[0] == NULL)
        return false;
    const char *slash = strrchr(spec->command[0], '/');
    return strcmp(slash != NULL ? slash + 1 : spec->command[0], "dlaunch-train") == 0;
}

int dl_train_command(dl_job_spec_t *spec, char **environ_list, char *err, size_t errlen)
{
    dl_train_config_t cfg;
    char msg[512], path[4200];
    int r = 0;

    if (spec->train == NULL && !runs_trainer(spec))
        return 0;
    /* The bundled trainer heals from its replicas (docs/recovery.md); a command we do not know
     * may not implement the control channel, so it keeps restart. */
    if (spec->recovery == NULL && (spec->recovery = strdup("in-job")) == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    /* A spare waits for a rank in dlaunch.torch's import; the trainer has no such wait and
     * would start as a rank of its own. */
    if (spec->spares > 0) {
        snprintf(err, errlen,
                 "--spares %d: the bundled trainer does not wait as a spare (only "
                 "PyTorch programs with dlaunch.torch do; docs/recovery.md)",
                 spec->spares);
        return -EINVAL;
    }
    dl_train_config_init(&cfg);
    /* The workers inherit DLAUNCH_TRAIN_*: a bad one must stop dlaunch here, before anything
     * starts, not every worker of every attempt. */
    dl_opt_unknown_vars(&dl_train_settings, environ_list, warn_unknown, NULL);
    r = dl_opt_from_env(&dl_train_settings, &cfg, environ_list, err, errlen);
    for (size_t i = 0; i < spec->train_len && r == 0; i++) {
        char *eq = strchr(spec->train[i], '=');
        *eq = '\0';
        bool known = dl_opt_by_key(&dl_train_settings, spec->train[i]) != NULL;
        r = dl_train_config_set(&cfg, spec->train[i], eq + 1, msg, sizeof(msg));
        *eq = '=';
        /* A bad key is pointed at where the key is, a bad value where the value is. */
        if (r < 0)
            snprintf(err, errlen, "%s: train: %s",
                     known ? spec->train_where[i] : spec->train_key_where[i], msg);
    }
    /* Without a train: section the command's own --set may complete the settings: only the
     * variables are dlaunch's to check. */
    if (spec->train == NULL) {
        dl_train_config_free(&cfg);
        return r;
    }
    if (r == 0 && (r = dl_train_config_check(&cfg, msg, sizeof(msg))) < 0)
        snprintf(err, errlen, "%s: train: %s", spec->spec_path ? spec->spec_path : "train", msg);
    dl_train_config_free(&cfg);
    if (r < 0 || spec->command != NULL) /* an explicit command wins; the settings were checked */
        return r;
    r = find_trainer(path, sizeof(path));
    if (r < 0) {
        snprintf(err, errlen, "cannot find the bundled trainer dlaunch-train beside dlaunch");
        return r;
    }
    char **argv = calloc(2 * spec->train_len + 2, sizeof(char *));
    if (argv == NULL || (argv[0] = strdup(path)) == NULL) {
        free(argv);
        return -ENOMEM;
    }
    size_t k = 1;
    for (size_t i = 0; i < spec->train_len; i++) {
        argv[k++] = strdup("--set");
        argv[k++] = strdup(spec->train[i]);
        if (argv[k - 1] == NULL || argv[k - 2] == NULL) {
            for (size_t j = 0; j < k; j++)
                free(argv[j]);
            free(argv);
            return -ENOMEM;
        }
    }
    spec->command = argv;
    spec->command_len = k;
    return 0;
}
