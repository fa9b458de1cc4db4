/*
 * The resolvers' answer cache (net/dnscache.h) on a clock the test moves: a stored answer is read
 * back with its TTL counting down and is gone once it runs out; TTLs are capped and floored;
 * NXDOMAIN and "no address" are kept briefly; a newer answer replaces an older one; a flood of
 * random names (what a sandbox allowed a wildcard can send) holds at most the owner's share and
 * leaves other owners' names alone; many owners' floods hold at most DNSCACHE_MAX in all, in
 * memory fixed at dnscache_new; a disowned sandbox's names stay but count against no one.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "net/dnscache.h"
#include "tap.h"

#define OWNERS 64

static struct dns_addr v4(const char *ip)
{
    struct dns_addr a = {.family = AF_INET};
    inet_pton(AF_INET, ip, a.addr);
    return a;
}

static int has_v4(const struct dnscache_answer *a, size_t i, const char *ip)
{
    struct dns_addr want = v4(ip);
    return i < a->n && a->addrs[i].family == AF_INET && memcmp(a->addrs[i].addr, want.addr, 4) == 0;
}

static void hits_and_ttl(struct dnscache *c)
{
    struct dnscache_answer a;
    uint64_t t = 1000000;
    ok(!dnscache_get(c, "pypi.org", t, &a), "an empty cache has nothing for pypi.org");
    struct dns_addr two[] = {v4("198.18.0.10"), v4("198.18.0.11")};
    dnscache_put(c, 1, "pypi.org", DNSCACHE_ADDRS, two, 2, 30, t);
    ok(dnscache_get(c, "pypi.org", t, &a) && a.kind == DNSCACHE_ADDRS && a.n == 2 &&
           has_v4(&a, 0, "198.18.0.10") && has_v4(&a, 1, "198.18.0.11"),
       "a stored answer is read back, its addresses in order (%zu)", a.n);
    ok(a.ttl == 30, "with the upstream's TTL, 30 (%u)", a.ttl);
    ok(dnscache_get(c, "pypi.org", t + 10000, &a) && a.ttl == 20,
       "10 s later its TTL has counted down to 20 (%u)", a.ttl);
    ok(dnscache_get(c, "pypi.org", t + 29500, &a) && a.ttl == 1,
       "with 0.5 s left it says 1, never 0 (%u)", a.ttl);
    ok(!dnscache_get(c, "pypi.org", t + 30000, &a), "at 30 s it is gone");
    ok(!dnscache_get(c, "pypi.org", t, &a), "and stays gone (an expired entry is dropped)");

    dnscache_put(c, 1, "big.test", DNSCACHE_ADDRS, two, 1, 86400, t);
    ok(dnscache_get(c, "big.test", t, &a) && a.ttl == DNSCACHE_TTL_MAX,
       "a TTL of a day is capped at %d s (%u)", DNSCACHE_TTL_MAX, a.ttl);
    ok(!dnscache_get(c, "big.test", t + DNSCACHE_TTL_MAX * 1000, &a), "and expires then");
    dnscache_put(c, 1, "zero.test", DNSCACHE_ADDRS, two, 1, 0, t);
    ok(dnscache_get(c, "zero.test", t, &a) && a.ttl == DNSCACHE_TTL_MIN,
       "a TTL of 0 is floored at %d s (%u), so a burst shares one answer", DNSCACHE_TTL_MIN, a.ttl);

    dnscache_put(c, 1, "gone.test", DNSCACHE_NXDOMAIN, NULL, 0, 3600, t);
    ok(dnscache_get(c, "gone.test", t, &a) && a.kind == DNSCACHE_NXDOMAIN && a.n == 0,
       "an NXDOMAIN is kept");
    ok(a.ttl == DNSCACHE_NEG_TTL && !dnscache_get(c, "gone.test", t + DNSCACHE_NEG_TTL * 1000, &a),
       "briefly: %d s, whatever the TTL given", DNSCACHE_NEG_TTL);
    dnscache_put(c, 1, "v6only.test", DNSCACHE_NODATA, NULL, 0, 600, t);
    ok(dnscache_get(c, "v6only.test", t, &a) && a.kind == DNSCACHE_NODATA && a.n == 0 &&
           a.ttl == DNSCACHE_NEG_TTL,
       "so is a name without an A record");

    struct dns_addr six = {.family = AF_INET6};
    dnscache_put(c, 1, "six.test", DNSCACHE_ADDRS, &six, 1, 60, t);
    ok(!dnscache_get(c, "six.test", t, &a), "an answer with no IPv4 address is not stored");

    dnscache_put(c, 1, "moved.test", DNSCACHE_ADDRS, two, 1, 60, t);
    dnscache_put(c, 2, "moved.test", DNSCACHE_ADDRS, two + 1, 1, 60, t + 1000);
    ok(dnscache_get(c, "moved.test", t + 1000, &a) && a.n == 1 && has_v4(&a, 0, "198.18.0.11") &&
           a.ttl == 60,
       "a newer answer replaces the older one");

    struct dns_addr many[40];
    char ip[32];
    for (int i = 0; i < 40; i++) {
        snprintf(ip, sizeof(ip), "198.18.1.%d", i + 1);
        many[i] = v4(ip);
    }
    dnscache_put(c, 1, "many.test", DNSCACHE_ADDRS, many, 40, 60, t);
    ok(dnscache_get(c, "many.test", t, &a) && a.n == DNSCACHE_ADDRS_MAX &&
           has_v4(&a, DNSCACHE_ADDRS_MAX - 1, "198.18.1.16"),
       "of 40 addresses the first %d are kept (%zu)", DNSCACHE_ADDRS_MAX, a.n);

    char longname[DNS_NAME_MAX + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    dnscache_put(c, 1, longname, DNSCACHE_ADDRS, two, 1, 60, t);
    dnscache_put(c, OWNERS, "stranger.test", DNSCACHE_ADDRS, two, 1, 60, t);
    ok(!dnscache_get(c, longname, t, &a) && !dnscache_get(c, "stranger.test", t, &a),
       "a name too long and an owner out of range store nothing");
}

/* Owner 3 asks for 20,000 random names: it holds its share at most, owner 4's names stay. */
static void flood(struct dnscache *c)
{
    struct dnscache_answer a;
    struct dnscache_stats s0;
    dnscache_stats(c, &s0);
    uint64_t t = 5000000;
    struct dns_addr one = v4("198.18.0.20");
    for (int i = 0; i < 10; i++) {
        char name[64];
        snprintf(name, sizeof(name), "keep%d.neighbour.test", i);
        dnscache_put(c, 4, name, DNSCACHE_ADDRS, &one, 1, 300, t);
    }
    unsigned x = 12345;
    for (int i = 0; i < 20000; i++) {
        char name[64];
        x = x * 1103515245u + 12345u;
        snprintf(name, sizeof(name), "r%08x%d.flood.test", x, i);
        dnscache_put(c, 3, name, DNSCACHE_ADDRS, &one, 1, 300, t + (uint64_t)i);
    }
    struct dnscache_stats s1;
    dnscache_stats(c, &s1);
    ok(dnscache_owner_entries(c, 3) == DNSCACHE_OWNER_MAX,
       "a flood of 20000 random names holds its owner's share, %d (%u)", DNSCACHE_OWNER_MAX,
       dnscache_owner_entries(c, 3));
    ok(s1.owner_evicted - s0.owner_evicted == 20000 - DNSCACHE_OWNER_MAX,
       "each name past the share evicted one of the flood's own (%llu)",
       (unsigned long long)(s1.owner_evicted - s0.owner_evicted));
    int kept = 0;
    for (int i = 0; i < 10; i++) {
        char name[64];
        snprintf(name, sizeof(name), "keep%d.neighbour.test", i);
        kept += dnscache_get(c, name, t + 30000, &a);
    }
    ok(kept == 10, "the neighbour's 10 names are all still there (%d)", kept);
    ok(s1.bytes == s0.bytes, "the memory held did not change (%zu bytes)", s1.bytes);

    /* Every owner floods: the whole stays within DNSCACHE_MAX, the oldest going first. */
    for (unsigned o = 0; o < OWNERS; o++)
        for (int i = 0; i < 200; i++) {
            char name[64];
            snprintf(name, sizeof(name), "o%u-%d.flood.test", o, i);
            dnscache_put(c, o, name, DNSCACHE_ADDRS, &one, 1, 300, t + 40000 + o * 1000 + i);
        }
    dnscache_stats(c, &s1);
    ok(s1.entries == DNSCACHE_MAX, "%u owners' floods hold %d names in all (%u)", OWNERS,
       DNSCACHE_MAX, s1.entries);
    ok(s1.evicted > s0.evicted, "evicting the least recently used");
    char last[64];
    snprintf(last, sizeof(last), "o%u-%d.flood.test", OWNERS - 1, 199);
    ok(dnscache_get(c, last, t + 200000, &a), "the newest name is there");
    ok(!dnscache_get(c, "o0-0.flood.test", t + 200000, &a), "the oldest is not");
    ok(s1.bytes == s0.bytes && s1.bytes < 4u << 20, "memory is what dnscache_new took: %zu bytes",
       s1.bytes);
}

static void disown(void)
{
    struct dnscache *c = dnscache_new(OWNERS);
    struct dnscache_answer a;
    struct dns_addr one = v4("198.18.0.30");
    for (int i = 0; i < DNSCACHE_OWNER_MAX; i++) {
        char name[64];
        snprintf(name, sizeof(name), "n%d.test", i);
        dnscache_put(c, 7, name, DNSCACHE_ADDRS, &one, 1, 300, 1000);
    }
    dnscache_disown(c, 7);
    ok(dnscache_owner_entries(c, 7) == 0, "a disowned slot holds nothing against its share");
    ok(dnscache_get(c, "n0.test", 1000, &a), "but its names are still served");
    dnscache_put(c, 7, "next.test", DNSCACHE_ADDRS, &one, 1, 300, 2000);
    ok(dnscache_get(c, "n1.test", 2000, &a) && dnscache_owner_entries(c, 7) == 1,
       "and the slot's next sandbox evicts none of them for its first name");
    dnscache_free(c);
}

int main(void)
{
    struct dnscache *c = dnscache_new(OWNERS);
    ok(c != NULL, "dnscache_new");
    hits_and_ttl(c);
    flood(c);
    dnscache_free(c);
    disown();
    dnscache_free(NULL);
    return tap_done();
}
