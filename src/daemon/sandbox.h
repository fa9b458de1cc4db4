/*
 * Sandboxes as the daemon holds them: options, state, the channel to the
 * agent, and the create and delete sequences that drive the driver from
 * worker threads and finish on the loop.
 */
#ifndef WR_DAEMON_SANDBOX_H
#define WR_DAEMON_SANDBOX_H

#include <jansson.h>
#include <limits.h>
#include <stdint.h>

#include "daemon/daemon.h"
#include "driver/driver.h"

enum sb_state {
    SB_CREATING,
    SB_RUNNING,
    SB_STOPPED,
    SB_FAILED,
    SB_DELETING,
    SB_STOPPING,
    SB_STARTING,
};

struct agentconn;
struct command;
struct session;
struct netlog;
struct sandbox_job;

/* An operation asked for while a failed sandbox is still being cleaned up. */
enum sb_deferred { SB_DEFER_NONE, SB_DEFER_DELETE, SB_DEFER_START };

struct sandbox {
    struct daemon *d;
    char id[DRIVER_ID_LEN + 1];
    enum sb_state state;
    char image[72];
    char key_id[32]; /* the API key that created it (daemon/keys.h); "": the admin */
    int cpus;
    int memory_mib;
    int disk_mib;
    int timeout_seconds;
    char on_lease_end[8];
    json_t *env;           /* object of strings */
    json_t *metadata;      /* object of strings */
    json_t *network;       /* object, normalised (net/netpolicy.h) */
    json_t *secrets;       /* {NAME: placeholder} of the secrets it was given (daemon/secrets.h) */
    int net_slot;          /* its slot in the daemon's gateway while it runs, else -1 */
    struct netlog *netlog; /* its recent denied network attempts (daemon/netlog.h); NULL: none */
    int64_t created_at;
    int64_t state_since;   /* unix seconds: when it entered its state (stopped, failed...) */
    int64_t lease_ends_ms; /* wall clock, milliseconds */
    char dir[PATH_MAX];
    char rootfs[PATH_MAX];
    char reason[32];  /* why it is in its state: one of sandbox_reason_names */
    char detail[256]; /* failed: what went wrong, in words ("" otherwise) */
    struct agentconn *conn;
    int refs;
    int busy;                       /* a driver operation is in flight */
    int unlinked;                   /* removed from the daemon's list */
    struct sandbox_job *create_job; /* while CREATING or STARTING and waiting for HELLO */
    struct command *commands;       /* background commands (daemon/command.h), newest first */
    unsigned command_seq;
    struct session *sessions; /* interactive sessions (daemon/session.h), newest first */
    unsigned session_seq;
    uint32_t ping_id;      /* the watchdog's outstanding PING, 0 if none */
    uint64_t ping_sent_ms; /* monotonic */
    uint64_t last_pong_ms;
    /* The host OOM killer's count in its cgroup as last read: every PING_EVERY_MS by the
     * watchdog and after each failed exec. An exec that fails with the count above what it was
     * when the exec started reports oom_killed. (So an OOM kill of some other process in the
     * few seconds before a failing exec is laid at that exec's door too.) */
    uint64_t oom_kills_seen;
    /* Host memory its cgroup held at the last stats read of this run (the meter's, every
     * second), in MiB; 0 until the first: admission (admission.c) counts what it uses. */
    long long memory_used_mib;
    enum sb_deferred deferred;
    void (*deferred_done)(struct sandbox *sb, int ok, const char *message, void *arg);
    void *deferred_arg;
    int pooled; /* a warm entry of the daemon's pool (daemon/pool.h): nobody's, seen by no one */
    /* Money (daemon/meter.h). */
    int64_t max_cost_micros;  /* its cap; -1: none */
    int64_t cost_micros;      /* charged so far, every run */
    int64_t reserved_micros;  /* held against its cap and its key's daily limit */
    int metering;             /* running and metered */
    int meter_reading;        /* a stats read for the meter is in flight */
    int meter_cpu_known;      /* meter_cpu_usec is a reading of this run's cgroup */
    uint64_t meter_at_ms;     /* the meter's clock: charged up to here */
    uint64_t meter_cpu_usec;  /* its cgroup's CPU then */
    uint64_t acc_cpu_usec;    /* billed since metering began in this daemon, priced whole */
    uint64_t acc_mem_mib_ms;  /* so rounding never drifts */
    uint64_t meter_frozen_at; /* meter clock: frozen since then (counted up to there); 0: awake */
    uint64_t meter_frozen_ms; /* of the time since the last reading, how much it was frozen */
    /* Idle freezing (daemon/idle.h). */
    int frozen;             /* the driver froze it; cleared by a thaw, or when a stop or
                               destroy (which thaws) is queued */
    int freezer_busy;       /* a freeze or thaw is on a worker */
    int thaw_wanted;        /* a frame waits for the agent: thaw once the freezer is free */
    uint64_t idle_since_ms; /* monotonic: when it was last in use (a frame sent, a request open) */
    uint32_t probe_id;      /* the PING asking its agent for the process count; 0: none */
    uint64_t probe_since;   /* idle_since_ms when that was asked */
    const char *freeze_why; /* why that probe may freeze it before its idle period is up (a
                               static string: "memory_pressure"); NULL: the idle period */
    struct sandbox_job *parked; /* a stop or destroy waiting for the freezer (sandbox.c) */
    struct sandbox *next;
};

typedef void (*sandbox_done_cb)(struct sandbox *sb, int ok, const char *message, void *arg);

/** Every state's name, indexed by enum sb_state, NULL-terminated. */
extern const char *const sandbox_state_names[];

/** Every reason a state change can carry (state_reason), NULL-terminated. */
extern const char *const sandbox_reason_names[];

/** Returns the state's name ("running"). */
const char *sandbox_state_name(enum sb_state s);

/** Parses a state name; -1 if unknown. */
int sandbox_state_parse(const char *name);

/** Makes a new fixed-width sandbox id ("sb-" + 21 base32 chars) into out[DRIVER_ID_LEN + 1]. */
void sandbox_new_id(char *out);

/** Allocates a sandbox with defaults for d (refs = 1, owned by the daemon's list once added). */
struct sandbox *sandbox_new(struct daemon *d);

/** Takes and drops references; the last unref of an unlinked sandbox frees it. */
void sandbox_ref(struct sandbox *sb);
void sandbox_unref(struct sandbox *sb);

/** Finds a sandbox by id (no reference taken). */
struct sandbox *sandbox_find(struct daemon *d, const char *id);

/** The API's JSON object for a sandbox (new reference). */
json_t *sandbox_to_json(const struct sandbox *sb);

/** A pool entry became a user's sandbox (daemon/pool.c set its fields): records its create
 * (events "creating", then "running" with reason "created"), saves it and starts metering. */
void sandbox_claimed(struct sandbox *sb);

/** Saves the sandbox's current document to the store (logs on failure). */
void sandbox_persist(struct sandbox *sb);

/** Changes state, records the event with its reason, logs, persists. Clears the detail. */
void sandbox_set_state(struct sandbox *sb, enum sb_state st, const char *reason);

/** Marks sb FAILED with reason (one of sandbox_reason_names) and what went wrong, in words. */
void sandbox_set_failed(struct sandbox *sb, const char *reason, const char *detail);

struct principal;

/**
 * Finds the sandbox named id, as who sees it (daemon/keys.h; NULL: the daemon itself). NULL
 * with err (WR_E_NOT_FOUND) if there is none, or it is another key's: the same answer.
 */
struct sandbox *sandbox_lookup(struct daemon *d, const char *id, const struct principal *who,
                               struct wr_err *err);

/**
 * Returns 0 if sb is running with a live agent, else -1 with err (WR_E_CONFLICT) saying what
 * state it is in and how to get it running.
 */
int sandbox_check_running(const struct sandbox *sb, struct wr_err *err);

/** Returns 0 if no driver operation is in flight on sb, else -1 with err (WR_E_CONFLICT). */
int sandbox_check_idle(const struct sandbox *sb, struct wr_err *err);

/** Moves the lease: it ends timeout_seconds from now (and start gives that much again). */
void sandbox_set_lease(struct sandbox *sb, int timeout_seconds);

/** Replaces the egress policy (copied) and saves it. */
void sandbox_set_network(struct sandbox *sb, json_t *policy);

typedef void (*sandbox_stats_cb)(struct sandbox *sb, int rc, const struct driver_stats *st,
                                 void *arg);

/**
 * Reads sb's resource use through the driver on a worker thread; cb runs on the loop with
 * rc = 0 and the numbers, or rc = -1 (st zeroed). sb is referenced until then.
 */
void sandbox_read_stats(struct sandbox *sb, sandbox_stats_cb cb, void *arg);

/**
 * Adds sb (filled with options, state CREATING) to the daemon and starts it. done runs once on
 * the loop: ok = 1 when the agent answered; ok = 0 with a message after everything created was
 * removed again (the sandbox is then gone from the daemon).
 */
void sandbox_create(struct sandbox *sb, sandbox_done_cb done, void *arg);

/**
 * Starts a stopped or failed sandbox again with its files and a fresh lease. done: ok = 1 when
 * the agent answered; ok = 0 with a message if it did not (the sandbox is then FAILED, files
 * kept).
 */
void sandbox_start(struct sandbox *sb, sandbox_done_cb done, void *arg);

/**
 * Stops a running sandbox: every process ends, the writable layer stays; state STOPPED with
 * reason. done: ok = 0 with a message if the driver failed (the sandbox is then FAILED).
 */
void sandbox_stop(struct sandbox *sb, const char *reason, sandbox_done_cb done, void *arg);

/**
 * Deletes sb: closes the channel, removes every trace through the driver, forgets it.
 * done: ok = 1 when gone; ok = 0 with a message if the driver failed (the sandbox is then
 * FAILED and can be deleted again).
 */
void sandbox_delete(struct sandbox *sb, sandbox_done_cb done, void *arg);

/** Like sandbox_delete, recording reason (e.g. "lease_ended") in the history. */
void sandbox_delete_reason(struct sandbox *sb, const char *reason, sandbox_done_cb done, void *arg);

/**
 * The sandbox's agent is gone or not answering: closes the channel (answering what was in
 * flight), marks it FAILED with reason (NULL = "oom" if the host OOM killer was at work in it,
 * else "agent_died"), and cleans up its runsc state, mounts and cgroups, files kept.
 */
void sandbox_lost(struct sandbox *sb, const char *reason, const char *detail);

/**
 * While a failed sandbox is being cleaned up, queues a delete or start to run when that is
 * done. Returns 0, or -1 if nothing is being cleaned up or something is already queued.
 */
int sandbox_defer(struct sandbox *sb, enum sb_deferred what, sandbox_done_cb done, void *arg);

/** Ends the leases that have run out (called every few hundred ms by the daemon). */
void sandbox_check_leases(struct daemon *d);

/**
 * Returns 1 if sb is stopped or failed, idle, and has been so for at least age seconds
 * (it may be deleted by retention or prune), else 0.
 */
int sandbox_expired(const struct sandbox *sb, int64_t now, int64_t age);

/**
 * Deletes the stopped and failed sandboxes kept longer than the daemon's retention
 * (cfg.stopped_retention; 0 = never), with reason retention_ended.
 */
void sandbox_check_retention(struct daemon *d);

/**
 * At start-up: loads stored sandboxes. Those that were running are stopped through the driver
 * (files kept) and marked stopped with reason daemon_restart; half-created or half-deleted ones
 * are destroyed. The driver work is queued on worker threads; it is done once the daemon's
 * work queue is empty.
 */
int sandbox_load_all(struct daemon *d, struct wr_err *err);

/**
 * At shutdown: closes every channel and queues a stop of every running sandbox through the
 * driver (files kept; state stopped, reason daemon_shutdown). Done once the work queue is.
 */
void sandbox_stop_all(struct daemon *d);

/** At exit, after daemon_shutdown: drops the daemon's list (nothing is persisted). */
void sandbox_free_all(struct daemon *d);

/**
 * The freeze or thaw on a worker finished: queues the stop or destroy that waited for it, if
 * one did. Returns 1 if it did (the sandbox is being torn down: nothing else to do), else 0.
 */
int sandbox_unpark(struct sandbox *sb);

/** Fills a driver spec for sb (strings point into sb and d). */
void sandbox_spec(const struct sandbox *sb, struct driver_spec *spec);

#endif
