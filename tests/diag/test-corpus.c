/* Replays the diag fuzzer's corpus (fuzz/corpus/diag/, the folder given as argv[1]) through the
 * fuzz target's own entry point, so an input that once broke one of its rules keeps being tried
 * in every ordinary build. The target aborts on a broken rule; the file is named first. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (d == NULL) {
        perror(argv[1]);
        return 1;
    }
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[4096];
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", argv[1], e->d_name);
        FILE *f = fopen(path, "rb");
        if (f == NULL) {
            perror(path);
            closedir(d);
            return 1;
        }
        uint8_t *buf = malloc(1 << 20);
        size_t len = buf != NULL ? fread(buf, 1, 1 << 20, f) : 0;
        fclose(f);
        fprintf(stderr, "%s\n", e->d_name);
        LLVMFuzzerTestOneInput(buf, len);
        free(buf);
        n++;
    }
    closedir(d);
    printf("%d files replayed\n", n);
    return n > 0 ? 0 : 1;
}
