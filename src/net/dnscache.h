/*
 * The sandboxes' resolvers' cache of upstream answers. A sandbox's lookup of an allowed name
 * used to cost an upstream round trip every time (10 ms p50 from inside a sandbox, bench/
 * egress.py); a cached answer costs the resolver's own work. What is cached is what the
 * upstream said about a name's A records (its addresses, "no address" or NXDOMAIN), never a
 * decision about a sandbox: the resolver checks the asking sandbox's policy before it looks
 * here, and filters the addresses (addr_dialable) each time it answers from here, so one cache
 * serves every sandbox of a gateway. Refusals, SERVFAIL and timeouts are not cached. What sharing
 * does let a sandbox learn is whether a name its policy allows was asked recently by anyone (a
 * fast answer): the upstream resolver's own cache, shared by every sandbox and the host, and the
 * proxy's lookup cache tell the same already, a little less precisely.
 *
 * Entries live for the upstream's TTL, capped at DNSCACHE_TTL_MAX and floored at
 * DNSCACHE_TTL_MIN (so that a TTL of 0 still shares one answer among a burst); a negative answer
 * for DNSCACHE_NEG_TTL. The TTL read back counts down: what a sandbox is told is what is left.
 *
 * Bounded, because a sandbox allowed a wildcard can ask for as many random names as it likes:
 * memory is fixed at dnscache_new (DNSCACHE_MAX entries and their index); past it the least
 * recently used entry goes. One owner (a sandbox's slot) holds at most DNSCACHE_OWNER_MAX of the
 * entries it filled, its own least recently used going first, so a flood from one sandbox evicts
 * its own names and leaves its neighbours' alone.
 *
 * Pure: no sockets, no clock (the caller passes the monotonic time in ms), no allocation after
 * dnscache_new. Used from one thread.
 */
#ifndef WR_NET_DNSCACHE_H
#define WR_NET_DNSCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "net/dnsmsg.h"

#define DNSCACHE_MAX 4096                     /* names held, in all */
#define DNSCACHE_OWNER_MAX (DNSCACHE_MAX / 8) /* names one owner's lookups may hold */
#define DNSCACHE_ADDRS_MAX 16                 /* IPv4 addresses kept per name */
#define DNSCACHE_TTL_MAX 300                  /* seconds an answer is kept at most ... */
#define DNSCACHE_TTL_MIN 5                    /* ... and at least */
#define DNSCACHE_NEG_TTL 5                    /* seconds an NXDOMAIN or "no address" is kept */

enum dnscache_kind {
    DNSCACHE_ADDRS = 1, /* NOERROR with addresses */
    DNSCACHE_NODATA,    /* NOERROR, no A record */
    DNSCACHE_NXDOMAIN,  /* no such name */
};

/** A cached answer as read back. */
struct dnscache_answer {
    enum dnscache_kind kind;
    size_t n;                                  /* addresses, for DNSCACHE_ADDRS */
    struct dns_addr addrs[DNSCACHE_ADDRS_MAX]; /* AF_INET, in the upstream's order */
    uint32_t ttl;                              /* seconds left, at least 1 */
};

/** Counters since dnscache_new. */
struct dnscache_stats {
    uint64_t hits, misses;  /* dnscache_get that found a live entry, and that did not */
    uint64_t stored;        /* dnscache_put calls that stored */
    uint64_t evicted;       /* live entries dropped for room (expired ones are not counted) */
    uint64_t owner_evicted; /* of which for the owner's own share */
    unsigned entries;       /* names held now (expired ones included until reused) */
    size_t bytes;           /* memory held, fixed at dnscache_new */
};

struct dnscache;

/**
 * Makes a cache for owners 0 .. owners-1 (a gateway's slots). Returns NULL if memory ran out.
 */
struct dnscache *dnscache_new(unsigned owners);

void dnscache_free(struct dnscache *c);

/**
 * The live answer for name (lower case, no trailing dot, as dnsmsg_parse_query gives it) into
 * out, its ttl what is left of it at now_ms (monotonic). Returns 1 if found, else 0 (an expired
 * entry is dropped).
 */
int dnscache_get(struct dnscache *c, const char *name, uint64_t now_ms,
                 struct dnscache_answer *out /* OUT */);

/**
 * Stores the upstream's answer for name, asked for owner (< owners): kind, addrs[0..n) for
 * DNSCACHE_ADDRS (AF_INET ones kept, at most DNSCACHE_ADDRS_MAX; none left stores nothing) and
 * the answer's smallest TTL in seconds. Replaces an entry for the same name. Ignores names longer
 * than DNS_NAME_MAX and owners out of range.
 */
void dnscache_put(struct dnscache *c, unsigned owner, const char *name, enum dnscache_kind kind,
                  const struct dns_addr *addrs, size_t n, uint32_t ttl, uint64_t now_ms);

/**
 * Owner's sandbox is gone: the entries it filled stay (they are the upstream's answers, good for
 * anyone) but count against no owner's share, so the slot's next sandbox starts with all of its.
 */
void dnscache_disown(struct dnscache *c, unsigned owner);

/** Names owner's lookups hold now. */
unsigned dnscache_owner_entries(const struct dnscache *c, unsigned owner);

void dnscache_stats(const struct dnscache *c, struct dnscache_stats *out /* OUT */);

#endif
