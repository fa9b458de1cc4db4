/*
 * The daemon: configuration, the shared context every API handler gets, and
 * the entry point of `withruntime serve`.
 */
#ifndef WR_DAEMON_H
#define WR_DAEMON_H

#include <event2/event.h>
#include <limits.h>
#include <stddef.h>

#include "driver/driver.h"

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
    int pids_max;             /* processes per sandbox */
    int default_disk_mib;     /* writable-layer quota when create does not say */
};

struct sandbox;
struct http_server;
struct store;
struct work_queue;

struct daemon {
    struct daemon_config cfg;
    struct event_base *base;
    struct http_server *http;
    struct store *store;
    struct work_queue *wq;
    const struct driver_ops *driver;
    struct sandbox *sandboxes; /* every known sandbox, newest first */
    int nsandboxes;
    int shutting_down;
    struct event *sigterm, *sigint;
};

/** `withruntime serve [flags]`: runs the daemon until SIGTERM/SIGINT. argv[0] is "serve". */
int daemon_main(int argc, char **argv);

/** Fills cfg with defaults (state dir from $WITHRUNTIME_STATE_DIR or /var/lib/withruntime). */
void daemon_config_defaults(struct daemon_config *cfg);

#endif
