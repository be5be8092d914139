/* One engine for every table of settings: the job spec's options, the trainer's settings and the
 * collective's variables. Each entry names its type; each type parses and checks a value and frees
 * what it took; from the entry the engine derives the command-line flag, the YAML key, the
 * variable (DLAUNCH_<KEY>, and torchrun's PET_<KEY> for its flags), the --help text and every
 * error message, which always names where the value came from. In the manner of redis's config.c.
 *
 * The engine never prints: errors come back as -errno plus one line, warnings through a
 * callback.
 */
#ifndef DL_OPT_H
#define DL_OPT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dl_opt_s dl_opt_t;

typedef struct dl_opt_type_s {
    /* What a good value looks like, for errors ("a whole number"). */
    const char *expect;
    /* Parses text into the setting at obj + o->offset (a type may set several fields). Returns 0,
     * or -EINVAL / -ERANGE with, optionally, a reason in why (else the error uses expect and,
     * for numbers, the range). Leaves obj as it was on failure. */
    int (*parse)(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen);
    /* Frees what parse took (NULL: nothing to free). */
    void (*release)(const dl_opt_t *o, void *obj);
    /* A YAML value must be a plain scalar: a quoted "3" or "true" is a string, and taking it for
     * a number would hide a tool's typo. */
    bool plain;
} dl_opt_type_t;

/* Types shared by every table. Numbers take [min, max]; strings are non-empty; booleans are
 * true/false, yes/no, on/off or 1/0 in any case; enums take choices[]. */
extern const dl_opt_type_t dl_opt_int;    /* int */
extern const dl_opt_type_t dl_opt_uint;   /* unsigned */
extern const dl_opt_type_t dl_opt_u64;    /* uint64_t */
extern const dl_opt_type_t dl_opt_size;   /* size_t */
extern const dl_opt_type_t dl_opt_double; /* double */
extern const dl_opt_type_t dl_opt_string; /* char *, owned; "" is refused */
extern const dl_opt_type_t dl_opt_path;   /* char *, owned; "" means none (NULL) */
extern const dl_opt_type_t dl_opt_bool;   /* bool */
extern const dl_opt_type_t dl_opt_enum;   /* int: the index into choices */
/* const char *, borrowed: points at the text given (an argv word, which outlives the settings),
 * so nothing is copied or freed; min >= 1 refuses "". */
extern const dl_opt_type_t dl_opt_text;

enum {
    DL_OPT_FLAG = 1 << 0,     /* on the command line it takes no value: present means true */
    DL_OPT_CLI_ONLY = 1 << 1, /* no YAML key and no variable */
    DL_OPT_PET = 1 << 2,      /* torchrun's flag: PET_<alias or name> sets it too */
    DL_OPT_HIDDEN = 1 << 3,   /* left out of --help */
    DL_OPT_IGNORED = 1 << 4,  /* accepted for torchrun's sake and warned about; no effect */
    DL_OPT_MARKS = 1 << 5,    /* setting it sets the bool at `mark` (given, as against default) */
    DL_OPT_STOP = 1 << 6,     /* on the command line it ends the parse (--help, --version) */
};

struct dl_opt_s {
    const char *name;  /* the long flag without "--"; YAML key: '-' as '_'; variable: upper case */
    const char *alias; /* another long flag (torchrun's spelling, for DL_OPT_PET), or NULL */
    char short_name;   /* or 0 */
    const dl_opt_type_t *type;
    size_t offset;              /* of the setting in the settings struct */
    double min, max;            /* numbers */
    const char *const *choices; /* enum: NULL-terminated names */
    const char *def;            /* the default in text form, or NULL */
    const char *metavar;        /* for --help; NULL for flags */
    const char *help;
    unsigned flags;
    size_t mark; /* DL_OPT_MARKS */
};

typedef struct dl_opt_table_s {
    const dl_opt_t *opts;
    size_t n;
    /* "DLAUNCH_", "DLAUNCH_TRAIN_": the variables of this table begin so. */
    const char *env_prefix;
    /* Variables under env_prefix that are known but no options of this table (NULL-terminated,
     * may be NULL), so they are not taken for typos. A name ending in '*' is a prefix. */
    const char *const *other_vars;
    /* An empty variable counts as unset (how a user's script clears a setting); false: the
     * empty text goes to the option's parser like any value (a launcher's variables). */
    bool empty_is_unset;
} dl_opt_table_t;

/* Flag names match with '_' and '-' alike (--nproc_per_node is --nproc-per-node). name need not
 * be NUL-terminated; len is its length. Returns NULL when none matches. */
const dl_opt_t *dl_opt_by_flag(const dl_opt_table_t *t, const char *name, size_t len);
/* As Python's argparse (torchrun's parser): a flag that names no option may be the start of one,
 * --nproc for --nproc-per-node, '_' and '-' alike. Sets *ret and returns 0 for an exact name or
 * a prefix of exactly one option's spellings; -ENOENT when none begins so; -EINVAL when several
 * options do, with their flags ("--a, --b") in candidates (clen bytes, truncated). */
int dl_opt_by_prefix(const dl_opt_table_t *t, const char *name, size_t len, const dl_opt_t **ret,
                     char *candidates, size_t clen);
const dl_opt_t *dl_opt_by_short(const dl_opt_table_t *t, char c);
/* By YAML key ("max_restarts"); options with DL_OPT_CLI_ONLY have none. */
const dl_opt_t *dl_opt_by_key(const dl_opt_table_t *t, const char *key);

/* "max-restarts" -> "max_restarts"; -> "DLAUNCH_MAX_RESTARTS"; alias "nproc-per-node" ->
 * "PET_NPROC_PER_NODE". */
void dl_opt_key(const dl_opt_t *o, char *buf, size_t len);
void dl_opt_env_name(const dl_opt_table_t *t, const dl_opt_t *o, char *buf, size_t len);
void dl_opt_pet_name(const dl_opt_t *o, char *buf, size_t len);

/* Sets o from text; where names the source for the error ("--nodes", "DLAUNCH_NODES",
 * "job.yaml:3:8: nodes"). On failure (-EINVAL, -ERANGE for a number out of range, -ENOMEM) err
 * gets "WHERE: 'TEXT' is not EXPECTED" or the type's reason, and obj is untouched. */
int dl_opt_set(const dl_opt_t *o, void *obj, const char *text, const char *where, char *err,
               size_t errlen);

/* Sets every option that has a default, except those of types that own memory (strings): they
 * stay NULL, their default is documentary (--help), and the code that reads them applies it, so
 * settings at their defaults hold nothing to free. Returns 0 or the first error (a bad table). */
int dl_opt_defaults(const dl_opt_table_t *t, void *obj, char *err, size_t errlen);

/* Frees what the table's options hold in obj. Accepts NULL. */
void dl_opt_release(const dl_opt_table_t *t, void *obj);

/* Reads the table's variables from envp: PET_<NAME> for torchrun's options first, then
 * <prefix><KEY>, which wins (see empty_is_unset). Returns 0 or the first error. */
int dl_opt_from_env(const dl_opt_table_t *t, void *obj, char *const *envp, char *err,
                    size_t errlen);

/* Calls warn for each variable in envp that begins with the table's prefix but is neither an
 * option nor one of other_vars, with the closest known name (or NULL). */
void dl_opt_unknown_vars(const dl_opt_table_t *t, char *const *envp,
                         void (*warn)(void *ctx, const char *var, const char *closest), void *ctx);

/* The option or key closest to word by edit distance, if close enough to be a typo, else NULL.
 * as_key: compare YAML keys, else flag names. */
const dl_opt_t *dl_opt_closest(const dl_opt_table_t *t, const char *word, bool as_key);

/* Writes the option list for --help to stream (a FILE *): flags, metavar, help (wrapped to 80
 * columns), variables and default, in table order. */
void dl_opt_print_help(const dl_opt_table_t *t, void *stream);
/* One line of such a list: lhs ("--name VALUE", "status RUN_ID") in a column of 30, help
 * beside it wrapped at 80 columns (below it when lhs is wider). */
void dl_opt_print_item(void *stream, const char *lhs, const char *help);

/* The option list for a man page (scdoc source) or a shell completion, to stream (a FILE *). */
typedef enum {
    DL_OPT_MAN_FLAGS = 0,   /* every flag with its help, and its variable and YAML key if any */
    DL_OPT_MAN_KEYS,        /* every YAML key with its help, flag and variable */
    DL_OPT_MAN_SETTINGS,    /* every option by name with its default and help (the trainer's) */
    DL_OPT_MAN_WORDS,       /* every flag name, space-separated */
    DL_OPT_MAN_NAMES,       /* every option's name as it is, space-separated (the trainer's keys) */
    DL_OPT_MAN_VALUE_FLAGS, /* the flags that take a value, space-separated */
} dl_opt_man_t;
void dl_opt_print_man(const dl_opt_table_t *t, void *stream, dl_opt_man_t what);

/* ---- Command lines (config/optargv.c) ---- */

typedef struct {
    /* In: the command as typed, for errors and hints ("dlaunch status", "dlaunchd"); the words
     * that are no options go to args, max_args at most. */
    const char *prog;
    const char **args;
    size_t max_args;
    /* Out: how many words went to args; the DL_OPT_STOP option that ended the parse, or NULL. */
    size_t nargs;
    const dl_opt_t *stopped_at;
} dl_opt_argv_t;

/* Reads argv[0..argc) against t, options and arguments in any order: --NAME, --NAME=VALUE,
 * --NAME VALUE, -C and -C VALUE (names exact, '_' as '-'; DL_OPT_FLAG options take no value).
 * A word that is "-" or '-' and a digit (a negative number) is an argument, not an option.
 * Values go through dl_opt_set, so their errors name the flag. Returns 0, or -EINVAL (-ERANGE
 * for a number out of range) with one line in err, which the caller begins with its program's
 * name: an unknown option (with the closest as a hint), a value missing or given to a flag, a
 * bad value, or an argument past max_args (none is dropped). */
int dl_opt_parse_argv(const dl_opt_table_t *t, void *obj, int argc, char **argv, dl_opt_argv_t *a,
                      char *err, size_t errlen);

/* Copies s into buf (len bytes) so that it prints on one line, as it would be typed: control
 * characters as \n, \t or \xNN, and a backslash doubled. Errors quote user text through it. */
void dl_opt_escape(const char *s, char *buf, size_t len);

/* A number as a person writes it, for messages: whole ones in full (1000000, not 1e+06; up to
 * 2^63), others to 6 significant digits (0.1, not 0.10000000000000001). Returns buf. */
const char *dl_opt_num_text(double v, char *buf, size_t len);

/* The accepted spellings of a boolean, for messages. */
#define DL_OPT_BOOL_WORDS "true/false, yes/no, on/off or 1/0"
int dl_opt_parse_bool(const char *s, bool *ret);

#endif
