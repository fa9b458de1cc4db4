/*
 * POST /v1/sandboxes/{id}/exec: checks the request and hands it to the
 * service (daemon/exec.c), which runs it whole, streamed, or in the
 * background.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "common/base64.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/service.h"

/* Bounds on what a request may carry; the service checks the encoded total against the
 * protocol's own limit. */
#define MAX_ARGS 4096
#define MAX_ARG_BYTES (256 * 1024)
#define MAX_CWD_BYTES 4096
/* A streamed command's output cap at most: 1 TiB, past anything a reader means to take. */
#define STREAM_OUTPUT_LIMIT (1LL << 40)

static const char *const exec_fields[] = {
    "command",          "argv",   "cwd",        "env", "stdin", "stdin_base64", "timeout_seconds",
    "max_output_bytes", "stream", "background", NULL};

/* Parses the body into r (strings borrowed from o; stdin copied into *stdin_buf). Returns 0,
 * or -1 with err set. */
static int parse(struct daemon *d, json_t *o, struct exec_request *r, unsigned char **stdin_buf,
                 struct wr_err *err)
{
    const char *in = NULL, *in64 = NULL;
    long long cap;
    if (jv_only(o, exec_fields, err) < 0 ||
        jv_string(o, "command", MAX_ARG_BYTES, &r->command, err) < 0 ||
        jv_string_array(o, "argv", MAX_ARGS, MAX_ARG_BYTES, &r->argv, err) < 0 ||
        jv_string(o, "cwd", MAX_CWD_BYTES, &r->cwd, err) < 0 ||
        jv_string_map(o, "env", 256, 256, 32768, 1, &r->env, err) < 0 ||
        jv_string(o, "stdin", d->cfg.max_json_body, &in, err) < 0 ||
        jv_string(o, "stdin_base64", d->cfg.max_json_body, &in64, err) < 0 ||
        jv_number(o, "timeout_seconds", 0, 86400, d->cfg.default_exec_timeout, &r->timeout_seconds,
                  err) < 0 ||
        jv_bool(o, "stream", 0, &r->stream, err) < 0 ||
        jv_bool(o, "background", 0, &r->background, err) < 0 ||
        jv_int(o, "max_output_bytes", 1, r->stream ? STREAM_OUTPUT_LIMIT : LLONG_MAX,
               (long long)d->cfg.default_output_cap, &cap, err) < 0)
        return -1;
    /* A whole answer (and a background command's kept tail) is held in the daemon's memory;
     * a stream is sent as it comes, with flow control, and holds nothing. */
    if (!r->stream && (unsigned long long)cap > d->cfg.max_output_cap)
        return wr_err_kind(err, WR_E_INVALID, 0,
                           "max_output_bytes: at most %zu for an answer that holds the whole "
                           "output; stream it (\"stream\": true) for up to %lld",
                           d->cfg.max_output_cap, STREAM_OUTPUT_LIMIT);
    r->max_output = (size_t)cap;
    if (r->stream && r->background)
        return wr_err_kind(err, WR_E_INVALID, 0, "stream, background: give at most one of them");
    if (!!r->command == !!r->argv)
        return wr_err_kind(err, WR_E_INVALID, 0, "command, argv: give exactly one of them");
    if (r->command && !*r->command)
        return wr_err_kind(err, WR_E_INVALID, 0, "command: must not be empty");
    if (r->cwd && !*r->cwd)
        return wr_err_kind(err, WR_E_INVALID, 0, "cwd: must not be empty");
    if (in && in64)
        return wr_err_kind(err, WR_E_INVALID, 0, "stdin, stdin_base64: give at most one of them");
    /* A background command has no timeout unless one was asked for: it runs until it exits or
     * the lease ends. */
    if (r->background && !json_object_get(o, "timeout_seconds"))
        r->timeout_seconds = 0;
    if (in64) {
        *stdin_buf = base64_decode(in64, strlen(in64), &r->stdin_len);
        if (!*stdin_buf)
            return wr_err_kind(err, WR_E_INVALID, 0, "stdin_base64: not valid base64");
    } else if (in) {
        r->stdin_len = strlen(in);
        *stdin_buf = xmalloc(r->stdin_len + 1);
        memcpy(*stdin_buf, in, r->stdin_len);
    }
    r->stdin_data = *stdin_buf;
    return 0;
}

void api_exec(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    struct wr_err err = {0};
    struct exec_request r = {0};
    unsigned char *stdin_buf = NULL;
    if (parse(d, o, &r, &stdin_buf, &err) < 0)
        api_reply_err(req, &err);
    else
        svc_exec(d, m->params[0], &r, api_sink_new(req));
    free(stdin_buf);
    json_decref(o);
}
