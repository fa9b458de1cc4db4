/*
 * A spinner on stderr while something the user waits for runs (a sandbox starting), shown
 * only when stderr is a terminal: a line redrawn in place every 100 ms by a thread of its own,
 * erased when it stops. Nothing is written when stderr is a file or a pipe.
 */
#include "cli/spinner.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

struct spinner {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    char what[96];
    uint64_t t0;
};

static void *spin(void *arg)
{
    struct spinner *s = arg;
    static const char frames[] = "|/-\\";
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; !s->stop; i++) {
        uint64_t ms = now_ms_monotonic() - s->t0;
        fprintf(stderr, "\r\033[K%c %s %llu.%llu s", frames[i % 4], s->what,
                (unsigned long long)(ms / 1000), (unsigned long long)(ms % 1000 / 100));
        fflush(stderr);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!s->stop && pthread_cond_timedwait(&s->cond, &s->lock, &until) == 0)
            ;
    }
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

struct spinner *spinner_start(const char *what)
{
    if (!isatty(STDERR_FILENO))
        return NULL;
    struct spinner *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    snprintf(s->what, sizeof(s->what), "%s", what);
    s->t0 = now_ms_monotonic();
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->lock, NULL);
    if (pthread_create(&s->thread, NULL, spin, s) != 0) {
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return NULL;
    }
    return s;
}

void spinner_stop(struct spinner *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
