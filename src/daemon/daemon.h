/*
 * The daemon: configuration, the shared context of the service, and its
 * opening and closing.
 */
#ifndef WR_DAEMON_H
#define WR_DAEMON_H

#include <event2/event.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "daemon/meter.h"

struct daemon_config {
    char state_dir[PATH_MAX];
    char listen_host[64];
    int listen_port; /* 0 = no TCP listener */
    char socket_path[PATH_MAX];
    char agent_path[PATH_MAX];
    char platform[32]; /* "" = auto */
    char driver[16];   /* "" = the first this host can run */
    int debug;
    size_t max_json_body;      /* bytes of a JSON request body */
    size_t max_upload;         /* bytes of a file upload */
    size_t default_output_cap; /* per stream, per exec */
    size_t max_output_cap;
    int max_cpus;
    int default_timeout; /* lease, seconds */
    int max_timeout;
    int default_exec_timeout; /* seconds */
    int hello_timeout_ms;     /* how long a new sandbox's agent has to say HELLO */
    int agent_deadline_ms;    /* how long a request may wait on a stuck agent */
    int pids_max;             /* processes per sandbox */
    int default_disk_mib;     /* writable-layer quota when create does not say */
    size_t output_budget;     /* bytes of command output and transfers held at once, daemon-wide */
    /* Admission (daemon/admission.c): a create or start past one of these is refused. */
    int max_running;           /* sandboxes creating, starting, running or stopping */
    int max_sandboxes;         /* sandboxes kept, stopped and failed ones too */
    double memory_overcommit;  /* running sandboxes' memory_mib up to host memory x this */
    double disk_overcommit;    /* running sandboxes' disk_mib up to (free - reserve) x this */
    int disk_reserve_mib;      /* free space in the state directory never promised */
    int max_loop_devices;      /* loop devices bound on the host, starts in flight included */
    uint64_t agent_log_max;    /* bytes a sandbox's agent.log is held to (driver/logcap.h) */
    int64_t stopped_retention; /* seconds a stopped or failed sandbox is kept; 0 = forever */
    /* Sandbox networking (net/gateway.h): "auto" (on if this host can, else sandboxes get no
       network and internet:true is refused), "on" (refuse to start without it), "off". */
    char egress[8];
    char dns_upstream[64];           /* "" = the host's first nameserver */
    char public_ranges[1024];        /* extra ranges that count as public (tests) */
    char extra_ca_file[PATH_MAX];    /* PEM certificates sandboxes trust besides the image's */
    char host_names[1024];           /* names the TCP listener answers to besides its address */
    struct meter_prices prices;      /* daemon/meter.h */
    int pool_size;                   /* warm sandboxes of the default shape (daemon/pool.h) */
    char meter_clock_file[PATH_MAX]; /* tests: the meter's clock (unix ms) is read from here */
    uint64_t freeze_after_ms;        /* an idle sandbox is frozen after this long; 0: never
                                        (daemon/idle.h) */
    int session_grace_s; /* a session with no client is killed after this long (session.h) */
};

struct audit_queue;
struct driver_ops;
struct gateway;
struct keys;
struct sandbox;
struct secrets;
struct store;
struct work_queue;

struct daemon {
    struct daemon_config cfg;
    struct event_base *base;
    struct store *store;
    struct work_queue *wq;        /* driver starts, stops, destroys */
    struct work_queue *wq_fast;   /* quick driver reads (stats), never behind a slow start */
    struct work_queue *wq_freeze; /* freezes and thaws (daemon/idle.h): a thaw waits on nothing */
    const struct driver_ops *driver;
    struct sandbox *sandboxes; /* every known sandbox, newest first */
    int nsandboxes;
    int shutting_down;
    int lock_fd;               /* flock on the state directory: one daemon per directory */
    int reaper_started;        /* proc_reaper_start succeeded */
    uint64_t trimmed_ms;       /* when free heap memory last went back to the system */
    size_t output_reserved;    /* of cfg.output_budget, held by running execs and transfers */
    long long host_memory_mib; /* physical memory, read at open */
    struct gateway *gw;        /* sandbox networking; NULL without */
    char gw_error[256];        /* why there is none (egress auto, or off) */
    char *extra_ca_pem;        /* what sandboxes trust besides their image: the daemon's CA and
                                  cfg.extra_ca_file's certificates, read at open; NULL: none */
    struct secrets *secrets;   /* daemon/secrets.h */
    struct keys *keys;         /* API keys (daemon/keys.h) */
    struct meter *meter;       /* money (daemon/meter.h) */
    int pool_refilling;        /* a pool entry is being created (daemon/pool.h) */
    uint64_t pool_retry_ms;    /* monotonic: no refill before this */
    struct audit_queue *audit; /* audit entries not yet written (daemon/admin.c) */
    int memory_pressure;       /* the host is under memory pressure (daemon/pressure.h) */
    uint64_t pressure_read_ms; /* monotonic: when the pressure check last read the host */
};

/**
 * Opens the daemon for cfg (already in d->cfg): state directory and its lock, the driver
 * (chosen and probed), the store, the event loop and workers; then settles the sandboxes a
 * previous run left. Returns 0, or -1 with err set (daemon_close still frees what was made).
 */
int daemon_open(struct daemon *d, struct wr_err *err);

/** Periodic work (leases, the agents' watchdog): call a few times a second on the loop. */
void daemon_tick(struct daemon *d);

/**
 * Shuts down: closes every channel (answering what is in flight), stops every running
 * sandbox through the driver, files kept, and waits for the driver work to finish. Runs
 * once; later calls do nothing.
 */
void daemon_shutdown(struct daemon *d);

/** Writes the audit entries still waiting (daemon/admin.c) and frees their queue: before the
 * store closes. */
void audit_close(struct daemon *d);

/** daemon_shutdown if not done, then frees everything daemon_open made. */
void daemon_close(struct daemon *d);

/**
 * Reserves n bytes of the daemon's output budget for an exec, a background command or a
 * transfer (what it may hold in memory at worst). Returns 0, or -1 with err set
 * (WR_E_UNAVAILABLE) if the budget would be exceeded: memory stays bounded however many
 * callers come, and each is told to retry (or ask for less) instead.
 */
int daemon_reserve_output(struct daemon *d, size_t n, const char *what, struct wr_err *err);

/** Gives back what daemon_reserve_output reserved. */
void daemon_release_output(struct daemon *d, size_t n);

/** Checks what daemon_open would only find bad later (--dns-upstream, --public-ranges).
 * Returns 0, or -1 with err naming the option. */
int daemon_config_check(const struct daemon_config *cfg, struct wr_err *err);

/** Fills cfg with defaults (state dir from $WITHRUNTIME_STATE_DIR or /var/lib/withruntime). */
void daemon_config_defaults(struct daemon_config *cfg);

#endif
