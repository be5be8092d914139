/* Shared between the files of config/: the job spec's option table. */
#ifndef DL_CONFIG_INTERNAL_H
#define DL_CONFIG_INTERNAL_H

#include "config.h"
#include "opt.h"

/* The job spec's options, in --help order, and the table the engine reads them through. */
extern const dl_opt_t dl__options[];
extern const size_t dl__options_count;
extern const dl_opt_table_t dl__job_table;

/* A signal both forwarded (an explicit --forward-signals) and stopping the job
 * (--signals-to-handle) is a usage error: 0, or -EINVAL with err set. */
int dl__signals_check(const dl_job_spec_t *spec, char *err, size_t errlen);

/* Frees and replaces a NULL-terminated string vector. */
void dl__strv_free(char **v);

#endif
