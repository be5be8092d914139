/* Files and folders of the log folder (ownfile.h). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ownfile.h"

int dl_ownfile_open(const char *path, int flags, mode_t mode)
{
    struct stat st;
    /* A file this call creates is a new regular file of ours (O_EXCL makes no file through a
     * symbolic link and opens no FIFO): nothing to check. A worker's two logs are new at its
     * first start, and the checks were four system calls each. */
    if ((flags & O_CREAT) != 0) {
        int fd = open(path, flags | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST)
            return fd >= 0 ? fd : -errno;
    }
    /* O_NONBLOCK: opening a FIFO with no writer (or, to write, no reader) returns at once. */
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    int r = 0;
    if (fstat(fd, &st) < 0)
        r = -errno;
    else if (!S_ISREG(st.st_mode))
        r = -EINVAL;
    else if (st.st_uid != geteuid())
        r = -EPERM;
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
        r = -errno;
    if (r < 0) {
        close(fd);
        return r;
    }
    return fd;
}

int dl_ownfile_check_dir(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    if (st.st_uid != geteuid())
        return -EPERM;
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        return -EACCES;
    return 0;
}

const char *dl_ownfile_strerror(int err)
{
    switch (err) {
    case -ELOOP: return "it is a symbolic link";
    case -EINVAL: return "it is not a regular file";
    case -ENOTDIR: return "it is not a folder (a symbolic link?)";
    case -EPERM: return "it belongs to another user";
    case -EACCES: return "users other than its owner may write it";
    default: return strerror(-err);
    }
}

char *dl_ownfile_clean(char *text, int keep_newlines)
{
    for (unsigned char *p = (unsigned char *)text; *p != '\0'; p++) {
        if ((*p < 0x20 && !(keep_newlines && *p == '\n') && *p != '\t') || *p == 0x7f)
            *p = '?';
    }
    return text;
}
