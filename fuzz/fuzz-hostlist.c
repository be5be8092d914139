/* libFuzzer target for the hostlist parser. Besides crashes and sanitizer reports it checks what a
 * caller relies on: a success yields exactly the counted names, each a non-empty name within the
 * limits with no separator or bracket in it; a failure yields a one-line message that names the
 * list and an offset inside it.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iconfig \
 *         fuzz/fuzz-hostlist.c config/hostlist.c -o /tmp/fuzz-hostlist
 *   /tmp/fuzz-hostlist fuzz/corpus/hostlist
 *
 * The ordinary build replays the corpus through this function (fuzz/replay.c, the unit test
 * hostlist-replay). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "slurm.h"

/* Large expansions are correct but slow; the fuzzer learns more from many small inputs. */
#define EXPAND_AT_MOST 20000

static void check_error(size_t len, int r, const char *err)
{
    const char *at = NULL, *p = err;
    unsigned long off;
    char *end;

    /* The last one: the quoted list may itself contain " at offset ". */
    while ((p = strstr(p, " at offset ")) != NULL)
        at = p++;
    if (r >= 0 || strncmp(err, "hostlist '", 10) != 0 || at == NULL || strchr(err, '\n'))
        abort();
    off = strtoul(at + 11, &end, 10);
    if (*end != '\0' || off > len)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512], **hosts;
    char *list;
    size_t n, counted, i;
    int r;

    if (size > 4096)
        return 0;
    list = malloc(size + 1);
    if (list == NULL)
        return 0;
    memcpy(list, data, size);
    list[size] = '\0';
    size = strlen(list); /* the API takes C strings: stop at the first NUL byte */

    r = dl_hostlist_count(list, &counted, err, sizeof(err));
    if (r < 0) {
        check_error(size, r, err);
        goto out;
    }
    if (counted > DL_HOSTLIST_MAX_HOSTS)
        abort();
    if (counted > EXPAND_AT_MOST)
        goto out;
    r = dl_hostlist_expand(list, &hosts, &n, err, sizeof(err));
    if (r < 0 || n != counted)
        abort();
    for (i = 0; i < n; i++) {
        size_t len = strlen(hosts[i]);
        if (len == 0 || len > DL_HOSTLIST_MAX_NAME || strpbrk(hosts[i], "[], \t\n") != NULL)
            abort();
    }
    if (hosts[n] != NULL)
        abort();
    dl_hostlist_free(hosts);
out:
    free(list);
    return 0;
}
