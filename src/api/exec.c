/*
 * POST /v1/sandboxes/{id}/exec: runs a command through the agent, whole or
 * streamed as NDJSON. The host enforces the limits itself: output beyond the
 * cap is dropped here whatever the agent sends, and the timeout is a timer
 * here that kills the command's process tree and, if the agent never
 * confirms, answers anyway.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "common/base64.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/command.h"
#include "daemon/sandbox.h"

#define KILL_GRACE_SECONDS 10

static const char *const exec_fields[] = {
    "command",          "argv",   "cwd",        "env", "stdin", "stdin_base64", "timeout_seconds",
    "max_output_bytes", "stream", "background", NULL};

static const char *const default_env[][2] = {
    {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
    {"HOME", "/root"},
    {"LANG", "C.UTF-8"},
    {"USER", "root"},
};

struct outbuf {
    unsigned char *data;
    size_t len;       /* bytes kept (whole mode) */
    size_t total;     /* bytes the command wrote */
    size_t forwarded; /* bytes passed on (stream mode) */
    int truncated;
    unsigned char hold[4]; /* stream mode: a UTF-8 character split across chunks */
    size_t holdlen;
};

struct exec_op {
    struct daemon *d;
    struct sandbox *sb;
    struct agentconn *conn;
    struct http_req *req;
    uint32_t id;
    int stream;
    size_t cap;
    struct outbuf out[2];
    struct event *timer;
    int timed_out;
    int killed;
    uint64_t start_ms;
    uint64_t oom_kills_before; /* the sandbox cgroup's OOM-kill count when the command started */
};

static void op_free(struct exec_op *op)
{
    if (op->timer)
        event_free(op->timer);
    for (int i = 0; i < 2; i++)
        free(op->out[i].data);
    sandbox_unref(op->sb);
    free(op);
}

/* Encodes bytes as a JSON string and its encoding name. */
static void encode_bytes(const unsigned char *b, size_t n, json_t **str, const char **enc)
{
    if (jv_utf8_valid(b, n)) {
        *str = json_stringn((const char *)b, n);
        *enc = "utf-8";
    } else {
        char *s = base64_encode(b, n);
        *str = json_string(s);
        free(s);
        *enc = "base64";
    }
}

static void stream_line(struct exec_op *op, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!s)
        return;
    size_t n = strlen(s);
    http_stream_write(op->req, s, n);
    http_stream_write(op->req, "\n", 1);
    free(s);
}

static void stream_chunk(struct exec_op *op, int which, const unsigned char *b, size_t n)
{
    json_t *data;
    const char *enc;
    encode_bytes(b, n, &data, &enc);
    stream_line(op, json_pack("{s:s, s:o, s:s}", "type", which ? "stderr" : "stdout", "data", data,
                              "encoding", enc));
}

/* Output from the command: kept (whole) or forwarded (stream), never past the cap. */
static void on_output(struct exec_op *op, int which, const uint8_t *b, size_t n)
{
    struct outbuf *ob = &op->out[which];
    ob->total += n;
    size_t room = op->cap - (op->stream ? ob->forwarded : ob->len);
    if (n > room) {
        n = room;
        ob->truncated = 1;
    }
    if (n == 0)
        return;
    if (!op->stream) {
        ob->data = xrealloc(ob->data, ob->len + n);
        memcpy(ob->data + ob->len, b, n);
        ob->len += n;
        return;
    }
    ob->forwarded += n;
    /* Join a held-back partial character, then hold back any new one at the end. */
    unsigned char *buf = xmalloc(ob->holdlen + n);
    memcpy(buf, ob->hold, ob->holdlen);
    memcpy(buf + ob->holdlen, b, n);
    size_t total = ob->holdlen + n;
    size_t whole = jv_utf8_complete_prefix(buf, total);
    ob->holdlen = total - whole;
    memcpy(ob->hold, buf + whole, ob->holdlen);
    if (whole)
        stream_chunk(op, which, buf, whole);
    free(buf);
}

/* Reads the sandbox's OOM-kill count (0 if unknown). */
static uint64_t oom_kills(struct sandbox *sb)
{
    struct driver_spec spec;
    struct driver_stats st;
    sandbox_spec(sb, &spec);
    return driver_stats(sb->d->driver, &spec, &st, NULL) < 0 ? 0 : st.oom_kills;
}

static json_t *result_json(struct exec_op *op, int code, int sig)
{
    /* Failed while the host's OOM killer was at work in this sandbox: out of memory is the
     * likely cause, and the one a user needs to hear. (Under gVisor a process whose host-side
     * task the OOM killer hit may end with a plain exit status, not a signal.) */
    int oom = (sig || code != 0) && oom_kills(op->sb) > op->oom_kills_before;
    return json_pack("{s:i, s:o, s:b, s:b, s:b, s:b, s:I}", "exit_code", code, "signal",
                     sig ? json_integer(sig) : json_null(), "stdout_truncated",
                     op->out[0].truncated, "stderr_truncated", op->out[1].truncated, "timed_out",
                     op->timed_out, "oom_killed", oom, "duration_ms",
                     (json_int_t)(now_ms_monotonic() - op->start_ms));
}

static void finish_exit(struct exec_op *op, int code, int sig)
{
    log_info(op->sb->id, "exec.exit", "code=%d signal=%d timed_out=%d ms=%llu", code, sig,
             op->timed_out, (unsigned long long)(now_ms_monotonic() - op->start_ms));
    if (op->stream) {
        for (int i = 0; i < 2; i++)
            if (op->out[i].holdlen)
                stream_chunk(op, i, op->out[i].hold, op->out[i].holdlen);
        json_t *o = result_json(op, code, sig);
        json_object_set_new(o, "type", json_string("exit"));
        stream_line(op, o);
        http_stream_end(op->req);
    } else {
        json_t *o = result_json(op, code, sig);
        for (int i = 0; i < 2; i++) {
            json_t *s;
            const char *enc;
            encode_bytes(op->out[i].data ? op->out[i].data : (const unsigned char *)"",
                         op->out[i].len, &s, &enc);
            json_object_set_new(o, i ? "stderr" : "stdout", s);
            json_object_set_new(o, i ? "stderr_encoding" : "stdout_encoding", json_string(enc));
        }
        http_reply_json(op->req, 200, o);
    }
    op_free(op);
}

static void finish_error(struct exec_op *op, int status, const char *code, const char *msg)
{
    log_warn(op->sb->id, "exec.error", "code=%s message=\"%s\"", code, msg);
    if (op->stream) {
        stream_line(op,
                    json_pack("{s:s, s:s, s:s}", "type", "error", "code", code, "message", msg));
        http_stream_end(op->req);
    } else {
        http_reply_error(op->req, status, code, "%s", msg);
    }
    op_free(op);
}

static void on_frame(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct exec_op *op = arg;
    if (!h) {
        op->id = 0;
        if (op->d->shutting_down)
            finish_error(op, 503, "unavailable", "the daemon is shutting down");
        else
            finish_error(op, 500, "sandbox_failed", (const char *)payload);
        return;
    }
    switch (h->type) {
    case PROTO_STDOUT:
    case PROTO_STDERR: on_output(op, h->type == PROTO_STDERR, payload, h->len); return;
    case PROTO_EXIT: {
        int code, sig;
        agentconn_exit_status(payload, h->len, &code, &sig);
        op->id = 0;
        finish_exit(op, code, sig);
        return;
    }
    case PROTO_ERROR: {
        char msg[512] = "the command could not be started";
        struct proto_field f;
        if (proto_find(payload, h->len, PT_MESSAGE, &f) == 1 &&
            proto_field_str(&f, msg, sizeof(msg)) < 0)
            snprintf(msg, sizeof(msg), "the command could not be started");
        if (!jv_utf8_valid((const unsigned char *)msg, strlen(msg)))
            snprintf(msg, sizeof(msg), "the command could not be started");
        op->id = 0;
        finish_error(op, 422, "exec_failed", msg);
        return;
    }
    default: return; /* nothing else belongs to an exec; ignore rather than guess */
    }
}

static void kill_tree(struct exec_op *op)
{
    struct proto_buf b = {0};
    proto_put_u32(&b, PT_SIGNUM, SIGKILL);
    agentconn_send(op->conn, op->id, PROTO_SIGNAL, 0, b.data, b.len);
    proto_buf_free(&b);
    op->killed = 1;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct exec_op *op = arg;
    if (!op->killed) {
        op->timed_out = 1;
        log_info(op->sb->id, "exec.timeout", NULL);
        kill_tree(op);
        struct timeval tv = {KILL_GRACE_SECONDS, 0};
        evtimer_add(op->timer, &tv);
        return;
    }
    /* Killed, yet no EXIT: the agent is not doing its job. Answer anyway. */
    agentconn_cancel(op->conn, op->id);
    op->id = 0;
    finish_error(op, 500, "sandbox_failed",
                 "the command was killed but the sandbox's agent never reported its end");
}

static void on_client_gone(void *arg)
{
    struct exec_op *op = arg;
    if (op->id && !op->killed && agentconn_alive(op->conn)) {
        log_info(op->sb->id, "exec.client_gone", NULL);
        kill_tree(op);
    }
}

/* Builds the EXEC payload. Returns 0, or -1 with msg set. */
static int build_exec(struct sandbox *sb, json_t *argv, const char *command, const char *cwd,
                      json_t *env, int has_stdin, struct proto_buf *b, char *msg)
{
    if (command) {
        proto_put_str(b, PT_ARG, "/bin/sh");
        proto_put_str(b, PT_ARG, "-c");
        proto_put_str(b, PT_ARG, command);
    } else {
        size_t i;
        json_t *v;
        json_array_foreach(argv, i, v)
            proto_put_bytes(b, PT_ARG, json_string_value(v), json_string_length(v));
    }
    json_t *merged = json_object();
    for (size_t i = 0; i < WR_ARRAY_LEN(default_env); i++)
        json_object_set_new(merged, default_env[i][0], json_string(default_env[i][1]));
    json_object_update(merged, sb->env);
    if (env)
        json_object_update(merged, env);
    const char *k;
    json_t *v;
    json_object_foreach(merged, k, v)
    {
        size_t kl = strlen(k), vl = json_string_length(v);
        char *kv = xmalloc(kl + 1 + vl + 1);
        memcpy(kv, k, kl);
        kv[kl] = '=';
        memcpy(kv + kl + 1, json_string_value(v), vl);
        proto_put_bytes(b, PT_ENV, kv, kl + 1 + vl);
        free(kv);
    }
    json_decref(merged);
    proto_put_str(b, PT_CWD, cwd ? cwd : "/workspace");
    if (has_stdin)
        proto_put_u32(b, PT_STDIN_PIPE, 1);
    if (b->len > PROTO_MAX_PAYLOAD) {
        snprintf(msg, JV_MSG, "command, argv, env and cwd together exceed %u bytes",
                 PROTO_MAX_PAYLOAD);
        return -1;
    }
    return 0;
}

void api_exec(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox_running(d, req, m->params[0]);
    if (!sb)
        return;
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    char msg[JV_MSG];
    const char *command = NULL, *cwd = NULL, *in = NULL, *in64 = NULL;
    json_t *argv = NULL, *env = NULL;
    double timeout;
    long long cap;
    int stream, background;
    unsigned char *stdin_data = NULL;
    size_t stdin_len = 0;
    struct proto_buf b = {0};
    if (jv_only(o, exec_fields, msg) < 0 ||
        jv_string(o, "command", 256 * 1024, &command, msg) < 0 ||
        jv_string_array(o, "argv", PROTO_MAX_ARGS, 256 * 1024, &argv, msg) < 0 ||
        jv_string(o, "cwd", PROTO_MAX_PATH, &cwd, msg) < 0 ||
        jv_string_map(o, "env", 256, 256, 32768, 1, &env, msg) < 0 ||
        jv_string(o, "stdin", d->cfg.max_json_body, &in, msg) < 0 ||
        jv_string(o, "stdin_base64", d->cfg.max_json_body, &in64, msg) < 0 ||
        jv_number(o, "timeout_seconds", 0, 86400, d->cfg.default_exec_timeout, &timeout, msg) < 0 ||
        jv_int(o, "max_output_bytes", 1, (long long)d->cfg.max_output_cap,
               (long long)d->cfg.default_output_cap, &cap, msg) < 0 ||
        jv_bool(o, "stream", 0, &stream, msg) < 0 ||
        jv_bool(o, "background", 0, &background, msg) < 0)
        goto bad;
    if (stream && background) {
        snprintf(msg, sizeof(msg), "stream, background: give at most one of them");
        goto bad;
    }
    if (!!command == !!argv) {
        snprintf(msg, sizeof(msg), "command, argv: give exactly one of them");
        goto bad;
    }
    if (command && !*command) {
        snprintf(msg, sizeof(msg), "command: must not be empty");
        goto bad;
    }
    if (cwd && !*cwd) {
        snprintf(msg, sizeof(msg), "cwd: must not be empty");
        goto bad;
    }
    if (in && in64) {
        snprintf(msg, sizeof(msg), "stdin, stdin_base64: give at most one of them");
        goto bad;
    }
    if (in64) {
        stdin_data = base64_decode(in64, strlen(in64), &stdin_len);
        if (!stdin_data) {
            snprintf(msg, sizeof(msg), "stdin_base64: not valid base64");
            goto bad;
        }
    } else if (in) {
        stdin_len = strlen(in);
        stdin_data = xmalloc(stdin_len + 1);
        memcpy(stdin_data, in, stdin_len);
    }
    if (build_exec(sb, argv, command, cwd, env, stdin_data != NULL, &b, msg) < 0)
        goto bad;
    if (background) {
        /* No timeout unless one was asked for: it runs until it exits or the lease ends. */
        json_t *shown = argv ? json_incref(argv) : json_pack("[s, s, s]", "/bin/sh", "-c", command);
        double bg_timeout = json_object_get(o, "timeout_seconds") ? timeout : 0;
        char err[256];
        struct command *c = command_start(sb, &b, shown, stdin_data, stdin_len, bg_timeout,
                                          (size_t)cap, err, sizeof(err));
        json_decref(shown);
        json_decref(o);
        free(stdin_data);
        proto_buf_free(&b);
        if (!c)
            http_reply_error(req, 409, "conflict", "%s", err);
        else
            http_reply_json(req, 201, command_to_json(c));
        return;
    }
    json_decref(o);
    o = NULL;

    struct exec_op *op = xcalloc(1, sizeof(*op));
    op->d = d;
    op->sb = sb;
    sandbox_ref(sb);
    op->conn = sb->conn;
    op->req = req;
    op->cap = (size_t)cap;
    op->start_ms = now_ms_monotonic();
    op->oom_kills_before = oom_kills(sb);
    op->id = agentconn_request(sb->conn, PROTO_EXEC, b.data, b.len, on_frame, op);
    proto_buf_free(&b);
    if (!op->id) {
        free(stdin_data);
        finish_error(op, 409, "conflict", "the sandbox's agent is not reachable");
        return;
    }
    if (stdin_data) {
        agentconn_send_stdin(sb->conn, op->id, stdin_data, stdin_len);
        free(stdin_data);
    }
    op->timer = evtimer_new(d->base, on_timer, op);
    struct timeval tv = {(time_t)timeout, (suseconds_t)((timeout - (double)(time_t)timeout) * 1e6)};
    evtimer_add(op->timer, &tv);
    http_req_on_close(req, on_client_gone, op);
    if (stream) {
        /* From here on every answer, errors included, is a line of the stream. */
        op->stream = 1;
        http_stream_start(req, 200, "application/x-ndjson");
    }
    log_info(sb->id, "exec.start", "stream=%d timeout=%g", stream, timeout);
    return;
bad:
    free(stdin_data);
    proto_buf_free(&b);
    json_decref(o);
    http_reply_error(req, 400, "invalid_request", "%s", msg);
}
