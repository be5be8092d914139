/* libFuzzer target for the control channel's parser (agent/recline.c): any worker writes these
 * lines. The input is one line (cut at its first NUL). The rules must hold, so that wrong answers
 * show as well as crashes: every number is in its documented range or missing, and the reason
 * holds no control character. A broken rule calls abort().
 *
 * Build: CC=clang meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz fuzz/fuzz-recline
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "recline.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *line = malloc(size + 1);
    if (line == NULL)
        return 0;
    memcpy(line, data, size);
    line[size] = '\0';
    dl_recline_t m;
    dl_recline_verb_t v = dl_recline_parse(line, &m);
    DL_FUZZ_REQUIRE(v == m.verb);
    DL_FUZZ_REQUIRE(m.gen >= -1);
    if (m.has_step)
        DL_FUZZ_REQUIRE(m.step >= 0 && m.step <= (1LL << 62));
    if (m.has_was)
        DL_FUZZ_REQUIRE(m.was >= -1 && m.was <= (1LL << 62));
    if (m.has_step && m.has_was)
        DL_FUZZ_REQUIRE(m.was - m.step <= (1LL << 62) && m.was - m.step >= -(1LL << 62) - 1);
    if (m.has_source)
        DL_FUZZ_REQUIRE(m.source >= 0);
    DL_FUZZ_REQUIRE(memchr(m.reason, '\0', sizeof(m.reason)) != NULL);
    for (const unsigned char *p = (const unsigned char *)m.reason; *p != '\0'; p++)
        DL_FUZZ_REQUIRE(*p >= 0x20 && *p != 0x7f);
    free(line);
    return 0;
}
