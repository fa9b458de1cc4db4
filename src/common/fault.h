/*
 * Fault points: named places where a test can make an operation fail, so
 * that error branches (a start that fails half-way, a cleanup that fails, a
 * full disk, a busy database) run in tests and not only when the host
 * misbehaves. Production runs never arm them: a point costs one load of a
 * flag until WR_FAULTS or WR_FAULTS_FILE is set in the environment.
 *
 * Spec (from $WR_FAULTS at the first check, or from the file named by
 * $WR_FAULTS_FILE, re-read whenever it changes): comma- or newline-separated
 * entries `point=ERRNO[:count]`, e.g. `store.put=EIO:1,gvisor.start.mount=ENOSPC`.
 * ERRNO is a name (EIO, ENOSPC, EBUSY, ...) or a number; count is how many
 * hits fail (default: every hit). A point named `prefix*` arms every point
 * starting with prefix. Instead of an errno, `delayMS` (e.g. `fake.stop=delay1500:1`) makes
 * the hit sleep MS milliseconds and then succeed: an operation that is slow, not failing, so
 * tests can act while it is in flight.
 */
#ifndef WR_COMMON_FAULT_H
#define WR_COMMON_FAULT_H

#include "common/err.h"

/**
 * Returns 0 if point is not armed. If it is, uses up one of its count, fills err with its
 * errno and "fault injected at POINT", and returns -1 (a delay entry sleeps, then returns 0).
 * Thread-safe.
 */
int fault_hit(const char *point, struct wr_err *err);

/** Re-reads the environment on the next check (for unit tests that change WR_FAULTS). */
void fault_reset(void);

#endif
