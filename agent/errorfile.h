/* TORCHELASTIC_ERROR_FILE: the JSON a worker leaves when it dies of an exception, as PyTorch's
 * @record decorator writes it. Read after the worker exits, for the failure summary and the
 * worker_exit event. */
#ifndef DL_ERRORFILE_H
#define DL_ERRORFILE_H

#include <stddef.h>

/* The path of rank's error file in an attempt's log folder, into buf. */
void dl_error_file_path(const char *attempt_dir, int rank, char *buf, size_t len);

/* Reads path: {"message": {"message": TEXT, "extraInfo": {"py_callstack": TRACE, ...}}}, or
 * {"message": TEXT}. Returns 1 with the message (its start) and the traceback ("" if none; its
 * end, when longer than the buffer) copied into the buffers, 0 when there is no file, or -errno
 * (-EBADMSG: not that JSON). */
int dl_error_file_read(const char *path, char *msg, size_t msglen, char *trace, size_t tracelen);

#endif
