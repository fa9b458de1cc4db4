/*
 * The sandboxes' DNS resolver: the only name service a sandbox has. The gateway binds one UDP
 * socket per sandbox gateway address and hands it here. Lookups are a leak channel, so the
 * resolver answers only names the asking sandbox's policy allows, never forwards a sandbox's
 * bytes (it writes its own query upstream and its own reply back), serves only A records (other
 * types get an empty answer without asking upstream, so no HTTPS/SVCB record can carry ECH keys
 * past the proxy; AAAA too, since sandboxes have no IPv6), and hands out only addresses the
 * egress proxy would dial (addr_dialable: public, and not the host's own).
 *
 * An allowed A question is answered from a cache of the upstream's answers when one is set
 * (resolver_set_cache; net/dnscache.h: TTLs honoured and counting down, NXDOMAIN kept briefly,
 * bounded), shared by the resolvers of a gateway. The policy is checked before the cache is
 * looked at, and the addresses filtered each time, so a cached answer never reaches a sandbox
 * whose policy refuses the name, and a refusal is never cached.
 *
 * One resolver runs on one event_base and is used from that base's thread only. Memory is fixed
 * at resolver_new: a table of RESOLVER_PENDING_MAX upstream queries with their timers, and the
 * datagram buffers; a query costs a slot in that table and nothing else.
 */
#ifndef WR_NET_RESOLVER_H
#define WR_NET_RESOLVER_H

#include <event2/event.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/err.h"
#include "net/addr.h"
#include "net/dnscache.h"

/* Upstream queries in flight per resolver; one more gets SERVFAIL at once. A sandbox's resolver
 * needs a handful; the bound keeps one looping sandbox from holding unbounded state. */
#define RESOLVER_PENDING_MAX 256
/* An upstream query is sent again after this long without an answer, once. */
#define RESOLVER_RETRY_MS 1000
/* And given up (SERVFAIL to the client) this long after the first send. */
#define RESOLVER_TIMEOUT_MS 2000
/* The TTL we hand out is the upstream's smallest (what is left of it, from the cache), capped
 * here, so that a policy change or a changed address reaches a sandbox's stub cache quickly. */
#define RESOLVER_TTL_MAX 60

/** What the resolver asks of whoever owns it; called on the loop's thread. */
struct resolver_hooks {
    /**
     * The egress policy (normalised, as netpolicy_parse returns it) of the sandbox at client, or
     * NULL for an unknown client (its lookups are refused). Borrowed: it must stay valid until
     * the call returns; the resolver keeps no reference.
     */
    json_t *(*policy)(void *ctx, const struct sockaddr *client, socklen_t len);
    /**
     * Whether client is one this resolver serves at all (may be NULL: every client is). A
     * datagram from any other is dropped before it is parsed: no answer, no call to denied
     * (whoever owns the resolver must not be charged with a stranger's lookups), counted in
     * foreign.
     */
    int (*client_ok)(void *ctx, const struct sockaddr *client, socklen_t len);
    /**
     * Whether addr is one of the host's own addresses (may be NULL: none is): the proxy's own
     * hook, so that both apply addr_dialable alike.
     */
    addr_local_fn is_local;
    /**
     * A lookup was refused (may be NULL): name is the lower-case name asked ("" for the root),
     * reason one of "unknown_client", "not_allowed", "private_address" (every address the
     * upstream gave is one the proxy would not dial). All pointers are valid only for the call.
     */
    void (*denied)(void *ctx, const struct sockaddr *client, socklen_t len, const char *name,
                   uint16_t qtype, const char *reason);
};

/** Counters since resolver_new, for the network log and the tests. */
struct resolver_stats {
    uint64_t queries;           /* datagrams read from clients (dropped ones included) */
    uint64_t dropped;           /* not answered: unparseable, a response, or over the size */
    uint64_t foreign;           /* not answered: from a client the resolver does not serve */
    uint64_t refused;           /* answered REFUSED (the denied hook was called) */
    uint64_t nodata;            /* answered empty without asking upstream (not A) */
    uint64_t cache_hits;        /* allowed A questions answered from the cache */
    uint64_t upstream_sent;     /* datagrams sent upstream, retries included */
    uint64_t upstream_retries;  /* of which second tries */
    uint64_t upstream_timeouts; /* queries given up for want of an answer */
    uint64_t servfail;          /* answered SERVFAIL, for any reason */
    uint64_t overflow;          /* of which for want of a free pending slot */
    unsigned pending;           /* upstream queries in flight now */
    unsigned pending_max;       /* the most ever in flight at once */
};

struct resolver;

/**
 * Starts serving DNS on udp_fd, an already bound UDP socket, on base. Takes ownership of udp_fd
 * (closed by resolver_free, or here on failure) and makes it non-blocking. upstream (upstream_len
 * bytes, AF_INET or AF_INET6) is where the resolver's own queries go, from one unconnected socket
 * of its own; replies from any other address are ignored. extra: ranges that count as public
 * (copied; NULL for none). hooks is copied, hooks->policy is required; ctx is passed to the hooks.
 * Returns the resolver (free with resolver_free), or NULL with err set.
 */
struct resolver *resolver_new(struct event_base *base, int udp_fd, const struct sockaddr *upstream,
                              socklen_t upstream_len, const struct addr_ranges *extra,
                              const struct resolver_hooks *hooks, void *ctx, struct wr_err *err);

/**
 * Stops serving and frees r: closes both sockets and drops the queries in flight without
 * answering them. Call on the loop's thread (or with the loop stopped). NULL is a no-op.
 */
void resolver_free(struct resolver *r);

/**
 * Answers r's allowed A questions from cache when it has the name, and stores the upstream's
 * answers there (addresses, "no address", NXDOMAIN; never SERVFAIL, a timeout or a refusal),
 * as owner's (a dnscache owner: the sandbox's slot). cache is borrowed: it must outlive r, or be
 * unset first (NULL). Call on the loop's thread.
 */
void resolver_set_cache(struct resolver *r, struct dnscache *cache, unsigned owner);

/** Copies r's counters into out. Call on the loop's thread (or with the loop stopped). */
void resolver_stats(const struct resolver *r, struct resolver_stats *out);

#endif
