/* A worker's stdout and stderr for one attempt: read from pipes, filed raw into
 * rank_N.{out,err}, echoed line by line with a rank prefix. Lives until both pipes reach EOF,
 * independent of the worker, so a respawn never waits for the old output to drain. */
#ifndef DL_OUTPUT_H
#define DL_OUTPUT_H

#include <stdbool.h>
#include <uv.h>

typedef struct dl_output_s dl_output_t;

/* Creates the log files attempt_dir/rank_N.{out,err} and two pipes. *ret_child_out/err are the
 * write ends for the child (the caller closes them after spawning). echo: copy lines to the
 * agent's stdout/stderr with prefix. readbuf is a scratch buffer shared by all outputs.
 * Returns 0 or -errno; on failure nothing is left open. */
int dl_output_open(uv_loop_t *loop, const char *attempt_dir, int rank, const char *prefix,
                   bool echo, char *readbuf, size_t readbuf_len, dl_output_t **ret,
                   int *ret_child_out, int *ret_child_err);

/* The worker has exited: gives up the caller's reference. Whatever is still buffered in the
 * pipes is read for at most timeout_ms (processes outside its group may hold them), then the
 * object closes and frees itself; o must not be used after this call. */
void dl_output_drain(dl_output_t *o, uint64_t timeout_ms);

#endif
