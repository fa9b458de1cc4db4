/* The per-sandbox ring of denied network attempts (netlog.h). */
#include "daemon/netlog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct netlog_entry {
    int64_t ms;
    char via[8];
    char host[256];
    int port;
    char reason[32];
};

struct netlog {
    struct netlog_entry e[NETLOG_MAX];
    unsigned head; /* the next slot written */
    unsigned n;    /* entries held */
    uint64_t total;
    int64_t minute_start_ms;
    unsigned minute_count;
    int64_t allowed_minute_start_ms;
    unsigned allowed_minute_count;
};

int netlog_add(struct netlog **logp, const char *via, const char *host, int port,
               const char *reason, int64_t now_ms)
{
    if (!*logp)
        *logp = xcalloc(1, sizeof(**logp));
    struct netlog *log = *logp;
    struct netlog_entry *e = &log->e[log->head];
    e->ms = now_ms;
    snprintf(e->via, sizeof(e->via), "%s", via ? via : "");
    snprintf(e->host, sizeof(e->host), "%s", host ? host : "");
    e->port = port;
    snprintf(e->reason, sizeof(e->reason), "%s", reason ? reason : "");
    log->head = (log->head + 1) % NETLOG_MAX;
    if (log->n < NETLOG_MAX)
        log->n++;
    log->total++;
    if (now_ms - log->minute_start_ms >= 60000) {
        log->minute_start_ms = now_ms;
        log->minute_count = 0;
    }
    return ++log->minute_count <= NETLOG_DAEMON_BURST;
}

int netlog_note_allowed(struct netlog **logp, int64_t now_ms)
{
    if (!*logp)
        *logp = xcalloc(1, sizeof(**logp));
    struct netlog *log = *logp;
    if (now_ms - log->allowed_minute_start_ms >= 60000) {
        log->allowed_minute_start_ms = now_ms;
        log->allowed_minute_count = 0;
    }
    return ++log->allowed_minute_count <= NETLOG_DAEMON_BURST;
}

json_t *netlog_to_json(const struct netlog *log)
{
    json_t *arr = json_array();
    unsigned n = log ? log->n : 0;
    for (unsigned i = 0; i < n; i++) {
        const struct netlog_entry *e = &log->e[(log->head + NETLOG_MAX - n + i) % NETLOG_MAX];
        char ts[40];
        format_rfc3339(e->ms / 1000, ts, sizeof(ts));
        json_array_append_new(arr,
                              json_pack("{s:s, s:s, s:s, s:i, s:s}", "time", ts, "via", e->via,
                                        "host", e->host, "port", e->port, "reason", e->reason));
    }
    return json_pack("{s:o, s:I}", "entries", arr, "total", (json_int_t)(log ? log->total : 0));
}

void netlog_free(struct netlog *log)
{
    free(log);
}
