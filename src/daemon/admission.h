/*
 * Admission control: whether the host has room for one more sandbox to run (a create, or a
 * start of a stopped one), counted against the limits in the daemon's configuration. Runs on
 * the loop thread, which is also the only thread that changes a sandbox's state, and a
 * sandbox admitted is CREATING or STARTING before the loop runs again: two creates can never
 * both take the last place.
 */
#ifndef WR_DAEMON_ADMISSION_H
#define WR_DAEMON_ADMISSION_H

#include "common/err.h"

struct daemon;
struct sandbox;

/**
 * Returns 0 if sb may start now, else -1 with err (WR_E_UNAVAILABLE) naming the limit and
 * the numbers. is_new: sb is being created (not yet in the daemon's list); else it is a
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
int admission_loop(struct daemon *d, const struct sandbox *sb, struct wr_err *err);

#endif
