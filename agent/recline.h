/* A line a worker writes on its control channel (docs/recovery.md, "the control channel"),
 * read into fields. Pure: no I/O, for the agent and for fuzz/fuzz-recline.c. */
#ifndef DL_RECLINE_H
#define DL_RECLINE_H

#include <stdbool.h>

typedef enum {
    DL_RECLINE_OTHER = 0, /* an unknown verb: ignored, as the document says */
    DL_RECLINE_HELLO,
    DL_RECLINE_RECOVERED,
    DL_RECLINE_BROKEN,
    DL_RECLINE_FAILED,
} dl_recline_verb_t;

/* The fields of a line. A number that is missing, is not a plain decimal or is out of its
 * range counts as missing: gen, source >= 0 and within int; step within 0..2^62; was within
 * -1..2^62 (so that no difference of two steps overflows). reason (the rest of the line) has
 * its control characters replaced by '?'. */
typedef struct {
    dl_recline_verb_t verb;
    int gen; /* -1 when missing */
    bool has_step, has_was, has_source, has_reason;
    long long step, was;
    int source;
    char reason[512];
} dl_recline_t;

/* Reads line (without its newline). Returns the verb, with *ret filled. */
dl_recline_verb_t dl_recline_parse(const char *line, dl_recline_t *ret);

#endif
