/*
 * Worker threads for blocking driver calls. Completions are handed back to
 * the event loop through an eventfd, so every `done` callback runs on the
 * loop thread and may touch daemon state without locks.
 */
#include "daemon/work.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/util.h"

struct job {
    work_fn fn, done;
    void *arg;
    struct job *next;
};

struct work_queue {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct job *todo_head, *todo_tail;
    struct job *done_head, *done_tail;
    int pending;
    int stopping;
    int nthreads;
    pthread_t *threads;
    int efd;
    struct event *ev;
};

static void push(struct job **head, struct job **tail, struct job *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static void *worker(void *p)
{
    struct work_queue *wq = p;
    pthread_mutex_lock(&wq->lock);
    for (;;) {
        while (!wq->todo_head && !wq->stopping)
            pthread_cond_wait(&wq->cond, &wq->lock);
        if (!wq->todo_head && wq->stopping)
            break;
        struct job *j = wq->todo_head;
        wq->todo_head = j->next;
        if (!wq->todo_head)
            wq->todo_tail = NULL;
        pthread_mutex_unlock(&wq->lock);
        j->fn(j->arg);
        pthread_mutex_lock(&wq->lock);
        push(&wq->done_head, &wq->done_tail, j);
        uint64_t one = 1;
        (void)!write(wq->efd, &one, sizeof(one));
    }
    pthread_mutex_unlock(&wq->lock);
    return NULL;
}

static void run_completions(struct work_queue *wq)
{
    pthread_mutex_lock(&wq->lock);
    struct job *j = wq->done_head;
    wq->done_head = wq->done_tail = NULL;
    pthread_mutex_unlock(&wq->lock);
    while (j) {
        struct job *next = j->next;
        j->done(j->arg);
        pthread_mutex_lock(&wq->lock);
        wq->pending--;
        pthread_mutex_unlock(&wq->lock);
        free(j);
        j = next;
    }
}

static void on_event(evutil_socket_t fd, short what, void *p)
{
    uint64_t v;
    (void)!read(fd, &v, sizeof(v));
    run_completions(p);
}

struct work_queue *work_queue_new(struct event_base *base, int nthreads)
{
    struct work_queue *wq = xcalloc(1, sizeof(*wq));
    pthread_mutex_init(&wq->lock, NULL);
    pthread_cond_init(&wq->cond, NULL);
    wq->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wq->efd < 0) {
        free(wq);
        return NULL;
    }
    wq->ev = event_new(base, wq->efd, EV_READ | EV_PERSIST, on_event, wq);
    event_add(wq->ev, NULL);
    wq->threads = xcalloc((size_t)nthreads, sizeof(pthread_t));
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&wq->threads[i], NULL, worker, wq) != 0)
            break;
        wq->nthreads++;
    }
    return wq;
}

void work_submit(struct work_queue *wq, work_fn fn, work_fn done, void *arg)
{
    struct job *j = xcalloc(1, sizeof(*j));
    j->fn = fn;
    j->done = done;
    j->arg = arg;
    pthread_mutex_lock(&wq->lock);
    push(&wq->todo_head, &wq->todo_tail, j);
    wq->pending++;
    pthread_cond_signal(&wq->cond);
    pthread_mutex_unlock(&wq->lock);
}

int work_pending(struct work_queue *wq)
{
    pthread_mutex_lock(&wq->lock);
    int n = wq->pending;
    pthread_mutex_unlock(&wq->lock);
    return n;
}

void work_queue_free(struct work_queue *wq)
{
    if (!wq)
        return;
    pthread_mutex_lock(&wq->lock);
    wq->stopping = 1;
    pthread_cond_broadcast(&wq->cond);
    pthread_mutex_unlock(&wq->lock);
    for (int i = 0; i < wq->nthreads; i++)
        pthread_join(wq->threads[i], NULL);
    run_completions(wq);
    event_free(wq->ev);
    close(wq->efd);
    free(wq->threads);
    pthread_mutex_destroy(&wq->lock);
    pthread_cond_destroy(&wq->cond);
    free(wq);
}
