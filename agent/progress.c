/* Where the heartbeat's training progress comes from.
 *
 * Until the workers' health beat carries it, this is the one place that finds it: for the bundled
 * trainer, the node that runs global rank 0 reads the last progress line rank 0 printed,
 *
 *   epoch 2 step 480/940 loss 0.4312 lr 0.04871 samples/s 8123 eta 12s
 *
 * from the end of its log file (a pread of 2 KiB once a heartbeat, nothing in between). Replace
 * the body of dl__agent_progress_poll when the beat format lands; rdzv.c only reads
 * a->progress and a->progress_valid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "summary.h"

/* Parses one progress line; returns false when line is not one. */
static bool parse_line(const char *line, dl_agent_progress_t *ret)
{
    const char *step = strstr(line, " step "), *loss = strstr(line, " loss ");
    const char *rate = strstr(line, " samples/s ");
    char *end;

    if (strncmp(line, "epoch ", 6) != 0 || step == NULL || loss == NULL)
        return false;
    long long s = strtoll(step + 6, &end, 10);
    if (end == step + 6 || s < 0)
        return false;
    ret->step = s;
    ret->loss = strtod(loss + 6, &end);
    if (end == loss + 6)
        ret->loss = NAN;
    ret->samples_per_s = rate != NULL ? strtod(rate + 11, &end) : NAN;
    if (rate != NULL && end == rate + 11)
        ret->samples_per_s = NAN;
    return true;
}

void dl__agent_progress_poll(dl_agent_t *a)
{
    char path[sizeof(a->attempt_dir) + 32], tail[2048];

    if (a->spec->train == NULL || a->nworkers < 1 || a->workers == NULL ||
        a->workers[0].rank != 0 || a->attempt_dir[0] == '\0')
        return;
    snprintf(path, sizeof(path), "%s/rank_0.out", a->attempt_dir);
    if (dl_summary_tail(path, 8, tail, sizeof(tail)) <= 0)
        return;
    /* The last progress line wins; checkpoint lines may follow it. */
    char *save = NULL;
    for (char *line = strtok_r(tail, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        dl_agent_progress_t p;
        if (parse_line(line, &p)) {
            a->progress = p;
            a->progress_valid = true;
        }
    }
}
