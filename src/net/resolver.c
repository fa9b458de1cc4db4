/*
 * The sandboxes' DNS resolver: see resolver.h. Each client query is parsed by dnsmsg, judged
 * against the client's policy, and answered from here; only an allowed A question makes the
 * resolver write a query of its own to the upstream.
 *
 * Upstream queries go out from one unconnected UDP socket per resolver rather than one per
 * query: a socket per query would cost an fd and an event per lookup (the bound here is memory
 * fixed at resolver_new) and a sandbox could exhaust the daemon's fds with it. The price is a
 * fixed source port, so an off-path spoofer of the upstream's answers has only the 16-bit random
 * id and the echoed question to guess; the upstream is an operator-configured resolver on a path
 * the daemon trusts, and replies from any other address are ignored. Revisit (port per query or
 * a small pool) if the upstream ever sits across an untrusted network.
 */
#include "net/resolver.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/util.h"
#include "net/addr.h"
#include "net/dnscache.h"
#include "net/dnsmsg.h"
#include "net/netpolicy.h"

/* Datagrams read per readiness callback, so one busy socket does not starve the loop. */
#define READ_BATCH 64
/* An upstream reply: we advertise DNS_EDNS_UDP, so a larger one is a broken upstream (dropped,
 * and the query times out); the slack only lets us see that it was larger. */
#define UPSTREAM_BUF (DNS_EDNS_UDP + 1)
/* Addresses kept from one upstream answer: more than any client needs, and the reply to the
 * client must fit DNS_EDNS_UDP anyway (about 70 A records). */
#define ADDRS_MAX 32
/* Attempts at a random id not already in flight; with at most RESOLVER_PENDING_MAX of 65536 in
 * use, failing all of them means getrandom is broken. */
#define ID_TRIES 64

struct pending {
    struct resolver *r;
    struct event *timer; /* made at resolver_new, added while the slot is used */
    int used;
    int tries; /* datagrams sent upstream for this query */
    uint16_t up_id;
    struct dns_query q; /* the client's question; q.name is what we asked upstream */
    struct sockaddr_storage client;
    socklen_t client_len;
};

struct resolver {
    struct event_base *base;
    int fd;    /* clients' socket (owned) */
    int up_fd; /* our queries to the upstream (owned) */
    struct event *ev_client, *ev_up;
    struct sockaddr_storage upstream;
    socklen_t upstream_len;
    struct addr_ranges extra;
    struct resolver_hooks hooks;
    void *ctx;
    struct resolver_stats stats;
    struct dnscache *cache; /* borrowed; NULL: every allowed A question goes upstream */
    unsigned cache_owner;
    uint8_t in[DNS_EDNS_UDP];   /* a client's query; larger ones are dropped */
    uint8_t out[DNS_EDNS_UDP];  /* a reply to a client, or our query upstream */
    uint8_t upin[UPSTREAM_BUF]; /* an upstream's reply */
    struct pending pending[RESOLVER_PENDING_MAX];
};

static void reply(struct resolver *r, const struct sockaddr *client, socklen_t len, int n)
{
    /* A lost reply (full buffer) is a lost datagram: the client asks again. */
    if (n > 0)
        (void)sendto(r->fd, r->out, (size_t)n, MSG_NOSIGNAL, client, len);
}

static void reply_rcode(struct resolver *r, const struct dns_query *q,
                        const struct sockaddr *client, socklen_t len, int rcode)
{
    if (rcode == DNS_RCODE_SERVFAIL)
        r->stats.servfail++;
    reply(r, client, len, dnsmsg_reply_error(q, rcode, r->out, sizeof(r->out)));
}

static void refuse(struct resolver *r, const struct dns_query *q, const struct sockaddr *client,
                   socklen_t len, const char *reason)
{
    r->stats.refused++;
    if (r->hooks.denied)
        r->hooks.denied(r->ctx, client, len, q->name, q->qtype, reason);
    reply_rcode(r, q, client, len, DNS_RCODE_REFUSED);
}

static void timer_add_ms(struct event *ev, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(ev, &tv);
}

static void slot_release(struct pending *p)
{
    event_del(p->timer);
    p->used = 0;
    p->r->stats.pending--;
}

/* Sends (or sends again) p's query upstream. A failed send is left to the retry timer. */
static void upstream_send(struct pending *p)
{
    struct resolver *r = p->r;
    int n = dnsmsg_build_query(p->up_id, p->q.name, p->q.qtype, r->out, sizeof(r->out));
    p->tries++;
    if (n < 0)
        return;
    if (sendto(r->up_fd, r->out, (size_t)n, MSG_NOSIGNAL, (struct sockaddr *)&r->upstream,
               r->upstream_len) == n)
        r->stats.upstream_sent++;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct pending *p = arg;
    struct resolver *r = p->r;
    if (p->tries < 2) {
        r->stats.upstream_retries++;
        upstream_send(p);
        timer_add_ms(p->timer, RESOLVER_TIMEOUT_MS - RESOLVER_RETRY_MS);
        return;
    }
    r->stats.upstream_timeouts++;
    reply_rcode(r, &p->q, (struct sockaddr *)&p->client, p->client_len, DNS_RCODE_SERVFAIL);
    slot_release(p);
}

static struct pending *slot_by_id(struct resolver *r, uint16_t id)
{
    for (size_t i = 0; i < RESOLVER_PENDING_MAX; i++)
        if (r->pending[i].used && r->pending[i].up_id == id)
            return &r->pending[i];
    return NULL;
}

/* An allowed A question: ask upstream, or SERVFAIL if we cannot now. */
static void upstream_start(struct resolver *r, const struct dns_query *q,
                           const struct sockaddr *client, socklen_t len)
{
    struct pending *p = NULL;
    for (size_t i = 0; i < RESOLVER_PENDING_MAX && !p; i++)
        if (!r->pending[i].used)
            p = &r->pending[i];
    if (!p) {
        r->stats.overflow++;
        reply_rcode(r, q, client, len, DNS_RCODE_SERVFAIL);
        return;
    }
    uint16_t id = 0;
    int found = 0;
    for (int t = 0; t < ID_TRIES && !found; t++)
        found = getrandom(&id, sizeof(id), 0) == (ssize_t)sizeof(id) && !slot_by_id(r, id);
    if (!found) {
        reply_rcode(r, q, client, len, DNS_RCODE_SERVFAIL);
        return;
    }
    p->used = 1;
    p->tries = 0;
    p->up_id = id;
    p->q = *q;
    memcpy(&p->client, client, len);
    p->client_len = len;
    if (++r->stats.pending > r->stats.pending_max)
        r->stats.pending_max = r->stats.pending;
    upstream_send(p);
    timer_add_ms(p->timer, RESOLVER_RETRY_MS);
}

/* What the proxy would dial: the same predicate, with the same hook for the host's addresses. */
static int dns_addr_dialable(const struct resolver *r, const struct dns_addr *a)
{
    if (a->family != AF_INET)
        return 0;
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    memcpy(&sin.sin_addr, a->addr, 4);
    return addr_dialable((struct sockaddr *)&sin, sizeof(sin), &r->extra, r->hooks.is_local,
                         r->ctx);
}

/* Answers an allowed A question q with what the upstream said (now, or earlier from the cache):
 * rcode, addrs[0..n) and the TTL left. */
static void answer(struct resolver *r, const struct dns_query *q, const struct sockaddr *client,
                   socklen_t len, int rcode, const struct dns_addr *addrs, size_t n, uint32_t ttl)
{
    if (rcode == DNS_RCODE_NOERROR) {
        struct dns_addr keep[ADDRS_MAX];
        size_t k = 0;
        for (size_t i = 0; i < n && k < ADDRS_MAX; i++)
            if (dns_addr_dialable(r, &addrs[i]))
                keep[k++] = addrs[i];
        if (n > 0 && k == 0) {
            /* Every address is one the proxy would refuse (private, a cloud's, the host's own):
             * REFUSED, not NXDOMAIN. The name exists; our policy withholds it, and the sandbox's
             * network log says so. An NXDOMAIN would be a lie that a stub caches as negative. */
            refuse(r, q, client, len, "private_address");
        } else {
            uint32_t t = ttl < RESOLVER_TTL_MAX ? ttl : RESOLVER_TTL_MAX;
            reply(r, client, len, dnsmsg_reply_addrs(q, keep, k, t, r->out, sizeof(r->out)));
        }
    } else if (rcode == DNS_RCODE_NXDOMAIN) {
        reply_rcode(r, q, client, len, DNS_RCODE_NXDOMAIN);
    } else {
        /* Other rcodes, a malformed answer, or TC (we do not fall back to TCP). */
        reply_rcode(r, q, client, len, DNS_RCODE_SERVFAIL);
    }
}

static void handle_query(struct resolver *r, size_t n, const struct sockaddr *client, socklen_t len)
{
    struct dns_query q;
    switch (dnsmsg_parse_query(r->in, n, &q)) {
    case DNS_QUERY_DROP: r->stats.dropped++; return;
    case DNS_QUERY_FORMERR: reply_rcode(r, &q, client, len, DNS_RCODE_FORMERR); return;
    case DNS_QUERY_NOTIMP: reply_rcode(r, &q, client, len, DNS_RCODE_NOTIMP); return;
    case DNS_QUERY_BADVERS: reply_rcode(r, &q, client, len, DNS_RCODE_BADVERS); return;
    case DNS_QUERY_BADNAME:
        /* No allowed name has such a byte; NXDOMAIN is true for every policy. */
        reply_rcode(r, &q, client, len, DNS_RCODE_NXDOMAIN);
        return;
    case DNS_QUERY_OK: break;
    }
    json_t *policy = r->hooks.policy(r->ctx, client, len);
    if (!policy) {
        refuse(r, &q, client, len, "unknown_client");
        return;
    }
    if (!netpolicy_name_allowed(policy, q.name)) {
        refuse(r, &q, client, len, "not_allowed");
        return;
    }
    if (q.qtype != DNS_TYPE_A) {
        r->stats.nodata++;
        reply(r, client, len, dnsmsg_reply_addrs(&q, NULL, 0, 0, r->out, sizeof(r->out)));
        return;
    }
    struct dnscache_answer ca;
    if (r->cache && dnscache_get(r->cache, q.name, now_ms_monotonic(), &ca)) {
        r->stats.cache_hits++;
        int rcode = ca.kind == DNSCACHE_NXDOMAIN ? DNS_RCODE_NXDOMAIN : DNS_RCODE_NOERROR;
        answer(r, &q, client, len, rcode, ca.addrs, ca.n, ca.ttl);
        return;
    }
    upstream_start(r, &q, client, len);
}

static void on_client(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct resolver *r = arg;
    for (int i = 0; i < READ_BATCH; i++) {
        struct sockaddr_storage from;
        socklen_t flen = sizeof(from);
        /* MSG_TRUNC: the datagram's real length, so an oversized one is seen and dropped rather
         * than parsed cut short. */
        ssize_t n = recvfrom(fd, r->in, sizeof(r->in), MSG_TRUNC, (struct sockaddr *)&from, &flen);
        if (n < 0)
            return; /* EAGAIN, or an error the next datagram will tell us again */
        r->stats.queries++;
        if (flen > sizeof(from) ||
            (r->hooks.client_ok && !r->hooks.client_ok(r->ctx, (struct sockaddr *)&from, flen))) {
            r->stats.foreign++;
            continue;
        }
        if ((size_t)n > sizeof(r->in)) {
            r->stats.dropped++;
            continue;
        }
        handle_query(r, (size_t)n, (struct sockaddr *)&from, flen);
    }
}

/* The upstream answered p's query with rcode (or a dns_answer_error other than NOT_OURS): the
 * answer goes into the cache (before the filter: the filter is applied to each answer given),
 * then to the client. */
static void upstream_done(struct pending *p, int rcode, const struct dns_addr *addrs, size_t n,
                          uint32_t ttl)
{
    struct resolver *r = p->r;
    if (r->cache && rcode == DNS_RCODE_NOERROR) {
        /* The dialable addresses first, so that the few the cache keeps of a long answer are
         * ones a sandbox may be given; all of them if none is (a refusal again, from cache). */
        struct dns_addr sorted[ADDRS_MAX];
        int ok[ADDRS_MAX];
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            ok[i] = dns_addr_dialable(r, &addrs[i]);
        for (int dialable = 1; dialable >= 0; dialable--)
            for (size_t i = 0; i < n; i++)
                if (ok[i] == dialable)
                    sorted[k++] = addrs[i];
        dnscache_put(r->cache, r->cache_owner, p->q.name, n ? DNSCACHE_ADDRS : DNSCACHE_NODATA,
                     sorted, k, ttl, now_ms_monotonic());
    } else if (r->cache && rcode == DNS_RCODE_NXDOMAIN) {
        dnscache_put(r->cache, r->cache_owner, p->q.name, DNSCACHE_NXDOMAIN, NULL, 0, ttl,
                     now_ms_monotonic());
    }
    answer(r, &p->q, (struct sockaddr *)&p->client, p->client_len, rcode, addrs, n, ttl);
    slot_release(p);
}

static void on_upstream(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct resolver *r = arg;
    for (int i = 0; i < READ_BATCH; i++) {
        struct sockaddr_storage from;
        socklen_t flen = sizeof(from);
        memset(&from, 0, sizeof(from));
        ssize_t n =
            recvfrom(fd, r->upin, sizeof(r->upin), MSG_TRUNC, (struct sockaddr *)&from, &flen);
        if (n < 0)
            return;
        if ((size_t)n > sizeof(r->upin) || n < DNS_HEADER_LEN || !addr_same(&from, &r->upstream))
            continue;
        struct pending *p = slot_by_id(r, (uint16_t)(r->upin[0] << 8 | r->upin[1]));
        if (!p)
            continue;
        struct dns_addr addrs[ADDRS_MAX];
        size_t na = 0;
        uint32_t ttl = 0;
        int rc = dnsmsg_parse_answer(r->upin, (size_t)n, p->up_id, p->q.name, p->q.qtype, addrs,
                                     ADDRS_MAX, &na, &ttl);
        if (rc == DNS_ANSWER_NOT_OURS)
            continue; /* a stray or a spoof: keep waiting for the real one */
        upstream_done(p, rc, addrs, na, ttl);
    }
}

struct resolver *resolver_new(struct event_base *base, int udp_fd, const struct sockaddr *upstream,
                              socklen_t upstream_len, const struct addr_ranges *extra,
                              const struct resolver_hooks *hooks, void *ctx, struct wr_err *err)
{
    if (!base || udp_fd < 0 || !upstream || !hooks || !hooks->policy ||
        upstream_len > sizeof(struct sockaddr_storage) ||
        (upstream->sa_family != AF_INET && upstream->sa_family != AF_INET6)) {
        if (udp_fd >= 0)
            close(udp_fd);
        wr_err_set(err, EINVAL, "resolver: bad arguments");
        return NULL;
    }
    struct resolver *r = calloc(1, sizeof(*r));
    if (!r) {
        close(udp_fd);
        wr_err_sys(err, ENOMEM, "resolver");
        return NULL;
    }
    r->base = base;
    r->fd = udp_fd;
    r->up_fd = -1;
    memcpy(&r->upstream, upstream, upstream_len);
    r->upstream_len = upstream_len;
    if (extra)
        r->extra = *extra;
    r->hooks = *hooks;
    r->ctx = ctx;
    if (evutil_make_socket_nonblocking(udp_fd) < 0) {
        wr_err_sys(err, errno, "resolver: non-blocking socket");
        goto fail;
    }
    r->up_fd = socket(upstream->sa_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->up_fd < 0) {
        wr_err_sys(err, errno, "resolver: upstream socket");
        goto fail;
    }
    r->ev_client = event_new(base, r->fd, EV_READ | EV_PERSIST, on_client, r);
    r->ev_up = event_new(base, r->up_fd, EV_READ | EV_PERSIST, on_upstream, r);
    if (!r->ev_client || !r->ev_up)
        goto fail_events;
    for (size_t i = 0; i < RESOLVER_PENDING_MAX; i++) {
        r->pending[i].r = r;
        r->pending[i].timer = event_new(base, -1, 0, on_timer, &r->pending[i]);
        if (!r->pending[i].timer)
            goto fail_events;
    }
    if (event_add(r->ev_client, NULL) < 0 || event_add(r->ev_up, NULL) < 0)
        goto fail_events;
    return r;
fail_events:
    wr_err_set(err, ENOMEM, "resolver: events");
fail:
    resolver_free(r);
    return NULL;
}

void resolver_free(struct resolver *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < RESOLVER_PENDING_MAX; i++)
        if (r->pending[i].timer)
            event_free(r->pending[i].timer);
    if (r->ev_client)
        event_free(r->ev_client);
    if (r->ev_up)
        event_free(r->ev_up);
    if (r->fd >= 0)
        close(r->fd);
    if (r->up_fd >= 0)
        close(r->up_fd);
    free(r);
}

void resolver_set_cache(struct resolver *r, struct dnscache *cache, unsigned owner)
{
    r->cache = cache;
    r->cache_owner = owner;
}

void resolver_stats(const struct resolver *r, struct resolver_stats *out)
{
    *out = r->stats;
}
