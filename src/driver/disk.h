/*
 * A sandbox's storage on the host: the mount table, and the filesystem image that holds
 * its writable layer.
 *
 * The host's filesystem has no project quotas. So the disk quota is a filesystem of its own:
 * a sparse ext4 image of the quota's size in the sandbox directory, mounted through a loop
 * device. A write past the quota fails with ENOSPC inside the sandbox. The host gives the
 * image no more blocks than its size, and only the blocks it uses.
 *
 * Loop devices are set up with LO_FLAGS_AUTOCLEAR: the device lets go of the image when its
 * last user does (an unmount, or the close after a failed mount). So a crashed daemon leaves
 * at most a mounted image behind, which the next stop or start unmounts. Another process that
 * unshared its mount namespace while the image was mounted holds a copy of the mount: removing
 * the mount point detaches such copies, and until that happens the device stays bound and is
 * used again rather than binding the same image to a second device.
 */
#ifndef WR_DRIVER_DISK_H
#define WR_DRIVER_DISK_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/** Smallest image disk_image_create accepts, in MiB (an ext4 journal needs some room). */
#define DISK_MIN_MIB 16

/**
 * Checks that disk images can be made and attached here: mke2fs is installed and loop
 * devices can be had. Returns 0, or -1 with the reason in err.
 */
int disk_check(struct wr_err *err);

/**
 * Counts the mounts at or below path in this process's mount table (/proc/self/mountinfo)
 * and copies the first one's mount point into first (may be NULL). Returns the count, or -1
 * with errno set.
 */
int disk_mount_count(const char *path, char *first, size_t firstlen);

/**
 * Unmounts everything mounted at or below path, lazily where busy. id (may be NULL) names
 * the sandbox in log lines. Returns 0, or -1 with err set.
 */
int disk_unmount_all(const char *id, const char *path, struct wr_err *err);

/**
 * Creates image (a path whose directory exists) as an empty ext4 filesystem of size_mib MiB,
 * sparse, unless it exists. It appears under its name complete or not at all. Returns 1 if
 * it made the image, 0 if it was there, -1 with err set.
 */
int disk_image_create(const char *image, int size_mib, struct wr_err *err);

/**
 * Mounts image at mountpoint (created if missing) through a loop device. A loop device that
 * still holds image from an earlier run is used again. Mounted already: nothing to do.
 * Returns 0, or -1 with err set (no mount and no loop device left behind).
 */
int disk_image_mount(const char *id, const char *image, const char *mountpoint, struct wr_err *err);

/**
 * Unmounts image from mountpoint, removes the mount point directory (which detaches copies
 * of the mount in other mount namespaces) and waits for the loop device to let go of image.
 * With discard, the data is about to be deleted: the filesystem is shut down first, so the
 * unmount writes nothing back. Without, unused blocks are first handed back to the host's
 * filesystem. A device still bound after a while is logged, not an error: it is set to let go
 * when its last user does. Nothing mounted or bound (or no image): nothing to do.
 * Returns 0, or -1 with err set.
 */
int disk_image_release(const char *id, const char *image, const char *mountpoint, bool discard,
                       struct wr_err *err);

/**
 * Counts the loop devices bound to a file on this host (anyone's, not only ours), from
 * sysfs. Returns the count, or -1 if sysfs cannot be read.
 */
int disk_loops_bound(void);

/**
 * Reads the space available on the filesystem holding path (what df calls Avail), in MiB, into
 * *free_mib. Returns 0, or -1 with errno set.
 */
int disk_free_mib(const char *path, long long *free_mib);

#endif
