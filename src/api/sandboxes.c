/*
 * /v1/sandboxes: create, list, get, delete, stop, start, timeout, events,
 * stats; and the small system routes (health, images).
 */
#include <event2/buffer.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "daemon/sandbox.h"
#include "daemon/service.h"
#include "net/netpolicy.h"

static const char *const create_fields[] = {
    "image",   "cpus",     "memory_mib",      "disk_mib",
    "env",     "metadata", "timeout_seconds", "on_lease_end",
    "network", "secrets",  "max_cost_micros", NULL};

void api_sandboxes_create(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 1);
    if (!o)
        return;
    struct wr_err err = {0};
    const char *image = "default", *ole = "stop";
    long long cpus, mem, disk, timeout, cap;
    json_t *env = NULL, *md = NULL, *net = NULL, *secrets = NULL;
    if (jv_only(o, create_fields, &err) < 0 || jv_string(o, "image", 64, &image, &err) < 0 ||
        jv_int(o, "cpus", 1, d->cfg.max_cpus, 2 > d->cfg.max_cpus ? d->cfg.max_cpus : 2, &cpus,
               &err) < 0 ||
        jv_int(o, "memory_mib", 128, 65536, 4096, &mem, &err) < 0 ||
        jv_int(o, "disk_mib", 64, 1048576, d->cfg.default_disk_mib, &disk, &err) < 0 ||
        jv_int(o, "timeout_seconds", 1, d->cfg.max_timeout, d->cfg.default_timeout, &timeout,
               &err) < 0 ||
        jv_string(o, "on_lease_end", 16, &ole, &err) < 0 ||
        jv_int(o, "max_cost_micros", 1, 1000000000000LL, -1, &cap, &err) < 0 ||
        jv_string_map(o, "env", 256, 256, 32768, 1, &env, &err) < 0 ||
        jv_string_map(o, "metadata", 64, 128, 1024, 0, &md, &err) < 0)
        goto bad;
    if (strcmp(ole, "stop") != 0 && strcmp(ole, "delete") != 0) {
        wr_err_kind(&err, WR_E_INVALID, 0, "on_lease_end: must be \"stop\" or \"delete\"");
        goto bad;
    }
    secrets = json_object_get(o, "secrets");
    if (json_is_array(secrets) && json_array_size(secrets) == 0)
        secrets = NULL;
    else if (jv_string_array(o, "secrets", 32, 64, &secrets, &err) < 0)
        goto bad;
    net = netpolicy_parse(json_object_get(o, "network"), &err);
    if (!net)
        goto bad;
    struct sandbox_opts opts = {
        .image = image,
        .cpus = (int)cpus,
        .memory_mib = (int)mem,
        .disk_mib = (int)disk,
        .timeout_seconds = (int)timeout,
        .on_lease_end = ole,
        .env = env,
        .metadata = md,
        .network = net,
        .secrets = secrets,
        .max_cost_micros = cap,
    };
    svc_sandbox_create(d, &opts, api_sink_new(req));
    json_decref(net);
    json_decref(o);
    return;
bad:
    json_decref(o);
    api_reply_err(req, &err);
}

/* The n bytes at p, percent-decoded ('+' is a space, as in a form); NULL if malformed, holding
 * a NUL, or not UTF-8 (json_stringn refuses it). */
static json_t *form_piece(const char *p, size_t n)
{
    cleanup_free char *out = xmalloc(n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            out[o++] = p[i] == '+' ? ' ' : p[i];
            continue;
        }
        int hi = i + 2 < n ? hex_digit((unsigned char)p[i + 1]) : -1,
            lo = i + 2 < n ? hex_digit((unsigned char)p[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi | lo) == 0)
            return NULL;
        out[o++] = (char)(hi * 16 + lo);
        i += 2;
    }
    return json_stringn(out, o);
}

/* metadata=K=V&K2=V2 (the form E2B's API takes, itself percent-encoded in the query; a key or
 * value holding '&' or '=' is percent-encoded once more; a pair without '=' is a key with an
 * empty value) into {K: V, ...}. NULL when no sandbox can match it: a key that is empty, or a
 * key or value that is not UTF-8 once decoded, holds a NUL or is not well percent-encoded
 * (metadata holds UTF-8 strings only). Bounded by the query's own length. */
static json_t *parse_metadata_filter(const char *q)
{
    json_t *md = json_object();
    while (*q) {
        size_t len = strcspn(q, "&");
        const char *eq = memchr(q, '=', len);
        size_t klen = eq ? (size_t)(eq - q) : len;
        json_t *k = form_piece(q, klen);
        json_t *v = eq ? form_piece(eq + 1, len - klen - 1) : json_string("");
        if (!k || !v || !json_string_length(k)) {
            json_decref(k);
            json_decref(v);
            json_decref(md);
            return NULL;
        }
        json_object_set_new(md, json_string_value(k), v);
        json_decref(k);
        q += len + (q[len] == '&');
    }
    return md;
}

void api_sandboxes_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct wr_err err = {0};
    struct sandbox_filter f = {.metadata = NULL, .state = -1, .none = 0};
    const char *md = http_req_query(req, "metadata"), *state = http_req_query(req, "state");
    if (state && (f.state = sandbox_state_parse(state)) < 0) {
        wr_err_kind(&err, WR_E_INVALID, 0, "state: not a sandbox state (running, stopped, ...)");
        api_reply_err(req, &err);
        return;
    }
    if (md && !(f.metadata = parse_metadata_filter(md)))
        f.none = 1;
    svc_sandbox_list(d, &f, api_sink_new(req));
    json_decref(f.metadata);
}

void api_sandboxes_get(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_sandbox_get(d, m->params[0], api_sink_new(req));
}

void api_sandboxes_delete(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_sandbox_delete(d, m->params[0], api_sink_new(req));
}

void api_sandboxes_stop(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_sandbox_stop(d, m->params[0], api_sink_new(req));
}

void api_sandboxes_start(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_sandbox_start(d, m->params[0], api_sink_new(req));
}

static const char *const prune_fields[] = {"older_than_seconds", NULL};

void api_sandboxes_prune(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 1);
    if (!o)
        return;
    struct wr_err err = {0};
    long long age;
    /* Up to 100 years, in seconds. */
    int bad = jv_only(o, prune_fields, &err) < 0 ||
              jv_int(o, "older_than_seconds", 0, 3153600000LL, 0, &age, &err) < 0;
    json_decref(o);
    if (bad)
        api_reply_err(req, &err);
    else
        svc_sandbox_prune(d, (int64_t)age, api_sink_new(req));
}

static const char *const timeout_fields[] = {"timeout_seconds", NULL};

void api_sandboxes_timeout(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    struct wr_err err = {0};
    long long t;
    int bad = jv_only(o, timeout_fields, &err) < 0 ||
              jv_int(o, "timeout_seconds", 1, d->cfg.max_timeout, -1, &t, &err) < 0 ||
              (t < 0 && wr_err_kind(&err, WR_E_INVALID, 0, "timeout_seconds: required") < 0);
    json_decref(o);
    if (bad)
        api_reply_err(req, &err);
    else
        svc_sandbox_set_timeout(d, m->params[0], (int)t, api_sink_new(req));
}

void api_sandboxes_network(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    struct wr_err err = {0};
    json_t *net = netpolicy_parse(o, &err);
    json_decref(o);
    if (!net) {
        api_reply_err(req, &err);
        return;
    }
    svc_sandbox_set_network(d, m->params[0], net, api_sink_new(req));
    json_decref(net);
}

void api_sandboxes_network_log(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_sandbox_network_log(d, m->params[0], api_sink_new(req));
}

void api_sandboxes_events(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_sandbox_events(d, m->params[0], api_sink_new(req));
}

void api_sandboxes_stats(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_sandbox_stats(d, m->params[0], api_sink_new(req));
}

void api_health(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_health(d, api_sink_new(req));
}

void api_images_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_images(d, api_sink_new(req));
}

void api_metrics(struct daemon *d, struct http_req *req, struct route_match *m)
{
    (void)m;
    struct evbuffer *out = evbuffer_new();
    metrics_render(d, out);
    size_t n = evbuffer_get_length(out);
    http_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8", evbuffer_pullup(out, -1), n);
    evbuffer_free(out);
}
