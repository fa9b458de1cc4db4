/*
 * Public or not, and address literals: see addr.h. The tables below follow IANA's special-purpose
 * address registries; IPv6 is judged by what is allocated (global unicast is 2000::/3, nothing
 * else is routable) rather than by a list of exceptions that grows.
 */
#include "net/addr.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An IPv6 literal in text, with room for a zone and brackets; longer is not a literal. */
#define LITERAL_MAX 128

struct block {
    uint8_t addr[16];
    unsigned prefix;
};

/*
 * Clouds' host endpoints: where a VM reaches its own provider (metadata with the VM's
 * credentials, the host agent's goal state). Never public, not even inside an extra range:
 * an operator's test range must not open one. Most also lie in a block below; the ones
 * that do not (Azure's, IBM's) are why this list exists.
 */
static const struct block v4_cloud[] = {
    {{169, 254, 169, 254}, 32}, /* instance metadata: AWS, GCP, Azure, Oracle, OpenStack, DO,
                                   Hetzner, Linode, Vultr, Exoscale, IBM VPC, Huawei */
    {{169, 254, 170, 2}, 32},   /* AWS ECS task metadata and credentials */
    {{169, 254, 170, 23}, 32},  /* AWS EKS Pod Identity agent */
    {{169, 254, 169, 253}, 32}, /* AWS VPC DNS (Route 53 Resolver) */
    {{169, 254, 169, 123}, 32}, /* AWS Time Sync */
    {{169, 254, 0, 23}, 32},    /* Tencent Cloud metadata */
    {{169, 254, 42, 42}, 32},   /* Scaleway metadata */
    {{168, 63, 129, 16}, 32},   /* Azure WireServer: host agent, goal state and certificates,
                                   DNS, DHCP; a public address routed to the VM's host node */
    {{100, 100, 100, 200}, 32}, /* Alibaba Cloud metadata (inside 100.64.0.0/10) */
    {{192, 0, 0, 192}, 32},     /* Oracle Cloud Classic metadata (inside 192.0.0.0/24) */
    {{161, 26, 0, 0}, 16},      /* IBM Cloud service network (its DNS, NTP, mirrors): IBM's
                                   public allocation, routed only on its private backbone */
    {{166, 8, 0, 0}, 14},       /* IBM Cloud private service endpoints (likewise) */
};

/* The IPv6 ones; all in fc00::/7, which is refused anyway, and listed to say whose. */
static const struct block v6_cloud[] = {
    {{0xfd, 0x00, 0x0e, 0xc2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x54}, 128}, /* AWS IMDS */
    {{0xfd, 0x00, 0x0e, 0xc2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x23}, 128}, /* AWS ECS/EKS */
    {{0xfd, 0x00, 0x0e, 0xc2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x53}, 128}, /* AWS DNS */
    {{0xfd, 0x20, 0x00, 0xce, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x54}, 128}, /* GCP metadata */
    {{0xfd, 0x00, 0x00, 0xc1, 0, 0, 0, 0, 0, 0, 0, 0, 0xa9, 0xfe, 0xa9, 0xfe}, 128}, /* Oracle */
    {{0xfd, 0x00, 0xa9, 0xfe, 0xa9, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01}, 128},    /* Linode */
    {{0xfd, 0x00, 0x00, 0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42}, 128},          /* Scaleway */
    {{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa9, 0xfe, 0xa9, 0xfe}, 128},       /* OpenStack */
};

/* IPv4 space that is not globally routable (IANA's IPv4 special-purpose registry). */
static const struct block v4_private[] = {
    {{0, 0, 0, 0}, 8},       /* "this network" */
    {{10, 0, 0, 0}, 8},      /* private */
    {{100, 64, 0, 0}, 10},   /* shared address space (carrier-grade NAT; Alibaba's metadata) */
    {{127, 0, 0, 0}, 8},     /* loopback */
    {{169, 254, 0, 0}, 16},  /* link-local: every cloud's metadata service */
    {{172, 16, 0, 0}, 12},   /* private */
    {{192, 0, 0, 0}, 24},    /* IETF protocol assignments (DS-Lite, NAT64 discovery, ...) */
    {{192, 0, 2, 0}, 24},    /* TEST-NET-1 */
    {{192, 88, 99, 0}, 24},  /* 6to4 relay anycast (deprecated) */
    {{192, 168, 0, 0}, 16},  /* private */
    {{198, 18, 0, 0}, 15},   /* benchmarking */
    {{198, 51, 100, 0}, 24}, /* TEST-NET-2 */
    {{203, 0, 113, 0}, 24},  /* TEST-NET-3 */
    {{224, 0, 0, 0}, 4},     /* multicast */
    {{240, 0, 0, 0}, 4},     /* reserved, and 255.255.255.255 */
};

/* Inside 2000::/3 (global unicast), the blocks that are not globally routable. */
static const struct block v6_private[] = {
    {{0x20, 0x01, 0x00, 0x00}, 23}, /* IETF protocol assignments (Teredo, ORCHID, ...) */
    {{0x20, 0x01, 0x0d, 0xb8}, 32}, /* documentation */
    {{0x3f, 0xff, 0x00, 0x00}, 20}, /* documentation (RFC 9637) */
};

static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
static const uint8_t nat64[12] = {0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};

/* Whether the first prefix bits of a and b are equal. */
static int prefix_equal(const uint8_t *a, const uint8_t *b, unsigned prefix)
{
    unsigned whole = prefix / 8, rest = prefix % 8;
    if (memcmp(a, b, whole) != 0)
        return 0;
    if (rest == 0)
        return 1;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

static int in_blocks(const uint8_t *a, const struct block *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (prefix_equal(a, t[i].addr, t[i].prefix))
            return 1;
    return 0;
}

static int ranges_match(int family, const uint8_t *a, const struct addr_ranges *ranges)
{
    if (!ranges)
        return 0;
    for (unsigned i = 0; i < ranges->n && i < ADDR_RANGES_MAX; i++)
        if (ranges->r[i].family == family &&
            prefix_equal(a, ranges->r[i].addr, ranges->r[i].prefix))
            return 1;
    return 0;
}

static int v4_public(const uint8_t *a, const struct addr_ranges *extra)
{
    if (in_blocks(a, v4_cloud, sizeof(v4_cloud) / sizeof(v4_cloud[0])))
        return 0;
    if (ranges_match(AF_INET, a, extra))
        return 1;
    return !in_blocks(a, v4_private, sizeof(v4_private) / sizeof(v4_private[0]));
}

static int v6_public(const uint8_t *a, const struct addr_ranges *extra)
{
    if (in_blocks(a, v6_cloud, sizeof(v6_cloud) / sizeof(v6_cloud[0])))
        return 0;
    if (ranges_match(AF_INET6, a, extra))
        return 1;
    /* forms that carry an IPv4 address reach it, so they are what it is */
    if (memcmp(a, v4_mapped, 12) == 0 || memcmp(a, nat64, 12) == 0)
        return v4_public(a + 12, extra);
    if (a[0] == 0x20 && a[1] == 0x02) /* 6to4: 2002:AABB:CCDD::/48 */
        return v4_public(a + 2, extra);
    /* ::/128, ::1, IPv4-compatible ::/96, 64:ff9b:1::/48, 100::/64, fc00::/7, fe80::/10,
       fec0::/10, ff00::/8 and everything IANA has not allocated lie outside 2000::/3 */
    if ((a[0] & 0xe0) != 0x20)
        return 0;
    return !in_blocks(a, v6_private, sizeof(v6_private) / sizeof(v6_private[0]));
}

int addr_is_public(const struct sockaddr *sa, const struct addr_ranges *extra)
{
    if (!sa)
        return 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return v4_public((const uint8_t *)&in->sin_addr, extra);
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        return v6_public(in6->sin6_addr.s6_addr, extra);
    }
    return 0;
}

int addr_dialable(const struct sockaddr *sa, socklen_t len, const struct addr_ranges *extra,
                  addr_local_fn is_local, void *ctx)
{
    if (!sa || sa->sa_family != AF_INET || len < (socklen_t)sizeof(struct sockaddr_in))
        return 0;
    if (!addr_is_public(sa, extra))
        return 0;
    return !is_local || !is_local(ctx, sa, len);
}

int addr_in_ranges(const struct sockaddr *sa, const struct addr_ranges *ranges)
{
    if (!sa)
        return 0;
    if (sa->sa_family == AF_INET)
        return ranges_match(AF_INET, (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr,
                            ranges);
    if (sa->sa_family == AF_INET6)
        return ranges_match(AF_INET6, ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr, ranges);
    return 0;
}

/*
 * IPv4 the way inet_aton reads it: one to four parts separated by dots, each decimal, octal
 * (leading 0) or hex (leading 0x); the last part fills the remaining bytes. Like glibc it stops
 * at whitespace. A single trailing dot ("127.0.0.1.") is also taken: URL parsers (WHATWG, curl)
 * read it as the address, and an address must never pass for a name.
 */
static int parse_v4(const char *s, uint8_t out[4])
{
    uint32_t parts[4];
    int n = 0;
    const char *p = s;
    for (;;) {
        if (n == 4)
            return 0;
        uint64_t v = 0;
        int base = 10, digits = 0;
        if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
            base = 16;
            p += 2;
            digits = 1; /* "0x" alone is 0 to a URL parser */
        } else if (p[0] == '0') {
            base = 8;
        }
        for (;; p++) {
            int d;
            if (*p >= '0' && *p <= '9')
                d = *p - '0';
            else if (base == 16 && *p >= 'a' && *p <= 'f')
                d = *p - 'a' + 10;
            else if (base == 16 && *p >= 'A' && *p <= 'F')
                d = *p - 'A' + 10;
            else
                break;
            if (d >= base)
                return 0; /* 8 or 9 in octal */
            v = v * (unsigned)base + (unsigned)d;
            if (v > 0xffffffffu)
                return 0;
            digits = 1;
        }
        if (!digits)
            return 0;
        parts[n++] = (uint32_t)v;
        if (*p != '.')
            break;
        p++;
        if (*p == '\0' || isspace((unsigned char)*p))
            break; /* the one trailing dot */
    }
    if (*p != '\0' && !isspace((unsigned char)*p))
        return 0;
    uint32_t v = parts[n - 1];
    /* all but the last part are one byte each; the last fills what is left */
    for (int i = 0; i < n - 1; i++) {
        if (parts[i] > 0xff)
            return 0;
        v |= parts[i] << (24 - 8 * i);
    }
    if (n > 1 && (uint64_t)parts[n - 1] >= (1ull << (8 * (4 - (n - 1)))))
        return 0;
    out[0] = (uint8_t)(v >> 24);
    out[1] = (uint8_t)(v >> 16);
    out[2] = (uint8_t)(v >> 8);
    out[3] = (uint8_t)v;
    return 1;
}

/* IPv6 as inet_pton reads it, bare or bracketed, a "%zone" dropped. */
static int parse_v6(const char *s, uint8_t out[16])
{
    char buf[LITERAL_MAX];
    size_t n = strlen(s);
    if (n >= sizeof(buf))
        return 0;
    memcpy(buf, s, n + 1);
    char *p = buf;
    if (p[0] == '[') {
        if (n < 2 || p[n - 1] != ']')
            return 0;
        p[n - 1] = '\0';
        p++;
    }
    char *zone = strchr(p, '%');
    if (zone)
        *zone = '\0';
    return inet_pton(AF_INET6, p, out) == 1;
}

int addr_parse_literal(const char *host, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (!host)
        return 0;
    uint8_t a[16];
    if (parse_v4(host, a)) {
        struct sockaddr_in *in = (struct sockaddr_in *)out;
        in->sin_family = AF_INET;
        memcpy(&in->sin_addr, a, 4);
        return AF_INET;
    }
    if (parse_v6(host, a)) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)out;
        in6->sin6_family = AF_INET6;
        memcpy(in6->sin6_addr.s6_addr, a, 16);
        return AF_INET6;
    }
    return 0;
}

/* One "addr[/prefix]" entry of n bytes at s into r; NULL, or why not. */
static const char *parse_range(const char *s, size_t n, struct addr_range *r)
{
    char buf[ADDR_RANGE_TEXT_MAX];
    if (n == 0)
        return "is empty";
    if (n >= sizeof(buf))
        return "is too long";
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *slash = strchr(buf, '/');
    long prefix = -1;
    if (slash) {
        *slash = '\0';
        const char *d = slash + 1;
        if (*d == '\0' || strlen(d) > 3 || strspn(d, "0123456789") != strlen(d))
            return "has a prefix length that is not a number";
        prefix = strtol(d, NULL, 10);
    }
    memset(r, 0, sizeof(*r));
    unsigned max;
    if (inet_pton(AF_INET, buf, r->addr) == 1) {
        r->family = AF_INET;
        max = 32;
    } else if (inet_pton(AF_INET6, buf, r->addr) == 1) {
        r->family = AF_INET6;
        max = 128;
    } else {
        return "is not an IPv4 or IPv6 address (dotted quad, or IPv6 without brackets)";
    }
    if (prefix < 0)
        prefix = max;
    if (prefix > (long)max)
        return "has a prefix length beyond the address";
    if (prefix == 0)
        return "is every address (/0), which would make the metadata service public";
    r->prefix = (unsigned)prefix;
    for (unsigned bit = r->prefix; bit < max; bit++)
        if (r->addr[bit / 8] & (0x80 >> (bit % 8)))
            return "has bits set after the prefix (write the network address)";
    return NULL;
}

int addr_ranges_parse(const char *csv, struct addr_ranges *out, struct wr_err *err)
{
    memset(out, 0, sizeof(*out));
    if (!csv)
        return 0;
    const char *p = csv;
    while (*p) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        const char *s = p, *e = end;
        while (s < e && (*s == ' ' || *s == '\t'))
            s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (s == e && !comma && p == csv)
            break; /* "" or only spaces: no ranges */
        if (out->n == ADDR_RANGES_MAX) {
            memset(out, 0, sizeof(*out));
            return wr_err_kind(err, WR_E_INVALID, 0, "public ranges: at most %d", ADDR_RANGES_MAX);
        }
        const char *why = parse_range(s, (size_t)(e - s), &out->r[out->n]);
        if (why) {
            int shown = (int)(e - s > 100 ? 100 : e - s);
            memset(out, 0, sizeof(*out));
            return wr_err_kind(err, WR_E_INVALID, 0, "public ranges: \"%.*s\" %s", shown, s, why);
        }
        out->n++;
        if (!comma)
            break;
        p = comma + 1;
        if (*p == '\0') {
            memset(out, 0, sizeof(*out));
            return wr_err_kind(err, WR_E_INVALID, 0, "public ranges: empty entry after ','");
        }
    }
    return 0;
}

int addr_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port &&
               memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
    }
    return 0;
}
