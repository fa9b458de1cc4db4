/*
 * Host files a sandbox can make grow: its agent.log (the agent's stderr, and runsc's). A
 * command inside can make the agent write, so the file is never handed to the sandbox's
 * processes (the sentry would hold it open for as long as they run): its writers get a pipe,
 * and one thread of the daemon copies what comes through into the file, cutting it in place
 * down to its newest lines (behind a marker line) before a write would take it past its limit.
 * The file is bounded at every write, whatever state the sandbox is in, and only the daemon ever
 * writes it.
 */
#ifndef WR_DRIVER_LOGCAP_H
#define WR_DRIVER_LOGCAP_H

#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* The limit when a driver is given none: 1 MiB. */
#define LOGCAP_DEFAULT_MAX (1u << 20)
/* The smallest limit: a cut keeps a quarter, and a copy is at most half. */
#define LOGCAP_MIN_MAX 1024

/**
 * If dir/agent.log is larger than max bytes, keeps its last keep bytes (from a line start)
 * after a marker line and drops the rest; *dropped (may be NULL) gets the bytes dropped.
 * Lines written while it is cut may be lost. No file, or small enough: nothing to do.
 * Returns 1 if it cut the file, 0 if not, -1 with err set.
 */
int driver_log_cap(const char *dir, uint64_t max, uint64_t keep, uint64_t *dropped,
                   struct wr_err *err);

struct logpump;

/**
 * Opens dir/agent.log (created 0640, appended to, never through a link) and a pipe into it.
 * *write_fd (O_CLOEXEC; the caller owns it) is the pipe's write end, to give a writer as its
 * stderr; the caller closes its own copy once handed on. The pump's thread (one for every pump,
 * started by the first) copies what arrives, holding the file to max bytes (LOGCAP_MIN_MAX at
 * least): before a write would pass max, the file is cut to its newest quarter behind an
 * `event=log.truncated bytes=N limit=M` line. When every copy of the write end is closed the
 * pump closes the file and ends. id names the sandbox in the daemon's log (its first cut is
 * logged). *size_before (may be NULL) gets the file's size at open. Returns a reference to give
 * back with logpump_release, or NULL with err set.
 */
struct logpump *logpump_open(const char *dir, const char *id, uint64_t max, int *write_fd,
                             off_t *size_before, struct wr_err *err);

/** Copies what is in the pipe now into the file (so it can be read, e.g. a writer's last words
 * once it has exited). Bounded: at most a few pipefuls. NULL is a no-op. */
void logpump_drain(struct logpump *p);

/* How long a stop waits for agent.log to take what the sandbox's last processes wrote: they are
 * dead by then, so only what is in the pipe is left to copy. */
#define LOGPUMP_SETTLE_MS 2000

/**
 * Waits (at most timeout_ms) until no pump into dir/agent.log is open: once a sandbox's
 * processes are gone, the file then holds everything they wrote. For stop and destroy.
 */
void logpump_settle(const char *dir, int timeout_ms);

/** Whether every writer has closed the pipe and the pump has closed the file (for tests). */
int logpump_closed(struct logpump *p);

/** Gives back the reference logpump_open returned; the pump goes on until its pipe's writers are
 * gone. NULL is a no-op. */
void logpump_release(struct logpump *p);

#endif
