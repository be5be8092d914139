/* Reading a worker's error file (errorfile.h). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errorfile.h"
#include "ownfile.h"

/* An error file is a message and a traceback; anything near this is not one. */
#define MAX_BYTES (1024 * 1024)

void dl_error_file_path(const char *attempt_dir, int rank, char *buf, size_t len)
{
    snprintf(buf, len, "%s/rank_%d.error.json", attempt_dir, rank);
}

int dl_error_file_read(const char *path, char *msg, size_t msglen, char *trace, size_t tracelen)
{
    struct stat st;
    json_error_t je;
    /* The worker wrote it, or someone in its place: a FIFO or a link there must not block or
     * redirect the agent. */
    int fd = dl_ownfile_open(path, O_RDONLY, 0);
    if (fd < 0)
        return fd == -ENOENT ? 0 : fd;
    if (fstat(fd, &st) < 0 || st.st_size > MAX_BYTES) {
        int r = st.st_size > MAX_BYTES ? -EFBIG : -errno;
        close(fd);
        return r;
    }
    json_auto_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    close(fd);
    if (root == NULL)
        return -EBADMSG;
    json_t *m = json_object_get(root, "message");
    const char *text = NULL, *tb = NULL;
    if (json_is_string(m)) {
        text = json_string_value(m);
    } else if (json_is_object(m)) {
        text = json_string_value(json_object_get(m, "message"));
        tb = json_string_value(json_object_get(json_object_get(m, "extraInfo"), "py_callstack"));
    }
    if (text == NULL)
        return -EBADMSG;
    snprintf(msg, msglen, "%s", text);
    /* A traceback ends with what matters (the innermost frame, the exception): a long one keeps
     * its end. */
    tb = tb != NULL ? tb : "";
    size_t n = strlen(tb);
    const char *from = n >= tracelen ? tb + (n - (tracelen - 1)) : tb;
    while (from > tb && ((unsigned char)*from & 0xC0) == 0x80)
        from++; /* not in the middle of a UTF-8 character */
    snprintf(trace, tracelen, "%s", from);
    /* Both go to a terminal: no escape sequences, and the message stays one line. */
    dl_ownfile_clean(msg, 0);
    dl_ownfile_clean(trace, 1);
    return 1;
}
