/*
 * File operations carried out by the agent inside the sandbox, so every path
 * resolves in the sandbox's own view and never on the host. The agent's
 * answers are untrusted: entries that are malformed or not UTF-8 are dropped,
 * and a byte stream that the agent ends early is cut short, never padded.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/utf8.h"
#include "common/util.h"
#include "daemon/agentconn.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "daemon/sandbox.h"
#include "daemon/service.h"

#define WRITE_CHUNK (256 * 1024)

/*
 * A read's flow control: the bytes the agent may still send (its credit) and the bytes queued
 * for the caller together stay within READ_INFLIGHT, however big the file. A caller that keeps
 * up leaves the queue empty, so the agent gets the whole of it as credit: a window big enough
 * to ride out the sandbox's wake-up latency (a split into two fixed halves left the agent half
 * of it and idled the channel on a busy host). A slow caller leaves the agent less and less,
 * down to nothing until the queue has drained.
 */
#define READ_INFLIGHT (4 * 1024 * 1024)

/*
 * A listing is built in memory (sorted, one JSON body): at most this many entries. A directory
 * with more answers the first ones the agent sent, with "truncated": true; the rest of what the
 * agent sends is dropped unread. 100,000 entries make a body of ~15 MB.
 */
#define LIST_MAX_ENTRIES 100000

enum fop_kind {
    FOP_READ,
    FOP_WRITE,
    FOP_LIST,
    FOP_STAT,
    FOP_MKDIR,
    FOP_REMOVE,
    FOP_ARCHIVE,
    FOP_EXTRACT
};

struct file_op {
    struct daemon *d;
    struct sandbox *sb; /* referenced */
    struct sink *sink;
    uint32_t id;
    enum fop_kind kind;
    int started;       /* FOP_READ: the stream has begun */
    int sized;         /* FOP_READ: the caller was promised exactly length bytes */
    int waiting_drain; /* FOP_READ: credit waits for the caller to catch up */
    uint64_t bytes;
    uint64_t sent, total;           /* FOP_WRITE: upload bytes handed to the agent, and in all */
    size_t reserved;                /* FOP_READ: of the daemon's output budget */
    uint64_t offset;                /* FOP_READ: where the caller asked to start */
    uint64_t length;                /* FOP_READ: at most this many bytes go to the caller */
    int truncated;                  /* FOP_LIST: the agent had more than LIST_MAX_ENTRIES */
    json_t *result;                 /* stat entry or entries array */
    char path[PROTO_MAX_PATH + 16]; /* as the user will see it: absolute */
};

static void fop_free(struct file_op *op)
{
    daemon_release_output(op->d, op->reserved);
    json_decref(op->result);
    sandbox_unref(op->sb);
    free(op);
}

static void fop_fail(struct file_op *op, enum wr_kind kind, int code, const char *msg)
{
    sink_failf(op->sink, kind, code, "%s", msg);
    fop_free(op);
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

static void fail_from_agent(struct file_op *op, const uint8_t *payload, size_t len)
{
    uint32_t err = EIO;
    char msg[600] = "";
    struct proto_field f;
    if (proto_find(payload, len, PT_ERRNO, &f) == 1)
        proto_field_u32(&f, &err);
    if (proto_find(payload, len, PT_MESSAGE, &f) == 1 && proto_field_str(&f, msg, sizeof(msg)) < 0)
        msg[0] = '\0';
    if (!msg[0] || !utf8_valid((const unsigned char *)msg, strlen(msg)))
        snprintf(msg, sizeof(msg), "%s: %s", op->path, strerror((int)err));
    if (err > 4095)
        err = EIO;
    fop_fail(op, err == ENOENT ? WR_E_NOT_FOUND : WR_E_FILE, (int)err, msg);
}

static void send_stat_request(struct file_op *op);

/* DIR_ENTRIES: groups of fields, each starting with NAME. */
static void add_entries(struct file_op *op, const uint8_t *payload, size_t len)
{
    struct proto_iter it;
    struct proto_field f;
    proto_iter_init(&it, payload, len);
    const uint8_t *group = NULL;
    int rc;
    while ((rc = proto_iter_next(&it, &f)) >= 0) {
        const uint8_t *here = rc == 1 ? f.data - 6 : payload + len;
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

/* OK from the agent: the operation is done. */
static void on_ok(struct file_op *op)
{
    switch (op->kind) {
    case FOP_READ:
        if (!op->started) { /* an empty answer without a stat: still a valid empty body */
            sink_begin(op->sink, "application/octet-stream");
        } else if (op->sized && op->bytes < op->length) {
            /* fewer bytes than the stat promised (the file shrank, or the agent lies) */
            log_warn(op->sb->id, "files.read_short", "path=\"%s\" bytes=%llu promised=%llu",
                     op->path, (unsigned long long)op->bytes, (unsigned long long)op->length);
            fop_fail(op, WR_E_FILE, EIO, "the file ended before the size it had when opened");
            return;
        }
        sink_end(op->sink);
        break;
    case FOP_LIST: {
        while (json_array_size(op->result) > LIST_MAX_ENTRIES)
            json_array_remove(op->result, json_array_size(op->result) - 1);
        sort_entries(op->result);
        json_t *o = json_pack("{s:s, s:O}", "path", op->path, "entries", op->result);
        if (op->truncated)
            json_object_set_new(o, "truncated", json_true());
        sink_reply(op->sink, SINK_OK, o);
        break;
    }
    case FOP_MKDIR:
        if (!op->result) {
            send_stat_request(op); /* answer with the new directory's entry */
            return;
        }
        /* fall through */
    case FOP_WRITE:
    case FOP_STAT:
        if (!op->result) {
            fop_fail(op, WR_E_SANDBOX_FAILED, 0, "the agent sent a malformed stat");
            return;
        }
        sink_reply(op->sink, SINK_OK, json_incref(op->result));
        break;
    case FOP_REMOVE:
        sink_reply(op->sink, SINK_OK, json_pack("{s:s, s:b}", "path", op->path, "removed", 1));
        break;
    case FOP_ARCHIVE:
        if (!op->started)
            sink_begin(op->sink, "application/x-tar");
        sink_end(op->sink);
        break;
    case FOP_EXTRACT:
        if (!op->result) {
            fop_fail(op, WR_E_SANDBOX_FAILED, 0,
                     "the agent ended an extraction without its counts");
            return;
        }
        sink_reply(op->sink, SINK_OK, json_incref(op->result));
        break;
    }
    fop_free(op);
}

static void read_topup(struct file_op *op);

/* The caller took what was queued: the agent may send more. */
static void read_drained(void *arg)
{
    struct file_op *op = arg;
    op->waiting_drain = 0;
    read_topup(op);
}

/* Gives the agent more credit while the caller keeps up; else waits until it has caught up. */
static void read_topup(struct file_op *op)
{
    if (!op->id || op->waiting_drain || op->bytes >= op->length)
        return; /* past LENGTH the agent has nothing more to send but OK */
    size_t backlog = sink_backlog(op->sink);
    if (backlog < READ_INFLIGHT / 2) {
        /* Credit counts from what arrived: it and the queue stay within READ_INFLIGHT. It goes
         * in steps of half of that at least: each CREDIT wakes the agent, and a wake-up in
         * gVisor is a few system calls, each a trip through the sentry. */
        uint64_t room = READ_INFLIGHT - backlog, left = op->length - op->bytes;
        uint64_t window = left < room ? left : room;
        agentconn_credit_step(op->sb->conn, op->id, window, window / 2);
        return;
    }
    op->waiting_drain = 1;
    sink_on_drain(op->sink, read_drained, op);
}

/* The caller has every byte it was promised: the answer ends, and the agent, which may have
 * more (a file that grew since it was opened), stops. Frees op. */
static void read_done(struct file_op *op)
{
    if (op->id && op->sb->conn)
        agentconn_abort(op->sb->conn, op->id);
    op->id = 0;
    sink_end(op->sink);
    fop_free(op);
}

/* The size of the answer to a read, from the agent's STAT_RESULT of the opened file: its
 * bytes from the offset on, at most the length asked for. Returns -1 for a malformed stat. */
static int read_size(const struct file_op *op, const uint8_t *payload, size_t len, uint64_t *out)
{
    struct proto_field f;
    uint64_t size;
    if (proto_find(payload, len, PT_SIZE, &f) != 1 || proto_field_u64(&f, &size) < 0)
        return -1;
    /* A size of 0 is no promise: /proc's files say 0 and have content. Such a read goes
     * unsized (chunked) to the agent's end of file, within the length asked for. */
    if (size == 0)
        return -1;
    uint64_t left = size > op->offset ? size - op->offset : 0;
    *out = left < op->length ? left : op->length;
    return 0;
}

/* The caller went away: the agent stops reading at once and the answer ends. */
static void read_cancelled(void *arg)
{
    struct file_op *op = arg;
    if (!op->id)
        return;
    log_info(op->sb->id, "files.read_cancelled", "path=\"%s\" after=%llu", op->path,
             (unsigned long long)op->bytes);
    if (op->sb->conn)
        agentconn_abort(op->sb->conn, op->id);
    op->id = 0;
    fop_fail(op, WR_E_UNAVAILABLE, 0, "the caller went away");
}

/* EXTRACTED: the agent's counts so far (progress, then the last before OK). */
static void extracted(struct file_op *op, const uint8_t *payload, size_t len)
{
    struct proto_field f;
    uint64_t entries = 0, bytes = 0, skipped = 0;
    char name[1024] = "", kind[64] = "";
    if (proto_find(payload, len, PT_ENTRIES, &f) == 1)
        proto_field_u64(&f, &entries);
    if (proto_find(payload, len, PT_SIZE, &f) == 1)
        proto_field_u64(&f, &bytes);
    if (proto_find(payload, len, PT_SKIPPED, &f) == 1)
        proto_field_u64(&f, &skipped);
    if (proto_find(payload, len, PT_NAME, &f) == 1 && proto_field_str(&f, name, sizeof(name)) < 0)
        name[0] = '\0';
    if (proto_find(payload, len, PT_MESSAGE, &f) == 1 &&
        proto_field_str(&f, kind, sizeof(kind)) < 0)
        kind[0] = '\0';
    if (!utf8_valid((const unsigned char *)name, strlen(name)))
        name[0] = '\0';
    if (!utf8_valid((const unsigned char *)kind, strlen(kind)))
        kind[0] = '\0';
    json_decref(op->result);
    op->result = json_pack("{s:s, s:I, s:I, s:I}", "path", op->path, "entries",
                           (json_int_t)(entries > INT64_MAX ? INT64_MAX : entries), "bytes",
                           (json_int_t)(bytes > INT64_MAX ? INT64_MAX : bytes), "skipped",
                           (json_int_t)(skipped > INT64_MAX ? INT64_MAX : skipped));
    if (skipped && name[0]) {
        char msg[1200];
        snprintf(msg, sizeof(msg), "%s '%s' skipped%s", kind[0] ? kind : "entry", name,
                 skipped > 1 ? " (and others: only directories, files and symlinks are extracted)"
                             : " (only directories, files and symlinks are extracted)");
        json_object_set_new(op->result, "skipped_note", json_string(msg));
    }
}

static void on_frame(void *arg, const struct proto_header *h, const uint8_t *payload)
{
    struct file_op *op = arg;
    if (h && agentconn_frame_ends(h->type))
        op->id = 0; /* the request is over: nothing to credit or cancel */
    if (!h) {
        if (op->started)
            fop_fail(op, WR_E_SANDBOX_FAILED, 0, (const char *)payload);
        else if (op->d->shutting_down)
            fop_fail(op, WR_E_UNAVAILABLE, 0, "the daemon is shutting down");
        else
            fop_fail(op, WR_E_SANDBOX_FAILED, 0, (const char *)payload);
        return;
    }
    switch (h->type) {
    case PROTO_STAT_RESULT:
        if (op->kind == FOP_READ && !op->started) {
            /* The answer's size is known from here: the caller is told it (a Content-Length),
             * and gets exactly that many bytes or a body visibly cut short. */
            uint64_t size;
            op->started = 1;
            if (read_size(op, payload, h->len, &size) < 0) {
                sink_begin(op->sink, "application/octet-stream");
                return;
            }
            op->length = size;
            op->sized = 1;
            sink_begin_sized(op->sink, "application/octet-stream", size);
            if (size == 0)
                read_done(op);
        } else if (!op->result) {
            op->result = entry_from_fields(payload, h->len, "", op->path);
        }
        return;
    case PROTO_DATA: /* reads and archives take theirs as buffers (on_data) */ return;
    case PROTO_DIR_ENTRIES:
        if (op->kind == FOP_LIST) {
            add_entries(op, payload, h->len);
            if (json_array_size(op->result) >= LIST_MAX_ENTRIES) {
                op->truncated = 1;
                agentconn_cancel(op->sb->conn, op->id);
                op->id = 0;
                on_ok(op);
            }
        }
        return;
    case PROTO_EXTRACTED:
        if (op->kind == FOP_EXTRACT)
            extracted(op, payload, h->len);
        return;
    case PROTO_OK: on_ok(op); return;
    case PROTO_ERROR:
        if (op->started) /* too late for a status: the body ends short */
            log_warn(op->sb->id, "files.read_error", "path=\"%s\" after=%llu", op->path,
                     (unsigned long long)op->bytes);
        fail_from_agent(op, payload, h->len);
        return;
    default:
        if (agentconn_frame_ends(h->type)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "the sandbox's agent answered a file request with %s",
                     proto_type_name(h->type));
            fop_fail(op, WR_E_SANDBOX_FAILED, 0, msg);
        }
        return;
    }
}

/* DATA of a read or an archive: its bytes move on to the caller as they lie, uncopied. */
static void on_data(void *arg, const struct proto_header *h, struct evbuffer *payload)
{
    struct file_op *op = arg;
    size_t len = evbuffer_get_length(payload);
    if (op->kind == FOP_ARCHIVE) {
        if (!op->started) {
            op->started = 1;
            sink_begin(op->sink, "application/x-tar");
        }
        op->bytes += len;
        if (len)
            sink_write_buffer(op->sink, payload);
        read_topup(op);
        return;
    }
    if (op->kind != FOP_READ || !op->started)
        return;
    /* The agent may send more than was asked for; the caller never gets it. */
    uint64_t room = op->length - op->bytes;
    size_t n = len < room ? len : (size_t)room;
    op->bytes += n;
    if (n == len) {
        sink_write_buffer(op->sink, payload);
    } else if (n) {
        struct evbuffer *head = evbuffer_new();
        if (!head)
            abort(); /* out of memory, as xmalloc */
        evbuffer_remove_buffer(payload, head, n);
        sink_write_buffer(op->sink, head);
        evbuffer_free(head);
    }
    if (n)
        metrics_add(MC_FILES_READ_BYTES, n);
    if (op->bytes >= op->length)
        read_done(op);
    else
        read_topup(op);
}

/* Checks the path and the sandbox, makes the op. Fails s and returns NULL if either is bad. */
static struct file_op *fop_new(struct daemon *d, const char *id, enum fop_kind kind,
                               const char *path, struct sink *s)
{
    size_t n = strlen(path);
    struct wr_err err = {0};
    struct sandbox *sb = NULL;
    if (n == 0 || n > PROTO_MAX_PATH)
        wr_err_kind(&err, WR_E_INVALID, 0, "path: must be 1 to %d bytes", PROTO_MAX_PATH);
    else if (!utf8_valid((const unsigned char *)path, n))
        wr_err_kind(&err, WR_E_INVALID, 0, "path: must be UTF-8");
    else if ((sb = sandbox_lookup(d, id, s->who, &err)) && sandbox_check_running(sb, &err) == 0)
        err.msg[0] = '\0';
    if (err.msg[0]) {
        sink_fail(s, &err);
        return NULL;
    }
    struct file_op *op = xcalloc(1, sizeof(*op));
    op->d = d;
    op->sb = sb;
    sandbox_ref(sb);
    op->sink = s;
    op->kind = kind;
    if (path[0] == '/')
        snprintf(op->path, sizeof(op->path), "%s", path);
    else
        join_path(op->path, sizeof(op->path), "/workspace", path);
    return op;
}

/* Sends the op's request (taking b). Returns 0, or -1 after failing and freeing the op. */
static int fop_send(struct file_op *op, uint16_t type, struct proto_buf *b)
{
    op->id = agentconn_request(op->sb->conn, type, b->data, b->len, on_frame, op);
    proto_buf_free(b);
    if (!op->id) {
        fop_fail(op, WR_E_CONFLICT, 0, "the sandbox's agent is not reachable");
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

void svc_file_read(struct daemon *d, const char *id, const char *path, uint64_t offset,
                   uint64_t length, struct sink *s)
{
    struct file_op *op = fop_new(d, id, FOP_READ, path, s);
    if (!op)
        return;
    struct wr_err err = {0};
    if (daemon_reserve_output(d, READ_INFLIGHT, "download", &err) < 0) {
        sink_fail(s, &err);
        fop_free(op);
        return;
    }
    op->reserved = READ_INFLIGHT;
    op->offset = offset;
    op->length = length;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    proto_put_u64(&b, PT_OFFSET, offset);
    if (length != UINT64_MAX)
        proto_put_u64(&b, PT_LENGTH, length);
    /* never credit for more than was asked: a byte past it is a lie the channel catches */
    op->id =
        agentconn_request_windowed(op->sb->conn, PROTO_FILE_READ, &b,
                                   length < READ_INFLIGHT ? length : READ_INFLIGHT, on_frame, op);
    proto_buf_free(&b);
    if (!op->id) {
        fop_fail(op, WR_E_CONFLICT, 0, "the sandbox's agent is not reachable");
        return;
    }
    agentconn_on_data(op->sb->conn, op->id, on_data);
    sink_on_cancel(s, read_cancelled, op);
}

/* Upload bytes queued towards the agent above which the pump waits for it to catch up: the
 * body is handed over in pieces, never copied whole into the channel. */
#define UPLOAD_HIGH (1024 * 1024)

static void upload_pump(void *arg);

/* Hands the caller's body to the agent while the channel keeps up; ends with DATA+FIN. The
 * agent may answer (ERROR) before the end, which frees op: nothing here runs after a send
 * that could have done so without checking. */
static void upload_pump(void *arg)
{
    struct file_op *op = arg;
    struct agentconn *conn = op->sb->conn;
    struct evbuffer *piece = evbuffer_new();
    unsigned char *chunk = op->sink->ops->input_move ? NULL : xmalloc(WRITE_CHUNK);
    size_t n;
    int rc = 0;
    while (op->id && agentconn_backlog(conn) < UPLOAD_HIGH) {
        /* the body's memory moves onto the channel as it is; copied only without input_move */
        if (chunk) {
            n = op->sink->ops->input_read(op->sink, chunk, WRITE_CHUNK);
            evbuffer_add(piece, chunk, n);
        } else {
            n = op->sink->ops->input_move(op->sink, piece, WRITE_CHUNK);
        }
        if (!n)
            break;
        op->sent += n;
        metrics_add(MC_FILES_WRITE_BYTES, n);
        rc = agentconn_send_buffer(conn, op->id, PROTO_DATA, 0, piece);
        evbuffer_drain(piece, evbuffer_get_length(piece));
        if (rc < 0)
            break;
    }
    free(chunk);
    evbuffer_free(piece);
    if (rc < 0) { /* the channel died: its death notice answers the request */
        log_warn(op->sb->id, "files.write_unsent", "path=\"%s\"", op->path);
        return;
    }
    if (op->sent < op->total) {
        agentconn_on_writable(conn, op->id, upload_pump, op);
        return;
    }
    if (agentconn_send(conn, op->id, PROTO_DATA, PROTO_F_FIN, NULL, 0) == 0)
        log_info(op->sb->id, "files.write", "path=\"%s\" bytes=%llu", op->path,
                 (unsigned long long)op->total);
}

void svc_file_write(struct daemon *d, const char *id, const char *path, unsigned mode, int parents,
                    uint64_t offset, struct sink *s)
{
    size_t total = s->ops->input_len(s);
    if (total > d->cfg.max_upload) {
        sink_failf(s, WR_E_TOO_LARGE, 0, "upload is %zu bytes; the limit is %zu", total,
                   d->cfg.max_upload);
        return;
    }
    struct file_op *op = fop_new(d, id, FOP_WRITE, path, s);
    if (!op)
        return;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    if (mode != SVC_MODE_UNSET)
        proto_put_u32(&b, PT_MODE, mode);
    else if (offset == SVC_OFFSET_NONE)
        proto_put_u32(&b, PT_MODE, 0644); /* a replaced file gets the default mode */
    proto_put_u32(&b, PT_WFLAGS, parents ? PROTO_W_PARENTS : 0);
    if (offset != SVC_OFFSET_NONE)
        proto_put_u64(&b, PT_OFFSET, offset);
    if (fop_send(op, PROTO_FILE_WRITE, &b) < 0)
        return;
    op->total = total;
    upload_pump(op);
}

void svc_file_archive(struct daemon *d, const char *id, const char *path, struct sink *s)
{
    struct file_op *op = fop_new(d, id, FOP_ARCHIVE, path, s);
    if (!op)
        return;
    struct wr_err err = {0};
    if (daemon_reserve_output(d, READ_INFLIGHT, "download", &err) < 0) {
        sink_fail(s, &err);
        fop_free(op);
        return;
    }
    op->reserved = READ_INFLIGHT;
    op->length = UINT64_MAX;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    op->id = agentconn_request_windowed(op->sb->conn, PROTO_FILE_ARCHIVE, &b, READ_INFLIGHT,
                                        on_frame, op);
    proto_buf_free(&b);
    if (!op->id) {
        fop_fail(op, WR_E_CONFLICT, 0, "the sandbox's agent is not reachable");
        return;
    }
    agentconn_on_data(op->sb->conn, op->id, on_data);
    log_info(op->sb->id, "files.archive", "path=\"%s\"", op->path);
    sink_on_cancel(s, read_cancelled, op);
}

void svc_file_extract(struct daemon *d, const char *id, const char *archive, const char *path,
                      int remove_archive, struct sink *s)
{
    size_t n = strlen(archive);
    if (n == 0 || n > PROTO_MAX_PATH || !utf8_valid((const unsigned char *)archive, n)) {
        sink_failf(s, WR_E_INVALID, 0, "archive: must be 1 to %d bytes of UTF-8", PROTO_MAX_PATH);
        return;
    }
    struct file_op *op = fop_new(d, id, FOP_EXTRACT, path, s);
    if (!op)
        return;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    proto_put_str(&b, PT_SOURCE, archive);
    proto_put_u32(&b, PT_WFLAGS, remove_archive ? PROTO_W_REMOVE_SOURCE : 0);
    if (fop_send(op, PROTO_FILE_EXTRACT, &b) == 0)
        log_info(op->sb->id, "files.extract", "path=\"%s\" archive=\"%s\"", op->path, archive);
}

void svc_file_list(struct daemon *d, const char *id, const char *path, struct sink *s)
{
    struct file_op *op = fop_new(d, id, FOP_LIST, path, s);
    if (!op)
        return;
    op->result = json_array();
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    fop_send(op, PROTO_FILE_LIST, &b);
}

void svc_file_stat(struct daemon *d, const char *id, const char *path, struct sink *s)
{
    struct file_op *op = fop_new(d, id, FOP_STAT, path, s);
    if (op)
        send_stat_request(op);
}

void svc_file_mkdir(struct daemon *d, const char *id, const char *path, unsigned mode, int parents,
                    struct sink *s)
{
    struct file_op *op = fop_new(d, id, FOP_MKDIR, path, s);
    if (!op)
        return;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    proto_put_u32(&b, PT_MODE, mode);
    proto_put_u32(&b, PT_WFLAGS, parents ? PROTO_W_PARENTS : 0);
    fop_send(op, PROTO_FILE_MKDIR, &b);
}

void svc_file_remove(struct daemon *d, const char *id, const char *path, int recursive,
                     struct sink *s)
{
    struct file_op *op = fop_new(d, id, FOP_REMOVE, path, s);
    if (!op)
        return;
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, op->path);
    proto_put_u32(&b, PT_WFLAGS, recursive ? PROTO_W_RECURSIVE : 0);
    fop_send(op, PROTO_FILE_REMOVE, &b);
}
