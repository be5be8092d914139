/* Files and folders the agent keeps in a log folder, which may sit on storage other users can
 * write (a shared scratch folder): never opened through a symbolic link, never a FIFO or a device
 * (whose open or read would block the agent), never a file or folder of another user. */
#ifndef DL_OWNFILE_H
#define DL_OWNFILE_H

#include <stddef.h>
#include <sys/types.h>

/* Opens path with flags (O_RDONLY, or O_WRONLY|O_CREAT|O_APPEND...) and mode, adding
 * O_NOFOLLOW, O_NONBLOCK and O_CLOEXEC, then checks that it is a regular file owned by this
 * process's user, and clears O_NONBLOCK; with O_CREAT, a file that does not exist yet is made with
 * O_EXCL and needs no check. Returns the fd, or -errno: -ELOOP for a symbolic link,
 * -EINVAL for a FIFO, device or folder, -EPERM for a file of another user. */
int dl_ownfile_open(const char *path, int flags, mode_t mode);

/* Checks a folder the agent writes into: a real folder (not a symbolic link), owned by this
 * process's user, that no one else may write (group or others) unless only its owner may
 * delete what is in it (the sticky bit is not enough: others could still add files). Returns
 * 0, or -ENOTDIR, -EPERM (another user's) or -EACCES (others may write it). */
int dl_ownfile_check_dir(const char *path);

/* What an error of the two calls above means, for a one-line message. */
const char *dl_ownfile_strerror(int err);

/* Replaces every control character of text (ASCII below 0x20 and DEL), but newlines where
 * keep_newlines, by '?': text a worker wrote goes to a terminal without escape sequences.
 * Returns text. */
char *dl_ownfile_clean(char *text, int keep_newlines);

#endif
