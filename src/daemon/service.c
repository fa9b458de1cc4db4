/*
 * The service's sandbox operations (service.h): lookups, the state rules
 * (what may happen to a sandbox in which state), and the answers. The
 * sequences themselves (driver jobs, the agent's HELLO) are sandbox.c's.
 */
#include "daemon/service.h"

#include <errno.h>
#include <event2/buffer.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "daemon/admission.h"
#include "daemon/daemon.h"
#include "daemon/keys.h"
#include "daemon/meter.h"
#include "daemon/netlog.h"
#include "daemon/pool.h"
#include "daemon/sandbox.h"
#include "daemon/secrets.h"
#include "driver/driver.h"
#include "image/image.h"
#include "net/gateway.h"
#include "store/store.h"

#ifndef WR_VERSION
#define WR_VERSION "0.1.0"
#endif

void sink_failf(struct sink *s, enum wr_kind kind, int code, const char *fmt, ...)
{
    struct wr_err err = {0};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof(err.msg), fmt, ap);
    va_end(ap);
    err.kind = kind;
    err.code = code;
    sink_fail(s, &err);
}

void sink_write_buffer(struct sink *s, struct evbuffer *buf)
{
    if (s->ops->write_buffer) {
        s->ops->write_buffer(s, buf);
        evbuffer_drain(buf, evbuffer_get_length(buf)); /* (emptied already) */
        return;
    }
    /* a sink without one takes the bytes chain by chain, as they lie */
    struct evbuffer_iovec v;
    while (evbuffer_peek(buf, -1, NULL, &v, 1) > 0 && v.iov_len) {
        s->ops->write(s, v.iov_base, v.iov_len);
        evbuffer_drain(buf, v.iov_len);
    }
}

/* Finds the sandbox or fails s. */
static struct sandbox *lookup(struct daemon *d, const char *id, struct sink *s)
{
    struct wr_err err = {0};
    struct sandbox *sb = sandbox_lookup(d, id, s->who, &err);
    if (!sb)
        sink_fail(s, &err);
    return sb;
}

/* Answers a finished create, start or stop with the sandbox, or the failure. */
static void answer_sandbox(struct sandbox *sb, int ok, const char *message, void *arg)
{
    if (ok)
        sink_reply(arg, SINK_OK, sandbox_to_json(sb));
    else
        sink_failf(arg, WR_E_INTERNAL, 0, "%s", message);
}

static void answer_created(struct sandbox *sb, int ok, const char *message, void *arg)
{
    if (ok)
        sink_reply(arg, SINK_CREATED, sandbox_to_json(sb));
    else
        sink_failf(arg, WR_E_INTERNAL, 0, "sandbox could not be created: %s", message);
}

static void answer_deleted(struct sandbox *sb, int ok, const char *message, void *arg)
{
    if (ok)
        sink_reply(arg, SINK_OK, json_pack("{s:s, s:b}", "id", sb->id, "deleted", 1));
    else
        sink_failf(arg, WR_E_INTERNAL, 0, "%s", message);
}

/* A policy that lets anything out, on a daemon without sandbox networking, is refused: the
 * API must never report a policy nothing enforces. Returns 1 (answered) or 0. */
static int network_refused(struct daemon *d, json_t *policy, struct sink *s)
{
    if (d->gw || !json_is_true(json_object_get(policy, "internet")))
        return 0;
    sink_failf(s, WR_E_UNAVAILABLE, 0, "network: %s", d->gw_error);
    return 1;
}

/* A key may keep at most its max_sandboxes. Returns 1 (answered) or 0. */
static int key_quota_refused(struct daemon *d, struct sink *s)
{
    const struct api_key *k =
        s->who && !s->who->admin ? keys_find(d->keys, s->who->owner_id) : NULL;
    if (!k || k->max_sandboxes < 0)
        return 0;
    int n = 0;
    for (struct sandbox *sb = d->sandboxes; sb; sb = sb->next)
        n += sb->state != SB_DELETING && strcmp(sb->key_id, k->id) == 0;
    if (n < k->max_sandboxes)
        return 0;
    sink_failf(s, WR_E_CONFLICT, 0,
               "key %s may keep %d sandboxes and has %d; delete one first (the admin can raise "
               "the number with `withruntime keys set %s --max-sandboxes N`)",
               k->id, k->max_sandboxes, n, k->id);
    return 1;
}

void svc_sandbox_create(struct daemon *d, const struct sandbox_opts *o, struct sink *s)
{
    char rootfs[PATH_MAX];
    struct wr_err err = {0};
    if (key_quota_refused(d, s))
        return;
    if (image_rootfs(d->cfg.state_dir, o->image, rootfs, sizeof(rootfs), &err) < 0) {
        /* A well-formed name of an image that is not built names something that is not there. */
        sink_failf(s, err.code == ENOENT ? WR_E_NOT_FOUND : WR_E_INVALID, 0, "image: %s", err.msg);
        return;
    }
    struct sandbox *sb = sandbox_new(d);
    sandbox_new_id(sb->id);
    if (s->who && !s->who->admin) /* its owner's, as every sandbox the key makes */
        snprintf(sb->key_id, sizeof(sb->key_id), "%s", s->who->owner_id);
    snprintf(sb->image, sizeof(sb->image), "%s", o->image);
    snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", rootfs);
    sb->cpus = o->cpus;
    sb->memory_mib = o->memory_mib;
    sb->disk_mib = o->disk_mib;
    sb->timeout_seconds = o->timeout_seconds;
    snprintf(sb->on_lease_end, sizeof(sb->on_lease_end), "%s", o->on_lease_end);
    if (o->env)
        json_object_update(sb->env, o->env);
    if (o->metadata)
        json_object_update(sb->metadata, o->metadata);
    if (o->network && network_refused(d, o->network, s)) {
        sandbox_unref(sb);
        return;
    }
    size_t i;
    json_t *name;
    json_array_foreach(o->secrets, i, name)
    {
        const char *n = json_string_value(name);
        /* One answer for a secret that is not there and one another tenant's: a key learns
         * no name it may not use. */
        if (!secrets_usable(d->secrets, n, sb->key_id)) {
            if (sb->key_id[0])
                sink_failf(s, WR_E_NOT_FOUND, ENOENT,
                           "secrets: no secret %.64s that this key may use (secrets are the "
                           "admin's, who grants each to keys: ask for it to be granted to %s)",
                           n, sb->key_id);
            else
                sink_failf(s, WR_E_NOT_FOUND, ENOENT, "secrets: no secret named %.64s", n);
            sandbox_unref(sb);
            return;
        }
        char ph[SECRET_PLACEHOLDER_LEN + 1];
        secrets_placeholder(ph);
        json_object_set_new(sb->secrets, n, json_string(ph));
    }
    if (o->network) {
        json_decref(sb->network);
        sb->network = json_deep_copy(o->network);
    }
    sb->max_cost_micros = o->max_cost_micros;
    if (admission_limits(d, sb, 1, &err) < 0 || meter_admit(sb, &err) < 0) {
        log_warn(NULL, "sandbox.refused", "error=\"%s\"", err.msg);
        sandbox_unref(sb);
        sink_fail(s, &err);
        return;
    }
    if (d->cfg.pool_size > 0 && pool_claim(d, sb, s)) {
        sandbox_unref(sb); /* a warm one took its place */
        return;
    }
    if (admission_loop(d, sb, &err) < 0) {
        log_warn(NULL, "sandbox.refused", "error=\"%s\"", err.msg);
        sandbox_unref(sb);
        sink_fail(s, &err);
        return;
    }
    sandbox_create(sb, answer_created, s);
    sandbox_unref(sb); /* the daemon's list holds it now */
}

static int filter_passes(const struct sandbox_filter *f, const struct sandbox *sb)
{
    if (!f)
        return 1;
    if (f->none)
        return 0;
    if (f->state >= 0 && (int)sb->state != f->state)
        return 0;
    const char *k;
    json_t *v;
    json_object_foreach(f->metadata, k, v)
    {
        if (!json_equal(json_object_get(sb->metadata, k), v))
            return 0;
    }
    return 1;
}

void svc_sandbox_list(struct daemon *d, const struct sandbox_filter *f, struct sink *s)
{
    json_t *arr = json_array();
    /* The list is newest first; answer oldest first. A key sees its own. */
    for (struct sandbox *sb = d->sandboxes; sb; sb = sb->next)
        if (!sb->pooled && principal_sees(s->who, sb->key_id) && filter_passes(f, sb))
            json_array_insert_new(arr, 0, sandbox_to_json(sb));
    sink_reply(s, SINK_OK, json_pack("{s:o}", "sandboxes", arr));
}

void svc_sandbox_get(struct daemon *d, const char *id, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    if (sb)
        sink_reply(s, SINK_OK, sandbox_to_json(sb));
}

void svc_sandbox_delete(struct daemon *d, const char *id, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    if (!sb)
        return;
    /* A sandbox that just failed is being cleaned up: delete it right after. */
    if (sandbox_defer(sb, SB_DEFER_DELETE, answer_deleted, s) == 0)
        return;
    struct wr_err err = {0};
    if (sandbox_check_idle(sb, &err) < 0) {
        sink_fail(s, &err);
        return;
    }
    sandbox_delete(sb, answer_deleted, s);
}

/* A prune in flight: its deletes, and what to answer when the last one is done. */
struct prune {
    struct sink *s;
    int pending;
    int64_t older_than;
    json_t *deleted, *errors;
};

static void prune_settle(struct prune *p)
{
    if (--p->pending > 0)
        return;
    log_info(NULL, "sandbox.pruned", "deleted=%zu errors=%zu older_than_seconds=%lld",
             json_array_size(p->deleted), json_array_size(p->errors), (long long)p->older_than);
    sink_reply(p->s, SINK_OK,
               json_pack("{s:o, s:o, s:I}", "deleted", p->deleted, "errors", p->errors,
                         "older_than_seconds", (json_int_t)p->older_than));
    free(p);
}

static void prune_one_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    struct prune *p = arg;
    if (ok)
        json_array_append_new(p->deleted, json_string(sb->id));
    else
        json_array_append_new(p->errors, json_pack("{s:s, s:s}", "id", sb->id, "message", message));
    prune_settle(p);
}

void svc_sandbox_prune(struct daemon *d, int64_t older_than_seconds, struct sink *s)
{
    struct prune *p = xcalloc(1, sizeof(*p));
    p->s = s;
    p->older_than = older_than_seconds;
    p->deleted = json_array();
    p->errors = json_array();
    p->pending = 1; /* this function's own, so no delete can answer before all are queued */
    int64_t now = now_unix();
    struct sandbox *next;
    for (struct sandbox *sb = d->sandboxes; sb; sb = next) {
        next = sb->next;
        if (sb->pooled || !principal_sees(s->who, sb->key_id) ||
            !sandbox_expired(sb, now, older_than_seconds))
            continue;
        p->pending++;
        sandbox_delete_reason(sb, "pruned", prune_one_done, p);
    }
    prune_settle(p);
}

void svc_sandbox_stop(struct daemon *d, const char *id, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    struct wr_err err = {0};
    if (!sb)
        return;
    if (sandbox_check_idle(sb, &err) < 0) {
        sink_fail(s, &err);
        return;
    }
    if (sb->state == SB_STOPPED) {
        sink_reply(s, SINK_OK, sandbox_to_json(sb));
        return;
    }
    sandbox_stop(sb, "user", answer_sandbox, s);
}

void svc_sandbox_start(struct daemon *d, const char *id, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    struct wr_err err = {0};
    if (!sb)
        return;
    if (sb->state == SB_RUNNING && !sb->busy) {
        sink_reply(s, SINK_OK, sandbox_to_json(sb));
        return;
    }
    /* Admitted before it is queued behind a failed one's cleanup: it counts as starting from
     * here, so no create takes its place meanwhile. */
    if ((sb->state == SB_STOPPED || sb->state == SB_FAILED) && sb->deferred == SB_DEFER_NONE &&
        (admission_check(d, sb, 0, &err) < 0 || meter_admit(sb, &err) < 0)) {
        log_warn(sb->id, "sandbox.refused", "error=\"%s\"", err.msg);
        sink_fail(s, &err);
        return;
    }
    if (sandbox_defer(sb, SB_DEFER_START, answer_sandbox, s) == 0)
        return;
    if (sandbox_check_idle(sb, &err) < 0) {
        sink_fail(s, &err);
        return;
    }
    if (!sb->rootfs[0]) {
        char rootfs[PATH_MAX];
        if (image_rootfs(d->cfg.state_dir, sb->image, rootfs, sizeof(rootfs), &err) < 0) {
            sink_failf(s, WR_E_CONFLICT, 0, "cannot start: %s", err.msg);
            return;
        }
        snprintf(sb->rootfs, sizeof(sb->rootfs), "%s", rootfs);
    }
    sandbox_start(sb, answer_sandbox, s);
}

void svc_sandbox_set_timeout(struct daemon *d, const char *id, int timeout_seconds, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    if (!sb)
        return;
    sandbox_set_lease(sb, timeout_seconds);
    sink_reply(s, SINK_OK, sandbox_to_json(sb));
}

void svc_sandbox_set_network(struct daemon *d, const char *id, json_t *policy, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    if (!sb)
        return;
    if (network_refused(d, policy, s))
        return;
    sandbox_set_network(sb, policy);
    sink_reply(s, SINK_OK, sandbox_to_json(sb));
}

void svc_secrets_list(struct daemon *d, struct sink *s)
{
    sink_reply(s, SINK_OK, secrets_list_json(d->secrets));
}

void svc_secret_get(struct daemon *d, const char *name, struct sink *s)
{
    json_t *o = secrets_get_json(d->secrets, name);
    if (!o) {
        sink_failf(s, WR_E_NOT_FOUND, ENOENT, "no secret named %.64s", name);
        return;
    }
    sink_reply(s, SINK_OK, o);
}

/* A grant names keys in use whose sandboxes are their own: a key made --of another makes its
 * owner's, so the owner is the one to name. Answers and returns 1 if one is not. */
static int grant_refused(struct daemon *d, json_t *keys, struct sink *s)
{
    size_t i;
    json_t *id;
    json_array_foreach(keys, i, id)
    {
        const char *kid = json_string_value(id);
        const struct api_key *k = kid ? keys_find(d->keys, kid) : NULL;
        if (!kid)
            continue; /* secrets.c names the bad entry */
        if (!k || k->revoked_at) {
            sink_failf(s, WR_E_NOT_FOUND, 0, "keys[%zu]: no key %.40s in use", i, kid);
            return 1;
        }
        if (strcmp(k->owner_id, k->id)) {
            sink_failf(s, WR_E_INVALID, 0,
                       "keys[%zu]: key %s was made --of %s and uses %s's grants: grant %s", i,
                       k->id, k->owner_id, k->owner_id, k->owner_id);
            return 1;
        }
    }
    return 0;
}

void svc_secret_set(struct daemon *d, const char *name, const char *value, size_t len,
                    const struct secret_fields *f, struct sink *s)
{
    struct wr_err err = {0};
    if (grant_refused(d, f->keys, s))
        return;
    if (secrets_set(d->secrets, d->store, name, value, len, f, &err) < 0) {
        sink_fail(s, &err);
        return;
    }
    /* the egress process applies what sandboxes may use now: before the answer */
    gateway_refresh(d->gw);
    sink_reply(s, SINK_OK, secrets_get_json(d->secrets, name));
}

void svc_secret_update(struct daemon *d, const char *name, const struct secret_fields *f,
                       struct sink *s)
{
    struct wr_err err = {0};
    if (grant_refused(d, f->keys, s))
        return;
    if (secrets_update(d->secrets, d->store, name, f, &err) < 0) {
        sink_fail(s, &err);
        return;
    }
    /* the egress process applies what sandboxes may use now: before the answer */
    gateway_refresh(d->gw);
    sink_reply(s, SINK_OK, secrets_get_json(d->secrets, name));
}

void svc_secret_delete(struct daemon *d, const char *name, struct sink *s)
{
    struct wr_err err = {0};
    if (secrets_delete(d->secrets, d->store, name, &err) < 0) {
        sink_fail(s, &err);
        return;
    }
    /* the egress process applies what sandboxes may use now: before the answer */
    gateway_refresh(d->gw);
    sink_reply(s, SINK_OK, json_pack("{s:s, s:b}", "name", name, "deleted", 1));
}

void svc_sandbox_network_log(struct daemon *d, const char *id, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    if (!sb)
        return;
    json_t *o = netlog_to_json(sb->netlog);
    json_object_set_new(o, "id", json_string(sb->id));
    sink_reply(s, SINK_OK, o);
}

static int add_event(void *arg, int64_t at, const char *type, const char *state, const char *reason)
{
    char ts[32];
    format_rfc3339(at, ts, sizeof(ts));
    json_array_append_new(arg, json_pack("{s:s, s:s, s:s?, s:s?}", "at", ts, "type", type, "state",
                                         state, "reason", reason));
    return 0;
}

void svc_sandbox_events(struct daemon *d, const char *id, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    if (!sb)
        return;
    json_t *arr = json_array();
    struct wr_err err = {0};
    if (store_event_foreach(d->store, sb->id, STORE_EVENTS_KEPT, add_event, arr, &err) < 0) {
        json_decref(arr);
        sink_fail(s, &err);
        return;
    }
    sink_reply(s, SINK_OK, json_pack("{s:s, s:o}", "id", sb->id, "events", arr));
}

static void stats_read(struct sandbox *sb, int rc, const struct driver_stats *st, void *arg)
{
    if (rc < 0) {
        sink_failf(arg, WR_E_INTERNAL, 0, "cannot read the resource use of sandbox %s", sb->id);
        return;
    }
    sink_reply(arg, SINK_OK,
               json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "id", sb->id, "state",
                         sandbox_state_name(sb->state), "cpu_usec", (json_int_t)st->cpu_usec,
                         "memory_bytes", (json_int_t)st->memory_bytes, "pids", (json_int_t)st->pids,
                         "oom_kills", (json_int_t)st->oom_kills));
}

void svc_sandbox_stats(struct daemon *d, const char *id, struct sink *s)
{
    struct sandbox *sb = lookup(d, id, s);
    if (sb)
        sandbox_read_stats(sb, stats_read, s);
}

void svc_health(struct daemon *d, struct sink *s)
{
    struct gateway_stats gs;
    gateway_stats(d->gw, &gs);
    json_t *net = d->gw ? json_pack("{s:b, s:{s:b, s:i}}", "enabled", 1, "egress", "up",
                                    gs.egress_pid > 0, "restarts", (int)gs.egress_restarts)
                        : json_pack("{s:b, s:s}", "enabled", 0, "reason", d->gw_error);
    int pooled = 0, ready = 0;
    for (struct sandbox *sb = d->sandboxes; sb; sb = sb->next)
        if (sb->pooled) {
            pooled++;
            ready += pool_ready(sb);
        }
    sink_reply(s, SINK_OK,
               json_pack("{s:s, s:s, s:s, s:i, s:o, s:{s:i, s:i}}", "status", "ok", "version",
                         WR_VERSION, "driver", d->driver->name, "sandboxes", d->nsandboxes - pooled,
                         "network", net, "pool", "size", d->cfg.pool_size, "ready", ready));
}

static int add_image(void *arg, const struct image_info *info)
{
    char ts[32];
    format_rfc3339(info->created_at, ts, sizeof(ts));
    json_array_append_new(arg, json_pack("{s:s, s:I, s:s}", "name", info->name, "size_bytes",
                                         (json_int_t)info->size_bytes, "created_at", ts));
    return 0;
}

void svc_images(struct daemon *d, struct sink *s)
{
    json_t *arr = json_array();
    struct wr_err err = {0};
    if (image_list(d->cfg.state_dir, add_image, arr, &err) < 0) {
        json_decref(arr);
        sink_fail(s, &err);
        return;
    }
    sink_reply(s, SINK_OK, json_pack("{s:o}", "images", arr));
}

json_t *svc_enums(void)
{
    json_t *states = json_array(), *reasons = json_array();
    for (const char *const *p = sandbox_state_names; *p; p++)
        json_array_append_new(states, json_string(*p));
    for (const char *const *p = sandbox_reason_names; *p; p++)
        json_array_append_new(reasons, json_string(*p));
    return json_pack("{s:o, s:o}", "states", states, "reasons", reasons);
}
