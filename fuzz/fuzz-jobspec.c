/* libFuzzer target for the YAML job spec, its train: section included: whatever the bytes, the
 * loader either fills a spec or fails with one line naming the file (and line:column where
 * there is one); the trainer's table then takes or refuses each train: entry with one line;
 * nothing leaks (ASan) and nothing overflows (UBSan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz.h"
#include "trainer.h"

static void one_line(const char *err, const char *prefix)
{
    if (err[0] == '\0' || strchr(err, '\n') != NULL || strncmp(err, prefix, strlen(prefix)) != 0) {
        fprintf(stderr, "bad error line: '%s'\n", err);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dl_job_spec_t spec;
    char err[DL_CONFIG_ERRLEN] = "";

    dl_job_spec_init(&spec);
    int r =
        dl_config_load_yaml_string(&spec, "fuzz.yaml", (const char *)data, size, err, sizeof(err));
    if (r < 0) {
        one_line(err, "fuzz.yaml");
    } else if (spec.train != NULL) {
        dl_train_config_t cfg;
        dl_train_config_init(&cfg);
        for (size_t i = 0; i < spec.train_len; i++) {
            char *eq = strchr(spec.train[i], '=');
            if (eq == NULL || spec.train_where[i] == NULL || spec.train_key_where[i] == NULL)
                abort();
            *eq = '\0';
            err[0] = '\0';
            if (dl_train_config_set(&cfg, spec.train[i], eq + 1, err, sizeof(err)) < 0)
                one_line(err, "");
            *eq = '=';
        }
        err[0] = '\0';
        if (dl_train_config_check(&cfg, err, sizeof(err)) < 0)
            one_line(err, "");
        dl_train_config_free(&cfg);
    }
    dl_job_spec_free(&spec);
    return 0;
}
