/* dlopen of libyaml (yaml-lib.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "yaml-lib.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dl_yaml_lib_t lib;
static const dl_yaml_lib_t *loaded;
static char failure[512];

static void *sym(void *h, const char *name)
{
    void *f = dlsym(h, name);
    if (f == NULL && failure[0] == '\0')
        snprintf(failure, sizeof(failure), "%s: no symbol %s", DL_YAML_SONAME, name);
    return f;
}

static void load(void)
{
    void *h = dlopen(DL_YAML_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(failure, sizeof(failure), "%s", e != NULL ? e : DL_YAML_SONAME);
        return;
    }
    /* Through void * as POSIX's dlsym asks: function and object pointers are the same size. */
    *(void **)&lib.parser_initialize = sym(h, "yaml_parser_initialize");
    *(void **)&lib.parser_set_input_string = sym(h, "yaml_parser_set_input_string");
    *(void **)&lib.parser_load = sym(h, "yaml_parser_load");
    *(void **)&lib.parser_delete = sym(h, "yaml_parser_delete");
    *(void **)&lib.document_get_root_node = sym(h, "yaml_document_get_root_node");
    *(void **)&lib.document_get_node = sym(h, "yaml_document_get_node");
    *(void **)&lib.document_delete = sym(h, "yaml_document_delete");
    if (failure[0] != '\0') {
        dlclose(h);
        return;
    }
    loaded = &lib;
}

const dl_yaml_lib_t *dl_yaml_lib(char *why, size_t whylen)
{
    pthread_once(&once, load);
    if (loaded == NULL)
        snprintf(why, whylen, "%s", failure);
    return loaded;
}
