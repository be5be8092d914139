/* libyaml, opened with dlopen the first time a job spec is read: a launch without --config
 * never maps it (docs/performance.md, "Launch"). */
#pragma once

#include <stddef.h>
#include <yaml.h>

/* The library's soname: its ABI has been .so.2 since libyaml 0.1.5. */
#define DL_YAML_SONAME "libyaml-0.so.2"

/* The functions the job-spec loader calls, with libyaml's own signatures. */
typedef struct {
    int (*parser_initialize)(yaml_parser_t *parser);
    void (*parser_set_input_string)(yaml_parser_t *parser, const unsigned char *input, size_t size);
    int (*parser_load)(yaml_parser_t *parser, yaml_document_t *document);
    void (*parser_delete)(yaml_parser_t *parser);
    yaml_node_t *(*document_get_root_node)(yaml_document_t *document);
    yaml_node_t *(*document_get_node)(yaml_document_t *document, int index);
    void (*document_delete)(yaml_document_t *document);
} dl_yaml_lib_t;

/* Opens libyaml once per process. Returns its functions, or NULL with the loader's reason
 * (dlerror's line, naming the file) in why. Thread-safe. */
const dl_yaml_lib_t *dl_yaml_lib(char *why, size_t whylen);
