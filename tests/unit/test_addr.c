/*
 * Public addresses and address literals (net/addr.h): every special-purpose range on both sides
 * of its edges, the IPv6 forms that carry IPv4 (mapped, NAT64, 6to4) judged by what they carry,
 * the tests' extra "public" ranges, and literals in all the spellings the C library accepts,
 * checked against inet_aton and inet_pton themselves.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "net/addr.h"
#include "tap.h"

/* text (strict inet_pton form) as a sockaddr; the family, or 0 if the test text is wrong. */
static int sockaddr_of(const char *text, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, text, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        return AF_INET;
    }
    if (inet_pton(AF_INET6, text, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        return AF_INET6;
    }
    return 0;
}

static int is_public(const char *text, const struct addr_ranges *extra)
{
    struct sockaddr_storage ss;
    if (!sockaddr_of(text, &ss))
        return -1;
    return addr_is_public((struct sockaddr *)&ss, extra);
}

static void public_checks(void)
{
    static const struct {
        const char *addr;
        int want;
    } cases[] = {
        /* IPv4: each special range, its first and last address, and its neighbours */
        {"0.0.0.0", 0},
        {"0.255.255.255", 0},
        {"1.0.0.0", 1},
        {"1.1.1.1", 1},
        {"9.255.255.255", 1},
        {"10.0.0.0", 0},
        {"10.255.255.255", 0},
        {"11.0.0.0", 1},
        {"100.63.255.255", 1},
        {"100.64.0.0", 0},
        {"100.127.255.255", 0},
        {"100.128.0.0", 1},
        {"126.255.255.255", 1},
        {"127.0.0.1", 0},
        {"127.255.255.255", 0},
        {"128.0.0.0", 1},
        {"169.253.255.255", 1},
        {"169.254.0.0", 0},
        {"169.254.169.254", 0}, /* the metadata service */
        {"169.254.255.255", 0},
        {"169.255.0.0", 1},
        {"172.15.255.255", 1},
        {"172.16.0.0", 0},
        {"172.31.255.255", 0},
        {"172.32.0.0", 1},
        {"192.0.0.0", 0},
        {"192.0.0.255", 0},
        {"192.0.1.0", 1},
        {"192.0.2.0", 0},
        {"192.0.2.255", 0},
        {"192.0.3.0", 1},
        {"192.88.98.255", 1},
        {"192.88.99.1", 0},
        {"192.88.100.0", 1},
        {"192.167.255.255", 1},
        {"192.168.0.0", 0},
        {"192.168.255.255", 0},
        {"192.169.0.0", 1},
        {"198.17.255.255", 1},
        {"198.18.0.0", 0},
        {"198.19.255.255", 0},
        {"198.20.0.0", 1},
        {"198.51.99.255", 1},
        {"198.51.100.7", 0},
        {"198.51.101.0", 1},
        {"203.0.112.255", 1},
        {"203.0.113.9", 0},
        {"203.0.114.0", 1},
        {"223.255.255.255", 1},
        {"224.0.0.1", 0},
        {"239.255.255.255", 0},
        {"240.0.0.0", 0},
        {"255.255.255.254", 0},
        {"255.255.255.255", 0},
        {"8.8.8.8", 1},
        {"151.101.0.223", 1},
        /* IPv6 */
        {"::", 0},
        {"::1", 0},
        {"::2", 0},
        {"::8.8.8.8", 0}, /* IPv4-compatible: deprecated, routed nowhere */
        {"::ffff:127.0.0.1", 0},
        {"::ffff:169.254.169.254", 0},
        {"::ffff:10.1.2.3", 0},
        {"::ffff:8.8.8.8", 1},
        {"::ffff:0:8.8.8.8", 0}, /* SIIT ::ffff:0:0:0/96 is not the mapped prefix */
        {"64:ff9b::8.8.8.8", 1},
        {"64:ff9b::127.0.0.1", 0},
        {"64:ff9b::192.168.1.1", 0},
        {"64:ff9b::a9fe:a9fe", 0}, /* 169.254.169.254 */
        {"64:ff9b:1::8.8.8.8", 0}, /* local-use NAT64 */
        {"100::1", 0},
        {"100::ffff:ffff:ffff:ffff", 0},
        {"2001::1", 0},     /* Teredo */
        {"2001:1ff::1", 0}, /* end of 2001::/23 */
        {"2001:200::1", 1}, /* just after it */
        {"2001:db8::1", 0}, /* documentation */
        {"2001:db9::1", 1},
        {"2002:0808:0808::1", 1}, /* 6to4 of 8.8.8.8 */
        {"2002:7f00:0001::1", 0}, /* 6to4 of 127.0.0.1 */
        {"2002:a9fe:a9fe::1", 0}, /* 6to4 of 169.254.169.254 */
        {"2002:c0a8:0101::1", 0}, /* 6to4 of 192.168.1.1 */
        {"2606:4700:4700::1111", 1},
        {"2a00:1450:4001:80b::200e", 1},
        {"3ffe::1", 1},
        {"3fff::1", 0}, /* documentation (RFC 9637) */
        {"3fff:fff::1", 0},
        {"4000::1", 0}, /* unallocated */
        {"5f00::1", 0}, /* SRv6 SIDs */
        {"1fff:ffff::1", 0},
        {"fc00::1", 0},
        {"fd00:1::5", 0},
        {"fdff:ffff::1", 0},
        {"fe80::1", 0},
        {"febf::1", 0},
        {"fec0::1", 0},
        {"ff02::1", 0},
        {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0},
        /* clouds' host endpoints, in every form that reaches them */
        {"169.254.170.2", 0},   /* AWS ECS task credentials */
        {"169.254.170.23", 0},  /* AWS EKS Pod Identity */
        {"169.254.169.253", 0}, /* AWS DNS */
        {"169.254.0.23", 0},    /* Tencent */
        {"169.254.42.42", 0},   /* Scaleway */
        {"168.63.129.16", 0},   /* Azure WireServer: a public address */
        {"168.63.129.15", 1},   /* its neighbours are ordinary Microsoft addresses */
        {"168.63.129.17", 1},
        {"::ffff:168.63.129.16", 0}, /* mapped */
        {"64:ff9b::a83f:8110", 0},   /* NAT64 */
        {"2002:a83f:8110::1", 0},    /* 6to4 */
        {"::168.63.129.16", 0},      /* IPv4-compatible */
        {"100.100.100.200", 0},      /* Alibaba */
        {"::ffff:100.100.100.200", 0},
        {"192.0.0.192", 0}, /* Oracle Cloud Classic */
        {"161.26.0.10", 0}, /* IBM Cloud service network */
        {"161.25.255.255", 1},
        {"161.27.0.0", 1},
        {"166.9.12.1", 0}, /* IBM Cloud private service endpoints */
        {"166.7.255.255", 1},
        {"166.12.0.0", 1},
        {"fd00:ec2::254", 0},                        /* AWS IMDS over IPv6 */
        {"fd00:ec2::23", 0},                         /* AWS ECS/EKS over IPv6 */
        {"fd20:ce::254", 0},                         /* GCP metadata over IPv6 */
        {"fd00:c1::a9fe:a9fe", 0},                   /* Oracle metadata over IPv6 */
        {"fd00:a9fe:a9fe::1", 0},                    /* Linode metadata */
        {"fe80::a9fe:a9fe", 0},                      /* OpenStack metadata over IPv6 */
        {"2001:0:4136:e378:8000:63bf:3fff:fdd2", 0}, /* Teredo */
        {"::ffff:0:169.254.169.254", 0},             /* SIIT */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = is_public(cases[i].addr, NULL);
        ok(got == cases[i].want, "%s is %s", cases[i].addr,
           got < 0 ? "not an address (test bug)"
           : got   ? "public"
                   : "not public");
    }

    ok(!addr_is_public(NULL, NULL), "NULL is not public");
    struct sockaddr_storage ss = {0};
    ss.ss_family = AF_UNIX;
    ok(!addr_is_public((struct sockaddr *)&ss, NULL), "AF_UNIX is not public");
    ss.ss_family = AF_UNSPEC;
    ok(!addr_is_public((struct sockaddr *)&ss, NULL), "AF_UNSPEC is not public");
}

static int fake_local(void *ctx, const struct sockaddr *sa, socklen_t len)
{
    struct sockaddr_storage mine;
    sockaddr_of((const char *)ctx, &mine);
    return sa->sa_family == AF_INET && ((const struct sockaddr_in *)sa)->sin_addr.s_addr ==
                                           ((const struct sockaddr_in *)&mine)->sin_addr.s_addr;
}

/* The proxy's and the resolver's one predicate. */
static void dialable_checks(void)
{
    static const struct {
        const char *addr;
        int want;
    } cases[] = {
        {"8.8.8.8", 1},         {"151.101.0.223", 0}, /* the host's own, public address */
        {"10.0.0.1", 0},        {"168.63.129.16", 0}, {"::ffff:8.8.8.8", 0}, /* IPv6: never */
        {"2606:4700::1111", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sockaddr_storage ss;
        sockaddr_of(cases[i].addr, &ss);
        socklen_t len =
            ss.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
        int got =
            addr_dialable((struct sockaddr *)&ss, len, NULL, fake_local, (void *)"151.101.0.223");
        ok(got == cases[i].want, "addr_dialable: %s %s", cases[i].addr,
           got ? "is dialed" : "is not");
    }
    struct sockaddr_storage ss;
    sockaddr_of("151.101.0.223", &ss);
    ok(addr_dialable((struct sockaddr *)&ss, sizeof(struct sockaddr_in), NULL, NULL, NULL) == 1,
       "without an is_local hook no address is the host's");
    ok(addr_dialable((struct sockaddr *)&ss, 4, NULL, NULL, NULL) == 0, "a short sockaddr is not");
    ok(addr_dialable(NULL, 0, NULL, NULL, NULL) == 0, "NULL is not");
}

static void extra_checks(void)
{
    struct addr_ranges r;
    struct wr_err err = {0};
    int rc = addr_ranges_parse(" 198.18.0.0/24 ,fd00:1::/64,10.9.8.7", &r, &err);
    ok(rc == 0 && r.n == 3, "three ranges parse (%s)", err.msg);
    ok(r.r[0].family == AF_INET && r.r[0].prefix == 24, "198.18.0.0/24");
    ok(r.r[1].family == AF_INET6 && r.r[1].prefix == 64, "fd00:1::/64");
    ok(r.r[2].family == AF_INET && r.r[2].prefix == 32, "a bare address is a /32");

    static const struct {
        const char *addr;
        int want;
    } cases[] = {
        {"198.18.0.1", 1},
        {"198.18.0.255", 1},
        {"198.18.1.0", 0}, /* still benchmarking space, outside the /24 */
        {"198.17.255.255", 1},
        {"10.9.8.7", 1},
        {"10.9.8.8", 0},
        {"fd00:1::1", 1},
        {"fd00:1:0:0:ffff:ffff:ffff:ffff", 1},
        {"fd00:1:0:1::1", 0},
        {"fd00:2::1", 0},
        {"::ffff:198.18.0.9", 1}, /* the IPv4 inside is judged with the extra ranges too */
        {"64:ff9b::198.18.0.9", 1},
        {"2002:c612:0009::1", 1}, /* 6to4 of 198.18.0.9 */
        {"169.254.169.254", 0},
        {"127.0.0.1", 0},
        {"8.8.8.8", 1},
    };
    struct addr_ranges clouds;
    rc = addr_ranges_parse("169.254.0.0/16,168.63.0.0/16,100.64.0.0/10,fd00::/8", &clouds, &err);
    ok(rc == 0, "ranges over the clouds' endpoints parse (%s)", err.msg);
    ok(is_public("169.254.1.1", &clouds) == 1 && is_public("168.63.1.1", &clouds) == 1,
       "with them, their other addresses are public");
    static const char *never[] = {"169.254.169.254", "169.254.170.2",        "168.63.129.16",
                                  "100.100.100.200", "::ffff:168.63.129.16", "fd00:ec2::254"};
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
        ok(is_public(never[i], &clouds) == 0, "but %s never is", never[i]);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = is_public(cases[i].addr, &r);
        ok(got == cases[i].want, "with extra ranges, %s is %s", cases[i].addr,
           got < 0 ? "not an address (test bug)"
           : got   ? "public"
                   : "not public");
    }
    struct sockaddr_storage ss;
    sockaddr_of("198.18.0.77", &ss);
    ok(addr_in_ranges((struct sockaddr *)&ss, &r), "addr_in_ranges: 198.18.0.77 in the list");
    sockaddr_of("198.18.1.77", &ss);
    ok(!addr_in_ranges((struct sockaddr *)&ss, &r), "addr_in_ranges: 198.18.1.77 not in it");
    ok(!addr_in_ranges((struct sockaddr *)&ss, NULL), "addr_in_ranges: NULL list");

    struct addr_ranges loop;
    rc = addr_ranges_parse("127.0.0.0/8", &loop, &err);
    sockaddr_of("127.0.0.1", &ss);
    ok(rc == 0 && addr_is_public((struct sockaddr *)&ss, &loop),
       "extra ranges are checked first (a test may call loopback public)");

    rc = addr_ranges_parse(NULL, &r, &err);
    ok(rc == 0 && r.n == 0, "NULL: no ranges");
    rc = addr_ranges_parse("", &r, &err);
    ok(rc == 0 && r.n == 0, "\"\": no ranges");
    rc = addr_ranges_parse("  ", &r, &err);
    ok(rc == 0 && r.n == 0, "spaces: no ranges");

    static const struct {
        const char *csv, *want;
    } bad[] = {
        {"198.18.0.1/24", "\"198.18.0.1/24\" has bits set after the prefix"},
        {"fd00:1::1/64", "has bits set after the prefix"},
        {"0.0.0.0/0", "is every address (/0)"},
        {"::/0", "is every address"},
        {"10.0.0.0/33", "prefix length beyond the address"},
        {"fd00::/129", "prefix length beyond"},
        {"10.0.0.0/", "prefix length that is not a number"},
        {"10.0.0.0/-8", "not a number"},
        {"10.0.0.0/+8", "not a number"},
        {"10.0.0.0/8x", "not a number"},
        {"10.0.0.0/0008", "not a number"},
        {"10.1/16", "\"10.1/16\" is not an IPv4 or IPv6 address"},
        {"0x0a000000/8", "is not an IPv4 or IPv6 address"},
        {"[fd00::]/8", "is not an IPv4"},
        {"example.test/24", "is not an IPv4"},
        {"10.0.0.0/8,", "empty entry after ','"},
        {"10.0.0.0/8,,11.0.0.0/8", "\"\" is empty"},
        {",10.0.0.0/8", "is empty"},
        {"10.0.0.0/8 11.0.0.0/8", "\"10.0.0.0/8 11.0.0.0/8\" has a prefix length"},
        {"1.0.0.0/8,2.0.0.0/8,3.0.0.0/8,4.0.0.0/8,5.0.0.0/8,6.0.0.0/8,7.0.0.0/8,8.0.0.0/8,"
         "9.0.0.0/8,10.0.0.0/8,11.0.0.0/8,12.0.0.0/8,13.0.0.0/8,14.0.0.0/8,15.0.0.0/8,"
         "16.0.0.0/8,17.0.0.0/8",
         "at most 16"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        wr_err_clear(&err);
        r.n = 7;
        rc = addr_ranges_parse(bad[i].csv, &r, &err);
        ok(rc < 0 && r.n == 0 && err.kind == WR_E_INVALID && strstr(err.msg, bad[i].want),
           "ranges \"%s\": refused (%s)", bad[i].csv, err.msg);
    }
}

/* addr_parse_literal's answer as text ("4:127.0.0.1", "6:::1", "0"). */
static const char *literal(const char *host, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    int fam = addr_parse_literal(host, &ss);
    char a[INET6_ADDRSTRLEN] = "";
    if (fam == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, a, sizeof(a));
    else if (fam == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, a, sizeof(a));
    snprintf(buf, cap, "%s%s", fam == AF_INET ? "4:" : fam == AF_INET6 ? "6:" : "0", a);
    return buf;
}

static void literal_checks(void)
{
    static const struct {
        const char *host, *want;
    } cases[] = {
        {"127.0.0.1", "4:127.0.0.1"},
        {"127.1", "4:127.0.0.1"},
        {"127.0.1", "4:127.0.0.1"},
        {"0x7f000001", "4:127.0.0.1"},
        {"0X7F.1", "4:127.0.0.1"},
        {"2130706433", "4:127.0.0.1"},
        {"017700000001", "4:127.0.0.1"},
        {"0177.0.0.01", "4:127.0.0.1"},
        {"0x7f.0x0.0x0.0x1", "4:127.0.0.1"},
        {"169.254.43518", "4:169.254.169.254"},
        {"0xa9fea9fe", "4:169.254.169.254"},
        {"2852039166", "4:169.254.169.254"},
        {"0", "4:0.0.0.0"},
        {"0xffffffff", "4:255.255.255.255"},
        {"1.0xffffff", "4:1.255.255.255"},
        {"000000000000000000000000000000000127.1", "4:87.0.0.1"}, /* octal 0127 */
        {"127.0.0.1.", "4:127.0.0.1"}, /* a URL parser's reading of a trailing dot */
        {"127.1.", "4:127.0.0.1"},
        {"0x", "4:0.0.0.0"},                   /* "0x" is 0 to a URL parser */
        {"127.0.0.1 trailing", "4:127.0.0.1"}, /* inet_aton stops at whitespace */
        {"::1", "6:::1"},
        {"[::1]", "6:::1"},
        {"[::ffff:127.0.0.1]", "6:::ffff:127.0.0.1"},
        {"fe80::1%eth0", "6:fe80::1"},
        {"[fe80::1%25eth0]", "6:fe80::1"},
        {"2001:DB8::1", "6:2001:db8::1"},
        {"", "0"},
        {"localhost", "0"},
        {"pypi.org", "0"},
        {"1.2.3.4.5", "0"},
        {"1.2.3.4..", "0"},
        {"1..2", "0"},
        {".1", "0"},
        {"256.0.0.1", "0"},
        {"1.256.0.1", "0"},
        {"1.2.3.256", "0"},
        {"1.2.65536", "0"},
        {"4294967296", "0"},
        {"0x100000000", "0"},
        {"08", "0"},
        {"09.1.1.1", "0"},
        {"0xg", "0"},
        {"1.2.3.4x", "0"},
        {"1e3", "0"},
        {"-1", "0"},
        {"+1", "0"},
        {" 1.2.3.4", "0"},
        {"0x7f000001.evil.test", "0"},
        {"[::1", "0"},
        {"::1]", "0"},
        {"[]", "0"},
        {"[127.0.0.1]", "0"},
        {"[[::1]]", "0"},
        {":::1", "0"},
        {"1.2.3.4:80", "0"},
        {"[::1]:80", "0"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        literal(cases[i].host, buf, sizeof(buf));
        ok(strcmp(buf, cases[i].want) == 0, "literal \"%s\": %s", cases[i].host, buf);
    }
    struct sockaddr_storage ss;
    ss.ss_family = AF_INET;
    ok(addr_parse_literal(NULL, &ss) == 0 && ss.ss_family == 0, "NULL: not a literal");

    /* Whatever the C library takes for an address, so must we, and read it the same way. */
    static const char *const probes[] = {
        "1",
        "1.2",
        "1.2.3",
        "1.2.3.4",
        "0x1.0x2.0x3.0x4",
        "01.02.03.04",
        "0377.0377.0377.0377",
        "0xff.0xff.0xffff",
        "4294967295",
        "037777777777",
        "255.16777215",
        "00",
        "0x0",
        "0.0",
        "000.000.000.000",
        "1.2.3.4 x",
        "1.2.3.4\tx",
        "1.2.3.4\n",
        "0x00000000000000001.2",
        "99999999999",
        "1.2.3.4.",
        "1.",
        "::",
        "::ffff:1.2.3.4",
        "1:2:3:4:5:6:7:8",
        "1:2:3:4:5:6:1.2.3.4",
        "1::",
        "::1:2:3:4:5:6:7",
    };
    int agree = 1;
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        struct in_addr a4;
        uint8_t a6[16];
        int fam = addr_parse_literal(probes[i], &ss);
        if (inet_aton(probes[i], &a4) &&
            (fam != AF_INET || memcmp(&((struct sockaddr_in *)&ss)->sin_addr, &a4, 4) != 0)) {
            printf("# inet_aton takes \"%s\", addr_parse_literal does not agree\n", probes[i]);
            agree = 0;
        }
        if (inet_pton(AF_INET6, probes[i], a6) == 1 &&
            (fam != AF_INET6 || memcmp(((struct sockaddr_in6 *)&ss)->sin6_addr.s6_addr, a6, 16))) {
            printf("# inet_pton takes \"%s\", addr_parse_literal does not agree\n", probes[i]);
            agree = 0;
        }
    }
    ok(agree, "every probe inet_aton or inet_pton takes is the same literal to addr_parse_literal");

    /* and the other way: all 1..4-part forms of a few addresses in decimal, octal and hex */
    static const uint32_t addrs[] = {0x7f000001u, 0xa9fea9feu, 0x0a000001u, 0xffffffffu, 0};
    int all = 1;
    for (size_t i = 0; i < sizeof(addrs) / sizeof(addrs[0]); i++) {
        for (int parts = 1; parts <= 4; parts++) {
            for (int style = 0; style < 3; style++) {
                char text[80];
                size_t n = 0;
                uint32_t v = addrs[i];
                for (int p = 0; p < parts; p++) {
                    uint32_t part = p < parts - 1 ? (v >> (24 - 8 * p)) & 0xff
                                    : parts == 1  ? v
                                                  : v & (0xffffffffu >> (8 * (parts - 1)));
                    const char *fmt = style == 0 ? "%s%u" : style == 1 ? "%s0%o" : "%s0x%x";
                    n += (size_t)snprintf(text + n, sizeof(text) - n, fmt, p ? "." : "", part);
                }
                struct in_addr a4;
                int fam = addr_parse_literal(text, &ss);
                if (!inet_aton(text, &a4) || fam != AF_INET ||
                    ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) != v ||
                    ntohl(a4.s_addr) != v) {
                    printf("# \"%s\" not read as %08x\n", text, v);
                    all = 0;
                }
            }
        }
    }
    ok(all, "1 to 4 parts, decimal, octal and hex, all read as inet_aton reads them");
}

int main(void)
{
    public_checks();
    extra_checks();
    dialable_checks();
    literal_checks();
    return tap_done();
}
