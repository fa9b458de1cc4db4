/*
 * /v1/sandboxes/{id}/files/...: file operations carried out by the agent
 * inside the sandbox, so every path resolves in the sandbox's own view and
 * never on the host. File content travels as raw HTTP bodies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/sandbox.h"

#define WRITE_CHUNK (256 * 1024)

enum fop_kind { FOP_READ, FOP_WRITE, FOP_LIST, FOP_STAT, FOP_MKDIR, FOP_REMOVE };

struct file_op {
    struct daemon *d;
    struct sandbox *sb;
    struct http_req *req;
    uint32_t id;
    enum fop_kind kind;
    int started; /* FOP_READ: the 200 and some bytes have gone out */
    uint64_t bytes;
    json_t *result;                 /* stat entry or entries array */
    char path[PROTO_MAX_PATH + 16]; /* as the user will see it: absolute */
};

static void fop_free(struct file_op *op)
{
    json_decref(op->result);
    sandbox_unref(op->sb);
    free(op);
}

static const char *type_name(uint32_t t)
{
    switch (t) {
    case PROTO_FT_FILE: return "file";
    case PROTO_FT_DIR: return "directory";
    case PROTO_FT_SYMLINK: return "symlink";
    default: return "other";
    }
}

/* Joins dir and name for display. */
static void join_path(char *out, size_t outlen, const char *dir, const char *name)
{
    size_t n = strlen(dir);
    snprintf(out, outlen, "%s%s%s", dir, n && dir[n - 1] == '/' ? "" : "/", name);
}

/*
 * Builds an entry object from the fields in payload[start, end). Returns NULL if the fields are
 * malformed or not UTF-8 where they must be.
 */
static json_t *entry_from_fields(const uint8_t *payload, size_t len, const char *dir,
                                 const char *fallback_path)
{
    struct proto_iter it;
    struct proto_field f;
    proto_iter_init(&it, payload, len);
    uint32_t type = PROTO_FT_OTHER, mode = 0;
    uint64_t size = 0, mtime = 0;
    char name[1024] = "", target[PROTO_MAX_PATH + 1] = "";
    int have_target = 0, rc;
    while ((rc = proto_iter_next(&it, &f)) == 1) {
        switch (f.tag) {
        case PT_TYPE:
            if (proto_field_u32(&f, &type) < 0)
                return NULL;
            break;
        case PT_MODE:
            if (proto_field_u32(&f, &mode) < 0)
                return NULL;
            break;
        case PT_SIZE:
            if (proto_field_u64(&f, &size) < 0)
                return NULL;
            break;
        case PT_MTIME:
            if (proto_field_u64(&f, &mtime) < 0)
                return NULL;
            break;
        case PT_NAME:
            if (proto_field_str(&f, name, sizeof(name)) < 0)
                return NULL;
            break;
        case PT_TARGET:
            if (proto_field_str(&f, target, sizeof(target)) < 0)
                return NULL;
            have_target = 1;
            break;
        default: break;
        }
    }
    if (rc < 0)
        return NULL;
    char mode_s[8], ts[32], path[PROTO_MAX_PATH + 1100];
    snprintf(mode_s, sizeof(mode_s), "%04o", mode & 07777);
    format_rfc3339(mtime > (uint64_t)INT64_MAX ? 0 : (int64_t)mtime, ts, sizeof(ts));
    if (name[0])
        join_path(path, sizeof(path), dir, name);
    else
        snprintf(path, sizeof(path), "%s", fallback_path);
    const char *base = strrchr(path, '/');
    base = base && base[1] ? base + 1 : path;
    json_t *e = json_pack("{s:s, s:s, s:s, s:I, s:s, s:s}", "name", name[0] ? name : base, "path",
                          path, "type", type_name(type), "size",
                          (json_int_t)(size > (uint64_t)INT64_MAX ? INT64_MAX : size), "mode",
                          mode_s, "mtime", ts);
    if (!e) /* a name that is not UTF-8 */
        return NULL;
    if (have_target) {
        json_t *t = json_string(target);
        if (t)
            json_object_set_new(e, "target", t);
    }
    return e;
}

static void reply_agent_error(struct file_op *op, const uint8_t *payload, size_t len)
{
    uint32_t err = EIO;
    char msg[600] = "";
    struct proto_field f;
    if (proto_find(payload, len, PT_ERRNO, &f) == 1)
        proto_field_u32(&f, &err);
    if (proto_find(payload, len, PT_MESSAGE, &f) == 1 && proto_field_str(&f, msg, sizeof(msg)) < 0)
        msg[0] = '\0';
    if (!msg[0] || !jv_utf8_valid((const unsigned char *)msg, strlen(msg)))
        snprintf(msg, sizeof(msg), "%s: %s", op->path, strerror((int)err));
    if (err == ENOENT)
        http_reply_error_extra(op->req, 404, "not_found", json_pack("{s:i}", "errno", (int)err),
                               "%s", msg);
    else
        http_reply_error_extra(op->req, 422, "file_error", json_pack("{s:i}", "errno", (int)err),
                               "%s", msg);
}

static void send_stat_request(struct file_op *op);

static int cmp_entry(const void *a, const void *b)
{
    const char *na = json_string_value(json_object_get(*(json_t *const *)a, "name"));
    const char *nb = json_string_value(json_object_get(*(json_t *const *)b, "name"));
    return strcmp(na ? na : "", nb ? nb : "");
}

/* Directory order is the filesystem's whim; answers are sorted by name (bytewise). */
static void sort_entries(json_t *arr)
{
    size_t n = json_array_size(arr);
    if (n < 2)
        return;
    json_t **v = xcalloc(n, sizeof(*v));
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(arr, i));
    qsort(v, n, sizeof(*v), cmp_entry);
    json_array_clear(arr);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, v[i]);
    free(v);
}

static void on_frame(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct file_op *op = arg;
    if (!h) {
        if (op->started)
            http_stream_end(op->req);
        else if (op->d->shutting_down)
            http_reply_error(op->req, 503, "unavailable", "the daemon is shutting down");
        else
            http_reply_error(op->req, 500, "sandbox_failed", "%s", (const char *)payload);
        fop_free(op);
        return;
    }
    switch (h->type) {
    case PROTO_STAT_RESULT:
        if (op->kind == FOP_READ && !op->started) {
            op->started = 1;
            http_stream_start(op->req, 200, "application/octet-stream");
        } else if (!op->result) {
            op->result = entry_from_fields(payload, h->len, "", op->path);
        }
        return;
    case PROTO_DATA:
        if (op->kind == FOP_READ && op->started) {
            op->bytes += h->len;
            http_stream_write(op->req, payload, h->len);
        }
        return;
    case PROTO_DIR_ENTRIES:
        if (op->kind == FOP_LIST) {
            /* Groups of fields, each starting with NAME. */
            struct proto_iter it;
            struct proto_field f;
            proto_iter_init(&it, payload, h->len);
            const uint8_t *group = NULL;
            int rc;
            while ((rc = proto_iter_next(&it, &f)) >= 0) {
                const uint8_t *here = rc == 1 ? f.data - 6 : payload + h->len;
                if (group && (rc == 0 || f.tag == PT_NAME)) {
                    json_t *e = entry_from_fields(group, (size_t)(here - group), op->path, "");
                    if (e)
                        json_array_append_new(op->result, e);
                    group = NULL;
                }
                if (rc == 0)
                    break;
                if (f.tag == PT_NAME)
                    group = here;
            }
        }
        return;
    case PROTO_OK: break;
    case PROTO_ERROR:
        if (op->started) { /* too late for a status: end the body short */
            log_warn(op->sb->id, "files.read_error", "path=\"%s\" after=%llu", op->path,
                     (unsigned long long)op->bytes);
            http_stream_end(op->req);
        } else {
            reply_agent_error(op, payload, h->len);
        }
        fop_free(op);
        return;
    default: return;
    }
    /* OK */
    switch (op->kind) {
    case FOP_READ:
        if (!op->started) { /* an empty answer without a stat: still a valid empty body */
            http_reply(op->req, 200, "application/octet-stream", NULL, 0);
        } else {
            http_stream_end(op->req);
        }
        break;
    case FOP_LIST:
        sort_entries(op->result);
        http_reply_json(op->req, 200,
                        json_pack("{s:s, s:O}", "path", op->path, "entries", op->result));
        break;
    case FOP_MKDIR:
        if (!op->result) {
            send_stat_request(op); /* answer with the new directory's entry */
            return;
        }
        /* fall through */
    case FOP_WRITE:
    case FOP_STAT:
        if (op->result)
            http_reply_json(op->req, 200, json_incref(op->result));
        else
            http_reply_error(op->req, 500, "sandbox_failed", "the agent sent a malformed stat");
        break;
    case FOP_REMOVE:
        http_reply_json(op->req, 200, json_pack("{s:s, s:b}", "path", op->path, "removed", 1));
        break;
    }
    fop_free(op);
}

/* Validates the path, makes the op. Answers and returns NULL on a bad request. */
static struct file_op *fop_new(struct daemon *d, struct http_req *req, struct route_match *m,
                               enum fop_kind kind, const char *path)
{
    if (!path) {
        http_reply_error(req, 400, "invalid_request", "path: required");
        return NULL;
    }
    size_t n = strlen(path);
    if (n == 0 || n > PROTO_MAX_PATH) {
        http_reply_error(req, 400, "invalid_request", "path: must be 1 to %d bytes",
                         PROTO_MAX_PATH);
        return NULL;
    }
    if (!jv_utf8_valid((const unsigned char *)path, n)) {
        http_reply_error(req, 400, "invalid_request", "path: must be UTF-8");
        return NULL;
    }
    struct sandbox *sb = api_sandbox_running(d, req, m->params[0]);
    if (!sb)
        return NULL;
    struct file_op *op = xcalloc(1, sizeof(*op));
    op->d = d;
    op->sb = sb;
    sandbox_ref(sb);
    op->req = req;
    op->kind = kind;
    if (path[0] == '/')
        snprintf(op->path, sizeof(op->path), "%s", path);
    else
        join_path(op->path, sizeof(op->path), "/workspace", path);
    return op;
}

static int fop_send(struct file_op *op, uint16_t type, struct proto_buf *b)
{
    op->id = agentconn_request(op->sb->conn, type, b->data, b->len, on_frame, op);
    proto_buf_free(b);
    if (!op->id) {
        http_reply_error(op->req, 409, "conflict", "the sandbox's agent is not reachable");
        fop_free(op);
        return -1;
    }
    return 0;
}

static void send_stat_request(struct file_op *op)
{
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    op->kind = FOP_STAT;
    fop_send(op, PROTO_FILE_STAT, &b);
}

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

void api_files_read(struct daemon *d, struct http_req *req, struct route_match *m)
{
    uint64_t offset, length;
    if (api_query_u64(req, "offset", 0, &offset) < 0 ||
        api_query_u64(req, "length", UINT64_MAX, &length) < 0)
        return;
    struct file_op *op = fop_new(d, req, m, FOP_READ, http_req_query(req, "path"));
    if (!op)
        return;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    proto_put_u64(&b, PT_OFFSET, offset);
    if (length != UINT64_MAX)
        proto_put_u64(&b, PT_LENGTH, length);
    fop_send(op, PROTO_FILE_READ, &b);
}

void api_files_write(struct daemon *d, struct http_req *req, struct route_match *m)
{
    unsigned mode = 0644;
    int parents;
    const char *ms = http_req_query(req, "mode");
    if (ms && jv_parse_mode(ms, &mode) < 0) {
        http_reply_error(req, 400, "invalid_request", "mode: must be an octal string like 0644");
        return;
    }
    if (parse_flag(http_req_query(req, "parents"), 1, &parents) < 0) {
        http_reply_error(req, 400, "invalid_request", "parents: must be true or false");
        return;
    }
    size_t total = http_req_body_len(req);
    if (total > d->cfg.max_upload) {
        http_reply_error(req, 413, "payload_too_large", "upload is %zu bytes; the limit is %zu",
                         total, d->cfg.max_upload);
        return;
    }
    struct file_op *op = fop_new(d, req, m, FOP_WRITE, http_req_query(req, "path"));
    if (!op)
        return;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    proto_put_u32(&b, PT_MODE, mode);
    proto_put_u32(&b, PT_WFLAGS, parents ? PROTO_W_PARENTS : 0);
    struct agentconn *conn = op->sb->conn;
    if (fop_send(op, PROTO_FILE_WRITE, &b) < 0)
        return;
    uint32_t id = op->id;
    unsigned char *chunk = xmalloc(WRITE_CHUNK);
    size_t n;
    while ((n = http_req_body_read(req, chunk, WRITE_CHUNK)) > 0)
        agentconn_send(conn, id, PROTO_DATA, 0, chunk, n);
    agentconn_send(conn, id, PROTO_DATA, PROTO_F_FIN, NULL, 0);
    free(chunk);
    log_info(op->sb->id, "files.write", "path=\"%s\" bytes=%zu", op->path, total);
}

void api_files_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    const char *p = http_req_query(req, "path");
    struct file_op *op = fop_new(d, req, m, FOP_LIST, p ? p : "/workspace");
    if (!op)
        return;
    op->result = json_array();
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    fop_send(op, PROTO_FILE_LIST, &b);
}

void api_files_stat(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct file_op *op = fop_new(d, req, m, FOP_STAT, http_req_query(req, "path"));
    if (op)
        send_stat_request(op);
}

static const char *const mkdir_fields[] = {"path", "parents", "mode", NULL};

void api_files_mkdir(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 0);
    if (!o)
        return;
    char msg[JV_MSG];
    const char *path = NULL, *ms = NULL;
    int parents;
    unsigned mode = 0755;
    if (jv_only(o, mkdir_fields, msg) < 0 || jv_string(o, "path", PROTO_MAX_PATH, &path, msg) < 0 ||
        jv_bool(o, "parents", 1, &parents, msg) < 0 || jv_string(o, "mode", 8, &ms, msg) < 0) {
        json_decref(o);
        http_reply_error(req, 400, "invalid_request", "%s", msg);
        return;
    }
    if (ms && jv_parse_mode(ms, &mode) < 0) {
        json_decref(o);
        http_reply_error(req, 400, "invalid_request", "mode: must be an octal string like 0755");
        return;
    }
    struct file_op *op = fop_new(d, req, m, FOP_MKDIR, path);
    json_decref(o);
    if (!op)
        return;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    proto_put_u32(&b, PT_MODE, mode);
    proto_put_u32(&b, PT_WFLAGS, parents ? PROTO_W_PARENTS : 0);
    fop_send(op, PROTO_FILE_MKDIR, &b);
}

void api_files_remove(struct daemon *d, struct http_req *req, struct route_match *m)
{
    int recursive;
    if (parse_flag(http_req_query(req, "recursive"), 0, &recursive) < 0) {
        http_reply_error(req, 400, "invalid_request", "recursive: must be true or false");
        return;
    }
    struct file_op *op = fop_new(d, req, m, FOP_REMOVE, http_req_query(req, "path"));
    if (!op)
        return;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    proto_put_u32(&b, PT_WFLAGS, recursive ? PROTO_W_RECURSIVE : 0);
    fop_send(op, PROTO_FILE_REMOVE, &b);
}
