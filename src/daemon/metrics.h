/*
 * Prometheus metrics: counters and histograms the daemon's parts bump as things happen, and
 * the text exposition (format 0.0.4) of those plus gauges read at scrape time (sandboxes by
 * state, frozen, the pool, spend by key, the daemon's memory and fds). Labels come from fixed
 * sets only (states, reasons, routes, status classes), never from a sandbox: cardinality is
 * bounded whatever clients do. One daemon per process: the counters are process-wide and
 * updated with relaxed atomics (workers may bump them too).
 */
#ifndef WR_DAEMON_METRICS_H
#define WR_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct daemon;
struct evbuffer;

enum metric_counter {
    MC_CREATES_OK,      /* creates answered with a sandbox */
    MC_CREATES_FAILED,  /* creates that failed after admission (the driver, the agent) */
    MC_CREATES_REFUSED, /* creates refused before starting (admission, limits, quotas) */
    MC_DELETES,
    MC_EXECS,             /* foreground commands that ended (streamed ones included) */
    MC_FILES_READ_BYTES,  /* bytes sent to callers by the files API */
    MC_FILES_WRITE_BYTES, /* bytes the files API took from callers and handed to the agent */
    MC_COUNTERS
};

enum metric_hist {
    MH_CREATE, /* POST /v1/sandboxes, request to answer, for creates that succeeded */
    MH_EXEC,   /* a foreground command, request to its exit's answer */
    MH_COUNT
};

void metrics_add(enum metric_counter c, uint64_t n);
void metrics_observe_us(enum metric_hist h, uint64_t us);

/** A sandbox became failed with this reason (one of sandbox_reason_names; others: "other"). */
void metrics_failed(const char *reason);

/** The gateway denied something: via "proxy" or "dns", reason as the network log has it. */
void metrics_denied(const char *via, const char *reason);

/** Appends the daemon's metrics to out, in the Prometheus text format. */
void metrics_render(struct daemon *d, struct evbuffer *out);

/** Zeroes every counter (the unit tests). */
void metrics_reset(void);

#endif
