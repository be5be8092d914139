/* A worker's stdout and stderr for one attempt: read from pipes, filed raw into
 * rank_N.{out,err}, echoed line by line with a rank prefix. Lives until both pipes reach EOF,
 * independent of the worker, so a respawn never waits for the old output to drain. */
#ifndef DL_OUTPUT_H
#define DL_OUTPUT_H

#include <stdbool.h>
#include <uv.h>

typedef struct dl_output_s dl_output_t;

/* Which streams dl_output_open echoes to the agent's console. */
enum { DL_OUTPUT_ECHO_OUT = 1, DL_OUTPUT_ECHO_ERR = 2 };
/* With the streams' bits: the echoed lines go to the line callback only, which prints them
 * (--merge-output folds several ranks' lines into one). */
enum { DL_OUTPUT_ECHO_VIA_CB = 4 };

/* What the owner hears about an output; both optional, ctx is dl_output_open's. */
typedef struct {
    /* Writing a log file failed (a full disk, say): said once per file; the worker's output
     * still reaches the console and the other file. path is borrowed for the call. */
    void (*write_failed)(void *ctx, const char *path, int err);
    /* Both pipes reached EOF (or the drain timeout passed) and the files hold everything that
     * will ever be in them. Called once, after dl_output_drain(), just before the object goes. */
    void (*drained)(void *ctx);
    /* A line echoed to the console (stream 0: stdout, 1: stderr), just after it was written;
     * prefix, line (len bytes, no newline) are borrowed for the call. */
    void (*line)(void *ctx, int stream, const char *prefix, const char *line, size_t len);
} dl_output_cbs_t;

/* Creates the log files attempt_dir/rank_N.{out,err} (a negative rank: spare_K for -1 - K) and
 * two pipes. *ret_child_out/err are the
 * write ends for the child (the caller closes them after spawning). echo (DL_OUTPUT_ECHO_*): the
 * streams whose lines are copied to the agent's stdout/stderr with prefix. readbuf is a scratch buffer shared by all outputs. cbs
 * (copied; may be NULL) and ctx report to the owner. The files are opened for appending and never
 * truncated: a log folder is never reused, and what is in a file stays. Returns 0 or -errno; on
 * failure nothing is left open and no callback runs. */
int dl_output_open(uv_loop_t *loop, const char *attempt_dir, int rank, const char *prefix,
                   unsigned echo, char *readbuf, size_t readbuf_len, const dl_output_cbs_t *cbs,
                   void *ctx, dl_output_t **ret, int *ret_child_out, int *ret_child_err);

/* The prefix of the lines echoed from now on (a hot spare that took a rank). */
void dl_output_set_prefix(dl_output_t *o, const char *prefix);

/* The worker has exited: gives up the caller's reference. Whatever is still buffered in the
 * pipes is read for at most timeout_ms (processes outside its group may hold them), then the
 * object closes and frees itself; o must not be used after this call. */
void dl_output_drain(dl_output_t *o, uint64_t timeout_ms);

#endif
