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
 *                   writes land in upper/ on the host
 *   config.json     the OCI bundle spec, rewritten on every start
 *   agent.log       the agent's stderr (and runsc's own start-up errors)
 * Host cgroups are made by cgroup.c; runsc state lives in <state_dir>/runsc.
 *
 * Every function blocks; different sandboxes may be handled concurrently.
 * Global state: the configuration (written once by configure) and the
 * platform chosen by the first start (under platform_lock).
 */
#include "driver/gvisor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/proc.h"
#include "common/util.h"
#include "driver/cgroup.h"
#include "driver/disk.h"

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

#define RUNSC_RUN_TIMEOUT_MS 60000
#define RUNSC_DELETE_TIMEOUT_MS 30000
#define RUNSC_STATE_TIMEOUT_MS 10000
#define RUNSC_PROBE_TIMEOUT_MS 15000
#define CGROUP_KILL_TIMEOUT_MS 5000
#define RUNSC_MIN_DATE 20240101 /* Debian 12's own 0.0~20221219 breaks ls/stat inside */

/* CAP_SYS_ADMIN is the agent's alone: it puts commands in a child pid namespace, out of reach
 * of kill -9 1, and drops it from every command (src/agent/pidns.c). */
static const char *const sandbox_caps[] = {
    "CAP_CHOWN",       "CAP_DAC_OVERRIDE",     "CAP_FSETID",     "CAP_FOWNER",
    "CAP_MKNOD",       "CAP_SETGID",           "CAP_SETUID",     "CAP_SETFCAP",
    "CAP_SETPCAP",     "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE", "CAP_SYS_ADMIN",
};

static struct {
    bool configured;
    char state_dir[PATH_MAX];
    char runsc_root[PATH_MAX];
    char platform_override[16];
    int debug;
} conf;

static pthread_mutex_t platform_lock = PTHREAD_MUTEX_INITIALIZER;
static char platform_chosen[16]; /* under platform_lock; "" until chosen */

static bool platform_valid(const char *p)
{
    return !strcmp(p, "systrap") || !strcmp(p, "ptrace") || !strcmp(p, "kvm");
}

static int gv_configure(const struct driver_config *cfg, struct wr_err *err)
{
    if (!cfg || !cfg->state_dir || cfg->state_dir[0] != '/')
        return wr_err_set(err, EINVAL, "driver: state_dir must be an absolute path");
    if (strlen(cfg->state_dir) > PATH_MAX - 64)
        return wr_err_set(err, ENAMETOOLONG, "driver: state_dir is too long");
    if (cfg->platform && cfg->platform[0] && !platform_valid(cfg->platform))
        return wr_err_set(err, EINVAL,
                          "driver: unknown gVisor platform \"%s\" (systrap, ptrace or kvm)",
                          cfg->platform);
    snprintf(conf.state_dir, sizeof(conf.state_dir), "%s", cfg->state_dir);
    snprintf(conf.runsc_root, sizeof(conf.runsc_root), "%s/runsc", cfg->state_dir);
    snprintf(conf.platform_override, sizeof(conf.platform_override), "%s",
             cfg->platform ? cfg->platform : "");
    conf.debug = cfg->debug;
    conf.configured = true;
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

/* ---- runsc command lines ---- */

struct runsc_cmd {
    char *argv[24];
    int argc;
    char root[PATH_MAX + 16];
    char platform[32];
    char debug_log[PATH_MAX + 32];
};

/* Starts a runsc command line with the global flags. dir (may be NULL) receives debug logs. */
static void runsc_init(struct runsc_cmd *c, const char *platform, const char *dir)
{
    c->argc = 0;
    c->argv[c->argc++] = "runsc";
    snprintf(c->root, sizeof(c->root), "--root=%s", conf.runsc_root);
    c->argv[c->argc++] = c->root;
    snprintf(c->platform, sizeof(c->platform), "--platform=%s", platform ? platform : "systrap");
    c->argv[c->argc++] = c->platform;
    c->argv[c->argc++] = "--network=none";
    c->argv[c->argc++] = "--overlay2=none";
    if (conf.debug) {
        snprintf(c->debug_log, sizeof(c->debug_log), "--debug-log=%s/runsc-debug/",
                 dir ? dir : conf.runsc_root);
        c->argv[c->argc++] = "--debug";
        c->argv[c->argc++] = c->debug_log;
    }
}

static void runsc_add(struct runsc_cmd *c, const char *arg)
{
    if (c->argc < (int)WR_ARRAY_LEN(c->argv) - 1)
        c->argv[c->argc++] = (char *)arg;
    c->argv[c->argc] = NULL;
}

static bool is_not_found(const char *msg)
{
    return strstr(msg, "does not exist") || strstr(msg, "not found") || strstr(msg, "no such file");
}

/* ---- platform ---- */

/* Runs a throwaway `runsc do true` on platform p (the host's root read-only under an
 * in-memory overlay, no network). Returns 0 or -1 with err set. */
static int platform_try(const char *p, struct wr_err *err)
{
    char root[PATH_MAX + 16], platform[32];
    snprintf(root, sizeof(root), "--root=%s", conf.runsc_root);
    snprintf(platform, sizeof(platform), "--platform=%s", p);
    char *argv[] = {"runsc",  root,   platform, "--network=none", "do",
                    "-quiet", "-cwd", "/",      "true",           NULL};
    char out[2048];
    /* doctor may run before any daemon made the state directory */
    if ((mkdir(conf.state_dir, 0755) < 0 && errno != EEXIST) ||
        (mkdir(conf.runsc_root, 0700) < 0 && errno != EEXIST))
        return wr_err_sys(err, errno, "creating %s", conf.runsc_root);
    if (proc_run(argv, RUNSC_PROBE_TIMEOUT_MS, out, sizeof(out), err) < 0)
        return wr_err_prefix(err, "platform %s", p);
    return 0;
}

int gvisor_platform_check(const char *platform, struct wr_err *err)
{
    if (!conf.configured)
        return wr_err_set(err, EINVAL, "the gvisor driver was not configured");
    if (!platform || !platform_valid(platform))
        return wr_err_set(err, EINVAL, "unknown gVisor platform \"%s\"", platform ? platform : "");
    return platform_try(platform, err);
}

/* Copies the platform to use into out: the configured one, else systrap if it works here,
 * else ptrace. The choice is made once. */
static int platform_get(char *out, size_t outlen, struct wr_err *err)
{
    if (conf.platform_override[0]) {
        snprintf(out, outlen, "%s", conf.platform_override);
        return 0;
    }
    pthread_mutex_lock(&platform_lock);
    int ret = 0;
    if (!platform_chosen[0]) {
        struct wr_err e1, e2;
        if (platform_try("systrap", &e1) == 0) {
            snprintf(platform_chosen, sizeof(platform_chosen), "systrap");
        } else if (platform_try("ptrace", &e2) == 0) {
            log_warn(NULL, "gvisor.platform", "platform=ptrace reason=\"%s\"", e1.msg);
            snprintf(platform_chosen, sizeof(platform_chosen), "ptrace");
        } else {
            ret = wr_err_set(err, e1.code ? e1.code : EIO, "no gVisor platform works here: %s; %s",
                             e1.msg, e2.msg);
        }
    }
    snprintf(out, outlen, "%s", platform_chosen);
    pthread_mutex_unlock(&platform_lock);
    return ret;
}

/* ---- validation and paths ---- */

struct sb_paths {
    char dir[PATH_MAX];
    char image[PATH_MAX];
    char layer[PATH_MAX];
    char upper[PATH_MAX];
    char work[PATH_MAX];
    char rootfs[PATH_MAX];
    char config[PATH_MAX];
    char log[PATH_MAX];
};

static int check_id(const char *id, struct wr_err *err)
{
    if (!id || strlen(id) != DRIVER_ID_LEN)
        return wr_err_set(err, EINVAL, "sandbox id must be %d characters", DRIVER_ID_LEN);
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
            return wr_err_set(err, EINVAL, "sandbox id \"%s\" has characters outside [a-z0-9-]",
                              id);
    return 0;
}

/* overlayfs takes its directories in a comma- and colon-separated option string. */
static int check_overlay_path(const char *what, const char *p, struct wr_err *err)
{
    if (!p || p[0] != '/')
        return wr_err_set(err, EINVAL, "%s must be an absolute path", what);
    if (strpbrk(p, ",:\\\n"))
        return wr_err_set(err, EINVAL, "%s \"%s\" contains ',', ':' or '\\'", what, p);
    if (strlen(p) > PATH_MAX - 64)
        return wr_err_set(err, ENAMETOOLONG, "%s is too long", what);
    return 0;
}

static void fill_paths(struct sb_paths *sp, const char *dir)
{
    snprintf(sp->dir, sizeof(sp->dir), "%s", dir);
    size_t n = strlen(sp->dir);
    while (n > 1 && sp->dir[n - 1] == '/')
        sp->dir[--n] = '\0';
    snprintf(sp->image, sizeof(sp->image), "%s/layer.img", sp->dir);
    snprintf(sp->layer, sizeof(sp->layer), "%s/layer", sp->dir);
    snprintf(sp->upper, sizeof(sp->upper), "%s/upper", sp->layer);
    snprintf(sp->work, sizeof(sp->work), "%s/work", sp->layer);
    snprintf(sp->rootfs, sizeof(sp->rootfs), "%s/rootfs", sp->dir);
    snprintf(sp->config, sizeof(sp->config), "%s/config.json", sp->dir);
    snprintf(sp->log, sizeof(sp->log), "%s/agent.log", sp->dir);
}

/* Resolves spec->dir to its canonical path (mountinfo shows canonical paths). Returns 1 if it
 * exists, 0 if it does not (paths filled from the given name), -1 on error. */
static int resolve_dir(const struct driver_spec *spec, struct sb_paths *sp, struct wr_err *err)
{
    if (!conf.configured)
        return wr_err_set(err, EINVAL, "the gvisor driver was not configured");
    if (check_id(spec->id, err) < 0)
        return -1;
    if (check_overlay_path("sandbox directory", spec->dir, err) < 0)
        return -1;
    char real[PATH_MAX];
    if (!realpath(spec->dir, real)) {
        if (errno == ENOENT) {
            fill_paths(sp, spec->dir);
            return 0;
        }
        return wr_err_sys(err, errno, "resolving %s", spec->dir);
    }
    if (!strcmp(real, "/"))
        return wr_err_set(err, EINVAL, "refusing to use / as a sandbox directory");
    if (check_overlay_path("sandbox directory", real, err) < 0)
        return -1;
    fill_paths(sp, real);
    return 1;
}

/* ---- mounts ---- */

static int mount_overlay(const struct sb_paths *sp, const char *lower, struct wr_err *err)
{
    int n = disk_mount_count(sp->rootfs, NULL, 0);
    if (n < 0)
        return wr_err_sys(err, errno, "reading /proc/self/mountinfo");
    if (n > 0)
        return 0;
    char opts[3 * PATH_MAX + 64];
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s,index=off", lower, sp->upper,
             sp->work);
    if (mount("overlay", sp->rootfs, "overlay", MS_NODEV, opts) < 0)
        return wr_err_sys(err, errno, "mounting the overlay at %s", sp->rootfs);
    return 0;
}

/* ---- removing trees without following symlinks or crossing mounts ---- */

struct rm_ctx {
    int topfd;
    dev_t dev;
    unsigned long seq;
    bool moved;
};

#define RM_MAX_DEPTH 32

static int rm_entry(struct rm_ctx *c, int dfd, const char *name, int depth, struct wr_err *err);

/* Removes the contents of directory dfd. Directories deeper than RM_MAX_DEPTH are moved up
 * to the top directory (and removed by a later pass), so fd use stays bounded. */
static int rm_children(struct rm_ctx *c, int dfd, int depth, struct wr_err *err)
{
    for (int pass = 0; pass < 4; pass++) {
        int dup_fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
        if (dup_fd < 0)
            return wr_err_sys(err, errno, "dup");
        DIR *d = fdopendir(dup_fd);
        if (!d) {
            close(dup_fd);
            return wr_err_sys(err, errno, "fdopendir");
        }
        rewinddir(d);
        int removed = 0, left = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            left++;
            if (rm_entry(c, dfd, de->d_name, depth, err) < 0) {
                closedir(d);
                return -1;
            }
            removed++;
        }
        closedir(d);
        if (left == 0 || removed == 0)
            return 0;
    }
    return 0;
}

static int rm_entry(struct rm_ctx *c, int dfd, const char *name, int depth, struct wr_err *err)
{
    struct statx stx;
    if (statx(dfd, name, AT_SYMLINK_NOFOLLOW, STATX_TYPE, &stx) < 0)
        return errno == ENOENT ? 0 : wr_err_sys(err, errno, "stat %s", name);
    if (!S_ISDIR(stx.stx_mode)) {
        if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
            return wr_err_sys(err, errno, "removing %s", name);
        return 0;
    }
    if ((stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
        (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT))
        return wr_err_set(err, EBUSY, "refusing to remove %s: a file system is mounted there",
                          name);
    if (makedev(stx.stx_dev_major, stx.stx_dev_minor) != c->dev)
        return wr_err_set(err, EXDEV, "refusing to remove %s: it is on another file system", name);
    if (depth >= RM_MAX_DEPTH) {
        for (;;) {
            char tmp[64];
            snprintf(tmp, sizeof(tmp), ".wr-rm-%lu", c->seq++);
            if (renameat2(dfd, name, c->topfd, tmp, RENAME_NOREPLACE) == 0)
                break;
            if (errno != EEXIST)
                return wr_err_sys(err, errno, "moving %s up", name);
        }
        c->moved = true;
        return 0;
    }
    int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0)
        return errno == ENOENT ? 0 : wr_err_sys(err, errno, "opening %s", name);
    int r = rm_children(c, sub, depth + 1, err);
    close(sub);
    if (r < 0)
        return -1;
    if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
        return wr_err_sys(err, errno, "removing directory %s", name);
    return 0;
}

/* Removes dirfd/name recursively. */
static int remove_tree_at(int dirfd, const char *name, struct wr_err *err)
{
    cleanup_close int top = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (top < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno == ENOTDIR || errno == ELOOP) {
            if (unlinkat(dirfd, name, 0) < 0 && errno != ENOENT)
                return wr_err_sys(err, errno, "removing %s", name);
            return 0;
        }
        return wr_err_sys(err, errno, "opening %s", name);
    }
    struct stat st;
    if (fstat(top, &st) < 0)
        return wr_err_sys(err, errno, "stat %s", name);
    struct rm_ctx c = {.topfd = top, .dev = st.st_dev};
    do {
        c.moved = false;
        if (rm_children(&c, top, 0, err) < 0)
            return wr_err_prefix(err, "removing %s", name);
    } while (c.moved);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
        return wr_err_sys(err, errno, "removing directory %s", name);
    return 0;
}

/* ---- the writable layer ---- */

static int mkdir_p1(const char *p, mode_t mode, struct wr_err *err)
{
    if (mkdir(p, mode) < 0 && errno != EEXIST)
        return wr_err_sys(err, errno, "creating %s", p);
    return 0;
}

/* Makes name in dirfd a real directory (not a symlink or file the sandbox left there). */
static int ensure_dir_at(int dirfd, const char *name, mode_t mode, struct wr_err *err)
{
    if (mkdirat(dirfd, name, mode) == 0)
        goto chmod;
    if (errno != EEXIST)
        return wr_err_sys(err, errno, "creating /%s in the sandbox", name);
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return wr_err_sys(err, errno, "stat /%s in the sandbox", name);
    if (S_ISDIR(st.st_mode))
        return 0;
    if (unlinkat(dirfd, name, 0) < 0 || mkdirat(dirfd, name, mode) < 0)
        return wr_err_sys(err, errno, "replacing /%s in the sandbox", name);
chmod:
    /* mkdirat's mode went through the umask. */
    if (fchmodat(dirfd, name, mode, 0) < 0)
        return wr_err_sys(err, errno, "chmod /%s in the sandbox", name);
    return 0;
}

/* Makes dir/name (dir relative to root) an empty-or-existing regular file, replacing whatever
 * else the sandbox may have put there. */
static int ensure_file_at(int root, const char *dir, const char *name, mode_t mode,
                          struct wr_err *err)
{
    cleanup_close int dfd = openat(root, dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return wr_err_sys(err, errno, "opening /%s in the sandbox", dir);
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISREG(st.st_mode))
            return 0;
        if (remove_tree_at(dfd, name, err) < 0)
            return -1;
    }
    cleanup_close int fd =
        openat(dfd, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return wr_err_sys(err, errno, "creating /%s/%s in the sandbox", dir, name);
    return 0;
}

/*
 * Prepares the root through the mounted overlay, never following links the sandbox may have
 * planted (they would resolve on the host): /workspace (the working directory), the mount
 * point for the agent binary, and a file in /tmp. runsc mounts a tmpfs over /tmp when the
 * image's /tmp is empty; a tmpfs there would hold files in sandbox memory (a big pip build
 * could get the whole sandbox OOM-killed), so /tmp is kept non-empty and stays on the
 * writable layer like any other directory.
 */
static int prepare_root(const struct sb_paths *sp, struct wr_err *err)
{
    cleanup_close int root = open(sp->rootfs, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (root < 0)
        return wr_err_sys(err, errno, "opening %s", sp->rootfs);
    if (ensure_dir_at(root, "workspace", 0755, err) < 0 ||
        ensure_dir_at(root, ".withruntime", 0755, err) < 0 ||
        ensure_dir_at(root, "tmp", 01777, err) < 0)
        return -1;
    if (ensure_file_at(root, ".withruntime", "agent", 0755, err) < 0 ||
        ensure_file_at(root, "tmp", ".withruntime", 0644, err) < 0)
        return -1;
    return 0;
}

/* ---- the OCI spec ---- */

static json_t *str_array(const char *const *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

static json_t *mount_obj(const char *dst, const char *type, const char *src,
                         const char *const *opts, size_t nopts)
{
    json_t *m = json_pack("{s:s, s:s, s:s}", "destination", dst, "type", type, "source", src);
    if (nopts)
        json_object_set_new(m, "options", str_array(opts, nopts));
    return m;
}

static json_t *build_spec(const struct driver_spec *spec, const struct sb_paths *sp)
{
    static const char *const env[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "LANG=C.UTF-8",
    };
    static const char *const ns[] = {"pid", "network", "ipc", "uts", "mount"};
    static const char *const dev_opts[] = {"nosuid", "strictatime", "mode=755", "size=65536k"};
    static const char *const pts_opts[] = {"nosuid", "noexec", "newinstance", "ptmxmode=0666",
                                           "mode=0620"};
    static const char *const shm_opts[] = {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"};
    static const char *const sys_opts[] = {"nosuid", "noexec", "nodev", "ro"};
    static const char *const agent_opts[] = {"bind", "ro"};

    size_t ncaps = WR_ARRAY_LEN(sandbox_caps);
    json_t *caps =
        json_pack("{s:o, s:o, s:o}", "bounding", str_array(sandbox_caps, ncaps), "effective",
                  str_array(sandbox_caps, ncaps), "permitted", str_array(sandbox_caps, ncaps));
    /* RLIMIT_AS = the sandbox's memory: one process that allocates past it gets ENOMEM inside
     * instead of pushing the host cgroup over its limit, which would kill the whole sandbox.
     * (Many processes together can still do that; the daemon then reports reason "oom".) */
    json_int_t as = (json_int_t)spec->memory_mib << 20;
    json_t *rlimits =
        json_pack("[{s:s, s:I, s:I}, {s:s, s:I, s:I}, {s:s, s:I, s:I}]", "type", "RLIMIT_NOFILE",
                  "hard", (json_int_t)65536, "soft", (json_int_t)65536, "type", "RLIMIT_NPROC",
                  "hard", (json_int_t)spec->pids_max, "soft", (json_int_t)spec->pids_max, "type",
                  "RLIMIT_AS", "hard", as, "soft", as);
    json_t *process =
        json_pack("{s:b, s:{s:i, s:i}, s:[s], s:o, s:s, s:o, s:o}", "terminal", 0, "user", "uid", 0,
                  "gid", 0, "args", "/.withruntime/agent", "env", str_array(env, WR_ARRAY_LEN(env)),
                  "cwd", "/workspace", "capabilities", caps, "rlimits", rlimits);

    json_t *mounts = json_array();
    json_array_append_new(mounts, mount_obj("/proc", "proc", "proc", NULL, 0));
    json_array_append_new(mounts,
                          mount_obj("/dev", "tmpfs", "tmpfs", dev_opts, WR_ARRAY_LEN(dev_opts)));
    json_array_append_new(
        mounts, mount_obj("/dev/pts", "devpts", "devpts", pts_opts, WR_ARRAY_LEN(pts_opts)));
    json_array_append_new(mounts,
                          mount_obj("/dev/shm", "tmpfs", "shm", shm_opts, WR_ARRAY_LEN(shm_opts)));
    json_array_append_new(mounts,
                          mount_obj("/sys", "sysfs", "sysfs", sys_opts, WR_ARRAY_LEN(sys_opts)));
    json_array_append_new(mounts, mount_obj("/.withruntime/agent", "bind", spec->agent_path,
                                            agent_opts, WR_ARRAY_LEN(agent_opts)));

    json_t *namespaces = json_array();
    for (size_t i = 0; i < WR_ARRAY_LEN(ns); i++)
        json_array_append_new(namespaces, json_pack("{s:s}", "type", ns[i]));
    char cgpath[128];
    cgroup_runsc_path(spec->id, cgpath, sizeof(cgpath));

    return json_pack("{s:s, s:o, s:{s:s, s:b}, s:s, s:o, s:{s:o, s:s}}", "ociVersion", "1.0.2",
                     "process", process, "root", "path", sp->rootfs, "readonly", 0, "hostname",
                     spec->id, "mounts", mounts, "linux", "namespaces", namespaces, "cgroupsPath",
                     cgpath);
}

static int write_spec(const struct driver_spec *spec, const struct sb_paths *sp, struct wr_err *err)
{
    json_t *j = build_spec(spec, sp);
    if (!j)
        return wr_err_set(err, ENOMEM, "building the OCI spec");
    cleanup_free char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!text)
        return wr_err_set(err, ENOMEM, "serialising the OCI spec");
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", sp->config);
    cleanup_close int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return wr_err_sys(err, errno, "creating %s", tmp);
    if (write_all(fd, text, strlen(text)) < 0)
        return wr_err_sys(err, errno, "writing %s", tmp);
    if (rename(tmp, sp->config) < 0)
        return wr_err_sys(err, errno, "renaming %s", tmp);
    return 0;
}

/* ---- runsc state ---- */

/* Returns 1 if runsc has any state for id (fixed-width ids: a prefix match is exact). */
static int runsc_has_state(const char *id)
{
    DIR *d = opendir(conf.runsc_root);
    if (!d)
        return 0;
    size_t n = strlen(id);
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        const char *name = de->d_name;
        if (!strncmp(name, "runsc-", 6))
            name += 6;
        found = !strncmp(name, id, n);
    }
    closedir(d);
    return found;
}

/* Copies the last non-empty line written to the log at path after offset `from` into out. */
static void log_tail_line(const char *path, off_t from, char *out, size_t outlen)
{
    out[0] = '\0';
    cleanup_close int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || st.st_size <= from)
        return;
    off_t start = st.st_size - from > 1024 ? st.st_size - 1024 : from;
    char buf[1025];
    ssize_t n = pread(fd, buf, 1024, start);
    if (n <= 0)
        return;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        n--;
    buf[n] = '\0';
    char *line = strrchr(buf, '\n');
    snprintf(out, outlen, "%s", line ? line + 1 : buf);
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
        struct runsc_cmd c;
        runsc_init(&c, NULL, dir_exists ? sp->dir : NULL);
        runsc_add(&c, "delete");
        runsc_add(&c, "--force");
        runsc_add(&c, spec->id);
        char out[2048];
        struct wr_err e;
        if (proc_run(c.argv, RUNSC_DELETE_TIMEOUT_MS, out, sizeof(out), &e) < 0 &&
            !is_not_found(e.msg)) {
            /* Kill what runs by its cgroup, then let runsc clean up its state. */
            cgroup_destroy(spec->id, CGROUP_KILL_TIMEOUT_MS, NULL);
            if (proc_run(c.argv, RUNSC_DELETE_TIMEOUT_MS, out, sizeof(out), &e) < 0 &&
                !is_not_found(e.msg)) {
                wr_err_set(err, e.code, "runsc delete: %s", e.msg);
                ret = -1;
            }
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
    if (check_overlay_path("image root filesystem", spec->image_rootfs, err) < 0)
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
    if (platform_get(platform, sizeof(platform), err) < 0)
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
    if (mkdir_p1(conf.runsc_root, 0700, err) < 0 || mkdir_p1(sp.upper, 0755, err) < 0 ||
        mkdir_p1(sp.work, 0700, err) < 0 || mkdir_p1(sp.rootfs, 0755, err) < 0)
        goto fail;
    if (mount_overlay(&sp, spec->image_rootfs, err) < 0)
        goto fail;
    if (prepare_root(&sp, err) < 0 || write_spec(spec, &sp, err) < 0)
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

    /* `run --detach` is create + start in one runsc process: ~30 ms faster here. */
    struct runsc_cmd c;
    runsc_init(&c, platform, sp.dir);
    runsc_add(&c, "run");
    runsc_add(&c, "--detach");
    runsc_add(&c, "--bundle");
    runsc_add(&c, sp.dir);
    runsc_add(&c, spec->id);
    uint64_t t1 = now_ms_monotonic();
    pid_t pid = proc_spawn(c.argv, NULL, sv[1], sv[1], logfd, err);
    if (pid < 0)
        goto fail;
    int status = 0;
    if (proc_wait(pid, &status, RUNSC_RUN_TIMEOUT_MS, err) < 0)
        goto fail;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char line[400];
        log_tail_line(sp.log, log_start, line, sizeof(line));
        wr_err_set(err, EIO, "runsc run failed (%s %d): %s",
                   WIFEXITED(status) ? "status" : "signal",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                   line[0] ? line : "see agent.log");
        goto fail;
    }
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
    if (remove_tree_at(parent, base, err) < 0)
        return wr_err_prefix(err, "destroying %s", spec->id);
    return 0;
}

static int gv_is_running(const struct driver_spec *spec, struct wr_err *err)
{
    if (!conf.configured)
        return wr_err_set(err, EINVAL, "the gvisor driver was not configured");
    if (check_id(spec->id, err) < 0)
        return -1;
    if (!runsc_has_state(spec->id))
        return 0;
    struct runsc_cmd c;
    runsc_init(&c, NULL, NULL);
    runsc_add(&c, "state");
    runsc_add(&c, spec->id);
    char out[8192];
    struct wr_err e;
    if (proc_run(c.argv, RUNSC_STATE_TIMEOUT_MS, out, sizeof(out), &e) < 0) {
        if (is_not_found(e.msg))
            return 0;
        return wr_err_set(err, e.code, "runsc state %s: %s", spec->id, e.msg);
    }
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    const char *status = NULL;
    if (!j || json_unpack(j, "{s:s}", "status", &status) < 0) {
        json_decref(j);
        return wr_err_set(err, EIO, "runsc state %s: unexpected output", spec->id);
    }
    int running = !strcmp(status, "running");
    json_decref(j);
    return running;
}

static int gv_stats(const struct driver_spec *spec, struct driver_stats *out, struct wr_err *err)
{
    memset(out, 0, sizeof(*out));
    if (check_id(spec->id, err) < 0)
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

int gvisor_runsc_version(char *out, size_t outlen, struct wr_err *err)
{
    char *argv[] = {"runsc", "--version", NULL};
    char buf[512];
    if (proc_run(argv, 5000, buf, sizeof(buf), err) < 0)
        return wr_err_prefix(err, "runsc is not usable (install it from bookworm-backports)");
    const char *v = strstr(buf, "version ");
    if (!v)
        return wr_err_set(err, EIO, "runsc --version printed no version");
    v += 8;
    size_t n = strcspn(v, " \n");
    snprintf(out, outlen, "%.*s", (int)n, v);
    return 0;
}

int gvisor_runsc_too_old(const char *version)
{
    const char *tilde = strchr(version, '~');
    long date = tilde ? strtol(tilde + 1, NULL, 10) : 0;
    return date > 0 && date < RUNSC_MIN_DATE;
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
    if (!conf.configured)
        return wr_err_set(err, EINVAL, "the gvisor driver was not configured");
    char platform[16];
    if (platform_get(platform, sizeof(platform), err) < 0)
        return -1;
    if (conf.platform_override[0] && platform_try(platform, err) < 0)
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
