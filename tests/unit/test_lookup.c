/*
 * The proxy's DNS client (net/lookup.h) against a fake upstream on 127.0.0.1, both on one event
 * loop run from this thread. Checks what the proxy relies on: addresses from the upstream, a
 * cache that saves the second query, one query shared by concurrent lookups of a name, NXDOMAIN
 * and empty answers told apart, a silent upstream given up on after its retry, answers from
 * another address ignored, callbacks never run inside lookup_start, cancel, and the bound on
 * names in flight.
 */
#include <arpa/inet.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "net/dnsmsg.h"
#include "net/lookup.h"
#include "tap.h"

static struct event_base *base;
static struct lookup *lk;
static int spoof_fd = -1;

/* ---- the fake upstream ---- */

#define NAMES_MAX 16
static struct {
    char name[64];
    int asked;
} seen[NAMES_MAX];
static int slow_asked;

static int asked(const char *name)
{
    for (int i = 0; i < NAMES_MAX; i++)
        if (strcmp(seen[i].name, name) == 0)
            return seen[i].asked;
    return 0;
}

static void count(const char *name)
{
    for (int i = 0; i < NAMES_MAX; i++) {
        if (strcmp(seen[i].name, name) == 0 || !seen[i].name[0]) {
            snprintf(seen[i].name, sizeof(seen[i].name), "%s", name);
            seen[i].asked++;
            return;
        }
    }
}

static void put16(uint8_t *b, size_t *off, unsigned v)
{
    b[(*off)++] = (uint8_t)(v >> 8);
    b[(*off)++] = (uint8_t)v;
}

static void put_a(uint8_t *b, size_t *off, const char *ip, uint32_t ttl)
{
    put16(b, off, 0xc00c);
    put16(b, off, DNS_TYPE_A);
    put16(b, off, DNS_CLASS_IN);
    put16(b, off, ttl >> 16);
    put16(b, off, ttl & 0xffff);
    put16(b, off, 4);
    inet_pton(AF_INET, ip, b + *off);
    *off += 4;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void fake_upstream(evutil_socket_t fd, short what, void *arg)
{
    uint8_t in[2048], out[1024];
    struct sockaddr_storage from;
    socklen_t flen = sizeof(from);
    ssize_t n;
    while ((n = recvfrom(fd, in, sizeof(in), MSG_DONTWAIT, (struct sockaddr *)&from, &flen)) >= 0) {
        struct dns_query q;
        if (dnsmsg_parse_query(in, (size_t)n, &q) != DNS_QUERY_OK)
            continue;
        if (ends_with(q.name, "slow.test")) {
            slow_asked++;
            continue;
        }
        count(q.name);
        unsigned rcode = DNS_RCODE_NOERROR, an = 0;
        size_t off = DNS_HEADER_LEN;
        memcpy(out + off, q.qwire, q.qwire_len);
        off += q.qwire_len;
        put16(out, &off, q.qtype);
        put16(out, &off, DNS_CLASS_IN);
        if (strcmp(q.name, "a.test") == 0 || strcmp(q.name, "c.test") == 0 ||
            strcmp(q.name, "spoof.test") == 0) {
            put_a(out, &off, "192.0.2.1", 300);
            an = 1;
        } else if (strcmp(q.name, "two.test") == 0) {
            put_a(out, &off, "192.0.2.2", 30);
            put_a(out, &off, "192.0.2.3", 30);
            an = 2;
        } else if (strcmp(q.name, "short.test") == 0) {
            put_a(out, &off, "192.0.2.4", 0);
            an = 1;
        } else if (strcmp(q.name, "nx.test") == 0) {
            rcode = DNS_RCODE_NXDOMAIN;
        } else if (strcmp(q.name, "servfail.test") == 0) {
            rcode = DNS_RCODE_SERVFAIL;
        }
        size_t h = 0;
        put16(out, &h, q.id);
        put16(out, &h, 0x8180 | rcode);
        put16(out, &h, 1);
        put16(out, &h, an);
        put16(out, &h, 0);
        put16(out, &h, 0);
        /* spoof.test is answered only from another address: the client must not take it. */
        int via = strcmp(q.name, "spoof.test") == 0 ? spoof_fd : (int)fd;
        sendto(via, out, off, 0, (struct sockaddr *)&from, flen);
        flen = sizeof(from);
    }
}

/* ---- requests ---- */

struct result {
    int called;
    int rc;
    char why[32];
    struct dns_addr addrs[LOOKUP_ADDRS_MAX];
    size_t n;
    struct lookup_req *cancel_on_call; /* cancels this other request from the callback */
};

static int inside_start; /* set around lookup_start: a callback must never see it */
static int reentered;

static void on_result(void *arg, int rc, const struct dns_addr *addrs, size_t n, const char *why)
{
    struct result *r = arg;
    if (inside_start)
        reentered++;
    r->called++;
    r->rc = rc;
    snprintf(r->why, sizeof(r->why), "%s", why);
    r->n = n;
    memcpy(r->addrs, addrs, n * sizeof(*addrs));
    if (r->cancel_on_call) {
        lookup_cancel(r->cancel_on_call);
        r->cancel_on_call = NULL;
    }
}

static struct lookup_req *start(const char *name, struct result *r)
{
    memset(r, 0, sizeof(*r));
    inside_start = 1;
    struct lookup_req *req = lookup_start(lk, name, on_result, r);
    inside_start = 0;
    return req;
}

static void tick(evutil_socket_t fd, short what, void *arg)
{
}

/* Runs the loop until *flag is non-zero or ms pass. */
static void run_until(const int *flag, int ms)
{
    uint64_t end = now_ms_monotonic() + (uint64_t)ms;
    while ((!flag || !*flag) && now_ms_monotonic() < end)
        event_base_loop(base, EVLOOP_ONCE);
}

static int is_v4(const struct result *r, size_t i, const char *ip)
{
    uint8_t want[4];
    inet_pton(AF_INET, ip, want);
    return i < r->n && r->addrs[i].family == AF_INET && memcmp(r->addrs[i].addr, want, 4) == 0;
}

static struct lookup_stats stats(void)
{
    struct lookup_stats s;
    lookup_stats(lk, &s);
    return s;
}

static void answers(void)
{
    struct result r1, r2;
    start("a.test", &r1);
    ok(!r1.called, "nothing is called from inside lookup_start");
    run_until(&r1.called, 5000);
    ok(r1.called == 1 && r1.rc == 0 && r1.n == 1 && is_v4(&r1, 0, "192.0.2.1") &&
           strcmp(r1.why, "ok") == 0,
       "a.test: 192.0.2.1 (rc %d, why %s, n %zu)", r1.rc, r1.why, r1.n);

    struct lookup_stats s0 = stats();
    start("A.Test.", &r2);
    ok(!r2.called, "a cache hit is not delivered inside lookup_start either");
    run_until(&r2.called, 5000);
    struct lookup_stats s1 = stats();
    ok(r2.called == 1 && r2.rc == 0 && is_v4(&r2, 0, "192.0.2.1"),
       "A.Test. (case and trailing dot) is the same name, answered");
    ok(asked("a.test") == 1 && s1.cache_hits == s0.cache_hits + 1 && s1.sent == s0.sent,
       "from the cache: the upstream was asked once (%d)", asked("a.test"));

    struct result r[3];
    for (int i = 0; i < 3; i++)
        start("two.test", &r[i]);
    run_until(&r[2].called, 5000);
    run_until(NULL, 50);
    ok(r[0].called == 1 && r[1].called == 1 && r[2].called == 1,
       "three concurrent lookups of two.test are each answered once");
    ok(r[0].n == 2 && is_v4(&r[0], 0, "192.0.2.2") && is_v4(&r[0], 1, "192.0.2.3") && r[2].n == 2 &&
           is_v4(&r[2], 1, "192.0.2.3"),
       "with both addresses in order");
    ok(asked("two.test") == 1 && stats().shared >= 2, "by one shared query (asked %d)",
       asked("two.test"));

    start("nx.test", &r1);
    run_until(&r1.called, 5000);
    ok(r1.rc == -1 && r1.n == 0 && strcmp(r1.why, "nxdomain") == 0, "nx.test: nxdomain (%s)",
       r1.why);
    start("nx.test", &r1);
    run_until(&r1.called, 5000);
    ok(asked("nx.test") == 2, "a failure is not cached (asked %d)", asked("nx.test"));
    start("empty.test", &r1);
    run_until(&r1.called, 5000);
    ok(r1.rc == -1 && strcmp(r1.why, "no_address") == 0, "empty.test: no_address (%s)", r1.why);
    start("servfail.test", &r1);
    run_until(&r1.called, 5000);
    ok(r1.rc == -1 && strcmp(r1.why, "upstream_error") == 0, "SERVFAIL: upstream_error (%s)",
       r1.why);
    start("bad name.test", &r1);
    run_until(&r1.called, 5000);
    ok(r1.rc == -1 && strcmp(r1.why, "bad_name") == 0, "'bad name.test': bad_name (%s)", r1.why);
    start("", &r1);
    run_until(&r1.called, 5000);
    ok(r1.rc == -1 && strcmp(r1.why, "bad_name") == 0, "'': bad_name");

    /* A TTL of 0 is cached for LOOKUP_TTL_MIN: long enough to share, then asked again. */
    start("short.test", &r1);
    run_until(&r1.called, 5000);
    start("short.test", &r2);
    run_until(&r2.called, 5000);
    ok(r2.rc == 0 && asked("short.test") == 1, "a TTL of 0 is still cached briefly (asked %d)",
       asked("short.test"));
    run_until(NULL, LOOKUP_TTL_MIN * 1000 + 200);
    start("short.test", &r2);
    run_until(&r2.called, 5000);
    ok(r2.rc == 0 && asked("short.test") == 2, "and asked again once it expired (asked %d)",
       asked("short.test"));
}

static void cancels(void)
{
    struct result r1, r2, r3;
    struct lookup_req *q = start("c.test", &r1);
    ok(q != NULL, "lookup of c.test started");
    lookup_cancel(q);
    run_until(NULL, 300);
    ok(!r1.called && asked("c.test") == 1,
       "cancelled: its callback never came though the upstream answered");
    start("c.test", &r2);
    run_until(&r2.called, 5000);
    ok(r2.rc == 0 && asked("c.test") == 1, "the cancelled query still filled the cache");

    q = start("c.test", &r1);
    lookup_cancel(q);
    run_until(NULL, 100);
    ok(!r1.called, "a cancelled cache hit is not delivered");

    /* Two waiters on one query; the first one's callback cancels the second. */
    start("two-cancel.test", &r1);
    struct lookup_req *second = start("two-cancel.test", &r2);
    r1.cancel_on_call = second;
    start("two-cancel.test", &r3);
    run_until(&r3.called, 5000);
    run_until(NULL, 50);
    ok(r1.called == 1 && r2.called == 0 && r3.called == 1,
       "a callback that cancels a fellow waiter: that one is never called, the next still is");
    /* Same within one batch of queued (cached) results. */
    start("a.test", &r1);
    second = start("a.test", &r2);
    r1.cancel_on_call = second;
    run_until(&r1.called, 5000);
    run_until(NULL, 50);
    ok(r1.called == 1 && r2.called == 0, "and in a batch of cache hits");
}

static void silence(void)
{
    struct lookup_stats s0 = stats();
    struct result slow, spoof;
    uint64_t t0 = now_ms_monotonic();
    start("slow.test", &slow);
    start("spoof.test", &spoof);
    run_until(&slow.called, 10000);
    uint64_t took = now_ms_monotonic() - t0;
    run_until(&spoof.called, 1000);
    struct lookup_stats s1 = stats();
    ok(slow.rc == -1 && strcmp(slow.why, "timeout") == 0, "a silent upstream: timeout (%s)",
       slow.why);
    ok(took >= LOOKUP_TIMEOUT_MS - 100 && took < LOOKUP_TIMEOUT_MS + 1500,
       "after about %d ms (%llu)", LOOKUP_TIMEOUT_MS, (unsigned long long)took);
    ok(s1.retries - s0.retries == 2 && s1.timeouts - s0.timeouts == 2,
       "each asked twice before giving up");
    ok(spoof.rc == -1 && strcmp(spoof.why, "timeout") == 0,
       "an answer from another address is ignored: spoof.test times out (%s)", spoof.why);
}

static void busy(void)
{
    static struct result rs[LOOKUP_PENDING_MAX + 1];
    char name[64];
    int before = slow_asked;
    inside_start = 1;
    for (int i = 0; i <= LOOKUP_PENDING_MAX; i++) {
        memset(&rs[i], 0, sizeof(rs[i]));
        snprintf(name, sizeof(name), "n%d.slow.test", i);
        lookup_start(lk, name, on_result, &rs[i]);
    }
    inside_start = 0;
    ok(stats().pending == LOOKUP_PENDING_MAX, "%d names in flight", LOOKUP_PENDING_MAX);
    run_until(&rs[LOOKUP_PENDING_MAX].called, 1000);
    ok(rs[LOOKUP_PENDING_MAX].rc == -1 && strcmp(rs[LOOKUP_PENDING_MAX].why, "busy") == 0,
       "one more fails with busy (%s) on the next turn", rs[LOOKUP_PENDING_MAX].why);
    ok(!rs[0].called, "while the others still wait");
    run_until(&rs[LOOKUP_PENDING_MAX - 1].called, 10000);
    run_until(NULL, 100);
    int timeouts = 0;
    for (int i = 0; i < LOOKUP_PENDING_MAX; i++)
        timeouts += rs[i].called == 1 && strcmp(rs[i].why, "timeout") == 0;
    ok(timeouts == LOOKUP_PENDING_MAX && stats().pending == 0,
       "then all of them time out (%d) and the table is empty", timeouts);
    ok(slow_asked - before <= 2 * LOOKUP_PENDING_MAX, "asked at most twice each (%d)",
       slow_asked - before);
}

static int udp_socket_on(struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t len = sizeof(*sa);
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int big = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    if (fd < 0 || bind(fd, (struct sockaddr *)sa, sizeof(*sa)) < 0 ||
        getsockname(fd, (struct sockaddr *)sa, &len) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

int main(void)
{
    base = event_base_new();
    struct sockaddr_in up_addr, spoof_addr;
    int up_fd = udp_socket_on(&up_addr);
    spoof_fd = udp_socket_on(&spoof_addr);
    ok(up_fd >= 0 && spoof_fd >= 0, "UDP sockets on 127.0.0.1");
    struct event *up_ev = event_new(base, up_fd, EV_READ | EV_PERSIST, fake_upstream, NULL);
    event_add(up_ev, NULL);
    struct event *ticker = event_new(base, -1, EV_PERSIST, tick, NULL);
    event_add(ticker, &(struct timeval){0, 10000});

    struct wr_err err = {0};
    lk = lookup_new(base, (struct sockaddr *)&up_addr, sizeof(up_addr), &err);
    ok(lk != NULL, "lookup_new %s", err.msg);
    ok(lookup_new(base, NULL, 0, &err) == NULL, "lookup_new without an upstream fails");

    answers();
    cancels();
    silence();
    busy();
    ok(reentered == 0, "no callback ran inside lookup_start");

    /* Requests still waiting at lookup_free are dropped without a call (ASan sees no leak). */
    struct result late;
    start("late.slow.test", &late);
    start("a.test", &late);
    lookup_free(lk);
    run_until(NULL, 50);
    ok(!late.called, "lookup_free drops waiting requests without calling them");

    event_free(ticker);
    event_free(up_ev);
    close(up_fd);
    close(spoof_fd);
    event_base_free(base);
    return tap_done();
}
