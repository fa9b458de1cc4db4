/*
 * Which addresses the egress proxy may dial. The proxy dials only what it resolved itself, and
 * only if it is public: never loopback, private, link-local (the metadata service at
 * 169.254.169.254), shared, documentation, benchmarking, multicast or reserved space, in IPv4 or
 * in the IPv6 forms that carry an IPv4 address (mapped, NAT64, 6to4), nor any cloud's host
 * endpoints, some of which are public addresses (Azure's WireServer 168.63.129.16, IBM's service
 * network). Tests build their fake internet out of private ranges, so the daemon can be told (off
 * by default) that a few ranges count as public; those are checked first, after the clouds'
 * endpoints, which no range makes public.
 *
 * Also here: recognising address literals in every spelling the C library turns into an address
 * ("127.1", "0x7f000001", "2130706433", "017700000001", "[::1]"), so that a host that is really an
 * address is never taken for a name.
 */
#ifndef WR_NET_ADDR_H
#define WR_NET_ADDR_H

#include <stdint.h>
#include <sys/socket.h>

#include "common/err.h"

/* Extra "public" ranges: a handful for tests, not a routing table. */
#define ADDR_RANGES_MAX 16
/* The text of one range ("ffff:...:ffff/128" is 43 bytes). */
#define ADDR_RANGE_TEXT_MAX 64

/** One CIDR range; addr holds 4 (AF_INET) or 16 (AF_INET6) bytes, host bits zero. */
struct addr_range {
    int family;
    uint8_t addr[16];
    unsigned prefix;
};

/** A small fixed list of ranges; no allocation, copy it freely. */
struct addr_ranges {
    unsigned n;
    struct addr_range r[ADDR_RANGES_MAX];
};

/**
 * Parses a comma-separated list of CIDR ranges ("198.18.0.0/24,fd00:1::/64"; spaces around
 * entries allowed, a bare address is a /32 or /128) into out. NULL or "" gives no ranges.
 * Addresses are strict (dotted quad or inet_pton IPv6), host bits must be zero, and /0 is
 * refused (it would make the metadata service public). Returns 0, or -1 with err set
 * (WR_E_INVALID) naming the entry; out is then empty.
 */
int addr_ranges_parse(const char *csv, struct addr_ranges *out, struct wr_err *err);

/** Whether sa (AF_INET or AF_INET6) falls in one of ranges (NULL: none). */
int addr_in_ranges(const struct sockaddr *sa, const struct addr_ranges *ranges);

/**
 * Whether the proxy may dial sa: 0 for a cloud's host endpoint (metadata services, Azure's
 * WireServer, ...); else 1 if it is in extra (NULL: none) or globally routable; else 0 (also for
 * NULL and families other than AF_INET and AF_INET6). IPv4-mapped, NAT64 (64:ff9b::/96) and 6to4
 * (2002::/16) addresses are judged by the IPv4 address they carry.
 */
int addr_is_public(const struct sockaddr *sa, const struct addr_ranges *extra);

/** Whether addr (len bytes) is one of this host's own addresses; ctx is the caller's. */
typedef int (*addr_local_fn)(void *ctx, const struct sockaddr *addr, socklen_t len);

/**
 * Whether the egress proxy dials sa (len bytes): an IPv4 address (sandboxes have no IPv6 and the
 * proxy dials IPv4 only), public by addr_is_public with extra, and not one of this host's own
 * addresses (is_local(ctx, ...); NULL: none is). The one test for both the proxy, on what it
 * resolved, and the sandboxes' resolver, on what it hands out: a sandbox is told only of
 * addresses it could be let through to.
 */
int addr_dialable(const struct sockaddr *sa, socklen_t len, const struct addr_ranges *extra,
                  addr_local_fn is_local, void *ctx);

/**
 * Recognises an address literal: every form inet_aton accepts for IPv4 (one to four parts,
 * decimal, octal or hex: "127.1", "0x7f000001", "2130706433", "017700000001"), and IPv6 as
 * inet_pton takes it, bare or in brackets ("::1", "[::1]"; a "%zone" suffix is recognised and
 * dropped). Fills out (port 0) and returns AF_INET or AF_INET6; returns 0 for anything else
 * (out zeroed), including NULL.
 */
int addr_parse_literal(const char *host, struct sockaddr_storage *out);

/** Whether a and b are the same address and port (AF_INET or AF_INET6; 0 for others): where a
 * DNS answer must come from. */
int addr_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b);

#endif
