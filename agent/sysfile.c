/* See sysfile.h. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>

#include "sysfile.h"

int dl_sysfile_read(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -errno;
    size_t n = fread(buf, 1, len - 1, f);
    int e = ferror(f) ? -EIO : 0;
    bool more = !feof(f) && fgetc(f) != EOF;
    fclose(f);
    if (e < 0)
        return e;
    if (more)
        return -EFBIG;
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    return 0;
}
