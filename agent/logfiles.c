/* Log files opened ahead of their workers (logfiles.h). The thread touches nothing but its
 * entries and the file system: no allocation, no libuv, every signal blocked. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "logfiles.h"
#include "output.h"

typedef struct {
    int rank;
    int fd[2];
    int err;     /* 0, or -errno of the first file that could not be opened */
    bool opened; /* by the thread; else dl_logfiles_take opens them */
} entry_t;

struct dl_logfiles_s {
    pthread_t thread;
    bool threaded;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done; /* the thread is through with entries [0, done) */
    bool stop;
    int n;
    entry_t *e;
    char dir[]; /* the attempt folder */
};

static int open_pair(const char *dir, entry_t *e)
{
    for (int s = 0; s < 2; s++) {
        int fd = dl_output_open_log(dir, e->rank, s);
        if (fd < 0) {
            if (s == 1)
                close(e->fd[0]);
            e->fd[0] = e->fd[1] = -1;
            return fd;
        }
        e->fd[s] = fd;
    }
    return 0;
}

static void *opener(void *arg)
{
    dl_logfiles_t *lf = arg;
    bool failed = false;
    for (int i = 0; i < lf->n; i++) {
        pthread_mutex_lock(&lf->lock);
        bool stop = lf->stop;
        pthread_mutex_unlock(&lf->lock);
        if (!stop && !failed) {
            lf->e[i].err = open_pair(lf->dir, &lf->e[i]);
            lf->e[i].opened = true;
            failed = lf->e[i].err < 0;
        }
        pthread_mutex_lock(&lf->lock);
        lf->done = i + 1;
        pthread_cond_signal(&lf->cond);
        pthread_mutex_unlock(&lf->lock);
    }
    return NULL;
}

dl_logfiles_t *dl_logfiles_start(const char *dir, const int *ranks, int n)
{
    size_t dlen = strlen(dir);
    dl_logfiles_t *lf = calloc(1, sizeof(*lf) + dlen + 1);
    if (lf == NULL)
        return NULL;
    lf->e = calloc((size_t)(n > 0 ? n : 1), sizeof(entry_t));
    if (lf->e == NULL) {
        free(lf);
        return NULL;
    }
    memcpy(lf->dir, dir, dlen + 1);
    lf->n = n;
    for (int i = 0; i < n; i++)
        lf->e[i] = (entry_t){ranks[i], {-1, -1}, 0, false};
    pthread_mutex_init(&lf->lock, NULL);
    pthread_cond_init(&lf->cond, NULL);
    /* The thread is born with every signal blocked: the agent's handlers run on its own. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    lf->threaded = pthread_create(&lf->thread, &attr, opener, lf) == 0;
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!lf->threaded)
        lf->done = n;
    return lf;
}

int dl_logfiles_take(dl_logfiles_t *lf, int i, int fds[2])
{
    if (i < 0 || i >= lf->n)
        return -EINVAL;
    pthread_mutex_lock(&lf->lock);
    while (lf->done <= i)
        pthread_cond_wait(&lf->cond, &lf->lock);
    pthread_mutex_unlock(&lf->lock);
    entry_t *e = &lf->e[i];
    int r = e->opened ? e->err : open_pair(lf->dir, e);
    e->opened = true;
    e->err = 0;
    if (r < 0)
        return r;
    fds[0] = e->fd[0];
    fds[1] = e->fd[1];
    e->fd[0] = e->fd[1] = -1;
    return 0;
}

void dl_logfiles_free(dl_logfiles_t *lf)
{
    if (lf == NULL)
        return;
    if (lf->threaded) {
        pthread_mutex_lock(&lf->lock);
        lf->stop = true;
        pthread_mutex_unlock(&lf->lock);
        pthread_join(lf->thread, NULL);
    }
    for (int i = 0; i < lf->n; i++)
        for (int s = 0; s < 2; s++)
            if (lf->e[i].fd[s] >= 0)
                close(lf->e[i].fd[s]);
    pthread_mutex_destroy(&lf->lock);
    pthread_cond_destroy(&lf->cond);
    free(lf->e);
    free(lf);
}
