/*
 * The service's answers as HTTP (daemon/sink.h implemented over http.h):
 * the one place that maps a kind of failure to a status and an error code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "common/util.h"
#include "daemon/keys.h"
#include "daemon/sink.h"

struct api_sink {
    struct sink base;
    struct principal who;
    struct http_req *req;
    int streaming; /* begun */
    int records;   /* a record stream (NDJSON) */
};

static const struct {
    int status;
    const char *code;
} kinds[] = {
    [WR_E_INTERNAL] = {500, "internal"},
    [WR_E_INVALID] = {400, "invalid_request"},
    [WR_E_NOT_FOUND] = {404, "not_found"},
    [WR_E_CONFLICT] = {409, "conflict"},
    [WR_E_TOO_LARGE] = {413, "payload_too_large"},
    [WR_E_UNAVAILABLE] = {503, "unavailable"},
    [WR_E_SANDBOX_FAILED] = {500, "sandbox_failed"},
    [WR_E_EXEC_FAILED] = {422, "exec_failed"},
    [WR_E_FILE] = {422, "file_error"},
    [WR_E_UNAUTHORIZED] = {401, "unauthorized"},
    [WR_E_FORBIDDEN] = {403, "forbidden"},
    [WR_E_COST_LIMIT] = {402, "cost_limit"},
    [WR_E_RATE_LIMITED] = {429, "rate_limited"},
    [WR_E_CAPACITY] = {503, "capacity"},
};

/* Retry-After on a capacity answer, in seconds: room comes back as sandboxes stop or are
 * deleted (~0.1-1.5 s each) and as starting ones are measured (the meter reads each running
 * sandbox every second), so a few seconds lets a burst drain without a storm of retries. */
#define CAPACITY_RETRY_AFTER "5"

static void kind_of(const struct wr_err *err, int *status, const char **code)
{
    unsigned k = (unsigned)err->kind;
    if (k >= WR_ARRAY_LEN(kinds) || !kinds[k].code)
        k = WR_E_INTERNAL;
    *status = kinds[k].status;
    *code = kinds[k].code;
}

/* File errors carry the errno the agent saw, so a client can tell EISDIR from EACCES. */
static json_t *extra_of(const struct wr_err *err)
{
    if (err->kind == WR_E_FILE || (err->kind == WR_E_NOT_FOUND && err->code))
        return json_pack("{s:i}", "errno", err->code);
    return NULL;
}

void api_reply_err(struct http_req *req, const struct wr_err *err)
{
    int status;
    const char *code;
    kind_of(err, &status, &code);
    json_t *extra = extra_of(err);
    if (err->kind == WR_E_CAPACITY)
        http_reply_header(req, "Retry-After", CAPACITY_RETRY_AFTER);
    if (extra)
        http_reply_error_extra(req, status, code, extra, "%s", err->msg);
    else
        http_reply_error(req, status, code, "%s", err->msg);
}

static void s_reply(struct sink *s, enum sink_status st, json_t *obj)
{
    struct api_sink *a = (struct api_sink *)s;
    const char *id = json_string_value(json_object_get(obj, "id"));
    if (st == SINK_CREATED && id && strncmp(id, "sb-", 3) == 0)
        api_req_note_sandbox(a->req, id); /* for the audit trail: which sandbox it made */
    http_reply_json(a->req, st == SINK_CREATED ? 201 : 200, obj);
    free(a);
}

static void write_record(struct api_sink *a, json_t *obj)
{
    char *line = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!line)
        return;
    size_t n = strlen(line);
    line[n] = '\n'; /* replaces the NUL: the line goes out in one chunk */
    http_stream_write(a->req, line, n + 1);
    free(line);
}

static void s_fail(struct sink *s, const struct wr_err *err)
{
    struct api_sink *a = (struct api_sink *)s;
    if (!a->streaming) {
        api_reply_err(a->req, err);
    } else {
        /* Too late for a status: a record stream ends with an error record, a byte stream
         * is cut off (the connection closes without the last chunk, so no client takes a
         * short body for the whole). */
        if (a->records) {
            int status;
            const char *code;
            kind_of(err, &status, &code);
            write_record(a, json_pack("{s:s, s:s, s:s}", "type", "error", "code", code, "message",
                                      err->msg));
            http_stream_end(a->req);
        } else {
            http_stream_abort(a->req);
        }
    }
    free(a);
}

static void s_begin(struct sink *s, const char *content_type)
{
    struct api_sink *a = (struct api_sink *)s;
    a->streaming = 1;
    a->records = content_type == NULL;
    http_stream_start(a->req, 200, content_type ? content_type : "application/x-ndjson");
}

static void s_begin_sized(struct sink *s, const char *content_type, uint64_t length)
{
    struct api_sink *a = (struct api_sink *)s;
    a->streaming = 1;
    http_stream_start_sized(a->req, 200, content_type, length);
}

static void s_write(struct sink *s, const void *data, size_t len)
{
    http_stream_write(((struct api_sink *)s)->req, data, len);
}

static void s_write_buffer(struct sink *s, struct evbuffer *buf)
{
    http_stream_write_buffer(((struct api_sink *)s)->req, buf);
}

static void s_record(struct sink *s, json_t *obj)
{
    write_record((struct api_sink *)s, obj);
}

static void s_end(struct sink *s)
{
    struct api_sink *a = (struct api_sink *)s;
    http_stream_end(a->req);
    free(a);
}

static void s_on_cancel(struct sink *s, void (*cb)(void *arg), void *arg)
{
    http_req_on_close(((struct api_sink *)s)->req, cb, arg);
}

static size_t s_backlog(struct sink *s)
{
    return http_stream_backlog(((struct api_sink *)s)->req);
}

static void s_on_drain(struct sink *s, void (*cb)(void *arg), void *arg)
{
    http_stream_on_drain(((struct api_sink *)s)->req, cb, arg);
}

static size_t s_input_len(struct sink *s)
{
    return http_req_body_len(((struct api_sink *)s)->req);
}

static size_t s_input_read(struct sink *s, void *buf, size_t n)
{
    return http_req_body_read(((struct api_sink *)s)->req, buf, n);
}

static size_t s_input_move(struct sink *s, struct evbuffer *dst, size_t n)
{
    return http_req_body_move(((struct api_sink *)s)->req, dst, n);
}

static const struct sink_ops api_sink_ops = {
    .reply = s_reply,
    .fail = s_fail,
    .begin = s_begin,
    .begin_sized = s_begin_sized,
    .write = s_write,
    .write_buffer = s_write_buffer,
    .record = s_record,
    .end = s_end,
    .on_cancel = s_on_cancel,
    .backlog = s_backlog,
    .on_drain = s_on_drain,
    .input_len = s_input_len,
    .input_read = s_input_read,
    .input_move = s_input_move,
};

struct sink *api_sink_new(struct http_req *req)
{
    struct api_sink *a = xcalloc(1, sizeof(*a));
    a->base.ops = &api_sink_ops;
    a->req = req;
    const struct principal *who = api_req_who(req);
    if (who) {
        a->who = *who;
        a->base.who = &a->who;
    } else { /* cannot happen: the door gave every request that reaches a handler one */
        a->who.read_only = 1;
        snprintf(a->who.owner_id, sizeof(a->who.owner_id), "(nobody)"); /* sees nothing */
        a->base.who = &a->who;
    }
    return &a->base;
}
