/*
 * The egress process and the CA's signer (netproc.h).
 */
#include "net/netproc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/confine.h"
#include "common/log.h"
#include "common/util.h"
#include "net/dnscache.h"
#include "net/gateway.h"
#include "net/inject.h"
#include "net/lookup.h"
#include "net/netipc.h"
#include "net/proxy.h"
#include "net/resolver.h"
#include "net/signer.h"
#include "net/tlsmitm.h"

/* What the daemon sent of one slot, and what is left to do about it (done in run_pending,
 * outside any proxy or resolver callback: a message read while one of them runs may close what
 * it is working on). */
struct np;
struct np_slot {
    struct np *np;
    int index;
    int used;
    char id[GATEWAY_ID_MAX + 1];
    json_t *policy;
    json_t *inject_json;      /* holds the strings inject points at */
    struct inject inject[32]; /* SANDBOX_SECRETS_MAX (daemon/secrets.h): all one sandbox has */
    size_t ninject;
    struct resolver *resolver;
    int dns_fd;         /* a resolver to start on it (-1: none) */
    int close, recheck; /* pending: stop the resolver and close connections; recheck them */
    int queued;
};

struct np {
    struct event_base *base;
    int ctl;
    char *buf; /* NETIPC_DOWN_MAX + 1 */
    struct sockaddr_in upstream;
    struct addr_ranges extra_public;
    struct lookup *lookup;
    struct dnscache *cache;
    struct tlsmitm *mitm;
    struct signer_client *signer;
    int signer_gone;
    struct proxy *proxy;
    struct np_slot *slots;
    int *queue; /* slots with something pending */
    unsigned nqueue;
    struct event *ev_ctl, *ev_pending, *ev_stats;
    uint64_t events_dropped;
    struct proxy_stats last;
    unsigned last_resolvers;
    int exit_status;
};

/* ---- to the daemon ---- */

static void send_up(struct np *np, int type, json_t *o)
{
    if (netipc_send(np->ctl, type, o, NULL, 0, NETIPC_UP_MAX) < 0)
        np->events_dropped++; /* the daemon is behind: its log loses an entry, nothing else */
    json_decref(o);
}

static void send_event(struct np *np, const char *id, const char *via, const char *host, int port,
                       const char *reason)
{
    char h[300];
    snprintf(h, sizeof(h), "%.255s", host ? host : "");
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:i}", "id", id ? id : "", "via", via, "host", h, "port", port);
    if (reason)
        json_object_set_new(o, "reason", json_string(reason));
    send_up(np, NETIPC_EVENT, o);
}

static void on_stats(evutil_socket_t fd, short what, void *arg)
{
    struct np *np = arg;
    struct proxy_stats ps;
    proxy_stats(np->proxy, &ps);
    unsigned resolvers = 0;
    for (int i = 0; i < GATEWAY_SLOTS; i++)
        resolvers += np->slots[i].resolver != NULL;
    if (ps.bytes_up == np->last.bytes_up && ps.bytes_down == np->last.bytes_down &&
        ps.accepted == np->last.accepted && resolvers == np->last_resolvers)
        return;
    np->last = ps;
    np->last_resolvers = resolvers;
    send_up(np, NETIPC_STATS,
            json_pack("{s:I, s:I, s:I, s:i, s:I}", "up", (json_int_t)ps.bytes_up, "down",
                      (json_int_t)ps.bytes_down, "conns", (json_int_t)ps.accepted, "resolvers",
                      (int)resolvers, "dropped", (json_int_t)np->events_dropped));
}

/* ---- the daemon's messages ---- */

static void slot_clear_state(struct np_slot *s)
{
    json_decref(s->policy);
    s->policy = NULL;
    if (s->inject_json) {
        /* the values: wiped, not just freed */
        for (size_t i = 0; i < s->ninject; i++)
            explicit_bzero((char *)s->inject[i].value, s->inject[i].len);
        json_decref(s->inject_json);
        s->inject_json = NULL;
    }
    s->ninject = 0;
}

static void enqueue(struct np *np, int slot)
{
    struct np_slot *s = &np->slots[slot];
    if (!s->queued) {
        s->queued = 1;
        np->queue[np->nqueue++] = slot;
    }
    event_active(np->ev_pending, EV_READ, 0);
}

static int slot_arg(json_t *o)
{
    json_t *v = json_object_get(o, "slot");
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= GATEWAY_SLOTS)
        return -1;
    return (int)json_integer_value(v);
}

/* The secrets a slot's sandbox may use now, from the daemon's "inject" array. */
static int parse_inject(struct np_slot *s, json_t *a)
{
    size_t i;
    json_t *x;
    if (!json_is_array(a) || json_array_size(a) > sizeof(s->inject) / sizeof(s->inject[0]))
        return -1;
    json_array_foreach(a, i, x)
    {
        json_t *ph = json_object_get(x, "placeholder"), *v = json_object_get(x, "value");
        json_t *pol = json_object_get(x, "policy"), *hd = json_object_get(x, "headers");
        if (!json_is_string(ph) || !json_is_string(v) || !json_is_object(pol) || !json_is_array(hd))
            return -1;
        s->inject[i] = (struct inject){.placeholder = json_string_value(ph),
                                       .value = json_string_value(v),
                                       .len = json_string_length(v),
                                       .policy = pol,
                                       .headers = hd};
    }
    s->ninject = json_array_size(a);
    return 0;
}

/* Applies one message's data at once (a decision made after it sees it) and queues what it
 * asks to be done. Returns -1 for a message the egress process cannot follow. */
static int apply(struct np *np, int type, json_t *o, int *fds, int nfds)
{
    int slot = o ? slot_arg(o) : -1;
    if ((type != NETIPC_SLOT_OPEN && nfds) || (type == NETIPC_SLOT_OPEN && nfds != 1) || slot < 0)
        return -1;
    struct np_slot *s = &np->slots[slot];
    switch (type) {
    case NETIPC_SLOT_STATE: {
        json_t *id = json_object_get(o, "id"), *pol = json_object_get(o, "policy");
        json_t *inj = json_object_get(o, "inject");
        if (!json_is_string(id) || json_string_length(id) > GATEWAY_ID_MAX ||
            !(json_is_object(pol) || json_is_null(pol)))
            return -1;
        slot_clear_state(s);
        snprintf(s->id, sizeof(s->id), "%s", json_string_value(id));
        s->used = 1;
        s->policy = json_is_object(pol) ? json_incref(pol) : NULL;
        if (json_is_array(inj) && json_array_size(inj)) {
            if (parse_inject(s, inj) < 0) {
                s->ninject = 0;
                return -1;
            }
            s->inject_json = json_incref(inj);
        }
        s->recheck = 1;
        enqueue(np, slot);
        return 0;
    }
    case NETIPC_SLOT_OPEN:
        if (s->dns_fd >= 0)
            close(s->dns_fd);
        s->dns_fd = fds[0];
        enqueue(np, slot);
        return 0;
    case NETIPC_SLOT_CLOSE:
        slot_clear_state(s);
        s->used = 0;
        s->id[0] = '\0';
        s->close = 1;
        if (s->dns_fd >= 0) {
            close(s->dns_fd);
            s->dns_fd = -1;
        }
        enqueue(np, slot);
        return 0;
    default: return -1;
    }
}

static void quit(struct np *np, int status)
{
    np->exit_status = status;
    event_base_loopbreak(np->base);
}

/* Reads what the daemon sent; only_state: just the slot states waiting (called before a
 * decision, from inside the proxy's or a resolver's callback). */
static void read_ctl(struct np *np, int only_state)
{
    for (int n = 0; n < 4096; n++) {
        if (only_state) {
            int t = netipc_peek(np->ctl);
            if (t != NETIPC_SLOT_STATE && t != NETIPC_SLOT_CLOSE)
                return;
        }
        int type = 0, fds[NETIPC_FDS_MAX], nfds = 0;
        json_t *o = NULL;
        struct wr_err err = {0};
        int r = netipc_recv(np->ctl, &type, &o, fds, &nfds, np->buf, NETIPC_DOWN_MAX, &err);
        if (r < 0 && errno == EAGAIN)
            return;
        if (r == 0) {
            quit(np, 0); /* the daemon closed: it is stopping */
            return;
        }
        int bad = r < 0 || apply(np, type, o, fds, nfds) < 0;
        json_decref(o);
        if (bad) {
            if (r > 0)
                for (int i = 0; i < nfds; i++)
                    if (type != NETIPC_SLOT_OPEN)
                        close(fds[i]);
            log_error(NULL, "egress.protocol", "type=%d error=\"%s\"", type,
                      err.msg[0] ? err.msg : "a message it cannot follow");
            quit(np, 2);
            return;
        }
    }
}

static void on_ctl(evutil_socket_t fd, short what, void *arg)
{
    read_ctl(arg, 0);
}

static const struct resolver_hooks np_resolver_hooks;

/* What the queued messages asked for, outside the callbacks. */
static void run_pending(evutil_socket_t fd, short what, void *arg)
{
    struct np *np = arg;
    while (np->nqueue) {
        int slot = np->queue[--np->nqueue];
        struct np_slot *s = &np->slots[slot];
        s->queued = 0;
        struct sockaddr_in peer = {.sin_family = AF_INET, .sin_addr = gateway_slot_addr(slot, 2)};
        if (s->close) {
            s->close = 0;
            if (s->resolver)
                resolver_free(s->resolver);
            s->resolver = NULL;
            proxy_close_peer(np->proxy, (struct sockaddr *)&peer, sizeof(peer));
            dnscache_disown(np->cache, (unsigned)slot);
        }
        if (s->dns_fd >= 0) {
            if (s->resolver)
                resolver_free(s->resolver);
            struct wr_err err = {0};
            s->resolver =
                resolver_new(np->base, steal_fd(&s->dns_fd), (struct sockaddr *)&np->upstream,
                             sizeof(np->upstream), &np->extra_public, &np_resolver_hooks, s, &err);
            if (s->resolver)
                resolver_set_cache(s->resolver, np->cache, (unsigned)slot);
            else
                log_error(s->id, "egress.resolver", "error=\"%s\"", err.msg);
        }
        if (s->recheck) {
            s->recheck = 0;
            if (s->used)
                proxy_recheck_peer(np->proxy, (struct sockaddr *)&peer, sizeof(peer));
        }
    }
}

/* ---- the proxy's and the resolvers' questions ---- */

static struct np_slot *slot_of(struct np *np, const struct sockaddr *sa, socklen_t len, int *idx)
{
    read_ctl(np, 1);
    int slot = gateway_slot_of_addr(sa, len);
    if (slot < 0 || !np->slots[slot].used)
        return NULL;
    if (idx)
        *idx = slot;
    return &np->slots[slot];
}

static json_t *proxy_policy(void *ctx, const struct sockaddr *peer, socklen_t len, char *id,
                            size_t idcap)
{
    struct np_slot *s = slot_of(ctx, peer, len, NULL);
    if (!s)
        return NULL;
    snprintf(id, idcap, "%s", s->id);
    return s->policy;
}

static int proxy_original_dst(void *ctx, int fd, struct sockaddr_in *out)
{
    socklen_t len = sizeof(*out);
    if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, out, &len) < 0)
        return -1;
    return out->sin_family == AF_INET ? 0 : -1;
}

/* An address of the host's own: binding to it works. The resolvers ask it too. */
static int is_local(void *ctx, const struct sockaddr *addr, socklen_t len)
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
    send_event(ctx, id, "proxy", host, port, reason ? reason : "denied");
}

static void proxy_allowed(void *ctx, const char *id, const char *host, int port)
{
    send_event(ctx, id, "proxy", host, port, NULL);
}

static char *proxy_rewrite_head(void *ctx, const char *id, const char *host, int port,
                                const char *head, size_t len, size_t *outlen)
{
    struct np *np = ctx;
    read_ctl(np, 1);
    for (int i = 0; i < GATEWAY_SLOTS; i++) {
        struct np_slot *s = &np->slots[i];
        if (s->used && s->ninject && !strcmp(s->id, id))
            return inject_head(s->inject, s->ninject, host, port, head, len, outlen);
    }
    return NULL;
}

/* A slot's resolver serves only its own sandbox: what comes from anyone else (every slot's
 * resolver address is reachable from every sandbox) is dropped unanswered, so that it cannot
 * land in a neighbour's network log. */
static int dns_client_ok(void *ctx, const struct sockaddr *client, socklen_t len)
{
    struct np_slot *s = ctx;
    int idx = -1;
    return slot_of(s->np, client, len, &idx) && idx == s->index;
}

static json_t *dns_policy(void *ctx, const struct sockaddr *client, socklen_t len)
{
    struct np_slot *s = ctx;
    int idx = -1;
    return slot_of(s->np, client, len, &idx) && idx == s->index ? s->policy : NULL;
}

static void dns_denied(void *ctx, const struct sockaddr *client, socklen_t len, const char *name,
                       uint16_t qtype, const char *reason)
{
    struct np_slot *s = ctx;
    send_event(s->np, s->id, "dns", name, 53, reason);
}

static const struct resolver_hooks np_resolver_hooks = {
    .policy = dns_policy, .client_ok = dns_client_ok, .is_local = is_local, .denied = dns_denied};

/* ---- leaves, from the signer ---- */

static X509 *sign_leaf(void *ctx, const char *host, EVP_PKEY *leaf_pub, time_t *not_after,
                       struct wr_err *err)
{
    struct np *np = ctx;
    if (!np->signer) {
        wr_err_set(err, ENOTCONN, "no signer");
        return NULL;
    }
    X509 *c = signer_client_sign(np->signer, host, leaf_pub, not_after, err);
    if (!c && err->code != EINVAL && !np->signer_gone) {
        /* the signer is gone or stuck: without it no intercepted handshake can succeed, so this
         * process ends and the daemon starts both afresh */
        np->signer_gone = 1;
        log_error(NULL, "egress.signer", "error=\"%s\"", err->msg);
        quit(np, 3);
    }
    return c;
}

/* ---- start-up ---- */

/* The daemon's NETIPC_INIT, waited for at most 10 s. */
static json_t *read_init(struct np *np, int fds[NETIPC_FDS_MAX], int *nfds, struct wr_err *err)
{
    struct pollfd p = {.fd = np->ctl, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1) {
        wr_err_set(err, ETIMEDOUT, "no configuration from the daemon");
        return NULL;
    }
    int type = 0;
    json_t *o = NULL;
    int r = netipc_recv(np->ctl, &type, &o, fds, nfds, np->buf, NETIPC_DOWN_MAX, err);
    if (r <= 0 || type != NETIPC_INIT || !o || *nfds < 1) {
        if (r > 0)
            for (int i = 0; i < *nfds; i++)
                close(fds[i]);
        json_decref(o);
        if (!err->msg[0])
            wr_err_set(err, EPROTO, "the daemon's first message is not its configuration");
        return NULL;
    }
    return o;
}

static int start(struct np *np, const char *user, struct wr_err *err)
{
    int fds[NETIPC_FDS_MAX], nfds = 0;
    json_t *init = read_init(np, fds, &nfds, err);
    if (!init)
        return -1;
    int listen_fd = fds[0], signer_fd = nfds > 1 ? fds[1] : -1;
    int ret = -1;
    const char *up = json_string_value(json_object_get(init, "upstream"));
    const char *ranges = json_string_value(json_object_get(init, "public_ranges"));
    const char *ca_pem = json_string_value(json_object_get(init, "ca_pem"));
    const char *extra_ca = json_string_value(json_object_get(init, "extra_ca"));
    int max_conns = (int)json_integer_value(json_object_get(init, "max_conns"));
    struct confine_ids ids;
    if (!up || !up[0] || gateway_parse_upstream(up, &np->upstream, err) < 0 ||
        addr_ranges_parse(ranges ? ranges : "", &np->extra_public, err) < 0 ||
        confine_lookup_user(user, &ids, err) < 0)
        goto out;
    np->base = event_base_new();
    np->lookup =
        np->base ? lookup_new(np->base, (struct sockaddr *)&np->upstream, sizeof(np->upstream), err)
                 : NULL;
    if (!np->lookup)
        goto out;
    if (!(np->cache = dnscache_new(GATEWAY_SLOTS))) {
        wr_err_set(err, ENOMEM, "the resolvers' cache");
        goto out;
    }
    if (ca_pem && signer_fd >= 0) {
        np->mitm = tlsmitm_new_signed(ca_pem, sign_leaf, np,
                                      extra_ca && extra_ca[0] ? extra_ca : NULL, err);
        if (!np->mitm)
            goto out;
        np->signer = signer_client_new(steal_fd(&signer_fd), tlsmitm_leaf_key(np->mitm), err);
        if (!np->signer)
            goto out;
    }
    /* Everything that needs root or files is open: from here on, neither. */
    if (confine_drop(&ids, err) < 0 || confine_seccomp(CONFINE_NET, err) < 0)
        goto out;
    struct proxy_config pc = {
        .extra_public = &np->extra_public, .mitm = np->mitm, .max_conns = max_conns};
    struct proxy_hooks ph = {.policy = proxy_policy,
                             .original_dst = proxy_original_dst,
                             .is_local = is_local,
                             .denied = proxy_denied,
                             .allowed = proxy_allowed,
                             .rewrite_head = proxy_rewrite_head};
    np->proxy = proxy_new(np->base, steal_fd(&listen_fd), np->lookup, &pc, &ph, np, err);
    if (!np->proxy)
        goto out;
    np->ev_ctl = event_new(np->base, np->ctl, EV_READ | EV_PERSIST, on_ctl, np);
    np->ev_pending = event_new(np->base, -1, 0, run_pending, np);
    np->ev_stats = event_new(np->base, -1, EV_PERSIST, on_stats, np);
    struct timeval tv = {.tv_sec = NETPROC_STATS_MS / 1000,
                         .tv_usec = (NETPROC_STATS_MS % 1000) * 1000};
    if (!np->ev_ctl || !np->ev_pending || !np->ev_stats || event_add(np->ev_ctl, NULL) < 0 ||
        event_add(np->ev_stats, &tv) < 0) {
        wr_err_set(err, ENOMEM, "events");
        goto out;
    }
    ret = 0;
out:
    if (listen_fd >= 0)
        close(listen_fd);
    if (signer_fd >= 0)
        close(signer_fd);
    json_decref(init);
    return ret;
}

static void stop(struct np *np)
{
    for (int i = 0; np->slots && i < GATEWAY_SLOTS; i++) {
        struct np_slot *s = &np->slots[i];
        if (s->resolver)
            resolver_free(s->resolver);
        if (s->dns_fd >= 0)
            close(s->dns_fd);
        slot_clear_state(s);
    }
    if (np->ev_ctl)
        event_free(np->ev_ctl);
    if (np->ev_pending)
        event_free(np->ev_pending);
    if (np->ev_stats)
        event_free(np->ev_stats);
    proxy_free(np->proxy);
    tlsmitm_free(np->mitm);
    signer_client_free(np->signer);
    lookup_free(np->lookup);
    dnscache_free(np->cache);
    if (np->base)
        event_base_free(np->base);
    free(np->slots);
    free(np->queue);
    free(np->buf);
}

int netproc_main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        _exit(1); /* the daemon is already gone */
    static struct np np;
    np.ctl = NETPROC_CTL_FD;
    np.buf = xmalloc(NETIPC_DOWN_MAX + 1);
    np.slots = xcalloc(GATEWAY_SLOTS, sizeof(*np.slots));
    np.queue = xcalloc(GATEWAY_SLOTS, sizeof(*np.queue));
    for (int i = 0; i < GATEWAY_SLOTS; i++) {
        np.slots[i].np = &np;
        np.slots[i].index = i;
        np.slots[i].dns_fd = -1;
    }
    struct wr_err err = {0};
    if (start(&np, argc > 1 ? argv[1] : NETPROC_USER, &err) < 0) {
        log_error(NULL, "egress.start_failed", "error=\"%s\"", err.msg);
        stop(&np);
        _exit(2);
    }
    send_up(&np, NETIPC_READY, json_object());
    event_base_dispatch(np.base);
    stop(&np);
    /* _exit: nothing of the daemon's (atexit handlers, buffered stdio) is this process's to run */
    _exit(np.exit_status);
}

/* ---- the signer ---- */

static void *read_pem_fd(int fd, int is_key)
{
    BIO *b = BIO_new_fd(fd, BIO_CLOSE);
    if (!b) {
        close(fd);
        return NULL;
    }
    void *v = is_key ? (void *)PEM_read_bio_PrivateKey(b, NULL, NULL, NULL)
                     : (void *)PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    return v;
}

int signerproc_main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        _exit(1);
    struct wr_err err = {0};
    struct confine_ids ids;
    EVP_PKEY *key = read_pem_fd(NETPROC_SIGNER_KEY_FD, 1);
    X509 *ca = read_pem_fd(NETPROC_SIGNER_CERT_FD, 0);
    int r = -1;
    if (!key || !ca || X509_check_private_key(ca, key) != 1)
        wr_err_set(&err, EINVAL, "the CA's certificate and key do not load or do not match");
    else if (confine_lookup_user(argc > 1 ? argv[1] : NETPROC_USER, &ids, &err) == 0 &&
             confine_drop(&ids, &err) == 0 && confine_seccomp(CONFINE_SIGNER, &err) == 0)
        r = signer_serve(NETPROC_SIGNER_SOCK_FD, ca, key, &err);
    if (r < 0)
        log_error(NULL, "signer.stopped", "error=\"%s\"", err.msg);
    EVP_PKEY_free(key);
    X509_free(ca);
    _exit(r < 0 ? 2 : 0);
}
