/*
 * The sandboxes' DNS resolver (net/resolver.h) against a fake upstream that lives in this test:
 * both on 127.0.0.1, both served by one event loop in a thread, a plain blocking client in the
 * main thread. What a sandbox would see: allowed names answered with the upstream's public
 * addresses and a capped TTL, everything else refused without a word to the upstream, no
 * HTTPS/TXT/AAAA records, no address the proxy would not dial (private, a cloud's, the host's),
 * SERVFAIL for a silent upstream after its retry, NXDOMAIN passed on, garbage ignored, another
 * resolver's client neither answered nor logged, and the pending table's bound under a burst.
 * Then with the cache two resolvers share (net/dnscache.h): a repeated lookup, an NXDOMAIN and a
 * refusal for private addresses answered without the upstream (the refusal logged each time),
 * the policy checked before the cache (a client whose policy refuses a cached name is refused),
 * SERVFAIL not cached, and a flood of random allowed names that keeps to its owner's share and
 * leaves the neighbour's cached names alone.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/addr.h"
#include "net/dnscache.h"
#include "net/dnsmsg.h"
#include "net/netpolicy.h"
#include "net/resolver.h"
#include "tap.h"

/* How long the client waits for any one reply: far beyond RESOLVER_TIMEOUT_MS, so only a reply
 * that never comes fails a check. */
#define REPLY_WAIT_MS 10000
#define BURST 300
#define BURST_SOCKETS 6 /* 50 queries each, well within a socket's receive buffer */
/* An address of "this host" (the is_local hook says so), in the test's extra public range. */
#define HOST_ADDR "198.18.0.66"
/* Every name under this the fake upstream answers (198.18.0.13): a flood's random names. */
#define FLOOD_SUFFIX ".flood.pythonhosted.org"

static struct event_base *base;
static struct resolver *resolver;
static struct resolver *neighbour; /* a second resolver, sharing the cache */
static struct dnscache *cache;
static json_t *policy;
static json_t *narrow;    /* the policy of narrow_port's client: gone.test only */
static int stranger_port; /* this client is no sandbox: the policy hook does not know it */
static int narrow_port;
static int foreign_port; /* this one is another resolver's client: client_ok turns it away */

/* The fake upstream's counters, written on the loop thread. */
static atomic_int up_received, up_slow;

static pthread_mutex_t denied_mu = PTHREAD_MUTEX_INITIALIZER;
static char denied_log[4096];

/* ---- the fake upstream (loop thread) ---- */

static void put16(uint8_t *b, size_t *off, unsigned v)
{
    b[(*off)++] = (uint8_t)(v >> 8);
    b[(*off)++] = (uint8_t)v;
}

static void put32(uint8_t *b, size_t *off, uint32_t v)
{
    put16(b, off, v >> 16);
    put16(b, off, v & 0xffff);
}

static void put_name(uint8_t *b, size_t *off, const char *name)
{
    while (*name) {
        const char *dot = strchr(name, '.');
        size_t n = dot ? (size_t)(dot - name) : strlen(name);
        b[(*off)++] = (uint8_t)n;
        memcpy(b + *off, name, n);
        *off += n;
        name += n + (dot ? 1 : 0);
    }
    b[(*off)++] = 0;
}

/* A record owned by the question's name (a pointer to offset 12) or by owner. */
static void put_rr_head(uint8_t *b, size_t *off, const char *owner, unsigned type, uint32_t ttl)
{
    if (owner)
        put_name(b, off, owner);
    else
        put16(b, off, 0xc00c);
    put16(b, off, type);
    put16(b, off, DNS_CLASS_IN);
    put32(b, off, ttl);
}

static void put_a(uint8_t *b, size_t *off, const char *owner, const char *ip, uint32_t ttl)
{
    put_rr_head(b, off, owner, DNS_TYPE_A, ttl);
    put16(b, off, 4);
    inet_pton(AF_INET, ip, b + *off);
    *off += 4;
}

static void fake_upstream(evutil_socket_t fd, short what, void *arg)
{
    uint8_t in[2048], out[1024];
    struct sockaddr_storage from;
    socklen_t flen = sizeof(from);
    ssize_t n;
    while ((n = recvfrom(fd, in, sizeof(in), MSG_DONTWAIT, (struct sockaddr *)&from, &flen)) >= 0) {
        struct dns_query q;
        up_received++;
        if (dnsmsg_parse_query(in, (size_t)n, &q) != DNS_QUERY_OK)
            continue;
        if (strcmp(q.name, "slow.test") == 0) {
            up_slow++;
            continue;
        }
        unsigned rcode = DNS_RCODE_NOERROR, an = 0;
        size_t off = DNS_HEADER_LEN;
        memcpy(out + off, q.qwire, q.qwire_len);
        off += q.qwire_len;
        put16(out, &off, q.qtype);
        put16(out, &off, DNS_CLASS_IN);
        int a = q.qtype == DNS_TYPE_A;
        if (strcmp(q.name, "pypi.org") == 0 && a) {
            put_a(out, &off, NULL, "198.18.0.10", 300);
            an = 1;
        } else if (strcmp(q.name, "files.pythonhosted.org") == 0 && a) {
            put_rr_head(out, &off, NULL, DNS_TYPE_CNAME, 30);
            size_t len_at = off;
            off += 2;
            put_name(out, &off, "a.cdn.test");
            size_t rdlen = off - len_at - 2;
            put16(out, &len_at, (unsigned)rdlen);
            put_a(out, &off, "a.cdn.test", "198.18.0.11", 300);
            an = 2;
        } else if (strcmp(q.name, "evil-private.test") == 0 && a) {
            put_a(out, &off, NULL, "10.0.0.5", 300);
            an = 1;
        } else if (strcmp(q.name, "host.test") == 0 && a) {
            put_a(out, &off, NULL, HOST_ADDR, 300);
            an = 1;
        } else if (strcmp(q.name, "mixed.test") == 0 && a) {
            put_a(out, &off, NULL, HOST_ADDR, 300);
            put_a(out, &off, NULL, "198.18.0.12", 300);
            put_a(out, &off, NULL, "168.63.129.16", 300);
            an = 3;
        } else if (a && strlen(q.name) > strlen(FLOOD_SUFFIX) &&
                   strcmp(q.name + strlen(q.name) - strlen(FLOOD_SUFFIX), FLOOD_SUFFIX) == 0) {
            put_a(out, &off, NULL, "198.18.0.13", 300);
            an = 1;
        } else if (strcmp(q.name, "gone.test") == 0) {
            rcode = DNS_RCODE_NXDOMAIN;
        } else if (an == 0 && strcmp(q.name, "pypi.org") != 0 &&
                   strcmp(q.name, "files.pythonhosted.org") &&
                   strcmp(q.name, "evil-private.test") != 0 && strcmp(q.name, "host.test") != 0 &&
                   strcmp(q.name, "mixed.test") != 0) {
            rcode = DNS_RCODE_SERVFAIL;
        }
        size_t h = 0;
        put16(out, &h, q.id);
        put16(out, &h, 0x8180 | rcode); /* QR, RD, RA */
        put16(out, &h, 1);
        put16(out, &h, an);
        put16(out, &h, 0);
        put16(out, &h, 0);
        sendto(fd, out, off, 0, (struct sockaddr *)&from, flen);
        flen = sizeof(from);
    }
}

/* ---- the resolver's hooks (loop thread) ---- */

static json_t *hook_policy(void *ctx, const struct sockaddr *client, socklen_t len)
{
    const struct sockaddr_in *sin = (const void *)client;
    if (client->sa_family == AF_INET && ntohs(sin->sin_port) == stranger_port)
        return NULL;
    if (client->sa_family == AF_INET && ntohs(sin->sin_port) == narrow_port)
        return narrow;
    return policy;
}

static int hook_client_ok(void *ctx, const struct sockaddr *client, socklen_t len)
{
    const struct sockaddr_in *sin = (const void *)client;
    return !(client->sa_family == AF_INET && ntohs(sin->sin_port) == foreign_port);
}

static int hook_is_local(void *ctx, const struct sockaddr *addr, socklen_t len)
{
    struct in_addr host;
    inet_pton(AF_INET, HOST_ADDR, &host);
    return addr->sa_family == AF_INET &&
           ((const struct sockaddr_in *)addr)->sin_addr.s_addr == host.s_addr;
}

static void hook_denied(void *ctx, const struct sockaddr *client, socklen_t len, const char *name,
                        uint16_t qtype, const char *reason)
{
    pthread_mutex_lock(&denied_mu);
    size_t used = strlen(denied_log);
    snprintf(denied_log + used, sizeof(denied_log) - used, "%s/%u/%s;", name, qtype, reason);
    pthread_mutex_unlock(&denied_mu);
}

static int denied_count(const char *entry)
{
    pthread_mutex_lock(&denied_mu);
    int n = 0;
    for (const char *p = denied_log; (p = strstr(p, entry)) != NULL; p += strlen(entry))
        n++;
    pthread_mutex_unlock(&denied_mu);
    return n;
}

static int denied_has(const char *entry)
{
    pthread_mutex_lock(&denied_mu);
    int found = strstr(denied_log, entry) != NULL;
    pthread_mutex_unlock(&denied_mu);
    return found;
}

/* ---- the loop and the resolver's counters ---- */

static void keepalive(evutil_socket_t fd, short what, void *arg)
{
}

static void *loop_main(void *arg)
{
    event_base_dispatch(base);
    return NULL;
}

struct stats_req {
    struct resolver_stats s;
    atomic_int done;
};

static void copy_stats(evutil_socket_t fd, short what, void *arg)
{
    struct stats_req *req = arg;
    resolver_stats(resolver, &req->s);
    req->done = 1;
}

/* The resolver's counters, read on the loop's thread (as resolver_stats asks). */
static struct resolver_stats stats(void)
{
    struct stats_req req = {.done = 0};
    struct timeval now = {0, 0};
    event_base_once(base, -1, EV_TIMEOUT, copy_stats, &req, &now);
    for (int i = 0; i < REPLY_WAIT_MS && !req.done; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    return req.s;
}

/* ---- the client (main thread) ---- */

static int udp_socket_on(struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    socklen_t len = sizeof(*sa);
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int big = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    if (fd < 0 || bind(fd, (struct sockaddr *)sa, sizeof(*sa)) < 0 ||
        getsockname(fd, (struct sockaddr *)sa, &len) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static struct sockaddr_in resolver_addr, neighbour_addr;

static int client_socket_to(int *port, const struct sockaddr_in *to)
{
    struct sockaddr_in me;
    int fd = udp_socket_on(&me);
    struct timeval tv = {REPLY_WAIT_MS / 1000, 0};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        connect(fd, (const struct sockaddr *)to, sizeof(*to)) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (port)
        *port = ntohs(me.sin_port);
    return fd;
}

static int client_socket(int *port)
{
    return client_socket_to(port, &resolver_addr);
}

static uint16_t next_id = 0x1000;

/* Sends a query for name and qtype (upper: its letters upper-cased on the wire); returns its id,
 * or -1. */
static int send_query(int fd, const char *name, uint16_t qtype, int upper)
{
    uint8_t q[512];
    uint16_t id = next_id++;
    int n = dnsmsg_build_query(id, name, qtype, q, sizeof(q));
    if (n < 0)
        return -1;
    for (int i = DNS_HEADER_LEN; upper && i < n; i++)
        q[i] = (uint8_t)toupper(q[i]);
    return send(fd, q, (size_t)n, 0) == n ? id : -1;
}

struct answer {
    int rcode; /* or a dns_answer_error, -100 for no reply, -101 for one not parsed */
    uint8_t raw[DNS_EDNS_UDP];
    size_t len;
    struct dns_addr addrs[8];
    size_t n;
    uint32_t ttl;
};

static void recv_answer_parse(struct answer *a, int id, const char *name, uint16_t qtype)
{
    a->rcode =
        dnsmsg_parse_answer(a->raw, a->len, (uint16_t)id, name, qtype, a->addrs, 8, &a->n, &a->ttl);
}

/* Reads one reply and parses it as the answer to query id (id < 0: only reads it). */
static void recv_answer(int fd, int id, const char *name, uint16_t qtype, struct answer *a)
{
    memset(a, 0, sizeof(*a));
    ssize_t n = recv(fd, a->raw, sizeof(a->raw), 0);
    if (n < 0) {
        a->rcode = -100;
        return;
    }
    a->len = (size_t)n;
    a->rcode =
        dnsmsg_parse_answer(a->raw, a->len, (uint16_t)id, name, qtype, a->addrs, 8, &a->n, &a->ttl);
}

static void lookup(int fd, const char *name, uint16_t qtype, int upper, struct answer *a)
{
    int id = send_query(fd, name, qtype, upper);
    recv_answer(fd, id, name, qtype, a);
}

static int is_v4(const struct answer *a, size_t i, const char *ip)
{
    uint8_t want[4];
    inet_pton(AF_INET, ip, want);
    return i < a->n && a->addrs[i].family == AF_INET && memcmp(a->addrs[i].addr, want, 4) == 0;
}

static unsigned ancount(const struct answer *a)
{
    return a->len >= DNS_HEADER_LEN ? (unsigned)(a->raw[6] << 8 | a->raw[7]) : 99;
}

static void answers(int fd)
{
    struct answer a;
    lookup(fd, "pypi.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && a.n == 1 && is_v4(&a, 0, "198.18.0.10"),
       "pypi.org A is the upstream's 198.18.0.10 (rcode %d, %zu addresses)", a.rcode, a.n);
    ok(a.ttl == RESOLVER_TTL_MAX, "its TTL of 300 is capped at %d (got %u)", RESOLVER_TTL_MAX,
       a.ttl);

    lookup(fd, "pypi.org", DNS_TYPE_A, 1, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && is_v4(&a, 0, "198.18.0.10"), "PYPI.ORG works too");
    ok(a.len > DNS_HEADER_LEN + 1 && memcmp(a.raw + DNS_HEADER_LEN + 1, "PYPI", 4) == 0,
       "and the question is echoed in the client's case");

    lookup(fd, "files.pythonhosted.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && a.n == 1 && is_v4(&a, 0, "198.18.0.11"),
       "files.pythonhosted.org (a CNAME upstream) gives 198.18.0.11");
    ok(a.ttl == 30, "with the chain's smallest TTL (got %u)", a.ttl);

    int up0 = up_received;
    lookup(fd, "pypi.org", DNS_TYPE_AAAA, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && a.n == 0 && ancount(&a) == 0 && up_received == up0,
       "pypi.org AAAA: an empty NOERROR without asking upstream (sandboxes have no IPv6)");

    lookup(fd, "mixed.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && a.n == 1 && is_v4(&a, 0, "198.18.0.12"),
       "mixed.test: of the host's own address, a public one and Azure's host endpoint, only the "
       "public one is handed out (%zu addresses)",
       a.n);
    lookup(fd, "host.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_REFUSED && a.n == 0,
       "host.test (only the host's own address, public by range) is REFUSED (rcode %d, %zu)",
       a.rcode, a.n);
    ok(denied_has("host.test/1/private_address;"), "and logged as a private address");

    lookup(fd, "gone.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NXDOMAIN, "the upstream's NXDOMAIN is passed on (rcode %d)", a.rcode);
}

static void refusals(int fd)
{
    struct answer a;
    struct resolver_stats s0 = stats();
    int up0 = up_received;

    lookup(fd, "evil.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_REFUSED && ancount(&a) == 0, "evil.test is REFUSED (rcode %d)",
       a.rcode);
    lookup(fd, "pythonhosted.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_REFUSED, "pythonhosted.org is not under *.pythonhosted.org: REFUSED");
    lookup(fd, "evil.test", DNS_TYPE_TXT, 0, &a);
    ok(a.rcode == DNS_RCODE_REFUSED, "a refused name is refused for every type");

    lookup(fd, "pypi.org", DNS_TYPE_HTTPS, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && ancount(&a) == 0, "pypi.org HTTPS: NOERROR, no records");
    lookup(fd, "pypi.org", DNS_TYPE_TXT, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && ancount(&a) == 0, "pypi.org TXT: NOERROR, no records");
    lookup(fd, "pypi.org", DNS_TYPE_SVCB, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && ancount(&a) == 0, "pypi.org SVCB: NOERROR, no records");

    int stranger = client_socket(&stranger_port);
    lookup(stranger, "pypi.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_REFUSED, "a client with no policy is REFUSED even for pypi.org");
    close(stranger);

    struct resolver_stats s1 = stats();
    ok(up_received == up0, "none of that reached the upstream (it saw %d datagrams)",
       up_received - up0);
    ok(s1.upstream_sent == s0.upstream_sent && s1.refused == s0.refused + 4 &&
           s1.nodata == s0.nodata + 3,
       "the resolver's counters agree: nothing sent, 4 refused, 3 answered empty");

    lookup(fd, "evil-private.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_REFUSED && a.n == 0,
       "evil-private.test (10.0.0.5 upstream) is REFUSED, no address handed out");

    ok(denied_has("evil.test/1/not_allowed;") && denied_has("evil.test/16/not_allowed;") &&
           denied_has("pythonhosted.org/1/not_allowed;"),
       "the denied hook got the names not allowed");
    ok(denied_has("pypi.org/1/unknown_client;"), "and the unknown client's lookup");
    ok(denied_has("evil-private.test/1/private_address;"), "and the private address");
    ok(!denied_has("pypi.org/65/") && !denied_has("gone.test"), "and nothing it answered (%s)",
       denied_log);
}

/* A neighbour's query sent to this resolver: no answer, no trace in this owner's log. */
static void foreign(int fd)
{
    struct resolver_stats s0 = stats();
    int f = client_socket(&foreign_port);
    ok(send_query(f, "forged.test", DNS_TYPE_A, 0) >= 0 &&
           send_query(f, "pypi.org", DNS_TYPE_A, 0) >= 0,
       "a foreign client sent a refused name and an allowed one");
    /* Datagrams are read in order: once the owner's answer is here, the foreign ones were
     * handled, and any reply to them would already wait in f's queue. */
    struct answer a;
    lookup(fd, "pypi.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR, "the owner's own lookup after them is answered");
    uint8_t buf[DNS_EDNS_UDP];
    errno = 0;
    ssize_t n = recv(f, buf, sizeof(buf), MSG_DONTWAIT);
    ok(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "the foreign client got no answer (%zd)",
       n);
    ok(!denied_has("forged.test"), "and its refused name is not in the owner's log (%s)",
       denied_log);
    struct resolver_stats s1 = stats();
    ok(s1.foreign == s0.foreign + 2 && s1.refused == s0.refused &&
           s1.upstream_sent == s0.upstream_sent + 1,
       "both counted as foreign, nothing refused, only the owner's lookup went upstream");
    close(f);
}

static void garbage(int fd)
{
    struct resolver_stats s0 = stats();
    uint8_t junk[1400];
    memset(junk, 0, sizeof(junk));
    ok(send(fd, "hello", 5, 0) == 5, "sent a 5-byte datagram");
    /* A well-formed header asking one question, but 1400 bytes long: over the size, dropped. */
    size_t off = 0;
    put16(junk, &off, 0x4242);
    put16(junk, &off, 0x0100);
    put16(junk, &off, 1);
    ok(send(fd, junk, sizeof(junk), 0) == (ssize_t)sizeof(junk), "sent a 1400-byte datagram");
    /* A response (QR set) is never answered: no reflection loops. */
    junk[2] = 0x81;
    ok(send(fd, junk, 40, 0) == 40, "sent a response");
    struct answer a;
    int id = send_query(fd, "pypi.org", DNS_TYPE_A, 0);
    recv_answer(fd, id, "pypi.org", DNS_TYPE_A, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && is_v4(&a, 0, "198.18.0.10"),
       "the first reply after them answers the next good query (rcode %d)", a.rcode);
    struct resolver_stats s1 = stats();
    ok(s1.dropped == s0.dropped + 3 && s1.queries == s0.queries + 4,
       "the three were read and dropped");

    /* No question at all: FORMERR, with the id. */
    uint8_t noq[DNS_HEADER_LEN] = {0x77, 0x01, 0x01, 0x00};
    ok(send(fd, noq, sizeof(noq), 0) == (ssize_t)sizeof(noq), "sent a query without a question");
    ssize_t n = recv(fd, a.raw, sizeof(a.raw), 0);
    ok(n >= DNS_HEADER_LEN && a.raw[0] == 0x77 && a.raw[1] == 0x01 && (a.raw[2] & 0x80) &&
           (a.raw[3] & 0x0f) == DNS_RCODE_FORMERR,
       "it gets FORMERR");
}

static void silence(int fd)
{
    struct resolver_stats s0 = stats();
    struct answer a;
    lookup(fd, "slow.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_SERVFAIL, "slow.test (the upstream never answers): SERVFAIL (rcode %d)",
       a.rcode);
    struct resolver_stats s1 = stats();
    ok(s1.upstream_retries == s0.upstream_retries + 1 && s1.upstream_sent == s0.upstream_sent + 2,
       "after one retry (2 sent)");
    ok(s1.upstream_timeouts == s0.upstream_timeouts + 1 && s1.pending == 0,
       "counted as a timeout, its slot free again");
}

static void burst(void)
{
    int fds[BURST_SOCKETS], ids[BURST];
    struct resolver_stats s0 = stats();
    int sent = 0;
    for (int k = 0; k < BURST_SOCKETS; k++) {
        fds[k] = client_socket(NULL);
        for (int i = 0; i < BURST / BURST_SOCKETS; i++)
            ids[sent++] = send_query(fds[k], "slow.test", DNS_TYPE_A, 0);
        /* Let the resolver read this batch before the next, so no socket buffer overflows. */
        for (int w = 0; w < REPLY_WAIT_MS && stats().queries < s0.queries + (uint64_t)sent; w++)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    /* Replies come in any order (the overflow first, then the timeouts as their timers fire):
     * each must answer one of its socket's queries, once. */
    int servfail = 0;
    for (int k = 0; k < BURST_SOCKETS; k++) {
        int *mine = ids + k * (BURST / BURST_SOCKETS);
        for (int i = 0; i < BURST / BURST_SOCKETS; i++) {
            struct answer a;
            recv_answer(fds[k], -1, "slow.test", DNS_TYPE_A, &a);
            int id = a.len >= 2 ? a.raw[0] << 8 | a.raw[1] : -1;
            for (int j = 0; j < BURST / BURST_SOCKETS; j++) {
                if (id >= 0 && mine[j] == id) {
                    mine[j] = -1;
                    recv_answer_parse(&a, id, "slow.test", DNS_TYPE_A);
                    servfail += a.rcode == DNS_RCODE_SERVFAIL;
                }
            }
        }
        close(fds[k]);
    }
    struct resolver_stats s1 = stats();
    ok(servfail == BURST, "%d queries for slow.test all got SERVFAIL (%d did)", BURST, servfail);
    /* How many overflow depends on how fast the burst is read (a slot frees after 2 s), so
     * only what holds however slow this machine is gets asserted: the bound, and that every
     * query either overflowed or went upstream and timed out. (Read in milliseconds, as usual,
     * 256 are in flight and 44 overflow.) */
    ok(s1.pending_max <= RESOLVER_PENDING_MAX && s1.pending_max > 0,
       "at most %d were in flight upstream (max %u)", RESOLVER_PENDING_MAX, s1.pending_max);
    uint64_t over = s1.overflow - s0.overflow, timed = s1.upstream_timeouts - s0.upstream_timeouts;
    ok(over + timed == BURST && s1.pending == 0,
       "each either got SERVFAIL at once without a slot (%llu) or timed out upstream and freed "
       "its slot (%llu)",
       (unsigned long long)over, (unsigned long long)timed);
    ok(up_slow <= 2 * (RESOLVER_PENDING_MAX + 1), "the upstream saw at most two tries each (%d)",
       (int)up_slow);
}

struct cache_req {
    struct dnscache_stats s;
    unsigned owner1;
    int set;
    atomic_int done;
};

static void on_loop_cache(evutil_socket_t fd, short what, void *arg)
{
    struct cache_req *req = arg;
    if (req->set)
        resolver_set_cache(resolver, cache, 1);
    dnscache_stats(cache, &req->s);
    req->owner1 = dnscache_owner_entries(cache, 1);
    req->done = 1;
}

/* Runs on the loop's thread (the cache and resolver_set_cache are used from there only): sets
 * the main resolver's cache if set, and reads the cache's counters. */
static struct cache_req cache_on_loop(int set)
{
    struct cache_req req = {.set = set, .done = 0};
    struct timeval now = {0, 0};
    event_base_once(base, -1, EV_TIMEOUT, on_loop_cache, &req, &now);
    for (int i = 0; i < REPLY_WAIT_MS && !req.done; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    return req;
}

static void cached(int fd)
{
    struct answer a;
    int nfd = client_socket_to(NULL, &neighbour_addr);
    ok(nfd >= 0, "a client of the neighbour resolver (owner 2 of the cache)");
    lookup(nfd, "files.pythonhosted.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && is_v4(&a, 0, "198.18.0.11"),
       "the neighbour's files.pythonhosted.org is answered (and cached as its own)");

    cache_on_loop(1);
    struct resolver_stats s0 = stats();
    int up0 = up_received;
    lookup(fd, "pypi.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && is_v4(&a, 0, "198.18.0.10") && up_received == up0 + 1,
       "with the cache, the first pypi.org goes upstream");
    for (int i = 0; i < 3; i++)
        lookup(fd, "pypi.org", DNS_TYPE_A, i == 1, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && a.n == 1 && is_v4(&a, 0, "198.18.0.10") &&
           up_received == up0 + 1,
       "the next three are answered from the cache, the upstream not asked (%d)",
       up_received - up0);
    ok(a.ttl > 0 && a.ttl <= RESOLVER_TTL_MAX, "with a TTL still capped at %d (%u)",
       RESOLVER_TTL_MAX, a.ttl);
    lookup(fd, "files.pythonhosted.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && is_v4(&a, 0, "198.18.0.11") && up_received == up0 + 1,
       "the neighbour's cached files.pythonhosted.org serves this resolver too");
    ok(a.ttl > 0 && a.ttl <= 30, "with what is left of its TTL of 30 (%u)", a.ttl);
    struct resolver_stats s1 = stats();
    ok(s1.cache_hits == s0.cache_hits + 4 && s1.upstream_sent == s0.upstream_sent + 1,
       "the resolver counted 4 cache hits and 1 query sent");

    up0 = up_received;
    lookup(fd, "gone.test", DNS_TYPE_A, 0, &a);
    lookup(fd, "gone.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NXDOMAIN && up_received == up0 + 1,
       "an NXDOMAIN is cached too: the second gone.test is NXDOMAIN without the upstream (%d)",
       up_received - up0);

    int logged = denied_count("host.test/1/private_address;");
    up0 = up_received;
    lookup(fd, "host.test", DNS_TYPE_A, 0, &a);
    lookup(fd, "host.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_REFUSED && a.n == 0 && up_received == up0 + 1,
       "host.test (only the host's address) is REFUSED again from the cache, no address given");
    ok(denied_count("host.test/1/private_address;") == logged + 2,
       "and each refusal is logged (%d)", denied_count("host.test/1/private_address;") - logged);

    /* The policy comes first: a client whose policy allows only gone.test asks for the cached
     * pypi.org. */
    int nc = client_socket(&narrow_port);
    up0 = up_received;
    struct cache_req c0 = cache_on_loop(0);
    lookup(nc, "pypi.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_REFUSED && ancount(&a) == 0,
       "a client whose policy refuses pypi.org is REFUSED though it is cached (rcode %d)", a.rcode);
    ok(denied_has("pypi.org/1/not_allowed;"), "and its log says not_allowed");
    lookup(nc, "gone.test", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NXDOMAIN, "while the name it may ask is answered from the cache");
    struct cache_req c1 = cache_on_loop(0);
    ok(up_received == up0 && c1.s.stored == c0.s.stored,
       "neither reached the upstream nor stored anything");
    close(nc);
    narrow_port = 0;

    up0 = up_received;
    lookup(fd, "nothing.pythonhosted.org", DNS_TYPE_A, 0, &a);
    lookup(fd, "nothing.pythonhosted.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_SERVFAIL && up_received == up0 + 2,
       "a SERVFAIL is not cached: both asked the upstream (%d)", up_received - up0);

    /* A hostile sandbox: random names under an allowed wildcard, more than its share. */
    int flood = DNSCACHE_OWNER_MAX + 200, answered = 0;
    for (int i = 0; i < flood; i++) {
        char name[64];
        snprintf(name, sizeof(name), "r%d-%u.flood.pythonhosted.org", i, (unsigned)rand());
        lookup(fd, name, DNS_TYPE_A, 0, &a);
        answered += a.rcode == DNS_RCODE_NOERROR && is_v4(&a, 0, "198.18.0.13");
    }
    ok(answered == flood, "%d random names under *.pythonhosted.org all answered (%d)", flood,
       answered);
    struct cache_req c2 = cache_on_loop(0);
    ok(c2.owner1 == DNSCACHE_OWNER_MAX && c2.s.entries <= DNSCACHE_MAX,
       "the flood holds its share of the cache and no more (%u of %d; %u in all)", c2.owner1,
       DNSCACHE_OWNER_MAX, c2.s.entries);
    ok(c2.s.bytes == c0.s.bytes, "in the memory the cache took at the start (%zu bytes)",
       c2.s.bytes);
    up0 = up_received;
    lookup(nfd, "files.pythonhosted.org", DNS_TYPE_A, 0, &a);
    ok(a.rcode == DNS_RCODE_NOERROR && up_received == up0,
       "the neighbour's name is still cached after the flood");
    close(nfd);
}

int main(void)
{
    evthread_use_pthreads();
    base = event_base_new();
    struct wr_err err = {0};
    json_t *given = json_pack("{s:b, s:[s,s,s,s,s,s,s]}", "internet", 1, "allow", "pypi.org",
                              "*.pythonhosted.org", "evil-private.test", "slow.test", "gone.test",
                              "host.test", "mixed.test");
    policy = netpolicy_parse(given, &err);
    json_decref(given);
    ok(policy != NULL, "the test's policy parses %s", err.msg);
    given = json_pack("{s:b, s:[s]}", "internet", 1, "allow", "gone.test");
    narrow = netpolicy_parse(given, &err);
    json_decref(given);
    cache = dnscache_new(4);
    ok(narrow != NULL && cache != NULL, "a narrower policy, and a cache for 4 owners");

    struct sockaddr_in up_addr;
    int up_fd = udp_socket_on(&up_addr);
    int res_fd = udp_socket_on(&resolver_addr);
    int nb_fd = udp_socket_on(&neighbour_addr);
    ok(up_fd >= 0 && res_fd >= 0 && nb_fd >= 0, "three UDP sockets on 127.0.0.1");
    struct event *up_ev = event_new(base, up_fd, EV_READ | EV_PERSIST, fake_upstream, NULL);
    event_add(up_ev, NULL);

    struct addr_ranges extra;
    ok(addr_ranges_parse("198.18.0.0/24", &extra, &err) == 0, "the extra public range parses");
    struct resolver_hooks hooks = {.policy = hook_policy,
                                   .client_ok = hook_client_ok,
                                   .is_local = hook_is_local,
                                   .denied = hook_denied};
    resolver = resolver_new(base, res_fd, (struct sockaddr *)&up_addr, sizeof(up_addr), &extra,
                            &hooks, NULL, &err);
    ok(resolver != NULL, "resolver_new %s", err.msg);
    neighbour = resolver_new(base, nb_fd, (struct sockaddr *)&up_addr, sizeof(up_addr), &extra,
                             &hooks, NULL, &err);
    ok(neighbour != NULL, "a neighbour resolver %s", err.msg);
    resolver_set_cache(neighbour, cache, 2);
    struct resolver_hooks none = {0};
    ok(resolver_new(base, -1, (struct sockaddr *)&up_addr, sizeof(up_addr), NULL, &none, NULL,
                    &err) == NULL,
       "resolver_new without a policy hook fails");

    struct event *ka = event_new(base, -1, EV_PERSIST, keepalive, NULL);
    event_add(ka, &(struct timeval){1, 0});
    pthread_t loop;
    pthread_create(&loop, NULL, loop_main, NULL);

    int fd = client_socket(NULL);
    ok(fd >= 0, "a client socket");
    answers(fd);
    refusals(fd);
    foreign(fd);
    garbage(fd);
    silence(fd);
    burst();
    cached(fd);
    close(fd);

    event_base_loopbreak(base);
    pthread_join(loop, NULL);
    resolver_free(resolver);
    resolver_free(neighbour);
    dnscache_free(cache);
    json_decref(narrow);
    event_free(ka);
    event_free(up_ev);
    close(up_fd);
    event_base_free(base);
    json_decref(policy);
    return tap_done();
}
