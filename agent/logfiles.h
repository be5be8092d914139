/* An attempt's log files (rank_N.out and rank_N.err of each worker), opened on a thread of their
 * own while the agent starts the workers. A file's creation is the dearest step of a worker's
 * start on a busy ext4 (its inode allocator searches past recently deleted inodes: 100-200 µs
 * each); the thread does it while the agent sits in clone() waiting for a worker's exec, so the
 * files are ready, and held, before their worker runs, as when the agent opened them itself. */
#ifndef DL_LOGFILES_H
#define DL_LOGFILES_H

typedef struct dl_logfiles_s dl_logfiles_t;

/* Starts opening dir's files for ranks[0..n) in that order (a negative rank: spare_K for
 * -1 - K), as dl_output_open would (dl_ownfile_open, O_APPEND). Without a thread (none could
 * be started) dl_logfiles_take opens each file itself. Returns NULL without memory. */
dl_logfiles_t *dl_logfiles_start(const char *dir, const int *ranks, int n);

/* Waits for entry i's two files and hands them over: fds[0] stdout's, fds[1] stderr's, the
 * caller's to close. Returns 0 or -errno (nothing open then); once one entry failed, the thread
 * opens no more and the later ones are opened here, if asked for. */
int dl_logfiles_take(dl_logfiles_t *lf, int i, int fds[2]);

/* Stops the thread after the file it is opening, closes what was not taken, frees lf (NULL is
 * nothing). */
void dl_logfiles_free(dl_logfiles_t *lf);

#endif
