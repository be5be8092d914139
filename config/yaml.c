/* The YAML job spec: a mapping of option keys plus command: and env:. Every error names
 * file:line:column, counted from 1 as editors do. */
#include "internal.h"
#include "yaml-lib.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A job spec is a few lines; anything near this is a mistake (a dataset named by accident). */
#define DL_SPEC_MAX_BYTES (1024 * 1024)

typedef struct {
    dl_job_spec_t *spec;
    const dl_yaml_lib_t *y;
    yaml_document_t *doc;
    const char *name;
    char *err;
    size_t errlen;
} loader_t;

static int fail_at(loader_t *ld, const yaml_node_t *node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail_at(loader_t *ld, const yaml_node_t *node, const char *fmt, ...)
{
    char msg[DL_CONFIG_ERRLEN], line[DL_CONFIG_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* Messages quote the spec's own text, which may hold line breaks: one line regardless. */
    dl_opt_escape(msg, line, sizeof(line));
    snprintf(ld->err, ld->errlen, "%s:%zu:%zu: %s", ld->name, node->start_mark.line + 1,
             node->start_mark.column + 1, line);
    return -EINVAL;
}

static const char *scalar(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static const char *kind_name(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SCALAR_NODE: return "a scalar";
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "nothing";
    }
}

static int load_command(loader_t *ld, const yaml_node_t *val)
{
    if (val->type != YAML_SEQUENCE_NODE)
        return fail_at(ld, val, "command: expected a list of strings (argv), got %s",
                       kind_name(val));
    size_t n = (size_t)(val->data.sequence.items.top - val->data.sequence.items.start);
    if (n == 0)
        return fail_at(ld, val, "command: must not be empty");
    char **v = calloc(n + 1, sizeof(char *));
    if (v == NULL)
        return fail_at(ld, val, "command: out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = ld->y->document_get_node(ld->doc, val->data.sequence.items.start[i]);
        if (item == NULL || item->type != YAML_SCALAR_NODE) {
            dl__strv_free(v);
            return fail_at(ld, item != NULL ? item : val,
                           "command: each argument must be a string, got %s",
                           item != NULL ? kind_name(item) : "nothing");
        }
        v[i] = strdup(scalar(item));
        if (v[i] == NULL) {
            dl__strv_free(v);
            return fail_at(ld, val, "command: out of memory");
        }
    }
    dl__strv_free(ld->spec->command);
    ld->spec->command = v;
    ld->spec->command_len = n;
    return 0;
}

static int valid_env_name(const char *s)
{
    if (*s == '\0' || (*s >= '0' && *s <= '9'))
        return 0;
    for (; *s != '\0'; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return 0;
    return 1;
}

static int load_env(loader_t *ld, const yaml_node_t *val)
{
    if (val->type != YAML_MAPPING_NODE)
        return fail_at(ld, val, "env: expected a mapping of NAME: value, got %s", kind_name(val));
    size_t n = (size_t)(val->data.mapping.pairs.top - val->data.mapping.pairs.start);
    char **v = calloc(n + 1, sizeof(char *));
    if (v == NULL)
        return fail_at(ld, val, "env: out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &val->data.mapping.pairs.start[i];
        yaml_node_t *k = ld->y->document_get_node(ld->doc, p->key);
        yaml_node_t *x = ld->y->document_get_node(ld->doc, p->value);
        int r;
        if (k->type != YAML_SCALAR_NODE || !valid_env_name(scalar(k)))
            r = fail_at(ld, k, "env: '%s' is not a variable name%s",
                        k->type == YAML_SCALAR_NODE ? scalar(k) : "?", "");
        else if (x->type != YAML_SCALAR_NODE)
            r = fail_at(ld, x, "env: %s: expected a string, got %s", scalar(k), kind_name(x));
        else if (asprintf(&v[i], "%s=%s", scalar(k), scalar(x)) < 0) {
            v[i] = NULL;
            r = fail_at(ld, val, "env: out of memory");
        } else
            r = 0;
        if (r < 0) {
            dl__strv_free(v);
            return r;
        }
    }
    dl__strv_free(ld->spec->env);
    ld->spec->env = v;
    ld->spec->env_len = n;
    return 0;
}

/* A train: value: a scalar as it is, a list of scalars joined with ',' (layers: [784, 10]). */
static int train_value(loader_t *ld, const char *key, const yaml_node_t *v, char **ret)
{
    if (v->type == YAML_SCALAR_NODE) {
        *ret = strdup(scalar(v));
        return *ret != NULL ? 0 : fail_at(ld, v, "train: out of memory");
    }
    if (v->type != YAML_SEQUENCE_NODE)
        return fail_at(ld, v, "train: %s: expected a value or a list, got %s", key, kind_name(v));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start), len = 0;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = ld->y->document_get_node(ld->doc, v->data.sequence.items.start[i]);
        if (item->type != YAML_SCALAR_NODE)
            return fail_at(ld, item, "train: %s: list items must be values, got %s", key,
                           kind_name(item));
        len += strlen(scalar(item)) + 1;
    }
    char *out = calloc(len + 1, 1);
    if (out == NULL)
        return fail_at(ld, v, "train: out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = ld->y->document_get_node(ld->doc, v->data.sequence.items.start[i]);
        if (i > 0)
            strcat(out, ",");
        strcat(out, scalar(item));
    }
    *ret = out;
    return 0;
}

/* Keeps train: as key=value pairs with their places; the trainer's own table checks them
 * (cmd/ does that right after loading, so errors still name file:line:column). */
static int load_train(loader_t *ld, const yaml_node_t *val)
{
    if (val->type != YAML_MAPPING_NODE)
        return fail_at(ld, val, "train: expected a mapping of settings, got %s", kind_name(val));
    size_t n = (size_t)(val->data.mapping.pairs.top - val->data.mapping.pairs.start);
    char **kv = calloc(n + 1, sizeof(char *)), **where = calloc(n + 1, sizeof(char *));
    char **key_where = calloc(n + 1, sizeof(char *));
    int r = 0;
    if (kv == NULL || where == NULL || key_where == NULL) {
        free(kv);
        free(where);
        free(key_where);
        return fail_at(ld, val, "train: out of memory");
    }
    for (size_t i = 0; i < n && r == 0; i++) {
        yaml_node_pair_t *p = &val->data.mapping.pairs.start[i];
        yaml_node_t *k = ld->y->document_get_node(ld->doc, p->key);
        yaml_node_t *x = ld->y->document_get_node(ld->doc, p->value);
        char *value = NULL;
        if (k->type != YAML_SCALAR_NODE) {
            r = fail_at(ld, k, "train: keys must be names, got %s", kind_name(k));
            break;
        }
        r = train_value(ld, scalar(k), x, &value);
        if (r == 0 && (asprintf(&kv[i], "%s=%s", scalar(k), value) < 0 ||
                       asprintf(&where[i], "%s:%zu:%zu", ld->name, x->start_mark.line + 1,
                                x->start_mark.column + 1) < 0 ||
                       asprintf(&key_where[i], "%s:%zu:%zu", ld->name, k->start_mark.line + 1,
                                k->start_mark.column + 1) < 0))
            r = fail_at(ld, val, "train: out of memory");
        free(value);
    }
    if (r < 0) {
        dl__strv_free(kv);
        dl__strv_free(where);
        dl__strv_free(key_where);
        return r;
    }
    dl__strv_free(ld->spec->train);
    dl__strv_free(ld->spec->train_where);
    dl__strv_free(ld->spec->train_key_where);
    ld->spec->train = kv;
    ld->spec->train_where = where;
    ld->spec->train_key_where = key_where;
    ld->spec->train_len = n;
    return 0;
}

static int load_option(loader_t *ld, const dl_opt_t *opt, const char *key, const yaml_node_t *val)
{
    char where[DL_CONFIG_ERRLEN];

    if (val->type != YAML_SCALAR_NODE)
        return fail_at(ld, val, "%s: expected a single value, got %s", key, kind_name(val));
    /* A quoted "3" is a string in YAML; accepting it for a number would hide typos in tools
     * that generate specs, so numbers and booleans must be plain. */
    if (opt->type->plain && val->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return fail_at(ld, val, "%s: expected %s, got a quoted string", key, opt->type->expect);
    snprintf(where, sizeof(where), "%s:%zu:%zu: %s", ld->name, val->start_mark.line + 1,
             val->start_mark.column + 1, key);
    int r = dl_opt_set(opt, ld->spec, scalar(val), where, ld->err, ld->errlen);
    return r == -ERANGE ? -EINVAL : r;
}

static int unknown_key(loader_t *ld, const yaml_node_t *k)
{
    const dl_opt_t *c = dl_opt_closest(&dl__job_table, scalar(k), true);
    char key[128];

    if (strchr(scalar(k), '-') != NULL)
        return fail_at(ld, k, "unknown key '%s' (keys use '_', not '-')", scalar(k));
    if (c == NULL)
        return fail_at(ld, k, "unknown key '%s'", scalar(k));
    dl_opt_key(c, key, sizeof(key));
    return fail_at(ld, k, "unknown key '%s' (did you mean '%s'?)", scalar(k), key);
}

static int load_root(loader_t *ld, yaml_node_t *root)
{
    if (root->type != YAML_MAPPING_NODE)
        return fail_at(ld, root, "the job spec must be a mapping of keys, got %s", kind_name(root));
    yaml_node_pair_t *start = root->data.mapping.pairs.start;
    yaml_node_pair_t *top = root->data.mapping.pairs.top;
    for (yaml_node_pair_t *p = start; p < top; p++) {
        yaml_node_t *k = ld->y->document_get_node(ld->doc, p->key);
        yaml_node_t *v = ld->y->document_get_node(ld->doc, p->value);
        const dl_opt_t *opt;
        int r;

        if (k->type != YAML_SCALAR_NODE)
            return fail_at(ld, k, "keys must be names, got %s", kind_name(k));
        for (yaml_node_pair_t *q = start; q < p; q++) {
            yaml_node_t *prev = ld->y->document_get_node(ld->doc, q->key);
            if (prev->type == YAML_SCALAR_NODE && strcmp(scalar(prev), scalar(k)) == 0)
                return fail_at(ld, k, "duplicate key '%s'", scalar(k));
        }
        if (strcmp(scalar(k), "command") == 0)
            r = load_command(ld, v);
        else if (strcmp(scalar(k), "env") == 0)
            r = load_env(ld, v);
        else if (strcmp(scalar(k), "train") == 0)
            r = load_train(ld, v);
        else if ((opt = dl_opt_by_key(&dl__job_table, scalar(k))) != NULL)
            r = load_option(ld, opt, scalar(k), v);
        else
            r = unknown_key(ld, k);
        if (r < 0)
            return r;
    }
    return 0;
}

int dl_config_load_yaml_string(dl_job_spec_t *spec, const char *name, const char *text, size_t len,
                               char *err, size_t errlen)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    char why[512];
    const dl_yaml_lib_t *y = dl_yaml_lib(why, sizeof(why));
    loader_t ld = {spec, y, &doc, name, err, errlen};
    int r;

    if (y == NULL) {
        snprintf(err, errlen, "%s: the YAML parser (libyaml) is not available: %s", name, why);
        return -ELIBACC;
    }
    if (!y->parser_initialize(&parser)) {
        snprintf(err, errlen, "%s: out of memory", name);
        return -ENOMEM;
    }
    y->parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!y->parser_load(&parser, &doc)) {
        snprintf(err, errlen, "%s:%zu:%zu: %s%s%s", name, parser.problem_mark.line + 1,
                 parser.problem_mark.column + 1, parser.problem ? parser.problem : "bad YAML",
                 parser.context ? " " : "", parser.context ? parser.context : "");
        y->parser_delete(&parser);
        return -EINVAL;
    }
    yaml_node_t *root = y->document_get_root_node(&doc);
    if (root == NULL) {
        snprintf(err, errlen, "%s: the job spec is empty", name);
        r = -EINVAL;
    } else {
        r = load_root(&ld, root);
    }
    y->document_delete(&doc);
    y->parser_delete(&parser);
    return r;
}

int dl_config_load_yaml(dl_job_spec_t *spec, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len;
    int r;

    if (f == NULL) {
        r = -errno;
        snprintf(err, errlen, "%s: cannot open the job spec: %s", path, strerror(errno));
        return r;
    }
    buf = malloc(DL_SPEC_MAX_BYTES + 1);
    if (buf == NULL) {
        fclose(f);
        snprintf(err, errlen, "%s: out of memory", path);
        return -ENOMEM;
    }
    len = fread(buf, 1, DL_SPEC_MAX_BYTES + 1, f);
    if (ferror(f)) {
        r = -errno;
        snprintf(err, errlen, "%s: cannot read the job spec: %s", path, strerror(errno));
    } else if (len > DL_SPEC_MAX_BYTES) {
        r = -EFBIG;
        snprintf(err, errlen, "%s: the job spec is over %d bytes", path, DL_SPEC_MAX_BYTES);
    } else {
        r = dl_config_load_yaml_string(spec, path, buf, len, err, errlen);
        if (r >= 0 && spec->spec_path == NULL && (spec->spec_path = strdup(path)) == NULL)
            r = -ENOMEM;
    }
    free(buf);
    fclose(f);
    return r;
}
