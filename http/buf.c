/* The text buffer the HTTP renderers write into. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static bool reserve(dl__http_buf_t *b, size_t extra)
{
    if (b->oom)
        return false;
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void dl__http_buf_put(dl__http_buf_t *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void dl__http_buf_puts(dl__http_buf_t *b, const char *s)
{
    dl__http_buf_put(b, s, strlen(s));
}

void dl__http_buf_printf(dl__http_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    char small[256];

    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(small)) {
        dl__http_buf_put(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void dl__http_buf_html(dl__http_buf_t *b, const char *s)
{
    for (const char *p = s ? s : ""; *p != '\0'; p++) {
        switch (*p) {
        case '&': dl__http_buf_puts(b, "&amp;"); break;
        case '<': dl__http_buf_puts(b, "&lt;"); break;
        case '>': dl__http_buf_puts(b, "&gt;"); break;
        case '"': dl__http_buf_puts(b, "&quot;"); break;
        case '\'': dl__http_buf_puts(b, "&#39;"); break;
        default: dl__http_buf_put(b, p, 1);
        }
    }
}

void dl__http_buf_label(dl__http_buf_t *b, const char *s)
{
    for (const char *p = s ? s : ""; *p != '\0'; p++) {
        if (*p == '\\')
            dl__http_buf_puts(b, "\\\\");
        else if (*p == '"')
            dl__http_buf_puts(b, "\\\"");
        else if (*p == '\n')
            dl__http_buf_puts(b, "\\n");
        else
            dl__http_buf_put(b, p, 1);
    }
}

void dl__http_buf_float(dl__http_buf_t *b, double v)
{
    if (isnan(v))
        dl__http_buf_puts(b, "NaN");
    else if (isinf(v))
        dl__http_buf_puts(b, v > 0 ? "+Inf" : "-Inf");
    else if (v == (double)(long long)v && fabs(v) < 1e15)
        dl__http_buf_printf(b, "%lld", (long long)v);
    else {
        /* The shortest form that reads back as the same double. */
        char text[32];
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(text, sizeof(text), "%.*g", prec, v);
            if (strtod(text, NULL) == v)
                break;
        }
        dl__http_buf_puts(b, text);
    }
}

char *dl__http_buf_take(dl__http_buf_t *b, size_t *ret_len)
{
    char *p = b->oom ? NULL : b->p;
    if (p == NULL && !b->oom)
        p = calloc(1, 1);
    *ret_len = p != NULL ? b->len : 0;
    if (b->oom)
        free(b->p);
    *b = (dl__http_buf_t){0};
    return p;
}

void dl__http_buf_free(dl__http_buf_t *b)
{
    if (b == NULL)
        return;
    free(b->p);
    *b = (dl__http_buf_t){0};
}
