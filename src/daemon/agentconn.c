/*
 * Daemon side of the agent protocol: framing over a bufferevent and a table
 * of open requests. See agentconn.h and docs/protocol.md.
 */
#include "daemon/agentconn.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdio.h>
#include <string.h>

#include "common/fault.h"
#include "common/log.h"
#include "common/util.h"

#define NBUCKETS 256

struct req {
    uint32_t id;
    agentconn_frame_cb cb;
    void *arg;
    struct req *next;
};

struct agentconn {
    struct event_base *base;
    struct bufferevent *bev;
    struct event *hello_timer;
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

static void destroy(struct agentconn *c)
{
    if (c->bev)
        bufferevent_free(c->bev);
    if (c->hello_timer)
        event_free(c->hello_timer);
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
    if (c->hello_timer)
        event_del(c->hello_timer);
    c->in_callback++;
    for (int i = 0; i < NBUCKETS; i++) {
        struct req *r;
        while ((r = c->buckets[i])) {
            c->buckets[i] = r->next;
            r->cb(r->arg, NULL, (const uint8_t *)c->reason);
            free(r);
        }
    }
    if (c->on_state)
        c->on_state(c->arg, 0, c->reason);
    c->in_callback--;
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
    case PROTO_OK:
    case PROTO_ERROR: return 1;
    default: return 0;
    }
}

static void dispatch(struct agentconn *c, const struct proto_header *h, const uint8_t *payload)
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
    if (agentconn_frame_ends(h->type)) {
        *p = r->next;
        r->cb(r->arg, h, payload);
        free(r);
    } else {
        r->cb(r->arg, h, payload);
    }
}

static void on_read(struct bufferevent *bev, void *p)
{
    struct agentconn *c = p;
    struct evbuffer *in = bufferevent_get_input(bev);
    c->in_callback++;
    while (!c->dead) {
        size_t avail = evbuffer_get_length(in);
        if (avail < PROTO_HEADER_LEN)
            break;
        uint8_t hb[PROTO_HEADER_LEN];
        evbuffer_copyout(in, hb, sizeof(hb));
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
        if (avail < PROTO_HEADER_LEN + (size_t)h.len)
            break;
        evbuffer_drain(in, PROTO_HEADER_LEN);
        const uint8_t *payload = h.len ? evbuffer_pullup(in, h.len) : (const uint8_t *)"";
        if (!payload) {
            die(c, "out of memory reading an agent frame");
            break;
        }
        dispatch(c, &h, payload);
        evbuffer_drain(in, h.len);
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
        die(c, "agent closed the control channel (the sandbox stopped or its agent died)");
    else if (what & BEV_EVENT_ERROR)
        die(c, "control channel error");
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
    bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    c->hello_timer = evtimer_new(base, on_hello_timeout, c);
    struct timeval tv = {hello_timeout_ms / 1000, (hello_timeout_ms % 1000) * 1000};
    evtimer_add(c->hello_timer, &tv);
    return c;
}

static int send_frame(struct agentconn *c, uint32_t id, uint16_t type, uint16_t flags,
                      const void *payload, size_t len)
{
    if (c->dead || len > PROTO_MAX_PAYLOAD)
        return -1;
    if (fault_hit("agentconn.send", NULL) < 0) /* tests: a send that fails */
        return -1;
    uint8_t hb[PROTO_HEADER_LEN];
    struct proto_header h = {.len = (uint32_t)len, .id = id, .type = type, .flags = flags};
    proto_header_encode(&h, hb);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_add(out, hb, sizeof(hb)) < 0 || (len && evbuffer_add(out, payload, len) < 0))
        return -1;
    return 0;
}

uint32_t agentconn_request(struct agentconn *c, uint16_t type, const void *payload, size_t len,
                           agentconn_frame_cb cb, void *arg)
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
    r->cb = cb;
    r->arg = arg;
    struct req **head = &c->buckets[id % NBUCKETS];
    r->next = *head;
    *head = r;
    return id;
}

int agentconn_send(struct agentconn *c, uint32_t id, uint16_t type, uint16_t flags,
                   const void *payload, size_t len)
{
    return send_frame(c, id, type, flags, payload, len);
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
    free(take(c, id));
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
