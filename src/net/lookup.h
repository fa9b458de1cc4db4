/*
 * The egress proxy's own DNS client. Names are pinned: the proxy never dials the address a
 * sandbox dialed, it resolves the name the sandbox asked for (the Host or the SNI) itself, from
 * the daemon's configured upstream, and dials only what came back. This is that resolver: A
 * records only, since the proxy dials IPv4 (a sandbox has no IPv6 route out), asked over one
 * unconnected UDP socket of its own, with a small cache so that a burst of connections to one
 * host costs one query, and one query shared by every lookup of a name already in flight.
 *
 * One lookup runs on one event_base and is used from that base's thread only. Callbacks are
 * never called from inside lookup_start (a cache hit, an invalid name or a full table answers on
 * the next turn of the loop), so a caller may start a lookup while holding state it has not
 * finished setting up.
 */
#ifndef WR_NET_LOOKUP_H
#define WR_NET_LOOKUP_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/err.h"
#include "net/dnsmsg.h"

/* Distinct names asked upstream at once; a lookup of one more fails at once with "busy". The
 * proxy asks one name per connection that got past the policy, and most share a few names. */
#define LOOKUP_PENDING_MAX 1024
/* Names remembered; past it the least recently used one goes. */
#define LOOKUP_CACHE_MAX 1024
/* Addresses kept per name: more than the proxy will ever try in one connect window. */
#define LOOKUP_ADDRS_MAX 8
/* A query is sent again after this long without an answer, once ... */
#define LOOKUP_RETRY_MS 1000
/* ... and given up ("timeout") this long after the first send. */
#define LOOKUP_TIMEOUT_MS 2000
/* A cached answer lives for the upstream's smallest TTL, capped here (so a changed address is
 * picked up quickly) and at least LOOKUP_TTL_MIN (so a TTL of 0 still shares one answer among a
 * burst of connections). */
#define LOOKUP_TTL_MAX 60
#define LOOKUP_TTL_MIN 1

/**
 * A lookup's result. rc 0: addrs[0..n) are the name's IPv4 addresses (n >= 1, AF_INET, in the
 * upstream's order) and why is "ok". rc -1: n is 0 and why says why: "nxdomain" (no such name),
 * "no_address" (the name has no A record), "timeout" (no answer in LOOKUP_TIMEOUT_MS),
 * "upstream_error" (SERVFAIL or another rcode, a malformed or truncated answer), "busy"
 * (LOOKUP_PENDING_MAX names in flight), "bad_name" (not a host name). addrs and why are valid
 * only for the call. The request's handle is gone once it is called.
 */
typedef void (*lookup_cb)(void *arg, int rc, const struct dns_addr *addrs, size_t n,
                          const char *why);

struct lookup;
struct lookup_req;

/** Counters since lookup_new, for the tests and the daemon's status. */
struct lookup_stats {
    uint64_t started;    /* lookup_start calls */
    uint64_t cache_hits; /* answered from the cache */
    uint64_t shared;     /* joined a query already in flight for the name */
    uint64_t sent;       /* datagrams sent upstream, retries included */
    uint64_t retries;    /* of which second tries */
    uint64_t timeouts;   /* queries given up for want of an answer */
    uint64_t busy;       /* failed at once for want of a free query slot */
    unsigned pending;    /* names asked upstream now */
    unsigned cached;     /* names in the cache (expired ones included until replaced) */
};

/**
 * Makes a DNS client on base that asks upstream (upstream_len bytes, AF_INET or AF_INET6) from a
 * UDP socket of its own; answers from any other address are ignored. Memory is fixed here: the
 * query table with its timers and the cache (about 0.5 MiB). Returns it (free with
 * lookup_free), or NULL with err set.
 */
struct lookup *lookup_new(struct event_base *base, const struct sockaddr *upstream,
                          socklen_t upstream_len, struct wr_err *err);

/**
 * Frees l: closes its socket and drops every request without calling its callback (their handles
 * become invalid). Not from inside a callback. NULL is a no-op.
 */
void lookup_free(struct lookup *l);

/**
 * Looks up the A records of name (a host name; case and a trailing dot do not matter). cb is
 * called exactly once with arg, on a later turn of the loop, unless the request is cancelled
 * first. Returns the request's handle, valid until cb is called or lookup_cancel; NULL only if
 * memory ran out (cb is then never called).
 */
struct lookup_req *lookup_start(struct lookup *l, const char *name, lookup_cb cb, void *arg);

/**
 * Cancels a request: its callback is never called and the handle is gone. The query upstream
 * goes on for the other requests of the name (and fills the cache). NULL is a no-op; a handle
 * whose callback has been called must not be passed.
 */
void lookup_cancel(struct lookup_req *req);

/**
 * Tests: a query is asked again after retry_ms and given up timeout_ms after it was first sent
 * (0 < retry_ms < timeout_ms), instead of LOOKUP_RETRY_MS and LOOKUP_TIMEOUT_MS, for queries sent
 * from now on.
 */
void lookup_set_timeouts(struct lookup *l, int retry_ms, int timeout_ms);

/** Copies l's counters into out. */
void lookup_stats(const struct lookup *l, struct lookup_stats *out /* OUT */);

#endif
