/*
 * Running a command through a sandbox's agent, whole or streamed. The host
 * enforces the limits itself: output beyond the cap is dropped here whatever
 * the agent sends, and the timeout is a timer here that kills the command's
 * process tree and, if the agent never confirms, answers anyway. Whether the
 * host's OOM killer was at work is read from the driver (on the stats worker)
 * when the command fails, and compared with the count the daemon last knew
 * (sandbox.h: oom_kills_seen). No read happens for a command that succeeds:
 * measured here, a read per exec on the worker costs ~2 ms of a 12 ms exec.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/base64.h"
#include "common/log.h"
#include "common/utf8.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/command.h"
#include "daemon/daemon.h"
#include "daemon/meter.h"
#include "daemon/metrics.h"
#include "daemon/sandbox.h"
#include "daemon/service.h"

#define KILL_GRACE_SECONDS 10

/* A streamed command's flow control (like a read's in files.c): output in flight from the
 * agent, and what the caller's connection may hold unsent before the agent gets more. */
#define STREAM_WINDOW (1024 * 1024)

static const char *const default_env[][2] = {
    {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
    {"HOME", "/root"},
    {"LANG", "C.UTF-8"},
    {"USER", "root"},
    /* A sandbox is disposable and root owns it: `pip install` works there as the seed's
     * examples expect, Debian's "externally managed" guard notwithstanding. */
    {"PIP_BREAK_SYSTEM_PACKAGES", "1"},
    /* The system bundle holds the daemon's CA (its proxy terminates TLS); these point the tools
     * that keep their own bundles at it too. */
    {"SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"},
    {"REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"},
    {"CURL_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"},
    {"NODE_EXTRA_CA_CERTS", "/etc/ssl/certs/ca-certificates.crt"},
    {"PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"},
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
    struct sandbox *sb; /* referenced */
    struct agentconn *conn;
    struct sink *sink;
    uint32_t id; /* the agent request while the command runs, else 0 */
    int stream;
    size_t cap;
    double timeout;
    struct outbuf out[2];
    struct event *timer;
    int timed_out;
    int killed;
    int waiting_drain; /* stream: credit waits for the caller to catch up */
    int exit_code, exit_signal;
    uint64_t start_ms;
    uint64_t exit_wait_us;     /* the agent's part of exit_to_answer_us, UINT64_MAX: not told */
    uint64_t exit_rx_us;       /* when EXIT came */
    uint64_t oom_kills_before; /* the sandbox's OOM-kill count when the command started */
    size_t reserved;           /* of the daemon's output budget */
};

static void op_free(struct exec_op *op)
{
    if (op->timer)
        event_free(op->timer);
    for (int i = 0; i < 2; i++)
        free(op->out[i].data);
    daemon_release_output(op->d, op->reserved);
    sandbox_unref(op->sb);
    free(op);
}

/* Output this big or bigger is sent as base64 if JSON's escapes would grow it past 1.5x. */
#define ESCAPE_CHECK_MIN 4096

/* Bytes b takes inside a JSON string: control characters become \uXXXX (or \n and the
 * like), quotes and backslashes get one. */
static size_t json_escaped_len(const unsigned char *b, size_t n)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = b[i];
        if (c == '"' || c == '\\' || c == '\n' || c == '\t' || c == '\r' || c == '\b' || c == '\f')
            len += 2;
        else if (c < 0x20)
            len += 6;
        else
            len += 1;
    }
    return len;
}

json_t *exec_encode_bytes(const unsigned char *b, size_t n, const char **enc)
{
    if (utf8_valid(b, n) && (n < ESCAPE_CHECK_MIN || json_escaped_len(b, n) <= n + n / 2)) {
        *enc = "utf-8";
        return json_stringn((const char *)b, n);
    }
    char *s = base64_encode(b, n);
    json_t *str = json_string(s);
    free(s);
    *enc = "base64";
    return str;
}

static void stream_chunk(struct exec_op *op, int which, const unsigned char *b, size_t n)
{
    const char *enc;
    json_t *data = exec_encode_bytes(b, n, &enc);
    sink_record(op->sink, json_pack("{s:s, s:o, s:s}", "type", which ? "stderr" : "stdout", "data",
                                    data, "encoding", enc));
}

static void stream_topup(struct exec_op *op);

static void stream_drained(void *arg)
{
    struct exec_op *op = arg;
    op->waiting_drain = 0;
    stream_topup(op);
}

/* Gives the agent more credit while the caller keeps up; else waits until it has caught up
 * (the command then blocks writing its output, as on a slow terminal). */
static void stream_topup(struct exec_op *op)
{
    if (!op->id || op->waiting_drain)
        return;
    if (sink_backlog(op->sink) < STREAM_WINDOW) {
        agentconn_credit(op->conn, op->id, STREAM_WINDOW);
        return;
    }
    op->waiting_drain = 1;
    sink_on_drain(op->sink, stream_drained, op);
}

static void on_whole_output(struct exec_op *op, int which, const uint8_t *b, size_t n)
{
    struct outbuf *ob = &op->out[which];
    ob->total += n;
    if (n > op->cap - ob->len) {
        n = op->cap - ob->len;
        ob->truncated = 1;
    }
    if (n == 0)
        return;
    ob->data = xrealloc(ob->data, ob->len + n);
    memcpy(ob->data + ob->len, b, n);
    ob->len += n;
}

/* Said once per stream, in its place among the output lines, so that a reader of the stream
 * knows at once that what follows is not all the command wrote (the exit line says it too). */
static void stream_truncated(struct exec_op *op, int which)
{
    /* The start of a character split at the cap is never completed: it goes now, as it is (a
     * chunk that is not UTF-8 goes as base64), so that the stream holds exactly the cap's
     * bytes and none of them follows this line. */
    struct outbuf *ob = &op->out[which];
    if (ob->holdlen)
        stream_chunk(op, which, ob->hold, ob->holdlen);
    ob->holdlen = 0;
    sink_record(op->sink,
                json_pack("{s:s, s:s, s:I}", "type", "truncated", "stream",
                          which ? "stderr" : "stdout", "max_output_bytes", (json_int_t)op->cap));
}

static void on_stream_output(struct exec_op *op, int which, const uint8_t *b, size_t n)
{
    struct outbuf *ob = &op->out[which];
    ob->total += n;
    int cut = 0;
    if (n > op->cap - ob->forwarded) {
        n = op->cap - ob->forwarded;
        cut = !ob->truncated;
        ob->truncated = 1;
    }
    if (n == 0) {
        if (cut)
            stream_truncated(op, which);
        stream_topup(op); /* past the cap, output is dropped: the agent may go on */
        return;
    }
    ob->forwarded += n;
    /* Join a held-back partial character, then hold back any new one at the end. */
    unsigned char *buf = xmalloc(ob->holdlen + n);
    memcpy(buf, ob->hold, ob->holdlen);
    memcpy(buf + ob->holdlen, b, n);
    size_t total = ob->holdlen + n;
    size_t whole = utf8_complete_prefix(buf, total);
    ob->holdlen = total - whole;
    memcpy(ob->hold, buf + whole, ob->holdlen);
    if (whole)
        stream_chunk(op, which, buf, whole);
    free(buf);
    if (cut)
        stream_truncated(op, which);
    stream_topup(op);
}

/* Output from the command: kept (whole) or forwarded (stream), never past the cap. */
static void on_output(struct exec_op *op, int which, const uint8_t *b, size_t n)
{
    if (op->stream)
        on_stream_output(op, which, b, n);
    else
        on_whole_output(op, which, b, n);
}

/* The agent's word on how long EXIT waited after the command was reaped: no more than the
 * command has run (it is untrusted), UINT64_MAX when it said nothing. */
static uint64_t exit_wait(const struct exec_op *op, const uint8_t *payload, size_t len)
{
    struct proto_field f;
    uint64_t us;
    if (proto_find(payload, len, PT_EXIT_WAIT, &f) != 1 || proto_field_u64(&f, &us) < 0)
        return UINT64_MAX;
    uint64_t ran = (now_ms_monotonic() - op->start_ms + 1) * 1000;
    return us < ran ? us : ran;
}

static json_t *result_json(struct exec_op *op, int oom)
{
    int code = op->exit_code, sig = op->exit_signal;
    json_t *o = json_pack("{s:i, s:o, s:b, s:b, s:b, s:b, s:I}", "exit_code", code, "signal",
                          sig ? json_integer(sig) : json_null(), "stdout_truncated",
                          op->out[0].truncated, "stderr_truncated", op->out[1].truncated,
                          "timed_out", op->timed_out, "oom_killed", oom, "duration_ms",
                          (json_int_t)(now_ms_monotonic() - op->start_ms));
    /* From the command's exit, as the agent saw it, to this answer: the agent's wait for the
     * pipes plus the daemon's own time since EXIT came (the channel's transit between them,
     * tens of microseconds, is not in it). */
    if (op->exit_wait_us != UINT64_MAX)
        json_object_set_new(
            o, "exit_to_answer_us",
            json_integer((json_int_t)(op->exit_wait_us + now_us_monotonic() - op->exit_rx_us)));
    return o;
}

static void finish_exit(struct exec_op *op, int oom)
{
    metrics_add(MC_EXECS, 1);
    metrics_observe_us(MH_EXEC, (now_ms_monotonic() - op->start_ms) * 1000);
    log_info(op->sb->id, "exec.exit", "code=%d signal=%d timed_out=%d ms=%llu", op->exit_code,
             op->exit_signal, op->timed_out,
             (unsigned long long)(now_ms_monotonic() - op->start_ms));
    json_t *o = result_json(op, oom);
    if (op->stream) {
        for (int i = 0; i < 2; i++)
            if (op->out[i].holdlen)
                stream_chunk(op, i, op->out[i].hold, op->out[i].holdlen);
        json_object_set_new(o, "type", json_string("exit"));
        sink_record(op->sink, o);
        sink_end(op->sink);
    } else {
        for (int i = 0; i < 2; i++) {
            const char *enc;
            json_t *s =
                exec_encode_bytes(op->out[i].data ? op->out[i].data : (const unsigned char *)"",
                                  op->out[i].len, &enc);
            json_object_set_new(o, i ? "stderr" : "stdout", s);
            json_object_set_new(o, i ? "stderr_encoding" : "stdout_encoding", json_string(enc));
        }
        sink_reply(op->sink, SINK_OK, o);
    }
    op_free(op);
}

static void finish_error(struct exec_op *op, enum wr_kind kind, const char *msg)
{
    struct wr_err err = {0};
    wr_err_kind(&err, kind, 0, "%s", msg);
    log_warn(op->sb->id, "exec.error", "kind=%d message=\"%s\"", (int)kind, msg);
    sink_fail(op->sink, &err);
    op_free(op);
}

/* A failed command: the host's OOM killer at work in this sandbox since it started is the
 * likely cause, and the one a user needs to hear. (Under gVisor a process whose host-side task
 * the OOM killer hit may end with a plain exit status, not a signal.) */
static void on_final_stats(struct sandbox *sb, int rc, const struct driver_stats *st, void *arg)
{
    struct exec_op *op = arg;
    int oom = rc == 0 && st->oom_kills > op->oom_kills_before;
    if (rc == 0 && st->oom_kills > sb->oom_kills_seen)
        sb->oom_kills_seen = st->oom_kills;
    finish_exit(op, oom);
}

static void on_frame(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct exec_op *op = arg;
    if (!h) {
        op->id = 0;
        if (op->d->shutting_down)
            finish_error(op, WR_E_UNAVAILABLE, "the daemon is shutting down");
        else
            finish_error(op, WR_E_SANDBOX_FAILED, (const char *)payload);
        return;
    }
    switch (h->type) {
    case PROTO_STDOUT:
    case PROTO_STDERR: on_output(op, h->type == PROTO_STDERR, payload, h->len); return;
    case PROTO_EXIT:
        op->exit_rx_us = now_us_monotonic();
        op->exit_wait_us = exit_wait(op, payload, h->len);
        agentconn_exit_status(payload, h->len, &op->exit_code, &op->exit_signal);
        op->id = 0;
        event_del(op->timer);
        if (op->exit_signal || op->exit_code != 0) {
            sandbox_read_stats(op->sb, on_final_stats, op);
        } else {
            finish_exit(op, 0);
        }
        return;
    case PROTO_ERROR: {
        char msg[512] = "the command could not be started";
        struct proto_field f;
        if (proto_find(payload, h->len, PT_MESSAGE, &f) == 1 &&
            proto_field_str(&f, msg, sizeof(msg)) < 0)
            snprintf(msg, sizeof(msg), "the command could not be started");
        if (!utf8_valid((const unsigned char *)msg, strlen(msg)))
            snprintf(msg, sizeof(msg), "the command could not be started");
        op->id = 0;
        finish_error(op, WR_E_EXEC_FAILED, msg);
        return;
    }
    default:
        if (agentconn_frame_ends(h->type)) {
            /* The agent ended the request with a frame that means nothing for an exec. */
            char msg[128];
            snprintf(msg, sizeof(msg), "the sandbox's agent answered the command with %s",
                     proto_type_name(h->type));
            op->id = 0;
            finish_error(op, WR_E_SANDBOX_FAILED, msg);
        }
        return; /* anything else does not belong to an exec: ignored */
    }
}

static void kill_tree(struct exec_op *op)
{
    struct proto_buf b = {0};
    proto_put_u32(&b, PT_SIGNUM, SIGKILL);
    if (agentconn_send(op->conn, op->id, PROTO_SIGNAL, 0, b.data, b.len) < 0)
        log_warn(op->sb->id, "exec.kill_unsent", "the channel to the agent is gone");
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
    /* Killed, yet no EXIT: the agent is not doing its job. Answer anyway, and the sandbox is
     * failed: an agent that leaves one command hanging cannot be trusted with the next. */
    struct sandbox *sb = op->sb;
    struct agentconn *conn = op->conn;
    agentconn_cancel(conn, op->id);
    op->id = 0;
    sandbox_ref(sb);
    finish_error(op, WR_E_SANDBOX_FAILED,
                 "the command was killed but the sandbox's agent never reported its end");
    if (sb->conn == conn && sb->state == SB_RUNNING)
        sandbox_lost(sb, "agent_unresponsive",
                     "the agent did not report the end of a killed command");
    sandbox_unref(sb);
}

static void on_cancel(void *arg)
{
    struct exec_op *op = arg;
    if (op->id && !op->killed && agentconn_alive(op->conn)) {
        log_info(op->sb->id, "exec.client_gone", NULL);
        kill_tree(op);
    }
}

/* Sends the command (taking b): EXEC, stdin, the timer; a stream begins. Finishes op if the
 * agent cannot be reached. */
static void exec_send(struct exec_op *op, struct proto_buf *b, const struct exec_request *r)
{
    struct sandbox *sb = op->sb;
    op->conn = sb->conn;
    op->start_ms = now_ms_monotonic();
    op->id = op->stream
                 ? agentconn_request_windowed(op->conn, PROTO_EXEC, b, STREAM_WINDOW, on_frame, op)
                 : agentconn_request(op->conn, PROTO_EXEC, b->data, b->len, on_frame, op);
    proto_buf_free(b);
    if (!op->id) {
        finish_error(op, WR_E_CONFLICT, "the sandbox's agent is not reachable");
        return;
    }
    if (r->stdin_data && agentconn_send_stdin(op->conn, op->id, r->stdin_data, r->stdin_len) < 0)
        log_warn(sb->id, "exec.stdin_unsent", "the channel to the agent is gone");
    op->timer = evtimer_new(op->d->base, on_timer, op);
    struct timeval tv = {(time_t)op->timeout,
                         (suseconds_t)((op->timeout - (double)(time_t)op->timeout) * 1e6)};
    evtimer_add(op->timer, &tv);
    if (op->stream)
        sink_begin(op->sink, NULL); /* from here on every answer, errors too, is a record */
    log_info(sb->id, "exec.start", "stream=%d timeout=%g", op->stream, op->timeout);
    sink_on_cancel(op->sink, on_cancel, op); /* last: it may run at once */
}

int exec_build(struct sandbox *sb, const struct exec_request *r, struct proto_buf *b,
               struct wr_err *err)
{
    if (r->command) {
        proto_put_str(b, PT_ARG, "/bin/sh");
        proto_put_str(b, PT_ARG, "-c");
        proto_put_str(b, PT_ARG, r->command);
    } else {
        size_t i;
        json_t *v;
        json_array_foreach(r->argv, i, v)
            proto_put_bytes(b, PT_ARG, json_string_value(v), json_string_length(v));
    }
    json_t *merged = json_object();
    for (size_t i = 0; i < WR_ARRAY_LEN(default_env); i++)
        json_object_set_new(merged, default_env[i][0], json_string(default_env[i][1]));
    /* A secret's name holds its placeholder: the proxy swaps in the value on its way out. */
    json_object_update(merged, sb->secrets);
    json_object_update(merged, sb->env);
    if (r->env)
        json_object_update(merged, r->env);
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
    proto_put_str(b, PT_CWD, r->cwd ? r->cwd : "/workspace");
    if (r->stdin_data)
        proto_put_u32(b, PT_STDIN_PIPE, 1);
    /* Room is left for the WINDOW field a stream adds (agentconn_request_windowed). */
    if (b->len > PROTO_MAX_PAYLOAD - 64)
        return wr_err_kind(err, WR_E_INVALID, 0,
                           "command, argv, env and cwd together exceed %u bytes",
                           PROTO_MAX_PAYLOAD);
    return 0;
}

void svc_exec(struct daemon *d, const char *id, const struct exec_request *r, struct sink *s)
{
    struct wr_err err = {0};
    struct sandbox *sb = sandbox_lookup(d, id, s->who, &err);
    struct proto_buf b = {0};
    if (!sb || sandbox_check_running(sb, &err) < 0 || meter_check_exec(sb, &err) < 0 ||
        exec_build(sb, r, &b, &err) < 0) {
        proto_buf_free(&b);
        sink_fail(s, &err);
        return;
    }
    if (r->background) {
        /* No timeout unless one was asked for: it runs until it exits or the lease ends. */
        json_t *shown =
            r->argv ? json_incref(r->argv) : json_pack("[s, s, s]", "/bin/sh", "-c", r->command);
        struct command *c = command_start(sb, &b, shown, r->stdin_data, r->stdin_len,
                                          r->timeout_seconds, r->max_output, &err);
        json_decref(shown);
        proto_buf_free(&b);
        if (!c)
            sink_fail(s, &err);
        else
            sink_reply(s, SINK_CREATED, command_to_json(c));
        return;
    }
    /* At worst a command holds both streams up to the cap; a stream holds its windows. */
    size_t reserve = r->stream ? 2 * (size_t)STREAM_WINDOW : 2 * r->max_output;
    if (daemon_reserve_output(d, reserve, "command", &err) < 0) {
        proto_buf_free(&b);
        sink_fail(s, &err);
        return;
    }
    struct exec_op *op = xcalloc(1, sizeof(*op));
    op->exit_wait_us = UINT64_MAX;
    op->reserved = reserve;
    op->d = d;
    op->sb = sb;
    sandbox_ref(sb);
    op->sink = s;
    op->stream = r->stream;
    op->cap = r->max_output;
    op->timeout = r->timeout_seconds;
    op->oom_kills_before = sb->oom_kills_seen;
    exec_send(op, &b, r);
}
