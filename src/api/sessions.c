/*
 * /v1/sandboxes/{id}/sessions: interactive sessions (daemon/session.c) — create, list, get,
 * delete — and connect, which upgrades to a WebSocket (http/wsconn.h) and bridges it to the
 * session: binary frames carry terminal bytes both ways, text frames JSON control messages
 * (client: resize, signal, eof; server: exit, error).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "common/util.h"
#include "common/ws.h"
#include "daemon/daemon.h"
#include "daemon/service.h"
#include "http/wsconn.h"

#define MAX_ARGS 4096
#define MAX_ARG_BYTES (256 * 1024)
#define MAX_CWD_BYTES 4096
/* The subprotocol a client may offer (and gets back); withruntime.key.<key> carries its key. */
#define WS_PROTOCOL "withruntime"

static const char *const create_fields[] = {"command", "argv", "cwd",  "env",
                                            "tty",     "rows", "cols", NULL};

void api_sessions_create(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 1);
    if (!o)
        return;
    struct wr_err err = {0};
    struct session_request r = {0};
    long long rows, cols;
    if (jv_only(o, create_fields, &err) < 0 ||
        jv_string(o, "command", MAX_ARG_BYTES, &r.command, &err) < 0 ||
        jv_string_array(o, "argv", MAX_ARGS, MAX_ARG_BYTES, &r.argv, &err) < 0 ||
        jv_string(o, "cwd", MAX_CWD_BYTES, &r.cwd, &err) < 0 ||
        jv_string_map(o, "env", 256, 256, 32768, 1, &r.env, &err) < 0 ||
        jv_bool(o, "tty", 1, &r.tty, &err) < 0 ||
        jv_int(o, "rows", 1, 10000, 24, &rows, &err) < 0 ||
        jv_int(o, "cols", 1, 10000, 80, &cols, &err) < 0) {
        /* the error is set */
    } else if (r.command && r.argv) {
        wr_err_kind(&err, WR_E_INVALID, 0, "command, argv: give at most one of them");
    } else if (r.command && !*r.command) {
        wr_err_kind(&err, WR_E_INVALID, 0, "command: must not be empty");
    } else if (r.argv && json_array_size(r.argv) == 0) {
        wr_err_kind(&err, WR_E_INVALID, 0, "argv: must not be empty");
    } else if (r.cwd && !*r.cwd) {
        wr_err_kind(&err, WR_E_INVALID, 0, "cwd: must not be empty");
    }
    if (err.msg[0]) {
        json_decref(o);
        api_reply_err(req, &err);
        return;
    }
    r.rows = (int)rows;
    r.cols = (int)cols;
    svc_session_create(d, m->params[0], &r, api_sink_new(req));
    json_decref(o);
}

void api_sessions_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_session_list(d, m->params[0], api_sink_new(req));
}

void api_sessions_get(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_session_get(d, m->params[0], m->params[1], api_sink_new(req));
}

void api_sessions_delete(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_session_delete(d, m->params[0], m->params[1], api_sink_new(req));
}

/* ---- the WebSocket bridge ---- */

struct bridge {
    struct wsconn *ws;  /* NULL once closed */
    struct session *ss; /* NULL once detached */
};

static void c_output(void *arg, const void *data, size_t len)
{
    struct bridge *b = arg;
    if (b->ws)
        wsconn_send(b->ws, WS_OP_BINARY, data, len);
}

static size_t c_backlog(void *arg)
{
    struct bridge *b = arg;
    return b->ws ? wsconn_backlog(b->ws) : 0;
}

static void c_want_drain(void *arg)
{
    struct bridge *b = arg;
    if (b->ws)
        wsconn_on_drain(b->ws);
}

static void c_pause(void *arg, int on)
{
    struct bridge *b = arg;
    if (b->ws)
        wsconn_pause(b->ws, on);
}

static void c_detached(void *arg, json_t *msg)
{
    struct bridge *b = arg;
    b->ss = NULL;
    if (b->ws) {
        if (msg) {
            char *s = json_dumps(msg, JSON_COMPACT);
            if (s)
                wsconn_send(b->ws, WS_OP_TEXT, s, strlen(s));
            free(s);
        }
        wsconn_close(b->ws, msg ? WS_CLOSE_NORMAL : 4000,
                     msg ? "session ended" : "another client connected");
        b->ws = NULL;
    }
    json_decref(msg);
    free(b);
}

static const struct session_client_ops client_ops = {
    .output = c_output,
    .backlog = c_backlog,
    .want_drain = c_want_drain,
    .pause = c_pause,
    .detached = c_detached,
};

static void send_error(struct bridge *b, const char *msg)
{
    json_t *o = json_pack("{s:s, s:s}", "type", "error", "message", msg);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s && b->ws)
        wsconn_send(b->ws, WS_OP_TEXT, s, strlen(s));
    free(s);
}

static void w_binary(void *arg, const uint8_t *data, size_t len)
{
    struct bridge *b = arg;
    if (b->ss)
        session_input(b->ss, data, len);
}

static void w_text(void *arg, const char *data, size_t len)
{
    struct bridge *b = arg;
    if (!b->ss)
        return;
    json_error_t je;
    json_t *o = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!json_is_object(o) || !type) {
        send_error(b, "a control message is a JSON object with a \"type\"");
    } else if (!strcmp(type, "resize")) {
        json_t *r = json_object_get(o, "rows"), *c = json_object_get(o, "cols");
        json_int_t rows = json_is_integer(r) ? json_integer_value(r) : 0;
        json_int_t cols = json_is_integer(c) ? json_integer_value(c) : 0;
        if (rows < 1 || rows > 10000 || cols < 1 || cols > 10000)
            send_error(b, "resize: rows and cols must be integers 1..10000");
        else
            session_resize(b->ss, (int)rows, (int)cols);
    } else if (!strcmp(type, "signal")) {
        int sig = api_signal_number(json_object_get(o, "signal"));
        if (sig < 0)
            send_error(b, "signal: a name (INT, TERM, KILL, HUP, QUIT, USR1, USR2, STOP, CONT) "
                          "or a number 1..64");
        else
            session_signal(b->ss, sig);
    } else if (!strcmp(type, "eof")) {
        session_eof(b->ss);
    } else {
        send_error(b, "unknown control message type (resize, signal, eof)");
    }
    json_decref(o);
}

static void w_drained(void *arg)
{
    struct bridge *b = arg;
    if (b->ss)
        session_client_drained(b->ss);
}

static void w_closed(void *arg)
{
    struct bridge *b = arg;
    b->ws = NULL;
    if (b->ss)
        session_detach(b->ss);
    free(b);
}

static const struct wsconn_ops ws_ops = {
    .binary = w_binary,
    .text = w_text,
    .drained = w_drained,
    .closed = w_closed,
};

/* Returns 1 if the comma-separated header value holds token (case-insensitive). */
static int has_token(const char *v, const char *token)
{
    size_t n = strlen(token);
    while (v && *v) {
        while (*v == ' ' || *v == '\t' || *v == ',')
            v++;
        size_t l = strcspn(v, ",");
        size_t t = l;
        while (t > 0 && (v[t - 1] == ' ' || v[t - 1] == '\t'))
            t--;
        if (t == n && strncasecmp(v, token, n) == 0)
            return 1;
        v += l;
    }
    return 0;
}

void api_sessions_connect(struct daemon *d, struct http_req *req, struct route_match *m)
{
    const char *upgrade = http_req_header(req, "Upgrade");
    const char *conn = http_req_header(req, "Connection");
    const char *version = http_req_header(req, "Sec-WebSocket-Version");
    const char *key = http_req_header(req, "Sec-WebSocket-Key");
    char accept[32];
    if (!has_token(upgrade, "websocket") || !has_token(conn, "upgrade")) {
        http_reply_header(req, "Upgrade", "websocket");
        http_reply_error(req, 426, "upgrade_required",
                         "connect is a WebSocket: send Upgrade: websocket, Connection: Upgrade, "
                         "Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key");
        return;
    }
    if (!version || strcmp(version, "13") != 0) {
        http_reply_header(req, "Sec-WebSocket-Version", "13");
        http_reply_error(req, 426, "upgrade_required", "only WebSocket version 13 is spoken");
        return;
    }
    if (wsconn_accept_key(key, accept) < 0) {
        http_reply_error(req, 400, "invalid_request",
                         "Sec-WebSocket-Key: must be the base64 of 16 bytes");
        return;
    }
    if (http_req_body_len(req) > 0) {
        http_reply_error(req, 400, "invalid_request", "a WebSocket handshake has no body");
        return;
    }
    struct wr_err err = {0};
    struct session *ss = session_lookup(d, m->params[0], m->params[1], api_req_who(req), &err);
    if (!ss) {
        api_reply_err(req, &err);
        return;
    }
    const char *protos = http_req_header(req, "Sec-WebSocket-Protocol");
    struct bridge *b = xcalloc(1, sizeof(*b));
    b->ws = wsconn_accept(d->base, req, accept, has_token(protos, WS_PROTOCOL) ? WS_PROTOCOL : NULL,
                          &ws_ops, b);
    if (!b->ws) {
        free(b);
        return;
    }
    b->ss = ss;
    session_attach(ss, &client_ops, b); /* may end at once (an ended session): b is then gone */
}
