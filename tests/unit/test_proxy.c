/*
 * The egress proxy (net/proxy.h) with a fake internet on 127.0.0.1: a fake upstream DNS server,
 * HTTP servers that record the requests they get, and a "TLS" echo server (the proxy never
 * terminates TLS, so a synthetic ClientHello and raw bytes after it stand in for a handshake).
 * The proxy, its lookup and the fakes share one event loop in a thread; the sandbox is a plain
 * blocking client in the main thread. 127.0.0.0/8 is configured as public so the fakes can be
 * dialed; the original destination hook answers 203.0.113.9 with the port the test chose, which
 * the proxy must never dial (nothing listens there).
 *
 * What a sandbox would see: allowed requests answered by the upstream, denied ones a 403 naming
 * host and reason with nothing sent upstream, kept-alive requests checked one by one (a refusal
 * after the answers to those before it), a tunnel only on the 101 that answers a WebSocket
 * handshake (h2c refused), TLS relayed verbatim by SNI, everything else closed; and the limits: per
 * peer, the relay's flow control, idle and first-bytes timeouts, proxy_close_peer.
 *
 * A second proxy on the same loop intercepts TLS (net/tlsmitm.h): the test makes a CA for it,
 * an "upstream" CA that signs the fake TLS upstreams' certificates (for allowed.test, and one
 * for another name), and a "rogue" CA nobody trusts. The sandbox is then a blocking OpenSSL
 * client that trusts only the proxy's CA, and sees: its requests answered, a certificate for the
 * SNI from that CA, a Host other than the SNI refused, secrets put into headers on the way out
 * and never shown to it, untrusted upstreams answered 502, h2-only clients and stalled
 * handshakes closed, and 4 MiB each way intact with bounded queues.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "net/addr.h"
#include "net/dnsmsg.h"
#include "net/lookup.h"
#include "net/netpolicy.h"
#include "net/proxy.h"
#include "net/tlsmitm.h"
#include "tap.h"
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define WAIT_MS 10000
#define PER_PEER 16
#define BUFFER_MAX (64 * 1024)
#define FIRST_BYTES_MS 2000
#define IDLE_MS 2000
#define BIG (4 * 1024 * 1024)
#define DIALED_ADDR "203.0.113.9"

static struct event_base *base;
static struct lookup *lk;
static struct proxy *proxy;
static struct sockaddr_in proxy_addr;
static int http_port, tls_port, closed_port;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static json_t *policy;           /* the sandbox's current policy */
static json_t *old_policies[16]; /* kept alive until the end: the loop may hold one */
static int n_old;
static int orig_port; /* what original_dst answers */
static char denied_log[16384];
static char http_log[16384];
static int http_requests;
static char tls_heads[65536]; /* every head the fake TLS upstreams got, whole */
static int tls_requests;
static uint8_t tls_first[4096];
static size_t tls_first_len;
static atomic_int dns_asked;

/* ---- the fake DNS upstream (loop thread) ---- */

static void put16(uint8_t *b, size_t *off, unsigned v)
{
    b[(*off)++] = (uint8_t)(v >> 8);
    b[(*off)++] = (uint8_t)v;
}

static void put_a(uint8_t *b, size_t *off, const char *ip)
{
    put16(b, off, 0xc00c);
    put16(b, off, DNS_TYPE_A);
    put16(b, off, DNS_CLASS_IN);
    put16(b, off, 0);
    put16(b, off, 300);
    put16(b, off, 4);
    inet_pton(AF_INET, ip, b + *off);
    *off += 4;
}

static const struct {
    const char *name;
    const char *a[2];
} dns_table[] = {
    {"allowed.test", {"127.0.0.1"}},
    {"other.test", {"127.0.0.1"}},
    {"tls.test", {"127.0.0.1"}},
    {"dead.test", {"127.0.0.1"}},
    {"private.test", {"10.1.2.3"}},
    {"local.test", {"127.0.0.66"}},
    {"mixed.test", {"10.1.2.3", "127.0.0.1"}},
};

static void fake_dns(evutil_socket_t fd, short what, void *arg)
{
    uint8_t in[2048], out[1024];
    struct sockaddr_storage from;
    socklen_t flen = sizeof(from);
    ssize_t n;
    while ((n = recvfrom(fd, in, sizeof(in), MSG_DONTWAIT, (struct sockaddr *)&from, &flen)) >= 0) {
        struct dns_query q;
        if (dnsmsg_parse_query(in, (size_t)n, &q) != DNS_QUERY_OK)
            continue;
        dns_asked++;
        unsigned rcode = DNS_RCODE_NXDOMAIN, an = 0;
        size_t off = DNS_HEADER_LEN;
        memcpy(out + off, q.qwire, q.qwire_len);
        off += q.qwire_len;
        put16(out, &off, q.qtype);
        put16(out, &off, DNS_CLASS_IN);
        for (size_t i = 0; i < sizeof(dns_table) / sizeof(dns_table[0]); i++) {
            if (strcmp(q.name, dns_table[i].name) != 0)
                continue;
            rcode = DNS_RCODE_NOERROR;
            for (int k = 0; k < 2 && dns_table[i].a[k] && q.qtype == DNS_TYPE_A; k++, an++)
                put_a(out, &off, dns_table[i].a[k]);
        }
        size_t h = 0;
        put16(out, &h, q.id);
        put16(out, &h, 0x8180 | rcode);
        put16(out, &h, 1);
        put16(out, &h, an);
        put16(out, &h, 0);
        put16(out, &h, 0);
        sendto(fd, out, off, 0, (struct sockaddr *)&from, flen);
        flen = sizeof(from);
    }
}

/* ---- fake upstream servers (loop thread) ---- */

#define SERVER_CONNS 256
static struct bufferevent *server_conns[SERVER_CONNS];

static void server_track(struct bufferevent *bev)
{
    for (int i = 0; i < SERVER_CONNS; i++)
        if (!server_conns[i]) {
            server_conns[i] = bev;
            return;
        }
}

static void server_free(struct bufferevent *bev)
{
    for (int i = 0; i < SERVER_CONNS; i++)
        if (server_conns[i] == bev)
            server_conns[i] = NULL;
    bufferevent_free(bev);
}

static void server_event(struct bufferevent *bev, short what, void *arg)
{
    if (what == BEV_EVENT_CONNECTED)
        return; /* a TLS upstream's handshake done */
    server_free(bev);
}

static uint32_t fnv(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static void pattern(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 7 + (i >> 13));
}

/* After a 101: echoes everything. */
static void ws_echo(struct bufferevent *bev, void *arg)
{
    evbuffer_add_buffer(bufferevent_get_output(bev), bufferevent_get_input(bev));
}

static void http_read(struct bufferevent *bev, void *arg);

/* An answer written a byte per write (one connection at a time), so that the proxy reads it
 * split everywhere; then HTTP again, or (dribble_echo) an echo. */
static struct evbuffer *dribble_rest;
static int dribble_echo;

static void dribble_write(struct bufferevent *bev, void *arg)
{
    if (evbuffer_get_length(dribble_rest) > 0) {
        evbuffer_remove_buffer(dribble_rest, bufferevent_get_output(bev), 1);
        return;
    }
    bufferevent_setcb(bev, dribble_echo ? ws_echo : http_read, NULL, server_event, NULL);
    if (dribble_echo)
        ws_echo(bev, NULL);
}

static void dribble(struct bufferevent *bev, int echo, const char *text)
{
    if (!dribble_rest)
        dribble_rest = evbuffer_new();
    evbuffer_add(dribble_rest, text, strlen(text));
    dribble_echo = echo;
    bufferevent_setcb(bev, NULL, dribble_write, server_event, NULL);
    dribble_write(bev, NULL);
}

/* An HTTP/1.1 server with keep-alive: answers each request with what it saw (arg non-NULL: a
 * TLS one, which also records each head whole and a hash of each body). GET /big gets BIG
 * bytes of pattern(); a WebSocket handshake to /ws a 101 and an echo from then on, to any other
 * path the usual answer (to /ws-refused a 403, to /ws-h2c a 101 to h2c); /nope a 404; /dribble (and
 * a handshake to /ws-dribble) an answer a byte at a time; /switch a 101
 * nobody asked for (and HTTP on); /chunky a chunked answer with a trailer; /interim a 100 Continue
 * first; HEAD the head alone. */
static void http_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    for (;;) {
        size_t len = evbuffer_get_length(in);
        struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
        if (end.pos < 0)
            return;
        size_t hl = (size_t)end.pos + 4, total = hl;
        char *head = malloc(hl + 1);
        evbuffer_copyout(in, head, hl);
        head[hl] = '\0';
        const char *cl = strcasestr(head, "\r\ncontent-length:");
        if (cl) {
            total = hl + strtoul(cl + 17, NULL, 10);
        } else if (strcasestr(head, "\r\ntransfer-encoding: chunked")) {
            /* The last chunk ("0" on its own line; the test's data has no such line), then
             * the blank line that ends the trailers. */
            struct evbuffer_ptr from;
            evbuffer_ptr_set(in, &from, hl - 2, EVBUFFER_PTR_SET);
            struct evbuffer_ptr z = evbuffer_search(in, "\r\n0\r\n", 5, &from);
            if (z.pos >= 0) {
                evbuffer_ptr_set(in, &from, (size_t)z.pos + 3, EVBUFFER_PTR_SET);
                z = evbuffer_search(in, "\r\n\r\n", 4, &from);
            }
            total = z.pos < 0 ? len + 1 : (size_t)z.pos + 4;
        }
        if (len < total) {
            free(head);
            return;
        }
        char method[16] = "", path[256] = "", host[300] = "";
        sscanf(head, "%15s %255s", method, path);
        const char *h = strcasestr(head, "\r\nhost:");
        if (h) {
            h += 7;
            while (*h == ' ')
                h++;
            size_t k = strcspn(h, "\r");
            snprintf(host, sizeof(host), "%.*s", (int)k, h);
        }
        int ws = strcasestr(head, "\r\nupgrade: websocket\r\n") != NULL;
        if (arg) {
            pthread_mutex_lock(&mu);
            tls_requests++;
            size_t used = strlen(tls_heads);
            snprintf(tls_heads + used, sizeof(tls_heads) - used, "%s", head);
            pthread_mutex_unlock(&mu);
        }
        free(head);
        char body[256];
        evbuffer_drain(in, hl);
        size_t blen = total - hl;
        char got[64] = "";
        evbuffer_copyout(in, got, blen < sizeof(got) - 1 ? blen : sizeof(got) - 1);
        const uint8_t *all = blen ? evbuffer_pullup(in, (ev_ssize_t)blen) : NULL;
        uint32_t sum = fnv(all, blen);
        evbuffer_drain(in, blen);
        if (strcmp(path, "/big") == 0) {
            evbuffer_add_printf(bufferevent_get_output(bev),
                                "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", BIG);
            uint8_t *big = malloc(BIG);
            pattern(big, BIG);
            evbuffer_add(bufferevent_get_output(bev), big, BIG);
            free(big);
            continue;
        }
        pthread_mutex_lock(&mu);
        http_requests++;
        size_t used = strlen(http_log);
        snprintf(http_log + used, sizeof(http_log) - used, "%s %s host=%s body=%zu[%s];", method,
                 path, host, blen, got);
        pthread_mutex_unlock(&mu);
        int n = snprintf(body, sizeof(body), "upstream saw %s %s host=%s body=%zu\n", method, path,
                         host, blen);
        if (arg)
            n = snprintf(body, sizeof(body), "upstream saw %s %s host=%s body=%zu sum=%08x\n",
                         method, path, host, blen, sum);
        struct evbuffer *out = bufferevent_get_output(bev);
        if ((ws && strcmp(path, "/ws") == 0) || strcmp(path, "/switch") == 0)
            evbuffer_add_printf(out, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                     "Connection: Upgrade\r\n\r\n");
        if (ws && strcmp(path, "/ws") == 0) {
            bufferevent_setcb(bev, ws_echo, NULL, server_event, NULL);
            ws_echo(bev, NULL);
            return;
        }
        if (strcmp(path, "/dribble") == 0 || (ws && strcmp(path, "/ws-dribble") == 0)) {
            dribble(bev, ws,
                    ws ? "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         "Connection: Upgrade\r\n\r\n"
                       : "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: "
                         "chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nX-T: 1\r\n\r\n");
            return;
        }
        if (strcmp(path, "/nope") == 0) {
            evbuffer_add_printf(out, "HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope\n");
            continue;
        }
        if (ws && strcmp(path, "/ws-refused") == 0) {
            evbuffer_add_printf(out, "HTTP/1.1 403 Forbidden\r\nContent-Length: 3\r\n\r\nno\n");
            continue;
        }
        if (ws && strcmp(path, "/ws-h2c") == 0) {
            evbuffer_add_printf(out, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n");
            continue;
        }
        if (strcmp(path, "/interim") == 0)
            evbuffer_add_printf(out, "HTTP/1.1 100 Continue\r\n\r\n");
        if (strcmp(path, "/chunky") == 0)
            evbuffer_add_printf(out,
                                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n",
                                n, body);
        else if (strcmp(method, "HEAD") == 0)
            evbuffer_add_printf(out, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", n);
        else
            evbuffer_add_printf(out, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", n, body);
    }
}

/* Echoes everything, recording the first bytes; stops reading while 256 KiB wait to go out. */
static void tls_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev), *out = bufferevent_get_output(bev);
    pthread_mutex_lock(&mu);
    if (tls_first_len < sizeof(tls_first)) {
        size_t k = sizeof(tls_first) - tls_first_len;
        ev_ssize_t got = evbuffer_copyout(in, tls_first + tls_first_len, k);
        if (got > 0)
            tls_first_len += (size_t)got;
    }
    pthread_mutex_unlock(&mu);
    evbuffer_add_buffer(out, in);
    if (evbuffer_get_length(out) > 256 * 1024)
        bufferevent_disable(bev, EV_READ);
}

static void tls_write(struct bufferevent *bev, void *arg)
{
    bufferevent_enable(bev, EV_READ);
}

static void on_server_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                             int salen, void *arg)
{
    int tls = arg != NULL;
    struct bufferevent *bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    server_track(bev);
    if (tls) {
        pthread_mutex_lock(&mu);
        tls_first_len = 0;
        pthread_mutex_unlock(&mu);
        bufferevent_setcb(bev, tls_read, tls_write, server_event, NULL);
        bufferevent_setwatermark(bev, EV_WRITE, 128 * 1024, 0);
    } else {
        bufferevent_setcb(bev, http_read, NULL, server_event, NULL);
    }
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static struct evconnlistener *server_listen(int tls, int *port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct evconnlistener *l = evconnlistener_new_bind(
        base, on_server_accept, tls ? (void *)1 : NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
        64, (struct sockaddr *)&sa, sizeof(sa));
    socklen_t len = sizeof(sa);
    getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&sa, &len);
    *port = ntohs(sa.sin_port);
    return l;
}

/* A TLS HTTP/1.1 upstream: its certificate for name, from m's CA. */
struct tls_upstream {
    struct tlsmitm *m;
    const char *name;
    int port;
    struct evconnlistener *l;
};

static void on_tls_upstream_accept(struct evconnlistener *lis, evutil_socket_t fd,
                                   struct sockaddr *sa, int salen, void *arg)
{
    struct tls_upstream *u = arg;
    struct wr_err err = {0};
    SSL *ssl = tlsmitm_server_ssl(u->m, u->name, &err);
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    server_track(bev);
    bufferevent_setcb(bev, http_read, NULL, server_event, (void *)1);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static void tls_upstream_listen(struct tls_upstream *u)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    u->l = evconnlistener_new_bind(base, on_tls_upstream_accept, u,
                                   LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 64,
                                   (struct sockaddr *)&sa, sizeof(sa));
    socklen_t len = sizeof(sa);
    getsockname(evconnlistener_get_fd(u->l), (struct sockaddr *)&sa, &len);
    u->port = ntohs(sa.sin_port);
}

/* ---- the proxy's hooks (loop thread) ---- */

static int is_ip(const struct sockaddr *sa, const char *ip)
{
    struct in_addr a;
    inet_pton(AF_INET, ip, &a);
    return sa->sa_family == AF_INET &&
           ((const struct sockaddr_in *)sa)->sin_addr.s_addr == a.s_addr;
}

static json_t *hook_policy(void *ctx, const struct sockaddr *peer, socklen_t len, char *id,
                           size_t idcap)
{
    if (is_ip(peer, "127.0.0.2"))
        return NULL;
    snprintf(id, idcap, "%s", is_ip(peer, "127.0.0.3") ? "sb-3" : "sb-1");
    pthread_mutex_lock(&mu);
    json_t *p = policy;
    pthread_mutex_unlock(&mu);
    return p;
}

static int hook_original_dst(void *ctx, int fd, struct sockaddr_in *out)
{
    memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    inet_pton(AF_INET, DIALED_ADDR, &out->sin_addr);
    pthread_mutex_lock(&mu);
    out->sin_port = htons((uint16_t)orig_port);
    pthread_mutex_unlock(&mu);
    return 0;
}

static int hook_is_local(void *ctx, const struct sockaddr *addr, socklen_t len)
{
    return is_ip(addr, "127.0.0.66");
}

static void hook_denied(void *ctx, const char *id, const char *host, int port, const char *reason)
{
    pthread_mutex_lock(&mu);
    size_t used = strlen(denied_log);
    snprintf(denied_log + used, sizeof(denied_log) - used, "%s|%s|%d|%s;", id, host, port, reason);
    pthread_mutex_unlock(&mu);
}

#define PLACEHOLDER "Authorization: Bearer PLACEHOLDER\r\n"
#define SECRET "Authorization: Bearer real-secret-0123\r\n"
static char rewrite_log[4096];

/* The daemon's part: the placeholder in a head replaced by the real value. */
static char *hook_rewrite(void *ctx, const char *id, const char *host, int port, const char *head,
                          size_t len, size_t *outlen)
{
    pthread_mutex_lock(&mu);
    size_t used = strlen(rewrite_log);
    snprintf(rewrite_log + used, sizeof(rewrite_log) - used, "%s|%s|%d;", id, host, port);
    pthread_mutex_unlock(&mu);
    const char *at = memmem(head, len, PLACEHOLDER, strlen(PLACEHOLDER));
    if (!at)
        return NULL;
    size_t before = (size_t)(at - head), after = len - before - strlen(PLACEHOLDER);
    char *out = malloc(len + strlen(SECRET));
    memcpy(out, head, before);
    memcpy(out + before, SECRET, strlen(SECRET));
    memcpy(out + before + strlen(SECRET), at + strlen(PLACEHOLDER), after);
    *outlen = before + strlen(SECRET) + after;
    return out;
}

/* ---- the test's side ---- */

static void msleep(int ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL);
}

static void set_policy(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_policy(const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    json_t *given = json_loads(text, 0, NULL);
    struct wr_err err = {0};
    json_t *p = netpolicy_parse(given, &err);
    json_decref(given);
    if (!p) {
        printf("# bad test policy %s: %s\n", text, err.msg);
        exit(2);
    }
    pthread_mutex_lock(&mu);
    if (policy)
        old_policies[n_old++] = policy;
    policy = p;
    pthread_mutex_unlock(&mu);
}

static void set_orig(int port)
{
    pthread_mutex_lock(&mu);
    orig_port = port;
    pthread_mutex_unlock(&mu);
}

static int denied_has(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int denied_has(const char *fmt, ...)
{
    char want[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof(want), fmt, ap);
    va_end(ap);
    /* The hook runs on the loop thread, maybe just after the client saw the close. */
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&mu);
        int found = strstr(denied_log, want) != NULL;
        pthread_mutex_unlock(&mu);
        if (found)
            return 1;
        msleep(10);
    }
    printf("# denied log: %s\n", denied_log);
    return 0;
}

static int upstream_requests(void)
{
    pthread_mutex_lock(&mu);
    int n = http_requests;
    pthread_mutex_unlock(&mu);
    return n;
}

static int http_log_has(const char *want)
{
    pthread_mutex_lock(&mu);
    int found = strstr(http_log, want) != NULL;
    pthread_mutex_unlock(&mu);
    return found;
}

struct stats_req {
    struct proxy_stats s;
    atomic_int done;
};

static void copy_stats(evutil_socket_t fd, short what, void *arg)
{
    struct stats_req *req = arg;
    proxy_stats(proxy, &req->s);
    req->done = 1;
}

static struct proxy_stats stats(void)
{
    struct stats_req req = {.done = 0};
    event_base_once(base, -1, EV_TIMEOUT, copy_stats, &req, &(struct timeval){0, 0});
    for (int i = 0; i < WAIT_MS && !req.done; i++)
        msleep(1);
    return req.s;
}

static void close_peer(evutil_socket_t fd, short what, void *arg)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, arg, &sa.sin_addr);
    proxy_close_peer(proxy, (struct sockaddr *)&sa, sizeof(sa));
}

/* A connection to a proxy at to from src (NULL: 127.0.0.1), as a sandbox would make it. */
static int dial_at(const struct sockaddr_in *to, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {WAIT_MS / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (src) {
        struct sockaddr_in me = {.sin_family = AF_INET};
        inet_pton(AF_INET, src, &me.sin_addr);
        if (bind(fd, (struct sockaddr *)&me, sizeof(me)) < 0)
            perror("bind");
    }
    if (connect(fd, (const struct sockaddr *)to, sizeof(*to)) < 0)
        perror("connect");
    return fd;
}

static int dial_proxy(const char *src)
{
    return dial_at(&proxy_addr, src);
}

static int send_all(int fd, const void *p, size_t n)
{
    return write_all(fd, p, n);
}

static int send_str(int fd, const char *s)
{
    return send_all(fd, s, strlen(s));
}

struct resp {
    int status; /* -1: no response */
    char head[4096];
    char body[4096];
};

static void read_answer(int fd, struct resp *r, int head_only);

/* Reads one response (head and Content-Length body) byte by byte, so that what follows it on
 * the connection stays unread. */
static void read_response(int fd, struct resp *r)
{
    read_answer(fd, r, 0);
}

/* The same, or (head_only: the answer to a HEAD) its head alone. */
static void read_answer(int fd, struct resp *r, int head_only)
{
    memset(r, 0, sizeof(*r));
    r->status = -1;
    size_t n = 0;
    while (n < sizeof(r->head) - 1) {
        if (recv(fd, r->head + n, 1, 0) != 1)
            return;
        n++;
        if (n >= 4 && memcmp(r->head + n - 4, "\r\n\r\n", 4) == 0)
            break;
    }
    const char *cl = strcasestr(r->head, "\r\ncontent-length:");
    size_t blen = cl && !head_only ? strtoul(cl + 17, NULL, 10) : 0;
    if (blen >= sizeof(r->body) || read_full(fd, r->body, blen) != (ssize_t)blen)
        return;
    sscanf(r->head, "HTTP/1.1 %d", &r->status);
}

/* Whether the proxy closes fd within ms (EOF or a reset), whatever it sends before. */
static int closed_within(int fd, int ms)
{
    uint64_t end = now_ms_monotonic() + (uint64_t)ms;
    char buf[4096];
    for (;;) {
        int left = (int)(end - now_ms_monotonic());
        if (left <= 0)
            return 0;
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, left) <= 0)
            return 0;
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return 1;
    }
}

/* One request on a new connection; returns its response, and whether the proxy then closed. */
static void request(const char *req, struct resp *r, int *closed)
{
    int fd = dial_proxy(NULL);
    send_str(fd, req);
    read_response(fd, r);
    if (closed)
        *closed = closed_within(fd, 3000);
    close(fd);
}

/* ---- a synthetic ClientHello ---- */

struct bb {
    uint8_t b[1024];
    size_t n;
};

static void b8(struct bb *m, unsigned v)
{
    m->b[m->n++] = (uint8_t)v;
}

static void b16(struct bb *m, unsigned v)
{
    b8(m, v >> 8);
    b8(m, v & 0xff);
}

/* A TLS 1.3-shaped ClientHello in one record, with an SNI of name (NULL: no SNI). */
static size_t client_hello(const char *name, uint8_t *out)
{
    struct bb e = {.n = 0}, h = {.n = 0};
    b16(&e, 0x002b); /* supported_versions: TLS 1.3, 1.2 */
    b16(&e, 5);
    b8(&e, 4);
    b16(&e, 0x0304);
    b16(&e, 0x0303);
    if (name) {
        size_t n = strlen(name);
        b16(&e, 0x0000);
        b16(&e, (unsigned)(n + 5));
        b16(&e, (unsigned)(n + 3));
        b8(&e, 0);
        b16(&e, (unsigned)n);
        memcpy(e.b + e.n, name, n);
        e.n += n;
    }
    b8(&h, 1); /* ClientHello, 24-bit length filled below */
    b8(&h, 0);
    b16(&h, 0);
    b16(&h, 0x0303);
    for (int i = 0; i < 32; i++)
        b8(&h, 0x11 * (unsigned)(i % 7));
    b8(&h, 32);
    for (int i = 0; i < 32; i++)
        b8(&h, 0x22);
    b16(&h, 4);
    b16(&h, 0x1301);
    b16(&h, 0x1302);
    b8(&h, 1);
    b8(&h, 0);
    b16(&h, (unsigned)e.n);
    memcpy(h.b + h.n, e.b, e.n);
    h.n += e.n;
    size_t body = h.n - 4;
    h.b[1] = (uint8_t)(body >> 16);
    h.b[2] = (uint8_t)(body >> 8);
    h.b[3] = (uint8_t)body;
    out[0] = 0x16;
    out[1] = 0x03;
    out[2] = 0x01;
    out[3] = (uint8_t)(h.n >> 8);
    out[4] = (uint8_t)h.n;
    memcpy(out + 5, h.b, h.n);
    return h.n + 5;
}

/* ---- the checks ---- */

static char allow_all[1024];

static void http_basics(void)
{
    struct resp r;
    int closed;
    char req[1024];
    set_orig(http_port);

    snprintf(req, sizeof(req), "GET /hello HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", http_port);
    request(req, &r, NULL);
    char want[256];
    snprintf(want, sizeof(want), "upstream saw GET /hello host=allowed.test:%d body=0\n",
             http_port);
    ok(r.status == 200 && strcmp(r.body, want) == 0,
       "an allowed GET gets the upstream's answer "
       "(%d)",
       r.status);
    snprintf(want, sizeof(want), "GET /hello host=allowed.test:%d body=0", http_port);
    ok(http_log_has(want), "and the upstream saw it with its Host");

    request("GET /noport HTTP/1.1\r\nHost: ALLOWED.test\r\n\r\n", &r, NULL);
    ok(r.status == 200 && strstr(r.body, "GET /noport host=ALLOWED.test body=0"),
       "a Host without a port goes to the port dialed (%d)", r.status);

    snprintf(req, sizeof(req),
             "GET http://allowed.test:%d/abs HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", http_port,
             http_port);
    request(req, &r, NULL);
    ok(r.status == 200 && strstr(r.body, "GET http://allowed.test"),
       "an absolute-form target that agrees with Host is fine (%d)", r.status);

    int before = upstream_requests();
    struct proxy_stats s0 = stats();
    snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n", http_port);
    request(req, &r, &closed);
    snprintf(want, sizeof(want),
             "withruntime: this sandbox's egress policy blocked evil.test:%d (not_allowed)\n",
             http_port);
    ok(r.status == 403 && strcmp(r.body, want) == 0, "evil.test gets a 403 saying why (%d)",
       r.status);
    ok(strstr(r.head, "Content-Type: text/plain; charset=utf-8\r\n") &&
           strstr(r.head, "Connection: close\r\n") && closed,
       "text/plain, Connection: close, and closed after it");
    ok(denied_has("sb-1|evil.test|%d|not_allowed;", http_port), "the denied hook got it");

    const char *lookalikes[] = {"allowed.test.evil.test", "evilallowed.test", "allowed.tes",
                                "xallowed.test"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: %s:%d\r\n\r\n", lookalikes[i],
                 http_port);
        request(req, &r, NULL);
        ok(r.status == 403 && strstr(r.body, lookalikes[i]) && strstr(r.body, "(not_allowed)"),
           "lookalike %s: 403 not_allowed", lookalikes[i]);
        ok(denied_has("sb-1|%s|%d|not_allowed;", lookalikes[i], http_port), "and logged");
    }

    snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", http_port + 1);
    request(req, &r, NULL);
    ok(r.status == 403 && strstr(r.body, "(port_mismatch)"),
       "a Host naming another port than the one dialed: 403 port_mismatch (%d)", r.status);
    ok(denied_has("sb-1|allowed.test|%d|port_mismatch;", http_port + 1), "and logged");

    snprintf(req, sizeof(req), "CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n",
             http_port, http_port);
    request(req, &r, &closed);
    ok(r.status == 403 && strstr(r.body, "(connect)") && closed, "CONNECT: 403 (%d)", r.status);
    ok(denied_has("sb-1|allowed.test|%d|connect;", http_port), "and logged");

    const char *literals[] = {"127.0.0.1", "127.1", "2130706433", "[::1]"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", literals[i]);
        request(req, &r, NULL);
        ok(r.status == 403 && strstr(r.body, "(address)"), "an address as Host (%s): 403 address",
           literals[i]);
    }
    ok(denied_has("sb-1|127.1|%d|address;", http_port), "and logged with the host as written");

    ok(upstream_requests() == before, "none of the refused requests reached the upstream (%d)",
       upstream_requests() - before);
    struct proxy_stats s1 = stats();
    ok(s1.dialed == s0.dialed, "and nothing was dialed for them");

    snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: private.test:%d\r\n\r\n", http_port);
    request(req, &r, NULL);
    ok(r.status == 403 && strstr(r.body, "(private_address)"),
       "private.test (only 10.1.2.3): 403 private_address (%d)", r.status);
    snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: local.test:%d\r\n\r\n", http_port);
    request(req, &r, NULL);
    ok(r.status == 403 && strstr(r.body, "(private_address)"),
       "local.test (an address of the host's own): 403 private_address");
    ok(stats().dialed == s0.dialed && upstream_requests() == before, "still nothing dialed");
    ok(denied_has("sb-1|private.test|%d|private_address;", http_port) &&
           denied_has("sb-1|local.test|%d|private_address;", http_port),
       "both logged");

    snprintf(req, sizeof(req), "GET /mixed HTTP/1.1\r\nHost: mixed.test:%d\r\n\r\n", http_port);
    request(req, &r, NULL);
    ok(r.status == 200 && strstr(r.body, "GET /mixed"),
       "mixed.test (10.1.2.3 and 127.0.0.1): served from the public one (%d)", r.status);

    snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: nx.test:%d\r\n\r\n", http_port);
    request(req, &r, NULL);
    ok(r.status == 502 && strstr(r.body, "(nxdomain)"), "nx.test: 502 nxdomain (%d)", r.status);
    ok(denied_has("sb-1|nx.test|%d|nxdomain;", http_port), "and logged");

    set_orig(closed_port);
    snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: dead.test:%d\r\n\r\n", closed_port);
    request(req, &r, NULL);
    ok(r.status == 502 && strstr(r.body, "(connect_failed)"),
       "nothing listening upstream: 502 connect_failed (%d)", r.status);
    ok(denied_has("sb-1|dead.test|%d|connect_failed;", closed_port), "and logged");
    set_orig(http_port);

    int fd = dial_proxy(NULL);
    send_str(fd, "GET / HTTP/1.1\r\nHost: a\x01z\r\n\r\n");
    read_response(fd, &r);
    ok(r.status == 400 && strstr(r.body, "(malformed)"), "a malformed head: 400 (%d)", r.status);
    close(fd);
    ok(denied_has("sb-1|" DIALED_ADDR "|%d|malformed;", http_port),
       "logged with the address dialed, for want of a name");

    fd = dial_proxy(NULL);
    send_all(fd, "\x01\x02\x03 garbage\r\n\r\n", 15);
    ok(closed_within(fd, 3000), "garbage: closed");
    close(fd);
    ok(denied_has("sb-1|" DIALED_ADDR "|%d|protocol;", http_port), "logged as protocol");

    fd = dial_proxy("127.0.0.2");
    send_str(fd, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
    ok(closed_within(fd, 3000), "a peer that is no sandbox: closed");
    close(fd);
    ok(denied_has("|" DIALED_ADDR "|%d|unknown_client;", http_port), "logged as unknown_client");
}

static void keep_alive(void)
{
    struct resp r;
    char req[2048];
    set_orig(http_port);

    int before = upstream_requests();
    int fd = dial_proxy(NULL);
    snprintf(req, sizeof(req), "GET /one HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "GET /one"), "kept alive: the first request is served");
    snprintf(req, sizeof(req), "GET /two HTTP/1.1\r\nHost: other.test:%d\r\n\r\n", http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "other.test") && strstr(r.body, "(host_changed)"),
       "a second one to another (allowed) host: 403 host_changed (%d)", r.status);
    ok(closed_within(fd, 3000), "and closed");
    close(fd);
    ok(upstream_requests() == before + 1 && !http_log_has("GET /two"),
       "the upstream saw the first only");
    ok(denied_has("sb-1|other.test|%d|host_changed;", http_port), "logged");

    /* A body with Content-Length, then a second request: both found and checked. The first
     * body looks like a request to evil.test: it is a body, and must pass as one. */
    fd = dial_proxy(NULL);
    const char *inner = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
    snprintf(req, sizeof(req),
             "POST /submit HTTP/1.1\r\nHost: allowed.test:%d\r\nContent-Length: %zu\r\n\r\n%s"
             "GET /second HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n",
             http_port, strlen(inner), inner, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "POST /submit") && strstr(r.body, "body=35"),
       "a POST with a Content-Length body (that looks like a request) is served (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "GET /second"), "and the request after its body too (%d)",
       r.status);
    /* Now a body shorter than what follows, in the same write: the rest is a request head, and
     * is checked (the POST's answer still comes first). */
    snprintf(req, sizeof(req),
             "POST /short HTTP/1.1\r\nHost: allowed.test:%d\r\nContent-Length: 5\r\n\r\nhello"
             "GET /smuggled HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n",
             http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "POST /short") && strstr(r.body, "body=5"),
       "the POST with a 5-byte body is answered (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "evil.test:") && strstr(r.body, "(host_changed)"),
       "a head right after a 5-byte body, to evil.test: 403 host_changed (%d)", r.status);
    close(fd);
    ok(!http_log_has("/smuggled"), "the upstream never saw it");

    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "POST /chunked HTTP/1.1\r\nHost: allowed.test:%d\r\nTransfer-Encoding: chunked\r\n\r\n"
             "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
             "GET /after-chunked HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n",
             http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "POST /chunked") && strstr(r.body, "body=46"),
       "a chunked POST is served, its body whole (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "GET /after-chunked"),
       "and the request after the chunked body too (%d)", r.status);
    snprintf(
        req, sizeof(req),
        "POST /chunked2 HTTP/1.1\r\nHost: allowed.test:%d\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\r\n0\r\n\r\n"
        "GET /evil-after HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n",
        http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "POST /chunked2"), "the chunked POST is answered (%d)",
       r.status);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "evil.test:"),
       "a head right after a chunked body, to evil.test: refused (%d)", r.status);
    close(fd);
    ok(!http_log_has("/evil-after"), "the upstream never saw it");

    /* A policy change reaches the next request on an open connection. */
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req), "GET /before HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200, "a request before the policy change is served");
    set_policy("{\"internet\": false}");
    snprintf(req, sizeof(req), "GET /after HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "(no_internet)"),
       "after {\"internet\": false}, the next one on the same connection: 403 no_internet (%d)",
       r.status);
    close(fd);
    request(req, &r, NULL);
    ok(r.status == 403 && strstr(r.body, "(no_internet)"), "and a new connection too");
    ok(denied_has("sb-1|allowed.test|%d|no_internet;", http_port), "logged");
    set_policy("%s", allow_all);
    request(req, &r, NULL);
    ok(r.status == 200, "the allow list back: served again (%d)", r.status);
}

/* Reads byte by byte up to and including marker (a chunked body's end, say): 1 if it came. */
static int read_until(int fd, const char *marker, char *out, size_t cap)
{
    size_t n = 0, m = strlen(marker);
    while (n < cap - 1 && recv(fd, out + n, 1, 0) == 1) {
        out[++n] = '\0';
        if (n >= m && memcmp(out + n - m, marker, m) == 0)
            return 1;
    }
    return 0;
}

#define WS_HEADERS                                                                                 \
    "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: "                             \
    "dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"

/* A tunnel opens only on the 101 that answers a WebSocket handshake: what the client sends
 * behind one waits for its answer, and is the next request (checked) if that is not a 101. */
static void upgrades(void)
{
    struct resp r;
    char req[2048], back[64];
    int closed;
    set_orig(http_port);

    int fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /nows HTTP/1.1\r\nHost: allowed.test:%d\r\n" WS_HEADERS "\r\n"
             "GET /ride HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n",
             http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "GET /nows"),
       "a WebSocket handshake the upstream answers 200: that answer (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "evil.test:") && strstr(r.body, "(host_changed)"),
       "the request sent right behind it, to evil.test: 403 host_changed (%d)", r.status);
    ok(closed_within(fd, 3000), "and closed");
    close(fd);
    ok(!http_log_has("/ride") && !http_log_has("host=evil.test"), "the upstream never saw it");

    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /ws HTTP/1.1\r\nHost: allowed.test:%d\r\n" WS_HEADERS "\r\nearly frame",
             http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 101, "a WebSocket handshake the upstream accepts: 101 (%d)", r.status);
    memset(back, 0, sizeof(back));
    ok(read_full(fd, back, 11) == 11 && memcmp(back, "early frame", 11) == 0,
       "what the client sent behind the handshake went through the tunnel, and came back");
    const char *inner = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
    send_str(fd, inner);
    ok(read_full(fd, back, strlen(inner)) == (ssize_t)strlen(inner) &&
           memcmp(back, inner, strlen(inner)) == 0,
       "after the 101 the bytes are the tunnel's, not requests (the upstream echoed them)");
    close(fd);

    /* Answers that arrive a byte at a time are followed just the same. */
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /ws-dribble HTTP/1.1\r\nHost: allowed.test:%d\r\n" WS_HEADERS "\r\nheld",
             http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 101, "a 101 a byte at a time (%d)", r.status);
    memset(back, 0, sizeof(back));
    ok(read_full(fd, back, 4) == 4 && memcmp(back, "held", 4) == 0, "opens the tunnel");
    close(fd);
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /dribble HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n"
             "GET /ride4 HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n",
             http_port, http_port);
    send_str(fd, req);
    char body[512];
    ok(read_until(fd, "0\r\nX-T: 1\r\n\r\n", body, sizeof(body)) &&
           strncmp(body, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n", 42) == 0,
       "a 100 and a chunked answer a byte at a time, whole");
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "(host_changed)"),
       "then the refusal of the request behind it (%d)", r.status);
    close(fd);
    ok(!http_log_has("/ride4"), "the upstream never saw it");

    /* A 101 nobody asked for (a hostile upstream) opens nothing. */
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req), "GET /switch HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 101, "an unasked-for 101 reaches the client (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "GET /switch"), "with the answer after it");
    snprintf(req, sizeof(req), "GET /ride2 HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n", http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "(host_changed)"),
       "and the next request is still checked: 403 (%d)", r.status);
    close(fd);
    ok(!http_log_has("/ride2"), "the upstream never saw it");

    /* A handshake answered with a 101 to something else: no tunnel, and no 101 either. */
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /ws-h2c HTTP/1.1\r\nHost: allowed.test:%d\r\n" WS_HEADERS "\r\n"
             "GET /ride3 HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n",
             http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 502 && strstr(r.body, "(upstream_answer)"),
       "a WebSocket handshake answered 101 to h2c: 502 upstream_answer (%d)", r.status);
    ok(closed_within(fd, 3000), "and closed");
    close(fd);
    ok(!http_log_has("/ride3"), "what was sent behind it never went upstream");

    /* h2c, or any Upgrade but a lone websocket, is refused. */
    snprintf(req, sizeof(req),
             "GET /h2c HTTP/1.1\r\nHost: allowed.test:%d\r\nConnection: Upgrade, HTTP2-Settings"
             "\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
             http_port);
    request(req, &r, &closed);
    ok(r.status == 403 && strstr(r.body, "(upgrade)") && closed,
       "Upgrade: h2c: 403 upgrade, closed (%d)", r.status);
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /first HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n"
             "GET /list HTTP/1.1\r\nHost: allowed.test:%d\r\nUpgrade: websocket, h2c\r\n\r\n",
             http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "GET /first"), "kept alive: the first request served");
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "(upgrade)"),
       "then Upgrade: websocket, h2c: 403 upgrade (%d)", r.status);
    close(fd);
    ok(!http_log_has("/h2c") && !http_log_has("/list"), "the upstream saw neither");
    ok(denied_has("sb-1|allowed.test|%d|upgrade;", http_port), "logged as upgrade");

    /* The answer to a HEAD has a Content-Length and no body: the 101 right after it is found. */
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "HEAD /head HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n"
             "GET /ws HTTP/1.1\r\nHost: allowed.test:%d\r\n" WS_HEADERS "\r\nafter head",
             http_port, http_port);
    send_str(fd, req);
    read_answer(fd, &r, 1);
    ok(r.status == 200 && strstr(r.head, "Content-Length: "), "HEAD: its head (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 101, "then the handshake's 101 (%d)", r.status);
    memset(back, 0, sizeof(back));
    ok(read_full(fd, back, 10) == 10 && memcmp(back, "after head", 10) == 0,
       "and the tunnel works");
    close(fd);

    /* An error answer to a request before the handshake is not the handshake's. */
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /nope HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n"
             "GET /ws HTTP/1.1\r\nHost: allowed.test:%d\r\n" WS_HEADERS "\r\nafter head",
             http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 404, "a 404 to the request before a handshake (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 101, "then the handshake's 101 (%d)", r.status);
    memset(back, 0, sizeof(back));
    ok(read_full(fd, back, 10) == 10 && memcmp(back, "after head", 10) == 0,
       "and the tunnel works");
    close(fd);
}

/* A refused request on a kept-alive connection: the answers to the requests before it come
 * first, all of them, then the refusal, then the close. */
static void pipelined_refusal(void)
{
    struct resp r;
    char req[2048], body[1024];
    set_orig(http_port);

    int fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /p1 HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n"
             "HEAD /p2 HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n"
             "GET /chunky HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n"
             "POST /interim HTTP/1.1\r\nHost: allowed.test:%d\r\nContent-Length: 2\r\n\r\nhi"
             "GET /p5 HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n"
             "GET /p6 HTTP/1.1\r\nHost: evil.test:%d\r\n\r\n"
             "GET /p7 HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n",
             http_port, http_port, http_port, http_port, http_port, http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "GET /p1"), "pipelined: the first answer (%d)", r.status);
    read_answer(fd, &r, 1);
    ok(r.status == 200, "the HEAD's (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.head, "chunked") &&
           read_until(fd, "0\r\nX-Trailer: 1\r\n\r\n", body, sizeof(body)) &&
           strstr(body, "GET /chunky"),
       "a chunked one, trailer included (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 100, "a 100 Continue (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "POST /interim"), "and its final answer (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 200 && strstr(r.body, "GET /p5"), "the fifth (%d)", r.status);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "evil.test:") && strstr(r.body, "(host_changed)"),
       "then the refusal (%d)", r.status);
    ok(closed_within(fd, 3000), "and the close");
    close(fd);
    ok(http_log_has("GET /p5") && !http_log_has("/p6") && !http_log_has("/p7"),
       "the upstream saw those before the refusal, and nothing from it on");

    /* A WebSocket handshake refused: answered, then closed (not left to the client). */
    snprintf(req, sizeof(req), "GET /chat HTTP/1.1\r\nHost: evil.test:%d\r\n" WS_HEADERS "\r\n",
             http_port);
    fd = dial_proxy(NULL);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "(not_allowed)"),
       "a WebSocket handshake to a denied host: 403 (%d)", r.status);
    ok(closed_within(fd, 1000), "and closed");
    close(fd);
    fd = dial_proxy(NULL);
    snprintf(req, sizeof(req),
             "GET /ws-refused HTTP/1.1\r\nHost: allowed.test:%d\r\n" WS_HEADERS "\r\n"
             "GET /behind HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n",
             http_port, http_port);
    send_str(fd, req);
    read_response(fd, &r);
    ok(r.status == 403 && strcmp(r.body, "no\n") == 0,
       "a WebSocket handshake the upstream refuses: its 403 (%d)", r.status);
    ok(closed_within(fd, 1000), "then closed by the proxy");
    close(fd);
    ok(!http_log_has("/behind"), "what was sent behind it never went upstream");
    snprintf(req, sizeof(req), "GET /chat HTTP/1.1\r\nHost: evil.test:%d\r\n" WS_HEADERS "\r\n",
             http_port);
    fd = dial_proxy(NULL);
    snprintf(body, sizeof(body), "GET /one HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n%s", http_port,
             req);
    send_str(fd, body);
    read_response(fd, &r);
    read_response(fd, &r);
    ok(r.status == 403 && strstr(r.body, "(host_changed)"),
       "one behind an allowed request, to another host: 403 (%d)", r.status);
    ok(closed_within(fd, 1000), "and closed");
    close(fd);
}

static void tls(void)
{
    uint8_t hello[1024], back[1024];
    set_orig(tls_port);

    size_t n = client_hello("tls.test", hello);
    int fd = dial_proxy(NULL);
    send_all(fd, hello, n);
    send_str(fd, "after the hello");
    size_t want = n + strlen("after the hello");
    ssize_t got = read_full(fd, back, want);
    ok(got == (ssize_t)want && memcmp(back, hello, n) == 0 &&
           memcmp(back + n, "after the hello", 15) == 0,
       "TLS to an allowed SNI: relayed and echoed back verbatim (%zd of %zu)", got, want);
    pthread_mutex_lock(&mu);
    int same = tls_first_len >= n && memcmp(tls_first, hello, n) == 0;
    pthread_mutex_unlock(&mu);
    ok(same, "the upstream got the ClientHello byte for byte");
    close(fd);

    n = client_hello("evil.test", hello);
    fd = dial_proxy(NULL);
    send_all(fd, hello, n);
    ok(closed_within(fd, 3000), "TLS to a denied SNI: closed");
    close(fd);
    ok(denied_has("sb-1|evil.test|%d|not_allowed;", tls_port), "logged with the SNI");

    n = client_hello(NULL, hello);
    fd = dial_proxy(NULL);
    send_all(fd, hello, n);
    ok(closed_within(fd, 3000), "TLS without an SNI: closed");
    close(fd);
    ok(denied_has("sb-1|" DIALED_ADDR "|%d|no_sni;", tls_port), "logged as no_sni");

    fd = dial_proxy(NULL);
    send_all(fd, "\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", 10);
    ok(closed_within(fd, 3000), "a TLS record that is no ClientHello: closed");
    close(fd);
    ok(denied_has("sb-1|" DIALED_ADDR "|%d|malformed;", tls_port), "logged as malformed");
}

/* 4 MiB each way through a TLS relay, the client not reading at first, so that every buffer on
 * the way fills and the proxy has to stop reading. */
static void big(void)
{
    set_orig(tls_port);
    uint8_t hello[1024];
    size_t hn = client_hello("tls.test", hello);
    size_t total = hn + BIG;
    uint8_t *out = malloc(total), *in = malloc(total);
    memcpy(out, hello, hn);
    for (size_t i = 0; i < BIG; i++)
        out[hn + i] = (uint8_t)(i * 7 + (i >> 13));
    int fd = dial_proxy(NULL);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    size_t sent = 0, recvd = 0;
    uint64_t start = now_ms_monotonic(), end = start + 60000;
    while (recvd < total && now_ms_monotonic() < end) {
        int reading = now_ms_monotonic() > start + 500;
        struct pollfd pfd = {fd, (short)((reading ? POLLIN : 0) | (sent < total ? POLLOUT : 0)), 0};
        if (poll(&pfd, 1, 100) < 0)
            break;
        if (sent < total && (pfd.revents & POLLOUT)) {
            ssize_t k = send(fd, out + sent, total - sent, MSG_NOSIGNAL);
            if (k > 0)
                sent += (size_t)k;
        }
        if (reading && (pfd.revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t k = recv(fd, in + recvd, total - recvd, 0);
            if (k <= 0)
                break;
            recvd += (size_t)k;
        }
    }
    ok(sent == total && recvd == total && memcmp(in, out, total) == 0,
       "4 MiB through the relay and back intact (sent %zu, received %zu of %zu)", sent, recvd,
       total);
    struct proxy_stats s = stats();
    ok(s.queued_max <= BUFFER_MAX + 64 * 1024,
       "no direction queued much more than buffer_max %d (most: %zu)", BUFFER_MAX, s.queued_max);
    ok(s.bytes_up >= total && s.bytes_down >= total, "counted both ways (%llu up, %llu down)",
       (unsigned long long)s.bytes_up, (unsigned long long)s.bytes_down);
    close(fd);
    free(out);
    free(in);
}

static void limits(void)
{
    set_orig(http_port);
    int fds[PER_PEER];
    for (int i = 0; i < PER_PEER; i++)
        fds[i] = dial_proxy("127.0.0.3");
    int extra = dial_proxy("127.0.0.3");
    ok(closed_within(extra, 2000), "connection %d from one peer: closed at once", PER_PEER + 1);
    close(extra);
    ok(denied_has("sb-3|" DIALED_ADDR "|%d|too_many_connections;", http_port),
       "logged as too_many_connections");
    int other = dial_proxy(NULL);
    char req[256];
    snprintf(req, sizeof(req), "GET /other-peer HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n",
             http_port);
    send_str(other, req);
    struct resp r;
    read_response(other, &r);
    ok(r.status == 200, "another peer is still served meanwhile (%d)", r.status);
    close(other);

    /* The silent ones are closed after first_bytes_ms. */
    uint64_t t0 = now_ms_monotonic();
    ok(closed_within(fds[0], FIRST_BYTES_MS + 3000), "a client that says nothing is closed");
    uint64_t took = now_ms_monotonic() - t0;
    ok(took + 500 >= FIRST_BYTES_MS / 2, "after first_bytes_ms (%llu ms)",
       (unsigned long long)took);
    ok(denied_has("sb-3|" DIALED_ADDR "|%d|timeout;", http_port), "logged as timeout");
    for (int i = 0; i < PER_PEER; i++)
        close(fds[i]);
}

static void idle_and_close_peer(void)
{
    set_orig(tls_port);
    uint8_t hello[1024], back[1024];
    size_t n = client_hello("tls.test", hello);

    int fd = dial_proxy(NULL);
    send_all(fd, hello, n);
    ok(read_full(fd, back, n) == (ssize_t)n, "a relay is up");
    uint64_t t0 = now_ms_monotonic();
    ok(closed_within(fd, IDLE_MS + 3000), "and closed when idle");
    ok(now_ms_monotonic() - t0 + 200 >= IDLE_MS, "after idle_ms (%llu ms)",
       (unsigned long long)(now_ms_monotonic() - t0));
    close(fd);

    fd = dial_proxy(NULL);
    send_all(fd, hello, n);
    ok(read_full(fd, back, n) == (ssize_t)n, "another relay is up");
    int waiting = dial_proxy(NULL); /* still sniffing: closed too */
    msleep(100);
    struct proxy_stats s0 = stats();
    event_base_once(base, -1, EV_TIMEOUT, close_peer, "127.0.0.1", &(struct timeval){0, 0});
    ok(closed_within(fd, 1000) && closed_within(waiting, 1000),
       "proxy_close_peer closes the sandbox's relay and its connection still sniffing");
    close(fd);
    close(waiting);
    struct proxy_stats s1 = stats();
    ok(s1.active == 0 && s0.active >= 2, "none left open (%u before, %u after)", s0.active,
       s1.active);
}

/* ---- intercepted TLS ---- */

static struct proxy *mproxy;
static struct sockaddr_in mproxy_addr;
/* Intercepting too, with a bucket of 3 handshakes that refills once in 1,000 s. */
static struct proxy *rproxy;
static struct sockaddr_in rproxy_addr;
static struct tlsmitm *mitm, *upstream_ca, *rogue_ca;
static struct tls_upstream up_ok, up_wrong, up_rogue;
static X509 *mitm_ca;
static SSL_CTX *sandbox_ctx; /* trusts only the proxy's CA */

struct mstats_req {
    struct proxy_stats s;
    atomic_int done;
};

static void copy_mstats(evutil_socket_t fd, short what, void *arg)
{
    struct mstats_req *req = arg;
    proxy_stats(mproxy, &req->s);
    req->done = 1;
}

static struct proxy_stats mstats(void)
{
    struct mstats_req req = {.done = 0};
    event_base_once(base, -1, EV_TIMEOUT, copy_mstats, &req, &(struct timeval){0, 0});
    for (int i = 0; i < WAIT_MS && !req.done; i++)
        msleep(1);
    return req.s;
}

static int tls_upstream_requests(void)
{
    pthread_mutex_lock(&mu);
    int n = tls_requests;
    pthread_mutex_unlock(&mu);
    return n;
}

static int tls_heads_has(const char *want)
{
    pthread_mutex_lock(&mu);
    int found = strstr(tls_heads, want) != NULL;
    pthread_mutex_unlock(&mu);
    return found;
}

static const unsigned char alpn_h11[] = "\x08http/1.1", alpn_h2[] = "\x02h2";

/* A sandbox's TLS client on a new connection to the intercepting proxy: SNI sni, ALPN alpn
 * (wire format). Returns the SSL after its handshake, or NULL (*fd then closed and -1). */
/* A TLS connection to the proxy at `at` from address src (NULL: 127.0.0.1) for sni; NULL
 * (and *fd -1) if the handshake did not complete. */
static SSL *tls_dial_from(const struct sockaddr_in *at, const char *src, const char *sni,
                          const unsigned char *alpn, size_t alpn_len, int *fd)
{
    *fd = dial_at(at, src);
    SSL *ssl = SSL_new(sandbox_ctx);
    SSL_set_tlsext_host_name(ssl, sni);
    SSL_set1_host(ssl, sni);
    SSL_set_alpn_protos(ssl, alpn, (unsigned)alpn_len);
    SSL_set_fd(ssl, *fd);
    if (SSL_connect(ssl) != 1) {
        ERR_clear_error();
        SSL_free(ssl);
        close(*fd);
        *fd = -1;
        return NULL;
    }
    return ssl;
}

static SSL *tls_dial(const char *sni, const unsigned char *alpn, size_t alpn_len, int *fd)
{
    return tls_dial_from(&mproxy_addr, NULL, sni, alpn, alpn_len, fd);
}

static void tls_close(SSL *ssl, int fd)
{
    if (ssl)
        SSL_free(ssl);
    if (fd >= 0)
        close(fd);
}

static int tls_send(SSL *ssl, const char *s)
{
    return SSL_write(ssl, s, (int)strlen(s)) == (int)strlen(s) ? 0 : -1;
}

/* read_response over TLS. */
static void tls_read_response(SSL *ssl, struct resp *r)
{
    memset(r, 0, sizeof(*r));
    r->status = -1;
    size_t n = 0;
    while (n < sizeof(r->head) - 1) {
        if (SSL_read(ssl, r->head + n, 1) != 1)
            return;
        n++;
        if (n >= 4 && memcmp(r->head + n - 4, "\r\n\r\n", 4) == 0)
            break;
    }
    const char *cl = strcasestr(r->head, "\r\ncontent-length:");
    size_t blen = cl ? strtoul(cl + 17, NULL, 10) : 0;
    if (blen >= sizeof(r->body))
        return;
    for (size_t got = 0; got < blen;) {
        int k = SSL_read(ssl, r->body + got, (int)(blen - got));
        if (k <= 0)
            return;
        got += (size_t)k;
    }
    sscanf(r->head, "HTTP/1.1 %d", &r->status);
}

/* Whether the peer closes the TLS connection within ms (close_notify, EOF or error). */
static int tls_closed_within(SSL *ssl, int fd, int ms)
{
    uint64_t end = now_ms_monotonic() + (uint64_t)ms;
    char buf[4096];
    for (;;) {
        int left = (int)(end - now_ms_monotonic());
        if (left <= 0)
            return 0;
        struct pollfd pfd = {fd, POLLIN, 0};
        if (!SSL_pending(ssl) && poll(&pfd, 1, left) <= 0)
            return 0;
        int k = SSL_read(ssl, buf, sizeof(buf));
        if (k <= 0) {
            ERR_clear_error();
            return 1;
        }
    }
}

static void mitm_basics(void)
{
    struct resp r;
    char req[1024];
    int fd;
    set_orig(up_ok.port);

    SSL *ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    ok(ssl != NULL, "intercepted: the sandbox's handshake for allowed.test succeeds");
    if (!ssl)
        return;
    X509 *peer = SSL_get1_peer_certificate(ssl);
    ok(SSL_get_verify_result(ssl) == X509_V_OK && peer &&
           X509_check_host(peer, "allowed.test", 0, 0, NULL) == 1 &&
           X509_check_issued(mitm_ca, peer) == X509_V_OK,
       "it verified a certificate for allowed.test issued by the proxy's CA");
    X509_free(peer);
    const unsigned char *sel = NULL;
    unsigned sel_len = 0;
    SSL_get0_alpn_selected(ssl, &sel, &sel_len);
    ok(sel_len == 8 && memcmp(sel, "http/1.1", 8) == 0, "ALPN agreed on http/1.1");
    tls_send(ssl, "GET /hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
    tls_read_response(ssl, &r);
    ok(r.status == 200 && strstr(r.body, "upstream saw GET /hello host=allowed.test body=0"),
       "an allowed HTTPS GET gets the upstream's answer (%d %s)", r.status, r.body);
    snprintf(req, sizeof(req), "GET /again HTTP/1.1\r\nHost: ALLOWED.test:%d\r\n\r\n", up_ok.port);
    tls_send(ssl, req);
    tls_read_response(ssl, &r);
    ok(r.status == 200 && strstr(r.body, "GET /again"),
       "kept alive, a second one with Host naming the SNI and the port dialed (%d)", r.status);
    tls_close(ssl, fd);

    int before = tls_upstream_requests();
    ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    tls_send(ssl, "GET /evil HTTP/1.1\r\nHost: evil.test\r\n\r\n");
    tls_read_response(ssl, &r);
    ok(r.status == 403 && strstr(r.body, "evil.test") && strstr(r.body, "(host_mismatch)"),
       "Host: evil.test under SNI allowed.test: 403 host_mismatch over TLS (%d %s)", r.status,
       r.body);
    ok(tls_closed_within(ssl, fd, 3000), "and closed");
    tls_close(ssl, fd);
    ok(denied_has("sb-1|evil.test|%d|host_mismatch;", up_ok.port), "logged");

    ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    snprintf(req, sizeof(req), "GET /port HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n",
             up_ok.port + 1);
    tls_send(ssl, req);
    tls_read_response(ssl, &r);
    ok(r.status == 403 && strstr(r.body, "(host_mismatch)"),
       "a Host naming another port: 403 host_mismatch (%d)", r.status);
    tls_close(ssl, fd);

    ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    tls_send(ssl, "GET /one HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
    tls_read_response(ssl, &r);
    ok(r.status == 200, "kept alive: the first request is served (%d)", r.status);
    tls_send(ssl, "GET /two HTTP/1.1\r\nHost: other.test\r\n\r\n");
    tls_read_response(ssl, &r);
    ok(r.status == 403 && strstr(r.body, "other.test") && strstr(r.body, "(host_mismatch)"),
       "a second one with another Host: 403 host_mismatch (%d)", r.status);
    ok(tls_closed_within(ssl, fd, 3000), "and closed");
    tls_close(ssl, fd);
    ok(tls_upstream_requests() == before + 1 && !tls_heads_has("/evil") &&
           !tls_heads_has("/port") && !tls_heads_has("GET /two"),
       "the upstream saw only the one allowed request (%d)", tls_upstream_requests() - before);

    ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    SSL_write(ssl, "\x01\x02\x03 garbage\r\n\r\n", 15);
    ok(tls_closed_within(ssl, fd, 3000), "bytes that are no HTTP inside the TLS: closed");
    tls_close(ssl, fd);
    ok(denied_has("sb-1|allowed.test|%d|protocol;", up_ok.port), "logged as protocol");
}

static void mitm_secrets(void)
{
    struct resp r;
    int fd;
    set_orig(up_ok.port);
    SSL *ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    tls_send(ssl, "GET /secret HTTP/1.1\r\nHost: allowed.test\r\n" PLACEHOLDER "\r\n");
    tls_read_response(ssl, &r);
    ok(r.status == 200 && strstr(r.body, "GET /secret"), "a request with a placeholder is served");
    ok(tls_heads_has("GET /secret HTTP/1.1\r\nHost: allowed.test\r\n" SECRET "\r\n") &&
           !tls_heads_has("PLACEHOLDER"),
       "the upstream got the real value in its place");
    ok(!strstr(r.head, "real-secret") && !strstr(r.body, "real-secret"),
       "and the sandbox never saw it");
    tls_send(ssl, "POST /secret2 HTTP/1.1\r\nHost: allowed.test\r\n" PLACEHOLDER
                  "Content-Length: 5\r\n\r\nhello");
    tls_read_response(ssl, &r);
    ok(r.status == 200 && strstr(r.body, "POST /secret2") && strstr(r.body, "body=5"),
       "a kept-alive POST's head is rewritten too, its body intact (%d)", r.status);
    ok(tls_heads_has("POST /secret2 HTTP/1.1\r\nHost: allowed.test\r\n" SECRET),
       "with the real value upstream");
    tls_close(ssl, fd);
    char want[64];
    snprintf(want, sizeof(want), "sb-1|allowed.test|%d;", up_ok.port);
    pthread_mutex_lock(&mu);
    int hooked = strstr(rewrite_log, want) != NULL;
    pthread_mutex_unlock(&mu);
    ok(hooked, "rewrite_head was given the sandbox's id, the SNI and the port dialed");
}

static void mitm_refusals(void)
{
    struct resp r;
    int fd;

    set_orig(up_wrong.port);
    SSL *ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    tls_send(ssl, "GET /wrong HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
    tls_read_response(ssl, &r);
    ok(r.status == 502 && strstr(r.body, "(upstream_tls)"),
       "an upstream whose certificate names another host: 502 upstream_tls (%d %s)", r.status,
       r.body);
    tls_close(ssl, fd);
    ok(denied_has("sb-1|allowed.test|%d|upstream_tls;", up_wrong.port), "logged");

    set_orig(up_rogue.port);
    ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    tls_send(ssl, "GET /rogue HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
    tls_read_response(ssl, &r);
    ok(r.status == 502 && strstr(r.body, "(upstream_tls)"),
       "an upstream whose certificate is from an untrusted CA: 502 upstream_tls (%d)", r.status);
    tls_close(ssl, fd);
    ok(denied_has("sb-1|allowed.test|%d|upstream_tls;", up_rogue.port), "logged");
    ok(!tls_heads_has("/wrong") && !tls_heads_has("/rogue"), "neither got the request");

    /* A WebSocket handshake refused over TLS: answered, then closed. */
    set_orig(up_ok.port);
    ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    tls_send(ssl, "GET /chat HTTP/1.1\r\nHost: other.test\r\n" WS_HEADERS "\r\n");
    tls_read_response(ssl, &r);
    ok(r.status == 403 && strstr(r.body, "(host_mismatch)"),
       "a WebSocket handshake for another host over TLS: 403 (%d)", r.status);
    ok(tls_closed_within(ssl, fd, 1000), "and closed");
    tls_close(ssl, fd);

    ssl = tls_dial("allowed.test", alpn_h2, sizeof(alpn_h2) - 1, &fd);
    ok(ssl == NULL, "a client offering only h2: its handshake fails");
    tls_close(ssl, fd);
    ok(denied_has("sb-1|allowed.test|%d|alpn;", up_ok.port), "logged as alpn");

    ssl = tls_dial("evil.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    ok(ssl == NULL, "an SNI the policy denies: no handshake at all");
    tls_close(ssl, fd);
    ok(denied_has("sb-1|evil.test|%d|not_allowed;", up_ok.port), "logged as not_allowed");

    /* A client that sends a real ClientHello (made through memory BIOs, so that nothing of
     * the proxy's answer is ever read) and never its Finished. */
    fd = dial_at(&mproxy_addr, NULL);
    ssl = SSL_new(sandbox_ctx);
    SSL_set_tlsext_host_name(ssl, "allowed.test");
    SSL_set_alpn_protos(ssl, alpn_h11, sizeof(alpn_h11) - 1);
    BIO *wbio = BIO_new(BIO_s_mem());
    SSL_set_bio(ssl, BIO_new(BIO_s_mem()), wbio);
    int rc = SSL_connect(ssl);
    char *ch = NULL;
    long chlen = BIO_get_mem_data(wbio, &ch);
    ok(rc < 0 && SSL_get_error(ssl, rc) == SSL_ERROR_WANT_READ && chlen > 0 &&
           send_all(fd, ch, (size_t)chlen) == 0,
       "a ClientHello sent, then silence");
    uint64_t t0 = now_ms_monotonic();
    ok(closed_within(fd, FIRST_BYTES_MS + 3000), "closed");
    uint64_t took = now_ms_monotonic() - t0;
    ok(took + 200 >= FIRST_BYTES_MS, "after first_bytes_ms (%llu ms)", (unsigned long long)took);
    ok(denied_has("sb-1|allowed.test|%d|timeout;", up_ok.port), "logged as timeout");
    tls_close(ssl, fd);

    /* A well-formed ClientHello OpenSSL cannot answer (no signature_algorithms, no key_share). */
    uint8_t hello[1024];
    size_t n = client_hello("allowed.test", hello);
    fd = dial_at(&mproxy_addr, NULL);
    send_all(fd, hello, n);
    ok(closed_within(fd, 3000), "a handshake that fails: closed");
    close(fd);
    ok(denied_has("sb-1|allowed.test|%d|tls_handshake;", up_ok.port), "logged as tls_handshake");
    ERR_clear_error();
}

/* 4 MiB up (a POST body) and 4 MiB down (GET /big) through one intercepted connection, the
 * client not reading at first so that every buffer on the way fills. */
/* A sandbox that replays ClientHellos gets its burst, then its connections are closed
 * unanswered; a neighbour's bucket is its own. */
static void mitm_rate(void)
{
    set_orig(up_ok.port);
    int fd, answered = 0;
    for (int i = 0; i < 3; i++) {
        SSL *ssl =
            tls_dial_from(&rproxy_addr, NULL, "allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
        answered += ssl != NULL;
        tls_close(ssl, fd);
    }
    ok(answered == 3, "handshake rate: a burst of 3 is answered (%d)", answered);
    SSL *ssl =
        tls_dial_from(&rproxy_addr, NULL, "allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    ok(ssl == NULL, "handshake rate: the 4th is closed unanswered");
    tls_close(ssl, fd);
    ok(denied_has("sb-1|allowed.test|%d|handshake_rate;", up_ok.port),
       "handshake rate: the denial says handshake_rate");
    ssl = tls_dial_from(&rproxy_addr, "127.0.0.3", "allowed.test", alpn_h11, sizeof(alpn_h11) - 1,
                        &fd);
    ok(ssl != NULL, "handshake rate: a neighbour's handshake is answered");
    tls_close(ssl, fd);
}

static void mitm_big(void)
{
    set_orig(up_ok.port);
    int fd;
    SSL *ssl = tls_dial("allowed.test", alpn_h11, sizeof(alpn_h11) - 1, &fd);
    uint8_t *buf = malloc(BIG);
    pattern(buf, BIG);
    char head[256];
    snprintf(head, sizeof(head),
             "POST /upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: %d\r\n\r\n", BIG);
    tls_send(ssl, head);
    size_t sent = 0;
    while (sent < BIG) {
        int k = SSL_write(ssl, buf + sent, BIG - (int)sent > 65536 ? 65536 : BIG - (int)sent);
        if (k <= 0)
            break;
        sent += (size_t)k;
    }
    struct resp r;
    tls_read_response(ssl, &r);
    char want[64];
    snprintf(want, sizeof(want), "body=%d sum=%08x", BIG, fnv(buf, BIG));
    ok(r.status == 200 && strstr(r.body, want), "4 MiB up, intact (%d %s)", r.status, r.body);

    tls_send(ssl, "GET /big HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
    msleep(500); /* not reading: the proxy must stop reading the upstream */
    char line[4096];
    size_t n = 0;
    while (n < sizeof(line) - 1 && SSL_read(ssl, line + n, 1) == 1) {
        n++;
        if (n >= 4 && memcmp(line + n - 4, "\r\n\r\n", 4) == 0)
            break;
    }
    line[n] = '\0';
    memset(buf, 0, BIG);
    size_t got = 0;
    while (got < BIG) {
        int k = SSL_read(ssl, buf + got, (int)(BIG - got));
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    uint8_t *want_buf = malloc(BIG);
    pattern(want_buf, BIG);
    ok(strncmp(line, "HTTP/1.1 200", 12) == 0 && got == BIG && memcmp(buf, want_buf, BIG) == 0,
       "4 MiB down, intact (%zu)", got);
    struct proxy_stats s = mstats();
    ok(s.queued_max <= BUFFER_MAX + 64 * 1024,
       "no direction queued much more than buffer_max %d, TLS records included (most: %zu)",
       BUFFER_MAX, s.queued_max);
    ok(s.bytes_up >= BIG && s.bytes_down >= BIG, "counted both ways (%llu up, %llu down)",
       (unsigned long long)s.bytes_up, (unsigned long long)s.bytes_down);
    tls_close(ssl, fd);
    free(buf);
    free(want_buf);
}

static void keepalive_tick(evutil_socket_t fd, short what, void *arg)
{
}

static void *loop_main(void *arg)
{
    event_base_dispatch(base);
    return NULL;
}

int main(void)
{
    evthread_use_pthreads();
    base = event_base_new();
    struct wr_err err = {0};

    struct sockaddr_in dns_addr = {.sin_family = AF_INET,
                                   .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int dns_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t alen = sizeof(dns_addr);
    ok(dns_fd >= 0 && bind(dns_fd, (struct sockaddr *)&dns_addr, sizeof(dns_addr)) == 0 &&
           getsockname(dns_fd, (struct sockaddr *)&dns_addr, &alen) == 0,
       "the fake DNS server's socket");
    struct event *dns_ev = event_new(base, dns_fd, EV_READ | EV_PERSIST, fake_dns, NULL);
    event_add(dns_ev, NULL);

    struct evconnlistener *http_l = server_listen(0, &http_port);
    struct evconnlistener *tls_l = server_listen(1, &tls_port);
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    alen = sizeof(sa);
    bind(probe, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(probe, (struct sockaddr *)&sa, &alen);
    closed_port = ntohs(sa.sin_port);
    close(probe); /* bound, never listening, closed: a port nothing answers on */
    ok(http_l && tls_l && closed_port > 0, "fake upstreams on ports %d (HTTP), %d (TLS)", http_port,
       tls_port);

    /* The CAs: the proxy's, the fake internet's, and one nobody trusts. */
    char dir[] = "/tmp/wr-proxy-tls-XXXXXX";
    char files[6][128];
    const char *names[6] = {"mitm.pem", "mitm.key", "up.pem", "up.key", "rogue.pem", "rogue.key"};
    ok(mkdtemp(dir) != NULL, "a directory for the CAs");
    for (int i = 0; i < 6; i++)
        snprintf(files[i], sizeof(files[i]), "%s/%s", dir, names[i]);
    ok(tlsmitm_ca_create(files[0], files[1], "proxy CA", &err) == 0 &&
           tlsmitm_ca_create(files[2], files[3], "upstream CA", &err) == 0 &&
           tlsmitm_ca_create(files[4], files[5], "rogue CA", &err) == 0,
       "three CAs %s", err.msg);
    mitm = tlsmitm_new(files[0], files[1], files[2], &err);
    upstream_ca = tlsmitm_new(files[2], files[3], NULL, &err);
    rogue_ca = tlsmitm_new(files[4], files[5], NULL, &err);
    ok(mitm && upstream_ca && rogue_ca, "tlsmitm_new %s", err.msg);
    mitm_ca = tlsmitm_ca_cert(mitm);
    up_ok = (struct tls_upstream){.m = upstream_ca, .name = "allowed.test"};
    up_wrong = (struct tls_upstream){.m = upstream_ca, .name = "wrong.test"};
    up_rogue = (struct tls_upstream){.m = rogue_ca, .name = "allowed.test"};
    tls_upstream_listen(&up_ok);
    tls_upstream_listen(&up_wrong);
    tls_upstream_listen(&up_rogue);
    ok(up_ok.l && up_wrong.l && up_rogue.l, "fake TLS upstreams on %d, %d (wrong name), %d (rogue)",
       up_ok.port, up_wrong.port, up_rogue.port);
    sandbox_ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(sandbox_ctx, SSL_VERIFY_PEER, NULL);
    ok(SSL_CTX_load_verify_locations(sandbox_ctx, files[0], NULL) == 1,
       "the sandbox trusts the proxy's CA only");

    snprintf(allow_all, sizeof(allow_all),
             "{\"internet\": true, \"allow\": [\"allowed.test:%d\", \"other.test:%d\", "
             "\"private.test:%d\", \"local.test:%d\", \"mixed.test:%d\", \"nx.test:%d\", "
             "\"dead.test:%d\", \"tls.test:%d\", \"allowed.test:%d\", \"other.test:%d\", "
             "\"allowed.test:%d\", \"allowed.test:%d\"]}",
             http_port, http_port, http_port, http_port, http_port, http_port, closed_port,
             tls_port, up_ok.port, up_ok.port, up_wrong.port, up_rogue.port);
    set_policy("%s", allow_all);

    lk = lookup_new(base, (struct sockaddr *)&dns_addr, sizeof(dns_addr), &err);
    ok(lk != NULL, "lookup_new %s", err.msg);

    struct addr_ranges extra;
    ok(addr_ranges_parse("127.0.0.0/8", &extra, &err) == 0, "127.0.0.0/8 counts as public here");
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    proxy_addr =
        (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    alen = sizeof(proxy_addr);
    ok(bind(lfd, (struct sockaddr *)&proxy_addr, sizeof(proxy_addr)) == 0 &&
           listen(lfd, 128) == 0 && getsockname(lfd, (struct sockaddr *)&proxy_addr, &alen) == 0,
       "the proxy's listening socket");
    struct proxy_config cfg = {.extra_public = &extra,
                               .max_conns_per_peer = PER_PEER,
                               .first_bytes_ms = FIRST_BYTES_MS,
                               .connect_ms = 3000,
                               .idle_ms = IDLE_MS,
                               .buffer_max = BUFFER_MAX};
    struct proxy_hooks hooks = {.policy = hook_policy,
                                .original_dst = hook_original_dst,
                                .is_local = hook_is_local,
                                .denied = hook_denied};
    struct proxy_hooks none = {0};
    ok(proxy_new(base, -1, lk, &cfg, &hooks, NULL, &err) == NULL,
       "proxy_new without a socket fails");
    ok(proxy_new(base, dup(lfd), lk, &cfg, &none, NULL, &err) == NULL,
       "proxy_new without hooks fails (and closes the socket)");
    proxy = proxy_new(base, lfd, lk, &cfg, &hooks, NULL, &err);
    ok(proxy != NULL, "proxy_new %s", err.msg);

    int mfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    mproxy_addr =
        (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    alen = sizeof(mproxy_addr);
    ok(bind(mfd, (struct sockaddr *)&mproxy_addr, sizeof(mproxy_addr)) == 0 &&
           listen(mfd, 128) == 0 && getsockname(mfd, (struct sockaddr *)&mproxy_addr, &alen) == 0,
       "the intercepting proxy's listening socket");
    struct proxy_config mcfg = cfg;
    mcfg.mitm = mitm;
    struct proxy_hooks mhooks = hooks;
    mhooks.rewrite_head = hook_rewrite;
    mproxy = proxy_new(base, mfd, lk, &mcfg, &mhooks, NULL, &err);
    ok(mproxy != NULL, "proxy_new with an interception context %s", err.msg);
    int rfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    rproxy_addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    alen = sizeof(rproxy_addr);
    ok(bind(rfd, (struct sockaddr *)&rproxy_addr, sizeof(rproxy_addr)) == 0 &&
           listen(rfd, 128) == 0 && getsockname(rfd, (struct sockaddr *)&rproxy_addr, &alen) == 0,
       "the rate-limited proxy's listening socket");
    rproxy_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct proxy_config rcfg = mcfg;
    rcfg.handshakes_per_s = 0.001;
    rcfg.handshake_burst = 3;
    rproxy = proxy_new(base, rfd, lk, &rcfg, &mhooks, NULL, &err);
    ok(rproxy != NULL, "proxy_new with a handshake rate %s", err.msg);

    struct event *tick = event_new(base, -1, EV_PERSIST, keepalive_tick, NULL);
    event_add(tick, &(struct timeval){1, 0});
    pthread_t loop;
    pthread_create(&loop, NULL, loop_main, NULL);

    http_basics();
    keep_alive();
    upgrades();
    pipelined_refusal();
    tls();
    big();
    limits();
    idle_and_close_peer();
    mitm_basics();
    mitm_secrets();
    mitm_refusals();
    mitm_big();
    mitm_rate();

    struct proxy_stats s = stats();
    ok(s.accepted > 0 && s.denied > 0 && s.requests > 0 && s.active_max <= PER_PEER + 8,
       "counters: %llu accepted, %llu denied, %llu requests, %llu dialed, at most %u open",
       (unsigned long long)s.accepted, (unsigned long long)s.denied, (unsigned long long)s.requests,
       (unsigned long long)s.dialed, s.active_max);

    event_base_loopbreak(base);
    pthread_join(loop, NULL);
    proxy_free(proxy);
    proxy_free(mproxy);
    proxy_free(rproxy);
    lookup_free(lk);
    for (int i = 0; i < SERVER_CONNS; i++)
        if (server_conns[i])
            bufferevent_free(server_conns[i]);
    evconnlistener_free(http_l);
    evconnlistener_free(tls_l);
    evconnlistener_free(up_ok.l);
    evconnlistener_free(up_wrong.l);
    evconnlistener_free(up_rogue.l);
    tlsmitm_free(mitm);
    tlsmitm_free(upstream_ca);
    tlsmitm_free(rogue_ca);
    SSL_CTX_free(sandbox_ctx);
    for (int i = 0; i < 6; i++)
        unlink(files[i]);
    rmdir(dir);
    event_free(tick);
    event_free(dns_ev);
    close(dns_fd);
    event_base_free(base);
    json_decref(policy);
    for (int i = 0; i < n_old; i++)
        json_decref(old_policies[i]);
    return tap_done();
}
