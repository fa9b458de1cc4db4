/*
 * The gVisor driver: each sandbox is one runsc container whose init is the
 * withruntime agent, talking to the daemon over its stdio.
 *
 * Per sandbox, under spec->dir:
 *   layer.img       the sandbox's writable layer (kept across stop/start): an
 *                   ext4 image of disk_mib MiB, its disk quota (disk.c)
 *   layer/          where the image is mounted while the sandbox runs; holds
 *                   upper/ and work/ for the overlay
 *   rootfs/         host overlayfs (lower = shared image, upper/work above),
 *                   given to runsc as the OCI root with --overlay2=none so
 *                   writes land in upper/ on the host (bundle.c)
 *   config.json     the OCI bundle spec, rewritten on every start (bundle.c)
 *   agent.log       the agent's stderr (and runsc's own start-up errors)
 * Host cgroups are made by cgroup.c; runsc state lives in <state_dir>/runsc
 * (runsc.c).
 *
 * Every function blocks; different sandboxes may be handled concurrently.
 * Global state: the configuration (written once by configure) and the
 * platform chosen by the first start (runsc.c).
 */
#include "driver/gvisor.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "driver/cgroup.h"
#include "driver/disk.h"
#include "driver/gvisor_internal.h"

/*
 * Memory: the host cgroup holds the sentry (Go heap, page tables, metadata), the gofer and
 * every guest page, and when it hits its limit the host OOM killer takes the whole sandbox
 * down. So the cgroup gets the sandbox's memory plus a margin for gVisor itself. Measured
 * here: an idle sandbox charges ~28 MB (sentry + gofer + page cache); with a 256 MiB limit a
 * guest reached 224 MiB of touched anonymous memory before the sandbox was OOM-killed. The
 * margin is 64 MiB plus 1/16 of the sandbox's memory (page tables and sentry bookkeeping
 * grow with it). The guest sees the whole cgroup limit as its MemTotal.
 */
#define MEMORY_MARGIN_MIB 64
#define MEMORY_MARGIN_DIV 16

/*
 * Processes: RLIMIT_NPROC (enforced inside the sentry; the sandbox survives hitting it) is
 * the real cap. A host pids.max hit makes the sentry panic, so the host limit is only a
 * backstop well above what pids_max guest tasks need on the host (under systrap every guest
 * thread may have a host stub thread, plus the sentry's and gofer's own threads).
 */
#define PIDS_BACKSTOP(n) ((n)*2 + 512)

#define CGROUP_KILL_TIMEOUT_MS 5000

struct gvisor_conf gvisor_conf;

static int gv_configure(const struct driver_config *cfg, struct wr_err *err)
{
    if (!cfg || !cfg->state_dir || cfg->state_dir[0] != '/')
        return wr_err_set(err, EINVAL, "driver: state_dir must be an absolute path");
    if (strlen(cfg->state_dir) > PATH_MAX - 64)
        return wr_err_set(err, ENAMETOOLONG, "driver: state_dir is too long");
    if (cfg->platform && cfg->platform[0] && !runsc_platform_valid(cfg->platform))
        return wr_err_set(err, EINVAL,
                          "driver: unknown gVisor platform \"%s\" (systrap, ptrace or kvm)",
                          cfg->platform);
    struct gvisor_conf *c = &gvisor_conf;
    snprintf(c->state_dir, sizeof(c->state_dir), "%s", cfg->state_dir);
    snprintf(c->runsc_root, sizeof(c->runsc_root), "%s/runsc", cfg->state_dir);
    snprintf(c->platform_override, sizeof(c->platform_override), "%s",
             cfg->platform ? cfg->platform : "");
    c->debug = cfg->debug;
    c->configured = true;
    return 0;
}

uint64_t gvisor_memory_limit_bytes(int memory_mib)
{
    uint64_t mib =
        (uint64_t)memory_mib + MEMORY_MARGIN_MIB + (uint64_t)memory_mib / MEMORY_MARGIN_DIV;
    return mib << 20;
}

int gvisor_pids_limit(int pids_max)
{
    return PIDS_BACKSTOP(pids_max);
}

/* The checks every operation on a sandbox starts with. */
static int check_sandbox(const struct driver_spec *spec, struct wr_err *err)
{
    if (!gvisor_conf.configured)
        return wr_err_set(err, EINVAL, "the gvisor driver was not configured");
    const char *id = spec->id;
    if (!id || strlen(id) != DRIVER_ID_LEN)
        return wr_err_set(err, EINVAL, "sandbox id must be %d characters", DRIVER_ID_LEN);
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
            return wr_err_set(err, EINVAL, "sandbox id \"%s\" has characters outside [a-z0-9-]",
                              id);
    return 0;
}

/* ---- the operations ---- */

/*
 * Stops what runs and undoes mounts, loop devices and cgroups; keeps the writable layer.
 * discard: the layer is about to be deleted, its unwritten data may be dropped.
 */
static int teardown(const struct driver_spec *spec, const struct sb_paths *sp, bool dir_exists,
                    bool discard, struct wr_err *err)
{
    int ret = 0;
    /* Killing the sandbox's processes ourselves first (the reaper collects them) makes
     * `runsc delete` find a dead sandbox: ~30 ms instead of ~120 ms for the kill and wait. */
    cgroup_kill(spec->id, CGROUP_KILL_TIMEOUT_MS, NULL);
    if (runsc_has_state(spec->id)) {
        const char *dir = dir_exists ? sp->dir : NULL;
        struct wr_err e;
        if (runsc_delete(spec->id, dir, &e) < 0) {
            /* Kill what runs by its cgroup, then let runsc clean up its state. */
            cgroup_destroy(spec->id, CGROUP_KILL_TIMEOUT_MS, NULL);
            if (runsc_delete(spec->id, dir, err) < 0)
                ret = -1;
        }
    }
    struct wr_err e;
    if (cgroup_destroy(spec->id, CGROUP_KILL_TIMEOUT_MS, &e) < 0 && ret == 0) {
        *err = e;
        ret = -1;
    }
    if (disk_unmount_all(spec->id, sp->rootfs, &e) < 0 && ret == 0) {
        *err = e;
        ret = -1;
    }
    /* Removing the mount point also detaches copies of the overlay in other mount
     * namespaces, which would keep the layer's filesystem (and loop device) in use. */
    if (rmdir(sp->rootfs) < 0 && errno != ENOENT && errno != EBUSY)
        log_warn(spec->id, "gvisor.rmdir_failed", "path=\"%s\" error=\"%s\"", sp->rootfs,
                 strerror(errno));
    if (disk_image_release(spec->id, sp->image, sp->layer, discard, &e) < 0 && ret == 0) {
        *err = e;
        ret = -1;
    }
    return ret;
}

/* Resolves spec->dir after the checks every operation starts with. Returns 1 if it exists, 0
 * if not, -1 on error. */
static int resolve_dir(const struct driver_spec *spec, struct sb_paths *sp, struct wr_err *err)
{
    if (check_sandbox(spec, err) < 0)
        return -1;
    return bundle_paths(spec->dir, sp, err);
}

static int gv_stop(const struct driver_spec *spec, struct wr_err *err)
{
    struct sb_paths sp;
    int exists = resolve_dir(spec, &sp, err);
    if (exists < 0)
        return -1;
    uint64_t t0 = now_ms_monotonic();
    if (teardown(spec, &sp, exists, false, err) < 0)
        return wr_err_prefix(err, "stopping %s", spec->id);
    log_debug(spec->id, "gvisor.stopped", "ms=%llu", (unsigned long long)(now_ms_monotonic() - t0));
    return 0;
}

static int gv_start(const struct driver_spec *spec, int *chan_fd, struct wr_err *err)
{
    uint64_t t0 = now_ms_monotonic();
    *chan_fd = -1;
    struct sb_paths sp;
    int exists = resolve_dir(spec, &sp, err);
    if (exists < 0)
        return -1;
    if (!exists)
        return wr_err_set(err, ENOENT, "sandbox directory %s does not exist", spec->dir);
    if (bundle_check_path("image root filesystem", spec->image_rootfs, err) < 0)
        return -1;
    if (!spec->agent_path || spec->agent_path[0] != '/')
        return wr_err_set(err, EINVAL, "agent path must be absolute");
    struct stat st;
    if (stat(spec->agent_path, &st) < 0 || !S_ISREG(st.st_mode))
        return wr_err_set(err, ENOENT, "agent binary %s is missing (build withruntime-agent)",
                          spec->agent_path);
    if (stat(spec->image_rootfs, &st) < 0 || !S_ISDIR(st.st_mode))
        return wr_err_set(err, ENOENT, "image root filesystem %s is missing", spec->image_rootfs);
    if (spec->cpus < 1 || spec->memory_mib < 16 || spec->pids_max < 1)
        return wr_err_set(err, EINVAL, "bad limits: cpus %d, memory %d MiB, pids %d", spec->cpus,
                          spec->memory_mib, spec->pids_max);
    char platform[16];
    if (runsc_platform_get(platform, sizeof(platform), err) < 0)
        return -1;

    /* Leftovers of an earlier run that was not stopped (e.g. the daemon died). */
    if (runsc_has_state(spec->id) || cgroup_exists(spec->id) ||
        disk_mount_count(sp.rootfs, NULL, 0) > 0 || disk_mount_count(sp.layer, NULL, 0) > 0) {
        log_info(spec->id, "gvisor.cleanup_leftovers", NULL);
        if (teardown(spec, &sp, true, false, err) < 0)
            return wr_err_prefix(err, "cleaning up an earlier run");
    }

    if (disk_image_create(sp.image, spec->disk_mib, err) < 0)
        return wr_err_prefix(err, "starting %s", spec->id);
    uint64_t t_image = now_ms_monotonic();

    int sv[2] = {-1, -1};
    cleanup_close int logfd = -1;
    int ret = -1;
    if (disk_image_mount(spec->id, sp.image, sp.layer, err) < 0)
        goto fail;
    uint64_t t_mount = now_ms_monotonic();
    if (bundle_mkdir(gvisor_conf.runsc_root, 0700, err) < 0 ||
        bundle_mkdir(sp.upper, 0755, err) < 0 || bundle_mkdir(sp.work, 0700, err) < 0 ||
        bundle_mkdir(sp.rootfs, 0755, err) < 0)
        goto fail;
    if (bundle_mount_overlay(&sp, spec->image_rootfs, err) < 0)
        goto fail;
    if (bundle_prepare_root(&sp, err) < 0 || bundle_write_spec(spec, &sp, err) < 0)
        goto fail;
    struct cgroup_limits lim = {.cpus = spec->cpus,
                                .memory_bytes = gvisor_memory_limit_bytes(spec->memory_mib),
                                .pids_max = PIDS_BACKSTOP(spec->pids_max)};
    if (cgroup_create(spec->id, &lim, err) < 0)
        goto fail;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        wr_err_sys(err, errno, "socketpair");
        goto fail;
    }
    logfd = open(sp.log, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0640);
    if (logfd < 0) {
        wr_err_sys(err, errno, "opening %s", sp.log);
        goto fail;
    }
    struct stat lst;
    off_t log_start = fstat(logfd, &lst) == 0 ? lst.st_size : 0;

    uint64_t t1 = now_ms_monotonic();
    pid_t pid;
    if (runsc_run_spawn(spec->id, platform, sp.dir, sv[1], logfd, &pid, err) < 0 ||
        runsc_run_wait(pid, sp.log, log_start, err) < 0)
        goto fail;
    close(sv[1]);
    sv[1] = -1;
    *chan_fd = steal_fd(&sv[0]);
    ret = 0;
    uint64_t t2 = now_ms_monotonic();
    log_debug(spec->id, "gvisor.started",
              "platform=%s image_ms=%llu mount_ms=%llu prepare_ms=%llu runsc_ms=%llu", platform,
              (unsigned long long)(t_image - t0), (unsigned long long)(t_mount - t_image),
              (unsigned long long)(t1 - t0), (unsigned long long)(t2 - t1));
    return 0;

fail:
    if (sv[0] >= 0)
        close(sv[0]);
    if (sv[1] >= 0)
        close(sv[1]);
    {
        struct wr_err e;
        if (teardown(spec, &sp, true, false, &e) < 0)
            log_warn(spec->id, "gvisor.cleanup_failed", "error=\"%s\"", e.msg);
    }
    wr_err_prefix(err, "starting %s", spec->id);
    return ret;
}

static int gv_destroy(const struct driver_spec *spec, struct wr_err *err)
{
    struct sb_paths sp;
    int exists = resolve_dir(spec, &sp, err);
    if (exists < 0)
        return -1;
    if (teardown(spec, &sp, exists, true, err) < 0)
        return wr_err_prefix(err, "destroying %s", spec->id);
    if (!exists)
        return 0;
    char first[PATH_MAX];
    int n = disk_mount_count(sp.dir, first, sizeof(first));
    if (n < 0)
        return wr_err_sys(err, errno, "reading /proc/self/mountinfo");
    if (n > 0)
        return wr_err_set(err, EBUSY, "destroying %s: %s is still mounted; not removing %s",
                          spec->id, first, sp.dir);
    char parent_path[PATH_MAX], base[PATH_MAX];
    const char *slash = strrchr(sp.dir, '/');
    snprintf(base, sizeof(base), "%s", slash + 1);
    snprintf(parent_path, sizeof(parent_path), "%.*s", slash == sp.dir ? 1 : (int)(slash - sp.dir),
             sp.dir);
    cleanup_close int parent = -1;
    parent = open(parent_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0)
        return wr_err_sys(err, errno, "destroying %s: opening %s", spec->id, parent_path);
    if (bundle_remove_tree_at(parent, base, err) < 0)
        return wr_err_prefix(err, "destroying %s", spec->id);
    return 0;
}

static int gv_is_running(const struct driver_spec *spec, struct wr_err *err)
{
    if (check_sandbox(spec, err) < 0)
        return -1;
    return runsc_is_running(spec->id, err);
}

static int gv_stats(const struct driver_spec *spec, struct driver_stats *out, struct wr_err *err)
{
    memset(out, 0, sizeof(*out));
    if (check_sandbox(spec, err) < 0)
        return -1;
    struct cgroup_usage u;
    if (cgroup_usage(spec->id, &u, err) < 0)
        return -1;
    out->cpu_usec = u.cpu_usec;
    out->memory_bytes = u.memory_bytes;
    out->pids = u.pids;
    out->oom_kills = u.oom_kills;
    return 0;
}

static int gv_probe(char *detail, size_t detail_len, struct wr_err *err)
{
    if (detail && detail_len)
        detail[0] = '\0';
    char ver[64];
    if (gvisor_runsc_version(ver, sizeof(ver), err) < 0)
        return -1;
    if (gvisor_runsc_too_old(ver))
        return wr_err_set(err, ENOTSUP,
                          "runsc %s is too old: its statx rejects AT_NO_AUTOMOUNT, "
                          "so ls and stat fail inside; install runsc from bookworm-backports",
                          ver);
    char cg[128];
    if (cgroup_check(cg, sizeof(cg), err) < 0)
        return -1;
    if (disk_check(err) < 0)
        return -1;
    if (!gvisor_conf.configured)
        return wr_err_set(err, EINVAL, "the gvisor driver was not configured");
    char platform[16];
    if (runsc_platform_get(platform, sizeof(platform), err) < 0)
        return -1;
    if (gvisor_conf.platform_override[0] && runsc_platform_try(platform, err) < 0)
        return -1;
    if (detail && detail_len)
        snprintf(detail, detail_len, "runsc %s, platform %s", ver, platform);
    return 0;
}

const struct driver_ops driver_gvisor = {
    .name = "gvisor",
    .configure = gv_configure,
    .probe = gv_probe,
    .start = gv_start,
    .stop = gv_stop,
    .destroy = gv_destroy,
    .is_running = gv_is_running,
    .stats = gv_stats,
};
