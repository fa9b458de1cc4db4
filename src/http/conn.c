/*
 * The connection layer under evhttp: see conn.h. Each connection's input buffer has a callback
 * that sees every byte as the socket is read, before evhttp parses it, and follows the
 * requests going by:
 *
 *   IDLE   between requests (nothing of the next one yet)
 *   HEAD   the header block is arriving: copied aside (bounded) and looked at when it ends;
 *          the header deadline runs
 *   HELD   the headers announced a body that does not fit the budget yet: the socket is not
 *          read until the connection's turn (or the wait ends and the connection is closed)
 *   BODY   the body is arriving (a Content-Length counted down; a chunked body until its
 *          handler has the request)
 *   BUSY   the request is with its handler (or had no body)
 *   REFUSED its Content-Length is over the route's limit: the header block never reaches
 *          evhttp; the 413 goes straight to the socket, and what the client still sends is
 *          dropped for a moment before the connection closes
 *
 * The layer learns a connection's evhttp_connection one turn of the loop after making its
 * bufferevent (evhttp sets it as the bufferevent's callback argument) and owns its close
 * callback from then on: that is how it hears a connection end, and with the evhttp_connection
 * it closes one itself (evhttp_connection_free) at the deadline, the cap or the end of a wait.
 */
#include "http/conn.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/http.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/util.h"

enum cstate { C_IDLE, C_HEAD, C_HELD, C_BODY, C_BUSY, C_REFUSED };

/* A refused request's body is dropped for this long (or this much) before the close, so that
 * the client, still sending, reads the answer instead of a reset. */
#define LINGER_MS 2000
#define LINGER_MAX ((size_t)16 << 20)
/* Largest write to a connection's socket in one go. */
#define CONN_MAX_WRITE ((size_t)1 << 20)
/* A body of known length is pulled from the socket in reads of this size (libevent 2.1 reads
 * 4 KiB at a time), at most PULL_TURN in one turn of the loop. With libevent's chain header
 * a read's buffer is 128 KiB, below the daemon's mmap threshold (256 KiB): it comes from the
 * heap, reused, instead of fresh pages that fault in and are unmapped again each time. */
#define PULL_READ (((size_t)128 << 10) - 64)
#define PULL_TURN ((size_t)8 << 20)

struct conn {
    struct conns *cs;
    struct bufferevent *bev;
    struct evhttp_connection *evcon; /* known from the turn after the bufferevent was made */
    struct evbuffer_cb_entry *in_cb;
    TAILQ_ENTRY(conn) all;  /* least recently active first */
    TAILQ_ENTRY(conn) line; /* waiting for room in the body budget */
    TAILQ_ENTRY(conn) pend; /* not attached to its evhttp_connection yet */
    enum cstate state;
    int inflight; /* requests with a handler */
    int waiting;
    int pending;
    int kill; /* to be closed by the timer (a refusal that could not be sent, too much dropped) */
    int tls;  /* the bufferevent is OpenSSL's: its input holds what was decrypted */
    int pulling; /* pull_body is reading into the input */
    size_t reserved;
    int64_t body_left; /* -1: chunked, until its handler has it */
    size_t need;       /* what a HELD body will reserve */
    size_t dropped;    /* by a REFUSED connection */
    char *head;
    size_t head_len, head_cap;
    struct event *timer;
    void (*gone)(void *);
    void *gone_arg;
};

TAILQ_HEAD(conn_list, conn);

struct conns {
    struct event_base *base;
    struct conn_limits lim;
    conn_accept_fn accept_fn;
    void *accept_ctx;
    conn_body_limit_fn limit_fn;
    void *limit_ctx;
    SSL_CTX *tls_ctx; /* for conns_new_tls_bev (not owned) */
    struct conn_list all;
    struct conn_list line;
    struct conn_list pend;
    struct event *attach;
    int open;
    int waiting;
    int paused;
    size_t body_used;
    struct http_conn_stats st; /* the counters; open, waiting and body_bytes filled on demand */
};

static void conn_drop(struct conn *c);

/* Closes c now. c is freed (through the close callback) unless not attached yet. */
static void conn_close(struct conn *c)
{
    if (c->evcon) {
        evhttp_connection_free(c->evcon);
        return;
    }
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct conns *cs = c->cs;
    if (c->kill || c->state == C_REFUSED) {
        conn_close(c);
    } else if (c->state == C_HEAD) {
        cs->st.header_timeouts++;
        log_info(NULL, "http.header_timeout", "seconds=%d", cs->lim.header_timeout_s);
        conn_close(c);
    } else if (c->state == C_HELD) {
        cs->st.wait_timeouts++;
        log_warn(NULL, "http.body_wait_timeout", "seconds=%d need=%zu budget=%zu used=%zu",
                 cs->lim.wait_s, c->need, cs->lim.body_budget, cs->body_used);
        conn_close(c);
    }
}

static void arm(struct conn *c, int ms)
{
    if (!c->timer)
        c->timer = evtimer_new(c->cs->base, on_timer, c);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

static void disarm(struct conn *c)
{
    if (c->timer)
        evtimer_del(c->timer);
}

static void touch(struct conn *c)
{
    TAILQ_REMOVE(&c->cs->all, c, all);
    TAILQ_INSERT_TAIL(&c->cs->all, c, all);
}

static void head_reset(struct conn *c)
{
    free(c->head);
    c->head = NULL;
    c->head_len = c->head_cap = 0;
}

static void release(struct conn *c)
{
    c->cs->body_used -= c->reserved;
    c->reserved = 0;
}

static int fits(struct conns *cs, size_t need)
{
    return cs->body_used == 0 || cs->body_used + need <= cs->lim.body_budget;
}

static void reserve(struct conn *c)
{
    c->reserved = c->need;
    c->cs->body_used += c->need;
}

/* Lets the connections waiting in line in, first come first served, while they fit. */
static void admit_waiting(struct conns *cs)
{
    struct conn *c;
    while ((c = TAILQ_FIRST(&cs->line)) && !c->inflight && fits(cs, c->need)) {
        TAILQ_REMOVE(&cs->line, c, line);
        c->waiting = 0;
        cs->waiting--;
        reserve(c);
        disarm(c);
        if (c->state == C_HELD)
            c->state = c->body_left == 0 ? C_BUSY : C_BODY;
        bufferevent_enable(c->bev, EV_READ);
    }
}

static void leave_line(struct conn *c)
{
    if (!c->waiting)
        return;
    TAILQ_REMOVE(&c->cs->line, c, line);
    c->waiting = 0;
    c->cs->waiting--;
}

/* A held body that evhttp has (or will have) whole anyway: counted, not held any longer. */
static void take_whole(struct conn *c)
{
    leave_line(c);
    reserve(c);
    disarm(c);
    c->state = C_BUSY;
    bufferevent_enable(c->bev, EV_READ);
}

/* ------------------------------------------------------------------ the header block */

/* Where the block that starts at s (n bytes) ends, counting its empty line; 0 if not yet. */
static size_t block_end(const char *s, size_t n, size_t from)
{
    for (size_t i = from; i < n; i++) {
        if (s[i] != '\n')
            continue;
        if (i >= 1 && s[i - 1] == '\n')
            return i + 1;
        if (i >= 2 && s[i - 1] == '\r' && s[i - 2] == '\n')
            return i + 1;
    }
    return 0;
}

/* evhttp reads a body for these methods (evhttp_method_may_have_body, libevent 2.1.12). */
static int may_have_body(const char *m, size_t n)
{
    static const char *const with[] = {"POST",   "PUT",     "PATCH",  "GET",
                                       "DELETE", "OPTIONS", "CONNECT"};
    for (size_t i = 0; i < sizeof(with) / sizeof(with[0]); i++)
        if (strlen(with[i]) == n && memcmp(with[i], m, n) == 0)
            return 1;
    return 0;
}

/* A header's value the way evhttp keeps it: leading spaces and trailing white space gone. */
static void header_value(const char *v, size_t n, char *out, size_t cap)
{
    while (n && *v == ' ')
        v++, n--;
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r' || v[n - 1] == '\n'))
        n--;
    if (n >= cap)
        n = cap - 1;
    memcpy(out, v, n);
    out[n] = '\0';
}

struct head_info {
    char method[16];
    char target[2048];
    int body;        /* the method takes a body */
    int chunked;     /* Transfer-Encoding: chunked */
    int have_length; /* a valid Content-Length */
    uint64_t length;
};

static void parse_head(const char *s, size_t n, struct head_info *h)
{
    memset(h, 0, sizeof(*h));
    while (n && (*s == '\r' || *s == '\n'))
        s++, n--;
    const char *eol = memchr(s, '\n', n);
    size_t ll = eol ? (size_t)(eol - s) : n;
    const char *sp = memchr(s, ' ', ll);
    if (sp) {
        size_t ml = (size_t)(sp - s);
        if (ml < sizeof(h->method)) {
            memcpy(h->method, s, ml);
            h->method[ml] = '\0';
            h->body = may_have_body(s, ml);
        }
        const char *t = sp + 1;
        const char *te = memchr(t, ' ', ll - (size_t)(t - s));
        size_t tl = te ? (size_t)(te - t) : ll - (size_t)(t - s);
        header_value(t, tl, h->target, sizeof(h->target));
    }
    int seen_length = 0;
    const char *p = eol ? eol + 1 : s + n;
    const char *end = s + n;
    while (p < end) {
        const char *le = memchr(p, '\n', (size_t)(end - p));
        size_t len = le ? (size_t)(le - p) : (size_t)(end - p);
        const char *colon = memchr(p, ':', len);
        if (colon) {
            size_t nl = (size_t)(colon - p);
            char v[64];
            if (nl == 14 && strncasecmp(p, "Content-Length", 14) == 0 && !seen_length) {
                seen_length = 1; /* evhttp takes the first */
                header_value(colon + 1, len - nl - 1, v, sizeof(v));
                char *e;
                errno = 0;
                long long x = strtoll(v, &e, 10);
                if (v[0] && !*e && x >= 0 && errno == 0) {
                    h->have_length = 1;
                    h->length = (uint64_t)x;
                }
            } else if (nl == 17 && strncasecmp(p, "Transfer-Encoding", 17) == 0) {
                header_value(colon + 1, len - nl - 1, v, sizeof(v));
                if (strcasecmp(v, "chunked") == 0)
                    h->chunked = 1;
            }
        }
        p = le ? le + 1 : end;
    }
}

/* A refused TLS connection's bufferevent reports its end (or evhttp's timeout): it closes. */
static void on_refused_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (!c->kill) {
        c->kill = 1;
        arm(c, 0);
    }
}

/* An error answer in the API's JSON, written straight to the socket (on TLS: through the
 * bufferevent, whose callbacks the layer takes from evhttp until the close): no handler sees
 * this request. False if it cannot go out whole now (an earlier answer still waiting to be
 * sent, a full socket). */
static int send_refusal(struct conn *c, const char *status, const char *code, const char *message)
{
    char msg[768];
    char body[512];
    int bl = snprintf(body, sizeof(body), "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}\n",
                      code, message);
    int ml = snprintf(msg, sizeof(msg),
                      "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                      "Connection: close\r\n\r\n%s",
                      status, bl, body);
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    if (fd < 0 || ml >= (int)sizeof(msg) ||
        evbuffer_get_length(bufferevent_get_output(c->bev)) != 0)
        return 0;
    if (c->tls) {
        /* evhttp must not see what follows (its write callback would finish a response it
         * never started); the connection is the layer's until it closes */
        if (!c->evcon)
            return 0;
        bufferevent_setcb(c->bev, NULL, NULL, on_refused_event, c);
        if (bufferevent_write(c->bev, msg, (size_t)ml) < 0)
            return 0;
        bufferevent_enable(c->bev, EV_READ | EV_WRITE);
        return 1;
    }
    if (send(fd, msg, (size_t)ml, MSG_NOSIGNAL | MSG_DONTWAIT) != ml)
        return 0;
    shutdown(fd, SHUT_WR);
    return 1;
}

/* Refuses the request whose header block is being read: the answer goes out, what evhttp has
 * of the block stays an unfinished header for ever, and what follows is dropped until the
 * connection closes (LINGER_MS later). */
static void refuse(struct conn *c, const char *status, const char *code, const char *message)
{
    head_reset(c);
    disarm(c);
    c->state = C_REFUSED;
    if (!send_refusal(c, status, code, message))
        c->kill = 1;
    arm(c, c->kill ? 0 : LINGER_MS);
}

/* The header block is complete: what may its body do? Returns -1 if the request is refused
 * (the caller keeps the block from evhttp). */
static int head_done(struct conn *c)
{
    struct conns *cs = c->cs;
    struct head_info h;
    parse_head(c->head, c->head_len, &h);
    head_reset(c);
    disarm(c);
    c->need = 0;
    c->body_left = 0;
    if (h.body && (h.chunked || (h.have_length && h.length > 0))) {
        size_t limit =
            cs->limit_fn ? cs->limit_fn(h.method, h.target, cs->limit_ctx) : cs->lim.max_body;
        if (limit > cs->lim.max_body)
            limit = cs->lim.max_body;
        if (!h.chunked && h.length > limit) {
            cs->st.refused++;
            log_info(NULL, "http.body_too_large", "method=%s length=%" PRIu64 " limit=%zu",
                     h.method, h.length, limit);
            char m[160];
            snprintf(m, sizeof(m),
                     "request body is %" PRIu64 " bytes; the limit for this route is %zu", h.length,
                     limit);
            refuse(c, "413 Payload Too Large", "payload_too_large", m);
            return -1;
        }
        /* evhttp has not parsed these headers yet: a chunked body is cut at this */
        if (c->evcon)
            evhttp_connection_set_max_body_size(c->evcon, (ev_ssize_t)limit);
        if (h.chunked) {
            c->need = limit;
            c->body_left = -1;
        } else {
            c->need = (size_t)h.length;
            c->body_left = (int64_t)h.length;
        }
    }
    if (c->need == 0) {
        c->state = C_BUSY;
        return 0;
    }
    if (!c->inflight && TAILQ_EMPTY(&cs->line) && fits(cs, c->need)) {
        reserve(c);
        c->state = C_BODY;
        return 0;
    }
    /* no room yet: the socket is not read until there is (what was read already goes on) */
    c->state = C_HELD;
    c->waiting = 1;
    cs->waiting++;
    TAILQ_INSERT_TAIL(&cs->line, c, line);
    bufferevent_disable(c->bev, EV_READ);
    arm(c, cs->lim.wait_s * 1000);
    return 0;
}

/* Bytes [pos, pos + n) of buf belong to a header block: copied aside while it lasts. Returns
 * how many of them do (all n unless it ended). */
static size_t head_take(struct conn *c, struct evbuffer *buf, size_t pos, size_t n, int *ended)
{
    *ended = 0;
    size_t cap = c->cs->lim.max_header + 1; /* one byte more than a block may have */
    if (c->head_len + n > cap)
        n = cap - c->head_len;
    if (n == 0)
        return 0;
    if (c->head_len + n > c->head_cap) {
        size_t nc = c->head_cap ? c->head_cap : 512;
        while (nc < c->head_len + n)
            nc *= 2;
        c->head = xrealloc(c->head, nc);
        c->head_cap = nc;
    }
    struct evbuffer_ptr p;
    if (evbuffer_ptr_set(buf, &p, pos, EVBUFFER_PTR_SET) < 0)
        return n;
    ev_ssize_t got = evbuffer_copyout_from(buf, &p, c->head + c->head_len, n);
    if (got <= 0)
        return n;
    size_t old = c->head_len;
    c->head_len += (size_t)got;
    /* empty lines before a request line are not its end */
    size_t skip = 0;
    while (skip < c->head_len && (c->head[skip] == '\r' || c->head[skip] == '\n'))
        skip++;
    size_t from = old > skip ? old : skip;
    size_t e = block_end(c->head, c->head_len, from);
    if (e) {
        c->head_len = e;
        *ended = 1;
        return e - old;
    }
    return (size_t)got;
}

/*
 * The rest of a body whose length is known, read straight into the connection's input in big
 * reads (each one comes back through on_input, which counts it). All of it fits the budget
 * already (C_BODY), and no byte past it is read: the next request's are libevent's to read.
 * A socket with nothing more, at its end or failing is left to libevent's next read.
 */
static void pull_body(struct conn *c, struct evbuffer *buf)
{
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    if (fd < 0)
        return;
    c->pulling = 1;
    size_t turn = 0;
    while (c->state == C_BODY && c->body_left > 0 && !c->kill && turn < PULL_TURN) {
        size_t want = (uint64_t)c->body_left < PULL_READ ? (size_t)c->body_left : PULL_READ;
        struct evbuffer_iovec v;
        if (evbuffer_reserve_space(buf, (ev_ssize_t)want, &v, 1) != 1)
            break;
        ssize_t n = recv(fd, v.iov_base, want, MSG_DONTWAIT);
        if (n <= 0)
            break;
        v.iov_len = (size_t)n;
        if (evbuffer_commit_space(buf, &v, 1) < 0)
            break;
        turn += (size_t)n;
        if ((size_t)n < want)
            break;
    }
    c->pulling = 0;
}

/* Bytes were added to a connection's input (read from its socket), evhttp has not seen them. */
static void on_input(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    struct conn *c = arg;
    struct conns *cs = c->cs;
    if (!info->n_added)
        return;
    size_t len = evbuffer_get_length(buf);
    size_t pos = info->n_added <= len ? len - info->n_added : 0;
    if (c->state == C_REFUSED || c->kill) {
        /* nothing more reaches evhttp (draining calls this again, with nothing added) */
        c->dropped += len;
        evbuffer_drain(buf, len);
        if (c->dropped > LINGER_MAX && !c->kill) {
            c->kill = 1;
            arm(c, 0);
        }
        return;
    }
    while (pos < len && !c->kill) {
        if (c->state == C_IDLE || c->state == C_BUSY) {
            if (!c->inflight)
                release(c); /* an earlier request evhttp answered by itself */
            c->state = C_HEAD;
            arm(c, cs->lim.header_timeout_s * 1000);
        }
        if (c->state == C_HEAD) {
            int ended;
            size_t n = head_take(c, buf, pos, len - pos, &ended);
            pos += n;
            if (!ended && c->head_len > cs->lim.max_header) {
                /* refused here, before evhttp's own (HTML) refusal of a long line */
                cs->st.refused++;
                char m[128];
                snprintf(m, sizeof(m), "the request line and headers are over %zu bytes",
                         cs->lim.max_header);
                refuse(c, "400 Bad Request", "invalid_request", m);
                evbuffer_drain(buf, len);
                return;
            }
            if (ended && head_done(c) < 0) {
                /* what evhttp has of the block stays an unfinished header for ever */
                evbuffer_drain(buf, len);
                return;
            }
            continue;
        }
        /* C_BODY or C_HELD (bytes read before the socket stopped being read) */
        size_t n = len - pos;
        if (c->body_left >= 0 && (uint64_t)n > (uint64_t)c->body_left)
            n = (size_t)c->body_left;
        pos += n;
        if (c->body_left > 0) {
            c->body_left -= (int64_t)n;
            if (c->body_left == 0 && c->state == C_BODY)
                c->state = C_BUSY;
        }
        if (c->body_left < 0)
            break; /* chunked: all of it is body until the handler has the request */
        if (c->state == C_HELD) {
            if (c->body_left == 0)
                take_whole(c); /* all of it came with the headers: nothing left to hold */
            else
                break; /* the rest is the next request's, seen when this one is let in */
        }
    }
    if (c->state == C_BODY && c->body_left > 0 && !c->tls && !c->pulling && !c->kill)
        pull_body(c, buf);
    touch(c);
}

/* ------------------------------------------------------------------ lifetime */

static void conn_drop(struct conn *c)
{
    struct conns *cs = c->cs;
    if (c->in_cb)
        evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->in_cb);
    if (c->pending)
        TAILQ_REMOVE(&cs->pend, c, pend);
    leave_line(c);
    release(c);
    if (c->timer)
        event_free(c->timer);
    head_reset(c);
    TAILQ_REMOVE(&cs->all, c, all);
    cs->open--;
    free(c);
    if (cs->paused && cs->open < cs->lim.max_conns) {
        cs->paused = 0;
        cs->accept_fn(1, cs->accept_ctx);
    }
    admit_waiting(cs);
}

static void on_closed(struct evhttp_connection *evcon, void *arg)
{
    struct conn *c = arg;
    evhttp_connection_set_closecb(evcon, NULL, NULL);
    void (*gone)(void *) = c->gone;
    c->gone = NULL;
    if (gone)
        gone(c->gone_arg);
    conn_drop(c);
}

/* A TCP connection's answers go out as they are written. With Nagle's algorithm a write made
 * while an earlier segment is unacknowledged waits for its ACK, which the client may delay by
 * up to 40 ms: every TLS answer paid that (its header block and body are records of their
 * own), and a streamed answer's pieces or a terminal's echo could. */
static void no_delay(struct bufferevent *bev)
{
    evutil_socket_t fd = bufferevent_getfd(bev);
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&ss, &len) < 0 ||
        (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
        return;
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
        log_warn(NULL, "http.nodelay_failed", "error=\"%s\"", strerror(errno));
}

/* One turn after the bufferevents were made: evhttp has set each one up by now, with its
 * evhttp_connection as the callback argument (or has let it go again). */
static void on_attach(evutil_socket_t fd, short what, void *arg)
{
    struct conns *cs = arg;
    struct conn *c;
    while ((c = TAILQ_FIRST(&cs->pend))) {
        TAILQ_REMOVE(&cs->pend, c, pend);
        c->pending = 0;
        struct bufferevent *bev = c->bev;
        bufferevent_data_cb rcb = NULL;
        bufferevent_event_cb ecb = NULL;
        void *cbarg = NULL;
        bufferevent_getcb(bev, &rcb, NULL, &ecb, &cbarg);
        if (!rcb && !ecb) {
            conn_drop(c); /* evhttp could not take the connection and freed it */
        } else {
            c->evcon = cbarg;
            evhttp_connection_set_closecb(c->evcon, on_closed, c);
            no_delay(bev);
        }
        bufferevent_decref(bev);
    }
}

/* At the cap: the connection idle the longest makes room, if there is one. */
static void evict_idle(struct conns *cs)
{
    struct conn *c;
    TAILQ_FOREACH(c, &cs->all, all)
    {
        if (c->state == C_IDLE && !c->inflight && c->evcon && !c->kill) {
            cs->st.evicted++;
            conn_close(c);
            return;
        }
    }
}

/* Takes bev (a connection evhttp is accepting) into the layer; returns it. */
static struct bufferevent *conn_add(struct conns *cs, struct bufferevent *bev, int tls)
{
    /* A download goes out in writes this big, not libevent's default of 16 KiB. */
    bufferevent_set_max_single_write(bev, CONN_MAX_WRITE);
    struct conn *c = xcalloc(1, sizeof(*c));
    c->cs = cs;
    c->bev = bev;
    c->tls = tls;
    c->in_cb = evbuffer_add_cb(bufferevent_get_input(bev), on_input, c);
    TAILQ_INSERT_TAIL(&cs->all, c, all);
    cs->open++;
    /* kept until attached, so that a bufferevent evhttp lets go at once is still there */
    bufferevent_incref(bev);
    c->pending = 1;
    TAILQ_INSERT_TAIL(&cs->pend, c, pend);
    event_active(cs->attach, EV_TIMEOUT, 0);
    if (cs->open >= cs->lim.max_conns)
        evict_idle(cs); /* the connection idle the longest makes room for the next one */
    if (cs->open >= cs->lim.max_conns && !cs->paused) {
        /* none was idle: accepting waits for a close */
        cs->paused = 1;
        cs->st.paused++;
        cs->accept_fn(0, cs->accept_ctx);
    }
    if (tls) {
        /* The handshake is the first header block's start: it and that block must be done by
         * the header deadline, so a client that connects and never speaks TLS is closed like a
         * slow plain one (no decrypted byte would ever start the clock). */
        c->state = C_HEAD;
        arm(c, cs->lim.header_timeout_s * 1000);
    }
    return bev;
}

struct bufferevent *conns_new_bev(struct event_base *base, void *arg)
{
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    return bev ? conn_add(arg, bev, 0) : NULL;
}

struct bufferevent *conns_new_tls_bev(struct event_base *base, void *arg)
{
    struct conns *cs = arg;
    if (!cs->tls_ctx)
        return NULL;
    SSL *ssl = SSL_new(cs->tls_ctx);
    if (!ssl)
        return NULL;
    /* ssl is freed with the bufferevent (libevent 2.1 leaves it to us if that fails) */
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        return NULL;
    }
    /* A client that closes without a TLS close_notify has just gone, like a plain one. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return conn_add(cs, bev, 1);
}

static struct conn *find(struct conns *cs, struct evhttp_connection *evcon)
{
    struct conn *c;
    TAILQ_FOREACH_REVERSE(c, &cs->all, conn_list, all)
    {
        if (c->evcon == evcon)
            return c;
    }
    return NULL;
}

int conns_request_begin(struct conns *cs, struct evhttp_connection *evcon, void (*gone)(void *arg),
                        void *arg)
{
    struct conn *c = evcon ? find(cs, evcon) : NULL;
    if (!c)
        return 0;
    c->inflight++;
    c->gone = gone;
    c->gone_arg = arg;
    if (c->state == C_HELD)
        take_whole(c);
    if (c->state == C_BODY) /* a chunked body: evhttp has all of it */
        c->state = C_BUSY;
    touch(c);
    return 1;
}

void conns_upgrade(struct conns *cs, struct evhttp_connection *evcon, void (*gone)(void *arg),
                   void *arg)
{
    struct conn *c = evcon ? find(cs, evcon) : NULL;
    if (!c)
        return;
    c->gone = gone;
    c->gone_arg = arg;
    if (c->in_cb) {
        evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->in_cb);
        c->in_cb = NULL;
    }
    disarm(c);
    release(c);
    c->state = C_BUSY; /* with its request in flight for good: never idle */
    touch(c);
    admit_waiting(cs);
}

void conns_request_end(struct conns *cs, struct evhttp_connection *evcon)
{
    struct conn *c = evcon ? find(cs, evcon) : NULL;
    if (!c)
        return;
    c->gone = NULL;
    if (c->inflight > 0)
        c->inflight--;
    if (!c->inflight) {
        release(c);
        if (c->state == C_BUSY)
            c->state = C_IDLE;
    }
    touch(c);
    admit_waiting(cs);
}

struct conns *conns_new(struct event_base *base, const struct conn_limits *lim,
                        conn_accept_fn accept_fn, void *accept_ctx)
{
    struct conns *cs = xcalloc(1, sizeof(*cs));
    cs->base = base;
    cs->lim = *lim;
    cs->accept_fn = accept_fn;
    cs->accept_ctx = accept_ctx;
    TAILQ_INIT(&cs->all);
    TAILQ_INIT(&cs->line);
    TAILQ_INIT(&cs->pend);
    cs->attach = event_new(base, -1, 0, on_attach, cs);
    return cs;
}

/* After evhttp_free: evhttp closed every connection it had (and so dropped their records);
 * what is left was never attached. */
void conns_free(struct conns *cs)
{
    if (!cs)
        return;
    cs->paused = 0;
    on_attach(-1, 0, cs);
    struct conn *c;
    while ((c = TAILQ_FIRST(&cs->all))) { /* none, unless evhttp freed one without a word */
        TAILQ_REMOVE(&cs->all, c, all);
        if (c->timer)
            event_free(c->timer);
        free(c->head);
        free(c);
    }
    event_free(cs->attach);
    free(cs);
}

void conns_set_limits(struct conns *cs, const struct conn_limits *lim)
{
    cs->lim = *lim;
    admit_waiting(cs);
}

void conns_set_tls(struct conns *cs, SSL_CTX *ctx)
{
    cs->tls_ctx = ctx;
}

void conns_set_body_limit(struct conns *cs, conn_body_limit_fn fn, void *ctx)
{
    cs->limit_fn = fn;
    cs->limit_ctx = ctx;
}

void conns_stats(struct conns *cs, struct http_conn_stats *out)
{
    *out = cs->st;
    out->open = cs->open;
    out->waiting = cs->waiting;
    out->body_bytes = cs->body_used;
}
