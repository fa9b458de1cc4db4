/* /v1/secrets: the secrets bound to hosts (daemon/secrets.h). A value goes in, never out. */
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "daemon/daemon.h"
#include "daemon/service.h"

static const char *const set_fields[] = {"value", "hosts", NULL};

void api_secrets_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_secrets_list(d, api_sink_new(req));
}

void api_secrets_get(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_secret_get(d, m->params[0], api_sink_new(req));
}

void api_secrets_set(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    struct wr_err err = {0};
    const char *value = NULL;
    json_t *hosts = json_object_get(o, "hosts");
    if (jv_only(o, set_fields, &err) < 0 || jv_string(o, "value", 8192, &value, &err) < 0) {
        json_decref(o);
        api_reply_err(req, &err);
        return;
    }
    if (!value || !hosts) {
        json_decref(o);
        wr_err_kind(&err, WR_E_INVALID, 0, "%s: required", value ? "hosts" : "value");
        api_reply_err(req, &err);
        return;
    }
    svc_secret_set(d, m->params[0], value, strlen(value), hosts, api_sink_new(req));
    json_decref(o);
}

void api_secrets_delete(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_secret_delete(d, m->params[0], api_sink_new(req));
}
