/*
 * The egress proxy's caps (net/proxy.h): the fair-share and fd-limit arithmetic, then a real
 * proxy on 127.0.0.1 whose global cap one sandbox (127.0.0.3) holds whole. A neighbour
 * (127.0.0.4) below its fair share still gets its connections, each one made room for by closing
 * one of the hog's; the hog, over its share, is refused more; and the neighbour is refused past
 * its own share. Connections here say nothing: they stay deciding (first_bytes_ms is long), so
 * no DNS or upstream is needed. What a sandbox sees: its connection open, or closed at once.
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
static struct proxy *proxy;
static struct sockaddr_in proxy_addr;
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
    snprintf(id, idcap, "%s", is_ip(peer, HOG) ? "hog" : "neighbour");
    return policy;
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
    struct event *ka = event_new(base, -1, EV_PERSIST, keepalive, NULL);
    event_add(ka, &(struct timeval){1, 0});
    pthread_t loop;
    pthread_create(&loop, NULL, loop_main, NULL);

    if (proxy)
        shares();

    event_base_loopbreak(base);
    pthread_join(loop, NULL);
    event_free(ka);
    proxy_free(proxy);
    lookup_free(lk);
    event_base_free(base);
    json_decref(policy);
    return tap_done();
}
