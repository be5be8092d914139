/* Features that need a large library (etcd: libcurl; the status server: libmicrohttpd) are built
 * as shared objects of their own, dlaunch-NAME.so, and loaded only when a job asks for them, so
 * that a plain launch loads none of those libraries. Each plugin exports one function that
 * returns its function table; the caller's layer keeps its public API and forwards to the table.
 *
 * Where plugins are: $DLAUNCH_PLUGIN_DIR when set; else a program run from its build tree takes
 * the build tree's (BUILD_ROOT/NAME/), and an installed one LIBDIR/dlaunch beside its BINDIR
 * (found from /proc/self/exe, so a DESTDIR or a moved prefix works). docs/install.md. */
#ifndef DL_PLUGIN_H
#define DL_PLUGIN_H

#include <stddef.h>

/* Loads dlaunch-NAME.so (once per process) and returns its entry point ENTRY in *ret. Returns 0,
 * or -ELIBACC with one line in err naming the file and the loader's reason (dlerror: the plugin
 * missing, or a library it needs, such as libcurl.so.4, missing). */
int dl_plugin_load(const char *name, const char *entry, void **ret, char *err, size_t errlen);

/* The folder plugins are looked for in, for messages and tests. Returns 0 or -ENAMETOOLONG. */
int dl_plugin_dir(char *buf, size_t len);

#endif
