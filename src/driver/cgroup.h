/*
 * Host cgroups (v1) for sandboxes. runsc applies linux.resources only to
 * cgroups it creates itself and removes them, counters included, on delete;
 * so the driver creates each sandbox's cpu, cpuacct, memory and pids cgroups,
 * writes the limits, hands the path to runsc as linux.cgroupsPath (runsc joins
 * pre-created cgroups and leaves them alone), reads the counters and removes
 * the cgroups itself. runsc still creates (and on delete removes) the other
 * hierarchies' cgroups under the same path. The freezer cgroup is the driver's too (when the
 * host mounts that hierarchy): an idle sandbox is frozen there (cgroup_freeze), and every
 * kill here thaws it first, because a frozen task does not die of SIGKILL.
 */
#ifndef WR_DRIVER_CGROUP_H
#define WR_DRIVER_CGROUP_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/** Parent of every sandbox cgroup in each hierarchy: /<CGROUP_PARENT>/<id>. */
#define CGROUP_PARENT "withruntime"

/** Limits written into a sandbox's cgroups. */
struct cgroup_limits {
    int cpus;              /* CFS quota = cpus * period */
    uint64_t memory_bytes; /* memory.limit_in_bytes (and memsw, so no swap) */
    int pids_max;          /* pids.max */
};

/** Counters read from a sandbox's cgroups. */
struct cgroup_usage {
    uint64_t cpu_usec;
    uint64_t memory_bytes;
    uint64_t pids;
    uint64_t oom_kills; /* processes the host's OOM killer killed in this cgroup */
};

/**
 * Checks that the cgroup v1 controllers the driver needs (cpu, cpuacct, memory, pids) are
 * mounted. Fills detail with where they are. Returns 0 or -1 with err set.
 */
int cgroup_check(char *detail, size_t detail_len, struct wr_err *err);

/**
 * Writes the cgroupsPath to give runsc for sandbox `id` into out ("/withruntime/<id>").
 */
void cgroup_runsc_path(const char *id, char *out, size_t outlen);

/**
 * Creates (or reuses) the sandbox's cgroups and writes the limits. Returns 0 or -1.
 */
int cgroup_create(const char *id, const struct cgroup_limits *lim, struct wr_err *err);

/**
 * Reads the sandbox's counters. Returns 1 if its cgroups exist (usage filled), 0 if they
 * do not (usage zeroed), -1 on error.
 */
int cgroup_usage(const char *id, struct cgroup_usage *usage, struct wr_err *err);

/**
 * Kills every process still in the sandbox's cgroups, waits (up to timeout_ms) for them to
 * go, and removes the sandbox's cgroup in every v1 hierarchy (including those runsc created
 * and may have left after a failed start). Absent cgroups are fine. Returns 0 or -1.
 */
int cgroup_destroy(const char *id, int timeout_ms, struct wr_err *err);

/**
 * Kills every process in the sandbox's cgroups and waits (up to timeout_ms) until none is
 * left. The cgroups stay. Returns 0, or -1 if processes remain.
 */
int cgroup_kill(const char *id, int timeout_ms, struct wr_err *err);

/**
 * Freezes (frozen = 1) or thaws (0) every task of the sandbox through the v1 freezer. A freeze
 * waits up to timeout_ms for the state to read FROZEN; if it does not, the cgroup is thawed
 * again and -1 returned (EBUSY). Returns 0, or -1 with err set (ENOTSUP: no freezer mounted).
 */
int cgroup_freeze(const char *id, int frozen, int timeout_ms, struct wr_err *err);

/** Returns 1 if any cgroup directory of sandbox `id` exists in any hierarchy, else 0. */
int cgroup_exists(const char *id);

#endif
