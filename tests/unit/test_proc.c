/*
 * Child processes (common/proc.h), first without the reaper (the CLI's case), then with it
 * (the daemon's): proc_run's exit status, captured output and its caps, an error that names
 * the command and quotes the output's last line, a missing command, a timeout that kills the
 * child, a grandchild holding the pipe open; proc_spawn's fds, environment and closed fds;
 * proc_wait's status, timeout and refusal of a stranger; the reaper collecting orphans and a
 * child that exits before anyone waits for it; proc_run after the reaper stops.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/proc.h"
#include "tap.h"

/* Clears err for the call it is passed to, so a message printed after it is that call's. */
static struct wr_err *clr(struct wr_err *e)
{
    wr_err_clear(e);
    return e;
}

static char tmpdir[] = "/tmp/wr-test-proc-XXXXXX";
static pid_t strays[8];
static int nstrays;

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Reads a pid a shell wrote to tmpdir/name, or -1; remembers it to kill at the end. */
static pid_t read_pid(const char *name)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "r");
    int pid = -1;
    if (f) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = -1;
        fclose(f);
    }
    unlink(p);
    if (pid > 0 && nstrays < 8)
        strays[nstrays++] = pid;
    return pid;
}

/* 1 if pid no longer exists (not even as a zombie), polling up to timeout_ms. */
static int gone_within(pid_t pid, int timeout_ms)
{
    char p[64];
    snprintf(p, sizeof(p), "/proc/%d", (int)pid);
    for (int t = 0; t <= timeout_ms; t += 10) {
        if (access(p, F_OK) < 0)
            return 1;
        sleep_ms(10);
    }
    return 0;
}

static void cleanup(void)
{
    for (int i = 0; i < nstrays; i++)
        kill(strays[i], SIGKILL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "# could not remove %s\n", tmpdir);
}

/* The proc_run checks that hold with or without the reaper. */
static void run_checks(const char *mode)
{
    char out[256];
    struct wr_err err = {0};

    char *t[] = {"true", NULL};
    ok(proc_run(t, 5000, out, sizeof(out), clr(&err)) == 0 && out[0] == '\0',
       "%s: `true` succeeds with no output", mode);

    char *both[] = {"sh", "-c", "echo hello; echo world >&2", NULL};
    ok(proc_run(both, 5000, out, sizeof(out), clr(&err)) == 0 && strcmp(out, "hello\nworld\n") == 0,
       "%s: stdout and stderr are captured together", mode);

    ok(proc_run(both, 5000, NULL, 0, clr(&err)) == 0, "%s: out may be NULL", mode);

    char *fail[] = {"sh", "-c", "echo first line; echo the-last-line >&2; exit 3", NULL};
    memset(&err, 0, sizeof(err));
    int r = proc_run(fail, 5000, out, sizeof(out), clr(&err));
    ok(r == -1 && strstr(out, "first line") != NULL, "%s: exit 3 fails, output still captured",
       mode);
    ok(strstr(err.msg, "sh") && strstr(err.msg, "the-last-line") && !strstr(err.msg, "first line"),
       "%s: the error names the command and quotes the last line only (%s)", mode, err.msg);

    char *sig[] = {"sh", "-c", "kill -9 $$", NULL};
    ok(proc_run(sig, 5000, out, sizeof(out), clr(&err)) == -1,
       "%s: a child killed by a signal fails", mode);

    char *missing[] = {"wr-no-such-command-here", NULL};
    memset(&err, 0, sizeof(err));
    r = proc_run(missing, 5000, out, sizeof(out), clr(&err));
    ok(r == -1 && err.code != 0 && strstr(err.msg, "wr-no-such-command-here"),
       "%s: a missing command fails with an error naming it (%s)", mode, err.msg);

    /* The timeout kills the child: it is gone when proc_run returns. */
    char pidcmd[300];
    snprintf(pidcmd, sizeof(pidcmd), "echo $$ > %s/sleeper; exec sleep 30", tmpdir);
    char *slow[] = {"sh", "-c", pidcmd, NULL};
    memset(&err, 0, sizeof(err));
    long t0 = now_ms();
    r = proc_run(slow, 300, out, sizeof(out), clr(&err));
    long took = now_ms() - t0;
    pid_t sleeper = read_pid("sleeper");
    ok(r == -1 && err.code == ETIMEDOUT, "%s: a sleeping child times out with ETIMEDOUT (%s)", mode,
       err.msg);
    ok(took >= 250 && took < 3000, "%s: the timeout is kept (%ld ms for 300)", mode, took);
    ok(sleeper > 0 && gone_within(sleeper, 0), "%s: the timed-out child was killed and reaped",
       mode);

    /* Output beyond the buffer: the child is not blocked on a full pipe, the rest is dropped. */
    char *loud[] = {"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a; echo end", NULL};
    char small[8];
    ok(proc_run(loud, 10000, small, sizeof(small), clr(&err)) == 0 && strcmp(small, "aaaaaaa") == 0,
       "%s: 300 KB into an 8-byte buffer: 7 bytes kept, NUL-terminated, command succeeds", mode);
    size_t biglen = 200 * 1024;
    char *big = malloc(biglen);
    memset(big, 'x', biglen);
    r = proc_run(loud, 10000, big, biglen, clr(&err));
    ok(r == 0 && strlen(big) == 64 * 1024,
       "%s: capture stops at 64 KiB with a larger buffer (got %zu)", mode, strlen(big));
    free(big);

    /* A grandchild that keeps the pipe open does not hold proc_run up. */
    snprintf(pidcmd, sizeof(pidcmd), "sleep 30 & echo $! > %s/grandchild; echo hi", tmpdir);
    char *gc[] = {"sh", "-c", pidcmd, NULL};
    t0 = now_ms();
    r = proc_run(gc, 10000, out, sizeof(out), clr(&err));
    took = now_ms() - t0;
    pid_t grandchild = read_pid("grandchild");
    ok(r == 0 && strcmp(out, "hi\n") == 0 && took < 3000,
       "%s: a grandchild holding the pipe does not hold proc_run (%ld ms)", mode, took);
    if (grandchild > 0)
        kill(grandchild, SIGKILL);
}

static void spawn_checks(const char *mode)
{
    struct wr_err err = {0};
    int status = -1;

    char *ex[] = {"sh", "-c", "exit 7", NULL};
    pid_t pid = proc_spawn(ex, NULL, -1, -1, -1, clr(&err));
    ok(pid > 0 && proc_wait(pid, &status, 5000, clr(&err)) == 0 && WIFEXITED(status) &&
           WEXITSTATUS(status) == 7,
       "%s: proc_wait returns the exit status (7)", mode);

    /* stdout to a pipe, a chosen environment, stdin from /dev/null, other fds closed */
    int p[2];
    if (pipe(p) < 0)
        p[0] = p[1] = -1;
    int stray = open("/dev/null", O_RDONLY); /* no CLOEXEC: the child must still not have it */
    char script[200];
    snprintf(script, sizeof(script),
             "echo \"$WR_TEST_VAR\"; if [ -e /proc/self/fd/%d ]; then echo open; else echo "
             "closed; fi; cat; echo eof",
             stray);
    char *sh[] = {"sh", "-c", script, NULL};
    char *env[] = {"WR_TEST_VAR=from-env", "PATH=/usr/bin:/bin", NULL};
    pid = proc_spawn(sh, env, -1, p[1], -1, clr(&err));
    close(p[1]);
    char buf[256];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof(buf) - 1 && (n = read(p[0], buf + got, sizeof(buf) - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = '\0';
    close(p[0]);
    close(stray);
    ok(pid > 0 && proc_wait(pid, &status, 5000, clr(&err)) == 0 && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "%s: spawned shell exits 0", mode);
    ok(strcmp(buf, "from-env\nclosed\neof\n") == 0,
       "%s: env is the given one, stdin is empty, other fds are closed", mode);

    /* Standard fds passed as the child's fds (proc_run's own case: stdout as stderr) */
    if (pipe(p) < 0)
        p[0] = p[1] = -1;
    char *sw[] = {"sh", "-c", "echo to-stderr >&2", NULL};
    pid = proc_spawn(sw, NULL, -1, -1, p[1], clr(&err));
    close(p[1]);
    got = 0;
    while (got < sizeof(buf) - 1 && (n = read(p[0], buf + got, sizeof(buf) - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = '\0';
    close(p[0]);
    ok(pid > 0 && proc_wait(pid, &status, 5000, clr(&err)) == 0 && strcmp(buf, "to-stderr\n") == 0,
       "%s: fd_err receives stderr", mode);

    /* Timeout: SIGKILL, then the status of the killed child. */
    char *sl[] = {"sleep", "30", NULL};
    pid = proc_spawn(sl, NULL, -1, -1, -1, clr(&err));
    long t0 = now_ms();
    memset(&err, 0, sizeof(err));
    int r = proc_wait(pid, &status, 200, clr(&err));
    long took = now_ms() - t0;
    ok(pid > 0 && r == -1 && err.code == ETIMEDOUT && WIFSIGNALED(status) &&
           WTERMSIG(status) == SIGKILL,
       "%s: proc_wait timeout kills with SIGKILL and reports ETIMEDOUT (%s)", mode, err.msg);
    ok(took < 3000 && gone_within(pid, 0), "%s: the killed child is reaped (%ld ms)", mode, took);

    /* A child that exits before anyone waits is not lost. */
    char *tr[] = {"true", NULL};
    pid = proc_spawn(tr, NULL, -1, -1, -1, clr(&err));
    sleep_ms(200);
    status = -1;
    ok(pid > 0 && proc_wait(pid, &status, 1000, clr(&err)) == 0 && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "%s: a child that exited before proc_wait is still waited for", mode);

    /* Not ours: refused, and nothing is killed. */
    memset(&err, 0, sizeof(err));
    ok(proc_wait(getppid(), &status, 100, clr(&err)) == -1 && kill(getppid(), 0) == 0,
       "%s: proc_wait refuses a pid it did not start, without killing it (%s)", mode, err.msg);

    char *empty[] = {NULL};
    ok(proc_spawn(empty, NULL, -1, -1, -1, clr(&err)) == -1, "%s: empty argv is refused", mode);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp");
        return tap_done();
    }
    signal(SIGPIPE, SIG_IGN);

    run_checks("no reaper");
    spawn_checks("no reaper");

    struct wr_err err = {0};
    ok(proc_reaper_start(&err) == 0, "proc_reaper_start");
    ok(proc_reaper_start(&err) == 0, "a second proc_reaper_start is harmless");
    run_checks("reaper");
    spawn_checks("reaper");

    /* An orphan re-parented to us (a subreaper) is reaped: no zombie stays behind. */
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "sleep 0.5 & echo $! > %s/orphan", tmpdir);
    char *orph[] = {"sh", "-c", cmd, NULL};
    char out[64];
    int r = proc_run(orph, 5000, out, sizeof(out), clr(&err));
    pid_t orphan = read_pid("orphan");
    ok(r == 0 && orphan > 0, "a shell leaves an orphan behind");
    char statp[64], line[256] = "";
    snprintf(statp, sizeof(statp), "/proc/%d/status", (int)orphan);
    FILE *f = fopen(statp, "r");
    int ours = 0;
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "PPid:", 5) == 0)
            ours = atoi(line + 5) == getpid();
    if (f)
        fclose(f);
    ok(ours, "the orphan is re-parented to us (the subreaper)");
    ok(orphan > 0 && gone_within(orphan, 3000), "the reaper collects the orphan once it exits");

    proc_reaper_stop();
    proc_reaper_stop();
    ok(1, "proc_reaper_stop twice returns");
    char *both[] = {"sh", "-c", "echo after; exit 0", NULL};
    ok(proc_run(both, 5000, out, sizeof(out), clr(&err)) == 0 && strcmp(out, "after\n") == 0,
       "proc_run works after the reaper stopped");
    char *sl[] = {"sleep", "30", NULL};
    pid_t pid = proc_spawn(sl, NULL, -1, -1, -1, clr(&err));
    int status = 0;
    ok(pid > 0 && proc_wait(pid, &status, 100, clr(&err)) == -1 && err.code == ETIMEDOUT &&
           gone_within(pid, 0),
       "proc_wait's timeout kills and reaps after the reaper stopped");

    cleanup();
    return tap_done();
}
