/*
 * A sandbox's storage on the host: finding and undoing mounts, and the ext4 image behind
 * each sandbox's writable layer (its disk quota), attached through a loop device.
 *
 * Why an image: the host's filesystem has no project quotas, and nothing else caps what a
 * directory tree may hold. Measured here (2 vCPUs, ext4 host), a sparse image costs ~10 ms
 * of mke2fs for 10 GiB (~60 ms for 1 TiB) and a few ms to attach and mount; with
 * LO_FLAGS_DIRECT_IO the loop device wrote 1 GiB at ~1.4 GB/s against ~170 MB/s without
 * (buffered, every page is cached twice, in the image's filesystem and in the host's).
 *
 * Choices in mke2fs and mount, and why:
 *   - a journal: a host crash leaves a filesystem that mounts (the journal replays) rather
 *     than one that needs fsck; lazy_journal_init skips writing it at mkfs.
 *   - discard at mkfs: on a regular file it punches holes, which read back as zeros, so
 *     mke2fs marks the inode tables zeroed. With nodiscard the kernel's ext4lazyinit thread
 *     would write zeros over every inode table after mount (host space and I/O for nothing).
 *   - no resize_inode: halves mkfs time; growing an image offline still works without it.
 *   - -m 0: no blocks reserved for root; the sandbox is root and gets its whole quota.
 *   - -T default -b 4096: small images would otherwise get 1 KiB blocks.
 *   - mount -o discard: freed blocks are punched out of the image at the next journal
 *     commit, so the host holds about what the sandbox holds, not its high-water mark.
 *
 * The layout is the caller's; this file only knows "an image" and "a mount point".
 */
#include "driver/disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/proc.h"
#include "common/util.h"

#define DISK_BLOCK_SIZE 4096
#define MKFS_TIMEOUT_MS 60000
#define LOOP_ATTACH_TRIES 64
#define RELEASE_WAIT_MS 2000 /* a stop or destroy waits this long for the device to let go */
#define REUSE_WAIT_MS 200    /* a start waits this long before using a still-bound device */

/* ext4's (and XFS's) shutdown ioctl, not in the uapi headers of every libc */
#ifndef EXT4_IOC_SHUTDOWN
#define EXT4_IOC_SHUTDOWN _IOR('X', 125, uint32_t)
#endif
#define EXT4_GOING_FLAGS_NOLOGFLUSH 0x2

/* ---- the mount table ---- */

/* Undoes mountinfo's octal escapes (\040 etc.) in place. */
static void unescape_mountinfo(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

int disk_mount_count(const char *path, char *first, size_t firstlen)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -1;
    size_t plen = strlen(path);
    int count = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        char *save = NULL, *mp = NULL;
        char *tok = strtok_r(line, " ", &save);
        for (int i = 0; tok && i < 4; i++)
            tok = strtok_r(NULL, " ", &save);
        mp = tok;
        if (!mp)
            continue;
        unescape_mountinfo(mp);
        if (!strncmp(mp, path, plen) && (mp[plen] == '\0' || mp[plen] == '/')) {
            if (count == 0 && first)
                snprintf(first, firstlen, "%s", mp);
            count++;
        }
    }
    free(line);
    fclose(f);
    return count;
}

int disk_unmount_all(const char *id, const char *path, struct wr_err *err)
{
    for (int i = 0; i < 16; i++) {
        char first[PATH_MAX];
        int n = disk_mount_count(path, first, sizeof(first));
        if (n < 0)
            return wr_err_sys(err, errno, "reading /proc/self/mountinfo");
        if (n == 0)
            return 0;
        if (umount2(first, UMOUNT_NOFOLLOW) == 0)
            continue;
        if (errno == EBUSY) {
            log_warn(id, "disk.umount_lazy", "path=\"%s\"", first);
            if (umount2(first, UMOUNT_NOFOLLOW | MNT_DETACH) == 0)
                continue;
        }
        if (errno != EINVAL && errno != ENOENT)
            return wr_err_sys(err, errno, "unmounting %s", first);
    }
    return wr_err_set(err, EBUSY, "%s is still mounted after unmounting it", path);
}

/* ---- loop devices ---- */

/* Reads a small sysfs file into buf without its trailing newline. Returns 0 or -1. */
static int read_sysfs(const char *path, char *buf, size_t len)
{
    cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, len - 1);
    if (n < 0)
        return -1;
    while (n > 0 && buf[n - 1] == '\n')
        n--;
    buf[n] = '\0';
    return 0;
}

/* Returns 1 if the loop device /dev/<name> is bound to the file st describes, else 0. */
static int loop_backs(const char *name, const struct stat *st)
{
    char dev[64];
    snprintf(dev, sizeof(dev), "/dev/%s", name);
    cleanup_close int fd = open(dev, O_RDONLY | O_CLOEXEC);
    struct loop_info64 info;
    if (fd < 0 || ioctl(fd, LOOP_GET_STATUS64, &info) < 0)
        return 0;
    dev_t d = (dev_t)info.lo_device;
    return info.lo_inode == st->st_ino && major(d) == major(st->st_dev) &&
           minor(d) == minor(st->st_dev);
}

/*
 * Calls fn(name, backing, arg) for each loop device with a backing file ("loop3", its path).
 * Returns 0, or -1 if sysfs cannot be read.
 */
static int loop_each(void (*fn)(const char *name, const char *backing, void *arg), void *arg)
{
    DIR *d = opendir("/sys/block");
    if (!d)
        return -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "loop", 4) || strlen(de->d_name) >= 32)
            continue;
        char path[128], backing[PATH_MAX + 16];
        snprintf(path, sizeof(path), "/sys/block/%s/loop/backing_file", de->d_name);
        if (read_sysfs(path, backing, sizeof(backing)) == 0 && backing[0])
            fn(de->d_name, backing, arg);
    }
    closedir(d);
    return 0;
}

struct loop_match {
    const char *image;
    const struct stat *st;
    char (*names)[32];
    int max, found;
};

static void match_one(const char *name, const char *backing, void *arg)
{
    struct loop_match *m = arg;
    if (strcmp(backing, m->image) || !loop_backs(name, m->st))
        return;
    if (m->found < m->max)
        snprintf(m->names[m->found], sizeof(m->names[m->found]), "%s", name);
    m->found++;
}

/*
 * Finds the loop devices bound to image (st: its stat): candidates by the backing file's
 * path in sysfs, confirmed by device and inode. Copies up to max names ("loop3") into names.
 * Returns how many are bound (may exceed max), or -1 if sysfs cannot be read.
 */
static int loop_find(const char *image, const struct stat *st, char (*names)[32], int max)
{
    struct loop_match m = {.image = image, .st = st, .names = names, .max = max};
    return loop_each(match_one, &m) < 0 ? -1 : m.found;
}

static void count_one(const char *name, const char *backing, void *arg)
{
    (*(int *)arg)++;
}

int disk_loops_bound(void)
{
    int bound = 0;
    return loop_each(count_one, &bound) < 0 ? -1 : bound;
}

int disk_free_mib(const char *path, long long *free_mib)
{
    struct statvfs vfs;
    if (statvfs(path, &vfs) < 0)
        return -1;
    *free_mib = (long long)((unsigned long long)vfs.f_bavail * vfs.f_frsize >> 20);
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/*
 * Lets go of image: every loop device bound to it is told to detach once unused
 * (LOOP_CLR_FD detaches at once if nobody else has it open, else sets autoclear), then this
 * waits up to wait_ms for them to go. Copies the name of one still bound into still (may be
 * NULL). Returns how many are still bound, or -1 if sysfs cannot be read.
 */
static int loop_release(const char *image, const struct stat *st, int wait_ms, char *still,
                        size_t stilllen)
{
    uint64_t deadline = now_ms_monotonic() + (uint64_t)wait_ms;
    int pause = 1;
    for (bool first = true;; first = false) {
        char names[8][32];
        int n = loop_find(image, st, names, (int)WR_ARRAY_LEN(names));
        if (n <= 0)
            return n;
        if (first) {
            for (int i = 0; i < n && i < (int)WR_ARRAY_LEN(names); i++) {
                char dev[64];
                snprintf(dev, sizeof(dev), "/dev/%s", names[i]);
                cleanup_close int fd = open(dev, O_RDONLY | O_CLOEXEC);
                if (fd >= 0)
                    ioctl(fd, LOOP_CLR_FD, 0);
            }
        }
        if (now_ms_monotonic() >= deadline) {
            if (still)
                snprintf(still, stilllen, "%s", names[0]);
            return n;
        }
        sleep_ms(pause);
        pause = pause < 32 ? pause * 2 : pause;
    }
}

/*
 * Binds image to a free loop device (autoclear, direct I/O where the host's filesystem
 * allows it). On success *loopfd is the open device (the caller closes it once the device is
 * mounted; closing it unused detaches it) and dev its path.
 */
static int loop_attach(const char *image, int *loopfd, char *dev, size_t devlen, struct wr_err *err)
{
    *loopfd = -1;
    cleanup_close int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0)
        return wr_err_sys(err, errno, "opening /dev/loop-control (is the loop module there?)");
    bool dio = true;
    for (int attempt = 0; attempt < LOOP_ATTACH_TRIES; attempt++) {
        cleanup_close int file =
            open(image, O_RDWR | O_NOFOLLOW | O_CLOEXEC | (dio ? O_DIRECT : 0));
        if (file < 0 && dio && errno == EINVAL) {
            dio = false; /* the host's filesystem has no O_DIRECT */
            continue;
        }
        if (file < 0)
            return wr_err_sys(err, errno, "opening %s", image);
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0)
            return wr_err_sys(err, errno, "finding a free loop device");
        snprintf(dev, devlen, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT || errno == ENXIO)
                continue; /* removed meanwhile */
            return wr_err_sys(err, errno, "opening %s", dev);
        }
        struct loop_config cfg;
        memset(&cfg, 0, sizeof(cfg));
        cfg.fd = (uint32_t)file;
        cfg.block_size = DISK_BLOCK_SIZE;
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (dio ? LO_FLAGS_DIRECT_IO : 0);
        snprintf((char *)cfg.info.lo_file_name, sizeof(cfg.info.lo_file_name), "%s", image);
        if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) {
            *loopfd = fd;
            return 0;
        }
        int e = errno;
        close(fd);
        if (e == EBUSY)
            continue; /* another start took that device first */
        if (e == EINVAL && dio) {
            dio = false;
            continue;
        }
        return wr_err_sys(err, e, "attaching %s to %s", image, dev);
    }
    return wr_err_set(err, EBUSY, "no free loop device for %s after %d tries", image,
                      LOOP_ATTACH_TRIES);
}

/* ---- the image ---- */

/* mke2fs by absolute path (a daemon's PATH may lack the sbin directories), or NULL. */
static const char *mke2fs_path(void)
{
    static const char *const candidates[] = {"/usr/sbin/mke2fs", "/sbin/mke2fs"};
    for (size_t i = 0; i < WR_ARRAY_LEN(candidates); i++)
        if (access(candidates[i], X_OK) == 0)
            return candidates[i];
    return NULL;
}

int disk_check(struct wr_err *err)
{
    if (!mke2fs_path())
        return wr_err_set(err, ENOENT, "mke2fs is missing (install e2fsprogs)");
    cleanup_close int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0)
        return wr_err_sys(err, errno, "cannot open /dev/loop-control for disk images");
    return 0;
}

int disk_image_create(const char *image, int size_mib, struct wr_err *err)
{
    struct stat st;
    if (lstat(image, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return wr_err_set(err, EINVAL, "%s is not a regular file", image);
        return 0;
    }
    if (errno != ENOENT)
        return wr_err_sys(err, errno, "stat %s", image);
    if (size_mib < DISK_MIN_MIB)
        return wr_err_set(err, EINVAL, "a disk of %d MiB is too small (at least %d)", size_mib,
                          DISK_MIN_MIB);
    const char *mkfs = mke2fs_path();
    if (!mkfs)
        return wr_err_set(err, ENOENT, "mke2fs is missing (install e2fsprogs)");
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", image);
    {
        cleanup_close int fd =
            open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
            return wr_err_sys(err, errno, "creating %s", tmp);
        if (ftruncate(fd, (off_t)size_mib << 20) < 0) {
            int e = errno;
            unlink(tmp);
            return wr_err_sys(err, e, "sizing %s to %d MiB", tmp, size_mib);
        }
    }
    /* mke2fs fsyncs what it wrote before it exits, so the rename publishes a whole image.
     * The options are explained at the top of this file. */
    static const char *const opts[] = {"-t", "ext4",
                                       "-q", "-F",
                                       "-m", "0",
                                       "-b", "4096",
                                       "-T", "default",
                                       "-O", "^resize_inode",
                                       "-E", "lazy_itable_init=1,lazy_journal_init=1,discard"};
    char *argv[WR_ARRAY_LEN(opts) + 3];
    size_t argc = 0;
    argv[argc++] = (char *)mkfs;
    for (size_t i = 0; i < WR_ARRAY_LEN(opts); i++)
        argv[argc++] = (char *)opts[i];
    argv[argc++] = tmp;
    argv[argc] = NULL;
    char out[1024];
    if (proc_run(argv, MKFS_TIMEOUT_MS, out, sizeof(out), err) < 0) {
        unlink(tmp);
        return wr_err_prefix(err, "making the disk image");
    }
    if (rename(tmp, image) < 0) {
        int e = errno;
        unlink(tmp);
        return wr_err_sys(err, e, "renaming %s", tmp);
    }
    return 1;
}

int disk_image_mount(const char *id, const char *image, const char *mountpoint, struct wr_err *err)
{
    if (mkdir(mountpoint, 0700) < 0 && errno != EEXIST)
        return wr_err_sys(err, errno, "creating %s", mountpoint);
    int n = disk_mount_count(mountpoint, NULL, 0);
    if (n < 0)
        return wr_err_sys(err, errno, "reading /proc/self/mountinfo");
    if (n > 0)
        return 0;
    struct stat st;
    if (stat(image, &st) < 0)
        return wr_err_sys(err, errno, "stat %s", image);

    /* Bound already (its mount lives on elsewhere, or a device was left set up): mount that
     * device, sharing its filesystem, rather than the same image through a second device,
     * which would be two filesystems writing to one image. */
    char dev[64] = "", still[32] = "";
    cleanup_close int loopfd = -1;
    if (loop_release(image, &st, REUSE_WAIT_MS, still, sizeof(still)) > 0) {
        log_warn(id, "disk.loop_reused", "device=/dev/%s image=\"%s\"", still, image);
        snprintf(dev, sizeof(dev), "/dev/%s", still);
    } else if (loop_attach(image, &loopfd, dev, sizeof(dev), err) < 0) {
        return -1;
    }
    if (mount(dev, mountpoint, "ext4", MS_NODEV | MS_NOSUID, "discard") < 0)
        return wr_err_sys(err, errno, "mounting %s (%s) at %s", image, dev, mountpoint);
    return 0;
}

/*
 * Returns an fd of mountpoint if it is the root of a mount of image through a loop device,
 * else -1. Guards the shutdown ioctl: it must never reach the host's own filesystem.
 */
static int open_image_mount(const char *image, const char *mountpoint)
{
    struct stat ist;
    if (stat(image, &ist) < 0)
        return -1;
    int fd = open(mountpoint, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct statx stx;
    char link[PATH_MAX], sys[64];
    if (statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &stx) < 0 ||
        !(stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) ||
        !(stx.stx_attributes & STATX_ATTR_MOUNT_ROOT))
        goto no;
    snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u", stx.stx_dev_major, stx.stx_dev_minor);
    ssize_t n = readlink(sys, link, sizeof(link) - 1);
    if (n <= 0)
        goto no;
    link[n] = '\0';
    const char *name = strrchr(link, '/');
    name = name ? name + 1 : link;
    if (strncmp(name, "loop", 4) || !loop_backs(name, &ist))
        goto no;
    return fd;
no:
    close(fd);
    return -1;
}

int disk_image_release(const char *id, const char *image, const char *mountpoint, bool discard,
                       struct wr_err *err)
{
    if (discard) {
        /* Nothing of it is wanted: drop dirty data instead of writing it back on unmount
         * (a sandbox that just wrote a few GiB would otherwise take seconds to delete). */
        cleanup_close int fd = open_image_mount(image, mountpoint);
        uint32_t how = EXT4_GOING_FLAGS_NOLOGFLUSH;
        if (fd >= 0 && ioctl(fd, EXT4_IOC_SHUTDOWN, &how) < 0)
            log_warn(id, "disk.shutdown_failed", "error=\"%s\"", strerror(errno));
    }
    if (disk_unmount_all(id, mountpoint, err) < 0)
        return -1;
    /* Copies of the mount in other mount namespaces (a process that unshared while it was
     * mounted) keep the image in use; removing their mount point detaches them all. */
    if (rmdir(mountpoint) < 0 && errno != ENOENT)
        log_warn(id, "disk.rmdir_failed", "path=\"%s\" error=\"%s\"", mountpoint, strerror(errno));
    struct stat st;
    if (stat(image, &st) < 0) {
        if (errno == ENOENT)
            return 0; /* no image: never started, nothing bound */
        return wr_err_sys(err, errno, "stat %s", image);
    }
    char still[32] = "";
    int n = loop_release(image, &st, RELEASE_WAIT_MS, still, sizeof(still));
    if (n < 0)
        log_warn(id, "disk.sysfs_failed", "error=\"%s\"", strerror(errno));
    else if (n > 0)
        log_warn(id, "disk.loop_busy", "device=/dev/%s image=\"%s\"", still, image);
    return 0;
}
