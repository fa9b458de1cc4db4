/*
 * The gateway namespace, the sandboxes' slots in it, and the proxy and resolvers that serve them
 * (see gateway.h for the layout).
 */
#include "net/gateway.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/proc.h"
#include "common/util.h"
#include "net/netipc.h"
#include "net/netns.h"
#include "net/netproc.h"
#include "net/proxy.h"

#define GATEWAY_NET 0x0ac80000u /* 10.200.0.0/16 */
#define GATEWAY_LISTEN_BACKLOG 1024

struct gw_slot {
    int used;
    int active; /* its DNS socket is dns_fd, served by the egress process */
    int dns_fd; /* kept: a restarted egress process gets it again */
    char id[GATEWAY_ID_MAX + 1];
};

/* The egress process and its signer (net/netproc.h), as the daemon sees them. */
struct gw_proc {
    pid_t net_pid, signer_pid;
    int net_pidfd, signer_pidfd;
    int ctl; /* -1 while they are down */
    struct event *ev_ctl, *ev_net_exit, *ev_signer_exit;
    uint64_t started_ms;
};

struct gateway {
    struct event_base *base;
    struct gateway_config cfg;
    struct gateway_hooks hooks;
    void *ctx;
    int gw_ns;     /* the gateway namespace */
    int listen_fd; /* the proxy's listener: kept, so connections wait through a restart */
    char ca_cert[PATH_MAX], ca_key[PATH_MAX], extra_ca[PATH_MAX];
    char *ca_pem;
    struct sockaddr_in upstream;
    struct gw_proc proc;
    struct event *ev_restart;
    int backoff_ms;
    char *rbuf;                      /* NETIPC_UP_MAX + 1 */
    struct gateway_stats seen;       /* the egress process's last counters, over its restarts */
    struct gateway_stats base_stats; /* what processes before this one counted */
    struct gw_slot *slots;           /* GATEWAY_SLOTS of them */
    unsigned used;
    unsigned next; /* where the search for a free slot starts: slots are not reused at once */
};

/* The gateway's rules. Connections are redirected before the input chain sees them, so the
 * input chain only lets in what reaches the proxy's port or a resolver. */
static const char ruleset_fmt[] =
    "table inet withruntime {\n"
    "  chain pre {\n"
    "    type nat hook prerouting priority dstnat; policy accept;\n"
    "    iifname \"wrs*\" meta nfproto ipv4 meta l4proto tcp redirect to :%d\n"
    "  }\n"
    "  chain in {\n"
    "    type filter hook input priority filter; policy drop;\n"
    "    iif \"lo\" accept\n"
    "    ct state established,related accept\n"
    "    iifname \"wrs*\" meta nfproto ipv4 tcp dport %d accept\n"
    "    iifname \"wrs*\" meta nfproto ipv4 udp dport 53 accept\n"
    "  }\n"
    "  chain forward {\n"
    "    type filter hook forward priority filter; policy drop;\n"
    "  }\n"
    "}\n";

struct in_addr gateway_slot_addr(int slot, int host)
{
    struct in_addr a = {.s_addr = htonl(GATEWAY_NET + (uint32_t)slot * 4 + (uint32_t)host)};
    return a;
}

int gateway_slot_of_addr(const struct sockaddr *sa, socklen_t len)
{
    if (!sa || sa->sa_family != AF_INET || len < (socklen_t)sizeof(struct sockaddr_in))
        return -1;
    uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
    if ((a & 0xffff0000u) != GATEWAY_NET || (a & 3u) != 2)
        return -1;
    int slot = (int)((a - GATEWAY_NET) / 4);
    return slot < GATEWAY_SLOTS ? slot : -1;
}

int gateway_parse_upstream(const char *text, struct sockaddr_in *out, struct wr_err *err)
{
    memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    out->sin_port = htons(53);
    char buf[64];
    if (!text || !text[0]) {
        FILE *f = fopen("/etc/resolv.conf", "re");
        if (!f)
            return wr_err_sys(err, errno, "reading /etc/resolv.conf for an upstream resolver");
        char line[256];
        int found = 0;
        while (!found && fgets(line, sizeof(line), f)) {
            char addr[64];
            if (sscanf(line, " nameserver %63s", addr) == 1 &&
                inet_pton(AF_INET, addr, &out->sin_addr) == 1)
                found = 1;
        }
        fclose(f);
        if (!found)
            return wr_err_set(err, ENOENT,
                              "no IPv4 nameserver in /etc/resolv.conf: give serve --dns-upstream");
        return 0;
    }
    if (strlen(text) >= sizeof(buf))
        return wr_err_set(err, EINVAL, "bad DNS upstream \"%.64s\"", text);
    snprintf(buf, sizeof(buf), "%s", text);
    char *colon = strchr(buf, ':');
    if (colon) {
        *colon = '\0';
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (colon[1] < '0' || colon[1] > '9' || *end || port < 1 || port > 65535)
            return wr_err_set(err, EINVAL, "bad DNS upstream \"%s\": the port must be 1..65535",
                              text);
        out->sin_port = htons((uint16_t)port);
    }
    if (inet_pton(AF_INET, buf, &out->sin_addr) != 1)
        return wr_err_set(err, EINVAL, "bad DNS upstream \"%s\": give an IPv4 address[:port]",
                          text);
    return 0;
}

/* ---- the egress process ---- */

static int slot_state_send(struct gateway *g, int slot)
{
    struct gw_slot *s = &g->slots[slot];
    json_t *st = g->hooks.slot_state(g->ctx, s->id);
    json_t *o = json_pack("{s:i, s:s, s:O?, s:O?}", "slot", slot, "id", s->id, "policy",
                          st ? json_object_get(st, "policy") : NULL, "inject",
                          st ? json_object_get(st, "inject") : NULL);
    json_decref(st);
    int r = netipc_send(g->proc.ctl, NETIPC_SLOT_STATE, o, NULL, 0, NETIPC_DOWN_MAX);
    json_decref(o);
    return r;
}

static void proc_down(struct gateway *g, const char *why);

/* A message to the egress process; one it cannot take (its socket's buffer is full: it has
 * stopped reading) ends it, and the restart sends every slot's state afresh. */
static void proc_send(struct gateway *g, int type, int slot, int fd)
{
    if (g->proc.ctl < 0)
        return; /* down: the restart sends everything */
    int r;
    if (type == NETIPC_SLOT_STATE) {
        r = slot_state_send(g, slot);
    } else {
        json_t *o = json_pack("{s:i}", "slot", slot);
        r = netipc_send(g->proc.ctl, type, o, fd >= 0 ? &fd : NULL, fd >= 0, NETIPC_DOWN_MAX);
        json_decref(o);
    }
    if (r < 0) {
        char why[96];
        snprintf(why, sizeof(why), "cannot send to it: %s", strerror(errno));
        proc_down(g, why);
    }
}

static void add_stats(struct gateway_stats *a, const struct gateway_stats *b)
{
    a->proxy_bytes_up += b->proxy_bytes_up;
    a->proxy_bytes_down += b->proxy_bytes_down;
    a->proxy_connections += b->proxy_connections;
}

static void on_event(struct gateway *g, json_t *o)
{
    const char *id = json_string_value(json_object_get(o, "id"));
    const char *via = json_string_value(json_object_get(o, "via"));
    const char *host = json_string_value(json_object_get(o, "host"));
    json_t *port = json_object_get(o, "port");
    json_t *reason = json_object_get(o, "reason");
    if (!id || !via || !host || !json_is_integer(port) || (reason && !json_is_string(reason)) ||
        strlen(id) > GATEWAY_ID_MAX || (strcmp(via, "dns") && strcmp(via, "proxy")))
        return;
    int p = (int)json_integer_value(port);
    if (p < 0 || p > 65535)
        return;
    if (reason && g->hooks.denied)
        g->hooks.denied(g->ctx, id, via, host, p, json_string_value(reason));
    else if (!reason && g->hooks.allowed)
        g->hooks.allowed(g->ctx, id, host, p);
}

static void on_stats_msg(struct gateway *g, json_t *o)
{
    json_t *up = json_object_get(o, "up"), *down = json_object_get(o, "down");
    json_t *conns = json_object_get(o, "conns"), *res = json_object_get(o, "resolvers");
    if (!json_is_integer(up) || !json_is_integer(down) || !json_is_integer(conns) ||
        !json_is_integer(res))
        return;
    g->seen.proxy_bytes_up = (uint64_t)json_integer_value(up);
    g->seen.proxy_bytes_down = (uint64_t)json_integer_value(down);
    g->seen.proxy_connections = (uint64_t)json_integer_value(conns);
    g->seen.resolvers = (unsigned)json_integer_value(res);
}

static void on_ctl(evutil_socket_t fd, short what, void *arg)
{
    struct gateway *g = arg;
    for (int n = 0; n < 256 && g->proc.ctl >= 0; n++) {
        int type = 0, fds[NETIPC_FDS_MAX], nfds = 0;
        json_t *o = NULL;
        struct wr_err err = {0};
        int r = netipc_recv(g->proc.ctl, &type, &o, fds, &nfds, g->rbuf, NETIPC_UP_MAX, &err);
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) {
            proc_down(g, r == 0 ? "it closed its socket" : err.msg);
            return;
        }
        for (int i = 0; i < nfds; i++)
            close(fds[i]); /* it has none to give */
        if (nfds || !o) {
            json_decref(o);
            proc_down(g, "a message it may not send");
            return;
        }
        if (type == NETIPC_EVENT)
            on_event(g, o);
        else if (type == NETIPC_STATS)
            on_stats_msg(g, o);
        else if (type == NETIPC_READY)
            log_info(NULL, "egress.ready", "pid=%d", (int)g->proc.net_pid);
        else {
            json_decref(o);
            proc_down(g, "a message it may not send");
            return;
        }
        json_decref(o);
    }
}

static void on_exit_ev(evutil_socket_t fd, short what, void *arg)
{
    proc_down(arg, "it exited");
}

static int pidfd_of(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* Starts `withruntime __net|__signer USER` with fds as its 3, 4, ... and nothing else but
 * stdio (its log lines go where the daemon's go). The common reaper (common/proc.h) collects it. */
static pid_t spawn(const char *what, const char *user, const int *fds, int nfds, struct wr_err *err)
{
    char *argv[] = {"/proc/self/exe", (char *)what, (char *)user, NULL};
    pid_t pid = proc_spawn_keep(argv, NULL, -1, STDOUT_FILENO, STDERR_FILENO, fds, nfds, err);
    if (pid < 0)
        wr_err_prefix(err, "starting the %s process", what + 2);
    return pid;
}

static void reap(pid_t *pid, int *pidfd, struct event **ev, const char *what)
{
    if (*ev) {
        event_free(*ev);
        *ev = NULL;
    }
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        int st = 0;
        struct wr_err e = {0};
        if (proc_wait(*pid, &st, 5000, &e) < 0)
            log_error(NULL, "egress.wait", "process=%s pid=%d error=\"%s\"", what, (int)*pid,
                      e.msg);
        else if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL)
            log_error(NULL, "egress.crashed", "process=%s pid=%d signal=%d", what, (int)*pid,
                      WTERMSIG(st));
        else if (WIFEXITED(st) && WEXITSTATUS(st))
            log_error(NULL, "egress.exited", "process=%s pid=%d status=%d", what, (int)*pid,
                      WEXITSTATUS(st));
    }
    *pid = -1;
    if (*pidfd >= 0)
        close(*pidfd);
    *pidfd = -1;
}

/* Stops both processes (either going takes the other: the proxy cannot intercept TLS without
 * its signer). Sandboxes' connections wait in the listener's backlog, their lookups in their
 * sockets, until the next one starts: egress is down, never open. */
static void proc_stop(struct gateway *g)
{
    struct gw_proc *p = &g->proc;
    if (p->ev_ctl) {
        event_free(p->ev_ctl);
        p->ev_ctl = NULL;
    }
    if (p->ctl >= 0)
        close(p->ctl);
    p->ctl = -1;
    reap(&p->net_pid, &p->net_pidfd, &p->ev_net_exit, "egress");
    reap(&p->signer_pid, &p->signer_pidfd, &p->ev_signer_exit, "signer");
    add_stats(&g->base_stats, &g->seen);
    memset(&g->seen, 0, sizeof(g->seen));
}

static int proc_start(struct gateway *g, int wait_ready, struct wr_err *err);

static void on_restart(evutil_socket_t fd, short what, void *arg)
{
    struct gateway *g = arg;
    struct wr_err err = {0};
    if (proc_start(g, 0, &err) < 0) {
        log_error(NULL, "egress.restart_failed", "error=\"%s\" retry_ms=%d", err.msg,
                  g->backoff_ms);
        proc_down(g, NULL);
    }
}

static void proc_down(struct gateway *g, const char *why)
{
    if (why)
        log_error(NULL, "egress.down", "pid=%d why=\"%s\"", (int)g->proc.net_pid, why);
    proc_stop(g);
    /* a process that ran a while gets a quick restart; one that keeps failing, a slower one */
    if (now_ms_monotonic() - g->proc.started_ms > 30000)
        g->backoff_ms = 0;
    int delay = g->backoff_ms;
    g->backoff_ms = g->backoff_ms ? (g->backoff_ms * 2 > 5000 ? 5000 : g->backoff_ms * 2) : 100;
    g->base_stats.egress_restarts++;
    struct timeval tv = {.tv_sec = delay / 1000, .tv_usec = (delay % 1000) * 1000};
    event_add(g->ev_restart, &tv);
}

/* Waits (at start-up only) for the egress process to say it serves, at most 10 s. */
static int wait_ready(struct gateway *g, struct wr_err *err)
{
    struct pollfd p = {.fd = g->proc.ctl, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1)
        return wr_err_set(err, ETIMEDOUT, "the egress process did not start within 10 s");
    int type = 0, fds[NETIPC_FDS_MAX], nfds = 0;
    json_t *o = NULL;
    int r = netipc_recv(g->proc.ctl, &type, &o, fds, &nfds, g->rbuf, NETIPC_UP_MAX, err);
    json_decref(o);
    for (int i = 0; r > 0 && i < nfds; i++)
        close(fds[i]);
    if (r > 0 && type == NETIPC_READY && !nfds)
        return 0;
    return wr_err_set(err, EPROTO,
                      "the egress process stopped at start-up (the daemon's log says why)");
}

static int proc_start(struct gateway *g, int wait, struct wr_err *err)
{
    struct gw_proc *p = &g->proc;
    int ctl[2] = {-1, -1}, sig[2] = {-1, -1}, keyfd = -1, certfd = -1;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0 ||
        (g->ca_pem && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sig) < 0)) {
        wr_err_sys(err, errno, "the egress process's sockets");
        goto fail;
    }
    int sz = NETIPC_SNDBUF;
    for (int i = 0; i < 2; i++)
        setsockopt(ctl[i], SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz));
    if (g->ca_pem) {
        keyfd = open(g->ca_key, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        certfd = open(g->ca_cert, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (keyfd < 0 || certfd < 0) {
            wr_err_sys(err, errno, "the daemon's CA");
            goto fail;
        }
        int sfds[3] = {sig[1], keyfd, certfd};
        p->signer_pid = spawn("__signer", g->cfg.user, sfds, 3, err);
        if (p->signer_pid < 0)
            goto fail;
        close(sig[1]);
        close(keyfd);
        close(certfd);
        sig[1] = keyfd = certfd = -1;
    }
    p->net_pid = spawn("__net", g->cfg.user, &ctl[1], 1, err);
    if (p->net_pid < 0)
        goto fail;
    close(ctl[1]);
    ctl[1] = -1;
    p->ctl = steal_fd(&ctl[0]);
    p->started_ms = now_ms_monotonic();
    char up[32];
    snprintf(up, sizeof(up), "%s:%d", inet_ntoa(g->upstream.sin_addr), ntohs(g->upstream.sin_port));
    json_t *init = json_pack("{s:s, s:s, s:i, s:s?, s:s}", "upstream", up, "public_ranges",
                             g->cfg.public_ranges, "max_conns", g->cfg.proxy_max_conns, "ca_pem",
                             g->ca_pem, "extra_ca", g->extra_ca);
    int ifds[2] = {g->listen_fd, sig[0]};
    int r = netipc_send(p->ctl, NETIPC_INIT, init, ifds, g->ca_pem ? 2 : 1, NETIPC_DOWN_MAX);
    json_decref(init);
    if (sig[0] >= 0)
        close(sig[0]);
    sig[0] = -1;
    if (r < 0) {
        wr_err_sys(err, errno, "configuring the egress process");
        goto fail;
    }
    if (wait && wait_ready(g, err) < 0)
        goto fail;
    p->net_pidfd = pidfd_of(p->net_pid);
    p->signer_pidfd = p->signer_pid > 0 ? pidfd_of(p->signer_pid) : -1;
    p->ev_ctl = event_new(g->base, p->ctl, EV_READ | EV_PERSIST, on_ctl, g);
    if (!p->ev_ctl || event_add(p->ev_ctl, NULL) < 0) {
        wr_err_set(err, ENOMEM, "events");
        goto fail;
    }
    if (p->net_pidfd >= 0) {
        p->ev_net_exit = event_new(g->base, p->net_pidfd, EV_READ, on_exit_ev, g);
        event_add(p->ev_net_exit, NULL);
    }
    if (p->signer_pidfd >= 0) {
        p->ev_signer_exit = event_new(g->base, p->signer_pidfd, EV_READ, on_exit_ev, g);
        event_add(p->ev_signer_exit, NULL);
    }
    /* what it serves: every running sandbox, its state first, then its resolver's socket */
    for (int i = 0; i < GATEWAY_SLOTS && p->ctl >= 0; i++) {
        struct gw_slot *s = &g->slots[i];
        if (!s->used)
            continue;
        proc_send(g, NETIPC_SLOT_STATE, i, -1);
        if (s->active && p->ctl >= 0)
            proc_send(g, NETIPC_SLOT_OPEN, i, s->dns_fd);
    }
    if (p->ctl >= 0)
        log_info(NULL, "egress.started", "pid=%d signer_pid=%d user=%s", (int)p->net_pid,
                 (int)p->signer_pid, g->cfg.user);
    return 0;
fail:
    for (int i = 0; i < 2; i++) {
        if (ctl[i] >= 0)
            close(ctl[i]);
        if (sig[i] >= 0)
            close(sig[i]);
    }
    if (keyfd >= 0)
        close(keyfd);
    if (certfd >= 0)
        close(certfd);
    proc_stop(g);
    return -1;
}

/* ---- opening and closing ---- */

static int make_listener(struct gateway *g, struct wr_err *err)
{
    int fd = netns_socket(g->gw_ns, AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, err);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(GATEWAY_PROXY_PORT)};
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        listen(fd, GATEWAY_LISTEN_BACKLOG) < 0) {
        int e = errno;
        close(fd);
        return wr_err_sys(err, e, "the egress proxy's listener");
    }
    return fd;
}

struct gateway *gateway_open(struct event_base *base, const struct gateway_config *cfg,
                             const struct gateway_hooks *hooks, void *ctx, struct wr_err *err)
{
    struct gateway *g = xcalloc(1, sizeof(*g));
    g->base = base;
    g->cfg = *cfg;
    g->hooks = *hooks;
    g->ctx = ctx;
    g->gw_ns = -1;
    g->listen_fd = -1;
    g->proc = (struct gw_proc){
        .net_pid = -1, .signer_pid = -1, .net_pidfd = -1, .signer_pidfd = -1, .ctl = -1};
    if (!g->cfg.user[0])
        snprintf(g->cfg.user, sizeof(g->cfg.user), "%s", NETPROC_USER);
    g->rbuf = xmalloc(NETIPC_UP_MAX + 1);
    g->slots = xcalloc(GATEWAY_SLOTS, sizeof(*g->slots));
    for (int i = 0; i < GATEWAY_SLOTS; i++)
        g->slots[i].dns_fd = -1;
    g->ev_restart = event_new(base, -1, 0, on_restart, g);
    struct addr_ranges ranges;
    if (addr_ranges_parse(cfg->public_ranges, &ranges, err) < 0)
        goto fail;
    if (gateway_parse_upstream(cfg->dns_upstream, &g->upstream, err) < 0)
        goto fail;
    if (netns_create(&g->gw_ns, err) < 0) {
        wr_err_prefix(err, "the gateway network namespace");
        goto fail;
    }
    if (netns_ipv6_disable(g->gw_ns, err) < 0 ||
        netns_sysctl(g->gw_ns, "ipv4/ip_forward", "0", err) < 0)
        goto fail;
    char rules[sizeof(ruleset_fmt) + 32];
    snprintf(rules, sizeof(rules), ruleset_fmt, GATEWAY_PROXY_PORT, GATEWAY_PROXY_PORT);
    if (netns_nft_load(g->gw_ns, rules, err) < 0) {
        wr_err_prefix(err, "the gateway's nftables rules");
        goto fail;
    }
    if ((g->listen_fd = make_listener(g, err)) < 0)
        goto fail;
    if (cfg->ca_cert && cfg->ca_key && cfg->ca_cert_pem) {
        snprintf(g->ca_cert, sizeof(g->ca_cert), "%s", cfg->ca_cert);
        snprintf(g->ca_key, sizeof(g->ca_key), "%s", cfg->ca_key);
        g->ca_pem = xstrdup(cfg->ca_cert_pem);
    }
    if (cfg->upstream_extra_ca)
        snprintf(g->extra_ca, sizeof(g->extra_ca), "%s", cfg->upstream_extra_ca);
    /* the paths and the text are the caller's, for this call only */
    g->cfg.ca_cert = g->cfg.ca_key = g->cfg.upstream_extra_ca = g->cfg.ca_cert_pem = NULL;
    if (!g->ev_restart || proc_start(g, 1, err) < 0) {
        wr_err_prefix(err, "the egress process");
        goto fail;
    }
    char up[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &g->upstream.sin_addr, up, sizeof(up));
    log_info(NULL, "gateway.open", "dns_upstream=%s:%d extra_public=%u proxy_max_conns=%d", up,
             ntohs(g->upstream.sin_port), ranges.n,
             cfg->proxy_max_conns ? cfg->proxy_max_conns : PROXY_MAX_CONNS);
    return g;
fail:
    gateway_close(g);
    return NULL;
}

void gateway_close(struct gateway *g)
{
    if (!g)
        return;
    proc_stop(g);
    if (g->ev_restart)
        event_free(g->ev_restart);
    for (int i = 0; i < GATEWAY_SLOTS; i++)
        if (g->slots[i].dns_fd >= 0)
            close(g->slots[i].dns_fd);
    if (g->listen_fd >= 0)
        close(g->listen_fd);
    if (g->gw_ns >= 0)
        close(g->gw_ns);
    free(g->ca_pem);
    free(g->rbuf);
    free(g->slots);
    free(g);
}

/* ---- slots ---- */

int gateway_slot_take(struct gateway *g, const char *id, struct wr_err *err)
{
    for (unsigned n = 0; n < GATEWAY_SLOTS; n++) {
        unsigned i = (g->next + n) % GATEWAY_SLOTS;
        struct gw_slot *s = &g->slots[i];
        if (s->used)
            continue;
        s->used = 1;
        snprintf(s->id, sizeof(s->id), "%s", id);
        g->used++;
        g->next = (i + 1) % GATEWAY_SLOTS;
        return (int)i;
    }
    return wr_err_kind(err, WR_E_UNAVAILABLE, EAGAIN, "all %d sandbox network slots are in use",
                       GATEWAY_SLOTS);
}

int gateway_slot_activate(struct gateway *g, int slot, int dns_fd, struct wr_err *err)
{
    if (slot < 0 || slot >= GATEWAY_SLOTS || !g->slots[slot].used) {
        close(dns_fd);
        return wr_err_set(err, EINVAL, "no such network slot %d", slot);
    }
    struct gw_slot *s = &g->slots[slot];
    if (s->dns_fd >= 0)
        close(s->dns_fd);
    s->dns_fd = dns_fd;
    s->active = 1;
    proc_send(g, NETIPC_SLOT_STATE, slot, -1);
    proc_send(g, NETIPC_SLOT_OPEN, slot, s->dns_fd);
    return 0;
}

void gateway_slot_release(struct gateway *g, int slot)
{
    if (!g || slot < 0 || slot >= GATEWAY_SLOTS || !g->slots[slot].used)
        return;
    struct gw_slot *s = &g->slots[slot];
    proc_send(g, NETIPC_SLOT_CLOSE, slot, -1);
    if (s->dns_fd >= 0)
        close(s->dns_fd);
    s->dns_fd = -1;
    s->active = 0;
    s->used = 0;
    s->id[0] = '\0';
    g->used--;
}

/* ---- plumbing (workers) ---- */

static void veth_name(int slot, char *out, size_t cap)
{
    snprintf(out, cap, "wrs%d", slot);
}

int gateway_plumb(struct gateway *g, int slot, int *netns_fd, int *dns_fd, char nameserver[16],
                  struct wr_err *err)
{
    *netns_fd = -1;
    *dns_fd = -1;
    if (slot < 0 || slot >= GATEWAY_SLOTS)
        return wr_err_set(err, EINVAL, "no such network slot %d", slot);
    char gw_if[16];
    veth_name(slot, gw_if, sizeof(gw_if));
    struct in_addr gw_addr = gateway_slot_addr(slot, 1), sb_addr = gateway_slot_addr(slot, 2);
    int ns = -1, dfd = -1;
    /* Whatever an earlier start of this slot may have left. */
    if (netns_link_del(g->gw_ns, gw_if, err) < 0)
        return -1;
    if (netns_create(&ns, err) < 0)
        return -1;
    struct netns_uplink up = {.gw_ifname = gw_if,
                              .sb_ifname = "eth0",
                              .gw_addr = gw_addr,
                              .sb_addr = sb_addr,
                              .prefix = 30};
    if (netns_ipv6_disable(ns, err) < 0 || netns_uplink_create(g->gw_ns, ns, &up, err) < 0)
        goto fail;
    dfd = netns_socket(g->gw_ns, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0, err);
    if (dfd < 0)
        goto fail;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(53), .sin_addr = gw_addr};
    if (bind(dfd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
        wr_err_sys(err, errno, "binding the sandbox's resolver");
        goto fail;
    }
    inet_ntop(AF_INET, &gw_addr, nameserver, 16);
    *netns_fd = ns;
    *dns_fd = dfd;
    return 0;
fail:
    if (dfd >= 0)
        close(dfd);
    struct wr_err e;
    netns_link_del(g->gw_ns, gw_if, &e);
    close(ns);
    return wr_err_prefix(err, "the sandbox's network");
}

int gateway_unplumb(struct gateway *g, int slot, struct wr_err *err)
{
    if (slot < 0 || slot >= GATEWAY_SLOTS)
        return 0;
    char gw_if[16];
    veth_name(slot, gw_if, sizeof(gw_if));
    return netns_link_del(g->gw_ns, gw_if, err);
}

void gateway_slot_policy_changed(struct gateway *g, int slot)
{
    if (!g || slot < 0 || slot >= GATEWAY_SLOTS || !g->slots[slot].used)
        return;
    proc_send(g, NETIPC_SLOT_STATE, slot, -1);
}

void gateway_refresh(struct gateway *g)
{
    for (int i = 0; g && i < GATEWAY_SLOTS; i++)
        if (g->slots[i].used)
            proc_send(g, NETIPC_SLOT_STATE, i, -1);
}

void gateway_stats(const struct gateway *g, struct gateway_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!g)
        return;
    *out = g->base_stats;
    add_stats(out, &g->seen);
    out->resolvers = g->seen.resolvers;
    out->slots_used = g->used;
    out->egress_pid = g->proc.ctl >= 0 ? (int)g->proc.net_pid : 0;
    out->signer_pid = g->proc.ctl >= 0 ? (int)g->proc.signer_pid : 0;
}

/* ---- doctor ---- */

int gateway_probe(char *detail, size_t detail_len, struct wr_err *err)
{
    if (detail_len)
        detail[0] = '\0';
    int gw = -1, sb = -1, ret = -1;
    if (netns_create(&gw, err) < 0) {
        wr_err_prefix(err, "creating a network namespace");
        goto out;
    }
    char rules[sizeof(ruleset_fmt) + 32];
    snprintf(rules, sizeof(rules), ruleset_fmt, GATEWAY_PROXY_PORT, GATEWAY_PROXY_PORT);
    if (netns_ipv6_disable(gw, err) < 0 || netns_nft_load(gw, rules, err) < 0) {
        wr_err_prefix(err, "the gateway's nftables rules");
        goto out;
    }
    if (netns_create(&sb, err) < 0)
        goto out;
    struct netns_uplink up = {.gw_ifname = "wrs0",
                              .sb_ifname = "eth0",
                              .gw_addr = gateway_slot_addr(0, 1),
                              .sb_addr = gateway_slot_addr(0, 2),
                              .prefix = 30};
    if (netns_uplink_create(gw, sb, &up, err) < 0) {
        wr_err_prefix(err, "a veth pair into the gateway");
        goto out;
    }
    snprintf(detail, detail_len, "namespaces, veth pairs and nftables (DNAT) work");
    ret = 0;
out:
    if (sb >= 0)
        close(sb);
    if (gw >= 0)
        close(gw);
    return ret;
}
