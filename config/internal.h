/* Shared between the files of config/: the option table and its setters. */
#ifndef DL_CONFIG_INTERNAL_H
#define DL_CONFIG_INTERNAL_H

#include "config.h"

typedef enum {
    DL__OPT_INT,    /* int within [min, max] */
    DL__OPT_DOUBLE, /* double within [min, max] */
    DL__OPT_STRING, /* non-empty char * */
    DL__OPT_BOOL,   /* flag without a value on the command line */
    DL__OPT_NODES,  /* N or MIN:MAX into nodes_min / nodes_max */
    DL__OPT_GPUS,   /* N or "auto" */
} dl__opt_kind_t;

typedef struct dl__option_s {
    const char *name;  /* command-line name without "--"; YAML key and env name derive from it */
    const char *alias; /* another command-line name, or NULL */
    char short_name;   /* or 0 */
    dl__opt_kind_t kind;
    size_t offset; /* into dl_job_spec_t */
    double min, max;
    const char *metavar;
    const char *help;
    bool cli_only; /* --help, --version: no YAML key, no variable */
} dl__option_t;

extern const dl__option_t dl__options[];
extern const size_t dl__options_count;

/* Finds an option by YAML key ("max_restarts") or NULL. */
const dl__option_t *dl__option_by_key(const char *key);

/* Sets opt from text. where names the source for messages ("--nodes", "job.yaml:3:8: nodes").
 * from_yaml: booleans must be YAML booleans (true/false). */
int dl__option_set(dl_job_spec_t *spec, const dl__option_t *opt, const char *text,
                   const char *where, char *err, size_t errlen);

/* "max-restarts" -> "max_restarts" (yaml) and "DLAUNCH_MAX_RESTARTS" (env), into buf. */
void dl__option_key(const dl__option_t *opt, char *buf, size_t len);
void dl__option_env_name(const dl__option_t *opt, char *buf, size_t len);

/* Frees and replaces a NULL-terminated string vector. */
void dl__strv_free(char **v);

#endif
