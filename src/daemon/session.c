/* Interactive sessions: see session.h. */
#include "daemon/session.h"

#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/utf8.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/command.h"
#include "daemon/daemon.h"
#include "daemon/meter.h"
#include "daemon/sandbox.h"
#include "daemon/service.h"

/* What runs when the caller names no command: a login shell, bash where there is one. */
#define LOGIN_SHELL "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"

enum ses_state { SES_RUNNING, SES_EXITED, SES_FAILED };

struct session {
    struct daemon *d;
    struct sandbox *sb;
    char id[SESSION_ID_LEN];
    uint32_t req_id; /* the agent request while it runs, else 0 */
    struct agentconn *conn;
    json_t *argv;
    int tty, rows, cols;
    enum ses_state state;
    int exit_code, signal;
    char error[256];
    int64_t created_ms, ended_ms;
    uint8_t *tail; /* output no client took: the last SESSION_TAIL bytes */
    size_t tail_len;
    const struct session_client_ops *cops; /* the attached client, or NULL */
    void *carg;
    int waiting_drain; /* credit waits for the client to catch up */
    int input_paused;  /* the client's input waits for the channel */
    struct event *grace;
    size_t reserved; /* of the daemon's output budget, while running */
    struct session *next;
};

static const char *state_name(enum ses_state s)
{
    return s == SES_RUNNING ? "running" : s == SES_EXITED ? "exited" : "failed";
}

json_t *session_to_json(const struct session *ss)
{
    char created[32], ended[32];
    format_rfc3339(ss->created_ms / 1000, created, sizeof(created));
    format_rfc3339(ss->ended_ms / 1000, ended, sizeof(ended));
    json_t *o = json_pack("{s:s, s:s, s:O, s:s, s:b, s:i, s:i, s:b, s:s, s:o, s:o, s:o}", "id",
                          ss->id, "sandbox_id", ss->sb->id, "argv", ss->argv, "state",
                          state_name(ss->state), "tty", ss->tty, "rows", ss->rows, "cols", ss->cols,
                          "connected", ss->cops != NULL, "created_at", created, "ended_at",
                          ss->state == SES_RUNNING ? json_null() : json_string(ended), "exit_code",
                          ss->state == SES_EXITED ? json_integer(ss->exit_code) : json_null(),
                          "signal", ss->signal ? json_integer(ss->signal) : json_null());
    if (ss->state == SES_FAILED) {
        json_t *e = json_string(ss->error);
        json_object_set_new(o, "error", e ? e : json_string("(message not valid UTF-8)"));
    }
    return o;
}

static json_t *exit_msg(const struct session *ss)
{
    json_t *o = json_pack("{s:s, s:o, s:o}", "type", "exit", "exit_code",
                          ss->state == SES_EXITED ? json_integer(ss->exit_code) : json_null(),
                          "signal", ss->signal ? json_integer(ss->signal) : json_null());
    if (ss->error[0]) {
        json_t *e = json_string(ss->error);
        json_object_set_new(o, "error", e ? e : json_string("(message not valid UTF-8)"));
    }
    return o;
}

static void tail_add(struct session *ss, const uint8_t *b, size_t n)
{
    if (!ss->tail)
        ss->tail = xmalloc(SESSION_TAIL);
    if (n >= SESSION_TAIL) {
        memcpy(ss->tail, b + n - SESSION_TAIL, SESSION_TAIL);
        ss->tail_len = SESSION_TAIL;
        return;
    }
    if (ss->tail_len + n > SESSION_TAIL) {
        size_t drop = ss->tail_len + n - SESSION_TAIL;
        memmove(ss->tail, ss->tail + drop, ss->tail_len - drop);
        ss->tail_len -= drop;
    }
    memcpy(ss->tail + ss->tail_len, b, n);
    ss->tail_len += n;
}

/* Gives the agent more credit while the client keeps up (or none is attached). */
static void topup(struct session *ss)
{
    if (!ss->req_id || ss->waiting_drain)
        return;
    if (ss->cops && ss->cops->backlog(ss->carg) >= SESSION_CLIENT_MAX) {
        ss->waiting_drain = 1;
        ss->cops->want_drain(ss->carg);
        return;
    }
    agentconn_credit(ss->conn, ss->req_id, SESSION_WINDOW);
}

void session_client_drained(struct session *ss)
{
    ss->waiting_drain = 0;
    topup(ss);
}

static void grace_start(struct session *ss)
{
    struct timeval tv = {ss->d->cfg.session_grace_s, 0};
    evtimer_add(ss->grace, &tv);
}

/* Forgets the oldest ended sessions beyond SESSION_KEEP_ENDED. */
static void trim(struct sandbox *sb)
{
    unsigned ended = 0;
    for (struct session **pp = &sb->sessions; *pp;) {
        struct session *ss = *pp;
        if (ss->state != SES_RUNNING && ++ended > SESSION_KEEP_ENDED && !ss->cops) {
            *pp = ss->next;
            event_free(ss->grace);
            json_decref(ss->argv);
            free(ss->tail);
            free(ss);
            continue;
        }
        pp = &ss->next;
    }
}

/* The session is over: its client hears how, its resources go. */
static void end(struct session *ss, enum ses_state st, int code, int sig, const char *error)
{
    ss->req_id = 0;
    ss->state = st;
    ss->exit_code = code;
    ss->signal = sig;
    if (error)
        snprintf(ss->error, sizeof(ss->error), "%s", error[0] ? error : "failed");
    ss->ended_ms = now_ms_wall();
    evtimer_del(ss->grace);
    daemon_release_output(ss->d, ss->reserved);
    ss->reserved = 0;
    log_info(ss->sb->id, "session.end", "id=%s state=%s code=%d signal=%d", ss->id, state_name(st),
             code, sig);
    if (ss->cops) {
        const struct session_client_ops *ops = ss->cops;
        ss->cops = NULL;
        ops->detached(ss->carg, exit_msg(ss));
    }
    trim(ss->sb);
}

static void on_frame(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct session *ss = arg;
    if (!h) {
        end(ss, SES_FAILED, -1, 0, (const char *)payload);
        return;
    }
    switch (h->type) {
    case PROTO_STDOUT:
    case PROTO_STDERR:
        if (ss->cops)
            ss->cops->output(ss->carg, payload, h->len);
        else
            tail_add(ss, payload, h->len);
        topup(ss);
        return;
    case PROTO_EXIT: {
        int code, sig;
        agentconn_exit_status(payload, h->len, &code, &sig);
        end(ss, SES_EXITED, code, sig, NULL);
        return;
    }
    case PROTO_ERROR: {
        char msg[256] = "the session's command could not be started";
        struct proto_field f;
        if (proto_find(payload, h->len, PT_MESSAGE, &f) == 1 &&
            (proto_field_str(&f, msg, sizeof(msg)) < 0 ||
             !utf8_valid((const unsigned char *)msg, strlen(msg))))
            snprintf(msg, sizeof(msg), "the session's command could not be started");
        end(ss, SES_FAILED, -1, 0, msg);
        return;
    }
    default:
        if (agentconn_frame_ends(h->type))
            end(ss, SES_FAILED, -1, 0, "the sandbox's agent ended the session unexpectedly");
        return;
    }
}

/* Kills a running session now: its tree is killed by the agent (CANCEL), its end is ours. */
static void kill_now(struct session *ss, const char *why)
{
    if (ss->state != SES_RUNNING)
        return;
    if (ss->req_id)
        agentconn_abort(ss->conn, ss->req_id);
    log_info(ss->sb->id, "session.kill", "id=%s why=\"%s\"", ss->id, why);
    end(ss, SES_EXITED, -1, SIGKILL, NULL);
}

static void on_grace(evutil_socket_t fd, short what, void *arg)
{
    struct session *ss = arg;
    if (ss->cops || ss->state != SES_RUNNING)
        return;
    log_info(ss->sb->id, "session.grace_over", "id=%s", ss->id);
    kill_now(ss, "no client connected within the grace period");
}

static unsigned running_count(const struct sandbox *sb)
{
    unsigned n = 0;
    for (const struct session *ss = sb->sessions; ss; ss = ss->next)
        n += ss->state == SES_RUNNING;
    return n;
}

void svc_session_create(struct daemon *d, const char *id, const struct session_request *r,
                        struct sink *s)
{
    struct wr_err err = {0};
    struct sandbox *sb = sandbox_lookup(d, id, s->who, &err);
    if (!sb || sandbox_check_running(sb, &err) < 0 || meter_check_exec(sb, &err) < 0) {
        sink_fail(s, &err);
        return;
    }
    if (running_count(sb) >= SESSION_MAX_PER_SANDBOX) {
        sink_failf(s, WR_E_CONFLICT, 0,
                   "sandbox %s has %d sessions running, the most it may have; end one first "
                   "(DELETE /v1/sandboxes/%s/sessions/{sid})",
                   sb->id, SESSION_MAX_PER_SANDBOX, sb->id);
        return;
    }
    json_t *env = json_object();
    if (r->tty)
        json_object_set_new(env, "TERM", json_string("xterm-256color"));
    if (r->env)
        json_object_update(env, r->env);
    struct exec_request er = {.command = r->command, .argv = r->argv, .cwd = r->cwd, .env = env};
    if (!r->command && !r->argv)
        er.command = LOGIN_SHELL;
    struct proto_buf b = {0};
    int rc = exec_build(sb, &er, &b, &err);
    json_decref(env);
    size_t reserve = SESSION_WINDOW + SESSION_TAIL;
    if (rc < 0 || daemon_reserve_output(d, reserve, "session", &err) < 0) {
        proto_buf_free(&b);
        sink_fail(s, &err);
        return;
    }
    proto_put_u32(&b, PT_TTY, r->tty ? 1 : 0);
    proto_put_u32(&b, PT_ROWS, (uint32_t)r->rows);
    proto_put_u32(&b, PT_COLS, (uint32_t)r->cols);

    struct session *ss = xcalloc(1, sizeof(*ss));
    ss->d = d;
    ss->sb = sb;
    snprintf(ss->id, sizeof(ss->id), "ses-%u", ++sb->session_seq);
    ss->argv = r->argv      ? json_incref(r->argv)
               : r->command ? json_pack("[s, s, s]", "/bin/sh", "-c", r->command)
                            : json_pack("[s, s, s]", "/bin/sh", "-c", LOGIN_SHELL);
    ss->tty = r->tty;
    ss->rows = r->rows;
    ss->cols = r->cols;
    ss->created_ms = now_ms_wall();
    ss->reserved = reserve;
    ss->grace = evtimer_new(d->base, on_grace, ss);
    ss->conn = sb->conn;
    ss->req_id =
        agentconn_request_windowed(ss->conn, PROTO_SESSION, &b, SESSION_WINDOW, on_frame, ss);
    proto_buf_free(&b);
    if (!ss->req_id) {
        daemon_release_output(d, reserve);
        event_free(ss->grace);
        json_decref(ss->argv);
        free(ss);
        sink_failf(s, WR_E_CONFLICT, 0, "the sandbox's agent is not reachable");
        return;
    }
    ss->next = sb->sessions;
    sb->sessions = ss;
    grace_start(ss); /* until a client connects */
    log_info(sb->id, "session.start", "id=%s tty=%d rows=%d cols=%d", ss->id, ss->tty, ss->rows,
             ss->cols);
    sink_reply(s, SINK_CREATED, session_to_json(ss));
}

static struct session *find(struct sandbox *sb, const char *sid)
{
    for (struct session *ss = sb->sessions; ss; ss = ss->next)
        if (strcmp(ss->id, sid) == 0)
            return ss;
    return NULL;
}

struct session *session_lookup(struct daemon *d, const char *id, const char *sid,
                               const struct principal *who, struct wr_err *err)
{
    struct sandbox *sb = sandbox_lookup(d, id, who, err);
    if (!sb)
        return NULL;
    struct session *ss = find(sb, sid);
    if (!ss)
        wr_err_kind(err, WR_E_NOT_FOUND, 0, "sandbox %s has no session %.40s", sb->id, sid);
    return ss;
}

void svc_session_list(struct daemon *d, const char *id, struct sink *s)
{
    struct wr_err err = {0};
    struct sandbox *sb = sandbox_lookup(d, id, s->who, &err);
    if (!sb) {
        sink_fail(s, &err);
        return;
    }
    json_t *a = json_array();
    for (struct session *ss = sb->sessions; ss; ss = ss->next)
        json_array_insert_new(a, 0, session_to_json(ss)); /* oldest first */
    sink_reply(s, SINK_OK, json_pack("{s:o}", "sessions", a));
}

void svc_session_get(struct daemon *d, const char *id, const char *sid, struct sink *s)
{
    struct wr_err err = {0};
    struct session *ss = session_lookup(d, id, sid, s->who, &err);
    if (!ss)
        sink_fail(s, &err);
    else
        sink_reply(s, SINK_OK, session_to_json(ss));
}

static void session_free(struct session *ss)
{
    if (ss->cops) {
        const struct session_client_ops *ops = ss->cops;
        ss->cops = NULL;
        ops->detached(ss->carg, exit_msg(ss));
    }
    daemon_release_output(ss->d, ss->reserved);
    event_free(ss->grace);
    json_decref(ss->argv);
    free(ss->tail);
    free(ss);
}

void svc_session_delete(struct daemon *d, const char *id, const char *sid, struct sink *s)
{
    struct wr_err err = {0};
    struct session *ss = session_lookup(d, id, sid, s->who, &err);
    if (!ss) {
        sink_fail(s, &err);
        return;
    }
    for (struct session **pp = &ss->sb->sessions; *pp; pp = &(*pp)->next) {
        if (*pp == ss) {
            *pp = ss->next;
            break;
        }
    }
    kill_now(ss, "deleted"); /* unlinked first: its end trims the others, never it */
    session_free(ss);
    sink_reply(s, SINK_OK, json_pack("{s:s, s:b}", "id", sid, "deleted", 1));
}

void session_attach(struct session *ss, const struct session_client_ops *ops, void *arg)
{
    if (ss->cops) {
        const struct session_client_ops *old = ss->cops;
        ss->cops = NULL;
        old->detached(ss->carg, NULL);
    }
    ss->waiting_drain = 0;
    ss->input_paused = 0;
    evtimer_del(ss->grace);
    if (ss->tail_len) {
        ops->output(arg, ss->tail, ss->tail_len);
        ss->tail_len = 0;
    }
    if (ss->state != SES_RUNNING) {
        ops->detached(arg, exit_msg(ss));
        return;
    }
    ss->cops = ops;
    ss->carg = arg;
    log_info(ss->sb->id, "session.attach", "id=%s", ss->id);
    topup(ss);
}

void session_detach(struct session *ss)
{
    if (!ss->cops)
        return;
    ss->cops = NULL;
    ss->carg = NULL;
    ss->waiting_drain = 0;
    if (ss->state == SES_RUNNING) {
        log_info(ss->sb->id, "session.detach", "id=%s grace=%d", ss->id,
                 ss->d->cfg.session_grace_s);
        grace_start(ss);
        topup(ss); /* output goes to the tail meanwhile: the command runs on */
    }
}

static void input_resume(void *arg)
{
    struct session *ss = arg;
    if (ss->input_paused && ss->cops) {
        ss->input_paused = 0;
        ss->cops->pause(ss->carg, 0);
    }
}

void session_input(struct session *ss, const void *data, size_t len)
{
    if (ss->state != SES_RUNNING || !ss->req_id)
        return;
    const uint8_t *p = data;
    while (len > 0) {
        size_t n = len < PROTO_CHUNK ? len : PROTO_CHUNK;
        if (agentconn_send(ss->conn, ss->req_id, PROTO_STDIN, 0, p, n) < 0)
            return;
        p += n;
        len -= n;
    }
    if (agentconn_backlog(ss->conn) > SESSION_INPUT_MAX && ss->cops && !ss->input_paused) {
        ss->input_paused = 1;
        ss->cops->pause(ss->carg, 1);
        agentconn_on_writable(ss->conn, ss->req_id, input_resume, ss);
    }
}

void session_resize(struct session *ss, int rows, int cols)
{
    if (ss->state != SES_RUNNING || !ss->req_id || !ss->tty)
        return;
    ss->rows = rows;
    ss->cols = cols;
    struct proto_buf b = {0};
    proto_put_u32(&b, PT_ROWS, (uint32_t)rows);
    proto_put_u32(&b, PT_COLS, (uint32_t)cols);
    agentconn_send(ss->conn, ss->req_id, PROTO_RESIZE, 0, b.data, b.len);
    proto_buf_free(&b);
}

void session_signal(struct session *ss, int signum)
{
    if (ss->state != SES_RUNNING || !ss->req_id)
        return;
    struct proto_buf b = {0};
    proto_put_u32(&b, PT_SIGNUM, (uint32_t)signum);
    agentconn_send(ss->conn, ss->req_id, PROTO_SIGNAL, 0, b.data, b.len);
    proto_buf_free(&b);
}

void session_eof(struct session *ss)
{
    if (ss->state != SES_RUNNING || !ss->req_id)
        return;
    agentconn_send(ss->conn, ss->req_id, PROTO_STDIN, PROTO_F_FIN, NULL, 0);
}

void session_free_all(struct sandbox *sb)
{
    struct session *ss;
    while ((ss = sb->sessions)) {
        sb->sessions = ss->next;
        session_free(ss);
    }
}
