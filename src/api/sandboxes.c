/*
 * /v1/sandboxes: create, list, get, delete, events; and the small system
 * routes (health, images).
 */
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/sandbox.h"
#include "image/image.h"
#include "store/store.h"

#ifndef WR_VERSION
#define WR_VERSION "0.1.0"
#endif

static const char *const create_fields[] = {
    "image",           "cpus",         "memory_mib", "disk_mib", "env", "metadata",
    "timeout_seconds", "on_lease_end", "network",    NULL};

struct create_req {
    struct http_req *req;
};

static void create_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    struct http_req *req = arg;
    if (ok)
        http_reply_json(req, 201, sandbox_to_json(sb));
    else
        http_reply_error(req, 500, "internal", "sandbox could not be created: %s", message);
}

void api_sandboxes_create(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 1);
    if (!o)
        return;
    char msg[JV_MSG];
    const char *image = "default", *ole = "stop";
    long long cpus, mem, disk, timeout;
    json_t *env = NULL, *md = NULL, *net = json_object_get(o, "network");
    if (jv_only(o, create_fields, msg) < 0 || jv_string(o, "image", 64, &image, msg) < 0 ||
        jv_int(o, "cpus", 1, d->cfg.max_cpus, 2 > d->cfg.max_cpus ? d->cfg.max_cpus : 2, &cpus,
               msg) < 0 ||
        jv_int(o, "memory_mib", 128, 65536, 4096, &mem, msg) < 0 ||
        jv_int(o, "disk_mib", 64, 1048576, d->cfg.default_disk_mib, &disk, msg) < 0 ||
        jv_int(o, "timeout_seconds", 1, d->cfg.max_timeout, d->cfg.default_timeout, &timeout, msg) <
            0 ||
        jv_string(o, "on_lease_end", 16, &ole, msg) < 0 ||
        jv_string_map(o, "env", 256, 256, 32768, 1, &env, msg) < 0 ||
        jv_string_map(o, "metadata", 64, 128, 1024, 0, &md, msg) < 0)
        goto bad;
    if (strcmp(ole, "stop") != 0 && strcmp(ole, "delete") != 0) {
        snprintf(msg, sizeof(msg), "on_lease_end: must be \"stop\" or \"delete\"");
        goto bad;
    }
    static const char *const network_fields[] = {"internet", "allow", NULL};
    if (net && json_is_object(net) && jv_only(net, network_fields, msg) < 0) {
        char inner[JV_MSG];
        snprintf(inner, sizeof(inner), "network.%s", msg);
        snprintf(msg, sizeof(msg), "%s", inner);
        goto bad;
    }
    if (net && !json_is_null(net)) {
        json_t *internet = json_object_get(net, "internet");
        json_t *allow = json_object_get(net, "allow");
        if (!json_is_object(net) || (internet && !json_is_boolean(internet)) ||
            (allow && !json_is_array(allow))) {
            snprintf(
                msg, sizeof(msg),
                "network: must be an object like {\"internet\": true, \"allow\": [\"pypi.org\"]}");
            goto bad;
        }
        size_t i;
        json_t *h;
        json_array_foreach(allow, i, h)
        {
            if (!json_is_string(h) || json_string_length(h) == 0 || json_string_length(h) > 253) {
                snprintf(msg, sizeof(msg), "network.allow[%zu]: must be a host name", i);
                goto bad;
            }
        }
    }

    char rootfs[PATH_MAX];
    struct wr_err err = {0};
    if (image_rootfs(d->cfg.state_dir, image, rootfs, sizeof(rootfs), &err) < 0) {
        json_decref(o);
        http_reply_error(req, 400, "invalid_request", "image: %s", err.msg);
        return;
    }

    struct sandbox *sb = sandbox_new(d);
    sandbox_new_id(sb->id);
    snprintf(sb->image, sizeof(sb->image), "%s", image);
    snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", rootfs);
    sb->cpus = (int)cpus;
    sb->memory_mib = (int)mem;
    sb->disk_mib = (int)disk;
    sb->timeout_seconds = (int)timeout;
    snprintf(sb->on_lease_end, sizeof(sb->on_lease_end), "%s", ole);
    if (env)
        json_object_update(sb->env, env);
    if (md)
        json_object_update(sb->metadata, md);
    if (net && !json_is_null(net)) {
        json_decref(sb->network);
        sb->network = json_deep_copy(net);
    }
    json_decref(o);
    sandbox_create(sb, create_done, req);
    sandbox_unref(sb); /* the daemon's list holds it now */
    return;
bad:
    json_decref(o);
    http_reply_error(req, 400, "invalid_request", "%s", msg);
}

void api_sandboxes_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *arr = json_array();
    /* The list is newest first; answer oldest first. */
    for (struct sandbox *sb = d->sandboxes; sb; sb = sb->next)
        json_array_insert_new(arr, 0, sandbox_to_json(sb));
    http_reply_json(req, 200, json_pack("{s:o}", "sandboxes", arr));
}

void api_sandboxes_get(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (sb)
        http_reply_json(req, 200, sandbox_to_json(sb));
}

static void state_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    struct http_req *req = arg;
    if (ok)
        http_reply_json(req, 200, sandbox_to_json(sb));
    else
        http_reply_error(req, 500, "internal", "%s", message);
}

/* Answers 409 if a driver operation is in flight; returns 1 then. */
static int busy(struct http_req *req, struct sandbox *sb)
{
    if (!sb->busy && sb->state != SB_CREATING && sb->state != SB_DELETING &&
        sb->state != SB_STOPPING && sb->state != SB_STARTING)
        return 0;
    http_reply_error(req, 409, "conflict", "sandbox %s is %s; try again in a moment", sb->id,
                     sandbox_state_name(sb->state));
    return 1;
}

static void delete_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    struct http_req *req = arg;
    if (ok)
        http_reply_json(req, 200, json_pack("{s:s, s:b}", "id", sb->id, "deleted", 1));
    else
        http_reply_error(req, 500, "internal", "%s", message);
}

void api_sandboxes_delete(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (!sb)
        return;
    /* A sandbox that just failed is being cleaned up: delete it right after. */
    if (sandbox_defer(sb, SB_DEFER_DELETE, delete_done, req) == 0 || busy(req, sb))
        return;
    sandbox_delete(sb, delete_done, req);
}

void api_sandboxes_stop(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (!sb || busy(req, sb))
        return;
    if (sb->state == SB_STOPPED) {
        http_reply_json(req, 200, sandbox_to_json(sb));
        return;
    }
    sandbox_stop(sb, "user", state_done, req);
}

void api_sandboxes_start(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (!sb || sandbox_defer(sb, SB_DEFER_START, state_done, req) == 0 || busy(req, sb))
        return;
    if (sb->state == SB_RUNNING) {
        http_reply_json(req, 200, sandbox_to_json(sb));
        return;
    }
    char rootfs[PATH_MAX];
    struct wr_err err = {0};
    if (!sb->rootfs[0]) {
        if (image_rootfs(d->cfg.state_dir, sb->image, rootfs, sizeof(rootfs), &err) < 0) {
            http_reply_error(req, 409, "conflict", "cannot start: %s", err.msg);
            return;
        }
        snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", rootfs);
    }
    sandbox_start(sb, state_done, req);
}

static const char *const timeout_fields[] = {"timeout_seconds", NULL};

void api_sandboxes_timeout(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (!sb)
        return;
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    char msg[JV_MSG];
    long long t;
    if (jv_only(o, timeout_fields, msg) < 0 ||
        jv_int(o, "timeout_seconds", 1, d->cfg.max_timeout, -1, &t, msg) < 0 ||
        (t < 0 && snprintf(msg, sizeof(msg), "timeout_seconds: required") > 0)) {
        json_decref(o);
        http_reply_error(req, 400, "invalid_request", "%s", msg);
        return;
    }
    json_decref(o);
    sb->timeout_seconds = (int)t;
    sb->lease_ends_ms = now_ms_wall() + t * 1000;
    sandbox_persist(sb);
    log_info(sb->id, "lease.set", "timeout_seconds=%lld", t);
    http_reply_json(req, 200, sandbox_to_json(sb));
}

struct events_ctx {
    json_t *arr;
};

static int add_event(void *arg, int64_t at, const char *type, const char *state, const char *reason)
{
    struct events_ctx *c = arg;
    char ts[32];
    format_rfc3339(at, ts, sizeof(ts));
    json_array_append_new(c->arr, json_pack("{s:s, s:s, s:s?, s:s?}", "at", ts, "type", type,
                                            "state", state, "reason", reason));
    return 0;
}

void api_sandboxes_events(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (!sb)
        return;
    struct events_ctx c = {json_array()};
    struct wr_err err = {0};
    if (store_event_foreach(d->store, sb->id, 1000, add_event, &c, &err) < 0) {
        json_decref(c.arr);
        http_reply_error(req, 500, "internal", "%s", err.msg);
        return;
    }
    http_reply_json(req, 200, json_pack("{s:s, s:o}", "id", sb->id, "events", c.arr));
}

void api_sandboxes_stats(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (!sb)
        return;
    struct driver_spec spec;
    struct driver_stats st;
    struct wr_err err = {0};
    sandbox_spec(sb, &spec);
    if (driver_stats(d->driver, &spec, &st, &err) < 0) {
        http_reply_error(req, 500, "internal", "%s", err.msg);
        return;
    }
    http_reply_json(req, 200,
                    json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "id", sb->id, "state",
                              sandbox_state_name(sb->state), "cpu_usec", (json_int_t)st.cpu_usec,
                              "memory_bytes", (json_int_t)st.memory_bytes, "pids",
                              (json_int_t)st.pids, "oom_kills", (json_int_t)st.oom_kills));
}

void api_health(struct daemon *d, struct http_req *req, struct route_match *m)
{
    http_reply_json(req, 200,
                    json_pack("{s:s, s:s, s:s, s:i}", "status", "ok", "version", WR_VERSION,
                              "driver", d->driver->name, "sandboxes", d->nsandboxes));
}

static int add_image(void *arg, const struct image_info *info)
{
    json_t *arr = arg;
    char ts[32];
    format_rfc3339(info->created_at, ts, sizeof(ts));
    json_array_append_new(arr, json_pack("{s:s, s:I, s:s}", "name", info->name, "size_bytes",
                                         (json_int_t)info->size_bytes, "created_at", ts));
    return 0;
}

void api_images_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *arr = json_array();
    struct wr_err err = {0};
    if (image_list(d->cfg.state_dir, add_image, arr, &err) < 0) {
        json_decref(arr);
        http_reply_error(req, 500, "internal", "%s", err.msg);
        return;
    }
    http_reply_json(req, 200, json_pack("{s:o}", "images", arr));
}
