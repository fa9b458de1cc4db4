/* /v1/secrets: the secrets bound to hosts (daemon/secrets.h). A value goes in, never out. */
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "daemon/daemon.h"
#include "daemon/secrets.h"
#include "daemon/service.h"

static const char *const set_fields[] = {"value", "hosts", "keys", "headers", NULL};
static const char *const update_fields[] = {"hosts", "keys", "headers", NULL};

void api_secrets_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_secrets_list(d, api_sink_new(req));
}

void api_secrets_get(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_secret_get(d, m->params[0], api_sink_new(req));
}

/* The body of a set (value and hosts required) or an update (at least one field). Its lists are
 * checked by daemon/secrets.c; null is as absent. */
static json_t *fields_body(struct daemon *d, struct http_req *req, int set, const char **value,
                           struct secret_fields *f)
{
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return NULL;
    struct wr_err err = {0};
    *value = NULL;
    memset(f, 0, sizeof(*f));
    if (jv_only(o, set ? set_fields : update_fields, &err) < 0 ||
        (set && jv_string(o, "value", 8192, value, &err) < 0)) {
        json_decref(o);
        api_reply_err(req, &err);
        return NULL;
    }
    f->hosts = json_is_null(json_object_get(o, "hosts")) ? NULL : json_object_get(o, "hosts");
    f->keys = json_is_null(json_object_get(o, "keys")) ? NULL : json_object_get(o, "keys");
    f->headers = json_is_null(json_object_get(o, "headers")) ? NULL : json_object_get(o, "headers");
    const char *missing = set && !*value     ? "value: required"
                          : set && !f->hosts ? "hosts: required"
                          : !set && !f->hosts && !f->keys && !f->headers
                              ? "nothing to change: give hosts, keys or headers"
                              : NULL;
    if (missing) {
        json_decref(o);
        api_reply_invalid(req, missing);
        return NULL;
    }
    return o;
}

void api_secrets_set(struct daemon *d, struct http_req *req, struct route_match *m)
{
    const char *value;
    struct secret_fields f;
    json_t *o = fields_body(d, req, 1, &value, &f);
    if (!o)
        return;
    svc_secret_set(d, m->params[0], value, strlen(value), &f, api_sink_new(req));
    json_decref(o);
}

void api_secrets_update(struct daemon *d, struct http_req *req, struct route_match *m)
{
    const char *value;
    struct secret_fields f;
    json_t *o = fields_body(d, req, 0, &value, &f);
    if (!o)
        return;
    svc_secret_update(d, m->params[0], &f, api_sink_new(req));
    json_decref(o);
}

void api_secrets_delete(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_secret_delete(d, m->params[0], api_sink_new(req));
}
