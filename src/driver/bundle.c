/*
 * The OCI bundle runsc runs, in the sandbox's directory: the paths of that directory, the
 * host overlayfs that is the container's root (lower = the shared image, upper and work on
 * the sandbox's mounted layer), the root's preparation for the agent, and config.json.
 *
 * The sandbox can write anything to its root, so everything done to it here goes through
 * directory fds and never follows a link the sandbox may have planted (it would resolve on
 * the host), and tree removal never leaves the file system it started on.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/util.h"
#include "driver/cgroup.h"
#include "driver/disk.h"
#include "driver/gvisor_internal.h"

/* CAP_SYS_ADMIN is the agent's alone: it puts commands in a child pid namespace, out of reach
 * of kill -9 1, and drops it from every command (src/agent/pidns.c). */
static const char *const sandbox_caps[] = {
    "CAP_CHOWN",       "CAP_DAC_OVERRIDE",     "CAP_FSETID",     "CAP_FOWNER",
    "CAP_MKNOD",       "CAP_SETGID",           "CAP_SETUID",     "CAP_SETFCAP",
    "CAP_SETPCAP",     "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE", "CAP_SYS_ADMIN",
};

/* ---- paths ---- */

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
    snprintf(sp->resolv, sizeof(sp->resolv), "%s/resolv.conf", sp->dir);
    snprintf(sp->cabundle, sizeof(sp->cabundle), "%s/ca-certificates.crt", sp->dir);
}

int bundle_paths(const char *dir, struct sb_paths *sp, struct wr_err *err)
{
    if (driver_check_overlay_path("sandbox directory", dir, err) < 0)
        return -1;
    char real[PATH_MAX];
    if (!realpath(dir, real)) {
        if (errno == ENOENT) {
            fill_paths(sp, dir);
            return 0;
        }
        return wr_err_sys(err, errno, "resolving %s", dir);
    }
    if (!strcmp(real, "/"))
        return wr_err_set(err, EINVAL, "refusing to use / as a sandbox directory");
    if (driver_check_overlay_path("sandbox directory", real, err) < 0)
        return -1;
    fill_paths(sp, real);
    return 1;
}

/* ---- mounts ---- */

int bundle_mount_overlay(const struct sb_paths *sp, const char *lower, struct wr_err *err)
{
    int n = disk_mount_count(sp->rootfs, NULL, 0);
    if (n < 0)
        return wr_err_sys(err, errno, "reading /proc/self/mountinfo");
    if (n > 0)
        return 0;
    char opts[3 * PATH_MAX + 64];
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s,index=off", lower, sp->upper,
             sp->work);
    /* nodev, nosuid: what a sandbox writes (a device node, a setuid-root binary) means nothing
     * on the host. gVisor applies the modes inside on its own, so setuid still works there. */
    if (mount("overlay", sp->rootfs, "overlay", MS_NODEV | MS_NOSUID, opts) < 0)
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
int bundle_remove_tree_at(int dirfd, const char *name, struct wr_err *err)
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

int bundle_mkdir(const char *p, mode_t mode, struct wr_err *err)
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
        if (bundle_remove_tree_at(dfd, name, err) < 0)
            return -1;
    }
    cleanup_close int fd =
        openat(dfd, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return wr_err_sys(err, errno, "creating /%s/%s in the sandbox", dir, name);
    return 0;
}

/*
 * /etc/hosts, when the sandbox has none (our image has none; the user may edit or replace it,
 * and it is theirs from then on): without it neither "localhost" nor the sandbox's own name
 * resolves, and every try is a lookup its resolver refuses and logs. Both names get an IPv4 and
 * an IPv6 line, as getent and getaddrinfo ask for both and a family missing here would go to the
 * resolver. The host name takes 127.0.1.1, as on Debian, so that it is what 127.0.1.1 (and not
 * 127.0.0.1) is called. Written through the overlay into the sandbox's own layer; a link or
 * anything else in its place is left alone, never followed.
 */
static int ensure_hosts_at(int root, const char *hostname, struct wr_err *err)
{
    cleanup_close int etc = openat(root, "etc", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (etc < 0)
        return 0; /* the sandbox made /etc something else: its own doing */
    cleanup_close int fd =
        openat(etc, "hosts", O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno == EEXIST ? 0 : wr_err_sys(err, errno, "creating /etc/hosts in the sandbox");
    char text[256];
    int n = snprintf(text, sizeof(text),
                     "127.0.0.1\tlocalhost\n"
                     "::1\tlocalhost ip6-localhost ip6-loopback\n"
                     "127.0.1.1\t%s\n"
                     "::1\t%s\n",
                     hostname, hostname);
    if (n < 0 || (size_t)n >= sizeof(text)) {
        unlinkat(etc, "hosts", 0);
        return wr_err_set(err, ENAMETOOLONG, "host name too long for /etc/hosts");
    }
    if (write_all(fd, text, (size_t)n) < 0 || fchmod(fd, 0644) < 0) {
        int e = errno;
        unlinkat(etc, "hosts", 0); /* the next start tries again */
        return wr_err_sys(err, e, "writing /etc/hosts in the sandbox");
    }
    return 0;
}

/*
 * Prepares the root through the mounted overlay, never following links the sandbox may have
 * planted (they would resolve on the host): /workspace (the working directory), the mount
 * point for the agent binary, a file in /tmp, and /etc/hosts if there is none. runsc mounts a
 * tmpfs over /tmp when the image's /tmp is empty; a tmpfs there would hold files in sandbox
 * memory (a big pip build could get the whole sandbox OOM-killed), so /tmp is kept non-empty
 * and stays on the writable layer like any other directory.
 */
int bundle_prepare_root(const struct sb_paths *sp, const char *hostname, struct wr_err *err)
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
    return ensure_hosts_at(root, hostname, err);
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

/*
 * The sandbox's process cap (RLIMIT_NPROC, which the agent also sets as its commands' pids
 * cgroup limit): pids_max, but no more than memory_mib/16 (at least 16). Held at the cap, a
 * fork bomb's copies of python take up to ~10 MiB of host memory each (measured: 64 of them
 * took a 512 MiB sandbox down through the host's OOM killer), and hundreds of tasks forking
 * at once starve the agent inside the sentry.
 */
int bundle_nproc(int memory_mib, int pids_max)
{
    int n = memory_mib / 16;
    if (n < 16)
        n = 16;
    return n < pids_max ? n : pids_max;
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
    static const char *const proc_opts[] = {"nosuid", "noexec", "nodev"};
    static const char *const agent_opts[] = {"bind", "ro", "nosuid", "nodev"};

    size_t ncaps = WR_ARRAY_LEN(sandbox_caps);
    json_t *caps =
        json_pack("{s:o, s:o, s:o}", "bounding", str_array(sandbox_caps, ncaps), "effective",
                  str_array(sandbox_caps, ncaps), "permitted", str_array(sandbox_caps, ncaps));
    /* RLIMIT_AS = the sandbox's memory: one process that allocates past it gets ENOMEM inside
     * instead of pushing the host cgroup over its limit, which would kill the whole sandbox.
     * (Many processes together can still do that; the daemon then reports reason "oom".) */
    json_int_t as = (json_int_t)spec->memory_mib << 20;
    json_int_t nproc = bundle_nproc(spec->memory_mib, spec->pids_max);
    json_t *rlimits =
        json_pack("[{s:s, s:I, s:I}, {s:s, s:I, s:I}, {s:s, s:I, s:I}]", "type", "RLIMIT_NOFILE",
                  "hard", (json_int_t)65536, "soft", (json_int_t)65536, "type", "RLIMIT_NPROC",
                  "hard", nproc, "soft", nproc, "type", "RLIMIT_AS", "hard", as, "soft", as);
    json_t *process =
        json_pack("{s:b, s:{s:i, s:i}, s:[s], s:o, s:s, s:o, s:o}", "terminal", 0, "user", "uid", 0,
                  "gid", 0, "args", "/.withruntime/agent", "env", str_array(env, WR_ARRAY_LEN(env)),
                  "cwd", "/workspace", "capabilities", caps, "rlimits", rlimits);

    json_t *mounts = json_array();
    json_array_append_new(mounts,
                          mount_obj("/proc", "proc", "proc", proc_opts, WR_ARRAY_LEN(proc_opts)));
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

    if (spec->netns_fd > 0 && spec->nameserver[0]) {
        static const char *const resolv_opts[] = {"bind", "ro", "nosuid", "nodev", "noexec"};
        json_array_append_new(mounts, mount_obj("/etc/resolv.conf", "bind", sp->resolv, resolv_opts,
                                                WR_ARRAY_LEN(resolv_opts)));
    }

    if (spec->extra_ca_pem && spec->extra_ca_pem[0]) {
        static const char *const ca_opts[] = {"bind", "ro", "nosuid", "nodev", "noexec"};
        json_array_append_new(mounts, mount_obj("/etc/ssl/certs/ca-certificates.crt", "bind",
                                                sp->cabundle, ca_opts, WR_ARRAY_LEN(ca_opts)));
    }

    json_t *namespaces = json_array();
    for (size_t i = 0; i < WR_ARRAY_LEN(ns); i++) {
        json_t *n = json_pack("{s:s}", "type", ns[i]);
        if (!strcmp(ns[i], "network") && spec->netns_fd > 0) {
            /* The daemon holds the namespace by an fd, never by a name: runsc opens it through
             * the daemon's fd table. */
            char path[64];
            snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)getpid(), spec->netns_fd);
            json_object_set_new(n, "path", json_string(path));
        }
        json_array_append_new(namespaces, n);
    }
    char cgpath[128];
    cgroup_runsc_path(spec->id, cgpath, sizeof(cgpath));

    return json_pack("{s:s, s:o, s:{s:s, s:b}, s:s, s:o, s:{s:o, s:s}}", "ociVersion", "1.0.2",
                     "process", process, "root", "path", sp->rootfs, "readonly", 0, "hostname",
                     spec->id, "mounts", mounts, "linux", "namespaces", namespaces, "cgroupsPath",
                     cgpath);
}

/* Writes path whole through a temporary file and a rename. */
static int write_file_atomic(const char *path, const char *text, mode_t mode, struct wr_err *err)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    cleanup_close int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return wr_err_sys(err, errno, "creating %s", tmp);
    if (write_all(fd, text, strlen(text)) < 0)
        return wr_err_sys(err, errno, "writing %s", tmp);
    if (rename(tmp, path) < 0)
        return wr_err_sys(err, errno, "renaming %s", tmp);
    return 0;
}

/* The image's CA bundle (a file of the shared, read-only image we built) followed by the
 * daemon's extra certificates, written to sp->cabundle. */
static int write_ca_bundle(const struct driver_spec *spec, const struct sb_paths *sp,
                           struct wr_err *err)
{
    char src[PATH_MAX + 64];
    snprintf(src, sizeof(src), "%s/etc/ssl/certs/ca-certificates.crt", spec->image_rootfs);
    cleanup_close int in = open(src, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        return wr_err_sys(err, errno, "opening the image's CA bundle %s", src);
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", sp->cabundle);
    cleanup_close int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (out < 0)
        return wr_err_sys(err, errno, "creating %s", tmp);
    char buf[65536];
    for (;;) {
        ssize_t n = read(in, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return wr_err_sys(err, errno, "reading %s", src);
        if (n == 0)
            break;
        if (write_all(out, buf, (size_t)n) < 0)
            return wr_err_sys(err, errno, "writing %s", tmp);
    }
    if (write_all(out, "\n", 1) < 0 ||
        write_all(out, spec->extra_ca_pem, strlen(spec->extra_ca_pem)) < 0)
        return wr_err_sys(err, errno, "writing %s", tmp);
    if (rename(tmp, sp->cabundle) < 0)
        return wr_err_sys(err, errno, "renaming %s", tmp);
    return 0;
}

int bundle_write_spec(const struct driver_spec *spec, const struct sb_paths *sp, struct wr_err *err)
{
    if (spec->extra_ca_pem && spec->extra_ca_pem[0] && write_ca_bundle(spec, sp, err) < 0)
        return -1;
    if (spec->netns_fd > 0 && spec->nameserver[0]) {
        /* The sandbox's only resolver is its gateway's; the file is the host's (mounted
         * read-only), so a start always brings the current address. */
        char text[96];
        snprintf(text, sizeof(text), "nameserver %s\noptions ndots:0\n", spec->nameserver);
        if (write_file_atomic(sp->resolv, text, 0644, err) < 0)
            return -1;
    }
    json_t *j = build_spec(spec, sp);
    if (!j)
        return wr_err_set(err, ENOMEM, "building the OCI spec");
    cleanup_free char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!text)
        return wr_err_set(err, ENOMEM, "serialising the OCI spec");
    return write_file_atomic(sp->config, text, 0644, err);
}
