/* /v1/keys and /v1/audit: the admin's; an auditor key reads the list and the audit trail
 * (daemon/admin.c checks who asks, too). */
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "daemon/daemon.h"
#include "daemon/keys.h"
#include "daemon/service.h"

#define DAILY_LIMIT_MAX 1000000000000LL
#define MAX_SANDBOXES_MAX 100000
#define AUDIT_PAGE_MAX 1000

/* A limit: an integer in [0, max], or null for none (which an update uses to lift it). */
static int limit_field(json_t *o, const char *name, long long max, int *has, long long *out,
                       struct wr_err *err)
{
    json_t *v = json_object_get(o, name);
    *has = v != NULL;
    if (!v)
        return 0;
    if (json_is_null(v)) {
        *out = -1;
        return 0;
    }
    return jv_int(o, name, 0, max, -1, out, err);
}

/* The fields of a create (name required) or an update (name refused). */
static int key_opts_parse(json_t *o, int create, struct key_opts *k, struct wr_err *err)
{
    static const char *const create_fields[] = {"name",          "owner_id", "read_only",
                                                "metrics",       "auditor",  "daily_limit_micros",
                                                "max_sandboxes", NULL};
    static const char *const update_fields[] = {"read_only", "daily_limit_micros", "max_sandboxes",
                                                NULL};
    long long limit = -1, maxsb = -1;
    memset(k, 0, sizeof(*k));
    if (jv_only(o, create ? create_fields : update_fields, err) < 0 ||
        (create && jv_string(o, "name", 64, &k->name, err) < 0) ||
        (create && jv_string(o, "owner_id", 31, &k->owner_id, err) < 0) ||
        jv_bool(o, "read_only", 0, &k->read_only, err) < 0 ||
        (create && jv_bool(o, "metrics", 0, &k->metrics, err) < 0) ||
        (create && jv_bool(o, "auditor", 0, &k->auditor, err) < 0) ||
        limit_field(o, "daily_limit_micros", DAILY_LIMIT_MAX, &k->has_daily_limit, &limit, err) <
            0 ||
        limit_field(o, "max_sandboxes", MAX_SANDBOXES_MAX, &k->has_max_sandboxes, &maxsb, err) < 0)
        return -1;
    if (create && !k->name)
        return wr_err_kind(err, WR_E_INVALID, 0, "name: required");
    k->has_read_only = json_object_get(o, "read_only") != NULL;
    k->daily_limit_micros = limit;
    k->max_sandboxes = (int)maxsb;
    return 0;
}

static void with_opts(struct daemon *d, struct http_req *req, struct route_match *m, int create)
{
    json_t *o = api_json_body(d, req, !create);
    if (!o)
        return;
    struct key_opts k;
    struct wr_err err = {0};
    if (key_opts_parse(o, create, &k, &err) < 0) {
        json_decref(o);
        api_reply_err(req, &err);
        return;
    }
    if (create)
        svc_key_create(d, &k, api_sink_new(req));
    else
        svc_key_update(d, m->params[0], &k, api_sink_new(req));
    json_decref(o);
}

void api_keys_create(struct daemon *d, struct http_req *req, struct route_match *m)
{
    with_opts(d, req, m, 1);
}

void api_keys_update(struct daemon *d, struct http_req *req, struct route_match *m)
{
    with_opts(d, req, m, 0);
}

void api_keys_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_key_list(d, api_sink_new(req));
}

void api_keys_get(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_key_get(d, m->params[0], api_sink_new(req));
}

void api_keys_revoke(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_key_revoke(d, m->params[0], api_sink_new(req));
}

void api_audit_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    uint64_t before, limit;
    if (api_query_u64(req, "before", (uint64_t)INT64_MAX, &before) < 0 ||
        api_query_u64(req, "limit", 100, &limit) < 0)
        return;
    if (limit < 1 || limit > AUDIT_PAGE_MAX || before > (uint64_t)INT64_MAX) {
        api_reply_invalid(req, limit < 1 || limit > AUDIT_PAGE_MAX
                                   ? "limit: must be an integer from 1 to 1000"
                                   : "before: too large");
        return;
    }
    svc_audit_list(d, (int64_t)before, (int)limit, api_sink_new(req));
}

void api_whoami(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_whoami(d, api_sink_new(req));
}
