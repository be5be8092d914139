/* Seeing inside a running job: the health beats workers write, the rule that names stragglers,
 * the one-line account of where the ranks of a hung job are. A node's report on the wire is
 * proto/node-report.h's record. docs/diagnostics.md is the reference.
 *
 * Pure: no clock (time is an argument), no file, no socket, no printing. libc and jansson only,
 * so that the agent, the rendezvous server and the control commands share one implementation.
 * Functions return >= 0 or -errno; destructors accept NULL. */
#ifndef DL_DIAG_H
#define DL_DIAG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Beats --------------------------------------------------------------------------------- */

/* A worker writes to DLAUNCH_HEALTH_FD. Any byte is a beat (so a worker that writes one byte now
 * and then is fine). A line of space-separated key=value pairs also carries figures:
 *
 *     step=812 compute_ms=3.1 wait_ms=0.4 loss=0.52 samples=256
 *
 * step: steps done; steps: how many steps the line covers (default 1); compute_ms and wait_ms:
 * a step's time outside and inside collective calls, averaged over those steps; samples: samples
 * a step on this rank; loss: the mean loss over them. Unknown keys and bad values are ignored. */
#define DL_DIAG_LINE_MAX 512

/* What is known of one rank from its beats. The agent keeps one per worker; other code (the
 * status page) may read it. */
typedef struct {
    double last_beat; /* the caller's clock at the last byte; 0: none yet */
    uint64_t beats;   /* lines, and reads that brought no newline */
    bool figures;     /* a line with step= came */
    uint64_t step;
    double loss;       /* NAN when not reported */
    double compute_ms; /* of the latest line: a step's mean */
    double wait_ms;
    double samples;
    /* Sums over every line since the worker started: what the straggler rule differences. */
    double total_steps;
    double total_compute_ms;
    double total_wait_ms;
    double total_samples;
    /* The line being assembled. */
    char partial[DL_DIAG_LINE_MAX];
    size_t partial_len;
    bool overlong; /* dropping the rest of a line that did not fit */
} dl_diag_beats_t;

void dl_diag_beats_init(dl_diag_beats_t *b);

/* Takes len bytes read from the pipe at time now. Returns how many complete lines carried
 * figures. */
int dl_diag_beats_feed(dl_diag_beats_t *b, const char *data, size_t len, double now);

/* Parses one line (without its newline) into b as if it had come through the pipe. Returns 1
 * when it carried step=, else 0. */
int dl_diag_beats_line(dl_diag_beats_t *b, const char *line, size_t len);

/* ---- Stragglers ---------------------------------------------------------------------------- */

/* The rule: at every evaluation a rank's compute time a step is summed over its latest window
 * (from its newest snapshot of sums at least window steps and min_reports reports back, to its
 * latest sums; snapshots are window / 8 steps apart or more) and held against the job's median
 * of the same (over every rank with a window; with an even number of ranks the lower middle
 * one, so that in a job of two the slow rank is held against the other). Slower than median x
 * (1 + threshold) over its window and over the window before it (ending where the latest
 * starts; one window can be a one-off stall): a straggler, named once. It is cleared by a window that
 * starts after it was named and is within the threshold. A sum, not a streak, so that intervals
 * that look normal by chance do not hide a rank that costs the job a steady share of its time. */
typedef struct {
    double threshold; /* 0.3: 30% slower than the median */
    uint64_t window;  /* steps */
    int min_reports;  /* reports a window spans at least, whatever the steps (1 to 7) */
} dl_diag_straggler_opts_t;

#define DL_DIAG_THRESHOLD_DEFAULT 0.3
#define DL_DIAG_WINDOW_DEFAULT 100
#define DL_DIAG_MIN_REPORTS 3

void dl_diag_straggler_opts_init(dl_diag_straggler_opts_t *o);

/* One rank's sums, as dl_diag_beats_t keeps them, and where it runs. */
typedef struct {
    int rank;
    int node_rank;
    const char *host; /* borrowed for the call */
    double steps, compute_ms, wait_ms, samples;
} dl_diag_totals_t;

typedef struct dl_diag_judge_s dl_diag_judge_t;

int dl_diag_judge_new(const dl_diag_straggler_opts_t *o, dl_diag_judge_t **ret);
void dl_diag_judge_free(dl_diag_judge_t *j);
/* Forgets every rank: a new attempt starts its sums from zero. */
void dl_diag_judge_reset(dl_diag_judge_t *j);

/* Takes the latest sums of some ranks (a node's report). Returns 0 or -ENOMEM / -EINVAL (a
 * negative rank). Memory grows with the ranks seen, whatever their numbers. Sums that went down
 * mean a restarted worker: its history starts again. */
int dl_diag_judge_feed(dl_diag_judge_t *j, const dl_diag_totals_t *v, size_t n);

typedef struct {
    int rank;
    int node_rank;
    char host[64];
    double compute_ms; /* its compute time a step over its latest window */
    double median_ms;  /* the job's median then */
    double step_ms;    /* the job's step (compute + wait), median over ranks */
    double slower;     /* compute_ms / median_ms - 1 */
    uint64_t steps;    /* the steps of its window and the one before */
    double cost;       /* samples/s the job would gain if it ran at the median */
    bool named;        /* this report named it (else it was named before) */
} dl_diag_straggler_t;

typedef struct {
    int ranks;        /* with figures */
    double median_ms; /* compute a step */
    double step_ms;
    int slowest_rank; /* -1 when no figures */
    double slowest_ms;
    double samples_per_s;                  /* the job's, from the ranks' figures */
    const dl_diag_straggler_t *stragglers; /* owned by the judge, valid until the next call */
    size_t nstragglers;
    const int *cleared; /* ranks cleared by this evaluation */
    size_t ncleared;
} dl_diag_view_t;

/* Applies the rule to what was fed since the last evaluation. Returns 0 or -ENOMEM. */
int dl_diag_judge_eval(dl_diag_judge_t *j, dl_diag_view_t *ret);

/* The last evaluation's view, without evaluating. */
void dl_diag_judge_view(const dl_diag_judge_t *j, dl_diag_view_t *ret);

/* ---- Where the ranks are ------------------------------------------------------------------- */

typedef enum {
    DL_DIAG_OP_NONE = 0, /* no operation yet, or no recorder */
    DL_DIAG_OP_QUEUED,
    DL_DIAG_OP_RUNNING,
    DL_DIAG_OP_DONE,
    DL_DIAG_OP_FAILED,
} dl_diag_op_state_t;

/* One operation of a rank, as its flight recorder has it. */
typedef struct {
    uint64_t seq;
    const char *op; /* "all-reduce" */
    dl_diag_op_state_t state;
    uint64_t bytes;
    const char *algo;      /* "" when the operation has one way */
    const char *transport; /* "shm" */
    double age_s;          /* since it started (running) or ended (done); < 0 unknown */
} dl_diag_op_t;

#define DL_DIAG_OPS_MAX 8

typedef struct {
    int rank;
    int node_rank;
    const char *host;
    bool recorder;   /* it keeps a flight recorder */
    char proc;       /* its process state from /proc: 'R', 'S', 'T' (stopped), 'Z'; 0 unknown */
    double silent_s; /* since its last beat; < 0 unknown */
    uint64_t step;   /* from its beats; 0 unknown */
    dl_diag_op_t ops[DL_DIAG_OPS_MAX]; /* newest last */
    size_t nops;
} dl_diag_rank_t;

/* One line a human can act on, about ranks v[0..n) (any order), for example
 *   "rank 3 never entered reduce-scatter #812 (its last: all-gather #811, done 31 s ago; its
 *    process is stopped); ranks 0-2 have waited in it for 31 s"
 * Writes a NUL-terminated line into buf (cut to len) and returns its length. */
size_t dl_diag_explain(const dl_diag_rank_t *v, size_t n, char *buf, size_t len);

/* The longest any rank has been inside its newest operation, in seconds (0: none is, or not
 * known): a job that moves shows fractions of a second, a stuck one grows. */
double dl_diag_stuck_s(const dl_diag_rank_t *v, size_t n);

/* The hang watchdog's rule: which of a node's ranks, silent in v[0..n) (silent_s from their last
 * beat), to name as hung once timeout seconds pass. A rank that sleeps inside a collective waits
 * for a peer, which may be on another node and named by its own agent first, so the one to name is
 * a rank that is silent outside any collective, or stopped; of several, the first to fall silent.
 * Ranks that only wait are named after twice the timeout (a collective that never completes
 * anywhere), with *ret_waiting set. Returns an index into v, or -1 when none is due. */
int dl_diag_hang_culprit(const dl_diag_rank_t *v, size_t n, double timeout, bool *ret_waiting);

/* "0-2,5,7-9": ranks (sorted here, in place) as ranges. */
size_t dl_diag_ranks_text(int *ranks, size_t n, char *buf, size_t len);

/* ---- Python stacks ------------------------------------------------------------------------- */

/* The innermost frames (up to frames) of the main thread in the newest of the faulthandler dumps
 * in text[0..len), as "train.py:42 step < train.py:80 main" (innermost first, file names without
 * their folders), NUL-terminated in buf (cut to buflen). Returns its length; 0 when text holds no
 * dump. */
size_t dl_diag_stack_top(const char *text, size_t len, int frames, char *buf, size_t buflen);

/* ---- On the wire (docs/protocol.md) -------------------------------------------------------- */

/* A node's report on the wire is declared as a record in proto/node-report.h, and made from and
 * read into this file's types by rendezvous/rdzv-report.h (diag/ is below neither). */

/* One straggler as a line: "rank 3 on node 1 (gpu3) computes 4.10 ms a step against the median
 * 2.90 ms (+41%) for 820 steps; it costs the job about 12000 samples/s". */
size_t dl_diag_straggler_text(const dl_diag_straggler_t *s, char *buf, size_t len);

/* The op state's name ("running"), and back (DL_DIAG_OP_NONE for anything else). */
const char *dl_diag_op_state_name(dl_diag_op_state_t s);
dl_diag_op_state_t dl_diag_op_state_parse(const char *name);

/* round() and ceil() without libm: they were all dlaunch used of it, and the loader mapping and
 * relocating libm cost every start about 0.1 ms. The same results for every double, signed zeros
 * included: past 2^52 a double has no fraction, and NaN or infinity stays as it is. */
static inline double dl_diag_round(double x)
{
    if (!(x > -4503599627370496.0 && x < 4503599627370496.0))
        return x;
    double t = (double)(long long)x; /* toward zero */
    double f = x - t;
    t = f >= 0.5 ? t + 1 : f <= -0.5 ? t - 1 : t;
    return __builtin_copysign(t, x);
}

static inline double dl_diag_ceil(double x)
{
    if (!(x > -4503599627370496.0 && x < 4503599627370496.0))
        return x;
    double t = (double)(long long)x;
    return __builtin_copysign(t < x ? t + 1 : t, x);
}

#endif
