/* libFuzzer target for what diag/ parses from others: health beats (any worker writes them) and
 * node reports (they come over the network).
 *
 * The input is used both ways, and the rules must hold, so the fuzzer finds wrong answers as well
 * as crashes:
 *   - as a beat stream, fed whole and in pieces whose size the input picks: the same figures,
 *     every sum finite and not negative;
 *   - as a JSON report (proto/node-report.h): when the decoder takes it, reading it, the straggler rule over it and the
 *     one-line account never fail, and the account is one NUL-terminated line.
 * A broken rule calls abort(). The ordinary build replays every file of fuzz/corpus/diag/ through
 * this entry point (fuzz/replay.c, the unit test diag-corpus).
 *
 * Build: CC=clang meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz fuzz/fuzz-diag
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "fuzz.h"
#include "rdzv-report.h"

static void check_beats(const dl_diag_beats_t *b)
{
    DL_FUZZ_REQUIRE(isfinite(b->total_steps) && b->total_steps >= 0);
    DL_FUZZ_REQUIRE(isfinite(b->total_compute_ms) && b->total_compute_ms >= 0);
    DL_FUZZ_REQUIRE(isfinite(b->total_wait_ms) && b->total_wait_ms >= 0);
    DL_FUZZ_REQUIRE(isfinite(b->total_samples) && b->total_samples >= 0);
    DL_FUZZ_REQUIRE(b->partial_len < sizeof(b->partial));
}

static void as_beats(const uint8_t *data, size_t size)
{
    dl_diag_beats_t whole, pieces;
    dl_diag_beats_init(&whole);
    dl_diag_beats_init(&pieces);
    dl_diag_beats_feed(&whole, (const char *)data, size, 1.0);
    size_t step = size > 0 ? (size_t)data[0] % 17 + 1 : 1;
    for (size_t off = 0; off < size; off += step)
        dl_diag_beats_feed(&pieces, (const char *)data + off, size - off < step ? size - off : step,
                           1.0);
    check_beats(&whole);
    check_beats(&pieces);
    /* Bare bytes are counted as they come, so only lines must agree. */
    DL_FUZZ_REQUIRE(whole.figures == pieces.figures && whole.step == pieces.step);
    DL_FUZZ_REQUIRE(whole.total_steps == pieces.total_steps);
}

static void as_report(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *json = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    char err[256];
    dl_proto_node_report_t rep;
    if (json == NULL)
        return;
    if (dl_proto_node_report_decode(json, &rep, err, sizeof(err)) < 0) {
        DL_FUZZ_REQUIRE(err[0] != '\0');
        json_decref(json);
        return;
    }
    size_t n = rep.nranks;
    dl_diag_totals_t *t = calloc(n + 1, sizeof(*t));
    dl_diag_rank_t *r = calloc(n + 1, sizeof(*r));
    DL_FUZZ_REQUIRE(t != NULL && r != NULL);
    for (size_t i = 0; i < n; i++) {
        dl_rdzv_report_rank(&rep, i, 0.5, &r[i]);
        (void)dl_rdzv_report_totals(&rep, i, &t[i]);
    }
    char line[1024];
    size_t len = dl_diag_explain(r, n, line, sizeof(line));
    DL_FUZZ_REQUIRE(len == strlen(line) && len < sizeof(line));
    DL_FUZZ_REQUIRE(strchr(line, '\n') == NULL);
    dl_diag_straggler_opts_t o;
    dl_diag_judge_t *j;
    dl_diag_straggler_opts_init(&o);
    DL_FUZZ_REQUIRE(dl_diag_judge_new(&o, &j) == 0);
    dl_diag_view_t v;
    for (int round = 0; round < 4; round++) {
        DL_FUZZ_REQUIRE(dl_diag_judge_feed(j, t, n) == 0); /* the checker refused negative ranks */
        DL_FUZZ_REQUIRE(dl_diag_judge_eval(j, &v) == 0);
        for (size_t i = 0; i < n; i++)
            t[i].steps += 10, t[i].compute_ms += 10 * (double)(i + 1);
    }
    DL_FUZZ_REQUIRE(v.nstragglers <= n && (v.slowest_rank < 0 || v.ranks > 0));
    dl_diag_judge_free(j);
    free(t);
    free(r);
    dl_proto_rec_free(&dl_proto_node_report_type, &rep);
    json_decref(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    as_beats(data, size);
    as_report(data, size);
    return 0;
}
