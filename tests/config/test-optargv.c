/* The option engine's command line (config/optargv.c) and the printers every table shares:
 * options and arguments in any order, values that stay in argv, the errors each way a word can
 * be wrong, and no argument past the limit dropped. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "opt.h"

typedef struct {
    const char *endpoint;
    const char *name;
    bool json, help;
    double timeout;
    bool timeout_given;
    int backend;
} settings_t;

static const char *const backends[] = {"c10d", "static", "etcd", NULL};

static const dl_opt_t options[] = {
    {"endpoint", NULL, 0, &dl_opt_text, offsetof(settings_t, endpoint), 0, 0, NULL, NULL,
     "HOST:PORT", "where to ask", DL_OPT_CLI_ONLY, 0},
    {"name", NULL, 'n', &dl_opt_text, offsetof(settings_t, name), 1, 0, NULL, NULL, "NAME",
     "a name, not empty", DL_OPT_CLI_ONLY, 0},
    {"json", NULL, 0, &dl_opt_bool, offsetof(settings_t, json), 0, 0, NULL, NULL, NULL,
     "print JSON", DL_OPT_FLAG | DL_OPT_CLI_ONLY, 0},
    {"timeout", NULL, 0, &dl_opt_double, offsetof(settings_t, timeout), 0, 60, NULL, "10",
     "SECONDS", "how long", DL_OPT_CLI_ONLY | DL_OPT_MARKS, offsetof(settings_t, timeout_given)},
    {"rdzv-backend", NULL, 0, &dl_opt_enum, offsetof(settings_t, backend), 0, 0, backends, "c10d",
     "c10d|static|etcd", "which store", DL_OPT_CLI_ONLY, 0},
    {"help", NULL, 'h', &dl_opt_bool, offsetof(settings_t, help), 0, 0, NULL, NULL, NULL,
     "show this help and exit", DL_OPT_FLAG | DL_OPT_CLI_ONLY | DL_OPT_STOP, 0},
};
static const dl_opt_table_t table = {options, sizeof(options) / sizeof(options[0]), "T_", NULL,
                                     true};

static char err[512];
static const char *args[3];

static int parse(settings_t *s, dl_opt_argv_t *a, char **argv)
{
    int argc = 0;
    while (argv[argc] != NULL)
        argc++;
    memset(s, 0, sizeof(*s));
    DL_CHECK_ERRNO(dl_opt_defaults(&table, s, err, sizeof(err)), 0);
    *a = (dl_opt_argv_t){.prog = "prog sub", .args = args, .max_args = 3};
    err[0] = '\0';
    return dl_opt_parse_argv(&table, s, argc, argv, a, err, sizeof(err));
}

DL_TEST(options_and_arguments_in_any_order)
{
    settings_t s;
    dl_opt_argv_t a;
    char *argv[] = {"one",  "--json", "--endpoint", "h:1", "-5", "--timeout=2.5", "--rdzv_backend",
                    "etcd", "-n",     "x",          "-",   NULL};
    ck_assert_int_eq(parse(&s, &a, argv), 0);
    ck_assert(s.json);
    ck_assert_ptr_eq(s.endpoint, argv[3]); /* borrowed, not copied */
    ck_assert_str_eq(s.name, "x");
    ck_assert(s.timeout == 2.5 && s.timeout_given);
    ck_assert_int_eq(s.backend, 2);
    /* A negative number and "-" are arguments. */
    ck_assert_uint_eq(a.nargs, 3);
    ck_assert_str_eq(args[0], "one");
    ck_assert_str_eq(args[1], "-5");
    ck_assert_str_eq(args[2], "-");
    ck_assert_ptr_null(a.stopped_at);

    char *none[] = {NULL};
    ck_assert_int_eq(parse(&s, &a, none), 0);
    ck_assert(s.timeout == 10 && !s.timeout_given && !s.json);
    ck_assert_ptr_null(s.endpoint);
}

DL_TEST(help_stops_the_parse)
{
    settings_t s;
    dl_opt_argv_t a;
    char *argv[] = {"--json", "-h", "--bogus", NULL};
    ck_assert_int_eq(parse(&s, &a, argv), 0);
    ck_assert(s.help);
    ck_assert_str_eq(a.stopped_at->name, "help");
}

DL_TEST(errors_name_the_word)
{
    static const struct {
        char *argv[6];
        const char *msg;
    } cases[] = {
        {{"--jsn"}, "unknown option '--jsn' (did you mean --json? see prog sub --help)"},
        {{"--frobnicate"}, "unknown option '--frobnicate' (see prog sub --help)"},
        {{"-x"}, "unknown option '-x' (see prog sub --help)"},
        {{"--"}, "unknown option '--' (see prog sub --help)"},
        {{"--endpoint"}, "option '--endpoint' needs a value (HOST:PORT)"},
        {{"--json=yes"}, "option '--json' takes no value"},
        {{"--timeout", "soon"}, "--timeout: 'soon' is not a number"},
        {{"--timeout", "99"}, "--timeout: '99' is out of range (0 to 60)"},
        {{"--rdzv-backend", "zk"}, "--rdzv-backend: 'zk' is not one of c10d, static, etcd"},
        {{"--name="}, "--name: must not be empty"},
        {{"a", "b", "c", "d"}, "too many arguments: prog sub takes at most 3, and 'd' is one more"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        settings_t s;
        dl_opt_argv_t a;
        int r = parse(&s, &a, (char **)cases[i].argv);
        ck_assert_msg(r == (strstr(cases[i].msg, "range") ? -ERANGE : -EINVAL), "case %zu", i);
        ck_assert_msg(strcmp(err, cases[i].msg) == 0, "case %zu: '%s'", i, err);
    }
    /* A table of options only calls any word an unknown argument. */
    settings_t s;
    char *argv[] = {"stray"};
    dl_opt_argv_t a = {.prog = "prog", .args = NULL, .max_args = 0};
    DL_CHECK_ERRNO(dl_opt_parse_argv(&table, &s, 1, argv, &a, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "unknown argument 'stray' (prog takes options only; see --help)");
}

static char *printed(void (*print)(FILE *f))
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    print(f);
    fclose(f);
    return buf;
}

static void help(FILE *f)
{
    dl_opt_print_help(&table, f);
    dl_opt_print_item(f, "a-left-side-wider-than-its-column-of-thirty",
                      "a help long enough to need two lines at eighty columns, broken at a space");
}

static void man(FILE *f)
{
    dl_opt_print_man(&table, f, DL_OPT_MAN_VALUE_FLAGS);
}

DL_TEST(printers)
{
    char *h = printed(help);
    ck_assert_ptr_nonnull(strstr(h, "  -n, --name NAME                a name, not empty\n"));
    ck_assert_ptr_nonnull(strstr(h, "  -h, --help                     show this help and exit\n"));
    ck_assert_ptr_nonnull(strstr(h, "  a-left-side-wider-than-its-column-of-thirty\n"
                                    "                                 a help long enough to "
                                    "need two lines at eighty\n"
                                    "                                 columns, broken at a "
                                    "space\n"));
    for (char *line = h; *line != '\0'; line = strchr(line, '\n') + 1)
        ck_assert_int_le(strchr(line, '\n') - line, 80);
    free(h);
    char *m = printed(man);
    ck_assert_str_eq(m, "--endpoint --name --timeout --rdzv-backend ");
    free(m);
}
