/*
 * Admission control: whether the host has room for one more sandbox to run (a create, or a
 * start of a stopped one), by what the host has and what sandboxes use, within the limits in
 * the daemon's configuration (admission.c says how). Runs on
 * the loop thread, which is also the only thread that changes a sandbox's state, and a
 * sandbox admitted is CREATING or STARTING before the loop runs again: two creates can never
 * both take the last place.
 */
#ifndef WR_DAEMON_ADMISSION_H
#define WR_DAEMON_ADMISSION_H

#include "common/err.h"

struct daemon;
struct sandbox;

/* Of the host's memory, the share (1/N) never promised to sandboxes: the daemon, runsc's
 * processes outside the sandboxes' cgroups, the kernel and the page cache the host runs on. */
#define ADMISSION_HOST_KEEP_DIV 16

/** What admission reads of the host when asked. */
struct admission_host {
    long long mem_available_mib; /* /proc/meminfo's MemAvailable; -1: unknown */
    double pressure_full;        /* /proc/pressure/memory's "full avg10", percent; -1: no PSI */
    double pressure_some;        /* its "some avg10" (daemon/pressure.h), percent; -1: no PSI */
    long long disk_free_mib;     /* the state directory's filesystem, as df's Avail; -1: unknown */
};

/** Reads the host's numbers now (two small /proc files and one statvfs). */
void admission_read_host(const char *state_dir, struct admission_host *out);

/** Reads only the memory numbers (the two /proc files; disk_free_mib is left -1): what the
 * pressure check (daemon/pressure.h) reads each second. */
void admission_read_memory(struct admission_host *out);

/**
 * Returns 0 if sb may start now, else -1 with err (WR_E_CAPACITY) naming what is short and
 * what frees it. is_new: sb is being created (not yet in the daemon's list); else it is a
 * stopped or failed sandbox about to start again (its disk is already counted).
 */
int admission_check(struct daemon *d, const struct sandbox *sb, int is_new, struct wr_err *err);

/**
 * admission_check in two parts, for a create that a warm pool entry may serve: the limits
 * (counts, memory, disk), then whether the host has a loop device left for a new disk. The
 * second reads sysfs for every loop device the host has (~1 ms with 200 of them) and a claim,
 * whose entry has its disk already, skips it.
 */
int admission_limits(struct daemon *d, const struct sandbox *sb, int is_new, struct wr_err *err);

/** admission_limits with the host's numbers given (tests/unit/test_admission.c). */
int admission_limits_on(struct daemon *d, const struct sandbox *sb, int is_new,
                        const struct admission_host *host, struct wr_err *err);
int admission_loop(struct daemon *d, const struct sandbox *sb, struct wr_err *err);

#endif
