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
 *                   nodev,nosuid like the image's mount, given to
 *                   runsc as the OCI root with --overlay2=none so
 *                   writes land in upper/ on the host (bundle.c)
 *   config.json     the OCI bundle spec, rewritten on every start (bundle.c)
 *   agent.log       the agent's stderr (and runsc's own start-up errors)
 * Host cgroups are made by cgroup.c; runsc state lives in <state_dir>/runsc
 * (runsc.c).
 *
 * A start is the list of steps below, run in order; each step that leaves
 * something on the host has an undo. A failed step unwinds the steps before
 * it in reverse (and its own partial work), and stop and destroy are the same
 * undos run over every step. Each step is a fault point,
 * gvisor.start.<step>, so tests can fail a start at any of them.
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
#include <unistd.h>

#include "common/fault.h"
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
    c->agent_log_max = cfg->agent_log_max ? cfg->agent_log_max : LOGCAP_DEFAULT_MAX;
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

/* The checks every operation on a sandbox but stats starts with. */
static int check_sandbox(const struct driver_spec *spec, struct wr_err *err)
{
    if (!gvisor_conf.configured)
        return wr_err_set(err, EINVAL, "the gvisor driver was not configured");
    return driver_check_id(spec->id, err);
}

/* ---- the steps of a start, each with its undo ---- */

/* What the steps of one start (or one teardown) work on. */
struct gv_run {
    const struct driver_spec *spec;
    struct sb_paths sp;
    bool dir_exists; /* sp.dir exists (runsc may write debug logs there) */
    bool discard;    /* teardown only: the layer is about to be deleted */
    char platform[16];
    int chan[2];          /* socketpair: [0] the daemon's end, [1] the agent's stdio */
    int logfd;            /* the agent's (and runsc's) stderr: a pipe into agent.log */
    struct logpump *pump; /* what copies it there (driver/logcap.h) */
    off_t log_start;      /* agent.log's size before this start */
    pid_t runsc_pid;      /* `runsc run` not yet waited for, else -1 */
};

static void run_init(struct gv_run *r, const struct driver_spec *spec)
{
    memset(r, 0, sizeof(*r));
    r->spec = spec;
    r->chan[0] = r->chan[1] = -1;
    r->logfd = -1;
    r->runsc_pid = -1;
}

static int teardown(struct gv_run *r, struct wr_err *err);

/* The spec's fields a start needs, and the files it names. */
static int step_check(struct gv_run *r, struct wr_err *err)
{
    const struct driver_spec *spec = r->spec;
    if (check_sandbox(spec, err) < 0)
        return -1;
    if (driver_check_overlay_path("image root filesystem", spec->image_rootfs, err) < 0)
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
    return 0;
}

static int step_resolve(struct gv_run *r, struct wr_err *err)
{
    int exists = bundle_paths(r->spec->dir, &r->sp, err);
    if (exists < 0)
        return -1;
    if (!exists)
        return wr_err_set(err, ENOENT, "sandbox directory %s does not exist", r->spec->dir);
    r->dir_exists = true;
    return 0;
}

static int step_platform(struct gv_run *r, struct wr_err *err)
{
    return runsc_platform_get(r->platform, sizeof(r->platform), err);
}

/* Leftovers of an earlier run that was not stopped (e.g. the daemon died). */
static int step_leftovers(struct gv_run *r, struct wr_err *err)
{
    const struct sb_paths *sp = &r->sp;
    if (!runsc_has_state(r->spec->id) && !cgroup_exists(r->spec->id) &&
        disk_mount_count(sp->rootfs, NULL, 0) <= 0 && disk_mount_count(sp->layer, NULL, 0) <= 0)
        return 0;
    log_info(r->spec->id, "gvisor.cleanup_leftovers", NULL);
    if (teardown(r, err) < 0)
        return wr_err_prefix(err, "cleaning up an earlier run");
    return 0;
}

/* The writable layer: its image made on the first start (and kept), mounted at layer/. */
static int step_disk(struct gv_run *r, struct wr_err *err)
{
    if (disk_image_create(r->sp.image, r->spec->disk_mib, err) < 0)
        return -1;
    return disk_image_mount(r->spec->id, r->sp.image, r->sp.layer, err);
}

static int undo_disk(struct gv_run *r, struct wr_err *err)
{
    return disk_image_release(r->spec->id, r->sp.image, r->sp.layer, r->discard, err);
}

static int step_overlay(struct gv_run *r, struct wr_err *err)
{
    const struct sb_paths *sp = &r->sp;
    if (bundle_mkdir(sp->upper, 0755, err) < 0 || bundle_mkdir(sp->work, 0700, err) < 0 ||
        bundle_mkdir(sp->rootfs, 0755, err) < 0)
        return -1;
    return bundle_mount_overlay(sp, r->spec->image_rootfs, err);
}

static int undo_overlay(struct gv_run *r, struct wr_err *err)
{
    const char *rootfs = r->sp.rootfs;
    int ret = disk_unmount_all(r->spec->id, rootfs, err);
    /* Removing the mount point also detaches copies of the overlay in other mount
     * namespaces, which would keep the layer's filesystem (and loop device) in use. */
    if (rmdir(rootfs) < 0 && errno != ENOENT && errno != EBUSY)
        log_warn(r->spec->id, "gvisor.rmdir_failed", "path=\"%s\" error=\"%s\"", rootfs,
                 strerror(errno));
    return ret;
}

/* The root prepared for the agent (through the overlay, so it stays in the layer) and
 * config.json; both are made again on every start, so there is nothing to undo. */
static int step_bundle(struct gv_run *r, struct wr_err *err)
{
    if (bundle_prepare_root(&r->sp, r->spec->id, err) < 0)
        return -1;
    return bundle_write_spec(r->spec, &r->sp, err);
}

static int step_cgroup(struct gv_run *r, struct wr_err *err)
{
    const struct driver_spec *spec = r->spec;
    struct cgroup_limits lim = {.cpus = spec->cpus,
                                .memory_bytes = gvisor_memory_limit_bytes(spec->memory_mib),
                                .pids_max = PIDS_BACKSTOP(spec->pids_max)};
    return cgroup_create(spec->id, &lim, err);
}

static int undo_cgroup(struct gv_run *r, struct wr_err *err)
{
    return cgroup_destroy(r->spec->id, CGROUP_KILL_TIMEOUT_MS, err);
}

/*
 * Each end of the channel may queue this much for the other. Linux's default (~208 KiB) made
 * a download a string of small writes and wake-ups on both sides, gVisor's sentry's most of
 * all. Kernel memory, used only while a transfer is in flight, and the daemon reads its end
 * continuously.
 */
#define CHAN_SNDBUF (4 << 20)

/* Raises a socket's send buffer past net.core.wmem_max (root may), else as far as allowed. */
static void chan_sndbuf(int fd)
{
    int v = CHAN_SNDBUF;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
}

/* `runsc run --detach` started, the agent's stdio one end of a socketpair. */
static int step_spawn(struct gv_run *r, struct wr_err *err)
{
    if (bundle_mkdir(gvisor_conf.runsc_root, 0700, err) < 0)
        return -1;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, r->chan) < 0)
        return wr_err_sys(err, errno, "socketpair");
    chan_sndbuf(r->chan[0]);
    chan_sndbuf(r->chan[1]);
    /* Never the file itself: the sentry holds its stderr for the sandbox's whole life, and
     * whatever the sandbox made it write would grow the file unchecked. */
    r->pump = logpump_open(r->sp.dir, r->spec->id, gvisor_conf.agent_log_max, &r->logfd,
                           &r->log_start, err);
    if (!r->pump)
        return -1;
    return runsc_run_spawn(r->spec->id, r->platform, r->sp.dir, r->spec->netns_fd, r->chan[1],
                           r->logfd, &r->runsc_pid, err);
}

/* Stops the container and removes runsc's state; its cgroups stay (undo_cgroup). */
static int undo_spawn(struct gv_run *r, struct wr_err *err)
{
    const char *id = r->spec->id;
    if (r->runsc_pid > 0) {
        /* A `runsc run` cut short might leave a sandbox runsc does not know of yet: let it
         * finish (bounded by its timeout), then delete what it made. */
        struct wr_err e;
        runsc_run_wait(r->runsc_pid, r->sp.log, r->log_start, r->pump, &e);
        r->runsc_pid = -1;
    }
    for (int i = 0; i < 2; i++)
        if (r->chan[i] >= 0) {
            close(r->chan[i]);
            r->chan[i] = -1;
        }
    if (r->logfd >= 0) {
        close(r->logfd);
        r->logfd = -1;
    }
    /* Killing the sandbox's processes ourselves first (the reaper collects them) makes
     * `runsc delete` find a dead sandbox: ~30 ms instead of ~120 ms for the kill and wait. */
    cgroup_kill(id, CGROUP_KILL_TIMEOUT_MS, NULL);
    if (!runsc_has_state(id))
        return 0;
    const char *dir = r->dir_exists ? r->sp.dir : NULL;
    struct wr_err e;
    if (runsc_delete(id, dir, &e) == 0)
        return 0;
    /* Kill what runs by its cgroup, then let runsc clean up its state. */
    cgroup_destroy(id, CGROUP_KILL_TIMEOUT_MS, NULL);
    return runsc_delete(id, dir, err);
}

/* The agent runs once `runsc run --detach` exits 0. */
static int step_wait(struct gv_run *r, struct wr_err *err)
{
    pid_t pid = r->runsc_pid;
    r->runsc_pid = -1;
    return runsc_run_wait(pid, r->sp.log, r->log_start, r->pump, err);
}

struct step {
    const char *name; /* in errors, and the fault point gvisor.start.<name> */
    int (*run)(struct gv_run *r, struct wr_err *err);
    /* Undoes what run did, whole or in part (NULL: nothing on the host to undo). Also the
     * pieces of stop and destroy, so it must work from the spec alone after a restart. */
    int (*undo)(struct gv_run *r, struct wr_err *err);
};

static const struct step steps[] = {
    {"check", step_check, NULL},       {"resolve", step_resolve, NULL},
    {"platform", step_platform, NULL}, {"leftovers", step_leftovers, NULL},
    {"disk", step_disk, undo_disk},    {"overlay", step_overlay, undo_overlay},
    {"bundle", step_bundle, NULL},     {"cgroup", step_cgroup, undo_cgroup},
    {"spawn", step_spawn, undo_spawn}, {"wait", step_wait, NULL},
};

#define NSTEPS WR_ARRAY_LEN(steps)

/*
 * Runs the undos of steps[n-1] down to steps[0]. Every undo runs even when one before it
 * failed; err gets the first failure, prefixed with its step's name. Returns 0 or -1.
 */
static int unwind(struct gv_run *r, size_t n, struct wr_err *err)
{
    int ret = 0;
    while (n-- > 0) {
        struct wr_err e;
        if (!steps[n].undo || steps[n].undo(r, &e) == 0)
            continue;
        wr_err_prefix(&e, "(step %s)", steps[n].name);
        if (ret == 0)
            *err = e;
        else
            log_warn(r->spec->id, "gvisor.undo_failed", "error=\"%s\"", e.msg);
        ret = -1;
    }
    return ret;
}

/*
 * Stops what runs and undoes mounts, loop devices and cgroups; keeps the writable layer
 * (r->discard: the layer is about to be deleted, its unwritten data may be dropped).
 */
static int teardown(struct gv_run *r, struct wr_err *err)
{
    return unwind(r, NSTEPS, err);
}

/*
 * Runs the steps in order. When step k fails (or its fault point is armed), the undos of
 * the steps before it run in reverse, and its own when it ran, since it may have done part
 * of its work; err names step k as "(step NAME)", which driver.c shows to API clients. Fills ms[]
 * with each step's duration. Returns 0 or -1.
 */
static int steps_run(struct gv_run *r, uint64_t ms[NSTEPS], struct wr_err *err)
{
    for (size_t k = 0; k < NSTEPS; k++) {
        char point[64];
        snprintf(point, sizeof(point), "gvisor.start.%s", steps[k].name);
        uint64_t t0 = now_ms_monotonic();
        size_t done = k;
        int failed = fault_hit(point, err) < 0;
        if (!failed && steps[k].run(r, err) < 0) {
            failed = 1;
            done = k + 1;
        }
        ms[k] = now_ms_monotonic() - t0;
        if (!failed)
            continue;
        wr_err_prefix(err, "(step %s)", steps[k].name);
        struct wr_err e;
        if (unwind(r, done, &e) < 0)
            log_warn(r->spec->id, "gvisor.cleanup_failed", "error=\"%s\"", e.msg);
        return -1;
    }
    return 0;
}

/* ---- the operations ---- */

static int gv_start(const struct driver_spec *spec, int *chan_fd, struct wr_err *err)
{
    *chan_fd = -1;
    struct gv_run r;
    run_init(&r, spec);
    uint64_t ms[NSTEPS];
    int rc = steps_run(&r, ms, err);
    logpump_release(r.pump); /* it runs on while the sandbox's processes hold the pipe */
    if (rc < 0)
        return wr_err_prefix(err, "starting %s", spec->id ? spec->id : "a sandbox");
    close(r.chan[1]);
    close(r.logfd);
    *chan_fd = r.chan[0];

    char times[NSTEPS * 24] = "";
    size_t len = 0;
    for (size_t k = 0; k < NSTEPS && len < sizeof(times); k++)
        len += (size_t)snprintf(times + len, sizeof(times) - len, "%s%s_ms=%llu", k ? " " : "",
                                steps[k].name, (unsigned long long)ms[k]);
    log_debug(spec->id, "gvisor.started", "platform=%s steps=\"%s\"", r.platform, times);
    return 0;
}

/* Fills r for a teardown of spec's sandbox. Returns 1 if its directory exists, 0 if not, -1
 * on error. */
static int run_for_teardown(struct gv_run *r, const struct driver_spec *spec, bool discard,
                            struct wr_err *err)
{
    run_init(r, spec);
    r->discard = discard;
    if (check_sandbox(spec, err) < 0)
        return -1;
    int exists = bundle_paths(spec->dir, &r->sp, err);
    r->dir_exists = exists > 0;
    return exists;
}

static int gv_stop(const struct driver_spec *spec, struct wr_err *err)
{
    if (fault_hit("gvisor.stop", err) < 0)
        return wr_err_prefix(err, "stopping %s", spec->id);
    struct gv_run r;
    if (run_for_teardown(&r, spec, false, err) < 0)
        return -1;
    uint64_t t0 = now_ms_monotonic();
    if (teardown(&r, err) < 0)
        return wr_err_prefix(err, "stopping %s", spec->id);
    /* Its processes are gone: their last words (why an agent died, say) are in agent.log
     * before the stop is reported. */
    if (r.dir_exists)
        logpump_settle(r.sp.dir, LOGPUMP_SETTLE_MS);
    log_debug(spec->id, "gvisor.stopped", "ms=%llu", (unsigned long long)(now_ms_monotonic() - t0));
    return 0;
}

static int gv_destroy(const struct driver_spec *spec, struct wr_err *err)
{
    if (fault_hit("gvisor.destroy", err) < 0)
        return wr_err_prefix(err, "destroying %s", spec->id);
    struct gv_run r;
    int exists = run_for_teardown(&r, spec, true, err);
    if (exists < 0)
        return -1;
    if (teardown(&r, err) < 0)
        return wr_err_prefix(err, "destroying %s", spec->id);
    if (!exists)
        return 0;
    logpump_settle(r.sp.dir, LOGPUMP_SETTLE_MS); /* no write lands in the file once it is gone */
    const char *dir = r.sp.dir;
    char first[PATH_MAX];
    int n = disk_mount_count(dir, first, sizeof(first));
    if (n < 0)
        return wr_err_sys(err, errno, "reading /proc/self/mountinfo");
    if (n > 0)
        return wr_err_set(err, EBUSY, "destroying %s: %s is still mounted; not removing %s",
                          spec->id, first, dir);
    char parent_path[PATH_MAX], base[PATH_MAX];
    const char *slash = strrchr(dir, '/');
    snprintf(base, sizeof(base), "%s", slash + 1);
    snprintf(parent_path, sizeof(parent_path), "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
    cleanup_close int parent = open(parent_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
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
    if (driver_check_id(spec->id, err) < 0)
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

/* How long a freeze may take to settle before the sandbox is thawed again (cgroup_freeze):
 * measured at a few ms for an idle sandbox. */
#define FREEZE_TIMEOUT_MS 2000

static int gv_freeze(const struct driver_spec *spec, int frozen, struct wr_err *err)
{
    if (driver_check_id(spec->id, err) < 0)
        return -1;
    if (fault_hit(frozen ? "gvisor.freeze" : "gvisor.thaw", err) < 0)
        return -1;
    return cgroup_freeze(spec->id, frozen, FREEZE_TIMEOUT_MS, err);
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
    .freeze = gv_freeze,
};
