/* Asynchronous all-reduce: a communication thread per group, started on the first request, runs
 * queued operations in issue order while the caller computes. Synchronous operations run on the
 * caller's thread (no hand-off cost on the latency path) once the queue has drained, so every
 * rank still sees the same order.
 *
 * A request's completion is a futex word inside the request itself: waiting touches nothing of
 * the group, so a request may be waited on after the group is gone. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

struct dl_coll_request_s {
    dl_coll_group_t *g;
    const void *src;
    void *dst;
    size_t count;
    dl_coll_dtype_t dtype;
    dl_coll_op_t op;
    int result;
    uint64_t seq; /* its flight recorder entry, or 0 */
    _Atomic uint32_t done;
    dl_coll_request_t *next;
};

int dl__coll_async_init(dl_coll_group_t *g)
{
    int r = pthread_mutex_init(&g->mu, NULL);
    if (r != 0)
        return -r;
    r = pthread_cond_init(&g->cv, NULL);
    if (r != 0) {
        pthread_mutex_destroy(&g->mu);
        return -r;
    }
    g->async_ok = 1;
    return 0;
}

static void complete(dl_coll_request_t *req, int result)
{
    req->result = result;
    atomic_store_explicit(&req->done, 1, memory_order_release);
    syscall(SYS_futex, (uint32_t *)&req->done, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void *comm_main(void *arg)
{
    dl_coll_group_t *g = arg;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (g->head == NULL && !g->stopping)
            pthread_cond_wait(&g->cv, &g->mu);
        if (g->head == NULL)
            break;
        dl_coll_request_t *req = g->head;
        g->head = req->next;
        if (g->head == NULL)
            g->tail = NULL;
        pthread_mutex_unlock(&g->mu);
        dl__coll_rec_start(&g->rec, req->seq, DL_COLL_REC_ALLREDUCE,
                           req->count * dl_coll_dtype_size(req->dtype),
                           dl__coll_allreduce_algo(g, req->count, req->dtype), req->dtype, -1);
        int r = dl__coll_run_allreduce(g, req->src, req->dst, req->count, req->dtype, req->op);
        dl__coll_rec_end(&g->rec, req->seq, r);
        pthread_mutex_lock(&g->mu);
        /* Pending drops before the request completes: a caller that waited on it and then
         * drains finds the queue idle without a second wake-up. */
        g->pending--;
        if (g->pending == 0)
            pthread_cond_broadcast(&g->cv);
        complete(req, r);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static int start_thread(dl_coll_group_t *g)
{
    /* The thread takes no signals: they belong to the program's own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&g->thread, NULL, comm_main, g);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0)
        return -r;
    g->thread_started = 1;
    return 0;
}

int dl_coll_allreduce_async(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                            dl_coll_dtype_t dtype, dl_coll_op_t op, dl_coll_request_t **ret_req)
{
    if ((unsigned)dtype > DL_COLL_INT64 || (unsigned)op > DL_COLL_MAX ||
        (count > 0 && (sendbuf == NULL || recvbuf == NULL)))
        return -EINVAL;
    dl_coll_request_t *req = calloc(1, sizeof(*req));
    if (req == NULL)
        return -ENOMEM;
    *req = (dl_coll_request_t){
        .g = g, .src = sendbuf, .dst = recvbuf, .count = count, .dtype = dtype, .op = op};
    pthread_mutex_lock(&g->mu);
    int r = g->thread_started ? 0 : start_thread(g);
    if (r == 0) {
        if (g->tail != NULL)
            g->tail->next = req;
        else
            g->head = req;
        g->tail = req;
        g->pending++;
        /* Numbered in issue order, which is the order the thread runs them in. */
        req->seq = dl__coll_rec_issue(&g->rec);
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    if (r < 0) {
        free(req);
        return r;
    }
    *ret_req = req;
    return 0;
}

int dl_coll_test(dl_coll_request_t *req, int *ret_done)
{
    if (req == NULL)
        return -EINVAL;
    *ret_done = atomic_load_explicit(&req->done, memory_order_acquire) != 0;
    return 0;
}

int dl_coll_wait(dl_coll_request_t *req)
{
    if (req == NULL)
        return -EINVAL;
    while (atomic_load_explicit(&req->done, memory_order_acquire) == 0)
        syscall(SYS_futex, (uint32_t *)&req->done, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    int r = req->result;
    free(req);
    return r;
}

void dl__coll_drain(dl_coll_group_t *g)
{
    /* Only the caller's thread queues work, so with no thread started nothing can be queued. */
    if (!g->thread_started)
        return;
    pthread_mutex_lock(&g->mu);
    while (g->pending > 0)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

void dl__coll_async_shutdown(dl_coll_group_t *g)
{
    if (!g->async_ok)
        return;
    if (g->thread_started) {
        pthread_mutex_lock(&g->mu);
        g->stopping = 1;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
        g->thread_started = 0;
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}
