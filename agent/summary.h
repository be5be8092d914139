/* The failure summary printed when a job gives up, and signal names for messages. */
#ifndef DL_SUMMARY_H
#define DL_SUMMARY_H

#include <stddef.h>
#include <stdio.h>

#include "supervisor.h"

/* "SIGKILL", or "signal 77" for numbers without a name (static storage, not reentrant). */
const char *dl_signal_name(int sig);

/* "its memory peak 180 MiB, the limit 192 MiB", leaving out what is not known (0). */
void dl_oom_text(long long peak, long long limit, char *buf, size_t len);

/* A log file whose writing failed (a full disk): what it holds ends where the error began. */
typedef struct {
    char *path;
    int err; /* errno */
} dl_summary_unwritten_t;

/* Prints what failed: one line per failed attempt (at most the last few), then for the last
 * one its log path and the last lines of its stderr, saying so when that file could not be
 * written (it is then one of the nunwritten files of unwritten). */
void dl_summary_print(FILE *f, const dl_sup_failure_t *history, size_t n, int attempts,
                      const char *run_dir, const dl_summary_unwritten_t *unwritten,
                      size_t nunwritten);

/* Copies the last max_lines lines of the file at path into buf (NUL-terminated). Returns the
 * number of bytes, or -errno (ownfile.h's: a link, FIFO or another user's file is not read).
 * Control characters but newlines come out as '?'. */
int dl_summary_tail(const char *path, int max_lines, char *buf, size_t len);

#endif
