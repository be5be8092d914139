/* The worker's lines on the control channel (recline.h): what a hostile or broken worker can
 * write must come out as fields in range, or as missing. */
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "recline.h"

DL_TEST(a_recovered_line_reads_its_fields)
{
    dl_recline_t m;
    ck_assert_int_eq(dl_recline_parse("recovered gen=3 rank=1 step=120 was=121 source=0 ms=40", &m),
                     DL_RECLINE_RECOVERED);
    ck_assert_int_eq(m.gen, 3);
    ck_assert(m.has_step && m.step == 120);
    ck_assert(m.has_was && m.was == 121);
    ck_assert(m.has_source && m.source == 0);
    ck_assert_int_eq(dl_recline_parse("recovered gen=1 step=0 was=-1", &m), DL_RECLINE_RECOVERED);
    ck_assert(m.has_was && m.was == -1);
    ck_assert_int_eq(dl_recline_parse("hello gen=0 rank=2 pid=9", &m), DL_RECLINE_HELLO);
    ck_assert_int_eq(dl_recline_parse("hellothere", &m), DL_RECLINE_OTHER);
    ck_assert_int_eq(dl_recline_parse("", &m), DL_RECLINE_OTHER);
}

DL_TEST(numbers_out_of_range_are_missing)
{
    /* step near -2^63 made the agent's "steps redone" (was - step) overflow. */
    static const char *const bad[] = {
        "recovered gen=1 step=-9223372036854775808 was=9223372036854775807",
        "recovered gen=1 step=99999999999999999999 was=x",
        "recovered gen=1 step=+5 was=-2",
        "recovered gen=1 step=5x was=",
        "recovered gen=1 step=4611686018427387905 was=4611686018427387905",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dl_recline_t m;
        ck_assert_int_eq(dl_recline_parse(bad[i], &m), DL_RECLINE_RECOVERED);
        ck_assert_msg(!m.has_step && !m.has_was, "%s", bad[i]);
    }
    dl_recline_t m;
    /* atoi of these was undefined; now they are missing. */
    dl_recline_parse("failed gen=99999999999 source=-4", &m);
    ck_assert_int_eq(m.gen, -1);
    ck_assert(!m.has_source);
}

DL_TEST(a_reason_reaches_no_terminal_raw)
{
    dl_recline_t m;
    ck_assert_int_eq(dl_recline_parse("failed gen=2 reason=peer gone \x1b[2J\x1b]0;t\x07 \x7f", &m),
                     DL_RECLINE_FAILED);
    ck_assert(m.has_reason);
    ck_assert_str_eq(m.reason, "peer gone ?[2J?]0;t? ?");
    /* The rest of the line, cut to fit. */
    char line[2000] = "broken gen=0 reason=";
    memset(line + strlen(line), 'r', 1500);
    line[1999] = '\0';
    dl_recline_parse(line, &m);
    ck_assert_uint_eq(strlen(m.reason), sizeof(m.reason) - 1);
}
