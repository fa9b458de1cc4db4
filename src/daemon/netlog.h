/*
 * A sandbox's network log: its recent denied lookups and connections, kept in memory (a ring
 * of NETLOG_MAX entries, made on the first denial), for GET /v1/sandboxes/{id}/network/log.
 * The daemon's own log gets the first NETLOG_DAEMON_BURST denials of each minute per sandbox,
 * so a sandbox hammering a blocked host cannot fill the host's disk.
 */
#ifndef WR_DAEMON_NETLOG_H
#define WR_DAEMON_NETLOG_H

#include <jansson.h>
#include <stdint.h>

#define NETLOG_MAX 200
#define NETLOG_DAEMON_BURST 20

struct netlog;

/** Records a denial in *log (made if NULL). via: "dns" or "proxy". Returns 1 if the daemon's
 * log should get it too (within the burst), else 0. */
int netlog_add(struct netlog **log, const char *via, const char *host, int port, const char *reason,
               int64_t now_ms);

/** Notes a connection let through; returns 1 if the daemon's log should get it (the first
 * NETLOG_DAEMON_BURST of each minute per sandbox), else 0. Allowed ones are not kept. */
int netlog_note_allowed(struct netlog **log, int64_t now_ms);

/** {"entries": [{"time", "via", "host", "port", "reason"}...] oldest first, "total": n}. */
json_t *netlog_to_json(const struct netlog *log);

void netlog_free(struct netlog *log);

#endif
