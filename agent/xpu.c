/* Intel GPUs ("xpu" to torch), counted as torchrun's --nproc-per-node xpu counts them, without
 * loading Level Zero: one /sys/class/drm/cardN whose PCI vendor is Intel and whose kernel
 * driver is i915 or xe (the drivers Level Zero runs on). ZE_AFFINITY_MASK, when set, is the
 * list of devices the workers may use, as CUDA_VISIBLE_DEVICES is for NVIDIA's. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"

static bool intel_card(const char *drm, const char *name)
{
    char path[4600], text[32], link[PATH_MAX];
    int digits = 0;
    if (strncmp(name, "card", 4) != 0)
        return false;
    for (const char *p = name + 4; *p != '\0'; p++, digits++)
        if (*p < '0' || *p > '9')
            return false; /* card0-DP-1 is a connector of card0 */
    if (digits == 0)
        return false;
    snprintf(path, sizeof(path), "%s/%s/device/vendor", drm, name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    bool intel = fgets(text, sizeof(text), f) != NULL && strncmp(text, "0x8086", 6) == 0;
    fclose(f);
    snprintf(path, sizeof(path), "%s/%s/device/driver", drm, name);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (!intel || n <= 0)
        return false;
    link[n] = '\0';
    const char *driver = strrchr(link, '/') != NULL ? strrchr(link, '/') + 1 : link;
    return strcmp(driver, "i915") == 0 || strcmp(driver, "xe") == 0;
}

int dl_xpu_count(const char *sys_root, const char *ze_affinity_mask)
{
    char drm[4200];
    int n = 0;

    if (ze_affinity_mask != NULL && *ze_affinity_mask != '\0') {
        n = 1;
        for (const char *p = ze_affinity_mask; *p != '\0'; p++)
            if (*p == ',' && p[1] != '\0')
                n++;
        return n;
    }
    snprintf(drm, sizeof(drm), "%s/sys/class/drm", sys_root);
    DIR *d = opendir(drm);
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += intel_card(drm, e->d_name);
    closedir(d);
    return n;
}
