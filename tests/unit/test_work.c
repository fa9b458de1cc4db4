/*
 * The worker pool (daemon/work.h) as the daemon relies on it: every job's fn runs on a worker
 * and its done on the loop thread, after its fn; a one-thread queue (the stats worker)
 * finishes jobs in the order they were submitted; work_pending counts jobs whose done has
 * not run; a done may submit the next job; work_queue_free runs queued jobs and every
 * completion not yet delivered before it returns.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/work.h"
#include "tap.h"

#define NJOBS 32

static pthread_t loop_thread;

struct job {
    int index;
    int sleep_ms;
    atomic_int fn_ran;
    int fn_on_loop; /* fn ran on the loop thread: wrong */
    int fn_ran_before_done;
    int done_ran;
    int done_on_other; /* done ran off the loop thread: wrong */
    int done_seq;      /* position among completions */
    struct work_queue *wq;
    struct job *next; /* submitted from this job's done */
};

static int done_counter;

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void job_fn(void *arg)
{
    struct job *j = arg;
    if (pthread_equal(pthread_self(), loop_thread))
        j->fn_on_loop = 1;
    if (j->sleep_ms)
        sleep_ms(j->sleep_ms);
    atomic_store(&j->fn_ran, atomic_load(&j->fn_ran) + 1);
}

static void job_done(void *arg)
{
    struct job *j = arg;
    j->fn_ran_before_done = atomic_load(&j->fn_ran) == 1;
    if (!pthread_equal(pthread_self(), loop_thread))
        j->done_on_other = 1;
    j->done_ran++;
    j->done_seq = done_counter++;
    if (j->next)
        work_submit(j->wq, job_fn, job_done, j->next);
}

/* Runs the loop until wq has nothing pending or timeout_ms passes. Returns 1 if drained. */
static int drain(struct event_base *base, struct work_queue *wq, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        if (work_pending(wq) == 0)
            return 1;
        struct timeval tv = {0, 10000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    return work_pending(wq) == 0;
}

static void check_jobs(struct job *jobs, int n, const char *what, int ordered)
{
    int once = 1, fn_first = 1, on_loop = 1, on_workers = 1, in_order = 1;
    for (int i = 0; i < n; i++) {
        once &= jobs[i].done_ran == 1 && atomic_load(&jobs[i].fn_ran) == 1;
        fn_first &= jobs[i].fn_ran_before_done;
        on_loop &= !jobs[i].done_on_other;
        on_workers &= !jobs[i].fn_on_loop;
        if (i > 0 && jobs[i].done_seq <= jobs[i - 1].done_seq)
            in_order = 0;
    }
    ok(once, "%s: every fn and every done ran exactly once", what);
    ok(fn_first, "%s: every done ran after its fn", what);
    ok(on_workers, "%s: no fn ran on the loop thread", what);
    ok(on_loop, "%s: every done ran on the loop thread", what);
    if (ordered)
        ok(in_order, "%s: completions arrive in submission order", what);
}

int main(void)
{
    loop_thread = pthread_self();
    struct event_base *base = event_base_new();
    ok(base != NULL, "event base");

    /* A one-thread queue: order is preserved, and pending counts every unfinished job. */
    {
        struct work_queue *wq = work_queue_new(base, 1);
        ok(wq != NULL, "1-thread queue created");
        ok(work_pending(wq) == 0, "a new queue has nothing pending");
        struct job *jobs = calloc(NJOBS, sizeof(*jobs));
        for (int i = 0; i < NJOBS; i++) {
            jobs[i].index = i;
            jobs[i].sleep_ms = i % 4 == 0 ? 2 : 0;
            work_submit(wq, job_fn, job_done, &jobs[i]);
        }
        ok(work_pending(wq) == NJOBS, "work_pending counts %d submitted jobs (got %d)", NJOBS,
           work_pending(wq));
        /* Without the loop running, no done can have run, however far the worker got. */
        sleep_ms(30);
        int any_done = 0;
        for (int i = 0; i < NJOBS; i++)
            any_done |= jobs[i].done_ran;
        ok(!any_done && work_pending(wq) == NJOBS,
           "no done runs and nothing stops being pending until the loop runs");
        ok(drain(base, wq, 5000), "the loop delivers every completion");
        ok(work_pending(wq) == 0, "nothing pending after the completions");
        check_jobs(jobs, NJOBS, "1 thread", 1);
        work_queue_free(wq);
        free(jobs);
    }

    /* Several threads: fn on workers, done on the loop, each once; jobs really overlap. */
    {
        done_counter = 0;
        struct work_queue *wq = work_queue_new(base, 4);
        ok(wq != NULL, "4-thread queue created");
        struct job jobs[8];
        memset(jobs, 0, sizeof(jobs));
        for (int i = 0; i < 8; i++) {
            jobs[i].sleep_ms = 100;
            work_submit(wq, job_fn, job_done, &jobs[i]);
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ok(drain(base, wq, 5000), "4 threads: the loop delivers every completion");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        check_jobs(jobs, 8, "4 threads", 0);
        ok(ms < 700, "8 jobs of 100 ms on 4 threads take well under 800 ms (%ld ms)", ms);
        work_queue_free(wq);
    }

    /* A done that submits the next job: the chain runs to its end. */
    {
        done_counter = 0;
        struct work_queue *wq = work_queue_new(base, 2);
        struct job jobs[5];
        memset(jobs, 0, sizeof(jobs));
        for (int i = 0; i < 5; i++) {
            jobs[i].wq = wq;
            jobs[i].next = i + 1 < 5 ? &jobs[i + 1] : NULL;
        }
        work_submit(wq, job_fn, job_done, &jobs[0]);
        ok(drain(base, wq, 5000), "chain: a done may submit a job; the loop runs the chain out");
        check_jobs(jobs, 5, "chain", 1);
        work_queue_free(wq);
    }

    /* work_queue_free with jobs queued, running and finished: all complete before it returns. */
    {
        done_counter = 0;
        struct work_queue *wq = work_queue_new(base, 1);
        struct job jobs[6];
        memset(jobs, 0, sizeof(jobs));
        for (int i = 0; i < 6; i++) {
            jobs[i].sleep_ms = 20;
            work_submit(wq, job_fn, job_done, &jobs[i]);
        }
        sleep_ms(30); /* the first is finished, the second running, the rest queued */
        work_queue_free(wq);
        check_jobs(jobs, 6, "work_queue_free", 1);
    }

    /* Freeing an idle queue, and a NULL one, is fine. */
    {
        struct work_queue *wq = work_queue_new(base, 3);
        work_queue_free(wq);
        work_queue_free(NULL);
        ok(1, "freeing an idle queue and NULL returns");
    }

    event_base_free(base);
    return tap_done();
}
