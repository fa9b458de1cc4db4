/*
 * The egress proxy's caps (net/proxy.h): the fair-share and fd-limit arithmetic, then a real
 * proxy on 127.0.0.1 whose global cap one sandbox (127.0.0.3) holds whole. A neighbour
 * (127.0.0.4) below its fair share still gets its connections, each one made room for by closing
 * one of the hog's; the hog, over its share, is refused more; and the neighbour is refused past
 * its own share. Connections here say nothing: they stay deciding (first_bytes_ms is long), so
 * no DNS or upstream is needed. What a sandbox sees: its connection open, or closed at once.
 *
 * Then the proxy's lookups, on a second proxy whose DNS server never answers (and whose lookups
 * wait a minute before giving up), so that every connection that asks a name stays waiting for
 * it: a sandbox has at most PROXY_LOOKUPS_PER_PEER at once, and once the lookup table is half
 * full one over its fair share is refused ("busy", a 502) while one below it still gets its
 * lookup.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/lookup.h"
#include "net/proxy.h"
#include "tap.h"

#define CAP 40 /* global and per-sandbox: one sandbox can hold all of it */
#define HOG "127.0.0.3"
#define NEIGHBOUR "127.0.0.4"

static struct event_base *base;
static struct proxy *proxy, *lproxy;
static struct lookup *slow_lk;
static struct sockaddr_in proxy_addr, lproxy_addr;
static json_t *policy;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char denied_log[16384];

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
    const struct sockaddr_in *in = (const struct sockaddr_in *)peer;
    if (is_ip(peer, HOG) || is_ip(peer, NEIGHBOUR))
        snprintf(id, idcap, "%s", is_ip(peer, HOG) ? "hog" : "neighbour");
    else
        snprintf(id, idcap, "peer-%u", (unsigned)(ntohl(in->sin_addr.s_addr) & 0xff));
    return ctx ? ctx : policy;
}

static int hook_original_dst(void *ctx, int fd, struct sockaddr_in *out)
{
    memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    inet_pton(AF_INET, "203.0.113.9", &out->sin_addr);
    out->sin_port = htons(80);
    return 0;
}

static void hook_denied(void *ctx, const char *id, const char *host, int port, const char *reason)
{
    pthread_mutex_lock(&mu);
    size_t used = strlen(denied_log);
    snprintf(denied_log + used, sizeof(denied_log) - used, "%s|%s;", id, reason);
    pthread_mutex_unlock(&mu);
}

/* How many times "id|reason;" was reported denied. */
static int denied_count(const char *id, const char *reason)
{
    char want[128];
    snprintf(want, sizeof(want), "%s|%s;", id, reason);
    pthread_mutex_lock(&mu);
    int n = 0;
    for (const char *p = denied_log; (p = strstr(p, want)); p += strlen(want))
        n++;
    pthread_mutex_unlock(&mu);
    return n;
}

static void keepalive(evutil_socket_t fd, short what, void *arg)
{
}

static void *loop_main(void *arg)
{
    event_base_dispatch(base);
    return NULL;
}

struct stats_ask {
    struct proxy_stats st;
    atomic_int done;
};

static void read_stats(evutil_socket_t fd, short what, void *arg)
{
    struct stats_ask *a = arg;
    proxy_stats(proxy, &a->st);
    atomic_store(&a->done, 1);
}

/* The proxy's counters, read on its loop's thread. */
static struct proxy_stats stats(void)
{
    struct stats_ask a = {0};
    event_base_once(base, -1, EV_TIMEOUT, read_stats, &a, &(struct timeval){0, 0});
    while (!atomic_load(&a.done))
        nanosleep(&(struct timespec){0, 1000000L}, NULL);
    return a.st;
}

/* Waits until the proxy has taken in `accepted` connections in all (10 s at most). */
static int wait_accepted(uint64_t accepted)
{
    for (int i = 0; i < 10000; i++) {
        if (stats().accepted >= accepted)
            return 1;
        nanosleep(&(struct timespec){0, 1000000L}, NULL);
    }
    return 0;
}

static int dial_to(const struct sockaddr_in *to, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in me = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &me.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&me, sizeof(me)) < 0 ||
        connect(fd, (const struct sockaddr *)to, sizeof(*to)) < 0)
        perror("dial");
    return fd;
}

static int dial(const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in me = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &me.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&me, sizeof(me)) < 0 ||
        connect(fd, (struct sockaddr *)&proxy_addr, sizeof(proxy_addr)) < 0)
        perror("dial");
    return fd;
}

/* Whether the proxy closed fd: its FIN (or a reset) is there. The proxy decides a connection's
 * fate in the accept callback itself, and a close on loopback reaches the peer at once. */
static int closed(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN);
}

static int count_closed(const int *fds, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += closed(fds[i]);
    return k;
}

static void arithmetic(void)
{
    ok(proxy_fair_share(4096, 17, PROXY_SHARE_FLOOR) == 240, "4,096 among 17 sandboxes: 240 each");
    ok(proxy_fair_share(4096, 18, PROXY_SHARE_FLOOR) == 227, "among 18: 227");
    ok(proxy_fair_share(4096, 1, PROXY_SHARE_FLOOR) == 4096, "one sandbox alone may use all");
    ok(proxy_fair_share(4096, 0, PROXY_SHARE_FLOOR) == 4096, "none yet: all");
    ok(proxy_fair_share(96, 50, PROXY_SHARE_FLOOR) == PROXY_SHARE_FLOOR,
       "96 among 50: the floor, %d", PROXY_SHARE_FLOOR);
    ok(proxy_fair_share(LOOKUP_PENDING_MAX, 16, PROXY_LOOKUP_SHARE_FLOOR) == 64,
       "1,024 lookups among 16 sandboxes: 64 each");
    ok(proxy_fair_share(LOOKUP_PENDING_MAX, 1000, PROXY_LOOKUP_SHARE_FLOOR) ==
           PROXY_LOOKUP_SHARE_FLOOR,
       "among 1,000: the floor, %d", PROXY_LOOKUP_SHARE_FLOOR);
    ok(proxy_conns_for_fds(1024) == 96, "1,024 fds: 96 proxy connections (%d)",
       proxy_conns_for_fds(1024));
    int c = proxy_conns_for_fds(1024);
    ok(1024 / 2 + 2 * c + PROXY_FD_RESERVE <= 1024 - 2 * c,
       "with the API's 512, they leave as many fds to the sandboxes as they take");
    ok(proxy_conns_for_fds(4096) == 480, "4,096 fds: 480 (%d)", proxy_conns_for_fds(4096));
    ok(proxy_conns_for_fds(33024) == PROXY_MAX_CONNS && proxy_conns_for_fds(1 << 20) == 4096,
       "33,024 fds or more: the most, 4,096");
    ok(proxy_conns_for_fds(256) == PROXY_MIN_CONNS && proxy_conns_for_fds(0) == PROXY_MIN_CONNS,
       "a tiny limit: the least, %d", PROXY_MIN_CONNS);
}

static void shares(void)
{
    int hog[CAP + 1], nb[CAP / 2 + 1];
    uint64_t accepted = 0;
    for (int i = 0; i < CAP; i++)
        hog[i] = dial(HOG);
    ok(wait_accepted(accepted += CAP), "the hog's %d connections are taken in", CAP);
    struct proxy_stats s = stats();
    ok(s.active == CAP && count_closed(hog, CAP) == 0,
       "and all stay open: it holds the whole global cap (%u open)", s.active);

    nb[0] = dial(NEIGHBOUR);
    wait_accepted(++accepted);
    ok(!closed(nb[0]), "a neighbour's connection at the cap stays open");
    ok(count_closed(hog, CAP) == 1, "one of the hog's was closed to make room (%d)",
       count_closed(hog, CAP));
    ok(denied_count("hog", "fair_share") == 1, "reported to the hog's log as fair_share");
    s = stats();
    ok(s.active == CAP && s.evicted == 1, "still %d open (%u), 1 evicted (%llu)", CAP, s.active,
       (unsigned long long)s.evicted);

    hog[CAP] = dial(HOG);
    wait_accepted(++accepted);
    ok(closed(hog[CAP]), "the hog, over its share, is refused another");
    ok(denied_count("hog", "too_many_connections") == 1, "as too_many_connections");

    /* Two sandboxes: a share is CAP / 2. The neighbour gets its whole share. */
    for (int i = 1; i < CAP / 2; i++)
        nb[i] = dial(NEIGHBOUR);
    wait_accepted(accepted += CAP / 2 - 1);
    ok(count_closed(nb, CAP / 2) == 0, "the neighbour holds its share, %d, all open", CAP / 2);
    ok(count_closed(hog, CAP) == CAP / 2, "the hog is down to its own (%d closed)",
       count_closed(hog, CAP));
    nb[CAP / 2] = dial(NEIGHBOUR);
    wait_accepted(++accepted);
    ok(closed(nb[CAP / 2]), "past its share the neighbour is refused too");
    ok(count_closed(hog, CAP) == CAP / 2, "and nothing more of the hog's closed");

    for (int i = 0; i <= CAP; i++)
        close(hog[i]);
    for (int i = 0; i <= CAP / 2; i++)
        close(nb[i]);
}

struct lookup_ask {
    struct lookup_stats ls;
    struct proxy_stats ps;
    atomic_int done;
};

static void read_lookup_stats(evutil_socket_t fd, short what, void *arg)
{
    struct lookup_ask *a = arg;
    lookup_stats(slow_lk, &a->ls);
    proxy_stats(lproxy, &a->ps);
    atomic_store(&a->done, 1);
}

/* Names asked upstream now, and the second proxy's denials so far, read on the loop's thread. */
static void lookup_counts(unsigned *pending, uint64_t *denied)
{
    struct lookup_ask a = {0};
    event_base_once(base, -1, EV_TIMEOUT, read_lookup_stats, &a, &(struct timeval){0, 0});
    while (!atomic_load(&a.done))
        nanosleep(&(struct timespec){0, 1000000L}, NULL);
    *pending = a.ls.pending;
    *denied = a.ps.denied;
}

/* Waits (10 s at most) until `pending` names are asked and `denied` connections refused. */
static int wait_lookups(unsigned pending, uint64_t denied)
{
    unsigned p = 0;
    uint64_t d = 0;
    for (int i = 0; i < 10000; i++) {
        lookup_counts(&p, &d);
        if (p >= pending && d >= denied)
            return p == pending && d == denied;
        nanosleep(&(struct timespec){0, 1000000L}, NULL);
    }
    return 0;
}

static int next_name;

/* Opens n connections from src to the second proxy, each asking for a name of its own. */
static void ask_names(const char *src, int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        fds[i] = dial_to(&lproxy_addr, src);
        char head[128];
        int len =
            snprintf(head, sizeof(head), "GET / HTTP/1.1\r\nHost: n%d.test\r\n\r\n", next_name++);
        if (send(fds[i], head, (size_t)len, MSG_NOSIGNAL) != len)
            perror("send");
    }
}

/* How many of fds were answered 502 within 10 s, waiting until `want` were or time is up. */
static int count_502(const int *fds, int n, int want)
{
    int found = 0;
    char *seen = calloc((size_t)n, 1);
    struct pollfd *p = calloc((size_t)n, sizeof(*p));
    for (int t = 0; t < 100 && found < want; t++) {
        for (int i = 0; i < n; i++)
            p[i] = (struct pollfd){.fd = seen[i] ? -1 : fds[i], .events = POLLIN};
        if (poll(p, (nfds_t)n, 100) <= 0)
            continue;
        for (int i = 0; i < n; i++) {
            char buf[64] = {0};
            if (!(p[i].revents & POLLIN) ||
                recv(fds[i], buf, sizeof(buf) - 1, MSG_PEEK | MSG_DONTWAIT) <= 0)
                continue;
            seen[i] = 1;
            found += strncmp(buf, "HTTP/1.1 502", 12) == 0;
        }
    }
    free(seen);
    free(p);
    return found;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

static void lookups(void)
{
    enum { PER = PROXY_LOOKUPS_PER_PEER };
    static int a[PER + 1], b[PER], c[PER], d[PER], nb[2];
    ask_names("127.0.0.5", a, PER);
    ok(wait_lookups(PER, 0), "one sandbox has %d lookups waiting", PER);
    ask_names("127.0.0.5", a + PER, 1);
    ok(wait_lookups(PER, 1) && count_502(a + PER, 1, 1) == 1,
       "its next is answered 502 at once: at most %d per sandbox", PER);
    ok(denied_count("peer-5", "busy") == 1, "logged as busy");

    /* Two more fill the table to three quarters: below half, and then below their shares. */
    ask_names("127.0.0.6", b, PER);
    ask_names("127.0.0.7", c, PER);
    ok(wait_lookups(3 * PER, 1), "three sandboxes hold %d of the %d lookups", 3 * PER,
       LOOKUP_PENDING_MAX);

    /* A neighbour: four sandboxes, a share of 256 each. */
    ask_names(NEIGHBOUR, nb, 1);
    ok(wait_lookups(3 * PER + 1, 1), "the table is past half full and a neighbour gets one");

    /* A fifth: a share of 1,024 / 5 = 204, and it is refused past it though the table has
     * room; the neighbour, below its own share, still gets another. */
    unsigned share = proxy_fair_share(LOOKUP_PENDING_MAX, 5, PROXY_LOOKUP_SHARE_FLOOR);
    int over = 6;
    ask_names("127.0.0.8", d, (int)share + over);
    ok(wait_lookups(3 * PER + 1 + share, 1 + (uint64_t)over),
       "a fifth sandbox gets its share, %u, and no more", share);
    ok(count_502(d, (int)share + over, over) == over && denied_count("peer-8", "busy") == over,
       "the %d past its share are answered 502 busy", over);
    ask_names(NEIGHBOUR, nb + 1, 1);
    ok(wait_lookups(3 * PER + 2 + share, 1 + (uint64_t)over),
       "the neighbour, below its share, still gets its second (%u of %d asked)",
       3 * PER + 2 + share, LOOKUP_PENDING_MAX);

    close_all(a, PER + 1);
    close_all(b, PER);
    close_all(c, PER);
    close_all(d, (int)share + over);
    close_all(nb, 2);
}

int main(void)
{
    arithmetic();

    evthread_use_pthreads();
    base = event_base_new();
    policy = json_pack("{s:b, s:[s]}", "internet", 1, "allow", "*");
    struct wr_err err = {0};
    struct sockaddr_in dns = {.sin_family = AF_INET, .sin_port = htons(9)};
    dns.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct lookup *lk = lookup_new(base, (struct sockaddr *)&dns, sizeof(dns), &err);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    proxy_addr =
        (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(proxy_addr);
    ok(lk && bind(lfd, (struct sockaddr *)&proxy_addr, sizeof(proxy_addr)) == 0 &&
           listen(lfd, 128) == 0 && getsockname(lfd, (struct sockaddr *)&proxy_addr, &alen) == 0,
       "the proxy's listening socket");
    struct proxy_config cfg = {
        .max_conns = CAP, .max_conns_per_peer = CAP, .first_bytes_ms = 60000};
    struct proxy_hooks hooks = {
        .policy = hook_policy, .original_dst = hook_original_dst, .denied = hook_denied};
    proxy = proxy_new(base, lfd, lk, &cfg, &hooks, NULL, &err);
    ok(proxy != NULL, "proxy_new %s", err.msg);

    /* The second proxy: every name asked waits a minute on a DNS server that never answers. */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
    ok(setrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= 2500,
       "fds for %d connections at both ends", 4 * PROXY_LOOKUPS_PER_PEER);
    int silent = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sdns = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t slen = sizeof(sdns);
    bind(silent, (struct sockaddr *)&sdns, sizeof(sdns));
    getsockname(silent, (struct sockaddr *)&sdns, &slen);
    slow_lk = lookup_new(base, (struct sockaddr *)&sdns, sizeof(sdns), &err);
    if (slow_lk)
        lookup_set_timeouts(slow_lk, 30000, 60000);
    json_t *any = json_pack("{s:b}", "internet", 1);
    int lfd2 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    lproxy_addr =
        (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    alen = sizeof(lproxy_addr);
    ok(slow_lk && bind(lfd2, (struct sockaddr *)&lproxy_addr, sizeof(lproxy_addr)) == 0 &&
           listen(lfd2, 1024) == 0 &&
           getsockname(lfd2, (struct sockaddr *)&lproxy_addr, &alen) == 0,
       "the second proxy's listening socket");
    struct proxy_config lcfg = {
        .max_conns = 4096, .max_conns_per_peer = 1024, .first_bytes_ms = 60000};
    lproxy = proxy_new(base, lfd2, slow_lk, &lcfg, &hooks, any, &err);
    ok(lproxy != NULL, "proxy_new %s", err.msg);

    struct event *ka = event_new(base, -1, EV_PERSIST, keepalive, NULL);
    event_add(ka, &(struct timeval){1, 0});
    pthread_t loop;
    pthread_create(&loop, NULL, loop_main, NULL);

    if (proxy)
        shares();
    if (lproxy)
        lookups();

    event_base_loopbreak(base);
    pthread_join(loop, NULL);
    event_free(ka);
    proxy_free(proxy);
    proxy_free(lproxy);
    lookup_free(lk);
    lookup_free(slow_lk);
    event_base_free(base);
    json_decref(policy);
    json_decref(any);
    close(silent);
    return tap_done();
}
