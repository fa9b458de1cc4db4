/*
 * Routing for /v1 and the helpers every handler shares (body parsing with
 * limits, query integers).
 */
#include "api/api.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/door.h"
#include "api/jsonv.h"
#include "common/ids.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/keys.h"
#include "daemon/metrics.h"
#include "daemon/sandbox.h"
#include "daemon/service.h"

typedef void (*handler_fn)(struct daemon *, struct http_req *, struct route_match *);

enum {
    H_HEALTH,
    H_IMAGES,
    H_SB_CREATE,
    H_SB_LIST,
    H_SB_GET,
    H_SB_DELETE,
    H_SB_EVENTS,
    H_SB_STOP,
    H_SB_START,
    H_SB_TIMEOUT,
    H_SB_NETWORK,
    H_SB_NETLOG,
    H_SECRETS_LIST,
    H_SECRET_GET,
    H_SECRET_SET,
    H_SECRET_UPDATE,
    H_SECRET_DELETE,
    H_SB_STATS,
    H_SB_PRUNE,
    H_EXEC,
    H_CMD_LIST,
    H_CMD_GET,
    H_CMD_OUT,
    H_CMD_WAIT,
    H_CMD_SIGNAL,
    H_F_READ,
    H_F_WRITE,
    H_F_LIST,
    H_F_STAT,
    H_F_MKDIR,
    H_F_REMOVE,
    H_F_ARCHIVE,
    H_F_EXTRACT,
    H_KEYS_CREATE,
    H_KEYS_LIST,
    H_KEY_GET,
    H_KEY_UPDATE,
    H_KEY_REVOKE,
    H_AUDIT,
    H_USAGE,
    H_METRICS,
    H_SES_CREATE,
    H_SES_LIST,
    H_SES_GET,
    H_SES_DELETE,
    H_SES_CONNECT,
    H_WHOAMI,
};

static const handler_fn handlers[] = {
    [H_HEALTH] = api_health,
    [H_IMAGES] = api_images_list,
    [H_SB_CREATE] = api_sandboxes_create,
    [H_SB_LIST] = api_sandboxes_list,
    [H_SB_GET] = api_sandboxes_get,
    [H_SB_DELETE] = api_sandboxes_delete,
    [H_SB_EVENTS] = api_sandboxes_events,
    [H_SB_STOP] = api_sandboxes_stop,
    [H_SB_START] = api_sandboxes_start,
    [H_SB_TIMEOUT] = api_sandboxes_timeout,
    [H_SB_NETWORK] = api_sandboxes_network,
    [H_SB_NETLOG] = api_sandboxes_network_log,
    [H_SECRETS_LIST] = api_secrets_list,
    [H_SECRET_GET] = api_secrets_get,
    [H_SECRET_SET] = api_secrets_set,
    [H_SECRET_UPDATE] = api_secrets_update,
    [H_SECRET_DELETE] = api_secrets_delete,
    [H_SB_STATS] = api_sandboxes_stats,
    [H_SB_PRUNE] = api_sandboxes_prune,
    [H_EXEC] = api_exec,
    [H_CMD_LIST] = api_commands_list,
    [H_CMD_GET] = api_commands_get,
    [H_CMD_OUT] = api_commands_output,
    [H_CMD_WAIT] = api_commands_wait,
    [H_CMD_SIGNAL] = api_commands_signal,
    [H_F_READ] = api_files_read,
    [H_F_WRITE] = api_files_write,
    [H_F_LIST] = api_files_list,
    [H_F_STAT] = api_files_stat,
    [H_F_MKDIR] = api_files_mkdir,
    [H_F_REMOVE] = api_files_remove,
    [H_F_ARCHIVE] = api_files_archive,
    [H_F_EXTRACT] = api_files_extract,
    [H_KEYS_CREATE] = api_keys_create,
    [H_KEYS_LIST] = api_keys_list,
    [H_KEY_GET] = api_keys_get,
    [H_KEY_UPDATE] = api_keys_update,
    [H_KEY_REVOKE] = api_keys_revoke,
    [H_AUDIT] = api_audit_list,
    [H_USAGE] = api_usage,
    [H_METRICS] = api_metrics,
    [H_SES_CREATE] = api_sessions_create,
    [H_SES_LIST] = api_sessions_list,
    [H_SES_GET] = api_sessions_get,
    [H_SES_DELETE] = api_sessions_delete,
    [H_SES_CONNECT] = api_sessions_connect,
    [H_WHOAMI] = api_whoami,
};

/* Who may call a route: anyone let in (reads), a key that is not read-only, the admin, the
 * admin or an auditor key (reading keys and the audit trail), or (for /metrics) the admin or a
 * metrics key. */
enum access { A_READ, A_WRITE, A_ADMIN, A_AUDIT, A_METRICS };

static enum access access_of(int handler, const char *method)
{
    switch (handler) {
    case H_SECRETS_LIST:
    case H_SECRET_GET:
    case H_SECRET_SET:
    case H_SECRET_UPDATE:
    case H_SECRET_DELETE:
    case H_KEYS_CREATE:
    case H_KEY_GET:
    case H_KEY_UPDATE:
    case H_KEY_REVOKE: return A_ADMIN;
    case H_KEYS_LIST:
    case H_AUDIT: return A_AUDIT;
    case H_METRICS: return A_METRICS;
    case H_CMD_WAIT: return A_READ;     /* a POST for its body, but it changes nothing */
    case H_SES_CONNECT: return A_WRITE; /* a GET that types into a shell */
    default: return !strcmp(method, "GET") || !strcmp(method, "HEAD") ? A_READ : A_WRITE;
    }
}

/* What the API keeps about a request while it is answered (http_req_set_data). */
struct api_call {
    struct principal who;
    int let_in;         /* the door let it in */
    const char *method; /* static strings */
    const char *route;  /* the matched route's pattern; NULL if none matched */
    int handler;        /* the matched route's; -1 if none */
    uint64_t start_us;  /* monotonic: when it came in */
    char sandbox_id[40];
};

static const struct route routes[] = {
    {"GET", "/metrics", H_METRICS, NULL},
    {"GET", "/v1/health", H_HEALTH, NULL},
    {"GET", "/v1/images", H_IMAGES, NULL},
    {"GET", "/v1/whoami", H_WHOAMI, NULL},
    {"POST", "/v1/keys", H_KEYS_CREATE, NULL},
    {"GET", "/v1/keys", H_KEYS_LIST, NULL},
    {"GET", "/v1/keys/{id}", H_KEY_GET, NULL},
    {"PATCH", "/v1/keys/{id}", H_KEY_UPDATE, NULL},
    {"POST", "/v1/keys/{id}/revoke", H_KEY_REVOKE, NULL},
    {"GET", "/v1/audit", H_AUDIT, "before,limit"},
    {"GET", "/v1/usage", H_USAGE, "from,to,group_by,sandbox"},
    {"GET", "/v1/secrets", H_SECRETS_LIST, NULL},
    {"GET", "/v1/secrets/{name}", H_SECRET_GET, NULL},
    {"PUT", "/v1/secrets/{name}", H_SECRET_SET, NULL},
    {"PATCH", "/v1/secrets/{name}", H_SECRET_UPDATE, NULL},
    {"DELETE", "/v1/secrets/{name}", H_SECRET_DELETE, NULL},
    {"POST", "/v1/sandboxes", H_SB_CREATE, NULL},
    {"GET", "/v1/sandboxes", H_SB_LIST, "metadata,state"},
    {"POST", "/v1/sandboxes/prune", H_SB_PRUNE, NULL},
    {"GET", "/v1/sandboxes/{id}", H_SB_GET, NULL},
    {"DELETE", "/v1/sandboxes/{id}", H_SB_DELETE, NULL},
    {"GET", "/v1/sandboxes/{id}/events", H_SB_EVENTS, NULL},
    {"GET", "/v1/sandboxes/{id}/stats", H_SB_STATS, NULL},
    {"POST", "/v1/sandboxes/{id}/stop", H_SB_STOP, NULL},
    {"POST", "/v1/sandboxes/{id}/start", H_SB_START, NULL},
    {"POST", "/v1/sandboxes/{id}/timeout", H_SB_TIMEOUT, NULL},
    {"PUT", "/v1/sandboxes/{id}/network", H_SB_NETWORK, NULL},
    {"GET", "/v1/sandboxes/{id}/network/log", H_SB_NETLOG, NULL},
    {"POST", "/v1/sandboxes/{id}/exec", H_EXEC, NULL},
    {"GET", "/v1/sandboxes/{id}/commands", H_CMD_LIST, NULL},
    {"GET", "/v1/sandboxes/{id}/commands/{cid}", H_CMD_GET, NULL},
    {"GET", "/v1/sandboxes/{id}/commands/{cid}/output", H_CMD_OUT, "stdout_offset,stderr_offset"},
    {"POST", "/v1/sandboxes/{id}/commands/{cid}/wait", H_CMD_WAIT, NULL},
    {"POST", "/v1/sandboxes/{id}/commands/{cid}/signal", H_CMD_SIGNAL, NULL},
    {"GET", "/v1/sandboxes/{id}/files/content", H_F_READ, "path,offset,length"},
    {"PUT", "/v1/sandboxes/{id}/files/content", H_F_WRITE, "path,mode,parents,offset"},
    {"GET", "/v1/sandboxes/{id}/files/list", H_F_LIST, "path"},
    {"GET", "/v1/sandboxes/{id}/files/stat", H_F_STAT, "path"},
    {"POST", "/v1/sandboxes/{id}/files/mkdir", H_F_MKDIR, NULL},
    {"DELETE", "/v1/sandboxes/{id}/files", H_F_REMOVE, "path,recursive"},
    {"GET", "/v1/sandboxes/{id}/files/archive", H_F_ARCHIVE, "path"},
    {"POST", "/v1/sandboxes/{id}/files/extract", H_F_EXTRACT, NULL},
    {"POST", "/v1/sandboxes/{id}/sessions", H_SES_CREATE, NULL},
    {"GET", "/v1/sandboxes/{id}/sessions", H_SES_LIST, NULL},
    {"GET", "/v1/sandboxes/{id}/sessions/{sid}", H_SES_GET, NULL},
    {"DELETE", "/v1/sandboxes/{id}/sessions/{sid}", H_SES_DELETE, NULL},
    {"GET", "/v1/sandboxes/{id}/sessions/{sid}/connect", H_SES_CONNECT, NULL},
};

static const char *pattern_of(int handler)
{
    for (size_t i = 0; i < WR_ARRAY_LEN(routes); i++)
        if (routes[i].handler == handler)
            return routes[i].pattern;
    return NULL;
}

/* The checks a matched route makes before its handler runs: who may call it, and a JSON
 * body's Content-Type. Answers and returns -1 if they fail. */
static int route_allows(struct http_req *req, const struct api_call *c, int handler)
{
    enum access a = access_of(handler, c->method);
    /* An auditor key: a list of what it may do, so a route added later is refused to it. */
    if (c->who.auditor && handler != H_KEYS_LIST && handler != H_AUDIT && handler != H_USAGE &&
        handler != H_WHOAMI) {
        http_reply_error(req, 403, "forbidden",
                         "key %s is an auditor key: it may GET /v1/keys, /v1/audit, /v1/usage "
                         "and /v1/whoami, not %s %s",
                         c->who.key_id, c->method, c->route);
        return -1;
    }
    if (c->who.metrics_only && a != A_METRICS) {
        http_reply_error(req, 403, "forbidden",
                         "key %s is a metrics key: it may GET /metrics and nothing else",
                         c->who.key_id);
        return -1;
    }
    if (a == A_METRICS && !c->who.admin && !c->who.metrics_only) {
        http_reply_error(req, 403, "forbidden",
                         "GET /metrics is the admin's or a metrics key's (`withruntime keys create "
                         "NAME --metrics`)");
        return -1;
    }
    if (a == A_AUDIT && !c->who.admin && !c->who.auditor) {
        http_reply_error(req, 403, "forbidden",
                         "%s %s is the admin's (root on the daemon's Unix socket, without a key) "
                         "or an auditor key's (`withruntime keys create NAME --auditor`)",
                         c->method, c->route);
        return -1;
    }
    if (a == A_ADMIN && !c->who.admin) {
        http_reply_error(req, 403, "forbidden",
                         "%s %s is the admin's (root on the daemon's Unix socket, without a key)",
                         c->method, c->route);
        return -1;
    }
    if (a == A_WRITE && c->who.read_only) {
        http_reply_error(req, 403, "forbidden",
                         "key %s is read-only: it may list and inspect, not %s %s", c->who.key_id,
                         c->method, c->route);
        return -1;
    }
    if (a != A_READ && handler != H_F_WRITE && !door_content_type_ok(req)) {
        http_reply_error(req, 415, "unsupported_media_type",
                         "the body must be JSON, sent with Content-Type: application/json");
        return -1;
    }
    return 0;
}

/* An Allow list names HEAD where GET answers (every GET route but the shell's WebSocket). */
static void allow_head(char *allow, size_t size, const char *path)
{
    struct route_match g;
    if (strstr(allow, "HEAD") ||
        route_find(routes, WR_ARRAY_LEN(routes), "GET", path, &g) != ROUTE_OK ||
        g.handler == H_SES_CONNECT)
        return;
    size_t used = strlen(allow);
    snprintf(allow + used, size - used, ", HEAD");
}

void api_handle(struct http_req *req, void *ctx)
{
    struct daemon *d = ctx;
    const char *method = http_req_method(req);
    const char *path = http_req_path(req);
    struct api_call *c = xcalloc(1, sizeof(*c));
    c->method = method;
    c->handler = -1;
    c->start_us = now_us_monotonic();
    http_req_set_data(req, c, free);
    if (d->shutting_down) {
        http_reply_error(req, 503, "unavailable", "the daemon is shutting down");
        return;
    }
    if (http_req_has_nul(req)) {
        http_reply_error(req, 400, "invalid_request",
                         "the request's path or query contains a NUL byte (%%00)");
        return;
    }
    if (http_req_query_bad(req)) {
        http_reply_error(req, 400, "invalid_request", "malformed query string");
        return;
    }
    if (api_web_is_asset(method, path)) {
        api_web_serve(d, req);
        return;
    }
    if (door_check(d, req, &c->who) < 0)
        return;
    c->let_in = 1;
    /* HEAD is a GET without its body (RFC 9110 9.3.2): the GET route answers it, and the
     * HTTP layer sends the head only. Not the shell's WebSocket: a head cannot be upgraded. */
    int head = strcmp(method, "HEAD") == 0;
    struct route_match m;
    enum route_result found =
        route_find(routes, WR_ARRAY_LEN(routes), head ? "GET" : method, path, &m);
    if (head && found == ROUTE_OK && m.handler == H_SES_CONNECT) {
        found = ROUTE_BAD_METHOD;
        snprintf(m.allow, sizeof(m.allow), "GET");
    }
    if (found == ROUTE_BAD_METHOD)
        allow_head(m.allow, sizeof(m.allow), path);
    switch (found) {
    case ROUTE_OK: {
        c->route = pattern_of(m.handler);
        c->handler = m.handler;
        /* The audit names a sandbox only by a well-formed id. */
        if (c->route && strncmp(c->route, "/v1/sandboxes/{id}", 18) == 0 &&
            sb_id_valid(m.params[0]))
            snprintf(c->sandbox_id, sizeof(c->sandbox_id), "%.39s", m.params[0]);
        /* Who may call it comes first: a read-only key gets its 403 whatever it sent. */
        if (route_allows(req, c, m.handler) < 0)
            return;
        const char *unknown = http_req_query_unknown(req, m.query);
        if (unknown) {
            http_reply_error(req, 400, "invalid_request",
                             "%.64s: unknown query parameter (this route takes: %s)", unknown,
                             m.query ? m.query : "none");
            return;
        }
        handlers[m.handler](d, req, &m);
        return;
    }
    case ROUTE_NOT_FOUND:
        if (api_web_is_asset(NULL, path)) { /* a dashboard file, with a method other than GET */
            http_reply_header(req, "Allow", "GET, HEAD");
            http_reply_error(req, 405, "method_not_allowed",
                             "%s is not allowed on %.200s (allowed: GET, HEAD)", method, path);
            return;
        }
        http_reply_error(req, 404, "not_found", "no such route: %s %.200s", method, path);
        return;
    case ROUTE_BAD_METHOD:
        http_reply_header(req, "Allow", m.allow);
        http_reply_error(req, 405, "method_not_allowed",
                         "%s is not allowed on %.200s (allowed: %s)", method, path, m.allow);
        return;
    default:
        http_reply_error(req, 404, "not_found", "no such route: %s %.200s", method, path);
        return;
    }
}

const struct principal *api_req_who(struct http_req *req)
{
    const struct api_call *c = http_req_data(req);
    return c && c->let_in ? &c->who : NULL;
}

void api_req_note_sandbox(struct http_req *req, const char *id)
{
    struct api_call *c = http_req_data(req);
    if (c && id)
        snprintf(c->sandbox_id, sizeof(c->sandbox_id), "%.39s", id);
}

void api_reply_hook(struct http_req *req, int status, void *ctx)
{
    const struct api_call *c = http_req_data(req);
    if (c && c->let_in && c->handler == H_SB_CREATE) {
        if (status == 201) {
            metrics_add(MC_CREATES_OK, 1);
            metrics_observe_us(MH_CREATE, now_us_monotonic() - c->start_us);
        } else {
            /* 503: refused before anything was made (no room, shutting down); a create that
             * failed after admission answers 500. */
            metrics_add(status >= 500 && status != 503 ? MC_CREATES_FAILED : MC_CREATES_REFUSED, 1);
        }
    }
    if (!c || !c->let_in || !c->route || !strcmp(c->method, "GET") || !strcmp(c->method, "HEAD") ||
        c->handler == H_CMD_WAIT)
        return; /* the audit keeps what changes things */
    svc_audit_record(ctx, &c->who, c->method, c->route, c->sandbox_id, status);
}

size_t api_body_limit(const char *method, const char *target, void *ctx)
{
    const struct daemon *d = ctx;
    /* File uploads take the upload limit; every other route takes JSON (or nothing), so the
     * JSON limit. Matched on the raw target: an encoded path can only get the smaller limit. */
    static const char upload[] = "/files/content";
    size_t n = strcspn(target, "?#");
    size_t u = sizeof(upload) - 1;
    if (strcmp(method, "PUT") == 0 && n >= u && memcmp(target + n - u, upload, u) == 0)
        return d->cfg.max_upload;
    return d->cfg.max_json_body;
}

json_t *api_json_body(struct daemon *d, struct http_req *req, int empty_ok)
{
    size_t n = http_req_body_len(req);
    if (n > d->cfg.max_json_body) {
        http_reply_error(req, 413, "payload_too_large",
                         "request body is %zu bytes; the limit for JSON bodies is %zu", n,
                         d->cfg.max_json_body);
        return NULL;
    }
    if (n == 0 && empty_ok)
        return json_object();
    char *body = http_req_body_string(req);
    if (!body) {
        http_reply_error(req, 400, "invalid_request", "request body contains a NUL byte");
        return NULL;
    }
    struct wr_err err = {0};
    json_t *o = jv_parse_object(body, &err);
    free(body);
    if (!o)
        api_reply_err(req, &err);
    return o;
}

int api_query_u64(struct http_req *req, const char *name, uint64_t def, uint64_t *out)
{
    const char *s = http_req_query(req, name);
    *out = def;
    if (!s)
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    /* strtoull would take leading blanks and signs; a parameter is digits only */
    if (!*s || strlen(s) > 19 || errno || *end || s[0] < '0' || s[0] > '9') {
        http_reply_error(req, 400, "invalid_request", "%s: must be a non-negative integer", name);
        return -1;
    }
    *out = v;
    return 0;
}

void api_reply_invalid(struct http_req *req, const char *msg)
{
    http_reply_error(req, 400, "invalid_request", "%s", msg);
}
