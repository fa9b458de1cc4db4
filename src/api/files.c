/*
 * /v1/sandboxes/{id}/files/...: checks the query or body and hands the file
 * operation to the service (daemon/files.c), which has the agent carry it
 * out inside the sandbox. File content travels as raw HTTP bodies.
 */
#include <stdint.h>
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "daemon/daemon.h"
#include "daemon/service.h"

#define MAX_PATH_BYTES 4096

static int parse_flag(const char *s, int def, int *out)
{
    if (!s) {
        *out = def;
        return 0;
    }
    if (!strcmp(s, "true") || !strcmp(s, "1"))
        *out = 1;
    else if (!strcmp(s, "false") || !strcmp(s, "0"))
        *out = 0;
    else
        return -1;
    return 0;
}

/* The path query parameter (def when absent), or NULL after answering 400. */
static const char *path_param(struct http_req *req, const char *def)
{
    const char *p = http_req_query(req, "path");
    if (!p)
        p = def;
    if (!p)
        api_reply_invalid(req, "path: required");
    return p;
}

void api_files_read(struct daemon *d, struct http_req *req, struct route_match *m)
{
    uint64_t offset, length;
    if (api_query_u64(req, "offset", 0, &offset) < 0 ||
        api_query_u64(req, "length", UINT64_MAX, &length) < 0)
        return;
    const char *path = path_param(req, NULL);
    if (path)
        svc_file_read(d, m->params[0], path, offset, length, api_sink_new(req));
}

void api_files_write(struct daemon *d, struct http_req *req, struct route_match *m)
{
    unsigned mode = SVC_MODE_UNSET;
    int parents;
    uint64_t offset;
    if (api_query_u64(req, "offset", SVC_OFFSET_NONE, &offset) < 0)
        return;
    if (offset != SVC_OFFSET_NONE && offset > (uint64_t)INT64_MAX) {
        api_reply_invalid(req, "offset: past the largest file offset");
        return;
    }
    const char *ms = http_req_query(req, "mode");
    if (ms && jv_parse_mode(ms, &mode) < 0) {
        api_reply_invalid(req, "mode: must be an octal string like 0644");
        return;
    }
    if (parse_flag(http_req_query(req, "parents"), 1, &parents) < 0) {
        api_reply_invalid(req, "parents: must be true or false");
        return;
    }
    const char *path = path_param(req, NULL);
    if (path)
        svc_file_write(d, m->params[0], path, mode, parents, offset, api_sink_new(req));
}

void api_files_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_file_list(d, m->params[0], path_param(req, "/workspace"), api_sink_new(req));
}

void api_files_stat(struct daemon *d, struct http_req *req, struct route_match *m)
{
    const char *path = path_param(req, NULL);
    if (path)
        svc_file_stat(d, m->params[0], path, api_sink_new(req));
}

static const char *const mkdir_fields[] = {"path", "parents", "mode", NULL};

void api_files_mkdir(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    struct wr_err err = {0};
    const char *path = NULL, *ms = NULL;
    int parents;
    unsigned mode = 0755;
    if (jv_only(o, mkdir_fields, &err) < 0 ||
        jv_string(o, "path", MAX_PATH_BYTES, &path, &err) < 0 ||
        jv_bool(o, "parents", 1, &parents, &err) < 0 || jv_string(o, "mode", 8, &ms, &err) < 0)
        api_reply_err(req, &err);
    else if (ms && jv_parse_mode(ms, &mode) < 0)
        api_reply_invalid(req, "mode: must be an octal string like 0755");
    else if (!path)
        api_reply_invalid(req, "path: required");
    else
        svc_file_mkdir(d, m->params[0], path, mode, parents, api_sink_new(req));
    json_decref(o);
}

void api_files_remove(struct daemon *d, struct http_req *req, struct route_match *m)
{
    int recursive;
    if (parse_flag(http_req_query(req, "recursive"), 0, &recursive) < 0) {
        api_reply_invalid(req, "recursive: must be true or false");
        return;
    }
    const char *path = path_param(req, NULL);
    if (path)
        svc_file_remove(d, m->params[0], path, recursive, api_sink_new(req));
}

void api_files_archive(struct daemon *d, struct http_req *req, struct route_match *m)
{
    const char *path = path_param(req, NULL);
    if (path)
        svc_file_archive(d, m->params[0], path, api_sink_new(req));
}

static const char *const extract_fields[] = {"archive", "path", "remove_archive", NULL};

void api_files_extract(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    struct wr_err err = {0};
    const char *path = NULL, *archive = NULL;
    int remove_archive;
    if (jv_only(o, extract_fields, &err) < 0 ||
        jv_string(o, "path", MAX_PATH_BYTES, &path, &err) < 0 ||
        jv_string(o, "archive", MAX_PATH_BYTES, &archive, &err) < 0 ||
        jv_bool(o, "remove_archive", 0, &remove_archive, &err) < 0)
        api_reply_err(req, &err);
    else if (!path)
        api_reply_invalid(req, "path: required");
    else if (!archive)
        api_reply_invalid(req, "archive: required");
    else
        svc_file_extract(d, m->params[0], archive, path, remove_archive, api_sink_new(req));
    json_decref(o);
}
