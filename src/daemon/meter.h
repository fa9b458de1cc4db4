/*
 * Money: what each running sandbox costs, and the caps on it.
 *
 * A running sandbox is metered about once a second: its measured CPU (its cgroup's
 * cpuacct.usage) and its memory allocation (memory_mib) over the wall time since the last
 * reading, priced from the daemon's config in integer micro-dollars. CPU is billed at no less
 * than a floor per vCPU (2.5 % by default: gVisor's own idle work, measured at ~2.2 % of a core
 * under systrap), so the seed's 2 vCPU / 4 GiB sandbox costs 31,250 micro-dollars for an idle
 * hour and 80,000 for an hour with both vCPUs busy. A stopped sandbox costs nothing. A frozen
 * one (daemon/idle.h) uses no CPU at all: its frozen time is billed memory and no CPU floor.
 *
 * Charges go into a ledger in the store: one row per sandbox per UTC minute (cost, billed CPU,
 * memory-time), the source of GET /v1/usage; a sandbox's cost so far and each key's spend
 * today are kept in memory and rebuilt from it at start.
 *
 * Caps never pass: a running sandbox holds a reservation, the most its next few seconds can
 * cost, taken from its max_cost_micros and from its key's daily limit before the time is used;
 * a charge never exceeds the reservation it is taken from. A create or start needs a
 * reservation (else 402), and a sandbox that cannot renew its reservation is stopped with
 * reason cost_cap or daily_limit. So many creates at once, one micro-dollar below a key's
 * limit, get one reservation between them and spend never passes the limit.
 */
#ifndef WR_DAEMON_METER_H
#define WR_DAEMON_METER_H

#include <jansson.h>
#include <stdint.h>

#include "common/err.h"

struct daemon;
struct principal;
struct sandbox;
struct sink;

/** Prices, from the daemon's config. */
struct meter_prices {
    int64_t vcpu_hour_micros; /* a vCPU busy for an hour (default 25,000: $0.025) */
    int64_t gib_hour_micros;  /* a GiB of memory for an hour (default 7,500: $0.0075) */
    int cpu_floor_permille;   /* CPU billed at least this share of each vCPU (default 25) */
};

#define METER_DEFAULT_VCPU_HOUR 25000
#define METER_DEFAULT_GIB_HOUR 7500
#define METER_DEFAULT_CPU_FLOOR 25

/** How much time a reservation covers at most, in ms of a sandbox at full use. */
#define METER_RESERVE_MS 5000

/* ---- the arithmetic (pure; tests/unit/test_meter.c) ---- */

/** The price of cpu_usec of billed CPU and mem_mib_ms of memory-time, rounded down. */
int64_t meter_price(const struct meter_prices *p, uint64_t cpu_usec, uint64_t mem_mib_ms);

/** The CPU billed for ms of wall time on cpus vCPUs that measured used_usec, frozen_ms of it
 * frozen: at least the floor for the time awake, at most every vCPU busy. */
uint64_t meter_billed_cpu(const struct meter_prices *p, int cpus, uint64_t ms, uint64_t frozen_ms,
                          uint64_t used_usec);

/** The most ms of a sandbox with cpus and mem_mib can cost (every vCPU busy), rounded up. */
int64_t meter_max_cost(const struct meter_prices *p, int cpus, int mem_mib, uint64_t ms);

/* ---- the daemon's meter ---- */

/** Rebuilds sandboxes' costs and keys' spend today from the ledger (at start). */
int meter_open(struct daemon *d, struct wr_err *err);

/** Writes what is pending and frees the meter (at close, before the store closes). */
void meter_close(struct daemon *d);

/** Writes charges not yet in the store (at shutdown, and before usage is read). */
void meter_flush(struct daemon *d);

/** Meters every running sandbox that is due; renews or stops. Called from the daemon's tick. */
void meter_tick(struct daemon *d);

/**
 * Takes a new create's or start's first reservation. -1 with err (WR_E_COST_LIMIT) if its cap
 * or its key's daily limit leaves no room.
 */
int meter_admit(struct sandbox *sb, struct wr_err *err);

/** -1 with err (WR_E_COST_LIMIT) if an exec on sb must be refused: it has no room left. */
int meter_check_exec(struct sandbox *sb, struct wr_err *err);

/** The sandbox went to state running: metering starts now (its reservation was taken). */
void meter_begin(struct sandbox *sb);

/** The sandbox was frozen (daemon/idle.h): no CPU floor from now until meter_thaw. */
void meter_freeze(struct sandbox *sb);

/** The sandbox was thawed: billed at its floor again from now. */
void meter_thaw(struct sandbox *sb);

/** The sandbox left running (or never got there): the time since its last reading is charged
 * at its floor, and its reservation is given back. Idempotent. */
void meter_end(struct sandbox *sb);

/** A key's spend on the current UTC day, in micro-dollars. */
int64_t meter_key_spent_today(struct daemon *d, const char *key_id);

/**
 * GET /v1/usage: from/to in unix seconds, group_by "sandbox", "key", "day" or "minute"; of
 * sandbox_id only unless NULL; who's own sandboxes only unless the admin or an auditor key.
 * Answers SINK_OK.
 */
void svc_usage(struct daemon *d, int64_t from, int64_t to, const char *group_by,
               const char *sandbox_id, struct sink *s);

#endif
