/*
 * Admission control (admission.h). A sandbox's memory_mib and disk_mib are limits it may grow
 * to (its cgroup, its disk image's size), not what it holds: an idle default-shape sandbox
 * (2 vCPU, 4096 MiB, 10 GiB) was measured at ~17.5 MiB of host memory and ~576 KiB of disk.
 * Counting limits as if they were in use refused the ninth such create on a 24 GiB host, and
 * the sixteenth after fifteen stopped ones. So admission follows what the host has and what
 * sandboxes use, plus reserves:
 *
 *   memory  the host's MemAvailable, less 1/16 of its memory kept for itself, must hold a
 *           reserve for the new sandbox and, for each active sandbox, what it has not yet
 *           been measured to use of its own reserve (a sandbox just started has no reading);
 *           no create while tasks stall on memory (/proc/pressure/memory, where present);
 *   disk    the state directory's free space, less --disk-reserve-mib, must hold a reserve
 *           for each running sandbox and the new one to write. Stopped sandboxes count what
 *           their files hold, which that free space already leaves out, not their disk_mib.
 *
 * And the limits may overcommit the host only so far: running sandboxes' memory_mib in total up
 * to host memory x --memory-overcommit, their disk_mib up to that free space x
 * --disk-overcommit. The defaults (32 and 16) let the seed's 100 default-shape sandboxes run at
 * once on a host with 12.5 GiB of memory and 64 GiB of free disk (plus the reserve): the bound
 * is reached only when sandboxes use on average more than 1/32 of their memory (128 MiB of
 * 4 GiB, seven times an idle one) or write 1/16 of their disk, and before that the use checks
 * above refuse what does not fit.
 *
 * Every number is counted afresh from the daemon's list of sandboxes, so nothing can drift;
 * the host's memory, pressure, free disk and bound loop devices are read when asked (two small
 * /proc files, one statvfs, one pass over /sys/block: cheap enough for the loop thread, though
 * the pass is ~1 ms on a host with 200 loop devices, so a pool claim skips it: admission.h).
 */
#include "daemon/admission.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/sandbox.h"
#include "driver/disk.h"

/* Host memory each active sandbox is counted at until it is measured above it (or its
 * memory_mib, if less): an idle one takes 14-17.5 MiB, the rest is room for a first command.
 * 32, not more: with 64 a 24 GiB host stopped at ~340 idle sandboxes (issue 24 asks for 500 of
 * 512 MiB); what grows past its reserve is in MemAvailable, read at each create. */
#define MEMORY_RESERVE_MIB 32
/* No create while all tasks stalled on memory for this share of the last 10 s (PSI "full"):
 * the host is reclaiming hard, and one more sandbox would push it to the OOM killer. */
#define PRESSURE_FULL_MAX 10.0
/* Disk each running sandbox (and the new one) is given room to write, or its disk_mib if less:
 * an idle one holds ~576 KiB; a pip install of a few packages fits. */
#define DISK_RESERVE_MIB 128

/* Starting: it may be about to bind a loop device that sysfs does not show yet. */
static int is_starting(const struct sandbox *s)
{
    return s->state == SB_CREATING || s->state == SB_STARTING ||
           (s->state == SB_FAILED && s->deferred == SB_DEFER_START);
}

/* Running, or about to, or not yet done stopping: it holds (or will hold) its memory. */
static int is_active(const struct sandbox *s)
{
    return is_starting(s) || s->state == SB_RUNNING || s->state == SB_STOPPING;
}

static long long min_ll(long long a, long long b)
{
    return a < b ? a : b;
}

/* What the daemon's sandboxes hold and may take, counted for one admission. */
struct tally {
    int kept, active, stopped;
    long long memory_limits; /* active sandboxes' memory_mib */
    long long memory_owed;   /* of their memory reserves, what is not yet measured in use */
    long long disk_limits;   /* active sandboxes' disk_mib */
    long long disk_owed;     /* active sandboxes' disk reserves */
};

static void tally_sandboxes(struct daemon *d, const struct sandbox *sb, struct tally *t)
{
    memset(t, 0, sizeof(*t));
    for (const struct sandbox *s = d->sandboxes; s; s = s->next) {
        /* A user's sandbox is not refused for the pool's warm entries (a claim or a refill
         * waits for room instead); a refill counts everything. */
        if (s == sb || (s->pooled && !sb->pooled))
            continue;
        t->kept++;
        if (!is_active(s)) {
            t->stopped++;
            continue;
        }
        t->active++;
        t->memory_limits += s->memory_mib;
        long long used = s->state == SB_RUNNING ? s->memory_used_mib : 0;
        long long reserve = min_ll(s->memory_mib, MEMORY_RESERVE_MIB);
        if (used < reserve)
            t->memory_owed += reserve - used;
        t->disk_limits += s->disk_mib;
        t->disk_owed += min_ll(s->disk_mib, DISK_RESERVE_MIB);
    }
}

/* Reads MemAvailable from /proc/meminfo, in MiB. -1 if it cannot. */
static long long mem_available_mib(void)
{
    char buf[4096];
    cleanup_close int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    const char *p = strstr(buf, "MemAvailable:");
    long long kib;
    if (!p || sscanf(p, "MemAvailable: %lld kB", &kib) != 1)
        return -1;
    return kib / 1024;
}

/* Reads the "some avg10" and "full avg10" shares from /proc/pressure/memory. -1 where the
 * kernel has no PSI. */
static void memory_pressure(double *some, double *full)
{
    char buf[512];
    *some = *full = -1;
    cleanup_close int fd = open("/proc/pressure/memory", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return;
    buf[n] = '\0';
    const char *p = strstr(buf, "some avg10=");
    if (!p || sscanf(p, "some avg10=%lf", some) != 1)
        *some = -1;
    p = strstr(buf, "full avg10=");
    if (!p || sscanf(p, "full avg10=%lf", full) != 1)
        *full = -1;
}

/* What the files directly in dir hold on the host, in bytes (blocks, not apparent size: a
 * disk image is sparse). */
static unsigned long long dir_held_bytes(const char *dir)
{
    cleanup_close int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dp = fd < 0 ? NULL : fdopendir(fd);
    if (!dp)
        return 0;
    fd = -1; /* the DIR owns it now */
    unsigned long long held = 0;
    struct dirent *de;
    struct stat st;
    while ((de = readdir(dp)))
        if (fstatat(dirfd(dp), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            held += (unsigned long long)st.st_blocks * 512;
    closedir(dp);
    return held;
}

/* "N stopped sandboxes hold X": what a prune would free, for a refusal's message (read only
 * then: a pass over every stopped sandbox's directory), or that none is kept stopped. */
static void stopped_note(struct daemon *d, const struct sandbox *sb, char *out, size_t len)
{
    int n = 0;
    unsigned long long held = 0;
    for (const struct sandbox *s = d->sandboxes; s; s = s->next) {
        if (s == sb || s->pooled || is_active(s))
            continue;
        n++;
        held += dir_held_bytes(s->dir);
    }
    if (n == 0)
        snprintf(out, len, "no sandbox is kept stopped");
    else
        snprintf(out, len,
                 "%d stopped sandbox%s hold%s %.1f GiB; `withruntime sandbox prune` "
                 "or POST /v1/sandboxes/prune frees it",
                 n, n == 1 ? "" : "es", n == 1 ? "s" : "", (double)held / (1ULL << 30));
}

static int check_counts(struct daemon *d, const struct tally *t, int is_new, struct wr_err *err)
{
    const struct daemon_config *cfg = &d->cfg;
    if (is_new && t->kept + 1 > cfg->max_sandboxes)
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "too many sandboxes: the daemon keeps %d, its limit (--max-sandboxes); "
                           "delete some (`withruntime sandbox prune` removes stopped ones)",
                           t->kept);
    if (t->active + 1 > cfg->max_running)
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "too many running sandboxes: %d are running or starting, the limit "
                           "(--max-running %d); stop or delete one first",
                           t->active, cfg->max_running);
    return 0;
}

void admission_read_memory(struct admission_host *out)
{
    out->mem_available_mib = mem_available_mib();
    memory_pressure(&out->pressure_some, &out->pressure_full);
    out->disk_free_mib = -1;
}

void admission_read_host(const char *state_dir, struct admission_host *out)
{
    admission_read_memory(out);
    if (out->mem_available_mib < 0)
        log_warn(NULL, "admission.meminfo", "error=\"no MemAvailable in /proc/meminfo\"");
    if (disk_free_mib(state_dir, &out->disk_free_mib) < 0) {
        log_warn(NULL, "admission.statvfs", "error=\"%s\"", strerror(errno));
        out->disk_free_mib = -1;
    }
}

static int check_memory(struct daemon *d, const struct sandbox *sb, const struct tally *t,
                        const struct admission_host *h, struct wr_err *err)
{
    const struct daemon_config *cfg = &d->cfg;
    long long host = d->host_memory_mib;
    if (host <= 0)
        return 0;
    if (sb->memory_mib > host)
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "memory_mib %d is more than this host's memory (%lld MiB)",
                           sb->memory_mib, host);
    long long budget = (long long)((double)host * cfg->memory_overcommit);
    if (t->memory_limits + sb->memory_mib > budget)
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "not enough memory: running sandboxes have %lld MiB and this one asks "
                           "%d MiB; the limit is %lld MiB (host memory %lld MiB x "
                           "--memory-overcommit %g); stop or delete a sandbox, or ask a smaller "
                           "memory_mib",
                           t->memory_limits, sb->memory_mib, budget, host, cfg->memory_overcommit);

    double full = h->pressure_full;
    if (full >= PRESSURE_FULL_MAX)
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "not enough memory: the host is short of it (every task stalled on "
                           "memory %.0f%% of the last 10 s); stop or delete a sandbox, or retry "
                           "later",
                           full);
    long long avail = h->mem_available_mib;
    if (avail < 0)
        return 0;
    long long keep = host / ADMISSION_HOST_KEEP_DIV;
    long long need = min_ll(sb->memory_mib, MEMORY_RESERVE_MIB);
    if (t->memory_owed + need > avail - keep)
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "not enough memory: the host has %lld MiB available, %lld MiB of it "
                           "kept for itself, and %d running sandboxes are counted at %d MiB each "
                           "at least (%lld MiB not yet in use); this one needs %lld MiB; stop or "
                           "delete a sandbox, or retry when starting ones settle",
                           avail, keep, t->active, MEMORY_RESERVE_MIB, t->memory_owed, need);
    return 0;
}

static int check_disk(struct daemon *d, const struct sandbox *sb, const struct tally *t, int is_new,
                      const struct admission_host *h, struct wr_err *err)
{
    const struct daemon_config *cfg = &d->cfg;
    long long free_mib = h->disk_free_mib;
    if (free_mib < 0)
        return 0;
    long long avail = free_mib - cfg->disk_reserve_mib;
    char note[160];
    /* A stopped one's disk exists already, and never holds more than its disk_mib. */
    if (is_new && sb->disk_mib > avail) {
        stopped_note(d, sb, note, sizeof(note));
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "disk_mib %d is more than the state directory's filesystem can hold: "
                           "%lld MiB free, %d MiB of it kept in reserve (--disk-reserve-mib); %s",
                           sb->disk_mib, free_mib, cfg->disk_reserve_mib, note);
    }
    long long need = min_ll(sb->disk_mib, DISK_RESERVE_MIB);
    if (t->disk_owed + need > avail) {
        stopped_note(d, sb, note, sizeof(note));
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "not enough disk: %lld MiB free, %d MiB of it kept in reserve "
                           "(--disk-reserve-mib), and %d running sandboxes are given %d MiB each "
                           "to write; %s",
                           free_mib, cfg->disk_reserve_mib, t->active, DISK_RESERVE_MIB, note);
    }
    long long budget = (long long)((double)(avail > 0 ? avail : 0) * cfg->disk_overcommit);
    if (t->disk_limits + sb->disk_mib > budget)
        return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                           "not enough disk: running sandboxes' disks total %lld MiB and this one "
                           "asks %d MiB; the limit is %lld MiB ((%lld MiB free - %d MiB reserve) "
                           "x --disk-overcommit %g); stop or delete a sandbox, or ask a smaller "
                           "disk_mib",
                           t->disk_limits, sb->disk_mib, budget, free_mib, cfg->disk_reserve_mib,
                           cfg->disk_overcommit);
    return 0;
}

int admission_limits_on(struct daemon *d, const struct sandbox *sb, int is_new,
                        const struct admission_host *host, struct wr_err *err)
{
    struct tally t;
    tally_sandboxes(d, sb, &t);
    if (check_counts(d, &t, is_new, err) < 0 || check_memory(d, sb, &t, host, err) < 0)
        return -1;
    return check_disk(d, sb, &t, is_new, host, err);
}

int admission_limits(struct daemon *d, const struct sandbox *sb, int is_new, struct wr_err *err)
{
    struct admission_host host;
    admission_read_host(d->cfg.state_dir, &host);
    return admission_limits_on(d, sb, is_new, &host, err);
}

int admission_loop(struct daemon *d, const struct sandbox *sb, struct wr_err *err)
{
    /* Only the gvisor driver puts a sandbox's disk on a loop device. */
    if (strcmp(d->driver->name, "gvisor") == 0) {
        int starting = 0;
        for (const struct sandbox *s = d->sandboxes; s; s = s->next)
            if (s != sb && is_starting(s))
                starting++;
        int bound = disk_loops_bound();
        if (bound >= 0 && bound + starting + 1 > d->cfg.max_loop_devices)
            return wr_err_kind(err, WR_E_CAPACITY, EAGAIN,
                               "no loop device for its disk: %d are bound on this host and %d "
                               "sandboxes are starting; the limit is %d (--max-loop-devices)",
                               bound, starting, d->cfg.max_loop_devices);
    }
    return 0;
}

int admission_check(struct daemon *d, const struct sandbox *sb, int is_new, struct wr_err *err)
{
    return admission_limits(d, sb, is_new, err) < 0 ? -1 : admission_loop(d, sb, err);
}
