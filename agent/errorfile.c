/* Reading a worker's error file (errorfile.h). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "errorfile.h"

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

    if (stat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (st.st_size > MAX_BYTES)
        return -EFBIG;
    json_auto_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return -EBADMSG;
    json_t *m = json_object_get(root, "message");
    const char *text = NULL, *tb = NULL;
    if (json_is_string(m)) {
        text = json_string_value(m);
    } else if (json_is_object(m)) {
        text = json_string_value(json_object_get(m, "message"));
        tb = json_string_value(
            json_object_get(json_object_get(m, "extraInfo"), "py_callstack"));
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
    return 1;
}
