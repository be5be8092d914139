/* Replays a fuzz target's corpus in the ordinary build: `fuzz-replay DIR` feeds every file of
 * DIR to the target linked in (LLVMFuzzerTestOneInput), which aborts on anything wrong, so a
 * corpus keeps guarding its parser without clang. One driver for every target. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    static uint8_t buf[1 << 20];
    char path[8192];
    struct dirent *de;
    int files = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (d == NULL) {
        perror(argv[1]);
        return 1;
    }
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", argv[1], de->d_name);
        FILE *f = fopen(path, "rb");
        if (f == NULL) {
            perror(path);
            closedir(d);
            return 1;
        }
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        files++;
    }
    closedir(d);
    printf("%d inputs replayed from %s\n", files, argv[1]);
    return files > 0 ? 0 : 1;
}
