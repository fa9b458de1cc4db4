/*
 * What the gVisor driver tells the rest of the program beyond the driver
 * table: the limits a sandbox really gets on the host (for docs and
 * accounting) and the runsc checks `doctor` reports one by one.
 */
#ifndef WR_DRIVER_GVISOR_H
#define WR_DRIVER_GVISOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "driver/driver.h"

/** The gVisor driver's table. */
extern const struct driver_ops driver_gvisor;

/**
 * The host memory cgroup limit for a sandbox of memory_mib: memory_mib plus a margin for
 * gVisor's own sentry and gofer (64 MiB + memory_mib/16). Exceeding it kills the whole
 * sandbox; the guest sees this total as its MemTotal.
 */
uint64_t gvisor_memory_limit_bytes(int memory_mib);

/** The host pids.max backstop for a sandbox whose guest process cap is pids_max. */
int gvisor_pids_limit(int pids_max);

/** Reads the installed runsc's version (e.g. "0.0~20240729.0") into out. Returns 0 or -1. */
int gvisor_runsc_version(char *out, size_t outlen, struct wr_err *err);

/**
 * Returns 1 if a runsc of this version is too old to use (Debian 12's own 0.0~20221219
 * rejects statx with AT_NO_AUTOMOUNT, so ls and stat fail inside), else 0.
 */
int gvisor_runsc_too_old(const char *version);

/**
 * Starts and stops a throwaway sandbox (`runsc do true`) on the given platform. Needs the
 * driver configured. Returns 0 if it worked, -1 with the reason in err.
 */
int gvisor_platform_check(const char *platform, struct wr_err *err);

#endif
