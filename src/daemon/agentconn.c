/*
 * Daemon side of the agent protocol: framing over one socket and a table of
 * open requests. See agentconn.h and docs/protocol.md.
 *
 * Frames out go through a bufferevent. Frames in do not: libevent 2.1 reads a
 * socket 4 KiB at a time (EVBUFFER_MAX_READ), and pulls a frame that spans its
 * chains up into one piece, which made the channel, not the sandbox, the limit
 * of a download. The connection reads into a flat buffer of its own instead,
 * up to IN_READ at a time, and hands each frame's payload from there. A big
 * DATA frame for a request that takes buffers (agentconn_on_data) is read
 * past the flat buffer, straight into heap blocks that become the buffer's
 * chains, so a download's bytes are never copied in the daemon: the kernel
 * puts them there and the caller's socket write takes them from there.
 */
#include "daemon/agentconn.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/evbuf.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/util.h"

#define NBUCKETS 256

/* How often open requests are checked against their deadlines. */
#define DEADLINE_CHECK_MS 1000
/* The channel's output is "writable" again for waiting uploads below this many bytes. */
#define WRITABLE_LOW (256u * 1024)
/* Largest write to the channel in one go (libevent's default is 16 KiB). */
#define OUT_MAX_WRITE (1u << 20)
/* The input buffer: room for the largest frame plus one read. Its pages are touched only as
 * far as reads reach, and an empty buffer is freed by the deadline check, so an idle sandbox
 * holds none. */
#define IN_READ (1u << 20)
#define IN_CAP (PROTO_HEADER_LEN + PROTO_MAX_PAYLOAD + IN_READ)
/* Bytes read in one turn of the loop before other connections get theirs. */
#define IN_TURN (4u << 20)
/* A DATA payload with at least this much still to come is read straight into blocks. */
#define DIRECT_MIN (64u << 10)
/* Its blocks: heap-sized (common/evbuf.h), as many as the largest payload needs. */
#define DIRECT_BLOCK EVBUF_BLOCK
#define DIRECT_BLOCKS (PROTO_MAX_PAYLOAD / DIRECT_BLOCK + 1)

struct req {
    uint32_t id;
    uint16_t type;     /* what was asked: decides which answers are valid */
    int windowed;      /* output is flow-controlled (PT_WINDOW) */
    uint64_t allowed;  /* windowed: bytes of output the agent may have sent in all */
    uint64_t received; /* windowed: bytes of output it did send */
    uint64_t last_ms;  /* the last sign of progress (a frame either way) */
    agentconn_frame_cb cb;
    agentconn_data_cb data_cb; /* DATA frames as buffers (agentconn_on_data), or NULL */
    void *arg;
    void (*writable_cb)(void *arg); /* one-shot: the channel's output drained */
    void *writable_arg;
    struct req *next;
};

struct agentconn {
    struct event_base *base;
    struct bufferevent *bev; /* output and its events; input is read_ev */
    struct event *read_ev;
    uint8_t *in; /* IN_CAP bytes, or NULL while there is nothing to hold */
    size_t in_off, in_len;
    /* A DATA payload being read straight into blocks: its header, what it holds so far, and
     * the bytes still to come. Set only between frames, with the flat buffer empty. */
    struct evbuffer *direct;
    struct proto_header direct_h;
    size_t direct_left;
    struct event *hello_timer;
    struct event *deadline_timer;
    int deadline_ms;    /* without progress for this long, a request means the agent is stuck */
    int gave_up;        /* the connection died because the agent missed a deadline */
    unsigned nwaiting;  /* requests with a writable_cb */
    unsigned nbuffered; /* requests with a data_cb */
    unsigned nactive;   /* open requests other than PING: the sandbox is in use */
    void (*on_send)(void *arg, uint16_t type); /* before each frame goes out (agentconn.h) */
    void *send_arg;
    agentconn_state_cb on_state;
    void *arg;
    struct req *buckets[NBUCKETS];
    uint32_t next_id;
    int ready;
    int dead;
    int in_callback; /* depth of callbacks running; free is deferred while > 0 */
    int free_pending;
    char reason[256];
};

static struct req **slot(struct agentconn *c, uint32_t id)
{
    struct req **p = &c->buckets[id % NBUCKETS];
    while (*p && (*p)->id != id)
        p = &(*p)->next;
    return p;
}

static struct req *take(struct agentconn *c, uint32_t id)
{
    struct req **p = slot(c, id);
    struct req *r = *p;
    if (r)
        *p = r->next;
    return r;
}

/* r leaves the table (answered, cancelled or dead). */
static void gone(struct agentconn *c, const struct req *r)
{
    if (r->type != PROTO_PING)
        c->nactive--;
    if (r->data_cb)
        c->nbuffered--;
}

static void destroy(struct agentconn *c)
{
    if (c->read_ev)
        event_free(c->read_ev);
    if (c->bev)
        bufferevent_free(c->bev); /* closes the channel */
    free(c->in);
    if (c->direct)
        evbuffer_free(c->direct);
    if (c->hello_timer)
        event_free(c->hello_timer);
    if (c->deadline_timer)
        event_free(c->deadline_timer);
    for (int i = 0; i < NBUCKETS; i++) {
        struct req *r = c->buckets[i];
        while (r) {
            struct req *n = r->next;
            free(r);
            r = n;
        }
    }
    free(c);
}

/* Marks the connection dead and tells everyone waiting on it, once. */
static void die(struct agentconn *c, const char *reason)
{
    if (c->dead)
        return;
    c->dead = 1;
    snprintf(c->reason, sizeof(c->reason), "%s", reason);
    if (c->bev)
        bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    if (c->read_ev)
        event_del(c->read_ev);
    if (c->hello_timer)
        event_del(c->hello_timer);
    if (c->deadline_timer)
        event_del(c->deadline_timer);
    c->in_callback++;
    for (int i = 0; i < NBUCKETS; i++) {
        struct req *r;
        while ((r = c->buckets[i])) {
            c->buckets[i] = r->next;
            gone(c, r);
            r->cb(r->arg, NULL, (const uint8_t *)c->reason);
            free(r);
        }
    }
    if (c->on_state)
        c->on_state(c->arg, 0, c->reason);
    c->in_callback--;
}

#define CLOSED_REASON "agent closed the control channel (the sandbox stopped or its agent died)"

/* A failed read or write on the channel. A reset or a broken pipe is the agent's end going
 * away: the kernel reports a close as ECONNRESET when the agent left frames it had not read yet
 * (as a dying agent does), and a write after the close as EPIPE. Either reads as a close. */
static void die_errno(struct agentconn *c, int err)
{
    if (err == ECONNRESET || err == EPIPE) {
        die(c, CLOSED_REASON);
        return;
    }
    char reason[128];
    snprintf(reason, sizeof(reason), "control channel error%s%s", err ? ": " : "",
             err ? strerror(err) : "");
    die(c, reason);
}

int agentconn_frame_ends(uint16_t type)
{
    return type == PROTO_EXIT || type == PROTO_OK || type == PROTO_ERROR || type == PROTO_PONG;
}

static int agent_may_send(uint16_t type)
{
    switch (type) {
    case PROTO_HELLO:
    case PROTO_PONG:
    case PROTO_STDOUT:
    case PROTO_STDERR:
    case PROTO_EXIT:
    case PROTO_DATA:
    case PROTO_STAT_RESULT:
    case PROTO_DIR_ENTRIES:
    case PROTO_EXTRACTED:
    case PROTO_OK:
    case PROTO_ERROR: return 1;
    default: return 0;
    }
}

/* Whether the agent may answer a request of type `asked` with a frame of type `got`. */
static int answer_fits(uint16_t asked, uint16_t got)
{
    if (got == PROTO_ERROR)
        return asked != PROTO_PING;
    switch (asked) {
    case PROTO_PING: return got == PROTO_PONG;
    case PROTO_EXEC:
    case PROTO_SESSION: return got == PROTO_STDOUT || got == PROTO_STDERR || got == PROTO_EXIT;
    case PROTO_FILE_READ: return got == PROTO_STAT_RESULT || got == PROTO_DATA || got == PROTO_OK;
    case PROTO_FILE_WRITE:
    case PROTO_FILE_STAT:
    case PROTO_FILE_MKDIR: return got == PROTO_STAT_RESULT || got == PROTO_OK;
    case PROTO_FILE_LIST: return got == PROTO_DIR_ENTRIES || got == PROTO_OK;
    case PROTO_FILE_REMOVE: return got == PROTO_OK;
    case PROTO_FILE_ARCHIVE: return got == PROTO_DATA || got == PROTO_OK;
    case PROTO_FILE_EXTRACT: return got == PROTO_EXTRACTED || got == PROTO_OK;
    default: return 0;
    }
}

static int is_output(uint16_t type)
{
    return type == PROTO_STDOUT || type == PROTO_STDERR || type == PROTO_DATA;
}

/* Hands a frame to its request: the payload is at payload, or (a DATA frame read straight into
 * blocks) in buf. */
static void deliver(struct agentconn *c, struct req *r, const struct proto_header *h,
                    const uint8_t *payload, struct evbuffer *buf)
{
    if (h->type == PROTO_DATA && r->data_cb) {
        struct evbuffer *tmp = NULL;
        if (!buf) {
            if (!(tmp = buf = evbuffer_new()))
                abort(); /* out of memory, as xmalloc */
            evbuf_add_pieces(buf, payload, h->len);
        }
        r->data_cb(r->arg, h, buf);
        if (tmp)
            evbuffer_free(tmp);
        return;
    }
    if (buf) /* (a request that takes buffers always does: not reached) */
        payload = evbuffer_pullup(buf, -1);
    r->cb(r->arg, h, payload);
}

static void dispatch(struct agentconn *c, const struct proto_header *h, const uint8_t *payload,
                     struct evbuffer *buf)
{
    if (h->type == PROTO_HELLO) {
        if (c->ready) {
            die(c, "agent sent a second HELLO");
            return;
        }
        uint32_t version = 0;
        struct proto_field f;
        if (proto_find(payload, h->len, PT_VERSION, &f) != 1 || proto_field_u32(&f, &version) < 0 ||
            version != PROTO_VERSION) {
            die(c, "agent sent a bad HELLO (protocol version mismatch?)");
            return;
        }
        c->ready = 1;
        event_del(c->hello_timer);
        c->on_state(c->arg, 1, NULL);
        return;
    }
    if (!c->ready) {
        if (h->type == PROTO_ERROR && h->id == 0) {
            /* The agent refuses to start (it cannot isolate its commands): its words, made
             * printable and bounded, are the start's failure. */
            char msg[300] = "", why[400];
            struct proto_field f;
            if (proto_find(payload, h->len, PT_MESSAGE, &f) == 1) {
                size_t n = f.len < sizeof(msg) - 1 ? f.len : sizeof(msg) - 1;
                for (size_t i = 0; i < n; i++)
                    msg[i] = f.data[i] >= 0x20 && f.data[i] < 0x7f ? (char)f.data[i] : '?';
                msg[n] = '\0';
            }
            snprintf(why, sizeof(why), "agent refused to start: %s",
                     msg[0] ? msg : "(no reason given)");
            die(c, why);
            return;
        }
        die(c, "agent sent a frame before HELLO");
        return;
    }
    struct req **p = slot(c, h->id);
    struct req *r = *p;
    if (!r)
        return; /* a cancelled request: late frames are expected */
    if (!answer_fits(r->type, h->type)) {
        char msg[128];
        snprintf(msg, sizeof(msg), "agent answered a %s request with %s (protocol violation)",
                 proto_type_name(r->type), proto_type_name(h->type));
        die(c, msg);
        return;
    }
    r->last_ms = now_ms_monotonic();
    if (r->windowed && is_output(h->type)) {
        r->received += h->len;
        if (r->received > r->allowed) {
            char msg[128];
            snprintf(msg, sizeof(msg),
                     "agent sent more %s output than the daemon allowed (protocol violation)",
                     proto_type_name(r->type));
            die(c, msg);
            return;
        }
    }
    if (agentconn_frame_ends(h->type)) {
        *p = r->next;
        gone(c, r);
        if (r->writable_cb)
            c->nwaiting--;
        r->cb(r->arg, h, payload);
        free(r);
    } else {
        deliver(c, r, h, payload, buf);
    }
}

/* handle_frames stopped at a frame whose first `have` payload bytes are in the buffer: a big
 * DATA frame for a request that takes buffers is read on straight into blocks (direct_read). */
static void direct_begin(struct agentconn *c, const struct proto_header *h, const uint8_t *payload,
                         size_t have)
{
    if (h->type != PROTO_DATA || h->len - have < DIRECT_MIN || !c->ready)
        return;
    struct req *r = *slot(c, h->id);
    if (!r || !r->data_cb)
        return;
    if (!(c->direct = evbuffer_new()))
        abort(); /* out of memory, as xmalloc */
    evbuf_add_pieces(c->direct, payload, have);
    c->direct_h = *h;
    c->direct_left = h->len - have;
    c->in_off = c->in_len = 0;
}

static void free_block(const void *data, size_t len, void *extra)
{
    free((void *)data);
}

/*
 * Reads the rest of the direct payload into fresh blocks and, once it is whole, the next frame's
 * header only into the flat buffer (so that a stream of big DATA frames goes direct frame after
 * frame). A block the read filled at least half of becomes a chain of the payload as it is; a
 * less filled one is copied (a trickle of tiny reads must not pin a block per byte). Returns
 * what read returned, and in *asked what was asked for.
 */
static ssize_t direct_read(struct agentconn *c, int fd, size_t *asked)
{
    struct iovec iov[DIRECT_BLOCKS + 1];
    size_t k = 0, planned = 0;
    while (planned < c->direct_left && k < DIRECT_BLOCKS) {
        size_t n =
            c->direct_left - planned < DIRECT_BLOCK ? c->direct_left - planned : DIRECT_BLOCK;
        iov[k].iov_base = xmalloc(n);
        iov[k++].iov_len = n;
        planned += n;
    }
    size_t nblocks = k;
    if (planned == c->direct_left) {
        if (!c->in)
            c->in = xmalloc(IN_CAP);
        iov[k].iov_base = c->in + c->in_len;
        iov[k++].iov_len = PROTO_HEADER_LEN;
    }
    *asked = planned + (k > nblocks ? PROTO_HEADER_LEN : 0);
    ssize_t n = readv(fd, iov, (int)k);
    size_t left = n > 0 ? (size_t)n : 0;
    for (size_t i = 0; i < nblocks; i++) {
        size_t got = left < iov[i].iov_len ? left : iov[i].iov_len;
        left -= got;
        if (got && 2 * got >= iov[i].iov_len) {
            if (evbuffer_add_reference(c->direct, iov[i].iov_base, got, free_block, NULL) < 0)
                abort();
            continue;
        }
        if (got && evbuffer_add(c->direct, iov[i].iov_base, got) < 0)
            abort();
        free(iov[i].iov_base);
    }
    if (n > 0) {
        c->direct_left -= (size_t)n - left;
        c->in_len += left; /* the next frame's header, or part of it */
    }
    return n;
}

/* The direct payload is whole: its frame goes to its request like any other. */
static void direct_end(struct agentconn *c)
{
    struct evbuffer *buf = c->direct;
    struct proto_header h = c->direct_h;
    c->direct = NULL;
    dispatch(c, &h, NULL, buf);
    evbuffer_free(buf);
}

/* Handles every whole frame in the input buffer. */
static void handle_frames(struct agentconn *c)
{
    while (!c->dead && !c->free_pending) {
        size_t avail = c->in_len - c->in_off;
        if (avail < PROTO_HEADER_LEN)
            break;
        const uint8_t *hb = c->in + c->in_off;
        struct proto_header h;
        if (proto_header_decode(hb, &h) < 0) {
            die(c, "agent sent a malformed frame header");
            break;
        }
        if (!agent_may_send(h.type)) {
            char msg[96];
            snprintf(msg, sizeof(msg), "agent sent a frame of type %s, which only the daemon sends",
                     proto_type_name(h.type));
            die(c, msg);
            break;
        }
        if (avail < PROTO_HEADER_LEN + (size_t)h.len) {
            direct_begin(c, &h, hb + PROTO_HEADER_LEN, avail - PROTO_HEADER_LEN);
            break;
        }
        c->in_off += PROTO_HEADER_LEN + (size_t)h.len;
        dispatch(c, &h, hb + PROTO_HEADER_LEN, NULL);
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
}

/*
 * While a request takes buffers, a read into the flat buffer stops at the end of the frame in
 * hand plus the next one's header: a DATA frame's payload is then never read there (and
 * copied out) but, its header known first, straight into blocks. A frame per read, so only
 * then. Returns how much to read, at most want.
 */
static size_t aligned_read(const struct agentconn *c, size_t want)
{
    size_t avail = c->in_len - c->in_off;
    struct proto_header h;
    if (avail < PROTO_HEADER_LEN)
        return PROTO_HEADER_LEN - avail;
    if (proto_header_decode(c->in + c->in_off, &h) < 0) /* (handle_frames would have died) */
        return want;
    size_t rest = PROTO_HEADER_LEN + (size_t)h.len - avail + PROTO_HEADER_LEN;
    return rest < want ? rest : want;
}

static void on_readable(evutil_socket_t fd, short what, void *p)
{
    struct agentconn *c = p;
    c->in_callback++;
    size_t turn = 0;
    while (!c->dead && !c->free_pending && turn < IN_TURN) {
        if (c->direct) {
            size_t asked;
            ssize_t n = direct_read(c, fd, &asked);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            if (n < 0) {
                die_errno(c, errno);
                break;
            }
            if (n == 0) {
                die(c, CLOSED_REASON);
                break;
            }
            turn += (size_t)n;
            if (!c->direct_left)
                direct_end(c);
            handle_frames(c);
            if ((size_t)n < asked)
                break; /* the socket is empty for now */
            continue;
        }
        if (!c->in)
            c->in = xmalloc(IN_CAP);
        /* A frame that began in an earlier read moves to the front (decode checked its length,
         * so it and one more read fit). */
        if (c->in_off && IN_CAP - c->in_len < IN_READ) {
            memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
            c->in_len -= c->in_off;
            c->in_off = 0;
        }
        size_t room = IN_CAP - c->in_len, want = room < IN_READ ? room : IN_READ;
        if (c->nbuffered)
            want = aligned_read(c, want);
        ssize_t n = read(fd, c->in + c->in_len, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n < 0) {
            die_errno(c, errno);
            break;
        }
        if (n == 0) {
            die(c, CLOSED_REASON);
            break;
        }
        c->in_len += (size_t)n;
        turn += (size_t)n;
        handle_frames(c);
        if ((size_t)n < want)
            break; /* the socket is empty for now */
    }
    c->in_callback--;
    if (c->free_pending && c->in_callback == 0)
        destroy(c);
}

static void on_event(struct bufferevent *bev, short what, void *p)
{
    struct agentconn *c = p;
    c->in_callback++;
    if (what & BEV_EVENT_EOF)
        die(c, CLOSED_REASON);
    else if (what & BEV_EVENT_ERROR) /* a write failed */
        die_errno(c, EVUTIL_SOCKET_ERROR());
    c->in_callback--;
    if (c->free_pending && c->in_callback == 0)
        destroy(c);
}

static void on_hello_timeout(evutil_socket_t fd, short what, void *p)
{
    struct agentconn *c = p;
    c->in_callback++;
    die(c, "agent did not say HELLO in time");
    c->in_callback--;
    if (c->free_pending && c->in_callback == 0)
        destroy(c);
}

/* Whether r is waiting on the agent (as opposed to the agent waiting on us: a windowed
 * request out of credit, or an exec, whose own timer bounds it). */
static int waits_on_agent(const struct req *r)
{
    if (r->type == PROTO_EXEC || r->type == PROTO_SESSION || r->type == PROTO_PING)
        return 0; /* a session waits on its user, for as long as the sandbox lives */
    return !r->windowed || r->received < r->allowed;
}

static void arm_deadline_check(struct agentconn *c)
{
    int ms = c->deadline_ms / 2 < DEADLINE_CHECK_MS ? c->deadline_ms / 2 : DEADLINE_CHECK_MS;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->deadline_timer, &tv);
}

void agentconn_set_deadline(struct agentconn *c, int ms)
{
    c->deadline_ms = ms > 0 ? ms : 1;
    if (!c->dead)
        arm_deadline_check(c);
}

static void on_deadline_check(evutil_socket_t fd, short what, void *p)
{
    struct agentconn *c = p;
    uint64_t now = now_ms_monotonic();
    if (c->in && c->in_len == 0) {
        free(c->in);
        c->in = NULL;
    }
    for (int i = 0; i < NBUCKETS && !c->dead; i++) {
        for (struct req *r = c->buckets[i]; r; r = r->next) {
            if (waits_on_agent(r) && now - r->last_ms > (uint64_t)c->deadline_ms) {
                char msg[160];
                snprintf(msg, sizeof(msg), "the agent did not answer a %s request within %d ms",
                         proto_type_name(r->type), c->deadline_ms);
                c->gave_up = 1;
                c->in_callback++;
                die(c, msg);
                c->in_callback--;
                break;
            }
        }
    }
    if (c->free_pending && c->in_callback == 0) {
        destroy(c);
        return;
    }
    if (!c->dead)
        arm_deadline_check(c);
}

/* The channel's output fell to WRITABLE_LOW: wake the requests waiting to send more. */
static void on_write(struct bufferevent *bev, void *p)
{
    struct agentconn *c = p;
    if (!c->nwaiting)
        return;
    c->in_callback++;
    for (int i = 0; i < NBUCKETS && !c->dead; i++) {
        for (struct req *r = c->buckets[i]; r;) {
            struct req *next = r->next; /* the callback may cancel r */
            if (r->writable_cb) {
                void (*cb)(void *) = r->writable_cb;
                r->writable_cb = NULL;
                c->nwaiting--;
                cb(r->writable_arg);
            }
            r = next;
        }
    }
    c->in_callback--;
    if (c->free_pending && c->in_callback == 0)
        destroy(c);
}

struct agentconn *agentconn_new(struct event_base *base, int fd, int hello_timeout_ms,
                                agentconn_state_cb on_state, void *arg)
{
    struct agentconn *c = xcalloc(1, sizeof(*c));
    c->base = base;
    c->on_state = on_state;
    c->arg = arg;
    c->next_id = 1;
    evutil_make_socket_nonblocking(fd);
    c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(c->bev, NULL, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, WRITABLE_LOW, 0);
    bufferevent_set_max_single_write(c->bev, OUT_MAX_WRITE);
    bufferevent_enable(c->bev, EV_WRITE);
    c->read_ev = event_new(base, fd, EV_READ | EV_PERSIST, on_readable, c);
    event_add(c->read_ev, NULL);
    c->hello_timer = evtimer_new(base, on_hello_timeout, c);
    struct timeval tv = {hello_timeout_ms / 1000, (hello_timeout_ms % 1000) * 1000};
    evtimer_add(c->hello_timer, &tv);
    c->deadline_ms = AGENTCONN_DEADLINE_MS;
    c->deadline_timer = evtimer_new(base, on_deadline_check, c);
    arm_deadline_check(c);
    return c;
}

/* Sends a frame's header: the payload must follow at once. */
static int send_header(struct agentconn *c, uint32_t id, uint16_t type, uint16_t flags, size_t len)
{
    if (c->dead || len > PROTO_MAX_PAYLOAD)
        return -1;
    if (c->on_send)
        c->on_send(c->send_arg, type);
    /* tests: a send that fails, by frame type (agentconn.send.EXEC), so that a watchdog PING
     * cannot take a fault meant for the request a test makes */
    char point[40];
    snprintf(point, sizeof(point), "agentconn.send.%s", proto_type_name(type));
    if (fault_hit(point, NULL) < 0)
        return -1;
    uint8_t hb[PROTO_HEADER_LEN];
    struct proto_header h = {.len = (uint32_t)len, .id = id, .type = type, .flags = flags};
    proto_header_encode(&h, hb);
    return evbuffer_add(bufferevent_get_output(c->bev), hb, sizeof(hb));
}

static int send_frame(struct agentconn *c, uint32_t id, uint16_t type, uint16_t flags,
                      const void *payload, size_t len)
{
    if (send_header(c, id, type, flags, len) < 0)
        return -1;
    /* (a failure here leaves a header without its payload: the stream is broken anyway) */
    if (len && evbuffer_add(bufferevent_get_output(c->bev), payload, len) < 0)
        return -1;
    return 0;
}

static uint32_t request(struct agentconn *c, uint16_t type, const void *payload, size_t len,
                        int windowed, uint64_t window, agentconn_frame_cb cb, void *arg)
{
    if (c->dead || !c->ready)
        return 0;
    uint32_t id;
    do {
        id = c->next_id++;
        if (c->next_id == 0)
            c->next_id = 1;
    } while (id == 0 || *slot(c, id));
    if (send_frame(c, id, type, 0, payload, len) < 0)
        return 0;
    struct req *r = xcalloc(1, sizeof(*r));
    r->id = id;
    r->type = type;
    r->windowed = windowed;
    r->allowed = window;
    r->last_ms = now_ms_monotonic();
    r->cb = cb;
    r->arg = arg;
    if (type != PROTO_PING)
        c->nactive++;
    struct req **head = &c->buckets[id % NBUCKETS];
    r->next = *head;
    *head = r;
    return id;
}

uint32_t agentconn_request(struct agentconn *c, uint16_t type, const void *payload, size_t len,
                           agentconn_frame_cb cb, void *arg)
{
    return request(c, type, payload, len, 0, 0, cb, arg);
}

uint32_t agentconn_request_windowed(struct agentconn *c, uint16_t type, struct proto_buf *fields,
                                    uint64_t window, agentconn_frame_cb cb, void *arg)
{
    proto_put_u64(fields, PT_WINDOW, window);
    return request(c, type, fields->data, fields->len, 1, window, cb, arg);
}

void agentconn_on_data(struct agentconn *c, uint32_t id, agentconn_data_cb cb)
{
    struct req *r = *slot(c, id);
    if (!r || c->dead)
        return;
    c->nbuffered += !r->data_cb - !cb;
    r->data_cb = cb;
}

void agentconn_credit(struct agentconn *c, uint32_t id, uint64_t window)
{
    /* Top up in steps of a quarter window at least: a CREDIT per DATA frame would double the
     * frames on the channel. */
    agentconn_credit_step(c, id, window, window / 4);
}

void agentconn_credit_step(struct agentconn *c, uint32_t id, uint64_t window, uint64_t step)
{
    struct req *r = *slot(c, id);
    if (!r || !r->windowed || c->dead)
        return;
    uint64_t target = r->received + window;
    if (target <= r->allowed || target - r->allowed < step)
        return;
    struct proto_buf b = {0};
    proto_put_u64(&b, PT_LENGTH, target - r->allowed);
    if (send_frame(c, id, PROTO_CREDIT, 0, b.data, b.len) == 0) {
        /* Waiting for credit is not waiting on the agent: the clock starts now. */
        if (r->received == r->allowed)
            r->last_ms = now_ms_monotonic();
        r->allowed = target;
    }
    proto_buf_free(&b);
}

size_t agentconn_backlog(struct agentconn *c)
{
    return c->dead ? 0 : evbuffer_get_length(bufferevent_get_output(c->bev));
}

void agentconn_on_writable(struct agentconn *c, uint32_t id, void (*cb)(void *arg), void *arg)
{
    struct req *r = *slot(c, id);
    if (!r || c->dead)
        return;
    if (!r->writable_cb)
        c->nwaiting++;
    r->writable_cb = cb;
    r->writable_arg = arg;
}

int agentconn_send(struct agentconn *c, uint32_t id, uint16_t type, uint16_t flags,
                   const void *payload, size_t len)
{
    struct req *r = *slot(c, id);
    if (r) /* the daemon's own progress on the request (upload data) restarts its clock */
        r->last_ms = now_ms_monotonic();
    return send_frame(c, id, type, flags, payload, len);
}

int agentconn_send_buffer(struct agentconn *c, uint32_t id, uint16_t type, uint16_t flags,
                          struct evbuffer *payload)
{
    struct req *r = *slot(c, id);
    if (r)
        r->last_ms = now_ms_monotonic();
    size_t len = evbuffer_get_length(payload);
    if (send_header(c, id, type, flags, len) < 0)
        return -1;
    if (len && evbuffer_add_buffer(bufferevent_get_output(c->bev), payload) < 0)
        return -1;
    return 0;
}

int agentconn_send_stdin(struct agentconn *c, uint32_t id, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t off = 0; off < len; off += PROTO_CHUNK) {
        size_t n = len - off < PROTO_CHUNK ? len - off : PROTO_CHUNK;
        if (agentconn_send(c, id, PROTO_STDIN, 0, p + off, n) < 0)
            return -1;
    }
    return agentconn_send(c, id, PROTO_STDIN, PROTO_F_FIN, NULL, 0);
}

void agentconn_cancel(struct agentconn *c, uint32_t id)
{
    struct req *r = take(c, id);
    if (r)
        gone(c, r);
    if (r && r->writable_cb)
        c->nwaiting--;
    free(r);
}

void agentconn_abort(struct agentconn *c, uint32_t id)
{
    if (!*slot(c, id))
        return;
    agentconn_cancel(c, id);
    send_frame(c, id, PROTO_CANCEL, 0, NULL, 0);
}

int agentconn_gave_up(struct agentconn *c)
{
    return c && c->gave_up;
}

void agentconn_exit_status(const uint8_t *payload, size_t len, int *code, int *sig)
{
    uint32_t c = 0, s = 0;
    struct proto_field f;
    if (proto_find(payload, len, PT_EXIT_CODE, &f) == 1)
        proto_field_u32(&f, &c);
    if (proto_find(payload, len, PT_TERM_SIGNAL, &f) == 1)
        proto_field_u32(&f, &s);
    *sig = s > 64 ? 0 : (int)s;
    *code = *sig ? -1 : (int)(int32_t)c;
}

void agentconn_on_send(struct agentconn *c, void (*cb)(void *arg, uint16_t type), void *arg)
{
    c->on_send = cb;
    c->send_arg = arg;
}

unsigned agentconn_active(struct agentconn *c)
{
    return c && !c->dead ? c->nactive : 0;
}

int agentconn_alive(struct agentconn *c)
{
    return c && !c->dead;
}

void agentconn_close(struct agentconn *c, const char *reason)
{
    if (!c)
        return;
    c->on_state = NULL; /* the owner is closing; it needs no death notice */
    c->in_callback++;
    die(c, reason ? reason : "closed");
    c->in_callback--;
    if (c->in_callback > 0) {
        c->free_pending = 1;
        return;
    }
    destroy(c);
}
