/* dlopen of dlaunch-NAME.so (plugin.h). */
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin.h"

/* Compiled in by plugin/meson.build: the build tree's root, and the installed plugin folder
 * relative to the installed programs' folder (or absolute when libdir is outside the prefix). */
#ifndef DL_BUILD_ROOT
#error "DL_BUILD_ROOT must be defined"
#endif
#ifndef DL_PLUGIN_RELDIR
#error "DL_PLUGIN_RELDIR must be defined"
#endif

/* The folder of the running program, without a trailing '/'. */
static int exe_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0 || (size_t)n >= len - 1)
        return n <= 0 ? -errno : -ENAMETOOLONG;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash == NULL)
        return -ENOENT;
    *slash = '\0';
    return 0;
}

static bool under(const char *path, const char *root)
{
    size_t n = strlen(root);
    return strncmp(path, root, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* The plugin's file: in the build tree each plugin is built in its layer's folder. */
static int plugin_path(const char *name, char *buf, size_t len)
{
    char dir[4096];
    const char *env = getenv("DLAUNCH_PLUGIN_DIR");
    int n;

    if (env != NULL && env[0] != '\0') {
        n = snprintf(buf, len, "%s/dlaunch-%s.so", env, name);
    } else {
        int r = exe_dir(dir, sizeof(dir));
        if (r < 0)
            return r;
        if (under(dir, DL_BUILD_ROOT))
            n = snprintf(buf, len, "%s/%s/dlaunch-%s.so", DL_BUILD_ROOT, name, name);
        else if (DL_PLUGIN_RELDIR[0] == '/')
            n = snprintf(buf, len, "%s/dlaunch-%s.so", DL_PLUGIN_RELDIR, name);
        else
            n = snprintf(buf, len, "%s/%s/dlaunch-%s.so", dir, DL_PLUGIN_RELDIR, name);
    }
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int dl_plugin_dir(char *buf, size_t len)
{
    int r = plugin_path("NAME", buf, len);
    char *slash = r == 0 ? strrchr(buf, '/') : NULL;
    if (slash != NULL)
        *slash = '\0';
    return r;
}

int dl_plugin_load(const char *name, const char *entry, void **ret, char *err, size_t errlen)
{
    char path[4200];
    int r = plugin_path(name, path, sizeof(path));

    *ret = NULL;
    if (r < 0) {
        snprintf(err, errlen, "cannot find the folder of dlaunch-%s.so: %s", name, strerror(-r));
        return -ELIBACC;
    }
    /* RTLD_LOCAL: the plugin's libraries stay out of everyone else's symbol lookups. A second
     * load of the same file returns the same handle; it is never closed (libraries such as
     * libcurl keep global state that outlives their last user). */
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        if (why == NULL)
            why = "unknown error";
        /* dlerror names the plugin when it is the one missing, and only the library otherwise. */
        if (strncmp(why, path, strlen(path)) == 0)
            snprintf(err, errlen, "%s", why);
        else
            snprintf(err, errlen, "%s: %s", path, why);
        return -ELIBACC;
    }
    void *fn = dlsym(handle, entry);
    if (fn == NULL) {
        const char *why = dlerror();
        snprintf(err, errlen, "%s is not a dlaunch plugin of this version: %s", path,
                 why != NULL ? why : entry);
        return -ELIBACC;
    }
    *ret = fn;
    return 0;
}
