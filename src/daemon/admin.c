/*
 * The admin's calls: API keys and the audit trail. Each checks who is asking itself, so no
 * route, present or future, lets a key make keys or raise its own limits. An auditor key may
 * read the key list and the audit trail too (reading changes nothing; see keys.h).
 */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/keys.h"
#include "daemon/service.h"
#include "net/gateway.h"
#include "store/store.h"

static int admin_only(struct sink *s)
{
    if (!s->who || s->who->admin)
        return 0;
    sink_failf(s, WR_E_FORBIDDEN, 0,
               "only the admin (root on the daemon's Unix socket, without a key) may do this");
    return -1;
}

static int admin_or_auditor(struct sink *s)
{
    if (!s->who || s->who->admin || s->who->auditor)
        return 0;
    sink_failf(s, WR_E_FORBIDDEN, 0,
               "only the admin (root on the daemon's Unix socket, without a key) or an auditor "
               "key may read this");
    return -1;
}

void svc_key_create(struct daemon *d, const struct key_opts *o, struct sink *s)
{
    if (admin_only(s) < 0)
        return;
    struct wr_err err = {0};
    char token[KEY_TOKEN_LEN + 1];
    const struct api_key *k = keys_create(d->keys, o, token, &err);
    if (!k) {
        sink_fail(s, &err);
        return;
    }
    json_t *out = key_to_json(k);
    json_object_set_new(out, "key", json_string(token));
    explicit_bzero(token, sizeof(token));
    sink_reply(s, SINK_CREATED, out);
}

void svc_key_list(struct daemon *d, struct sink *s)
{
    if (admin_or_auditor(s) < 0)
        return;
    sink_reply(s, SINK_OK, json_pack("{s:o}", "keys", keys_list_json(d->keys)));
}

void svc_whoami(struct daemon *d, struct sink *s)
{
    const struct api_key *k = s->who && !s->who->admin ? keys_find(d->keys, s->who->key_id) : NULL;
    if (s->who && !s->who->admin && !k) {
        sink_failf(s, WR_E_UNAUTHORIZED, 0, "the key is no longer known");
        return;
    }
    sink_reply(s, SINK_OK,
               json_pack("{s:b, s:b, s:o}", "admin", s->who && s->who->admin, "auditor",
                         k && k->auditor, "key", k ? key_to_json(k) : json_null()));
}

void svc_key_get(struct daemon *d, const char *id, struct sink *s)
{
    if (admin_only(s) < 0)
        return;
    const struct api_key *k = keys_find(d->keys, id);
    if (!k) {
        sink_failf(s, WR_E_NOT_FOUND, 0, "no key %.40s", id);
        return;
    }
    sink_reply(s, SINK_OK, key_to_json(k));
}

void svc_key_update(struct daemon *d, const char *id, const struct key_opts *o, struct sink *s)
{
    if (admin_only(s) < 0)
        return;
    struct wr_err err = {0};
    const struct api_key *k = keys_update(d->keys, id, o, &err);
    if (!k) {
        sink_fail(s, &err);
        return;
    }
    sink_reply(s, SINK_OK, key_to_json(k));
}

struct revoke_walk {
    struct daemon *d;
    const struct principal *who;
    json_t *ids;
};

/* A key revoked with its owner: named in the answer, and in the audit trail by an entry of its
 * own whose route names it (the request's own entry names only the owner's route). */
static void revoked_with(void *arg, const struct api_key *dep)
{
    struct revoke_walk *w = arg;
    char route[64];
    snprintf(route, sizeof(route), "/v1/keys/%s/revoke", dep->id);
    json_array_append_new(w->ids, json_string(dep->id));
    svc_audit_record(w->d, w->who, "POST", route, NULL, 200);
}

void svc_key_revoke(struct daemon *d, const char *id, struct sink *s)
{
    if (admin_only(s) < 0)
        return;
    struct wr_err err = {0};
    struct revoke_walk w = {.d = d, .who = s->who, .ids = json_array()};
    const struct api_key *k = keys_revoke(d->keys, id, revoked_with, &w, &err);
    if (!k) {
        json_decref(w.ids);
        sink_fail(s, &err);
        return;
    }
    json_t *out = key_to_json(k);
    json_object_set_new(out, "also_revoked", w.ids);
    /* its sandboxes (and its --of keys') lose their secrets before the answer */
    gateway_refresh(d->gw);
    sink_reply(s, SINK_OK, out);
}

/*
 * The audit trail is written just after the answers it records, in batches: an insert of its
 * own cost every mutating request ~140 µs (measured: p50 137 µs of an exec's answer, before
 * its bytes left). Entries wait at most AUDIT_FLUSH_MS, or until AUDIT_BATCH_MAX are waiting;
 * a read of the trail and the daemon's close write what waits first, so the trail a caller
 * reads has every request already answered. A daemon killed outright loses at most what
 * waited.
 */
#define AUDIT_FLUSH_MS 20
#define AUDIT_BATCH_MAX 256

struct audit_entry {
    int64_t at_ms;
    int status;
    char key_id[sizeof(((struct principal *)0)->key_id)];
    char method[16];
    char route[128];
    char sandbox_id[40];
};

struct audit_queue {
    struct audit_entry e[AUDIT_BATCH_MAX];
    size_t n;
    struct event *timer;
};

static void audit_flush(struct daemon *d)
{
    struct audit_queue *q = d->audit;
    if (!q || q->n == 0)
        return;
    struct store_audit rows[AUDIT_BATCH_MAX];
    for (size_t i = 0; i < q->n; i++)
        rows[i] = (struct store_audit){.at_ms = q->e[i].at_ms,
                                       .key_id = q->e[i].key_id,
                                       .method = q->e[i].method,
                                       .route = q->e[i].route,
                                       .sandbox_id = q->e[i].sandbox_id,
                                       .status = q->e[i].status};
    struct wr_err err = {0};
    if (store_audit_add(d->store, rows, q->n, &err) < 0)
        log_error(NULL, "audit.failed", "entries=%zu first=\"%s %s\" error=\"%s\"", q->n,
                  q->e[0].method, q->e[0].route, err.msg);
    q->n = 0;
    if (q->timer)
        event_del(q->timer);
}

static void audit_timer(evutil_socket_t fd, short what, void *arg)
{
    audit_flush(arg);
}

void audit_close(struct daemon *d)
{
    audit_flush(d);
    if (d->audit && d->audit->timer)
        event_free(d->audit->timer);
    free(d->audit);
    d->audit = NULL;
}

void svc_audit_record(struct daemon *d, const struct principal *who, const char *method,
                      const char *route, const char *sandbox_id, int status)
{
    if (!d->audit) {
        d->audit = xcalloc(1, sizeof(*d->audit));
        if (d->base)
            d->audit->timer = evtimer_new(d->base, audit_timer, d);
    }
    struct audit_queue *q = d->audit;
    if (q->n == AUDIT_BATCH_MAX)
        audit_flush(d);
    struct audit_entry *e = &q->e[q->n++];
    e->at_ms = now_ms_wall();
    e->status = status;
    snprintf(e->key_id, sizeof(e->key_id), "%s", who && !who->admin ? who->key_id : "");
    snprintf(e->method, sizeof(e->method), "%s", method);
    snprintf(e->route, sizeof(e->route), "%s", route);
    snprintf(e->sandbox_id, sizeof(e->sandbox_id), "%s", sandbox_id ? sandbox_id : "");
    if (!q->timer) {
        audit_flush(d); /* no loop to wait on (a test's daemon): written at once */
    } else if (q->n == 1) {
        struct timeval tv = {.tv_sec = 0, .tv_usec = AUDIT_FLUSH_MS * 1000};
        evtimer_add(q->timer, &tv);
    }
}

struct audit_walk {
    json_t *entries;
    int64_t last_seq;
};

static int audit_one(void *arg, int64_t seq, const struct store_audit *a)
{
    struct audit_walk *w = arg;
    char at[32];
    format_rfc3339(a->at_ms / 1000, at, sizeof(at));
    json_array_append_new(
        w->entries, json_pack("{s:I, s:s, s:o, s:s, s:s, s:o, s:i}", "seq", (json_int_t)seq, "at",
                              at, "key_id", a->key_id[0] ? json_string(a->key_id) : json_null(),
                              "method", a->method, "route", a->route, "sandbox_id",
                              a->sandbox_id[0] ? json_string(a->sandbox_id) : json_null(), "status",
                              a->status));
    w->last_seq = seq;
    return 0;
}

void svc_audit_list(struct daemon *d, int64_t before_seq, int limit, struct sink *s)
{
    if (admin_or_auditor(s) < 0)
        return;
    audit_flush(d); /* what waits is older than anything read */
    struct audit_walk w = {.entries = json_array(), .last_seq = 0};
    struct wr_err err = {0};
    if (store_audit_foreach(d->store, before_seq, limit, audit_one, &w, &err) < 0) {
        json_decref(w.entries);
        sink_fail(s, &err);
        return;
    }
    json_t *out = json_pack("{s:o}", "entries", w.entries);
    /* A full page may have more behind it: the next page starts before its last entry. */
    if ((int)json_array_size(w.entries) == limit && w.last_seq > 1)
        json_object_set_new(out, "next_before", json_integer(w.last_seq));
    sink_reply(s, SINK_OK, out);
}
