/*
 * Host cgroups (driver/cgroup.h) on a real cgroup v1 host, for a sandbox id of the test's
 * own: the limits written are the ones asked for, also when an existing cgroup is reused
 * with a larger memory limit; usage counts a process put in the cgroups; cgroup_kill empties
 * them and keeps them; cgroup_destroy kills what is left and removes the sandbox's cgroup in
 * every hierarchy, runsc's too, and leaves no directory of the id in /sys/fs/cgroup/x; the
 * freezer freezes and thaws, and cgroup_kill kills a frozen process.
 * Needs root and cgroup v1: elsewhere it prints SKIP lines.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver/cgroup.h"
#include "tap.h"

/* Clears err for the call it is passed to, so a message printed after it is that call's. */
static struct wr_err *clr(struct wr_err *e)
{
    wr_err_clear(e);
    return e;
}

#define ROOT "/sys/fs/cgroup"

static char id[32];
static pid_t children[4];
static int nchildren;
static char extra_dir[256];    /* a cgroup made as runsc would, in a hierarchy we do not own */
static char extra_parent[256]; /* its parent, if this test made it */

static int read_file(const char *ctrl, const char *file, char *buf, size_t len)
{
    char p[512];
    snprintf(p, sizeof(p), ROOT "/%s/" CGROUP_PARENT "/%s/%s", ctrl, id, file);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

static long long read_num(const char *ctrl, const char *file)
{
    char buf[64];
    if (read_file(ctrl, file, buf, sizeof(buf)) < 0)
        return -1;
    return strtoll(buf, NULL, 10);
}

static int in_file(const char *ctrl, const char *file, pid_t pid)
{
    char p[512];
    snprintf(p, sizeof(p), ROOT "/%s/" CGROUP_PARENT "/%s/%s", ctrl, id, file);
    FILE *f = fopen(p, "w");
    if (!f)
        return -1;
    int r = fprintf(f, "%d", (int)pid) > 0 ? 0 : -1;
    if (fclose(f) != 0)
        r = -1;
    return r;
}

/* Counts directories named id under /sys/fs/cgroup/x/withruntime in every hierarchy. */
static int leftovers(char *first, size_t firstlen)
{
    DIR *d = opendir(ROOT);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof(p), ROOT "/%s/" CGROUP_PARENT "/%s", de->d_name, id);
        if (access(p, F_OK) == 0) {
            if (n++ == 0)
                snprintf(first, firstlen, "%s", p);
        }
    }
    if (d)
        closedir(d);
    return n;
}

/*
 * Forks a child that waits for a byte on a pipe, then burns ~50 ms of CPU, touches 8 MiB
 * and sleeps. The caller moves it into the cgroups, then writes the byte.
 */
/* The write end of a pipe the last child started writes a byte to once it has spent its CPU
 * and touched its memory; its read end is child_done (wait_child_done). */
static int child_done = -1;

/* Waits (at most 10 s) for the child's word that its CPU and memory are spent. */
static int wait_child_done(void)
{
    struct pollfd pf = {.fd = child_done, .events = POLLIN};
    char c;
    int r = child_done >= 0 && poll(&pf, 1, 10000) == 1 && read(child_done, &c, 1) == 1 ? 0 : -1;
    if (child_done >= 0)
        close(child_done);
    child_done = -1;
    return r;
}

static pid_t start_child(int *go)
{
    int p[2], d[2];
    if (pipe(p) < 0)
        return -1;
    if (pipe(d) < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(p[1]);
        close(d[0]);
        char c;
        if (read(p[0], &c, 1) != 1)
            _exit(1);
        volatile uint64_t x = 0;
        struct timespec t;
        do {
            for (int i = 0; i < 100000; i++)
                x += (uint64_t)i;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
        } while (t.tv_nsec < 50000000L && t.tv_sec == 0);
        size_t len = 8u << 20;
        char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED)
            memset(m, 1, len);
        (void)!write(d[1], "d", 1);
        for (;;)
            pause();
    }
    close(p[0]);
    close(d[1]);
    if (pid < 0) {
        close(p[1]);
        close(d[0]);
        return -1;
    }
    if (child_done >= 0)
        close(child_done);
    child_done = d[0];
    children[nchildren++] = pid;
    *go = p[1];
    return pid;
}

static int join_cgroups(pid_t pid)
{
    static const char *const ctrls[] = {"cpu", "cpuacct", "memory", "pids"};
    for (size_t i = 0; i < sizeof(ctrls) / sizeof(ctrls[0]); i++)
        if (in_file(ctrls[i], "cgroup.procs", pid) < 0)
            return -1;
    return 0;
}

/* Waits (up to 2 s) for pid to be killed by SIGKILL. Returns 1 if it was. */
static int killed(pid_t pid)
{
    for (int i = 0; i < 200; i++) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            for (int j = 0; j < nchildren; j++)
                if (children[j] == pid)
                    children[j] = 0;
            return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        }
        if (r < 0)
            return 0;
        usleep(10000);
    }
    return 0;
}

static void cleanup(void)
{
    for (int i = 0; i < nchildren; i++)
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
        }
    struct wr_err err = {0};
    cgroup_destroy(id, 2000, clr(&err));
    if (extra_dir[0])
        rmdir(extra_dir);
    if (extra_parent[0])
        rmdir(extra_parent);
}

int main(void)
{
    snprintf(id, sizeof(id), "sb-unittest%013d", (int)getpid());
    struct wr_err err = {0};
    char detail[256];
    if (geteuid() != 0) {
        printf("ok 1 # SKIP not root: cgroups cannot be created\n1..1\n");
        return 0;
    }
    if (cgroup_check(detail, sizeof(detail), clr(&err)) < 0) {
        printf("ok 1 # SKIP no cgroup v1: %s\n1..1\n", err.msg);
        return 0;
    }
    ok(strlen(id) == 24, "test id %s has the driver's length", id);
    ok(detail[0] != '\0', "cgroup_check: %s", detail);
    atexit(cleanup);

    char path[128];
    cgroup_runsc_path(id, path, sizeof(path));
    char want[128];
    snprintf(want, sizeof(want), "/" CGROUP_PARENT "/%s", id);
    ok(strcmp(path, want) == 0, "runsc path is %s", path);

    struct cgroup_usage u;
    memset(&u, 0xff, sizeof(u));
    ok(!cgroup_exists(id), "no cgroup before create");
    ok(cgroup_usage(id, &u, clr(&err)) == 0 && u.cpu_usec == 0 && u.memory_bytes == 0 &&
           u.pids == 0 && u.oom_kills == 0,
       "usage of an absent sandbox: 0, zeroed");
    ok(cgroup_destroy(id, 1000, clr(&err)) == 0, "destroying absent cgroups is fine");

    struct cgroup_limits lim = {.cpus = 2, .memory_bytes = 64ull << 20, .pids_max = 50};
    ok(cgroup_create(id, &lim, clr(&err)) == 0, "cgroup_create (%s)", err.msg);
    ok(cgroup_exists(id), "cgroup_exists after create");
    ok(read_num("cpu", "cpu.cfs_period_us") > 0 &&
           read_num("cpu", "cpu.cfs_quota_us") == 2 * read_num("cpu", "cpu.cfs_period_us"),
       "CPU quota is 2 periods (%lld / %lld)", read_num("cpu", "cpu.cfs_quota_us"),
       read_num("cpu", "cpu.cfs_period_us"));
    ok(read_num("memory", "memory.limit_in_bytes") == 64ll << 20, "memory limit is 64 MiB");
    long long memsw = read_num("memory", "memory.memsw.limit_in_bytes");
    ok(memsw == -1 || memsw == 64ll << 20, "memory+swap limit is 64 MiB too (or absent: %lld)",
       memsw);
    ok(read_num("pids", "pids.max") == 50, "pids.max is 50");
    ok(cgroup_usage(id, &u, clr(&err)) == 1 && u.pids == 0, "usage of an empty cgroup: 1, no pids");

    /* Reused with different limits, the larger memory limit above the old memsw included. */
    struct cgroup_limits lim2 = {.cpus = 1, .memory_bytes = 128ull << 20, .pids_max = 100};
    ok(cgroup_create(id, &lim2, clr(&err)) == 0,
       "cgroup_create again with a larger memory limit (%s)", err.msg);
    ok(read_num("memory", "memory.limit_in_bytes") == 128ll << 20 &&
           read_num("pids", "pids.max") == 100 &&
           read_num("cpu", "cpu.cfs_quota_us") == read_num("cpu", "cpu.cfs_period_us"),
       "the new limits replaced the old ones");
    memsw = read_num("memory", "memory.memsw.limit_in_bytes");
    ok(memsw == -1 || memsw == 128ll << 20, "memory+swap follows (%lld)", memsw);
    struct cgroup_limits lim3 = {.cpus = 1, .memory_bytes = 32ull << 20, .pids_max = 100};
    ok(cgroup_create(id, &lim3, clr(&err)) == 0 &&
           read_num("memory", "memory.limit_in_bytes") == 32ll << 20,
       "and again with a smaller one (%s)", err.msg);

    /* A process in the cgroups is counted, then killed by cgroup_kill; the cgroups stay. */
    int go = -1;
    pid_t child = start_child(&go);
    ok(child > 0 && join_cgroups(child) == 0, "a child joins the sandbox's cgroups");
    if (go >= 0) {
        (void)!write(go, "x", 1);
        close(go);
    }
    ok(wait_child_done() == 0, "the child spent its CPU and touched its memory");
    ok(cgroup_usage(id, &u, clr(&err)) == 1, "usage reads the counters");
    ok(u.pids == 1, "usage counts 1 process (%llu)", (unsigned long long)u.pids);
    ok(u.cpu_usec >= 10000, "usage counts its CPU time (%llu us)", (unsigned long long)u.cpu_usec);
    ok(u.memory_bytes >= 4u << 20, "usage counts its memory (%llu bytes)",
       (unsigned long long)u.memory_bytes);
    ok(u.oom_kills == 0, "no OOM kills");
    ok(cgroup_kill(id, 2000, clr(&err)) == 0, "cgroup_kill (%s)", err.msg);
    ok(child > 0 && killed(child), "cgroup_kill killed the child with SIGKILL");
    ok(cgroup_exists(id) && cgroup_usage(id, &u, clr(&err)) == 1 && u.pids == 0,
       "after cgroup_kill the cgroups stay, empty");
    ok(cgroup_kill(id, 100, clr(&err)) == 0, "cgroup_kill on empty cgroups returns 0");

    /* The freezer: a frozen process is stopped by the kernel, thawed it runs again, and
     * cgroup_kill kills it even while frozen (a frozen task would not die of SIGKILL). */
    if (access(ROOT "/freezer", F_OK) == 0) {
        char st[32] = "";
        pid_t ice = start_child(&go);
        ok(ice > 0 && join_cgroups(ice) == 0 && in_file("freezer", "cgroup.procs", ice) == 0,
           "a child joins the freezer cgroup cgroup_create made");
        if (go >= 0) {
            (void)!write(go, "x", 1);
            close(go);
        }
        ok(cgroup_freeze(id, 1, 2000, clr(&err)) == 0 &&
               read_file("freezer", "freezer.state", st, sizeof(st)) == 0 &&
               strncmp(st, "FROZEN", 6) == 0,
           "cgroup_freeze: FROZEN (%s)", err.msg);
        ok(cgroup_freeze(id, 0, 2000, clr(&err)) == 0 &&
               read_file("freezer", "freezer.state", st, sizeof(st)) == 0 &&
               strncmp(st, "THAWED", 6) == 0,
           "cgroup_freeze 0: THAWED (%s)", err.msg);
        ok(cgroup_freeze(id, 1, 2000, clr(&err)) == 0, "frozen again (%s)", err.msg);
        ok(cgroup_kill(id, 2000, clr(&err)) == 0 && ice > 0 && killed(ice),
           "cgroup_kill kills a frozen process (%s)", err.msg);
        ok(read_file("freezer", "freezer.state", st, sizeof(st)) == 0 &&
               strncmp(st, "THAWED", 6) == 0,
           "and leaves the cgroup thawed");
        ok(cgroup_create(id, &lim3, clr(&err)) == 0, "cgroup_create on it again (%s)", err.msg);
    }

    /* A cgroup runsc would have made in another hierarchy, and a process still running:
     * cgroup_destroy kills it and removes every directory of the sandbox. */
    const char *other = access(ROOT "/devices", F_OK) == 0 ? "devices" : "blkio";
    char parent[256];
    snprintf(parent, sizeof(parent), ROOT "/%s/" CGROUP_PARENT, other);
    if (mkdir(parent, 0755) == 0)
        snprintf(extra_parent, sizeof(extra_parent), "%s", parent);
    snprintf(extra_dir, sizeof(extra_dir), "%s/%s", parent, id);
    ok(mkdir(extra_dir, 0755) == 0, "a %s cgroup as runsc makes it", other);
    pid_t sleeper = start_child(&go);
    ok(sleeper > 0 && join_cgroups(sleeper) == 0 && in_file(other, "cgroup.procs", sleeper) == 0,
       "a sleeping child joins, the %s cgroup too", other);
    if (go >= 0) {
        (void)!write(go, "x", 1);
        close(go);
    }
    ok(cgroup_destroy(id, 2000, clr(&err)) == 0, "cgroup_destroy with a live process (%s)",
       err.msg);
    ok(sleeper > 0 && killed(sleeper), "cgroup_destroy killed the sleeping child");
    char first[512] = "";
    ok(!cgroup_exists(id), "cgroup_exists is 0 after destroy");
    ok(leftovers(first, sizeof(first)) == 0,
       "no %s directory left in " ROOT "/x/" CGROUP_PARENT " %s", id, first);
    if (access(extra_dir, F_OK) < 0)
        extra_dir[0] = '\0';
    ok(cgroup_usage(id, &u, clr(&err)) == 0, "usage after destroy: 0");
    ok(cgroup_destroy(id, 100, clr(&err)) == 0, "destroy again: 0");

    return tap_done();
}
