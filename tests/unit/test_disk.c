/*
 * Disk images and mounts (driver/disk.h) on the real host: an image is sparse, refused below
 * DISK_MIN_MIB and made once; mounted through a loop device it holds no more than its size
 * (a write past it fails with ENOSPC); released, it leaves no mount, no mount point and no
 * loop device, and keeps its data unless discarded; a mount that fails leaves nothing bound;
 * the mount table is read with escapes and path boundaries right; disk_unmount_all undoes
 * nested mounts. Needs root and loop devices: elsewhere it prints SKIP lines.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver/disk.h"
#include "tap.h"

/* Clears err for the call it is passed to, so a message printed after it is that call's. */
static struct wr_err *clr(struct wr_err *e)
{
    wr_err_clear(e);
    return e;
}

static char tmpdir[] = "/var/tmp/wr-test-disk-XXXXXX";
static char image[PATH_MAX], mnt[PATH_MAX];

/* Counts loop devices whose backing file is path (as losetup -a would show it). */
static int loops_for(const char *path)
{
    DIR *d = opendir("/sys/block");
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, "loop", 4))
            continue;
        char p[300], buf[PATH_MAX] = "";
        snprintf(p, sizeof(p), "/sys/block/%s/loop/backing_file", de->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        if (fgets(buf, sizeof(buf), f)) {
            buf[strcspn(buf, "\n")] = '\0';
            n += strcmp(buf, path) == 0;
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

/* Counts lines of /proc/mounts whose mount point is under tmpdir. */
static int mounts_under_tmpdir(void)
{
    FILE *f = fopen("/proc/mounts", "r");
    char line[4096];
    int n = 0;
    size_t len = strlen(tmpdir);
    while (f && fgets(line, sizeof(line), f)) {
        char *sp = strchr(line, ' ');
        if (sp && strncmp(sp + 1, tmpdir, len) == 0)
            n++;
    }
    if (f)
        fclose(f);
    return n;
}

static void cleanup(void)
{
    struct wr_err err;
    disk_unmount_all(NULL, tmpdir, clr(&err));
    char cmd[PATH_MAX + 64];
    /* Any device still bound to an image of ours is let go. */
    DIR *d = opendir("/sys/block");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[300], buf[PATH_MAX] = "";
        snprintf(p, sizeof(p), "/sys/block/%s/loop/backing_file", de->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        if (fgets(buf, sizeof(buf), f) && strncmp(buf, tmpdir, strlen(tmpdir)) == 0) {
            snprintf(cmd, sizeof(cmd), "losetup -d /dev/%s", de->d_name);
            if (system(cmd) != 0)
                fprintf(stderr, "# %s failed\n", cmd);
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "# could not remove %s\n", tmpdir);
}

static int write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int r = fputs(s, f) >= 0 ? 0 : -1;
    return fclose(f) == 0 ? r : -1;
}

int main(void)
{
    struct wr_err err = {0};
    if (geteuid() != 0) {
        printf("ok 1 # SKIP not root: cannot attach loop devices or mount\n1..1\n");
        return 0;
    }
    if (disk_check(&err) < 0) {
        printf("ok 1 # SKIP disk images unavailable: %s\n1..1\n", err.msg);
        return 0;
    }
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp %s", tmpdir);
        return tap_done();
    }
    atexit(cleanup);
    snprintf(image, sizeof(image), "%s/layer.img", tmpdir);
    snprintf(mnt, sizeof(mnt), "%s/rootfs", tmpdir);
    struct stat st;

    /* Creating the image */
    ok(disk_image_create(image, DISK_MIN_MIB - 1, clr(&err)) == -1 && err.code == EINVAL &&
           access(image, F_OK) < 0,
       "an image below %d MiB is refused and not made (%s)", DISK_MIN_MIB, err.msg);
    ok(disk_image_create(image, 32, clr(&err)) == 1, "a 32 MiB image is made (%s)", err.msg);
    ok(stat(image, &st) == 0 && st.st_size == 32 << 20, "its size is 32 MiB");
    ok(st.st_blocks * 512 < 16 << 20, "it is sparse (%lld bytes allocated)",
       (long long)st.st_blocks * 512);
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", image);
    ok(access(tmp, F_OK) < 0, "no temporary file is left beside it");
    ok(disk_image_create(image, 64, clr(&err)) == 0 && stat(image, &st) == 0 &&
           st.st_size == 32 << 20,
       "creating it again returns 0 and leaves it alone");
    char dirimg[PATH_MAX];
    snprintf(dirimg, sizeof(dirimg), "%s/adir", tmpdir);
    mkdir(dirimg, 0700);
    ok(disk_image_create(dirimg, 32, clr(&err)) == -1,
       "a directory in the image's place is refused");

    /* Mounting: one mount, one device; mounting again changes nothing. */
    ok(disk_mount_count(mnt, NULL, 0) == 0, "nothing mounted at the mount point yet");
    ok(disk_image_mount("sb-unittest", image, mnt, clr(&err)) == 0, "disk_image_mount (%s)",
       err.msg);
    char first[PATH_MAX] = "";
    ok(disk_mount_count(mnt, first, sizeof(first)) == 1 && strcmp(first, mnt) == 0,
       "one mount, at the mount point");
    ok(loops_for(image) == 1, "one loop device holds the image");
    ok(disk_image_mount("sb-unittest", image, mnt, clr(&err)) == 0 &&
           disk_mount_count(mnt, NULL, 0) == 1 && loops_for(image) == 1,
       "mounting again: still one mount and one device");

    /* The quota: a write past 32 MiB fails with ENOSPC. */
    char big[PATH_MAX + 16];
    snprintf(big, sizeof(big), "%s/big", mnt);
    int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    static char chunk[1 << 20];
    memset(chunk, 'z', sizeof(chunk));
    long long written = 0;
    int werr = 0;
    for (int i = 0; fd >= 0 && i < 64; i++) {
        ssize_t n = write(fd, chunk, sizeof(chunk));
        if (n < 0) {
            werr = errno;
            break;
        }
        written += n;
        if (n < (ssize_t)sizeof(chunk)) {
            /* a short write at the end: the next one says why */
            continue;
        }
    }
    if (fd >= 0 && !werr && fsync(fd) < 0)
        werr = errno;
    if (fd >= 0)
        close(fd);
    ok(fd >= 0 && werr == ENOSPC, "writing 64 MiB into a 32 MiB disk fails with ENOSPC (%s)",
       strerror(werr));
    ok(written > 20ll << 20 && written <= 32ll << 20,
       "the sandbox got most of its quota and no more (%lld MiB)", written >> 20);
    unlink(big);

    /* Data survives a release without discard. */
    char keep[PATH_MAX + 16];
    snprintf(keep, sizeof(keep), "%s/keep", mnt);
    ok(write_file(keep, "kept\n") == 0, "a small file is written");
    ok(disk_image_release("sb-unittest", image, mnt, false, clr(&err)) == 0,
       "disk_image_release keeping data (%s)", err.msg);
    ok(disk_mount_count(mnt, NULL, 0) == 0 && mounts_under_tmpdir() == 0,
       "no mount left (/proc/mounts)");
    ok(access(mnt, F_OK) < 0, "the mount point is removed");
    ok(loops_for(image) == 0, "no loop device holds the image");
    ok(stat(image, &st) == 0 && st.st_blocks * 512 < 16 << 20,
       "the freed blocks went back to the host (%lld bytes allocated)",
       (long long)st.st_blocks * 512);
    ok(disk_image_mount("sb-unittest", image, mnt, clr(&err)) == 0, "mounted again (%s)", err.msg);
    char buf[32] = "";
    FILE *f = fopen(keep, "r");
    if (f) {
        if (!fgets(buf, sizeof(buf), f))
            buf[0] = '\0';
        fclose(f);
    }
    ok(strcmp(buf, "kept\n") == 0, "the file is still there");
    ok(write_file(keep, "discarded\n") == 0, "it is overwritten");
    ok(disk_image_release("sb-unittest", image, mnt, true, clr(&err)) == 0,
       "disk_image_release discarding (%s)", err.msg);
    ok(disk_mount_count(mnt, NULL, 0) == 0 && mounts_under_tmpdir() == 0 && access(mnt, F_OK) < 0 &&
           loops_for(image) == 0,
       "no mount, mount point or loop device left");
    ok(disk_image_release("sb-unittest", image, mnt, true, clr(&err)) == 0,
       "releasing a released image: nothing to do");
    char none[PATH_MAX + 16];
    snprintf(none, sizeof(none), "%s/none.img", tmpdir);
    ok(disk_image_release("sb-unittest", none, mnt, false, clr(&err)) == 0,
       "releasing a missing image: nothing to do");

    /* A mount that fails (not a filesystem) leaves no mount and no device behind. */
    char junk[PATH_MAX + 16];
    snprintf(junk, sizeof(junk), "%s/junk.img", tmpdir);
    fd = open(junk, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ok(fd >= 0 && ftruncate(fd, 16 << 20) == 0, "a 16 MiB file of zeros");
    if (fd >= 0)
        close(fd);
    ok(disk_image_mount("sb-unittest", junk, mnt, clr(&err)) == -1, "mounting it fails (%s)",
       err.msg);
    ok(disk_mount_count(mnt, NULL, 0) == 0 && loops_for(junk) == 0,
       "and leaves no mount and no loop device");
    rmdir(mnt);

    /* The mount table: escapes, path boundaries, nested mounts. */
    char sp[PATH_MAX], nested[PATH_MAX + 8], sibling[PATH_MAX];
    snprintf(sp, sizeof(sp), "%s/with space", tmpdir);
    snprintf(nested, sizeof(nested), "%s/sub", sp);
    snprintf(sibling, sizeof(sibling), "%s/with spacex", tmpdir);
    mkdir(sp, 0700);
    mkdir(sibling, 0700);
    int m1 = mount("tmpfs", sp, "tmpfs", 0, "size=1m") == 0;
    mkdir(nested, 0700);
    int m2 = mount("tmpfs", nested, "tmpfs", 0, "size=1m") == 0;
    int m3 = mount("tmpfs", sibling, "tmpfs", 0, "size=1m") == 0;
    ok(m1 && m2 && m3, "three tmpfs mounts");
    first[0] = '\0';
    ok(disk_mount_count(sp, first, sizeof(first)) == 2 && strcmp(first, sp) == 0,
       "a path with a space: its mount and the nested one, not the sibling (%s)", first);
    ok(disk_unmount_all("sb-unittest", sp, clr(&err)) == 0 && disk_mount_count(sp, NULL, 0) == 0,
       "disk_unmount_all undoes both (%s)", err.msg);
    ok(disk_mount_count(sibling, NULL, 0) == 1, "and leaves the sibling mounted");
    ok(disk_unmount_all("sb-unittest", sibling, clr(&err)) == 0 && mounts_under_tmpdir() == 0,
       "nothing mounted under the test directory at the end");

    return tap_done();
}
