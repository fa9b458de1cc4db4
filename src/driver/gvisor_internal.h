/*
 * What the gVisor driver's files share and nothing else sees: the configuration, the
 * sandbox directory's paths, and the runsc (runsc.c) and bundle (bundle.c) mechanisms that
 * the start steps and teardown in gvisor.c put together.
 */
#ifndef WR_DRIVER_GVISOR_INTERNAL_H
#define WR_DRIVER_GVISOR_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/err.h"
#include "driver/driver.h"
#include "driver/logcap.h"

/** The driver's configuration: written once by configure, before any other call. */
struct gvisor_conf {
    bool configured;
    char state_dir[PATH_MAX];
    char runsc_root[PATH_MAX]; /* <state_dir>/runsc: runsc's --root */
    char platform_override[16];
    int debug;
    uint64_t agent_log_max; /* agent.log's limit (driver/logcap.h) */
};

extern struct gvisor_conf gvisor_conf;

/* ---- runsc.c: runsc command lines and the platform ---- */

/** Returns true if p names a gVisor platform (systrap, ptrace, kvm). */
bool runsc_platform_valid(const char *p);

/**
 * Copies the platform to use into out: the configured one, else systrap if it works here,
 * else ptrace. The choice is made once, by the first caller. Returns 0 or -1 with err set.
 */
int runsc_platform_get(char *out, size_t outlen, struct wr_err *err);

/** Runs a throwaway `runsc do true` on platform p. Returns 0 or -1 with err set. */
int runsc_platform_try(const char *p, struct wr_err *err);

/** Returns 1 if runsc has any state for id (fixed-width ids: a prefix match is exact). */
int runsc_has_state(const char *id);

/**
 * Spawns `runsc run --detach` of the bundle in dir as container id, with chan_fd as the
 * init's stdin and stdout and logfd as its stderr (runsc's own errors land there too).
 * netns_fd >= 0: the sandbox gets gVisor's own network stack over that namespace's interfaces
 * (--network=sandbox; the bundle names the namespace), else no network (--network=none).
 * Stores the pid to give runsc_run_wait in *pid. Returns 0 or -1 with err set.
 */
int runsc_run_spawn(const char *id, const char *platform, const char *dir, int netns_fd,
                    int chan_fd, int logfd, pid_t *pid, struct wr_err *err);

/**
 * Waits for the `runsc run --detach` started by runsc_run_spawn: when it exits 0, the
 * container's init runs. On failure err carries the last line runsc wrote to the log at
 * log_path after offset log_start, once pump (the log's, may be NULL) has copied it there.
 * Returns 0 or -1 with err set.
 */
int runsc_run_wait(pid_t pid, const char *log_path, off_t log_start, struct logpump *pump,
                   struct wr_err *err);

/**
 * `runsc delete --force id`. dir (may be NULL) receives debug logs. A container runsc does
 * not know is not an error. Returns 0 or -1 with err set.
 */
int runsc_delete(const char *id, const char *dir, struct wr_err *err);

/** Asks runsc for the container's state: 1 if running, 0 if not (or unknown), -1 on error. */
int runsc_is_running(const char *id, struct wr_err *err);

/* ---- bundle.c: the sandbox directory, its root and its OCI spec ---- */

/** The paths in a sandbox's directory (see the layout in gvisor.c). */
struct sb_paths {
    char dir[PATH_MAX];
    char image[PATH_MAX];
    char layer[PATH_MAX];
    char upper[PATH_MAX];
    char work[PATH_MAX];
    char rootfs[PATH_MAX];
    char config[PATH_MAX];
    char log[PATH_MAX];
    char resolv[PATH_MAX];   /* resolv.conf given to a sandbox with networking */
    char cabundle[PATH_MAX]; /* the image's CA bundle with the daemon's extra CAs */
};

/**
 * Fills sp from dir, resolved to its canonical path (mountinfo shows canonical paths).
 * Returns 1 if dir exists, 0 if it does not (paths filled from the given name), -1 on error.
 */
int bundle_paths(const char *dir, struct sb_paths *sp, struct wr_err *err);

/** The sandbox's process cap (RLIMIT_NPROC and the agent's commands' pids cgroup): pids_max,
 * at most memory_mib/16, at least 16. */
int bundle_nproc(int memory_mib, int pids_max);

/** mkdir that accepts an existing directory. Returns 0 or -1 with err set. */
int bundle_mkdir(const char *p, mode_t mode, struct wr_err *err);

/**
 * Mounts the overlay (lower = the image root, upper and work in the mounted layer) at
 * sp->rootfs unless something is mounted there. Returns 0 or -1 with err set.
 */
int bundle_mount_overlay(const struct sb_paths *sp, const char *lower, struct wr_err *err);

/**
 * Prepares the root through the mounted overlay for the agent: /workspace, the agent's
 * mount point, a file that keeps /tmp off a tmpfs, and an /etc/hosts naming localhost and
 * hostname (the OCI spec's) unless the sandbox has one. Returns 0 or -1 with err set.
 */
int bundle_prepare_root(const struct sb_paths *sp, const char *hostname, struct wr_err *err);

/** Writes the OCI spec for spec to sp->config (atomically). Returns 0 or -1 with err set. */
int bundle_write_spec(const struct driver_spec *spec, const struct sb_paths *sp,
                      struct wr_err *err);

/**
 * Removes dir's entry name recursively, never following symlinks nor crossing into another
 * file system (refuses with EBUSY or EXDEV instead). Returns 0 or -1 with err set.
 */
int bundle_remove_tree_at(int dirfd, const char *name, struct wr_err *err);

#endif
