/* The one replay driver: every fuzz target links it in the ordinary build (no libFuzzer), and
 * `NAME-replay DIR [MIN_FILES]` feeds each file of DIR, in name order, to the target's
 * LLVMFuzzerTestOneInput. A broken rule aborts; the driver then names the file that did it. It
 * fails when DIR holds fewer than MIN_FILES files (default 1): an emptied corpus would
 * otherwise pass by testing nothing. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

/* Set under the sanitizers only: their reports end the process without SIGABRT. */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

/* The input being replayed, for the crash handlers. */
static const char *volatile current;

static void name_current(void)
{
    static const char head[] = "replay: crashed on ";
    const char *name = current != NULL ? current : "(no input)";

    (void)!write(STDERR_FILENO, head, sizeof(head) - 1);
    (void)!write(STDERR_FILENO, name, strlen(name));
    (void)!write(STDERR_FILENO, "\n", 1);
}

static void on_crash(int sig)
{
    name_current();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The whole file in a buffer of its exact size, so that the sanitizers see a read past it. */
static int read_input(const char *path, uint8_t **ret_data, size_t *ret_len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *data = NULL;
    size_t len = 0, cap = 0, n;

    if (f == NULL)
        return -errno;
    do {
        if (len == cap) {
            uint8_t *bigger = realloc(data, cap = cap == 0 ? 4096 : cap * 2);
            if (bigger == NULL) {
                free(data);
                fclose(f);
                return -ENOMEM;
            }
            data = bigger;
        }
        n = fread(data + len, 1, cap - len, f);
        len += n;
    } while (n > 0);
    int err = ferror(f) ? -EIO : 0;
    fclose(f);
    if (err == 0 && len > 0) {
        uint8_t *exact = malloc(len);
        if (exact == NULL)
            err = -ENOMEM;
        else
            memcpy(exact, data, len);
        free(data);
        data = exact;
    }
    if (err < 0) {
        free(data);
        return err;
    }
    *ret_data = data;
    *ret_len = len;
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int not_hidden(const struct dirent *e)
{
    return e->d_name[0] != '.';
}

int main(int argc, char **argv)
{
    struct dirent **names;
    long min_files = 1;
    char *end;
    int n, failed = 0;

    if (argc == 3) {
        errno = 0;
        min_files = strtol(argv[2], &end, 10);
        if (errno != 0 || *end != '\0' || end == argv[2] || min_files < 0) {
            fprintf(stderr, "replay: MIN_FILES '%s' is not a count\n", argv[2]);
            return 2;
        }
    }
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s CORPUS_DIR [MIN_FILES]\n", argv[0]);
        return 2;
    }
    n = scandir(argv[1], &names, not_hidden, by_name);
    if (n < 0) {
        fprintf(stderr, "replay: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    signal(SIGABRT, on_crash);
    signal(SIGSEGV, on_crash);
    if (__sanitizer_set_death_callback != NULL)
        __sanitizer_set_death_callback(name_current);
    for (int i = 0; i < n; i++) {
        char path[4096];
        uint8_t *data = NULL;
        size_t len = 0;
        int r;

        snprintf(path, sizeof(path), "%s/%s", argv[1], names[i]->d_name);
        r = read_input(path, &data, &len);
        if (r < 0) {
            fprintf(stderr, "replay: %s: %s\n", path, strerror(-r));
            failed++;
        } else {
            current = names[i]->d_name;
            r = LLVMFuzzerTestOneInput(data, len);
            current = NULL;
            /* libFuzzer's contract: 0 (-1 would drop a corpus input the target cannot take). */
            if (r != 0) {
                fprintf(stderr, "replay: %s: the target returned %d\n", path, r);
                failed++;
            }
            free(data);
        }
        free(names[i]);
    }
    free(names);
    printf("%d inputs replayed from %s, %d failed\n", n, argv[1], failed);
    if (n < min_files) {
        fprintf(stderr, "replay: %s holds %d inputs, fewer than the %ld expected\n", argv[1], n,
                min_files);
        return 1;
    }
    return failed == 0 ? 0 : 1;
}
