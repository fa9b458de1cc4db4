/*
 * Admission control (admission.h). Every number is counted afresh from the daemon's list of
 * sandboxes, so nothing can drift; the host's free disk and bound loop devices are read when
 * asked (one statvfs, one pass over /sys/block: cheap enough for the loop thread, though the
 * pass is ~1 ms on a host with 200 loop devices, so a pool claim skips it: admission.h).
 */
#include "daemon/admission.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "daemon/daemon.h"
#include "daemon/sandbox.h"
#include "driver/disk.h"

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

int admission_limits(struct daemon *d, const struct sandbox *sb, int is_new, struct wr_err *err)
{
    const struct daemon_config *cfg = &d->cfg;
    int kept = 0, active = 0;
    long long memory = 0, disk = 0;
    for (const struct sandbox *s = d->sandboxes; s; s = s->next) {
        /* A user's sandbox is not refused for the pool's warm entries (a claim or a refill
         * waits for room instead); a refill counts everything. */
        if (s == sb || (s->pooled && !sb->pooled))
            continue;
        kept++;
        disk += s->disk_mib;
        if (is_active(s)) {
            active++;
            memory += s->memory_mib;
        }
    }
    if (is_new && kept + 1 > cfg->max_sandboxes)
        return wr_err_kind(err, WR_E_UNAVAILABLE, EAGAIN,
                           "too many sandboxes: the daemon keeps %d, its limit (--max-sandboxes); "
                           "delete some (`withruntime sandbox prune` removes stopped ones)",
                           kept);
    if (active + 1 > cfg->max_running)
        return wr_err_kind(err, WR_E_UNAVAILABLE, EAGAIN,
                           "too many running sandboxes: %d are running or starting, the limit "
                           "(--max-running %d); stop or delete one first",
                           active, cfg->max_running);

    long long host = d->host_memory_mib;
    if (host > 0) {
        if (sb->memory_mib > host)
            return wr_err_kind(err, WR_E_UNAVAILABLE, EAGAIN,
                               "memory_mib %d is more than this host's memory (%lld MiB)",
                               sb->memory_mib, host);
        long long budget = (long long)((double)host * cfg->memory_overcommit);
        if (memory + sb->memory_mib > budget)
            return wr_err_kind(
                err, WR_E_UNAVAILABLE, EAGAIN,
                "not enough memory: running sandboxes have %lld MiB and this one asks "
                "%d MiB; the limit is %lld MiB (host memory %lld MiB x "
                "--memory-overcommit %g)",
                memory, sb->memory_mib, budget, host, cfg->memory_overcommit);
    }

    if (is_new) {
        long long free_mib;
        if (disk_free_mib(cfg->state_dir, &free_mib) < 0) {
            log_warn(NULL, "admission.statvfs", "error=\"%s\"", strerror(errno));
        } else {
            long long avail = free_mib - cfg->disk_reserve_mib;
            if (sb->disk_mib > avail)
                return wr_err_kind(err, WR_E_UNAVAILABLE, EAGAIN,
                                   "disk_mib %d is more than the state directory's filesystem can "
                                   "hold: %lld MiB free, %d MiB of it kept in reserve "
                                   "(--disk-reserve-mib)",
                                   sb->disk_mib, free_mib, cfg->disk_reserve_mib);
            long long budget = (long long)((double)avail * cfg->disk_overcommit);
            if (disk + sb->disk_mib > budget)
                return wr_err_kind(
                    err, WR_E_UNAVAILABLE, EAGAIN,
                    "not enough disk: kept sandboxes' disks total %lld MiB and this one "
                    "asks %d MiB; the limit is %lld MiB ((%lld MiB free - %d MiB "
                    "reserve) x --disk-overcommit %g)",
                    disk, sb->disk_mib, budget, free_mib, cfg->disk_reserve_mib,
                    cfg->disk_overcommit);
        }
    }

    return 0;
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
            return wr_err_kind(err, WR_E_UNAVAILABLE, EAGAIN,
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
