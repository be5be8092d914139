/* libFuzzer target for the file-timer watchdog's requests (agent/filetimer.c): any process of the
 * job may write lines into the named pipe torch's FileTimerClient uses. The input is several
 * lines, each parsed and applied to one table in turn, the way the agent reads the pipe. The
 * table's rules must hold after every line, so that wrong answers show as well as crashes: one
 * timer per (pid, scope), never more than the cap, fields in their documented ranges, and the
 * worker named due really is the earliest expired one with a signal. A broken rule calls abort().
 *
 * Build: CC=clang meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz fuzz/fuzz-filetimer
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "filetimer.h"
#include "fuzz.h"

static void check_table(const dl_filetimer_table_t *tab)
{
    DL_FUZZ_REQUIRE(tab->n <= DL_FILETIMER_MAX_TIMERS && tab->n <= tab->cap);
    for (size_t i = 0; i < tab->n; i++) {
        const dl_filetimer_req_t *t = &tab->t[i];
        DL_FUZZ_REQUIRE(t->pid > 0 && t->signal >= 0 && t->signal <= 64);
        DL_FUZZ_REQUIRE(isfinite(t->expiration_time) && !(t->expiration_time < 0));
        DL_FUZZ_REQUIRE(memchr(t->scope_id, '\0', sizeof(t->scope_id)) != NULL);
        for (size_t j = i + 1; j < tab->n; j++)
            DL_FUZZ_REQUIRE(tab->t[j].pid != t->pid ||
                            strcmp(tab->t[j].scope_id, t->scope_id) != 0);
    }
}

static void check_due(const dl_filetimer_table_t *tab, double now)
{
    dl_filetimer_req_t due;
    int found = dl_filetimer_due(tab, now, &due);
    for (size_t i = 0; i < tab->n; i++) {
        const dl_filetimer_req_t *t = &tab->t[i];
        if (t->signal == 0 || t->expiration_time > now)
            continue;
        DL_FUZZ_REQUIRE(found == 1);
        DL_FUZZ_REQUIRE(due.expiration_time <= t->expiration_time);
    }
    if (found == 1)
        DL_FUZZ_REQUIRE(due.signal > 0 && due.expiration_time <= now);
    double next = dl_filetimer_next(tab);
    if (found == 1)
        DL_FUZZ_REQUIRE(!(next < 0) && next <= due.expiration_time);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dl_filetimer_table_t tab;
    dl_filetimer_init(&tab);
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl != NULL ? nl : end) - p);
        dl_filetimer_req_t req;
        memset(&req, 0x5a, sizeof(req));
        dl_filetimer_req_t before = req;
        if (dl_filetimer_parse(p, len, &req) == 0) {
            DL_FUZZ_REQUIRE(req.pid > 0 && req.signal >= 0 && req.signal <= 64);
            DL_FUZZ_REQUIRE(isfinite(req.expiration_time));
            DL_FUZZ_REQUIRE(memchr(req.scope_id, '\0', sizeof(req.scope_id)) != NULL);
            int rc = dl_filetimer_apply(&tab, &req);
            DL_FUZZ_REQUIRE(rc == 0 || rc == -E2BIG);
        } else {
            DL_FUZZ_REQUIRE(memcmp(&req, &before, sizeof(req)) == 0); /* untouched on failure */
        }
        check_table(&tab);
        check_due(&tab, 0);
        check_due(&tab, 1.7e9);
        check_due(&tab, INFINITY);
        p += len + (nl != NULL);
    }
    if (tab.n > 0) {
        int pid = tab.t[0].pid;
        dl_filetimer_forget_pid(&tab, pid);
        for (size_t i = 0; i < tab.n; i++)
            DL_FUZZ_REQUIRE(tab.t[i].pid != pid);
        check_table(&tab);
    }
    dl_filetimer_free(&tab);
    return 0;
}
