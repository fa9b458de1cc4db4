/*
 * Capping a sandbox's agent.log on the host (logcap.h). The file is cut in place rather than
 * rotated: a renamed file would go on growing under an open descriptor, and a new file in the
 * sandbox directory could race with its removal on delete.
 *
 * The pumps: one thread, one epoll set, every running sandbox's pipe in it. A pump's mutex
 * makes its copying one at a time, whether the thread or a caller of logpump_drain copies.
 * Only the thread closes a pump's pipe (when it reads end of file), so an event it already took
 * from epoll never finds a freed pump: a pump is freed once the thread has closed its pipe and
 * its opener has released it.
 */
#include "driver/logcap.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

/* Bytes read from a pipe at a time (at most half the limit, so a copy after a cut fits). */
#define PUMP_CHUNK 65536
/* A drain copies at most this much, so a writer that never stops cannot hold its caller. */
#define DRAIN_MAX (1 << 20)
/* The pipe's own buffer: a burst of lines waits there rather than blocking the agent. */
#define PUMP_PIPE_SIZE (256 * 1024)

/* The marker line and the newest keep bytes of the file open as fd (size bytes), in place. */
static int cut_fd(int fd, const char *path, uint64_t size, uint64_t max, uint64_t keep,
                  uint64_t *dropped, struct wr_err *err)
{
    char *tail = malloc(keep ? keep : 1);
    if (!tail)
        return wr_err_set(err, ENOMEM, "no memory to cap %s", path);
    ssize_t n = keep ? pread(fd, tail, keep, (off_t)(size - keep)) : 0;
    if (n < 0) {
        int e = errno;
        free(tail);
        return wr_err_sys(err, e, "reading %s", path);
    }
    /* Start at a line: the first, partial one goes. */
    size_t from = 0;
    char *nl = n > 0 ? memchr(tail, '\n', (size_t)n) : NULL;
    from = nl ? (size_t)(nl - tail) + 1 : (size_t)n;
    if (ftruncate(fd, 0) < 0) {
        int e = errno;
        free(tail);
        return wr_err_sys(err, e, "truncating %s", path);
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    time_t t = tv.tv_sec;
    gmtime_r(&t, &tm);
    char ts[32], marker[160];
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    uint64_t gone = size - ((uint64_t)n - from);
    int m = snprintf(marker, sizeof(marker),
                     "ts=%s.%03dZ level=warn event=log.truncated bytes=%llu limit=%llu\n", ts,
                     (int)(tv.tv_usec / 1000), (unsigned long long)gone, (unsigned long long)max);
    /* O_APPEND: lines another writer adds meanwhile land after these, never inside them. */
    if (write_all(fd, marker, (size_t)m) < 0 || write_all(fd, tail + from, (size_t)n - from) < 0) {
        int e = errno;
        free(tail);
        return wr_err_sys(err, e, "writing %s", path);
    }
    free(tail);
    if (dropped)
        *dropped = gone;
    return 1;
}

int driver_log_cap(const char *dir, uint64_t max, uint64_t keep, uint64_t *dropped,
                   struct wr_err *err)
{
    if (dropped)
        *dropped = 0;
    if (keep > max)
        keep = max;
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/agent.log", dir) >= (int)sizeof(path))
        return wr_err_set(err, ENAMETOOLONG, "sandbox directory too long");
    cleanup_close int fd = open(path, O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? 0 : wr_err_sys(err, errno, "opening %s", path);
    struct stat st;
    if (fstat(fd, &st) < 0)
        return wr_err_sys(err, errno, "stat %s", path);
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size <= max)
        return 0;
    return cut_fd(fd, path, (uint64_t)st.st_size, max, keep, dropped, err);
}

/* ---- the pumps ---- */

struct logpump {
    pthread_mutex_t mu;
    int rfd;   /* the pipe's read end; -1 once the thread has closed it */
    int logfd; /* agent.log, O_APPEND */
    uint64_t max;
    int cuts;             /* so far; the first is logged */
    int failed;           /* cuts that failed; the first is logged */
    atomic_int refs;      /* the opener's, and the thread's while the pipe is open */
    struct logpump *next; /* in open_pumps while the pipe is open */
    char id[64];
    char path[PATH_MAX];
};

static pthread_once_t pumps_once = PTHREAD_ONCE_INIT;
static int pumps_ep = -1;
static int pumps_errno;

/* Pumps whose pipe is open, so that logpump_settle can wait for one to take its last bytes. */
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t open_cond = PTHREAD_COND_INITIALIZER;
static struct logpump *open_pumps;

static void open_remove(struct logpump *p)
{
    pthread_mutex_lock(&open_mu);
    for (struct logpump **q = &open_pumps; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            break;
        }
    pthread_cond_broadcast(&open_cond);
    pthread_mutex_unlock(&open_mu);
}

static void pump_unref(struct logpump *p)
{
    if (atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Appends n bytes, cutting the file first if they would take it past max. Under p->mu. */
static void pump_write(struct logpump *p, const char *buf, size_t n)
{
    struct stat st;
    if (fstat(p->logfd, &st) < 0)
        return;
    if ((uint64_t)st.st_size + n > p->max) {
        struct wr_err err;
        uint64_t dropped = 0;
        if (cut_fd(p->logfd, p->path, (uint64_t)st.st_size, p->max, p->max / 4, &dropped, &err) <
            0) {
            if (p->failed++ == 0)
                log_error(p->id, "sandbox.log_cut_failed", "error=\"%s\"", err.msg);
            return; /* the bytes are dropped: the file must not grow */
        }
        if (p->cuts++ == 0)
            log_warn(p->id, "sandbox.log_cut", "bytes=%llu limit=%llu", (unsigned long long)dropped,
                     (unsigned long long)p->max);
    }
    (void)write_all(p->logfd, buf, n);
}

/* Copies from the pipe until it is empty, at most limit bytes (0: no limit), into the file.
 * Returns 1 at end of file (every writer gone), else 0. Under p->mu. */
static int pump_copy(struct logpump *p, size_t limit)
{
    char buf[PUMP_CHUNK];
    size_t chunk = p->max / 2 < sizeof(buf) ? (size_t)(p->max / 2) : sizeof(buf);
    size_t done = 0;
    while (p->rfd >= 0 && (limit == 0 || done < limit)) {
        ssize_t n = read(p->rfd, buf, chunk);
        if (n > 0) {
            pump_write(p, buf, (size_t)n);
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        return n == 0;
    }
    return 0;
}

static void *pumps_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct epoll_event ev[32];
        int n = epoll_wait(pumps_ep, ev, 32, -1);
        if (n < 0) {
            if (errno != EINTR)
                log_error(NULL, "logpump.wait_failed", "error=\"%s\"", strerror(errno));
            continue;
        }
        for (int i = 0; i < n; i++) {
            struct logpump *p = ev[i].data.ptr;
            pthread_mutex_lock(&p->mu);
            /* A bounded copy per wake-up: one busy pipe does not starve the others. */
            int eof = pump_copy(p, 4 * PUMP_CHUNK);
            if (eof) {
                epoll_ctl(pumps_ep, EPOLL_CTL_DEL, p->rfd, NULL);
                close(p->rfd);
                close(p->logfd);
                p->rfd = p->logfd = -1;
            }
            pthread_mutex_unlock(&p->mu);
            if (eof) {
                open_remove(p);
                pump_unref(p);
            }
        }
    }
    return NULL;
}

static void pumps_start(void)
{
    pumps_ep = epoll_create1(EPOLL_CLOEXEC);
    if (pumps_ep < 0) {
        pumps_errno = errno;
        return;
    }
    pthread_t t;
    int r = pthread_create(&t, NULL, pumps_main, NULL);
    if (r != 0) {
        pumps_errno = r;
        close(pumps_ep);
        pumps_ep = -1;
        return;
    }
    pthread_detach(t);
}

struct logpump *logpump_open(const char *dir, const char *id, uint64_t max, int *write_fd,
                             off_t *size_before, struct wr_err *err)
{
    *write_fd = -1;
    pthread_once(&pumps_once, pumps_start);
    if (pumps_ep < 0) {
        wr_err_sys(err, pumps_errno, "starting the agent log thread");
        return NULL;
    }
    struct logpump *p = calloc(1, sizeof(*p));
    if (!p) {
        wr_err_set(err, ENOMEM, "no memory for an agent log");
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    p->max = max < LOGCAP_MIN_MAX ? LOGCAP_MIN_MAX : max;
    snprintf(p->id, sizeof(p->id), "%s", id ? id : "");
    if (snprintf(p->path, sizeof(p->path), "%s/agent.log", dir) >= (int)sizeof(p->path)) {
        wr_err_set(err, ENAMETOOLONG, "sandbox directory too long");
        goto fail_free;
    }
    /* Read as well: a cut keeps the file's newest lines. */
    p->logfd = open(p->path, O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0640);
    if (p->logfd < 0) {
        wr_err_sys(err, errno, "opening %s", p->path);
        goto fail_free;
    }
    struct stat st;
    if (size_before)
        *size_before = fstat(p->logfd, &st) == 0 ? st.st_size : 0;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) {
        wr_err_sys(err, errno, "a pipe for %s", p->path);
        goto fail_log;
    }
    (void)fcntl(fds[1], F_SETPIPE_SZ, PUMP_PIPE_SIZE);
    p->rfd = fds[0];
    if (fcntl(p->rfd, F_SETFL, O_NONBLOCK) < 0) {
        wr_err_sys(err, errno, "a pipe for %s", p->path);
        goto fail_pipe;
    }
    atomic_init(&p->refs, 2);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = p};
    if (epoll_ctl(pumps_ep, EPOLL_CTL_ADD, p->rfd, &ev) < 0) {
        wr_err_sys(err, errno, "watching the pipe for %s", p->path);
        goto fail_pipe;
    }
    pthread_mutex_lock(&open_mu);
    p->next = open_pumps;
    open_pumps = p;
    pthread_mutex_unlock(&open_mu);
    *write_fd = fds[1];
    return p;
fail_pipe:
    close(fds[0]);
    close(fds[1]);
fail_log:
    close(p->logfd);
fail_free:
    pthread_mutex_destroy(&p->mu);
    free(p);
    return NULL;
}

void logpump_drain(struct logpump *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    /* End of file is the thread's to handle: it closes the pipe. */
    pump_copy(p, DRAIN_MAX);
    pthread_mutex_unlock(&p->mu);
}

void logpump_settle(const char *dir, int timeout_ms)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/agent.log", dir) >= (int)sizeof(path))
        return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&open_mu);
    for (;;) {
        int open = 0;
        for (struct logpump *p = open_pumps; p && !open; p = p->next)
            open = !strcmp(p->path, path);
        if (!open || pthread_cond_timedwait(&open_cond, &open_mu, &until) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&open_mu);
}

int logpump_closed(struct logpump *p)
{
    pthread_mutex_lock(&p->mu);
    int closed = p->rfd < 0;
    pthread_mutex_unlock(&p->mu);
    return closed;
}

void logpump_release(struct logpump *p)
{
    if (p)
        pump_unref(p);
}
