/* The driver lists one folder per GPU under /proc/driver/nvidia/gpus; reading it costs no
 * library load, where asking NVML would add tens of milliseconds to every launch. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "gpu.h"

int dl_gpu_count(const char *proc_root, const char *cuda_visible)
{
    char path[4096];
    DIR *d;
    struct dirent *e;
    int n = 0;

    if (cuda_visible != NULL) {
        /* CUDA treats an empty list, or one starting with -1, as "no devices". */
        if (*cuda_visible == '\0' || strncmp(cuda_visible, "-1", 2) == 0)
            return 0;
        n = 1;
        for (const char *p = cuda_visible; *p != '\0'; p++)
            if (*p == ',' && p[1] != '\0')
                n++;
        return n;
    }
    snprintf(path, sizeof(path), "%s/driver/nvidia/gpus", proc_root);
    d = opendir(path);
    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}
