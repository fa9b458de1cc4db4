/*
 * A small pool of worker threads for blocking work (driver operations: runsc,
 * mounts) so the event loop never blocks. A job runs `fn` on a worker, then
 * `done` on the event-loop thread.
 */
#ifndef WR_DAEMON_WORK_H
#define WR_DAEMON_WORK_H

#include <event2/event.h>

struct work_queue;

typedef void (*work_fn)(void *arg);

/** Creates a pool of nthreads workers whose completions run on base's loop. NULL on failure. */
struct work_queue *work_queue_new(struct event_base *base, int nthreads);

/** Queues a job: fn(arg) on a worker, then done(arg) on the loop thread. Never fails. */
void work_submit(struct work_queue *wq, work_fn fn, work_fn done, void *arg);

/** Number of jobs queued or running whose `done` has not run yet. */
int work_pending(struct work_queue *wq);

/** Waits for running jobs to finish (queued ones still run), stops the workers, frees the pool.
 * Completions not yet delivered are run before returning. */
void work_queue_free(struct work_queue *wq);

#endif
