/*
 * The egress proxy: see proxy.h. A connection goes through these states, each with at most one
 * timer armed (the connection's one event):
 *
 *   SNIFF     reading the first bytes (client read capped at SNIFF_BUF_MAX, first_bytes_ms)
 *   HANDSHAKE intercepting: the sandbox's TLS handshake (first_bytes_ms), then SNIFF again for
 *             the first request head in the decrypted stream (first_bytes_ms)
 *   LOOKUP    the policy passed; resolving the name (client not read; lookup has its own timeout)
 *   DIAL      connecting to the resolved public addresses in turn (connect_ms over all of them)
 *   UPTLS     intercepting: the TLS handshake with the upstream (connect_ms)
 *   RELAY     both ways; HTTP followed request by request one way, answer by answer the other,
 *             raw once a WebSocket handshake got its 101 (idle_ms)
 *   REFUSING  a 4xx/5xx being flushed, then a lingering close (FLUSH_MS)
 *
 * When intercepting, c->cl and c->up become libevent's OpenSSL filters over the socket
 * bufferevents, so the relay reads and writes plaintext through the same code. What a filter
 * has encrypted waits in its socket bufferevent's output, which the relay counts as queued too
 * (queued()); a callback on that buffer wakes the filter's write callback when it empties, so
 * that a FIN (after a close_notify) never overtakes the bytes before it.
 *
 * Whoever frees a connection does it through conn_close, from any callback; a function that may
 * have closed it returns -1 so that its caller touches nothing more. Bufferevents may be freed
 * from their own callbacks (libevent holds a reference and drops the callbacks).
 */
#include "net/proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "net/netpolicy.h"
#include "net/sniff.h"
#include "net/tlsmitm.h"

/* First bytes kept while deciding: a ClientHello of SNIFF_TLS_HELLO_MAX spread over records
 * (a 5-byte header each), or an HTTP head. Still undecided at this many: refused. */
#define SNIFF_BUF_MAX (2 * SNIFF_TLS_HELLO_MAX)
/* Below this many bytes a head is parsed on every read, so that a non-HTTP start is told at
 * once; above it only once its blank line came, so a head sent a byte at a time costs one parse
 * per read of a short prefix rather than of the whole head. */
#define HEAD_PEEK 64
/* How long a refusal may take to flush and linger before the connection is closed anyway. */
#define FLUSH_MS 5000
/* After an accept error (EMFILE and the like): a pause before accepting again, rather than a
 * loop spinning on a listening socket that stays readable. */
#define ACCEPT_PAUSE_MS 100
/* Requests forwarded and not answered yet, at most (a bit each in conn.pending_head); a client
 * that pipelines more waits, unread, for answers. */
#define PIPELINE_MAX 64

enum conn_state { ST_SNIFF, ST_HANDSHAKE, ST_LOOKUP, ST_DIAL, ST_UPTLS, ST_RELAY, ST_REFUSING };
enum conn_kind { KIND_NONE, KIND_TLS, KIND_HTTP };
/* Where the client-to-upstream byte stream stands. */
enum req_state { RQ_HEAD, RQ_BODY, RQ_CHUNKED, RQ_RAW };
/* Where the upstream-to-client byte stream stands: answers are followed head by head (their
 * status and framing only) so that a tunnel opens on the 101 that answers a WebSocket handshake
 * and nothing else, and a refusal goes out after the answers to the requests before it. */
enum ans_state {
    AN_HEAD,    /* the next answer's head */
    AN_BODY,    /* ans_left bytes of a body */
    AN_CHUNKED, /* a chunked body (ans_chunk) */
    AN_CLOSE,   /* a body that runs to the upstream's close: nothing after it is an answer */
    AN_LOST,    /* unfollowable (malformed, unasked for): relayed as it comes, no tunnel */
    AN_RAW,     /* a tunnel (TLS relayed, or after a WebSocket's 101) */
};

/* A sandbox address with connections here: what it holds, for its caps and fair shares. */
struct peer {
    struct peer *next;
    struct sockaddr_storage addr;
    unsigned conns;   /* connections open from it, in any state */
    unsigned lookups; /* of which waiting for a lookup (ST_LOOKUP) */
};

struct conn {
    struct proxy *p;
    struct conn *prev, *next;
    struct peer *pe;
    enum conn_state state;
    enum conn_kind kind;
    struct sockaddr_storage peer;
    socklen_t peer_len;
    char id[PROXY_ID_MAX];
    struct sockaddr_in orig;
    int orig_port;
    char orig_text[INET_ADDRSTRLEN];
    struct bufferevent *cl, *up;
    /* Intercepting: on the output of the socket bufferevent under cl's (up's) TLS filter. */
    struct evbuffer_cb_entry *cl_drain, *up_drain;
    int mitm;     /* TLS terminated here: cl (and, once dialed, up) are TLS filters */
    int alpn_bad; /* the ClientHello offered ALPN without http/1.1 */
    struct event *timer;
    struct lookup_req *lk;
    /* The pinned target: the name checked, resolved and dialed, and the port. */
    char host[SNIFF_NAME_MAX + 1];
    int port;
    struct sockaddr_in dial[LOOKUP_ADDRS_MAX];
    size_t ndial, dial_next;
    uint64_t deadline_ms;
    int connecting;   /* inside bufferevent_socket_connect */
    int connect_died; /* ... and it reported a failure from there */
    uint64_t last_io_ms;
    size_t sniff_need; /* a ClientHello cannot be complete in fewer bytes */
    size_t scanned;    /* bytes of the current head searched for its end */
    /* The first HTTP head, forwarded once connected. */
    size_t first_head_len;
    enum sniff_body first_body;
    uint64_t first_length;
    enum sniff_upgrade first_upgrade;
    int first_is_head;
    enum req_state rq;
    uint64_t body_left;
    struct sniff_chunked chunk;
    enum ans_state an;
    uint64_t ans_left;
    struct sniff_chunked ans_chunk;
    size_t ans_scanned;    /* bytes of the current answer head searched for its end */
    unsigned pending;      /* requests forwarded whose answers have not ended */
    uint64_t pending_head; /* bit i: the i-th oldest of them is a HEAD (its answer has no body) */
    int ws_wait;           /* the newest of them is a WebSocket handshake: later bytes are held */
    int ws_failed;         /* ... answered with an error: closed once that answer is out */
    int refuse_status;     /* a refusal waiting for the answers before it (refuse_text) */
    char refuse_text[SNIFF_NAME_MAX + 160];
    int cl_paused, up_paused; /* not read: the other side's output is full */
    int cl_eof, up_eof;       /* that side sent its FIN */
    int cl_shut, up_shut;     /* we sent ours to it */
};

/* The handshake rate:
 * A bucket per sandbox address, kept apart from struct peer (which goes with a sandbox's last
 * connection: one connection at a time would refill it each time). An open-addressed table;
 * a slot whose bucket has refilled whole is as good as free and is taken over. */
#define HS_SLOTS 1024
#define HS_PROBES 16

struct hs_bucket {
    uint32_t addr; /* IPv4, network order; 0: never used */
    double tokens;
    uint64_t at_ms;
};

struct proxy {
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *accept_pause;
    struct lookup *lk;
    struct proxy_config cfg;
    struct addr_ranges extra;
    struct proxy_hooks hooks;
    void *ctx;
    struct conn *conns;
    struct peer *peers; /* every address with a connection open */
    unsigned npeers;
    struct proxy_stats stats;
    struct hs_bucket hs[HS_SLOTS]; /* handshake buckets, by sandbox address */
};

/* ---- the handshake rate (see handshake_admit) ---- */

static double hs_rate(const struct proxy *p)
{
    return p->cfg.handshakes_per_s > 0 ? p->cfg.handshakes_per_s : PROXY_HANDSHAKES_PER_S;
}

static double hs_burst(const struct proxy *p)
{
    return p->cfg.handshake_burst > 0 ? p->cfg.handshake_burst : PROXY_HANDSHAKE_BURST;
}

/* The bucket's tokens at now_ms. */
static double hs_refilled(const struct proxy *p, const struct hs_bucket *b, uint64_t now_ms)
{
    double t = b->tokens + (double)(now_ms - b->at_ms) * hs_rate(p) / 1000.0;
    return t < hs_burst(p) ? t : hs_burst(p);
}

/* Takes one handshake from the bucket of peer's address; 0 when it is empty (or, with every
 * slot it may use busy, when there is no bucket for it: refused rather than unlimited). */
static int handshake_admit(struct proxy *p, const struct sockaddr *peer)
{
    if (peer->sa_family != AF_INET)
        return 1; /* sandboxes reach the proxy over IPv4 only */
    uint32_t a = ((const struct sockaddr_in *)peer)->sin_addr.s_addr;
    uint64_t now = now_ms_monotonic();
    unsigned h = (ntohl(a) * 2654435761u) % HS_SLOTS;
    struct hs_bucket *b = NULL, *spare = NULL;
    /* Its own bucket wherever it is along the probes: a spare slot before it must not hand the
     * sandbox a full bucket while its spent one sits further on. */
    for (unsigned i = 0; i < HS_PROBES && !b; i++) {
        struct hs_bucket *s = &p->hs[(h + i) % HS_SLOTS];
        if (s->addr == a)
            b = s;
        else if (!spare && (!s->addr || hs_refilled(p, s, now) >= hs_burst(p)))
            spare = s;
    }
    if (!b && spare) {
        *spare = (struct hs_bucket){.addr = a, .tokens = hs_burst(p), .at_ms = now};
        b = spare;
    }
    if (!b)
        return 0;
    b->tokens = hs_refilled(p, b, now);
    b->at_ms = now;
    if (b->tokens < 1)
        return 0;
    b->tokens -= 1;
    return 1;
}

static void timer_ms(struct conn *c, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    event_add(c->timer, &tv);
}

/* Frees a side's bufferevent (and, under a TLS filter, the socket's with it). */
static void side_free(struct bufferevent **bev, struct evbuffer_cb_entry **drain)
{
    if (*drain) {
        evbuffer_remove_cb_entry(bufferevent_get_output(bufferevent_get_underlying(*bev)), *drain);
        *drain = NULL;
    }
    if (*bev)
        bufferevent_free(*bev);
    *bev = NULL;
}

/* Bytes on their way to bev's peer: in its output and, under a TLS filter, encrypted in the
 * socket bufferevent's. */
static size_t queued(struct bufferevent *bev)
{
    size_t n = evbuffer_get_length(bufferevent_get_output(bev));
    struct bufferevent *raw = bufferevent_get_underlying(bev);
    if (raw)
        n += evbuffer_get_length(bufferevent_get_output(raw));
    return n;
}

/* Sends bev's peer our FIN once all queued for it went out (under TLS, a close_notify first).
 * Returns 1 once sent; 0 while still flushing: bev's write callback comes again when the socket
 * drained (on_raw_drained). */
static int half_close(struct bufferevent *bev)
{
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    if (ssl && !(SSL_get_shutdown(ssl) & SSL_SENT_SHUTDOWN) &&
        evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
        SSL_shutdown(ssl);
        ERR_clear_error(); /* nothing to learn from it, and libevent reads the queue */
    }
    if (queued(bev) > 0)
        return 0;
    shutdown(bufferevent_getfd(bev), SHUT_WR);
    return 1;
}

/* The socket bufferevent under a TLS filter drained: the filter itself would not say so. */
static void on_raw_drained(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    if (info->n_deleted > 0 && evbuffer_get_length(buf) == 0)
        bufferevent_trigger(arg, EV_WRITE, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

static int same_host(const struct sockaddr *a, const struct sockaddr *b);

/* The peer entry of addr, made if it has none; counts one more connection. NULL: no memory. */
static struct peer *peer_get(struct proxy *p, const struct sockaddr *addr, socklen_t len)
{
    struct peer *pe = p->peers;
    while (pe && !same_host((const struct sockaddr *)&pe->addr, addr))
        pe = pe->next;
    if (!pe) {
        pe = calloc(1, sizeof(*pe));
        if (!pe)
            return NULL;
        memcpy(&pe->addr, addr, len);
        pe->next = p->peers;
        p->peers = pe;
        p->npeers++;
    }
    pe->conns++;
    return pe;
}

/* One connection of pe's fewer; the entry goes with its last. */
static void peer_put(struct proxy *p, struct peer *pe)
{
    if (--pe->conns > 0)
        return;
    for (struct peer **pp = &p->peers; *pp; pp = &(*pp)->next)
        if (*pp == pe) {
            *pp = pe->next;
            break;
        }
    p->npeers--;
    free(pe);
}

/* c's lookup ended (answered or cancelled): its sandbox holds one fewer. */
static void lookup_ended(struct conn *c)
{
    if (c->lk && c->pe)
        c->pe->lookups--;
    c->lk = NULL;
}

static void conn_close(struct conn *c)
{
    struct proxy *p = c->p;
    if (c->lk)
        lookup_cancel(c->lk);
    lookup_ended(c);
    if (c->pe)
        peer_put(p, c->pe);
    side_free(&c->cl, &c->cl_drain);
    side_free(&c->up, &c->up_drain);
    if (c->timer)
        event_free(c->timer);
    if (c->prev)
        c->prev->next = c->next;
    else
        p->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    p->stats.active--;
    free(c);
}

static int same_host(const struct sockaddr *a, const struct sockaddr *b)
{
    if (a->sa_family != b->sa_family)
        return 0;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return 0;
}

static void note_queued(struct proxy *p, struct bufferevent *dst)
{
    size_t n = queued(dst);
    if (n > p->stats.queued_max)
        p->stats.queued_max = n;
}

/* ---- refusing ---- */

static const char *status_text(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    default: return "Bad Gateway";
    }
}

static void on_refusing_read(struct bufferevent *bev, void *arg)
{
    /* Read and dropped, so the client is never blocked writing while we write to it, and the
     * close does not reset the connection under an unread answer. */
    struct evbuffer *in = bufferevent_get_input(bev);
    evbuffer_drain(in, evbuffer_get_length(in));
}

static void on_refusing_write(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    if (evbuffer_get_length(bufferevent_get_output(bev)) > 0 || c->cl_shut)
        return;
    if (c->cl_eof && queued(bev) == 0) {
        conn_close(c);
        return;
    }
    /* Lingering close: our FIN now, the socket closed when the client's comes (or FLUSH_MS). */
    if (half_close(bev))
        c->cl_shut = 1;
}

static void on_refusing_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if ((what & BEV_EVENT_EOF) && !c->cl_shut && queued(bev) > 0) {
        c->cl_eof = 1; /* the client is done sending; still flush it the answer */
        bufferevent_disable(bev, EV_READ);
        return;
    }
    conn_close(c);
}

/* Answers an HTTP client with status and text (text NULL: nothing more than what is queued),
 * then closes. Always succeeds in taking over the connection (which stays until flushed). */
static void respond(struct conn *c, int status, const char *text)
{
    if (c->lk) {
        lookup_cancel(c->lk);
        lookup_ended(c);
    }
    side_free(&c->up, &c->up_drain);
    c->state = ST_REFUSING;
    struct evbuffer *in = bufferevent_get_input(c->cl), *out = bufferevent_get_output(c->cl);
    evbuffer_drain(in, evbuffer_get_length(in));
    if (text)
        evbuffer_add_printf(out,
                            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                            status, status_text(status), strlen(text), text);
    bufferevent_setcb(c->cl, on_refusing_read, on_refusing_write, on_refusing_event, c);
    bufferevent_setwatermark(c->cl, EV_READ, 0, 0);
    bufferevent_setwatermark(c->cl, EV_WRITE, 0, 0);
    if (c->cl_eof)
        bufferevent_disable(c->cl, EV_READ);
    else
        bufferevent_enable(c->cl, EV_READ);
    bufferevent_enable(c->cl, EV_WRITE);
    timer_ms(c, FLUSH_MS);
}

/*
 * Refuses the connection (or, kept alive, its current request) and closes it: reported to the
 * denied hook and logged; an HTTP client is answered status (403 for the policy, 400 for what
 * could not be read, 502 for what could not be reached) with a body saying why, after the
 * answers still due to the requests before it; anything else is just closed. c is gone, taken
 * over, or (answers due) reads nothing more from the client on return.
 */
static void refuse(struct conn *c, const char *host, int port, const char *reason, int status)
{
    struct proxy *p = c->p;
    p->stats.denied++;
    log_info(c->id[0] ? c->id : NULL, "proxy.denied", "host=%s port=%d reason=%s", host, port,
             reason);
    if (p->hooks.denied)
        p->hooks.denied(p->ctx, c->id, host, port, reason);
    if (c->kind != KIND_HTTP || !c->cl) {
        conn_close(c);
        return;
    }
    char text[sizeof(c->refuse_text)];
    if (status == 403)
        snprintf(text, sizeof(text),
                 "withruntime: this sandbox's egress policy blocked %s:%d (%s)\n", host, port,
                 reason);
    else if (status == 400)
        snprintf(text, sizeof(text),
                 "withruntime: the egress proxy could not read this request "
                 "(%s)\n",
                 reason);
    else
        snprintf(text, sizeof(text), "withruntime: could not reach %s:%d (%s)\n", host, port,
                 reason);
    if (c->state == ST_RELAY && c->up && !c->up_eof && c->pending > 0 && c->an < AN_CLOSE) {
        /* Kept alive: the answers to the requests before this one go out first (answered()),
         * then the refusal, then the close. Nothing more is read from the client. */
        c->refuse_status = status;
        memcpy(c->refuse_text, text, sizeof(text));
        struct evbuffer *in = bufferevent_get_input(c->cl);
        evbuffer_drain(in, evbuffer_get_length(in));
        bufferevent_disable(c->cl, EV_READ);
        return;
    }
    respond(c, status, text);
}

static void deny(struct conn *c, const char *host, int port, const char *reason)
{
    refuse(c, host, port, reason, 403);
}

/* ---- relaying ---- */

static size_t move(struct conn *c, struct evbuffer *from, struct evbuffer *to, size_t n, int up)
{
    int moved = evbuffer_remove_buffer(from, to, n);
    if (moved <= 0)
        return 0;
    if (up)
        c->p->stats.bytes_up += (uint64_t)moved;
    else
        c->p->stats.bytes_down += (uint64_t)moved;
    return (size_t)moved;
}

/* Forwards the head at the start of in (len bytes) to out: on an intercepted connection through
 * the rewrite_head hook, which may replace it. */
static void forward_head(struct conn *c, struct evbuffer *in, struct evbuffer *out, size_t len)
{
    struct proxy *p = c->p;
    if (c->mitm && p->hooks.rewrite_head) {
        const char *head = (const char *)evbuffer_pullup(in, (ev_ssize_t)len);
        size_t outlen = 0;
        char *repl =
            head ? p->hooks.rewrite_head(p->ctx, c->id, c->host, c->port, head, len, &outlen)
                 : NULL;
        if (repl) {
            evbuffer_drain(in, len);
            evbuffer_add(out, repl, outlen);
            /* It holds a secret's real value: not left in freed memory for the next owner. */
            OPENSSL_cleanse(repl, outlen);
            free(repl);
            p->stats.bytes_up += outlen;
            return;
        }
    }
    move(c, in, out, len, 1);
}

/* Whether the head at the start of in (len bytes) is worth parsing yet: short enough to tell a
 * non-HTTP start, at the size limit (to refuse it), or with its blank line in. */
static int head_ready(struct conn *c, struct evbuffer *in, size_t len)
{
    if (len <= HEAD_PEEK || len > SNIFF_HTTP_HEAD_MAX)
        return 1;
    struct evbuffer_ptr from;
    if (evbuffer_ptr_set(in, &from, c->scanned > 3 ? c->scanned - 3 : 0, EVBUFFER_PTR_SET) < 0)
        return 1;
    struct evbuffer_ptr at = evbuffer_search(in, "\r\n\r\n", 4, &from);
    if (at.pos >= 0)
        return 1;
    c->scanned = len;
    return 0;
}

/* What follows a head that passed. */
static void after_head(struct conn *c, enum sniff_body body, uint64_t length)
{
    c->scanned = 0;
    if (body == SNIFF_BODY_LENGTH && length > 0) {
        c->rq = RQ_BODY;
        c->body_left = length;
    } else if (body == SNIFF_BODY_CHUNKED) {
        c->rq = RQ_CHUNKED;
        sniff_chunked_init(&c->chunk);
    } else {
        c->rq = RQ_HEAD;
    }
}

/* A request head went upstream: its answer is now awaited. A WebSocket handshake holds what the
 * client sends after it until its answer says whether that is a tunnel's bytes (101) or the next
 * request (anything else). */
static void expect_answer(struct conn *c, int is_head, enum sniff_upgrade upgrade)
{
    if (is_head)
        c->pending_head |= 1ull << c->pending;
    c->pending++;
    c->ws_wait = upgrade == SNIFF_UPGRADE_WEBSOCKET;
}

static int is_head_method(const struct sniff_http *h)
{
    return h->method.len == 4 && memcmp(h->method.p, "HEAD", 4) == 0;
}

/* A kept-alive request's head: it must pass the policy and name the pinned host and port. */
static int check_next_head(struct conn *c, const struct sniff_http *h)
{
    struct proxy *p = c->p;
    char host[SNIFF_NAME_MAX + 1];
    int port = h->port_given ? h->port : c->port;
    if (h->is_connect) {
        deny(c, h->host, h->port, "connect");
        return -1;
    }
    if (h->upgrade == SNIFF_UPGRADE_OTHER) {
        deny(c, h->host, port, "upgrade");
        return -1;
    }
    int r = h->host_is_addr ? -2 : netpolicy_host(h->host, host, sizeof(host));
    if (r == -2) {
        deny(c, h->host, port, "address");
        return -1;
    }
    if (r < 0 || strcmp(host, c->host) != 0 || port != c->port) {
        /* Intercepted, the pinned host is the SNI: a request elsewhere contradicts it. */
        deny(c, h->host, port, c->mitm ? "host_mismatch" : "host_changed");
        return -1;
    }
    json_t *policy =
        p->hooks.policy(p->ctx, (struct sockaddr *)&c->peer, c->peer_len, c->id, sizeof(c->id));
    if (!policy) {
        c->id[0] = '\0';
        deny(c, c->host, c->port, "unknown_client");
        return -1;
    }
    enum netpolicy_verdict v = netpolicy_check(policy, c->host, c->port);
    if (v != NETPOLICY_ALLOW) {
        deny(c, c->host, c->port, netpolicy_reason(v));
        return -1;
    }
    if (h->upgrade == SNIFF_UPGRADE_WEBSOCKET && c->an >= AN_CLOSE) {
        /* Its 101 could not be told from the rest: no tunnel. */
        refuse(c, c->host, c->port, "upstream_answer", 502);
        return -1;
    }
    p->stats.requests++;
    return 0;
}

/* Whether the client's next request waits unread: behind a WebSocket handshake not answered
 * yet, or behind PIPELINE_MAX requests not answered yet. */
static int held(const struct conn *c)
{
    return c->ws_wait || c->pending >= PIPELINE_MAX;
}

/* Forwards the head at the start of in if it is complete and passes. 1: forwarded; 0: wait for
 * more (or held); -1: refused (c is gone, taken over or refusing after the answers due). */
static int next_head(struct conn *c, struct evbuffer *in, size_t len)
{
    if (held(c) || !head_ready(c, in, len))
        return 0;
    size_t take = len < SNIFF_HTTP_HEAD_MAX + 1 ? len : SNIFF_HTTP_HEAD_MAX + 1;
    const uint8_t *buf = evbuffer_pullup(in, (ev_ssize_t)take);
    struct sniff_http h;
    int r = buf ? sniff_http(buf, take, &h) : SNIFF_BAD;
    if (r == SNIFF_MORE)
        return 0;
    if (r != SNIFF_OK) {
        refuse(c, c->host, c->port, r == SNIFF_NOT_HTTP ? "protocol" : "malformed", 400);
        return -1;
    }
    if (check_next_head(c, &h) < 0)
        return -1;
    forward_head(c, in, bufferevent_get_output(c->up), h.head_len);
    expect_answer(c, is_head_method(&h), h.upgrade);
    after_head(c, h.body, h.content_length);
    return 1;
}

/* Scans the chunked body at the start of in; *n is how many of its bytes belong to it. */
static int chunk_scan(struct sniff_chunked *ch, struct evbuffer *in, size_t len, size_t *n)
{
    struct evbuffer_iovec v[8];
    int nv = evbuffer_peek(in, (ev_ssize_t)len, NULL, v, 8);
    *n = 0;
    for (int i = 0; i < nv && i < 8 && *n < len; i++) {
        size_t vl = v[i].iov_len < len - *n ? v[i].iov_len : len - *n;
        size_t used = 0;
        int r = sniff_chunked_feed(ch, v[i].iov_base, vl, &used);
        *n += used;
        if (r != SNIFF_MORE)
            return r;
    }
    return SNIFF_MORE;
}

/* Client to upstream. Returns -1 if c was closed or taken over. */
static int pump_up(struct conn *c)
{
    struct proxy *p = c->p;
    struct evbuffer *in = bufferevent_get_input(c->cl), *out = bufferevent_get_output(c->up);
    size_t len;
    if (c->refuse_status) {
        evbuffer_drain(in, evbuffer_get_length(in));
        bufferevent_disable(c->cl, EV_READ);
        return 0;
    }
    while ((len = evbuffer_get_length(in)) > 0) {
        if (c->rq == RQ_RAW) {
            move(c, in, out, len, 1);
        } else if (c->rq == RQ_BODY) {
            size_t k = len < c->body_left ? len : (size_t)c->body_left;
            c->body_left -= move(c, in, out, k, 1);
            if (c->body_left == 0)
                after_head(c, SNIFF_BODY_NONE, 0);
        } else if (c->rq == RQ_CHUNKED) {
            size_t n;
            int r = chunk_scan(&c->chunk, in, len, &n);
            if (r == SNIFF_BAD) {
                refuse(c, c->host, c->port, "malformed", 400);
                return -1;
            }
            move(c, in, out, n, 1);
            if (r == SNIFF_DONE)
                after_head(c, SNIFF_BODY_NONE, 0);
        } else {
            int r = next_head(c, in, len);
            if (r < 0)
                return -1;
            if (r == 0)
                break;
        }
    }
    note_queued(p, c->up);
    /* Held bytes wait in the client's input: at most about buffer_max of them are read. */
    if (queued(c->up) >= p->cfg.buffer_max ||
        (c->rq == RQ_HEAD && held(c) && evbuffer_get_length(in) >= p->cfg.buffer_max)) {
        bufferevent_disable(c->cl, EV_READ);
        c->cl_paused = 1;
    }
    return 0;
}

/* A hold on the client's bytes may have ended: they are looked at again from the loop (not from
 * here, inside the upstream's callback, where a refusal could free what the caller uses). */
static void resume_up(struct conn *c)
{
    if (c->cl_paused && !c->cl_eof) {
        c->cl_paused = 0;
        bufferevent_enable(c->cl, EV_READ);
    }
    bufferevent_trigger(c->cl, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* The answers cannot be followed from here (why): they are relayed as they come. A WebSocket
 * handshake waiting for its answer is refused (its 101 cannot be told apart), and a refusal
 * waiting for answers goes out now. Returns -1 if c was taken over. */
static int lost(struct conn *c, const char *why)
{
    log_info(c->id[0] ? c->id : NULL, "proxy.answer_unfollowed", "host=%s port=%d why=%s", c->host,
             c->port, why);
    c->an = AN_LOST;
    if (c->refuse_status) {
        respond(c, c->refuse_status, c->refuse_text);
        return -1;
    }
    if (c->ws_wait) {
        refuse(c, c->host, c->port, "upstream_answer", 502);
        return -1;
    }
    return 0;
}

/* An answer ended: its request is done. The refusal waiting for it goes out once no answer is
 * due; a handshake answered other than 101 lets the next request through. Returns -1 if c was
 * taken over. */
static int answered(struct conn *c)
{
    int was_held = held(c);
    c->an = AN_HEAD;
    c->pending--;
    c->pending_head >>= 1;
    if (c->pending == 0) {
        c->ws_wait = 0;
        if (c->refuse_status || c->ws_failed) {
            respond(c, c->refuse_status, c->refuse_status ? c->refuse_text : NULL);
            return -1;
        }
    }
    if (was_held && !held(c))
        resume_up(c);
    return 0;
}

/* The answer head at the start of in, once complete, is followed and forwarded. 1: forwarded;
 * 0: wait for more; -1: c was taken over. */
static int answer_head(struct conn *c, struct evbuffer *in, size_t len)
{
    if (len < SNIFF_HTTP_HEAD_MAX) {
        struct evbuffer_ptr from, at;
        size_t back = c->ans_scanned > 3 ? c->ans_scanned - 3 : 0;
        if (evbuffer_ptr_set(in, &from, back, EVBUFFER_PTR_SET) == 0) {
            at = evbuffer_search(in, "\r\n\r\n", 4, &from);
            if (at.pos < 0) {
                c->ans_scanned = len;
                return 0;
            }
        }
    }
    c->ans_scanned = 0;
    size_t take = len < SNIFF_HTTP_HEAD_MAX ? len : SNIFF_HTTP_HEAD_MAX;
    const uint8_t *buf = evbuffer_pullup(in, (ev_ssize_t)take);
    struct sniff_answer a;
    int r = buf ? sniff_http_answer(buf, take, &a) : SNIFF_BAD;
    if (r == SNIFF_MORE)
        return 0;
    if (r != SNIFF_OK)
        return lost(c, "malformed") < 0 ? -1 : 1;
    if (c->pending == 0)
        return lost(c, "unasked") < 0 ? -1 : 1;
    /* A 101 to anything but the handshake waiting for it, or to another protocol: never given to
     * a client waiting for its handshake's answer (lost() refuses that), passed on otherwise. */
    if (a.status == 101 && (!c->ws_wait || c->pending != 1 || !a.websocket))
        return lost(c, "switch") < 0 ? -1 : 1;
    move(c, in, bufferevent_get_output(c->cl), a.head_len, 0);
    if (a.status == 101) {
        /* The handshake's own answer: a tunnel from here, to the host it was checked for. */
        log_debug(c->id[0] ? c->id : NULL, "proxy.websocket", "host=%s port=%d", c->host, c->port);
        c->an = AN_RAW;
        c->rq = RQ_RAW;
        c->ws_wait = 0;
        c->pending = 0;
        resume_up(c);
        return 1;
    }
    if (a.status < 200)
        return 1; /* interim (100 Continue, 103 Early Hints): the final answer follows */
    /* A handshake refused (4xx, 5xx): the WebSocket failed, and its client closes the connection
     * (RFC 6455 4.1); the proxy does too once the answer is out, rather than wait on it. One
     * answered 2xx or 3xx came from a server that ignored the Upgrade: HTTP goes on. */
    c->ws_failed = c->ws_wait && c->pending == 1 && a.status >= 400;
    if ((c->pending_head & 1) || a.status == 204 || a.status == 304 ||
        (a.body == SNIFF_BODY_LENGTH && a.content_length == 0))
        return answered(c) < 0 ? -1 : 1;
    if (a.body == SNIFF_BODY_LENGTH) {
        c->an = AN_BODY;
        c->ans_left = a.content_length;
    } else if (a.body == SNIFF_BODY_CHUNKED) {
        c->an = AN_CHUNKED;
        sniff_chunked_init(&c->ans_chunk);
    } else {
        c->an = AN_CLOSE;
    }
    return 1;
}

/* Upstream to client, answer by answer. Returns -1 if c was closed or taken over. */
static int pump_down(struct conn *c)
{
    struct proxy *p = c->p;
    struct evbuffer *in = bufferevent_get_input(c->up), *out = bufferevent_get_output(c->cl);
    size_t len;
    while ((len = evbuffer_get_length(in)) > 0) {
        if (c->an == AN_HEAD) {
            int r = answer_head(c, in, len);
            if (r < 0)
                return -1;
            if (r == 0)
                break;
        } else if (c->an == AN_BODY) {
            size_t k = len < c->ans_left ? len : (size_t)c->ans_left;
            c->ans_left -= move(c, in, out, k, 0);
            if (c->ans_left == 0 && answered(c) < 0)
                return -1;
        } else if (c->an == AN_CHUNKED) {
            size_t n;
            int r = chunk_scan(&c->ans_chunk, in, len, &n);
            if (r == SNIFF_BAD) {
                if (lost(c, "chunked") < 0)
                    return -1;
                continue;
            }
            move(c, in, out, n, 0);
            if (r == SNIFF_DONE && answered(c) < 0)
                return -1;
        } else {
            move(c, in, out, len, 0);
        }
    }
    note_queued(p, c->cl);
    if (queued(c->cl) >= p->cfg.buffer_max) {
        bufferevent_disable(c->up, EV_READ);
        c->up_paused = 1;
    }
    return 0;
}

/* Both sides sent their FIN and all of it went out: done. Returns -1 if c was closed. */
static int maybe_finish(struct conn *c)
{
    if (c->cl_eof && c->up_eof && c->cl_shut && c->up_shut) {
        conn_close(c);
        return -1;
    }
    return 0;
}

static void on_cl_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    c->last_io_ms = now_ms_monotonic();
    pump_up(c);
}

static void on_up_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    c->last_io_ms = now_ms_monotonic();
    pump_down(c);
}

/* dst's output drained below its low watermark: resume its source, or pass on a FIN. */
static void drained(struct conn *c, int to_up)
{
    struct bufferevent *dst = to_up ? c->up : c->cl, *src = to_up ? c->cl : c->up;
    int *paused = to_up ? &c->cl_paused : &c->up_paused;
    int src_eof = to_up ? c->cl_eof : c->up_eof;
    int *shut = to_up ? &c->up_shut : &c->cl_shut;
    if (*paused && !src_eof && queued(dst) < c->p->cfg.buffer_max) {
        *paused = 0;
        bufferevent_enable(src, EV_READ);
    }
    if (src_eof && !*shut && evbuffer_get_length(bufferevent_get_output(dst)) == 0 &&
        half_close(dst)) {
        *shut = 1;
        maybe_finish(c);
    }
}

static void on_cl_write(struct bufferevent *bev, void *arg)
{
    drained(arg, 0);
}

static void on_up_write(struct bufferevent *bev, void *arg)
{
    drained(arg, 1);
}

static void on_relay_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (!(what & BEV_EVENT_EOF) || (what & BEV_EVENT_ERROR)) {
        conn_close(c);
        return;
    }
    int from_cl = bev == c->cl;
    if (from_cl) {
        c->cl_eof = 1;
        /* A partial head left at the end is no request: dropped. */
        struct evbuffer *in = bufferevent_get_input(c->cl);
        evbuffer_drain(in, evbuffer_get_length(in));
    } else {
        c->up_eof = 1;
        if (c->refuse_status && c->an != AN_CLOSE) {
            /* The answers due will not come: the refusal now. */
            respond(c, c->refuse_status, c->refuse_text);
            return;
        }
    }
    bufferevent_disable(bev, EV_READ);
    drained(c, from_cl);
}

static void up_tls_start(struct conn *c);

static void relay_start(struct conn *c)
{
    struct proxy *p = c->p;
    p->stats.dialed++;
    c->state = ST_RELAY;
    c->last_io_ms = now_ms_monotonic();
    log_debug(c->id[0] ? c->id : NULL, "proxy.relay", "host=%s port=%d", c->host, c->port);
    if (p->hooks.allowed)
        p->hooks.allowed(p->ctx, c->id, c->host, c->port);
    bufferevent_setcb(c->cl, on_cl_read, on_cl_write, on_relay_event, c);
    bufferevent_setcb(c->up, on_up_read, on_up_write, on_relay_event, c);
    bufferevent_setwatermark(c->cl, EV_READ, 0, 0);
    bufferevent_setwatermark(c->cl, EV_WRITE, p->cfg.buffer_max / 2, 0);
    bufferevent_setwatermark(c->up, EV_WRITE, p->cfg.buffer_max / 2, 0);
    /* Under a TLS filter, the socket's output holds at most a quarter more: the filter stops
     * encrypting there, so the filter's own output fills and the relay's flow control sees it. */
    struct bufferevent *raw_cl = bufferevent_get_underlying(c->cl);
    struct bufferevent *raw_up = bufferevent_get_underlying(c->up);
    if (raw_cl)
        bufferevent_setwatermark(raw_cl, EV_WRITE, 0, p->cfg.buffer_max / 4);
    if (raw_up)
        bufferevent_setwatermark(raw_up, EV_WRITE, 0, p->cfg.buffer_max / 4);
    bufferevent_enable(c->cl, EV_READ | EV_WRITE);
    bufferevent_enable(c->up, EV_READ | EV_WRITE);
    timer_ms(c, p->cfg.idle_ms);
    if (c->kind == KIND_HTTP) {
        forward_head(c, bufferevent_get_input(c->cl), bufferevent_get_output(c->up),
                     c->first_head_len);
        expect_answer(c, c->first_is_head, c->first_upgrade);
        after_head(c, c->first_body, c->first_length);
    } else {
        c->rq = RQ_RAW;
        c->an = AN_RAW;
    }
    pump_up(c);
}

/* ---- intercepting ---- */

/* The first OpenSSL error queued, as text for a log line ("" if none); the queue is cleared. */
static void ssl_error_text(char *out, size_t cap)
{
    unsigned long e = ERR_get_error();
    out[0] = '\0';
    if (e)
        ERR_error_string_n(e, out, cap);
    ERR_clear_error();
}

/* Puts a TLS filter over the socket bufferevent *side (which it then owns); NULL on failure
 * (*side untouched, ssl freed). */
static struct bufferevent *tls_over(struct conn *c, struct bufferevent **side,
                                    struct evbuffer_cb_entry **drain, SSL *ssl,
                                    enum bufferevent_ssl_state state)
{
    struct bufferevent *raw = *side;
    struct bufferevent *tls = bufferevent_openssl_filter_new(
        c->p->base, raw, ssl, state, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (!tls) {
        SSL_free(ssl);
        return NULL;
    }
    /* A peer that closes without a close_notify has still sent all it meant to; HTTP's own
     * framing tells a cut-off message, as over plain TCP. */
    bufferevent_openssl_set_allow_dirty_shutdown(tls, 1);
    *drain = evbuffer_add_cb(bufferevent_get_output(raw), on_raw_drained, tls);
    *side = tls;
    return tls;
}

static void on_up_tls_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        relay_start(c);
        return;
    }
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    char why[256];
    ssl_error_text(why, sizeof(why));
    log_info(c->id[0] ? c->id : NULL, "proxy.upstream_tls",
             "host=%s port=%d verify=\"%s\" error=\"%s\"", c->host, c->port,
             X509_verify_cert_error_string(v), why);
    refuse(c, c->host, c->port, "upstream_tls", 502);
}

/* Connected upstream: the TLS handshake with it, within connect_ms. */
static void up_tls_start(struct conn *c)
{
    struct proxy *p = c->p;
    struct wr_err err = {0};
    SSL *ssl = tlsmitm_client_ssl(p->cfg.mitm, c->host, &err);
    struct bufferevent *raw = c->up;
    if (!ssl || !tls_over(c, &c->up, &c->up_drain, ssl, BUFFEREVENT_SSL_CONNECTING)) {
        log_warn(c->id[0] ? c->id : NULL, "proxy.upstream_tls", "host=%s error=\"%s\"", c->host,
                 ssl ? "no TLS filter" : err.msg);
        refuse(c, c->host, c->port, "upstream_tls", 502);
        return;
    }
    c->state = ST_UPTLS;
    bufferevent_setcb(c->up, NULL, NULL, on_up_tls_event, c);
    bufferevent_enable(c->up, EV_READ | EV_WRITE);
    timer_ms(c, (uint64_t)p->cfg.connect_ms);
    /* The filter waits for its socket's callbacks; one now sends the ClientHello. */
    bufferevent_trigger(raw, EV_WRITE, BEV_TRIG_IGNORE_WATERMARKS);
}

static void decide(struct conn *c, const char *name, int port);
static int lookup_admit(struct proxy *p, const struct peer *pe);

/* The first request head in the decrypted stream: its Host must be the SNI. */
static void decide_intercepted(struct conn *c, const struct sniff_http *h)
{
    if (h->is_connect) {
        deny(c, h->host, h->port, "connect");
        return;
    }
    char host[SNIFF_NAME_MAX + 1];
    int port = h->port_given ? h->port : c->orig_port;
    int r = h->host_is_addr ? -2 : netpolicy_host(h->host, host, sizeof(host));
    if (r < 0 || strcmp(host, c->host) != 0 || port != c->orig_port) {
        deny(c, h->host, port, "host_mismatch");
        return;
    }
    if (h->upgrade == SNIFF_UPGRADE_OTHER) {
        deny(c, c->host, port, "upgrade");
        return;
    }
    c->first_head_len = h->head_len;
    c->first_body = h->body;
    c->first_length = h->content_length;
    c->first_upgrade = h->upgrade;
    c->first_is_head = is_head_method(h);
    decide(c, c->host, c->orig_port);
}

static void on_head_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    if (c->state != ST_SNIFF)
        return;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len = evbuffer_get_length(in);
    if (len == 0 || !head_ready(c, in, len))
        return;
    size_t take = len < SNIFF_HTTP_HEAD_MAX + 1 ? len : SNIFF_HTTP_HEAD_MAX + 1;
    const uint8_t *buf = evbuffer_pullup(in, (ev_ssize_t)take);
    struct sniff_http h;
    int r = buf ? sniff_http(buf, take, &h) : SNIFF_BAD;
    if (r == SNIFF_OK) {
        decide_intercepted(c, &h);
    } else if (r == SNIFF_BAD) {
        refuse(c, c->host, c->port, "malformed", 400);
    } else if (r == SNIFF_NOT_HTTP) {
        c->kind = KIND_TLS; /* no HTTP client to answer: closed */
        deny(c, c->host, c->port, "protocol");
    }
}

static void on_head_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    c->kind = KIND_TLS;
    if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
        deny(c, c->host, c->port, "protocol");
    else
        conn_close(c);
}

static void on_handshake_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        c->kind = KIND_HTTP; /* refusals from here on are answered over TLS */
        c->state = ST_SNIFF;
        c->scanned = 0;
        bufferevent_setcb(c->cl, on_head_read, NULL, on_head_event, c);
        timer_ms(c, (uint64_t)c->p->cfg.first_bytes_ms);
        on_head_read(c->cl, c);
        return;
    }
    char why[256];
    ssl_error_text(why, sizeof(why));
    log_info(c->id[0] ? c->id : NULL, "proxy.tls_handshake", "host=%s error=\"%s\"", c->host, why);
    refuse(c, c->host, c->port, c->alpn_bad ? "alpn" : "tls_handshake", 0);
}

/* The SNI passed: answers the sandbox's handshake as c->host, within first_bytes_ms. The
 * ClientHello is still in the socket's input, where the TLS filter reads it. */
static void mitm_accept(struct conn *c)
{
    struct proxy *p = c->p;
    struct wr_err err = {0};
    SSL *ssl = tlsmitm_server_ssl(p->cfg.mitm, c->host, &err);
    struct bufferevent *raw = c->cl;
    if (!ssl || !tls_over(c, &c->cl, &c->cl_drain, ssl, BUFFEREVENT_SSL_ACCEPTING)) {
        log_warn(c->id[0] ? c->id : NULL, "proxy.tls_handshake", "host=%s error=\"%s\"", c->host,
                 ssl ? "no TLS filter" : err.msg);
        refuse(c, c->host, c->port, "tls_handshake", 0);
        return;
    }
    c->mitm = 1;
    c->state = ST_HANDSHAKE;
    bufferevent_setcb(c->cl, NULL, NULL, on_handshake_event, c);
    bufferevent_setwatermark(c->cl, EV_READ, 0, SNIFF_BUF_MAX);
    bufferevent_enable(c->cl, EV_READ | EV_WRITE);
    timer_ms(c, (uint64_t)p->cfg.first_bytes_ms);
    /* No read event will announce bytes already read: the filter is told of them now. */
    bufferevent_trigger(raw, EV_READ, BEV_TRIG_IGNORE_WATERMARKS);
}

/* ---- dialing ---- */

static void dial_next(struct conn *c);

static void on_dial_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (c->connecting) {
        c->connect_died = 1;
        return;
    }
    if (what & BEV_EVENT_CONNECTED) {
        if (c->mitm)
            up_tls_start(c);
        else
            relay_start(c);
        return;
    }
    bufferevent_free(c->up);
    c->up = NULL;
    dial_next(c);
}

/* Connects to the next resolved address, or refuses "connect_failed" when none is left or the
 * time is up. Each attempt gets an equal share of what is left of connect_ms. */
static void dial_next(struct conn *c)
{
    struct proxy *p = c->p;
    while (c->dial_next < c->ndial) {
        uint64_t now = now_ms_monotonic();
        if (now >= c->deadline_ms)
            break;
        const struct sockaddr_in *sa = &c->dial[c->dial_next++];
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        /* Before connect, so that the window offered is sized by it, and autotuning (which
         * grew each unread download's queue to megabytes) is off. */
        int rcvbuf = PROXY_UPSTREAM_RCVBUF;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
        c->up = bufferevent_socket_new(p->base, fd, BEV_OPT_CLOSE_ON_FREE);
        if (!c->up) {
            close(fd);
            continue;
        }
        bufferevent_setcb(c->up, NULL, NULL, on_dial_event, c);
        c->connecting = 1;
        c->connect_died = 0;
        int r = bufferevent_socket_connect(c->up, (const struct sockaddr *)sa, sizeof(*sa));
        c->connecting = 0;
        if (r < 0 || c->connect_died) {
            bufferevent_free(c->up);
            c->up = NULL;
            continue;
        }
        uint64_t share = (c->deadline_ms - now) / (c->ndial - c->dial_next + 1);
        timer_ms(c, share > 0 ? share : 1);
        return;
    }
    p->stats.connect_failed++;
    refuse(c, c->host, c->port, "connect_failed", 502);
}

static void on_lookup(void *arg, int rc, const struct dns_addr *addrs, size_t n, const char *why)
{
    struct conn *c = arg;
    struct proxy *p = c->p;
    lookup_ended(c);
    if (rc < 0) {
        refuse(c, c->host, c->port, why, 502);
        return;
    }
    c->ndial = 0;
    for (size_t i = 0; i < n && c->ndial < LOOKUP_ADDRS_MAX; i++) {
        if (addrs[i].family != AF_INET)
            continue;
        struct sockaddr_in sa;
        memset(&sa, 0, sizeof(sa));
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)c->port);
        memcpy(&sa.sin_addr, addrs[i].addr, 4);
        if (!addr_dialable((struct sockaddr *)&sa, sizeof(sa), &p->extra, p->hooks.is_local,
                           p->ctx))
            continue;
        c->dial[c->ndial++] = sa;
    }
    if (c->ndial == 0) {
        deny(c, c->host, c->port, "private_address");
        return;
    }
    c->state = ST_DIAL;
    c->dial_next = 0;
    c->deadline_ms = now_ms_monotonic() + (uint64_t)p->cfg.connect_ms;
    dial_next(c);
}

/* ---- deciding ---- */

/* The connection wants name:port (port: the one the sandbox dialed). Checks the policy, then
 * resolves. c may be gone on return. */
static void decide(struct conn *c, const char *name, int port)
{
    struct proxy *p = c->p;
    int r = netpolicy_host(name, c->host, sizeof(c->host));
    c->port = port;
    if (r == -2) {
        deny(c, name, port, "address");
        return;
    }
    if (r < 0) {
        deny(c, name, port, netpolicy_reason(NETPOLICY_BAD_NAME));
        return;
    }
    json_t *policy =
        p->hooks.policy(p->ctx, (struct sockaddr *)&c->peer, c->peer_len, c->id, sizeof(c->id));
    if (!policy) {
        c->id[0] = '\0';
        deny(c, c->host, port, "unknown_client");
        return;
    }
    enum netpolicy_verdict v = netpolicy_check(policy, c->host, port);
    if (v != NETPOLICY_ALLOW) {
        deny(c, c->host, port, netpolicy_reason(v));
        return;
    }
    if (c->kind == KIND_TLS && p->cfg.mitm && !c->mitm) {
        if (!handshake_admit(p, (struct sockaddr *)&c->peer)) {
            refuse(c, c->host, port, "handshake_rate", 0);
            return;
        }
        mitm_accept(c);
        return;
    }
    if (c->kind == KIND_HTTP)
        p->stats.requests++;
    if (!lookup_admit(p, c->pe)) {
        refuse(c, c->host, port, "busy", 502);
        return;
    }
    c->state = ST_LOOKUP;
    event_del(c->timer);
    bufferevent_disable(c->cl, EV_READ);
    c->lk = lookup_start(p->lk, c->host, on_lookup, c);
    if (!c->lk)
        refuse(c, c->host, port, "busy", 502);
    else
        c->pe->lookups++;
}

static void decide_http(struct conn *c, const struct sniff_http *h)
{
    c->kind = KIND_HTTP;
    if (h->is_connect) {
        deny(c, h->host, h->port, "connect");
        return;
    }
    if (h->host_is_addr) {
        deny(c, h->host, h->port_given ? h->port : c->orig_port, "address");
        return;
    }
    if (h->port_given && h->port != c->orig_port) {
        deny(c, h->host, h->port, "port_mismatch");
        return;
    }
    if (h->upgrade == SNIFF_UPGRADE_OTHER) {
        deny(c, h->host, c->orig_port, "upgrade");
        return;
    }
    c->first_head_len = h->head_len;
    c->first_body = h->body;
    c->first_length = h->content_length;
    c->first_upgrade = h->upgrade;
    c->first_is_head = is_head_method(h);
    decide(c, h->host, c->orig_port);
}

static void on_sniff_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len = evbuffer_get_length(in);
    if (len > SNIFF_BUF_MAX)
        len = SNIFF_BUF_MAX;
    if (len < c->sniff_need)
        return;
    /* The record header says whether it is TLS; the whole hello is pulled up only if it is. */
    size_t peek = len < 16 ? len : 16;
    const uint8_t *buf = evbuffer_pullup(in, (ev_ssize_t)peek);
    struct sniff_tls t;
    int r = buf ? sniff_tls(buf, peek, &t) : SNIFF_BAD;
    if (r != SNIFF_NOT_TLS && peek < len) {
        buf = evbuffer_pullup(in, (ev_ssize_t)len);
        r = buf ? sniff_tls(buf, len, &t) : SNIFF_BAD;
    }
    if (r == SNIFF_OK) {
        c->kind = KIND_TLS;
        c->alpn_bad = t.has_alpn && !(t.alpn & SNIFF_ALPN_HTTP11);
        if (!t.has_sni)
            deny(c, c->orig_text, c->orig_port, "no_sni");
        else
            decide(c, t.sni, c->orig_port);
        return;
    }
    if (r == SNIFF_MORE) {
        c->sniff_need = t.need;
        if (t.need > SNIFF_BUF_MAX || len >= SNIFF_BUF_MAX)
            deny(c, c->orig_text, c->orig_port, "malformed");
        return;
    }
    if (r == SNIFF_BAD) {
        deny(c, c->orig_text, c->orig_port, "malformed");
        return;
    }
    if (!head_ready(c, in, len))
        return;
    buf = evbuffer_pullup(in, (ev_ssize_t)len);
    struct sniff_http h;
    r = buf ? sniff_http(buf, len, &h) : SNIFF_BAD;
    if (r == SNIFF_OK) {
        decide_http(c, &h);
    } else if (r == SNIFF_BAD) {
        c->kind = KIND_HTTP;
        refuse(c, c->orig_text, c->orig_port, "malformed", 400);
    } else if (r == SNIFF_NOT_HTTP) {
        deny(c, c->orig_text, c->orig_port, "protocol");
    }
}

static void on_sniff_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
        deny(c, c->orig_text, c->orig_port, "protocol"); /* it said too little to decide on */
    else
        conn_close(c); /* connected and left: nothing asked, nothing denied */
}

/* ---- timers ---- */

/* Returns -1 if c was closed or taken over. */
static int on_timer_state(struct conn *c)
{
    struct proxy *p = c->p;
    switch (c->state) {
    case ST_SNIFF:
        if (c->mitm) {
            c->kind = KIND_TLS; /* a client silent after its handshake: closed */
            deny(c, c->host, c->port, "timeout");
        } else {
            deny(c, c->orig_text, c->orig_port, "timeout");
        }
        return -1;
    case ST_HANDSHAKE: deny(c, c->host, c->port, "timeout"); return -1;
    case ST_UPTLS: refuse(c, c->host, c->port, "upstream_tls", 502); return -1;
    case ST_LOOKUP: return 0; /* not armed: the lookup gives up by itself */
    case ST_DIAL:
        bufferevent_free(c->up);
        c->up = NULL;
        dial_next(c);
        return -1;
    case ST_RELAY: {
        uint64_t idle = now_ms_monotonic() - c->last_io_ms;
        if (idle >= (uint64_t)p->cfg.idle_ms) {
            conn_close(c);
            return -1;
        }
        timer_ms(c, (uint64_t)p->cfg.idle_ms - idle);
        return 0;
    }
    case ST_REFUSING: conn_close(c); return -1;
    }
    return 0;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    on_timer_state(arg);
}

/* ---- accepting ---- */

/* The sandbox holding the most connections, other than pe; NULL if none. */
static struct peer *biggest_peer(struct proxy *p, const struct peer *pe)
{
    struct peer *big = NULL;
    for (struct peer *q = p->peers; q; q = q->next)
        if (q != pe && (!big || q->conns > big->conns))
            big = q;
    return big;
}

/* Closes hog's connection idle the longest (one still deciding first: it has moved nothing),
 * to make room for a sandbox below its fair share. */
static void evict(struct proxy *p, struct peer *hog)
{
    struct conn *victim = NULL;
    for (struct conn *c = p->conns; c; c = c->next)
        if (c->pe == hog && c->state != ST_REFUSING &&
            (!victim || c->last_io_ms < victim->last_io_ms))
            victim = c;
    if (!victim)
        return;
    p->stats.evicted++;
    log_info(victim->id[0] ? victim->id : NULL, "proxy.evicted", "host=%s port=%d conns=%u",
             victim->host[0] ? victim->host : victim->orig_text,
             victim->port ? victim->port : victim->orig_port, hog->conns);
    if (p->hooks.denied)
        p->hooks.denied(p->ctx, victim->id, victim->host[0] ? victim->host : victim->orig_text,
                        victim->port ? victim->port : victim->orig_port, "fair_share");
    conn_close(victim);
}

/* Whether c, counted already in its sandbox's and the proxy's totals, may stay: within the
 * per-sandbox cap, and within the global one -- or, at the global cap, below its fair share
 * while another sandbox is over its own, which then gives up a connection (evict). */
static int conn_admit(struct proxy *p, struct conn *c)
{
    if (c->pe->conns > (unsigned)p->cfg.max_conns_per_peer)
        return 0;
    if (p->stats.active <= (unsigned)p->cfg.max_conns)
        return 1;
    unsigned share = proxy_fair_share((unsigned)p->cfg.max_conns, p->npeers, PROXY_SHARE_FLOOR);
    if (c->pe->conns > share)
        return 0;
    struct peer *hog = biggest_peer(p, c->pe);
    if (!hog || hog->conns <= share)
        return 0;
    evict(p, hog);
    return 1;
}

/* Whether pe may start one more lookup. A sandbox holds at most PROXY_LOOKUPS_PER_PEER, and
 * once the lookup table is half full, no more than its fair share of the table: the other half
 * stays for the sandboxes below theirs. */
static int lookup_admit(struct proxy *p, const struct peer *pe)
{
    if (pe->lookups >= PROXY_LOOKUPS_PER_PEER)
        return 0;
    struct lookup_stats ls;
    lookup_stats(p->lk, &ls);
    if (ls.pending < LOOKUP_PENDING_MAX / 2)
        return 1;
    return pe->lookups < proxy_fair_share(LOOKUP_PENDING_MAX, p->npeers, PROXY_LOOKUP_SHARE_FLOOR);
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    struct proxy *p = arg;
    p->stats.accepted++;
    struct conn *c = calloc(1, sizeof(*c));
    if (!c || salen <= 0 || (size_t)salen > sizeof(c->peer)) {
        free(c);
        close(fd);
        return;
    }
    c->p = p;
    memcpy(&c->peer, sa, (size_t)salen);
    c->peer_len = (socklen_t)salen;
    /* What a sandbox does not read waits unsent in the kernel for no more than this (plus one
     * write of the relay's): the socket is writable only below it. Not SO_SNDBUF, which would
     * also cap the bytes in flight, a third of the throughput under load. */
    int lowat = PROXY_CLIENT_NOTSENT;
    setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat));
    c->cl = bufferevent_socket_new(p->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->pe = c->cl ? peer_get(p, sa, c->peer_len) : NULL;
    if (!c->pe) {
        if (c->cl)
            bufferevent_free(c->cl);
        else
            close(fd);
        free(c);
        return;
    }
    c->next = p->conns;
    if (p->conns)
        p->conns->prev = c;
    p->conns = c;
    if (++p->stats.active > p->stats.active_max)
        p->stats.active_max = p->stats.active;
    c->timer = evtimer_new(p->base, on_timer, c);
    if (!c->timer) {
        conn_close(c);
        return;
    }

    json_t *policy = p->hooks.policy(p->ctx, sa, c->peer_len, c->id, sizeof(c->id));
    if (!policy)
        c->id[0] = '\0';
    c->id[sizeof(c->id) - 1] = '\0';
    int have_dst =
        p->hooks.original_dst(p->ctx, fd, &c->orig) == 0 && c->orig.sin_family == AF_INET;
    if (have_dst) {
        c->orig_port = ntohs(c->orig.sin_port);
        inet_ntop(AF_INET, &c->orig.sin_addr, c->orig_text, sizeof(c->orig_text));
    }
    if (!policy) {
        deny(c, c->orig_text, c->orig_port, "unknown_client");
        return;
    }
    if (!have_dst || c->orig_port == 0) {
        deny(c, "", 0, "no_original_dst");
        return;
    }
    if (!conn_admit(p, c)) {
        deny(c, c->orig_text, c->orig_port, "too_many_connections");
        return;
    }
    c->state = ST_SNIFF;
    bufferevent_setcb(c->cl, on_sniff_read, NULL, on_sniff_event, c);
    bufferevent_setwatermark(c->cl, EV_READ, 0, SNIFF_BUF_MAX);
    bufferevent_enable(c->cl, EV_READ);
    timer_ms(c, (uint64_t)p->cfg.first_bytes_ms);
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
    struct proxy *p = arg;
    evconnlistener_enable(p->listener);
}

static void on_accept_error(struct evconnlistener *lis, void *arg)
{
    struct proxy *p = arg;
    int e = EVUTIL_SOCKET_ERROR();
    log_warn(NULL, "proxy.accept_failed", "error=\"%s\" active=%u", strerror(e), p->stats.active);
    evconnlistener_disable(lis);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    event_add(p->accept_pause, &tv);
}

/* ---- the proxy ---- */

struct proxy *proxy_new(struct event_base *base, int listen_fd, struct lookup *lk,
                        const struct proxy_config *cfg, const struct proxy_hooks *hooks, void *ctx,
                        struct wr_err *err)
{
    if (!base || listen_fd < 0 || !lk || !hooks || !hooks->policy || !hooks->original_dst) {
        if (listen_fd >= 0)
            close(listen_fd);
        wr_err_set(err, EINVAL, "proxy: bad arguments");
        return NULL;
    }
    struct proxy *p = calloc(1, sizeof(*p));
    if (!p) {
        close(listen_fd);
        wr_err_sys(err, ENOMEM, "proxy");
        return NULL;
    }
    p->base = base;
    p->lk = lk;
    if (cfg)
        p->cfg = *cfg;
    if (p->cfg.extra_public)
        p->extra = *p->cfg.extra_public;
    p->cfg.extra_public = NULL; /* copied into extra: nothing borrowed stays */
    if (p->cfg.max_conns <= 0)
        p->cfg.max_conns = PROXY_MAX_CONNS;
    if (p->cfg.max_conns_per_peer <= 0)
        p->cfg.max_conns_per_peer = PROXY_MAX_CONNS_PER_PEER;
    if (p->cfg.first_bytes_ms <= 0)
        p->cfg.first_bytes_ms = PROXY_FIRST_BYTES_MS;
    if (p->cfg.connect_ms <= 0)
        p->cfg.connect_ms = PROXY_CONNECT_MS;
    if (p->cfg.idle_ms <= 0)
        p->cfg.idle_ms = PROXY_IDLE_MS;
    if (p->cfg.buffer_max == 0)
        p->cfg.buffer_max = PROXY_BUFFER_MAX;
    p->hooks = *hooks;
    p->ctx = ctx;
    if (evutil_make_socket_nonblocking(listen_fd) < 0) {
        wr_err_sys(err, errno, "proxy: non-blocking listening socket");
        close(listen_fd);
        free(p);
        return NULL;
    }
    p->accept_pause = evtimer_new(base, on_accept_resume, p);
    /* backlog 0: the socket is listening already. */
    p->listener = evconnlistener_new(base, on_accept, p,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, listen_fd);
    if (!p->listener || !p->accept_pause) {
        wr_err_set(err, ENOMEM, "proxy: listener");
        if (!p->listener)
            close(listen_fd);
        proxy_free(p);
        return NULL;
    }
    evconnlistener_set_error_cb(p->listener, on_accept_error);
    return p;
}

void proxy_free(struct proxy *p)
{
    if (!p)
        return;
    while (p->conns)
        conn_close(p->conns);
    if (p->listener)
        evconnlistener_free(p->listener);
    if (p->accept_pause)
        event_free(p->accept_pause);
    free(p);
}

void proxy_close_peer(struct proxy *p, const struct sockaddr *peer, socklen_t len)
{
    if (!p || !peer || len < (socklen_t)sizeof(sa_family_t))
        return;
    struct conn *c = p->conns;
    while (c) {
        struct conn *next = c->next;
        if (same_host((const struct sockaddr *)&c->peer, peer))
            conn_close(c);
        c = next;
    }
}

void proxy_recheck_peer(struct proxy *p, const struct sockaddr *peer, socklen_t len)
{
    if (!p || !peer || len < (socklen_t)sizeof(sa_family_t))
        return;
    struct conn *c = p->conns;
    while (c) {
        struct conn *next = c->next;
        /* Still deciding (no host yet): the policy is asked when it decides. */
        if (same_host((const struct sockaddr *)&c->peer, peer) && c->host[0] &&
            c->state != ST_REFUSING) {
            json_t *policy = p->hooks.policy(p->ctx, (struct sockaddr *)&c->peer, c->peer_len,
                                             c->id, sizeof(c->id));
            if (!policy || netpolicy_check(policy, c->host, c->port) != NETPOLICY_ALLOW) {
                p->stats.denied++;
                log_info(c->id[0] ? c->id : NULL, "proxy.denied", "host=%s port=%d reason=%s",
                         c->host, c->port, "policy_changed");
                if (p->hooks.denied)
                    p->hooks.denied(p->ctx, c->id, c->host, c->port, "policy_changed");
                conn_close(c);
            }
        }
        c = next;
    }
}

void proxy_stats(const struct proxy *p, struct proxy_stats *out)
{
    *out = p->stats;
}

unsigned proxy_fair_share(unsigned total, unsigned sandboxes, unsigned floor)
{
    unsigned share = sandboxes > 0 ? total / sandboxes : total;
    return share > floor ? share : floor;
}

int proxy_conns_for_fds(unsigned long long fd_limit)
{
    unsigned long long api = fd_limit / 2;
    if (fd_limit <= api + PROXY_FD_RESERVE)
        return PROXY_MIN_CONNS;
    unsigned long long conns = (fd_limit - api - PROXY_FD_RESERVE) / 2 / 2;
    if (conns < PROXY_MIN_CONNS)
        return PROXY_MIN_CONNS;
    return conns > PROXY_MAX_CONNS ? PROXY_MAX_CONNS : (int)conns;
}
