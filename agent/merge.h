/* --merge-output's core, pure: identical console lines from several ranks within a short window
 * become one line with the ranks they came from ("[ranks 0-7] loss 0.25"). No clock and no I/O:
 * the caller passes the time (seconds, monotonic) and prints what the callback hands it. */
#ifndef DL_MERGE_H
#define DL_MERGE_H

#include <stddef.h>

/* Lines held at once; one more pushes the oldest out, so a flood of distinct lines costs
 * bounded memory and only loses merging, never a line. */
#define DL_MERGE_MAX_PENDING 256

/* A merged line: ranks as text ("rank 3", "ranks 0-7", "ranks 0,2,5-6"), the line (len bytes,
 * no newline), both borrowed for the call. */
typedef void (*dl_merge_emit_cb)(void *ctx, int stream, const char *ranks, const char *line,
                                 size_t len);

typedef struct dl_merge_entry_s dl_merge_entry_t;

typedef struct {
    double window;          /* seconds a line waits for the same line from other ranks */
    dl_merge_entry_t *head; /* pending lines, oldest first; owned */
    dl_merge_entry_t *tail;
    size_t n;
    dl_merge_emit_cb emit;
    void *ctx;
} dl_merge_t;

void dl_merge_init(dl_merge_t *m, double window, dl_merge_emit_cb emit, void *ctx);

/* A line of rank's stream (0 stdout, 1 stderr) seen at now. The same text already pending from
 * other ranks gains this rank; from this rank again, the pending one is printed first (a rank's
 * own repeated lines are never folded). Lines whose window has passed are printed. Returns 0, or
 * -ENOMEM after printing the line on its own (nothing is lost). */
int dl_merge_line(dl_merge_t *m, int stream, int rank, const char *line, size_t len, double now);

/* Prints the lines whose window has passed by now. */
void dl_merge_due(dl_merge_t *m, double now);

/* When the oldest pending line is due, or a negative number when none is pending. */
double dl_merge_next(const dl_merge_t *m);

/* Prints everything pending (at exit, or before the agent's own lines) and frees it. */
void dl_merge_flush(dl_merge_t *m);

#endif
