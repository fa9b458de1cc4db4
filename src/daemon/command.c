/* Background commands; see command.h. */
#include "daemon/command.h"

#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/daemon.h"
#include "daemon/sandbox.h"
#include "daemon/service.h"

struct command_waiter {
    struct command *c;
    struct sink *sink;
    struct event *timer;
    struct command_waiter *next;
};

static struct command **head(struct sandbox *sb)
{
    return &sb->commands;
}

static void waiter_answer(struct command_waiter *w)
{
    struct command_waiter **p = &w->c->waiters;
    while (*p && *p != w)
        p = &(*p)->next;
    if (*p)
        *p = w->next;
    event_free(w->timer);
    sink_reply(w->sink, SINK_OK, command_to_json(w->c));
    free(w);
}

static void trim_finished_output(struct sandbox *sb);

static void finish(struct command *c)
{
    c->req_id = 0;
    /* Finished output is bounded per sandbox (trim_finished_output), not by the budget. */
    daemon_release_output(c->sb->d, c->reserved);
    c->reserved = 0;
    c->ended_ms = now_ms_wall();
    if (c->timer)
        event_del(c->timer);
    while (c->waiters)
        waiter_answer(c->waiters);
    log_info(c->sb->id, "command.end", "command=%s state=%s code=%d signal=%d", c->id,
             c->state == CMD_EXITED ? "exited" : "failed", c->exit_code, c->signal);
    trim_finished_output(c->sb);
}

/* Adds output to a stream's tail: the ring grows up to cap, then the oldest bytes go. */
static void out_append(struct command_out *o, size_t cap, const uint8_t *p, size_t n)
{
    o->total += n;
    if (n >= cap) { /* only the last cap bytes can stay */
        o->truncated |= o->total > cap;
        p += n - cap;
        n = cap;
        if (o->size < cap) {
            free(o->data);
            o->data = xmalloc(cap);
            o->size = cap;
        }
        memcpy(o->data, p, n);
        o->len = n;
        o->head = 0;
        return;
    }
    if (o->len + n > o->size && o->size < cap) { /* grow, linearising what is kept */
        size_t size = o->size ? o->size : 4096;
        while (size < o->len + n && size < cap)
            size *= 2;
        if (size > cap)
            size = cap;
        unsigned char *d = xmalloc(size);
        for (size_t i = 0; i < o->len; i++)
            d[i] = o->data[(o->head + i) % o->size];
        free(o->data);
        o->data = d;
        o->size = size;
        o->head = 0;
    }
    while (n) {
        size_t k;
        if (o->len < o->size) { /* room after the newest byte */
            size_t tail = (o->head + o->len) % o->size;
            size_t room = o->size - o->len < o->size - tail ? o->size - o->len : o->size - tail;
            k = n < room ? n : room;
            memcpy(o->data + tail, p, k);
            o->len += k;
        } else { /* full: overwrite the oldest */
            k = n < o->size - o->head ? n : o->size - o->head;
            memcpy(o->data + o->head, p, k);
            o->head = (o->head + k) % o->size;
            o->truncated = 1;
        }
        p += k;
        n -= k;
    }
}

/* Copies the kept bytes from absolute offset `from` (at least the oldest kept) into a new
 * buffer; *start is where they begin, *n how many. */
static unsigned char *out_copy(const struct command_out *o, uint64_t from, uint64_t *start,
                               size_t *n)
{
    uint64_t first = o->total - o->len;
    if (from < first)
        from = first;
    if (from > o->total)
        from = o->total;
    *start = from;
    *n = (size_t)(o->total - from);
    unsigned char *buf = xmalloc(*n ? *n : 1);
    if (*n) {
        size_t at = (o->head + (size_t)(from - first)) % o->size;
        size_t k = *n < o->size - at ? *n : o->size - at;
        memcpy(buf, o->data + at, k);
        memcpy(buf + k, o->data, *n - k);
    }
    return buf;
}

/* Forgets the output of the oldest finished commands while they keep more than the budget. */
static void trim_finished_output(struct sandbox *sb)
{
    size_t kept = 0;
    for (struct command *c = *head(sb); c; c = c->next)
        if (c->state != CMD_RUNNING)
            kept += c->out[0].size + c->out[1].size;
    while (kept > COMMAND_FINISHED_OUTPUT_MAX) {
        struct command *oldest = NULL;
        for (struct command *c = *head(sb); c; c = c->next)
            if (c->state != CMD_RUNNING && (c->out[0].size || c->out[1].size))
                oldest = c; /* newest first: the last match is the oldest */
        if (!oldest)
            return;
        for (int i = 0; i < 2; i++) {
            struct command_out *o = &oldest->out[i];
            kept -= o->size;
            free(o->data);
            o->data = NULL;
            o->truncated |= o->len > 0;
            o->size = o->len = o->head = 0;
        }
    }
}

static void on_frame(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct command *c = arg;
    if (!h) {
        c->state = CMD_FAILED;
        snprintf(c->error, sizeof(c->error), "the sandbox stopped: %s", (const char *)payload);
        finish(c);
        return;
    }
    switch (h->type) {
    case PROTO_STDOUT:
    case PROTO_STDERR:
        out_append(&c->out[h->type == PROTO_STDERR], c->cap, payload, h->len);
        return;
    case PROTO_EXIT:
        c->state = CMD_EXITED;
        agentconn_exit_status(payload, h->len, &c->exit_code, &c->signal);
        finish(c);
        return;
    case PROTO_ERROR: {
        struct proto_field f;
        c->state = CMD_FAILED;
        if (proto_find(payload, h->len, PT_MESSAGE, &f) != 1 ||
            proto_field_str(&f, c->error, sizeof(c->error)) < 0)
            snprintf(c->error, sizeof(c->error), "the command could not be started");
        finish(c);
        return;
    }
    default:
        if (agentconn_frame_ends(h->type)) {
            c->state = CMD_FAILED;
            snprintf(c->error, sizeof(c->error), "the sandbox's agent answered the command with %s",
                     proto_type_name(h->type));
            finish(c);
        }
        return;
    }
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct command *c = arg;
    if (c->req_id) {
        c->timed_out = 1;
        command_signal(c, SIGKILL);
    }
}

/* Frees one command (no waiters left, no agent request open). */
static void command_free(struct command *c)
{
    json_decref(c->argv);
    free(c->out[0].data);
    free(c->out[1].data);
    if (c->timer)
        event_free(c->timer);
    free(c);
}

/* Forgets the oldest finished commands beyond the cap. */
static void prune(struct sandbox *sb)
{
    int n = 0;
    for (struct command *c = *head(sb); c; c = c->next)
        n++;
    while (n > COMMAND_MAX_PER_SANDBOX) {
        struct command **p = head(sb), **victim = NULL;
        for (; *p; p = &(*p)->next)
            if ((*p)->state != CMD_RUNNING && !(*p)->waiters)
                victim = p; /* the list is newest first: the last match is the oldest */
        if (!victim)
            return;
        struct command *c = *victim;
        *victim = c->next;
        command_free(c);
        n--;
    }
}

struct command *command_start(struct sandbox *sb, const struct proto_buf *exec, json_t *argv,
                              const unsigned char *stdin_data, size_t stdin_len, double timeout_s,
                              size_t cap, struct wr_err *err)
{
    int running = 0;
    for (struct command *c = *head(sb); c; c = c->next)
        running += c->state == CMD_RUNNING;
    if (running >= COMMAND_MAX_PER_SANDBOX) {
        wr_err_kind(err, WR_E_CONFLICT, 0, "sandbox %s already has %d background commands running",
                    sb->id, running);
        return NULL;
    }
    struct command *c = xcalloc(1, sizeof(*c));
    c->sb = sb;
    snprintf(c->id, sizeof(c->id), "cmd-%u", ++sb->command_seq);
    c->argv = json_incref(argv);
    c->cap = cap < COMMAND_TAIL_MAX ? cap : COMMAND_TAIL_MAX;
    if (daemon_reserve_output(sb->d, 2 * c->cap, "background command", err) < 0) {
        json_decref(c->argv);
        free(c);
        return NULL;
    }
    c->reserved = 2 * c->cap;
    c->started_ms = now_ms_wall();
    c->req_id = agentconn_request(sb->conn, PROTO_EXEC, exec->data, exec->len, on_frame, c);
    if (!c->req_id) {
        daemon_release_output(sb->d, c->reserved);
        json_decref(c->argv);
        free(c);
        wr_err_kind(err, WR_E_CONFLICT, 0, "the sandbox's agent is not reachable");
        return NULL;
    }
    if (stdin_data && agentconn_send_stdin(sb->conn, c->req_id, stdin_data, stdin_len) < 0)
        log_warn(sb->id, "command.stdin_unsent", "command=%s", c->id);
    if (timeout_s > 0) {
        c->timer = evtimer_new(sb->d->base, on_timeout, c);
        struct timeval tv = {(time_t)timeout_s,
                             (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
        evtimer_add(c->timer, &tv);
    }
    c->next = *head(sb);
    *head(sb) = c;
    prune(sb);
    log_info(sb->id, "command.start", "command=%s", c->id);
    return c;
}

struct command *command_find(struct sandbox *sb, const char *id)
{
    for (struct command *c = *head(sb); c; c = c->next)
        if (strcmp(c->id, id) == 0)
            return c;
    return NULL;
}

json_t *command_to_json(const struct command *c)
{
    char started[32], ended[32];
    format_rfc3339(c->started_ms / 1000, started, sizeof(started));
    format_rfc3339(c->ended_ms / 1000, ended, sizeof(ended));
    const char *st = c->state == CMD_RUNNING  ? "running"
                     : c->state == CMD_EXITED ? "exited"
                                              : "failed";
    json_t *o = json_pack(
        "{s:s, s:s, s:O, s:s, s:o, s:o, s:b, s:s, s:o, s:I, s:I, s:b, s:b}", "id", c->id,
        "sandbox_id", c->sb->id, "argv", c->argv, "state", st, "exit_code",
        c->state == CMD_EXITED ? json_integer(c->exit_code) : json_null(), "signal",
        c->signal ? json_integer(c->signal) : json_null(), "timed_out", c->timed_out, "started_at",
        started, "ended_at", c->state == CMD_RUNNING ? json_null() : json_string(ended),
        "stdout_bytes", (json_int_t)c->out[0].total, "stderr_bytes", (json_int_t)c->out[1].total,
        "stdout_truncated", c->out[0].truncated, "stderr_truncated", c->out[1].truncated);
    if (c->state == CMD_FAILED) {
        json_t *e = json_string(c->error);
        json_object_set_new(o, "error", e ? e : json_string("(message not valid UTF-8)"));
    }
    return o;
}

int command_signal(struct command *c, int signum)
{
    if (c->state != CMD_RUNNING || !c->req_id || !agentconn_alive(c->sb->conn))
        return -1;
    struct proto_buf b = {0};
    proto_put_u32(&b, PT_SIGNUM, (uint32_t)signum);
    int rc = agentconn_send(c->sb->conn, c->req_id, PROTO_SIGNAL, 0, b.data, b.len);
    proto_buf_free(&b);
    return rc;
}

static void on_wait_timeout(evutil_socket_t fd, short what, void *arg)
{
    waiter_answer(arg);
}

void command_wait(struct command *c, struct sink *s, double timeout_s)
{
    if (c->state != CMD_RUNNING) {
        sink_reply(s, SINK_OK, command_to_json(c));
        return;
    }
    struct command_waiter *w = xcalloc(1, sizeof(*w));
    w->c = c;
    w->sink = s;
    w->timer = evtimer_new(c->sb->d->base, on_wait_timeout, w);
    struct timeval tv = {(time_t)timeout_s,
                         (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    evtimer_add(w->timer, &tv);
    w->next = c->waiters;
    c->waiters = w;
}

void command_free_all(struct sandbox *sb)
{
    struct command *c = *head(sb);
    while (c) {
        struct command *next = c->next;
        while (c->waiters)
            waiter_answer(c->waiters);
        command_free(c);
        c = next;
    }
    *head(sb) = NULL;
}

/* ---- the service's command operations ---- */

/* Finds the command cid of sandbox id, or fails s and returns NULL. */
static struct command *lookup(struct daemon *d, const char *id, const char *cid, struct sink *s)
{
    struct wr_err err = {0};
    struct sandbox *sb = sandbox_lookup(d, id, s->who, &err);
    struct command *c = sb ? command_find(sb, cid) : NULL;
    if (sb && !c)
        wr_err_kind(&err, WR_E_NOT_FOUND, 0, "command %.64s not found in sandbox %s", cid, sb->id);
    if (!c)
        sink_fail(s, &err);
    return c;
}

void svc_command_list(struct daemon *d, const char *id, struct sink *s)
{
    struct wr_err err = {0};
    struct sandbox *sb = sandbox_lookup(d, id, s->who, &err);
    if (!sb) {
        sink_fail(s, &err);
        return;
    }
    json_t *arr = json_array();
    for (struct command *c = *head(sb); c; c = c->next)
        json_array_insert_new(arr, 0, command_to_json(c));
    sink_reply(s, SINK_OK, json_pack("{s:o}", "commands", arr));
}

void svc_command_get(struct daemon *d, const char *id, const char *cid, struct sink *s)
{
    struct command *c = lookup(d, id, cid, s);
    if (c)
        sink_reply(s, SINK_OK, command_to_json(c));
}

void svc_command_output(struct daemon *d, const char *id, const char *cid, uint64_t stdout_offset,
                        uint64_t stderr_offset, struct sink *s)
{
    struct command *c = lookup(d, id, cid, s);
    if (!c)
        return;
    json_t *o = command_to_json(c);
    static const char *const names[2] = {"stdout", "stderr"};
    uint64_t off[2] = {stdout_offset, stderr_offset};
    for (int i = 0; i < 2; i++) {
        uint64_t start;
        size_t n;
        unsigned char *p = out_copy(&c->out[i], off[i], &start, &n);
        const char *enc;
        char key[32];
        json_object_set_new(o, names[i], exec_encode_bytes(p, n, &enc));
        free(p);
        snprintf(key, sizeof(key), "%s_encoding", names[i]);
        json_object_set_new(o, key, json_string(enc));
        snprintf(key, sizeof(key), "%s_offset", names[i]);
        json_object_set_new(o, key, json_integer((json_int_t)start));
        snprintf(key, sizeof(key), "%s_next_offset", names[i]);
        json_object_set_new(o, key, json_integer((json_int_t)c->out[i].total));
    }
    sink_reply(s, SINK_OK, o);
}

void svc_command_wait(struct daemon *d, const char *id, const char *cid, double timeout_seconds,
                      struct sink *s)
{
    struct command *c = lookup(d, id, cid, s);
    if (c)
        command_wait(c, s, timeout_seconds);
}

void svc_command_signal(struct daemon *d, const char *id, const char *cid, int signum,
                        struct sink *s)
{
    struct command *c = lookup(d, id, cid, s);
    if (!c)
        return;
    if (command_signal(c, signum) < 0) {
        sink_failf(s, WR_E_CONFLICT, 0, "command %s is not running", c->id);
        return;
    }
    sink_reply(s, SINK_OK, command_to_json(c));
}
