/*
 * Sandbox cgroups on a cgroup v1 host; see cgroup.h for why the driver owns
 * them rather than letting runsc create them.
 *
 * Paths follow runsc's own convention (/sys/fs/cgroup/<controller>/<path>),
 * so the directory we create is the one runsc joins.
 */
#include "driver/cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define CGROUP_ROOT "/sys/fs/cgroup"
#define CGROUP_V1_MAGIC 0x27e0eb
#define CFS_PERIOD_US 100000

/* The hierarchies whose cgroups we create, write and read. */
static const char *const owned[] = {"cpu", "cpuacct", "memory", "pids"};

/* The freezer is ours too when the host mounts it (cgroup_freeze); without it sandboxes run,
 * they are just never frozen. */
#define FREEZER "freezer"
#define FREEZE_POLL_MS 2

static void cg_dir(const char *ctrl, const char *id, char *out, size_t outlen)
{
    if (id)
        snprintf(out, outlen, CGROUP_ROOT "/%s/" CGROUP_PARENT "/%s", ctrl, id);
    else
        snprintf(out, outlen, CGROUP_ROOT "/%s/" CGROUP_PARENT, ctrl);
}

/* Whether the v1 freezer hierarchy is mounted (looked up once; the mounts do not change). */
static int freezer_mounted(void)
{
    static int known = -1;
    if (known < 0) {
        struct statfs sfs;
        known = statfs(CGROUP_ROOT "/" FREEZER, &sfs) == 0 && sfs.f_type == CGROUP_V1_MAGIC;
    }
    return known;
}

int cgroup_check(char *detail, size_t detail_len, struct wr_err *err)
{
    for (size_t i = 0; i < WR_ARRAY_LEN(owned); i++) {
        char p[256];
        snprintf(p, sizeof(p), CGROUP_ROOT "/%s", owned[i]);
        struct statfs sfs;
        if (statfs(p, &sfs) < 0 || sfs.f_type != CGROUP_V1_MAGIC)
            return wr_err_set(err, ENOTSUP,
                              "cgroup v1 controller %s is not mounted at %s (this driver "
                              "needs the cgroup v1 cpu, cpuacct, memory and pids hierarchies)",
                              owned[i], p);
    }
    if (detail && detail_len)
        snprintf(detail, detail_len, "cgroup v1 cpu, cpuacct, memory, pids%s under " CGROUP_ROOT,
                 freezer_mounted() ? ", freezer" : "");
    return 0;
}

void cgroup_runsc_path(const char *id, char *out, size_t outlen)
{
    snprintf(out, outlen, "/" CGROUP_PARENT "/%s", id);
}

/* Writes a decimal value to dir/file. Returns 0 or -errno. */
static int write_u64(const char *dir, const char *file, uint64_t v)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, file);
    cleanup_close int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    if (write(fd, buf, (size_t)n) != n)
        return -errno;
    return 0;
}

/* Writes a string to dir/file. Returns 0 or -errno. */
static int write_str(const char *dir, const char *file, const char *v)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, file);
    cleanup_close int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t n = strlen(v);
    if (write(fd, v, n) != (ssize_t)n)
        return -errno;
    return 0;
}

static int write_i64(const char *dir, const char *file, int64_t v)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, file);
    cleanup_close int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "%lld", (long long)v);
    if (write(fd, buf, (size_t)n) != n)
        return -errno;
    return 0;
}

/* Reads a decimal value from dir/file. Returns 0 or -errno. */
static int read_u64(const char *dir, const char *file, uint64_t *v)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, file);
    cleanup_close int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char buf[64];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    char *end;
    errno = 0;
    unsigned long long x = strtoull(buf, &end, 10);
    if (errno || end == buf)
        return -EINVAL;
    *v = x;
    return 0;
}

static int mkdir_ok(const char *p)
{
    if (mkdir(p, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

int cgroup_create(const char *id, const struct cgroup_limits *lim, struct wr_err *err)
{
    char dir[256];
    int r;
    for (size_t i = 0; i < WR_ARRAY_LEN(owned); i++) {
        cg_dir(owned[i], NULL, dir, sizeof(dir));
        if ((r = mkdir_ok(dir)) < 0)
            return wr_err_sys(err, -r, "creating cgroup %s", dir);
        cg_dir(owned[i], id, dir, sizeof(dir));
        if ((r = mkdir_ok(dir)) < 0)
            return wr_err_sys(err, -r, "creating cgroup %s", dir);
    }

    if (freezer_mounted()) {
        cg_dir(FREEZER, NULL, dir, sizeof(dir));
        if ((r = mkdir_ok(dir)) < 0)
            return wr_err_sys(err, -r, "creating cgroup %s", dir);
        cg_dir(FREEZER, id, dir, sizeof(dir));
        if ((r = mkdir_ok(dir)) < 0)
            return wr_err_sys(err, -r, "creating cgroup %s", dir);
        /* A cgroup reused from a run that ended frozen must not freeze the new one. */
        if ((r = write_str(dir, "freezer.state", "THAWED")) < 0)
            return wr_err_sys(err, -r, "thawing cgroup %s", dir);
    }

    cg_dir("cpu", id, dir, sizeof(dir));
    if ((r = write_u64(dir, "cpu.cfs_period_us", CFS_PERIOD_US)) < 0 ||
        (r = write_i64(dir, "cpu.cfs_quota_us", (int64_t)lim->cpus * CFS_PERIOD_US)) < 0)
        return wr_err_sys(err, -r, "setting the CPU limit in %s", dir);

    cg_dir("memory", id, dir, sizeof(dir));
    /* memsw must stay >= the memory limit: on a reused cgroup, raise it first. */
    char memsw[512];
    snprintf(memsw, sizeof(memsw), "%s/memory.memsw.limit_in_bytes", dir);
    bool have_memsw = access(memsw, F_OK) == 0;
    r = write_u64(dir, "memory.limit_in_bytes", lim->memory_bytes);
    if (r == -EINVAL && have_memsw) {
        write_i64(dir, "memory.memsw.limit_in_bytes", -1);
        r = write_u64(dir, "memory.limit_in_bytes", lim->memory_bytes);
    }
    if (r < 0)
        return wr_err_sys(err, -r, "setting the memory limit in %s", dir);
    if (have_memsw && (r = write_u64(dir, "memory.memsw.limit_in_bytes", lim->memory_bytes)) < 0)
        return wr_err_sys(err, -r, "setting the memory+swap limit in %s", dir);

    cg_dir("pids", id, dir, sizeof(dir));
    if ((r = write_u64(dir, "pids.max", (uint64_t)lim->pids_max)) < 0)
        return wr_err_sys(err, -r, "setting the process limit in %s", dir);
    return 0;
}

/* The oom_kill count from memory.oom_control (0 if unreadable: older kernels lack it). */
static uint64_t read_oom_kills(const char *dir)
{
    char p[320], buf[512];
    snprintf(p, sizeof(p), "%s/memory.oom_control", dir);
    cleanup_close int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read_full(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *k = strstr(buf, "oom_kill ");
    return k ? strtoull(k + 9, NULL, 10) : 0;
}

int cgroup_usage(const char *id, struct cgroup_usage *usage, struct wr_err *err)
{
    memset(usage, 0, sizeof(*usage));
    char dir[256];
    uint64_t ns = 0;
    cg_dir("cpuacct", id, dir, sizeof(dir));
    int r = read_u64(dir, "cpuacct.usage", &ns);
    if (r == -ENOENT)
        return 0;
    if (r < 0)
        return wr_err_sys(err, -r, "reading %s/cpuacct.usage", dir);
    usage->cpu_usec = ns / 1000;
    cg_dir("memory", id, dir, sizeof(dir));
    if ((r = read_u64(dir, "memory.usage_in_bytes", &usage->memory_bytes)) < 0 && r != -ENOENT)
        return wr_err_sys(err, -r, "reading %s/memory.usage_in_bytes", dir);
    usage->oom_kills = read_oom_kills(dir);
    cg_dir("pids", id, dir, sizeof(dir));
    if ((r = read_u64(dir, "pids.current", &usage->pids)) < 0 && r != -ENOENT)
        return wr_err_sys(err, -r, "reading %s/pids.current", dir);
    return 1;
}

/* Kills one process listed in a sandbox cgroup. The pidfd pins the process, and the
 * membership check on it makes sure a recycled pid is never signalled. */
static void kill_member(pid_t pid, const char *id)
{
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0)
        return;
    char p[64], buf[2048];
    snprintf(p, sizeof(p), "/proc/%d/cgroup", (int)pid);
    cleanup_close int fd = open(p, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read_full(fd, buf, sizeof(buf) - 1) : -1;
    if (n > 0) {
        buf[n] = '\0';
        char want[128];
        snprintf(want, sizeof(want), ":/" CGROUP_PARENT "/%s\n", id);
        if (strstr(buf, want))
            syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
    }
    close(pfd);
}

/* Signals every process in dir/cgroup.procs. Returns how many were listed. */
static int kill_procs(const char *dir, const char *id)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/cgroup.procs", dir);
    FILE *f = fopen(p, "re");
    if (!f)
        return 0;
    int n = 0, pid;
    while (fscanf(f, "%d", &pid) == 1) {
        kill_member(pid, id);
        n++;
    }
    fclose(f);
    return n;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Thaws the sandbox's freezer cgroup if there is one: a frozen task does not die of SIGKILL
 * until it is thawed. Quiet: an absent cgroup needs no thaw. */
static void thaw_quietly(const char *id)
{
    if (!freezer_mounted())
        return;
    char dir[256];
    cg_dir(FREEZER, id, dir, sizeof(dir));
    write_str(dir, "freezer.state", "THAWED");
}

int cgroup_freeze(const char *id, int frozen, int timeout_ms, struct wr_err *err)
{
    if (!freezer_mounted())
        return wr_err_set(err, ENOTSUP,
                          "the cgroup v1 freezer is not mounted at " CGROUP_ROOT "/" FREEZER);
    char dir[256];
    cg_dir(FREEZER, id, dir, sizeof(dir));
    const char *want = frozen ? "FROZEN" : "THAWED";
    int r = write_str(dir, "freezer.state", want);
    if (r < 0)
        return wr_err_sys(err, -r, "writing %s to %s/freezer.state", want, dir);
    if (!frozen)
        return 0; /* a thaw takes effect at once: the tasks run again as they are woken */
    /* FREEZING until every task has stopped: a task in an uninterruptible wait stops only
     * when the wait ends. One that does not in time is thawed again, so a sandbox is never
     * left half frozen. */
    uint64_t deadline = now_ms_monotonic() + (uint64_t)timeout_ms;
    for (;;) {
        char p[320], buf[32];
        snprintf(p, sizeof(p), "%s/freezer.state", dir);
        cleanup_close int fd = open(p, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
        if (n < 0) {
            int e = errno;
            thaw_quietly(id);
            return wr_err_sys(err, e, "reading %s", p);
        }
        buf[n] = '\0';
        if (strncmp(buf, "FROZEN", 6) == 0)
            return 0;
        if (now_ms_monotonic() >= deadline) {
            thaw_quietly(id);
            return wr_err_set(err, EBUSY, "%s was still freezing after %d ms; thawed again", dir,
                              timeout_ms);
        }
        sleep_ms(FREEZE_POLL_MS);
    }
}

int cgroup_kill(const char *id, int timeout_ms, struct wr_err *err)
{
    uint64_t deadline = now_ms_monotonic() + (uint64_t)timeout_ms;
    char dir[256];
    cg_dir("pids", id, dir, sizeof(dir));
    for (;;) {
        thaw_quietly(id);
        int n = kill_procs(dir, id);
        if (n == 0)
            return 0;
        if (now_ms_monotonic() >= deadline)
            return wr_err_set(err, EBUSY, "%d processes are still in %s", n, dir);
        sleep_ms(5);
    }
}

int cgroup_destroy(const char *id, int timeout_ms, struct wr_err *err)
{
    uint64_t deadline = now_ms_monotonic() + (uint64_t)timeout_ms;
    thaw_quietly(id);
    DIR *d = opendir(CGROUP_ROOT);
    if (!d)
        return errno == ENOENT ? 0 : wr_err_sys(err, errno, "opening " CGROUP_ROOT);
    int ret = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char dir[512];
        snprintf(dir, sizeof(dir), CGROUP_ROOT "/%s/" CGROUP_PARENT "/%s", de->d_name, id);
        struct stat st;
        if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
            continue;
        for (;;) {
            thaw_quietly(id);
            kill_procs(dir, id);
            if (rmdir(dir) == 0 || errno == ENOENT)
                break;
            if (errno != EBUSY || now_ms_monotonic() >= deadline) {
                ret = wr_err_sys(err, errno, "removing cgroup %s", dir);
                break;
            }
            sleep_ms(10);
        }
        if (ret < 0)
            break;
    }
    closedir(d);
    return ret;
}

int cgroup_exists(const char *id)
{
    DIR *d = opendir(CGROUP_ROOT);
    if (!d)
        return 0;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char dir[512];
        snprintf(dir, sizeof(dir), CGROUP_ROOT "/%s/" CGROUP_PARENT "/%s", de->d_name, id);
        found = access(dir, F_OK) == 0;
    }
    closedir(d);
    return found;
}
