/*
 * The gateway namespace, the sandboxes' slots in it, and the proxy and resolvers that serve them
 * (see gateway.h for the layout).
 */
#include "net/gateway.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "net/dnscache.h"
#include "net/lookup.h"
#include "net/netns.h"
#include "net/proxy.h"
#include "net/resolver.h"
#include "net/tlsmitm.h"

#define GATEWAY_NET 0x0ac80000u /* 10.200.0.0/16 */
#define GATEWAY_LISTEN_BACKLOG 1024

struct gw_slot {
    struct gateway *g;
    int index;
    int used;
    char id[GATEWAY_ID_MAX + 1];
    struct resolver *resolver;
};

struct gateway {
    struct event_base *base;
    struct gateway_config cfg;
    struct gateway_hooks hooks;
    void *ctx;
    int gw_ns; /* the gateway namespace */
    struct sockaddr_in upstream;
    struct lookup *lookup;
    /* The resolvers' answers, shared by every slot (net/dnscache.h says why that is safe). Kept
     * apart from the proxy's own cache in lookup: that one is what the proxy dials, and nothing
     * a sandbox's lookups do (a flood of names, answers kept longer) may evict or change it. */
    struct dnscache *dns_cache;
    struct tlsmitm *mitm;
    struct proxy *proxy;
    struct gw_slot *slots; /* GATEWAY_SLOTS of them */
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

static struct in_addr slot_addr(int slot, int host)
{
    struct in_addr a = {.s_addr = htonl(GATEWAY_NET + (uint32_t)slot * 4 + (uint32_t)host)};
    return a;
}

/* The slot of a sandbox's own address, or -1. */
static int slot_of_peer(const struct gateway *g, const struct sockaddr *sa, socklen_t len)
{
    if (!sa || sa->sa_family != AF_INET || len < (socklen_t)sizeof(struct sockaddr_in))
        return -1;
    uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
    if ((a & 0xffff0000u) != GATEWAY_NET || (a & 3u) != 2)
        return -1;
    int slot = (int)((a - GATEWAY_NET) / 4);
    if (slot >= GATEWAY_SLOTS || !g->slots[slot].used)
        return -1;
    return slot;
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

/* ---- hooks for the proxy and the resolvers ---- */

static json_t *proxy_policy(void *ctx, const struct sockaddr *peer, socklen_t len, char *id,
                            size_t idcap)
{
    struct gateway *g = ctx;
    int slot = slot_of_peer(g, peer, len);
    if (slot < 0)
        return NULL;
    snprintf(id, idcap, "%s", g->slots[slot].id);
    return g->hooks.policy(g->ctx, g->slots[slot].id);
}

static int proxy_original_dst(void *ctx, int fd, struct sockaddr_in *out)
{
    socklen_t len = sizeof(*out);
    if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, out, &len) < 0)
        return -1;
    return out->sin_family == AF_INET ? 0 : -1;
}

/* An address of the daemon's own host: binding to it works. The resolvers ask it too. */
static int proxy_is_local(void *ctx, const struct sockaddr *addr, socklen_t len)
{
    if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
        return 1;
    int fd = socket(addr->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 1; /* cannot tell: do not dial */
    struct sockaddr_storage ss;
    memcpy(&ss, addr, len < sizeof(ss) ? len : sizeof(ss));
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    int r = bind(fd, (struct sockaddr *)&ss, len);
    int e = errno;
    close(fd);
    return r == 0 || e != EADDRNOTAVAIL;
}

static void proxy_denied(void *ctx, const char *id, const char *host, int port, const char *reason)
{
    struct gateway *g = ctx;
    if (g->hooks.denied)
        g->hooks.denied(g->ctx, id, "proxy", host, port, reason);
}

static void proxy_allowed(void *ctx, const char *id, const char *host, int port)
{
    struct gateway *g = ctx;
    if (g->hooks.allowed)
        g->hooks.allowed(g->ctx, id, host, port);
}

static char *proxy_rewrite_head(void *ctx, const char *id, const char *host, int port,
                                const char *head, size_t len, size_t *outlen)
{
    struct gateway *g = ctx;
    return g->hooks.rewrite_head ? g->hooks.rewrite_head(g->ctx, id, host, port, head, len, outlen)
                                 : NULL;
}

/* Every slot's resolver address is in the gateway namespace, so a sandbox can send to a
 * neighbour's as easily as to its own: what comes from anyone but the slot's own sandbox is
 * dropped unanswered, so that it cannot land in the neighbour's network log. */
static int dns_client_ok(void *ctx, const struct sockaddr *client, socklen_t len)
{
    struct gw_slot *s = ctx;
    return slot_of_peer(s->g, client, len) == s->index;
}

static json_t *dns_policy(void *ctx, const struct sockaddr *client, socklen_t len)
{
    struct gw_slot *s = ctx;
    if (slot_of_peer(s->g, client, len) != s->index)
        return NULL;
    return s->g->hooks.policy(s->g->ctx, s->id);
}

static void dns_denied(void *ctx, const struct sockaddr *client, socklen_t len, const char *name,
                       uint16_t qtype, const char *reason)
{
    struct gw_slot *s = ctx;
    if (s->g->hooks.denied)
        s->g->hooks.denied(s->g->ctx, s->id, "dns", name, 53, reason);
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
    g->slots = xcalloc(GATEWAY_SLOTS, sizeof(*g->slots));
    for (int i = 0; i < GATEWAY_SLOTS; i++) {
        g->slots[i].g = g;
        g->slots[i].index = i;
    }
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
    g->lookup = lookup_new(base, (struct sockaddr *)&g->upstream, sizeof(g->upstream), err);
    if (!g->lookup)
        goto fail;
    g->dns_cache = dnscache_new(GATEWAY_SLOTS);
    if (!g->dns_cache) {
        wr_err_set(err, ENOMEM, "the resolvers' cache");
        goto fail;
    }
    int lfd = make_listener(g, err);
    if (lfd < 0)
        goto fail;
    if (cfg->ca_cert && cfg->ca_key) {
        g->mitm = tlsmitm_new(cfg->ca_cert, cfg->ca_key, cfg->upstream_extra_ca, err);
        if (!g->mitm) {
            close(lfd);
            goto fail;
        }
    }
    /* the paths are the caller's, for this call only */
    g->cfg.ca_cert = g->cfg.ca_key = g->cfg.upstream_extra_ca = NULL;
    struct proxy_config pc = {
        .extra_public = &g->cfg.extra_public, .mitm = g->mitm, .max_conns = cfg->proxy_max_conns};
    struct proxy_hooks ph = {.policy = proxy_policy,
                             .original_dst = proxy_original_dst,
                             .is_local = proxy_is_local,
                             .denied = proxy_denied,
                             .allowed = proxy_allowed,
                             .rewrite_head = proxy_rewrite_head};
    g->proxy = proxy_new(base, lfd, g->lookup, &pc, &ph, g, err);
    if (!g->proxy)
        goto fail;
    char up[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &g->upstream.sin_addr, up, sizeof(up));
    log_info(NULL, "gateway.open", "dns_upstream=%s:%d extra_public=%u proxy_max_conns=%d", up,
             ntohs(g->upstream.sin_port), g->cfg.extra_public.n,
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
    for (int i = 0; i < GATEWAY_SLOTS; i++)
        if (g->slots[i].resolver)
            resolver_free(g->slots[i].resolver);
    proxy_free(g->proxy);
    tlsmitm_free(g->mitm);
    lookup_free(g->lookup);
    dnscache_free(g->dns_cache);
    if (g->gw_ns >= 0)
        close(g->gw_ns);
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
    if (s->resolver) {
        resolver_free(s->resolver);
        s->resolver = NULL;
    }
    struct resolver_hooks rh = {.policy = dns_policy,
                                .client_ok = dns_client_ok,
                                .is_local = proxy_is_local,
                                .denied = dns_denied};
    s->resolver = resolver_new(g->base, dns_fd, (struct sockaddr *)&g->upstream,
                               sizeof(g->upstream), &g->cfg.extra_public, &rh, s, err);
    if (!s->resolver)
        return -1;
    resolver_set_cache(s->resolver, g->dns_cache, (unsigned)slot);
    return 0;
}

void gateway_slot_release(struct gateway *g, int slot)
{
    if (!g || slot < 0 || slot >= GATEWAY_SLOTS || !g->slots[slot].used)
        return;
    struct gw_slot *s = &g->slots[slot];
    if (s->resolver) {
        resolver_free(s->resolver);
        s->resolver = NULL;
    }
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_addr = slot_addr(slot, 2)};
    proxy_close_peer(g->proxy, (struct sockaddr *)&peer, sizeof(peer));
    dnscache_disown(g->dns_cache, (unsigned)slot);
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
    struct in_addr gw_addr = slot_addr(slot, 1), sb_addr = slot_addr(slot, 2);
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
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_addr = slot_addr(slot, 2)};
    proxy_recheck_peer(g->proxy, (struct sockaddr *)&peer, sizeof(peer));
}

void gateway_stats(const struct gateway *g, struct gateway_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!g)
        return;
    out->slots_used = g->used;
    if (g->proxy) {
        struct proxy_stats ps;
        proxy_stats(g->proxy, &ps);
        out->proxy_bytes_up = ps.bytes_up;
        out->proxy_bytes_down = ps.bytes_down;
        out->proxy_connections = ps.accepted;
    }
    for (int i = 0; i < GATEWAY_SLOTS; i++)
        if (g->slots[i].resolver)
            out->resolvers++;
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
                              .gw_addr = slot_addr(0, 1),
                              .sb_addr = slot_addr(0, 2),
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
