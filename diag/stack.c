/* Reading a Python stack dump as faulthandler writes it (the dlaunch package's stacks file,
 * docs/python.md): every dump is one block a thread, "Thread 0x... (most recent call first):" or
 * "Current thread 0x... (most recent call first):", then a line a frame,
 * `  File "/path/x.py", line 42 in fn`, innermost first, then an empty line. The interpreter
 * lists its threads newest first, so the main thread, the one a training loop runs in, is the
 * last block of a dump, and the last block of the text is the newest dump's main thread. */
#include <stdio.h>
#include <string.h>

#include "diag.h"

static bool starts_with(const char *p, const char *end, const char *s)
{
    size_t n = strlen(s);
    return (size_t)(end - p) >= n && memcmp(p, s, n) == 0;
}

/* One frame line into "x.py:42 fn" at o; returns the bytes written (0: not a frame line). */
static size_t frame(const char *p, const char *end, char *o, size_t room)
{
    if (!starts_with(p, end, "  File \""))
        return 0;
    p += 8;
    const char *q = memchr(p, '"', (size_t)(end - p));
    if (q == NULL || !starts_with(q, end, "\", line "))
        return 0;
    const char *base = p;
    for (const char *s = p; s < q; s++)
        if (*s == '/')
            base = s + 1;
    const char *ln = q + 8, *in = ln;
    while (in < end && *in >= '0' && *in <= '9')
        in++;
    if (in == ln || !starts_with(in, end, " in "))
        return 0;
    const char *fn = in + 4;
    int n = snprintf(o, room, "%.*s:%.*s %.*s", (int)(q - base), base, (int)(in - ln), ln,
                     (int)(end - fn), fn);
    return n < 0 ? 0 : (size_t)n < room ? (size_t)n : room - 1;
}

size_t dl_diag_stack_top(const char *text, size_t len, int frames, char *buf, size_t buflen)
{
    if (buflen == 0)
        return 0;
    buf[0] = '\0';
    const char *end = text + len, *block = NULL;
    for (const char *p = text; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        if (starts_with(p, le, "Thread 0x") || starts_with(p, le, "Current thread 0x"))
            block = p;
        p = nl != NULL ? nl + 1 : end;
    }
    if (block == NULL)
        return 0;
    size_t off = 0;
    int got = 0;
    const char *p = memchr(block, '\n', (size_t)(end - block));
    for (p = p != NULL ? p + 1 : end; p < end && got < frames && off + 1 < buflen;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        if (le == p)
            break; /* the block's end */
        size_t sep = got > 0 && off + 4 < buflen ? 3 : 0;
        if (got > 0 && sep == 0)
            break;
        memcpy(buf + off, " < ", sep);
        size_t n = frame(p, le, buf + off + sep, buflen - off - sep);
        if (n == 0) {
            buf[off] = '\0';
            break;
        }
        off += sep;
        off += n;
        got++;
        p = nl != NULL ? nl + 1 : end;
    }
    return off;
}
