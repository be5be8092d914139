/* Where the dlaunch Python package is for this agent's workers: the source tree's python/ when
 * this program runs from its build tree (a developer's build, the tests), else the folder
 * `meson install` put it in. The agent puts it first on the workers' PYTHONPATH, so that
 * `import dlaunch.torch` finds the copy that speaks this agent's formats, installed or not. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Looked up once: where this program runs from and what is installed beside it do not change
 * while it runs, and every worker of every attempt asks. */
static int found = 1; /* 1: not looked up yet; else 0 or -errno */
static char found_dir[PATH_MAX];

static int look_up(void)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    const char *dir = DL_PYTHON_INSTALL_DIR;
    if (n > 0) {
        exe[n] = '\0';
        size_t root = strlen(DL_BUILD_ROOT);
        if (strncmp(exe, DL_BUILD_ROOT, root) == 0 && exe[root] == '/')
            dir = DL_PYTHON_SOURCE_DIR;
    }
    char init[PATH_MAX];
    if (dir[0] == '\0' ||
        snprintf(init, sizeof(init), "%s/dlaunch/__init__.py", dir) >= (int)sizeof(init))
        return -ENOENT;
    if (access(init, R_OK) < 0)
        return -errno;
    if (snprintf(found_dir, sizeof(found_dir), "%s", dir) >= (int)sizeof(found_dir))
        return -ENAMETOOLONG;
    return 0;
}

int dl__python_dir(char *buf, size_t len)
{
    if (found == 1)
        found = look_up();
    if (found < 0)
        return found;
    if (snprintf(buf, len, "%s", found_dir) >= (int)len)
        return -ENAMETOOLONG;
    return 0;
}
