/* Where the heartbeat's training progress comes from: the health beats of global rank 0, when
 * this node runs it and its worker reports figures (the bundled trainer does; any worker can, in
 * the documented beat format, docs/diagnostics.md). rdzv.c only reads a->progress and
 * a->progress_valid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void dl__agent_progress_poll(dl_agent_t *a)
{
    if (a->nworkers < 1 || a->workers == NULL || a->workers[0].rank != 0)
        return;
    const dl_diag_beats_t *b = &a->workers[0].beats;
    if (!b->figures)
        return;
    double step_ms = b->compute_ms + b->wait_ms;
    a->progress.step = (long long)b->step;
    a->progress.loss = b->loss;
    /* Every rank takes a step of its own batch in that time: the job's rate. */
    a->progress.samples_per_s = step_ms > 0 && b->samples > 0
                                    ? b->samples * (double)a->world_size / (step_ms / 1000.0)
                                    : NAN;
    a->progress_valid = true;
}
