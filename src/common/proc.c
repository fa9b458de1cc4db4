/*
 * Child processes for a daemon that is a child subreaper.
 *
 * runsc leaves its sandbox and gofer processes behind when `runsc create` or
 * `runsc run --detach` exits; as a subreaper we inherit them, and unless
 * somebody reaps them promptly `runsc delete` waits ~1.5 s for them to
 * vanish. So one reaper thread reaps every child, ours and orphans, and
 * records exit statuses in a table; proc_wait() picks its pid's status from
 * there.
 *
 * The reaper peeks with waitid(WNOWAIT) and reaps only while holding the table
 * lock, so a pid that proc_wait() finds unreaped under the lock cannot have
 * been recycled: killing it on timeout is safe. Pids registered by proc_spawn
 * stay in the table until proc_wait() claims them (a child that exits before
 * proc_wait() is called is not lost); statuses of orphans nobody asked for age
 * out. Without a reaper (CLI commands) proc_wait() falls back to waitpid().
 */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

extern char **environ;

#define ORPHAN_MAX 256      /* unclaimed statuses kept at most */
#define ORPHAN_TTL_MS 30000 /* and for at most this long */
#define CAPTURE_MAX (64 * 1024)

enum entry_state {
    ENTRY_RUNNING, /* spawned by us, not exited yet */
    ENTRY_EXITED,  /* spawned by us, exited, status not claimed yet */
    ENTRY_ORPHAN,  /* reaped, nobody registered it */
};

struct entry {
    pid_t pid;
    enum entry_state state;
    int status;
    uint64_t reaped_ms;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t table_cond;   /* an entry changed, or a child was spawned */
static struct entry *table;         /* under table_lock */
static size_t table_len, table_cap; /* under table_lock */
static uint64_t spawn_gen;          /* under table_lock: bumped by every spawn */
static bool reaper_running;         /* under table_lock */
static pthread_t reaper_thread;
static pthread_once_t cond_once = PTHREAD_ONCE_INIT;

static void cond_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&table_cond, &a);
    pthread_condattr_destroy(&a);
}

static struct entry *table_find(pid_t pid)
{
    for (size_t i = 0; i < table_len; i++)
        if (table[i].pid == pid)
            return &table[i];
    return NULL;
}

static void table_remove(struct entry *e)
{
    *e = table[--table_len];
}

static struct entry *table_add(pid_t pid)
{
    if (table_len == table_cap) {
        table_cap = table_cap ? table_cap * 2 : 64;
        table = xrealloc(table, table_cap * sizeof(*table));
    }
    struct entry *e = &table[table_len++];
    memset(e, 0, sizeof(*e));
    e->pid = pid;
    return e;
}

/* Drops orphan statuses that are too old, and the oldest ones beyond ORPHAN_MAX. */
static void table_expire(uint64_t now)
{
    size_t orphans = 0;
    for (size_t i = 0; i < table_len;) {
        if (table[i].state == ENTRY_ORPHAN && now - table[i].reaped_ms > ORPHAN_TTL_MS) {
            table_remove(&table[i]);
            continue;
        }
        if (table[i].state == ENTRY_ORPHAN)
            orphans++;
        i++;
    }
    while (orphans > ORPHAN_MAX) {
        struct entry *oldest = NULL;
        for (size_t i = 0; i < table_len; i++)
            if (table[i].state == ENTRY_ORPHAN &&
                (!oldest || table[i].reaped_ms < oldest->reaped_ms))
                oldest = &table[i];
        table_remove(oldest);
        orphans--;
    }
}

/* Called with table_lock held: reaps pid (known to be a zombie) and records it. */
static void record_exit(pid_t pid)
{
    int status;
    pid_t r;
    do
        r = waitpid(pid, &status, WNOHANG | __WALL);
    while (r < 0 && errno == EINTR);
    if (r != pid)
        return;
    uint64_t now = now_ms_monotonic();
    struct entry *e = table_find(pid);
    if (e && e->state == ENTRY_RUNNING) {
        e->state = ENTRY_EXITED;
    } else {
        if (!e)
            e = table_add(pid);
        e->state = ENTRY_ORPHAN;
    }
    e->status = status;
    e->reaped_ms = now;
    table_expire(now);
    pthread_cond_broadcast(&table_cond);
}

static void unlock_cleanup(void *arg)
{
    (void)arg;
    pthread_mutex_unlock(&table_lock);
}

static void *reaper_main(void *arg)
{
    (void)arg;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
    for (;;) {
        /* Taken before waitid: a spawn between an ECHILD and the wait below is not missed. */
        pthread_mutex_lock(&table_lock);
        uint64_t gen = spawn_gen;
        pthread_mutex_unlock(&table_lock);
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
        int r = waitid(P_ALL, 0, &si, WEXITED | WNOWAIT | __WALL);
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
        if (r == 0 && si.si_pid > 0) {
            pthread_mutex_lock(&table_lock);
            record_exit(si.si_pid);
            pthread_mutex_unlock(&table_lock);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        /* No children (ECHILD): sleep until something is spawned. Children that
         * other code started without proc_spawn are picked up within a second. */
        pthread_mutex_lock(&table_lock);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 1;
        pthread_cleanup_push(unlock_cleanup, NULL);
        pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
        while (gen == spawn_gen) {
            if (pthread_cond_timedwait(&table_cond, &table_lock, &ts) == ETIMEDOUT)
                break;
        }
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
        pthread_cleanup_pop(1);
    }
    return NULL;
}

int proc_reaper_start(struct wr_err *err)
{
    pthread_once(&cond_once, cond_init);
    pthread_mutex_lock(&table_lock);
    if (reaper_running) {
        pthread_mutex_unlock(&table_lock);
        return 0;
    }
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
        int e = errno;
        pthread_mutex_unlock(&table_lock);
        return wr_err_sys(err, e, "prctl(PR_SET_CHILD_SUBREAPER)");
    }
    /* The reaper needs no signals; every other thread keeps its own mask. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&reaper_thread, NULL, reaper_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0) {
        pthread_mutex_unlock(&table_lock);
        return wr_err_sys(err, r, "starting the reaper thread");
    }
    reaper_running = true;
    pthread_mutex_unlock(&table_lock);
    return 0;
}

void proc_reaper_stop(void)
{
    pthread_mutex_lock(&table_lock);
    bool running = reaper_running;
    pthread_mutex_unlock(&table_lock);
    if (!running)
        return;
    pthread_cancel(reaper_thread);
    pthread_join(reaper_thread, NULL);
    pthread_mutex_lock(&table_lock);
    reaper_running = false;
    /* Waiters fall back to waitpid() themselves from now on. */
    pthread_cond_broadcast(&table_cond);
    pthread_mutex_unlock(&table_lock);
}

/* Returns fd, or a CLOEXEC duplicate >= 3 if fd is one of the standard fds (so that the
 * dup2 sequence in the child cannot clobber a source before it is used). */
static int lift_fd(int fd, int *owned)
{
    *owned = -1;
    if (fd < 0 || fd > 2)
        return fd;
    *owned = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    return *owned;
}

pid_t proc_spawn(char *const argv[], char *const env[], int fd_in, int fd_out, int fd_err,
                 struct wr_err *err)
{
    return proc_spawn_keep(argv, env, fd_in, fd_out, fd_err, NULL, 0, err);
}

pid_t proc_spawn_keep(char *const argv[], char *const env[], int fd_in, int fd_out, int fd_err,
                      const int *keep, int nkeep, struct wr_err *err)
{
    pthread_once(&cond_once, cond_init);
    if (!argv || !argv[0])
        return wr_err_set(err, EINVAL, "proc_spawn: empty argv");
    if (nkeep < 0 || nkeep > PROC_KEEP_MAX)
        return wr_err_set(err, EINVAL, "proc_spawn: too many descriptors to keep");

    int owned[3];
    int fds[3] = {lift_fd(fd_in, &owned[0]), lift_fd(fd_out, &owned[1]),
                  lift_fd(fd_err, &owned[2])};
    /* above every target (3 + i), so no dup2 below overwrites a source still to be moved */
    int lifted[PROC_KEEP_MAX];
    for (int i = 0; i < nkeep; i++)
        lifted[i] = fcntl(keep[i], F_DUPFD_CLOEXEC, 3 + PROC_KEEP_MAX);
    int ret = -1;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    for (int i = 0; i < nkeep; i++) {
        if (lifted[i] < 0) {
            wr_err_sys(err, errno, "proc_spawn %s: duplicating fd", argv[0]);
            goto out;
        }
        posix_spawn_file_actions_adddup2(&fa, lifted[i], 3 + i);
    }

    for (int i = 0; i < 3; i++) {
        if ((i == 0 ? fd_in : i == 1 ? fd_out : fd_err) >= 0 && fds[i] < 0) {
            wr_err_sys(err, errno, "proc_spawn %s: duplicating fd", argv[0]);
            goto out;
        }
        if (fds[i] < 0)
            posix_spawn_file_actions_addopen(&fa, i, "/dev/null", i == 0 ? O_RDONLY : O_WRONLY, 0);
        else
            posix_spawn_file_actions_adddup2(&fa, fds[i], i);
    }
    posix_spawn_file_actions_addclosefrom_np(&fa, 3 + nkeep);

    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

    /* Spawn and register under the lock: the reaper cannot record this pid's exit
     * before it is known to be ours, and any stale entry for a recycled pid goes. */
    pthread_mutex_lock(&table_lock);
    pid_t pid;
    int r = posix_spawnp(&pid, argv[0], &fa, &attr, argv, env ? env : environ);
    if (r == 0) {
        struct entry *e = table_find(pid);
        if (!e)
            e = table_add(pid);
        e->state = ENTRY_RUNNING;
        e->status = 0;
        spawn_gen++;
        pthread_cond_broadcast(&table_cond);
    }
    pthread_mutex_unlock(&table_lock);
    if (r != 0) {
        wr_err_sys(err, r, "cannot run %s", argv[0]);
        goto out;
    }
    ret = pid;
out:
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    for (int i = 0; i < 3; i++)
        if (owned[i] >= 0)
            close(owned[i]);
    for (int i = 0; i < nkeep; i++)
        if (lifted[i] >= 0)
            close(lifted[i]);
    return ret;
}

/* Without a reaper thread: waits for pid with waitpid(), polling a pidfd for the timeout.
 * Called and returns with table_lock held. Returns 1 if reaped, 0 on timeout, -1 on error. */
static int wait_direct(pid_t pid, int *status, uint64_t deadline, bool forever)
{
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG | __WALL);
        if (r == pid)
            return 1;
        if (r < 0 && errno != EINTR)
            return -1;
        if (r < 0)
            continue;
        uint64_t now = now_ms_monotonic();
        if (!forever && now >= deadline)
            return 0;
        /* Sleep without the lock: a reaper may be started meanwhile. */
        int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
        pthread_mutex_unlock(&table_lock);
        int slice = forever ? 1000 : (int)(deadline - now);
        if (slice > 1000)
            slice = 1000;
        if (pfd >= 0) {
            struct pollfd p = {.fd = pfd, .events = POLLIN};
            poll(&p, 1, slice);
            close(pfd);
        } else {
            struct timespec ts = {.tv_sec = 0, .tv_nsec = 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&table_lock);
        if (reaper_running)
            return 2;
    }
}

/* Waits for pid's status until deadline. Returns 1 with *status set, 0 on timeout (the
 * process is still unreaped), -1 if pid is not one we can wait for. Lock held throughout
 * (except inside waits). */
static int wait_locked(pid_t pid, int *status, uint64_t deadline, bool forever)
{
    for (;;) {
        struct entry *e = table_find(pid);
        if (e && e->state != ENTRY_RUNNING) {
            *status = e->status;
            table_remove(e);
            return 1;
        }
        if (!reaper_running) {
            int r = wait_direct(pid, status, deadline, forever);
            if (r == 2)
                continue;
            if (r == 1 && (e = table_find(pid)))
                table_remove(e);
            return r;
        }
        if (!e)
            return -1;
        if (forever) {
            pthread_cond_wait(&table_cond, &table_lock);
            continue;
        }
        uint64_t now = now_ms_monotonic();
        if (now >= deadline)
            return 0;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t left = deadline - now;
        ts.tv_sec += (time_t)(left / 1000);
        ts.tv_nsec += (long)(left % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&table_cond, &table_lock, &ts);
    }
}

int proc_wait(pid_t pid, int *status, int timeout_ms, struct wr_err *err)
{
    pthread_once(&cond_once, cond_init);
    int st = 0;
    bool forever = timeout_ms < 0;
    uint64_t deadline = now_ms_monotonic() + (uint64_t)(forever ? 0 : timeout_ms);

    pthread_mutex_lock(&table_lock);
    int r = wait_locked(pid, &st, deadline, forever);
    if (r == 0) {
        /* Still unreaped (the lock keeps the reaper from reaping it), so the pid is ours. */
        kill(pid, SIGKILL);
        r = wait_locked(pid, &st, 0, true);
        pthread_mutex_unlock(&table_lock);
        if (status)
            *status = st;
        return wr_err_set(err, ETIMEDOUT, "process %d timed out after %d ms and was killed",
                          (int)pid, timeout_ms);
    }
    pthread_mutex_unlock(&table_lock);
    if (r < 0)
        return wr_err_set(err, ECHILD, "process %d is not a child started by proc_spawn", (int)pid);
    if (status)
        *status = st;
    return 0;
}

/* Non-blocking check used while a child's output is still being read. Returns 1 if pid has
 * exited (status stored), else 0. */
static int proc_poll_exit(pid_t pid, int *status)
{
    pthread_mutex_lock(&table_lock);
    int r = wait_locked(pid, status, 0, false);
    pthread_mutex_unlock(&table_lock);
    return r == 1;
}

/* Formats a wait status for messages. */
static void describe_status(int status, char *out, size_t outlen)
{
    if (WIFEXITED(status))
        snprintf(out, outlen, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, outlen, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, outlen, "ended with wait status 0x%x", status);
}

/* Copies the last non-empty line of buf[0..len) into out. */
static void last_line(const char *buf, size_t len, char *out, size_t outlen)
{
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
        len--;
    size_t start = len;
    while (start > 0 && buf[start - 1] != '\n')
        start--;
    size_t n = len - start;
    if (n >= outlen)
        n = outlen - 1;
    memcpy(out, buf + start, n);
    out[n] = '\0';
}

int proc_run(char *const argv[], int timeout_ms, char *out, size_t outlen, struct wr_err *err)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0)
        return wr_err_sys(err, errno, "pipe");
    cleanup_close int rfd = pipefd[0];
    int wfd = pipefd[1];

    pid_t pid = proc_spawn(argv, NULL, -1, wfd, wfd, err);
    close(wfd);
    if (pid < 0)
        return -1;

    bool forever = timeout_ms < 0;
    uint64_t deadline = now_ms_monotonic() + (uint64_t)(forever ? 0 : timeout_ms);
    size_t cap = out && outlen > 0 ? outlen - 1 : 0;
    if (cap > CAPTURE_MAX)
        cap = CAPTURE_MAX;
    size_t got = 0;
    char tail[512];
    size_t tail_len = 0;
    int status = 0;
    bool exited = false, timed_out = false;

    /* Read until EOF. A grandchild that keeps the pipe open must not hang us: once the
     * child itself has exited, whatever is buffered is read and the rest is ignored. */
    for (;;) {
        int slice = 100;
        if (!forever) {
            uint64_t now = now_ms_monotonic();
            if (now >= deadline) {
                timed_out = true;
                break;
            }
            if (deadline - now < (uint64_t)slice)
                slice = (int)(deadline - now);
        }
        struct pollfd p = {.fd = rfd, .events = POLLIN};
        int pr = poll(&p, 1, exited ? 0 : slice);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0) {
            if (exited)
                break;
            exited = proc_poll_exit(pid, &status);
            continue;
        }
        char buf[4096];
        ssize_t n = read(rfd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t k = (size_t)n;
        if (got < cap) {
            size_t c = cap - got < k ? cap - got : k;
            memcpy(out + got, buf, c);
            got += c;
        }
        if (k >= sizeof(tail)) {
            memcpy(tail, buf + k - sizeof(tail), sizeof(tail));
            tail_len = sizeof(tail);
        } else {
            size_t keep = sizeof(tail) - k < tail_len ? sizeof(tail) - k : tail_len;
            memmove(tail, tail + tail_len - keep, keep);
            memcpy(tail + keep, buf, k);
            tail_len = keep + k;
        }
    }
    if (out && outlen > 0)
        out[got] = '\0';

    if (!exited) {
        int left = -1;
        if (!forever) {
            uint64_t now = now_ms_monotonic();
            left = timed_out || now >= deadline ? 0 : (int)(deadline - now);
        }
        struct wr_err werr;
        if (proc_wait(pid, &status, left, &werr) < 0) {
            if (werr.code == ETIMEDOUT)
                return wr_err_set(err, ETIMEDOUT, "%s timed out after %d ms", argv[0], timeout_ms);
            return wr_err_set(err, werr.code, "%s: %s", argv[0], werr.msg);
        }
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;

    char how[96], line[320];
    describe_status(status, how, sizeof(how));
    last_line(tail, tail_len, line, sizeof(line));
    int code = WIFEXITED(status) && WEXITSTATUS(status) == 127 ? ENOENT : EIO;
    if (line[0])
        return wr_err_set(err, code, "%s %s: %s", argv[0], how, line);
    return wr_err_set(err, code, "%s %s", argv[0], how);
}
