/* A server-side WebSocket connection: see wsconn.h. */
#include "http/wsconn.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "common/base64.h"
#include "common/log.h"
#include "common/util.h"
#include "common/ws.h"

/* A closing connection waits this long at most for its last bytes to go out. */
#define CLOSE_LINGER_S 5
/* While more than this waits to go to the peer, the peer is not read: its pings (answered) and
 * whatever its input makes the owner send cannot pile up. */
#define OUT_MAX ((size_t)2 << 20)

struct wsconn {
    struct http_upgraded *u;
    struct bufferevent *bev;
    const struct wsconn_ops *ops;
    void *arg;
    struct ws_reader rd;
    struct event *timer;
    uint64_t last_rx_ms;
    int closing;     /* a close frame was queued: nothing more is sent, nor handed to the owner */
    int await_peer;  /* closing, and reading on only to see the peer's close frame (RFC 6455
                        5.5.1: the TCP connection goes once both sides have sent theirs) */
    int peer_closed; /* the peer's close frame came */
    int want_drain;  /* call ops->drained when the queue empties */
    int paused;
    int out_full; /* not reading while the peer does not take what it is sent */
    int in_feed;  /* inside ws_reader_feed: a callback may close */
    int dead;     /* to be freed once the feed returns */
};

int wsconn_accept_key(const char *key, char *out)
{
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    size_t n = 0;
    unsigned char *raw = key ? base64_decode(key, strlen(key), &n) : NULL;
    free(raw);
    if (!raw || n != 16)
        return -1;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s%s", key, guid);
    unsigned char md[20];
    unsigned int mdlen = 0;
    if (EVP_Digest(buf, strlen(buf), md, &mdlen, EVP_sha1(), NULL) != 1 || mdlen != 20)
        return -1;
    char *b = base64_encode(md, 20);
    snprintf(out, 29, "%s", b);
    free(b);
    return 0;
}

static void conn_free(struct wsconn *c)
{
    if (c->timer)
        event_free(c->timer);
    ws_reader_free(&c->rd);
    if (c->u)
        http_upgraded_close(c->u);
    free(c);
}

/* The connection is over: the owner hears it, then it is freed. */
static void conn_end(struct wsconn *c)
{
    if (c->dead)
        return;
    c->dead = 1;
    if (!c->closing && c->ops->closed)
        c->ops->closed(c->arg);
    c->closing = 1;
    if (!c->in_feed)
        conn_free(c);
}

static void put_frame(struct wsconn *c, int op, const void *data, size_t len)
{
    uint8_t h[WS_MAX_HEADER];
    size_t hl = ws_header_build(h, op, len, NULL);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add(out, h, hl);
    if (len)
        evbuffer_add(out, data, len);
}

/* Queues a close frame and ends the connection once it is out: at once if await_peer is 0 or
 * the peer's own close came already, else when the peer's close frame comes (or it hangs up),
 * and after CLOSE_LINGER_S in any case. */
static void send_close(struct wsconn *c, int code, const char *reason, int await_peer)
{
    uint8_t b[2 + 123];
    size_t rl = reason ? strlen(reason) : 0;
    if (rl > 123)
        rl = 123;
    b[0] = (uint8_t)(code >> 8);
    b[1] = (uint8_t)code;
    if (rl)
        memcpy(b + 2, reason, rl);
    put_frame(c, WS_OP_CLOSE, b, 2 + rl);
    c->closing = 1;
    c->await_peer = await_peer && !c->peer_closed;
    if (c->await_peer) {
        /* paused or not, what comes is read now, and dropped, until the close frame */
        bufferevent_enable(c->bev, EV_READ);
        if (evbuffer_get_length(bufferevent_get_input(c->bev)))
            bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
    } else {
        bufferevent_disable(c->bev, EV_READ);
    }
    struct timeval tv = {CLOSE_LINGER_S, 0};
    evtimer_add(c->timer, &tv);
}

static int on_msg(void *arg, int op, const uint8_t *data, size_t len, int fin, int code)
{
    struct wsconn *c = arg;
    if (c->dead)
        return 0;
    if (c->closing) {
        if (op == WS_OP_CLOSE && c->await_peer) {
            c->peer_closed = 1;
            if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
                conn_end(c); /* both closes are out: freed once the feed returns */
        }
        return 0;
    }
    switch (op) {
    case WS_OP_BINARY:
        if (len && c->ops->binary)
            c->ops->binary(c->arg, data, len);
        break;
    case WS_OP_TEXT:
        if (c->ops->text)
            c->ops->text(c->arg, (const char *)data, len);
        break;
    case WS_OP_PING: put_frame(c, WS_OP_PONG, data, len); break;
    case WS_OP_PONG: break;
    case WS_OP_CLOSE:
        /* The peer is done: it hears the same code back, and the owner that it is over. */
        c->peer_closed = 1;
        if (c->ops->closed)
            c->ops->closed(c->arg);
        send_close(c, code == 1005 ? WS_CLOSE_NORMAL : code, NULL, 0);
        break;
    }
    return 0;
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct wsconn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    c->last_rx_ms = now_ms_monotonic();
    while (!c->dead && evbuffer_get_length(in) > 0) {
        if (c->closing && (!c->await_peer || c->peer_closed))
            break;
        if (!c->closing && c->paused)
            break;
        if (!c->closing && evbuffer_get_length(bufferevent_get_output(bev)) > OUT_MAX) {
            c->out_full = 1;
            bufferevent_disable(bev, EV_READ);
            break;
        }
        uint8_t buf[16384];
        int n = evbuffer_remove(in, buf, sizeof(buf));
        if (n <= 0)
            break;
        c->in_feed = 1;
        int rc = ws_reader_feed(&c->rd, buf, (size_t)n, on_msg, c);
        c->in_feed = 0;
        if (c->dead) {
            conn_free(c);
            return;
        }
        if (rc && c->closing) {
            conn_end(c); /* garbage after our close frame: no close of its own will come */
            return;
        }
        if (rc) {
            log_info(NULL, "ws.protocol_error", "close=%d", rc);
            if (c->ops->closed)
                c->ops->closed(c->arg);
            send_close(c, rc, rc == WS_CLOSE_TOO_BIG ? "message too big" : "protocol violation", 0);
        }
    }
    if (c->closing)
        evbuffer_drain(in, evbuffer_get_length(in));
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct wsconn *c = arg;
    if (c->closing) {
        if (!c->await_peer || c->peer_closed)
            conn_end(c); /* the close frame is out (and the peer's came, if awaited) */
        return;
    }
    if (c->out_full) {
        c->out_full = 0;
        if (!c->paused) {
            bufferevent_enable(bev, EV_READ);
            if (evbuffer_get_length(bufferevent_get_input(bev)))
                bufferevent_trigger(bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
        }
    }
    if (c->want_drain) {
        c->want_drain = 0;
        if (c->ops->drained)
            c->ops->drained(c->arg);
    }
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct wsconn *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        conn_end(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct wsconn *c = arg;
    if (c->closing) {
        conn_end(c); /* the peer never took the close frame */
        return;
    }
    uint64_t now = now_ms_monotonic();
    if (now - c->last_rx_ms >= (uint64_t)WSCONN_DEAD_S * 1000) {
        if (c->ops->closed)
            c->ops->closed(c->arg);
        send_close(c, WS_CLOSE_GOING_AWAY, "no sign of life", 0);
        return;
    }
    put_frame(c, WS_OP_PING, NULL, 0);
    struct timeval tv = {WSCONN_PING_S, 0};
    evtimer_add(c->timer, &tv);
}

/* The server is freeing the connection under us (shutdown). */
static void on_gone(void *arg)
{
    struct wsconn *c = arg;
    c->bev = NULL;
    if (!c->dead) {
        c->dead = 1;
        if (!c->closing && c->ops->closed)
            c->ops->closed(c->arg);
        c->closing = 1;
    }
    if (!c->in_feed) {
        /* freed on the next turn: the server is inside its own free */
        event_free(c->timer);
        c->timer = NULL;
        ws_reader_free(&c->rd);
        http_upgraded_close(c->u);
        free(c);
    }
}

struct wsconn *wsconn_accept(struct event_base *base, struct http_req *r, const char *accept,
                             const char *protocol, const struct wsconn_ops *ops, void *arg)
{
    struct wsconn *c = xcalloc(1, sizeof(*c));
    char h_accept[64], h_proto[160];
    snprintf(h_accept, sizeof(h_accept), "Sec-WebSocket-Accept: %s", accept);
    const char *headers[5] = {"Upgrade: websocket", "Connection: Upgrade", h_accept, NULL, NULL};
    if (protocol) {
        snprintf(h_proto, sizeof(h_proto), "Sec-WebSocket-Protocol: %s", protocol);
        headers[3] = h_proto;
    }
    c->u = http_req_upgrade(r, headers, on_gone, c);
    if (!c->u) {
        free(c);
        return NULL;
    }
    c->bev = http_upgraded_bev(c->u);
    c->ops = ops;
    c->arg = arg;
    ws_reader_init(&c->rd, 1, WSCONN_MAX_FRAME, WSCONN_MAX_TEXT);
    c->last_rx_ms = now_ms_monotonic();
    c->timer = evtimer_new(base, on_timer, c);
    struct timeval tv = {WSCONN_PING_S, 0};
    evtimer_add(c->timer, &tv);
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    /* Bytes the client sent right behind its handshake are already in the input. */
    if (evbuffer_get_length(bufferevent_get_input(c->bev)))
        bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
    return c;
}

void wsconn_send(struct wsconn *c, int opcode, const void *data, size_t len)
{
    if (c->closing || c->dead || !c->bev)
        return;
    put_frame(c, opcode, data, len);
}

size_t wsconn_backlog(struct wsconn *c)
{
    return c->bev ? evbuffer_get_length(bufferevent_get_output(c->bev)) : 0;
}

void wsconn_on_drain(struct wsconn *c)
{
    if (wsconn_backlog(c) == 0) {
        if (c->ops->drained)
            c->ops->drained(c->arg);
        return;
    }
    c->want_drain = 1;
}

void wsconn_pause(struct wsconn *c, int on)
{
    if (c->closing || c->dead || !c->bev || c->paused == on)
        return;
    c->paused = on;
    if (on) {
        bufferevent_disable(c->bev, EV_READ);
    } else if (!c->out_full) {
        bufferevent_enable(c->bev, EV_READ);
        if (evbuffer_get_length(bufferevent_get_input(c->bev)))
            bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
    }
}

static const struct wsconn_ops no_ops;

void wsconn_close(struct wsconn *c, int code, const char *reason)
{
    if (c->dead || !c->bev) {
        c->closing = 1;
        conn_end(c);
        return;
    }
    if (!c->closing)
        send_close(c, code, reason, 1);
    c->closing = 1;
    c->ops = &no_ops; /* the owner is gone: no more calls */
}
