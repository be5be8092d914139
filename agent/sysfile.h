/* Reading the small text files of /proc, /sys and cgroup folders. */
#ifndef DL_SYSFILE_H
#define DL_SYSFILE_H

#include <stddef.h>

/* Reads the file at path whole into buf (len bytes), without trailing newlines and spaces.
 * Returns 0, -errno, or -EFBIG when it does not fit. */
int dl_sysfile_read(const char *path, char *buf, size_t len);

#endif
