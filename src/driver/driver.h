/*
 * The isolation seam: a driver creates, starts, stops and destroys sandboxes
 * and hands the daemon one byte stream to the agent inside. Everything else
 * (API, files, leases, money, egress) is driver-independent.
 *
 * Every operation here blocks (it runs runsc, mounts, ...) and is called from
 * a worker thread, never from the event loop. Operations on different
 * sandboxes may run concurrently; the caller never runs two operations on the
 * same sandbox at once.
 */
#ifndef WR_DRIVER_H
#define WR_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

#define DRIVER_ID_LEN 24 /* sandbox ids are fixed-width: "sb-" + 21 lowercase base32 chars */

/** What a sandbox is made of. Strings are borrowed for the duration of the call. */
struct driver_spec {
    const char *id;           /* fixed-width id, [a-z0-9-], DRIVER_ID_LEN chars */
    const char *dir;          /* per-sandbox directory on the host (exists; driver owns its
                                 contents: writable layer, bundle, logs) */
    const char *image_rootfs; /* read-only image root filesystem shared by every sandbox */
    const char *agent_path;   /* host path of the static withruntime-agent binary */
    int cpus;                 /* CPU limit, whole vCPUs (>= 1) */
    int memory_mib;           /* memory for the sandbox's processes */
    int pids_max;             /* process-count cap inside the sandbox */
    int disk_mib;             /* quota on the writable layer */
    /* Networking (start only): the sandbox's own network namespace, already plumbed by the
       daemon's gateway (net/gateway.h); 0 or -1 for none at all (loopback only: a zeroed spec
       has no network, and fd 0 is never a namespace). The driver borrows the fd for the call.
       nameserver: the resolver's address the sandbox is given (dotted quad; "" without networking).
     */
    int netns_fd;
    char nameserver[16];
    /* PEM certificates the sandbox trusts besides its image's (NULL or "": none): appended to
       the image's /etc/ssl/certs/ca-certificates.crt in a copy mounted read-only over it. */
    const char *extra_ca_pem;
};

/** Resource use as measured on the host. */
struct driver_stats {
    uint64_t cpu_usec;     /* CPU time used since the sandbox started */
    uint64_t memory_bytes; /* current memory use */
    uint64_t pids;         /* current number of host tasks */
    uint64_t oom_kills;    /* processes the host OOM killer killed in it since it started */
};

struct driver_config;

struct driver_ops {
    const char *name; /* "gvisor", "fake" */

    /** Stores the global configuration. Called once, before any other operation. */
    int (*configure)(const struct driver_config *cfg, struct wr_err *err);

    /**
     * Checks whether this host can run the driver. Returns 0 if it can, -1 with the reason in
     * err if not. Fills `detail` (NUL-terminated, may be empty) with what was found, e.g.
     * "runsc 0.0~20240729.0, platform systrap".
     */
    int (*probe)(char *detail, size_t detail_len, struct wr_err *err);

    /**
     * Prepares the sandbox's writable layer in spec->dir (first start only; idempotent) and
     * starts it: on success the agent is running as PID 1 and *chan_fd (O_CLOEXEC,
     * caller owns it) is the daemon's end of the byte stream to it. On failure everything the
     * start did is undone (the writable layer stays).
     */
    int (*start)(const struct driver_spec *spec, int *chan_fd, struct wr_err *err);

    /**
     * Stops the sandbox: every process in it ends; runsc state, mounts and cgroups are removed;
     * the writable layer in spec->dir stays. Stopping a stopped (or half-started) sandbox
     * succeeds.
     */
    int (*stop)(const struct driver_spec *spec, struct wr_err *err);

    /**
     * Stops the sandbox if needed and removes every trace of it, including spec->dir itself.
     * Works after a daemon restart from the spec alone.
     */
    int (*destroy)(const struct driver_spec *spec, struct wr_err *err);

    /** Returns 1 if the sandbox's container is running, 0 if not, -1 on error. */
    int (*is_running)(const struct driver_spec *spec, struct wr_err *err);

    /** Reads the sandbox's resource use. */
    int (*stats)(const struct driver_spec *spec, struct driver_stats *out, struct wr_err *err);

    /**
     * Freezes (frozen = 1) every process of a running sandbox so it uses no CPU at all, or
     * thaws it (0). A frozen sandbox keeps its memory and its channel (bytes sent to it wait);
     * stop and destroy work on a frozen sandbox (they thaw it first). A freeze that cannot
     * complete leaves the sandbox thawed and fails. NULL: this driver cannot freeze, and the
     * daemon never asks it to.
     */
    int (*freeze)(const struct driver_spec *spec, int frozen, struct wr_err *err);
};

/** Global driver configuration, set once by the daemon before any call. */
struct driver_config {
    const char *state_dir; /* e.g. /var/lib/withruntime; drivers keep their state under it */
    const char *platform;  /* gvisor platform override (NULL = auto: systrap, else ptrace) */
    int debug;             /* keep runsc debug logs in the sandbox dir */
    /* Bytes a sandbox's agent.log is held to at every write (0: LOGCAP_DEFAULT_MAX; see
       driver/logcap.h). */
    uint64_t agent_log_max;
};

/** Checks a sandbox id before it goes into paths, cgroup names or command lines. 0 or -1. */
int driver_check_id(const char *id, struct wr_err *err);

/**
 * Checks a host path that goes into an overlayfs option string (absolute, no ',', ':' or '\\',
 * not "/", not too long); `what` names it in the message. Returns 0 or -1.
 */
int driver_check_overlay_path(const char *what, const char *p, struct wr_err *err);

/** Looks up a driver by name ("gvisor", "fake"); NULL if unknown. */
const struct driver_ops *driver_find(const char *name);

/**
 * Chooses, configures and probes the driver the daemon will use: the one named (NULL or ""
 * = the first production driver whose probe passes, as `doctor` would say). Fills detail
 * with the probe's findings. Returns the driver, or NULL with err saying why.
 */
const struct driver_ops *driver_select(const char *name, const struct driver_config *cfg,
                                       char *detail, size_t detail_len, struct wr_err *err);

/**
 * Marks the calling thread as one that must never call a driver (the daemon's event loop).
 * Later driver_* calls from it abort in builds without NDEBUG.
 */
void driver_forbid_this_thread(void);

/*
 * The daemon calls drivers only through these, which check the thread (see above) and
 * dispatch to drv's operation of the same name.
 */
int driver_start(const struct driver_ops *drv, const struct driver_spec *spec, int *chan_fd,
                 struct wr_err *err);
int driver_stop(const struct driver_ops *drv, const struct driver_spec *spec, struct wr_err *err);
int driver_destroy(const struct driver_ops *drv, const struct driver_spec *spec,
                   struct wr_err *err);
int driver_stats(const struct driver_ops *drv, const struct driver_spec *spec,
                 struct driver_stats *out, struct wr_err *err);
int driver_freeze(const struct driver_ops *drv, const struct driver_spec *spec, int frozen,
                  struct wr_err *err);

#endif
