/*
 * DNS messages (net/dnsmsg.h): queries as stub resolvers and dig lay them out, every way a
 * sandbox's query can be broken (truncations, pointers, counts, names of 253/254 bytes and labels
 * of 63/64, bytes no host name has, EDNS0 variants), the replies byte for byte, and upstream
 * answers: CNAME chains in any order, records for other names, compression pointers that loop,
 * point forwards or jump too often, and answers that are not ours.
 */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "net/dnsmsg.h"
#include "tap.h"

/* A message built by hand, as the bytes go on the wire. */
struct msg {
    uint8_t b[4096];
    size_t n;
};

static void u8(struct msg *m, unsigned v)
{
    m->b[m->n++] = (uint8_t)v;
}

static void u16(struct msg *m, unsigned v)
{
    u8(m, v >> 8);
    u8(m, v);
}

static void u32(struct msg *m, uint32_t v)
{
    u16(m, v >> 16);
    u16(m, v & 0xffff);
}

static void raw(struct msg *m, const void *p, size_t n)
{
    memcpy(m->b + m->n, p, n);
    m->n += n;
}

static void set16(struct msg *m, size_t at, unsigned v)
{
    m->b[at] = (uint8_t)(v >> 8);
    m->b[at + 1] = (uint8_t)v;
}

/* Labels of a dotted name ("" is the root), uncompressed, ending with the root's 0. */
static void name(struct msg *m, const char *dotted)
{
    while (*dotted) {
        const char *dot = strchr(dotted, '.');
        size_t l = dot ? (size_t)(dot - dotted) : strlen(dotted);
        u8(m, (unsigned)l);
        raw(m, dotted, l);
        dotted += l + (dot ? 1 : 0);
    }
    u8(m, 0);
}

static void ptr(struct msg *m, unsigned off)
{
    u16(m, 0xc000 | off);
}

static void header(struct msg *m, unsigned id, unsigned flags, unsigned qd, unsigned an,
                   unsigned ns, unsigned ar)
{
    m->n = 0;
    u16(m, id);
    u16(m, flags);
    u16(m, qd);
    u16(m, an);
    u16(m, ns);
    u16(m, ar);
}

/* A question for a dotted name with the fixed part after it. */
static void question(struct msg *m, const char *qname, unsigned type, unsigned class)
{
    name(m, qname);
    u16(m, type);
    u16(m, class);
}

/* An OPT record: UDP size, extended rcode, version, DO; no options. */
static void opt(struct msg *m, unsigned size, unsigned ext, unsigned version, int dnssec_ok)
{
    u8(m, 0);
    u16(m, DNS_TYPE_OPT);
    u16(m, size);
    u32(m, (uint32_t)ext << 24 | (uint32_t)version << 16 | (dnssec_ok ? 0x8000u : 0));
    u16(m, 0);
}

/* A record's fixed part after an owner name written by the caller, then rdata. */
static void rr_tail(struct msg *m, unsigned type, uint32_t ttl, const void *rdata, size_t rdlen)
{
    u16(m, type);
    u16(m, 1);
    u32(m, ttl);
    u16(m, (unsigned)rdlen);
    raw(m, rdata, rdlen);
}

static enum dns_query_result parse(const struct msg *m, struct dns_query *q)
{
    return dnsmsg_parse_query(m->b, m->n, q);
}

/* A standard query as glibc's stub sends it: RD, no EDNS0. */
static void glibc_query(struct msg *m, const char *qname, unsigned type)
{
    header(m, 0xbeef, 0x0100, 1, 0, 0, 0);
    question(m, qname, type, 1);
}

/* As dig 9.18 sends it by default: RD and AD, EDNS0 at 1232 with an 8-byte client cookie. */
static void dig_query(struct msg *m, const char *qname, unsigned type)
{
    header(m, 0x5ca1, 0x0120, 1, 0, 0, 1);
    question(m, qname, type, 1);
    u8(m, 0);
    u16(m, DNS_TYPE_OPT);
    u16(m, 1232);
    u32(m, 0);
    u16(m, 12);
    u16(m, 10); /* COOKIE */
    u16(m, 8);
    raw(m, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
}

static void query_ok_checks(void)
{
    struct msg m;
    struct dns_query q;
    glibc_query(&m, "example.com", DNS_TYPE_A);
    enum dns_query_result r = parse(&m, &q);
    ok(r == DNS_QUERY_OK && q.id == 0xbeef && q.rd && q.has_question &&
           strcmp(q.name, "example.com") == 0 && q.qtype == DNS_TYPE_A &&
           q.qclass == DNS_CLASS_IN && !q.edns && q.udp_size == 512 && q.qwire_len == 13,
       "a glibc query: %s, \"%s\", no EDNS0, replies up to 512", dnsmsg_query_result_name(r),
       q.name);

    header(&m, 0x0001, 0x0120, 1, 0, 0, 0); /* dig +noedns: RD and AD */
    question(&m, "pypi.org", DNS_TYPE_AAAA, 1);
    ok(parse(&m, &q) == DNS_QUERY_OK && q.qtype == DNS_TYPE_AAAA && strcmp(q.name, "pypi.org") == 0,
       "a dig +noedns query for AAAA");

    dig_query(&m, "files.pythonhosted.org", DNS_TYPE_A);
    ok(parse(&m, &q) == DNS_QUERY_OK && q.edns && q.udp_size == 1232 && !q.do_bit &&
           q.edns_version == 0,
       "a dig query with EDNS0 and a cookie: udp size 1232");

    header(&m, 7, 0, 1, 0, 0, 1);
    question(&m, "a.test", DNS_TYPE_A, 1);
    opt(&m, 4096, 0, 0, 1);
    ok(parse(&m, &q) == DNS_QUERY_OK && q.udp_size == 4096 && q.do_bit && !q.rd,
       "EDNS0 at 4096 with DO: both recorded, RD clear recorded");

    header(&m, 7, 0x0100, 1, 0, 0, 1);
    question(&m, "a.test", DNS_TYPE_A, 1);
    opt(&m, 100, 0, 0, 0);
    ok(parse(&m, &q) == DNS_QUERY_OK && q.udp_size == 512, "an EDNS0 size under 512 counts as 512");

    glibc_query(&m, "WWW.Example.COM.test", DNS_TYPE_A);
    ok(parse(&m, &q) == DNS_QUERY_OK && strcmp(q.name, "www.example.com.test") == 0 &&
           memcmp(q.qwire, "\3WWW\7Example\3COM", 16) == 0,
       "upper case: the name lower-cased, the question kept as asked (%s)", q.name);

    glibc_query(&m, "_dmarc.x-y.test", DNS_TYPE_TXT);
    ok(parse(&m, &q) == DNS_QUERY_OK && strcmp(q.name, "_dmarc.x-y.test") == 0,
       "'_' and '-' are name bytes");

    glibc_query(&m, "", DNS_TYPE_NS);
    ok(parse(&m, &q) == DNS_QUERY_OK && q.name[0] == '\0' && q.qwire_len == 1,
       "the root: the name \"\"");

    glibc_query(&m, "pypi.org", DNS_TYPE_HTTPS);
    ok(parse(&m, &q) == DNS_QUERY_OK && q.qtype == DNS_TYPE_HTTPS,
       "an HTTPS query parses (the reply decides)");

    /* EDNS0 padding (RFC 7830) makes a query longer than 512 */
    header(&m, 9, 0x0100, 1, 0, 0, 1);
    question(&m, "a.test", DNS_TYPE_A, 1);
    u8(&m, 0);
    u16(&m, DNS_TYPE_OPT);
    u16(&m, 1232);
    u32(&m, 0);
    u16(&m, 4 + 600);
    u16(&m, 12); /* PADDING */
    u16(&m, 600);
    memset(m.b + m.n, 0, 600);
    m.n += 600;
    ok(parse(&m, &q) == DNS_QUERY_OK && m.n > 512, "a padded EDNS0 query of %zu bytes", m.n);
}

/* A name of exactly n presentation bytes: labels of 63 and a last one for the rest. */
static void long_name(char *out, size_t n)
{
    size_t t = 0;
    while (t < n) {
        size_t l = n - t > 63 ? 63 : n - t;
        if (n - t - l == 1)
            l--; /* never leave a lone dot at the end */
        memset(out + t, 'a', l);
        t += l;
        if (t < n)
            out[t++] = '.';
    }
    out[t] = '\0';
}

static void query_name_checks(void)
{
    struct msg m;
    struct dns_query q;
    char n[300];
    long_name(n, 253);
    glibc_query(&m, n, DNS_TYPE_A);
    ok(parse(&m, &q) == DNS_QUERY_OK && strlen(q.name) == 253 && q.qwire_len == 255,
       "a name of 253 bytes (255 on the wire)");
    long_name(n, 254);
    glibc_query(&m, n, DNS_TYPE_A);
    ok(strlen(n) == 254 && parse(&m, &q) == DNS_QUERY_FORMERR && !q.has_question,
       "a name of 254 bytes: FORMERR");

    char label[70];
    memset(label, 'b', 63);
    strcpy(label + 63, ".test");
    glibc_query(&m, label, DNS_TYPE_A);
    ok(parse(&m, &q) == DNS_QUERY_OK, "a label of 63 bytes");
    memset(label, 'b', 64);
    strcpy(label + 64, ".test");
    glibc_query(&m, label, DNS_TYPE_A);
    ok(parse(&m, &q) == DNS_QUERY_FORMERR, "a label of 64 bytes: FORMERR");

    static const struct {
        const char *wire; /* the name on the wire */
        size_t len;
        enum dns_query_result want;
        const char *text;
    } names[] = {
        /* octal escapes: a hex one would swallow the label's first letters */
        {"\3a b\4test", 9, DNS_QUERY_BADNAME, "a?b.test"},
        {"\3a.b\4test", 9, DNS_QUERY_BADNAME, "a?b.test"}, /* a dot inside a label */
        {"\3a\0b\4test", 9, DNS_QUERY_BADNAME, "a?b.test"},
        {"\3a\303\251\4test", 9, DNS_QUERY_BADNAME, "a??.test"},
        {"\3a*b\4test", 9, DNS_QUERY_BADNAME, "a?b.test"},
        {"\1a\300\14", 4, DNS_QUERY_FORMERR, ""}, /* a pointer in a question */
        {"\300\14", 2, DNS_QUERY_FORMERR, ""},    /* a pointer to itself */
        {"\1a\100b", 4, DNS_QUERY_FORMERR, ""},   /* an extended label type */
        {"\1a\200b", 4, DNS_QUERY_FORMERR, ""},   /* a reserved label type */
        {"\1a\5bc", 5, DNS_QUERY_FORMERR, ""},    /* a label past the end */
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        header(&m, 3, 0x0100, 1, 0, 0, 0);
        raw(&m, names[i].wire, names[i].len);
        if (names[i].want == DNS_QUERY_BADNAME)
            u8(&m, 0);
        u16(&m, DNS_TYPE_A);
        u16(&m, 1);
        enum dns_query_result r = parse(&m, &q);
        ok(r == names[i].want && strcmp(q.name, names[i].text) == 0 && q.id == 3,
           "question name %zu: %s (\"%s\")", i, dnsmsg_query_result_name(r), q.name);
    }
}

static void query_bad_checks(void)
{
    struct msg m;
    struct dns_query q;
    dig_query(&m, "files.pythonhosted.org", DNS_TYPE_A);
    size_t full = m.n;
    int drops = 1, formerrs = 1;
    for (size_t len = 0; len < full; len++) {
        enum dns_query_result r = dnsmsg_parse_query(m.b, len, &q);
        if (len < 12)
            drops &= r == DNS_QUERY_DROP;
        else
            formerrs &= r == DNS_QUERY_FORMERR && q.id == 0x5ca1;
    }
    ok(drops, "every truncation inside the header: dropped");
    ok(formerrs, "every truncation after it: FORMERR with the id (%zu cases)", full - 12);
    m.b[m.n++] = 0;
    ok(parse(&m, &q) == DNS_QUERY_FORMERR && q.has_question, "a byte after the OPT: FORMERR");
    glibc_query(&m, "a.test", DNS_TYPE_A);
    m.b[m.n++] = 0;
    ok(parse(&m, &q) == DNS_QUERY_FORMERR, "a byte after the question: FORMERR");

    static const struct {
        unsigned flags, qd, an, ns, ar;
        enum dns_query_result want;
        const char *what;
    } heads[] = {
        {0x8180, 1, 0, 0, 0, DNS_QUERY_DROP, "a response (QR)"},
        {0x1000, 1, 0, 0, 0, DNS_QUERY_NOTIMP, "opcode STATUS"},
        {0x2000, 1, 0, 0, 0, DNS_QUERY_NOTIMP, "opcode NOTIFY"},
        {0x2800, 1, 0, 0, 0, DNS_QUERY_NOTIMP, "opcode UPDATE"},
        {0x0100, 0, 0, 0, 0, DNS_QUERY_FORMERR, "QDCOUNT 0"},
        {0x0100, 2, 0, 0, 0, DNS_QUERY_FORMERR, "QDCOUNT 2"},
        {0x0100, 1, 1, 0, 0, DNS_QUERY_FORMERR, "ANCOUNT 1"},
        {0x0100, 1, 0, 1, 0, DNS_QUERY_FORMERR, "NSCOUNT 1"},
        {0x0100, 1, 0, 0, 2, DNS_QUERY_FORMERR, "ARCOUNT 2"},
        {0x0100, 1, 0, 0, 1, DNS_QUERY_FORMERR, "ARCOUNT 1 and no record"},
    };
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        header(&m, 0x4242, heads[i].flags, heads[i].qd, heads[i].an, heads[i].ns, heads[i].ar);
        question(&m, "a.test", DNS_TYPE_A, 1);
        if (heads[i].qd == 2)
            question(&m, "b.test", DNS_TYPE_A, 1);
        enum dns_query_result r = parse(&m, &q);
        ok(r == heads[i].want && (r == DNS_QUERY_DROP || q.id == 0x4242), "%s: %s", heads[i].what,
           dnsmsg_query_result_name(r));
    }

    glibc_query(&m, "version.bind", DNS_TYPE_TXT);
    set16(&m, m.n - 2, 3);
    ok(parse(&m, &q) == DNS_QUERY_NOTIMP && q.has_question, "class CH: NOTIMP");
    set16(&m, m.n - 2, 255);
    ok(parse(&m, &q) == DNS_QUERY_NOTIMP, "class ANY: NOTIMP");

    header(&m, 5, 0x0100, 1, 0, 0, 1);
    question(&m, "a.test", DNS_TYPE_A, 1);
    opt(&m, 1232, 0, 1, 0);
    ok(parse(&m, &q) == DNS_QUERY_BADVERS && q.edns && q.edns_version == 1,
       "EDNS version 1: BADVERS");

    header(&m, 5, 0x0100, 1, 0, 0, 1); /* a TSIG where the OPT would be */
    question(&m, "a.test", DNS_TYPE_A, 1);
    name(&m, "key.test");
    rr_tail(&m, 250, 0, "", 0);
    ok(parse(&m, &q) == DNS_QUERY_FORMERR, "an additional record other than OPT: FORMERR");

    header(&m, 5, 0x0100, 1, 0, 0, 1);
    question(&m, "a.test", DNS_TYPE_A, 1);
    name(&m, "a.test");
    rr_tail(&m, DNS_TYPE_OPT, 0, "", 0);
    ok(parse(&m, &q) == DNS_QUERY_FORMERR, "an OPT not owned by the root: FORMERR");

    header(&m, 5, 0x0100, 1, 0, 0, 1);
    question(&m, "a.test", DNS_TYPE_A, 1);
    u8(&m, 0);
    rr_tail(&m, DNS_TYPE_OPT, 0,
            "\x00\x0a\x00\x09"
            "12345678",
            12);
    ok(parse(&m, &q) == DNS_QUERY_FORMERR && !q.edns,
       "an EDNS option longer than the OPT: FORMERR");

    header(&m, 5, 0x0100, 1, 0, 0, 1);
    question(&m, "a.test", DNS_TYPE_A, 1);
    opt(&m, 1232, 0, 0, 0);
    set16(&m, m.n - 2, 4);
    ok(parse(&m, &q) == DNS_QUERY_FORMERR, "an OPT's rdata past the end: FORMERR");
}

/* The reply parsed as an upstream answer to q. */
static int reparse(const uint8_t *b, int len, const struct dns_query *q, struct dns_addr *out,
                   size_t cap, size_t *n, uint32_t *ttl)
{
    return dnsmsg_parse_answer(b, len < 0 ? 0 : (size_t)len, q->id, q->name, q->qtype, out, cap, n,
                               ttl);
}

static void reply_checks(void)
{
    struct msg m;
    struct dns_query q;
    uint8_t b[2048];
    glibc_query(&m, "Evil.Test", DNS_TYPE_A);
    parse(&m, &q);
    int len = dnsmsg_reply_error(&q, DNS_RCODE_REFUSED, b, sizeof(b));
    static const uint8_t refused[] = {0xbe, 0xef, 0x81, 0x85, 0,   1,   0,   0,   0,
                                      0,    0,    0,    4,    'E', 'v', 'i', 'l', 4,
                                      'T',  'e',  's',  't',  0,   0,   1,   0,   1};
    ok(len == (int)sizeof(refused) && memcmp(b, refused, sizeof(refused)) == 0,
       "REFUSED: QR RD RA, AA clear, the question as asked, nothing else (%d bytes)", len);
    int shorter = 1;
    for (size_t cap = 0; cap < sizeof(refused); cap++)
        shorter &= dnsmsg_reply_error(&q, DNS_RCODE_REFUSED, b, cap) == -1;
    ok(shorter && dnsmsg_reply_error(&q, DNS_RCODE_REFUSED, b, sizeof(refused)) == len,
       "a buffer a byte short: -1; exactly the size: the reply");
    struct dns_addr a[4];
    size_t n;
    uint32_t ttl;
    len = dnsmsg_reply_error(&q, DNS_RCODE_NXDOMAIN, b, sizeof(b));
    ok(reparse(b, len, &q, a, 4, &n, &ttl) == DNS_RCODE_NXDOMAIN && n == 0,
       "NXDOMAIN parses back as an answer to the query");
    ok(dnsmsg_parse_query(b, (size_t)len, &q) == DNS_QUERY_DROP, "and as a query it is dropped");
    glibc_query(&m, "Evil.Test", DNS_TYPE_A);
    parse(&m, &q);
    ok(dnsmsg_reply_error(&q, DNS_RCODE_BADVERS, b, sizeof(b)) == -1 &&
           dnsmsg_reply_error(&q, -1, b, sizeof(b)) == -1,
       "BADVERS without EDNS0, or a negative rcode: -1");
    int codes[] = {DNS_RCODE_FORMERR, DNS_RCODE_SERVFAIL, DNS_RCODE_NOTIMP};
    int each = 1;
    for (size_t i = 0; i < 3; i++) {
        len = dnsmsg_reply_error(&q, codes[i], b, sizeof(b));
        each &= len == 27 && (b[3] & 0x0f) == codes[i];
    }
    ok(each, "FORMERR, SERVFAIL, NOTIMP in the header's rcode");

    dig_query(&m, "pypi.org", DNS_TYPE_A);
    parse(&m, &q);
    len = dnsmsg_reply_error(&q, DNS_RCODE_REFUSED, b, sizeof(b));
    static const uint8_t opt_rr[] = {0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0};
    ok(len == 12 + 14 + 11 && b[11] == 1 && b[2] == 0x81 && b[3] == 0x85 &&
           memcmp(b + len - 11, opt_rr, 11) == 0,
       "to an EDNS0 query: an OPT at 1232, no cookie, DO clear");

    header(&m, 5, 0x0000, 1, 0, 0, 1);
    question(&m, "a.test", DNS_TYPE_A, 1);
    opt(&m, 1232, 0, 1, 1);
    parse(&m, &q);
    len = dnsmsg_reply_error(&q, DNS_RCODE_BADVERS, b, sizeof(b));
    ok(len > 0 && (b[3] & 0x0f) == 0 && b[len - 11 + 5] == 1 && b[len - 11 + 6] == 0 &&
           b[len - 11 + 7] == 0 && (b[2] & 0x01) == 0,
       "BADVERS: 0 in the header, 1 in the OPT's extended rcode, version 0, DO and RD clear");

    header(&m, 0x77, 0x0100, 2, 0, 0, 0);
    question(&m, "a.test", DNS_TYPE_A, 1);
    ok(parse(&m, &q) == DNS_QUERY_FORMERR &&
           dnsmsg_reply_error(&q, DNS_RCODE_FORMERR, b, sizeof(b)) == 12 && b[0] == 0 &&
           b[1] == 0x77 && b[5] == 0 && b[3] == 0x81,
       "FORMERR before the question was read: the header alone, QDCOUNT 0");
    ok(dnsmsg_reply_addrs(&q, NULL, 0, 60, b, sizeof(b)) == -1, "no addresses without a question");
}

static void addr4(struct dns_addr *a, uint8_t x, uint8_t y, uint8_t z, uint8_t w)
{
    memset(a, 0, sizeof(*a));
    a->family = AF_INET;
    a->addr[0] = x;
    a->addr[1] = y;
    a->addr[2] = z;
    a->addr[3] = w;
}

static void addr6(struct dns_addr *a, uint8_t last)
{
    memset(a, 0, sizeof(*a));
    a->family = AF_INET6;
    a->addr[0] = 0x20;
    a->addr[1] = 0x01;
    a->addr[2] = 0x0d;
    a->addr[3] = 0xb8;
    a->addr[15] = last;
}

static void reply_addrs_checks(void)
{
    struct msg m;
    struct dns_query q;
    uint8_t b[4096];
    struct dns_addr in[3], out[8];
    addr4(&in[0], 192, 0, 2, 1);
    addr6(&in[1], 1);
    addr4(&in[2], 198, 51, 100, 7);
    size_t n;
    uint32_t ttl;

    glibc_query(&m, "pypi.org", DNS_TYPE_A);
    parse(&m, &q);
    int len = dnsmsg_reply_addrs(&q, in, 3, 300, b, sizeof(b));
    static const uint8_t first[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0x01, 0x2c, 0, 4, 192, 0, 2, 1};
    ok(len == 12 + 14 + 2 * 16 && b[7] == 2 && b[2] == 0x81 && b[3] == 0x80 &&
           memcmp(b + 26, first, 16) == 0,
       "A: the two IPv4 addresses, owned by a pointer to the question, TTL 300 (%d bytes)", len);
    int r = reparse(b, len, &q, out, 8, &n, &ttl);
    ok(r == 0 && n == 2 && ttl == 300 && out[0].family == AF_INET &&
           memcmp(out[1].addr, in[2].addr, 4) == 0,
       "and they parse back as an answer (%d, %zu addresses)", r, n);

    glibc_query(&m, "pypi.org", DNS_TYPE_AAAA);
    parse(&m, &q);
    len = dnsmsg_reply_addrs(&q, in, 3, 60, b, sizeof(b));
    r = reparse(b, len, &q, out, 8, &n, &ttl);
    ok(len == 12 + 14 + 28 && r == 0 && n == 1 && out[0].family == AF_INET6 &&
           memcmp(out[0].addr, in[1].addr, 16) == 0 && ttl == 60,
       "AAAA: the IPv6 address alone");

    unsigned nodata[] = {DNS_TYPE_HTTPS, DNS_TYPE_SVCB,  DNS_TYPE_TXT, DNS_TYPE_MX,
                         DNS_TYPE_ANY,   DNS_TYPE_CNAME, DNS_TYPE_NS};
    for (size_t i = 0; i < sizeof(nodata) / sizeof(nodata[0]); i++) {
        dig_query(&m, "pypi.org", nodata[i]);
        parse(&m, &q);
        len = dnsmsg_reply_addrs(&q, in, 3, 60, b, sizeof(b));
        ok(len == 12 + 14 + 11 && b[6] == 0 && b[7] == 0 && (b[3] & 0x0f) == 0 &&
               reparse(b, len, &q, out, 8, &n, &ttl) == 0 && n == 0,
           "type %u: NOERROR with no records (NODATA)", nodata[i]);
    }

    struct dns_addr many[100];
    for (int i = 0; i < 100; i++)
        addr4(&many[i], 10, 0, 0, (uint8_t)i);
    glibc_query(&m, "pypi.org", DNS_TYPE_A);
    parse(&m, &q);
    len = dnsmsg_reply_addrs(&q, many, 30, 60, b, sizeof(b));
    ok(len == 12 + 14 + 30 * 16, "30 addresses fit in 512 (%d bytes)", len);
    len = dnsmsg_reply_addrs(&q, many, 31, 60, b, sizeof(b));
    ok(len == 12 + 14 && (b[2] & 0x02) && b[7] == 0 &&
           reparse(b, len, &q, out, 8, &n, &ttl) == DNS_ANSWER_TRUNCATED,
       "31 do not (522 bytes): TC and no answers, read back as truncated");
    dig_query(&m, "pypi.org", DNS_TYPE_A);
    parse(&m, &q);
    len = dnsmsg_reply_addrs(&q, many, 74, 60, b, sizeof(b));
    ok(len == 12 + 14 + 74 * 16 + 11 && !(b[2] & 0x02), "with EDNS0 at 1232: 74 fit (%d)", len);
    len = dnsmsg_reply_addrs(&q, many, 75, 60, b, sizeof(b));
    ok(len == 12 + 14 + 11 && (b[2] & 0x02) && b[11] == 1, "75 do not: TC, the OPT kept");
    len = dnsmsg_reply_addrs(&q, many, 10, 60, b, 100);
    ok(len == 12 + 14 + 11 && (b[2] & 0x02), "a cap under the client's size truncates too");
    ok(dnsmsg_reply_addrs(&q, many, 10, 60, b, 36) == -1, "a cap under the truncated reply: -1");
    q.udp_size = 65535; /* as for TCP */
    len = dnsmsg_reply_addrs(&q, many, 100, 60, b, sizeof(b));
    ok(len == 12 + 14 + 100 * 16 + 11 && !(b[2] & 0x02), "udp_size raised for TCP: 100 fit");
}

static void build_query_checks(void)
{
    uint8_t b[600];
    int len = dnsmsg_build_query(0x1234, "Example.COM.", DNS_TYPE_A, b, sizeof(b));
    static const uint8_t want[] = {
        0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1,  7,    'e',  'x', 'a', 'm', 'p', 'l', 'e',
        3,    'c',  'o',  'm',  0, 0, 1, 0, 1, 0, 0, 41, 0x04, 0xd0, 0,   0,   0,   0,   0,   0};
    ok(len == (int)sizeof(want) && memcmp(b, want, sizeof(want)) == 0,
       "our query: RD, lower case, EDNS0 at 1232, DO clear (%d bytes)", len);
    struct dns_query q;
    ok(dnsmsg_parse_query(b, (size_t)len, &q) == DNS_QUERY_OK &&
           strcmp(q.name, "example.com") == 0 && q.edns && q.udp_size == 1232,
       "and it parses as a query");
    ok(dnsmsg_build_query(1, "example.com", DNS_TYPE_A, b, sizeof(want) - 1) == -1,
       "a buffer a byte short: -1");
    char n[300];
    long_name(n, 253);
    ok(dnsmsg_build_query(1, n, DNS_TYPE_AAAA, b, sizeof(b)) == 12 + 255 + 4 + 11,
       "a name of 253 bytes");
    long_name(n, 254);
    const char *bad[] = {n, "a..b", ".a", "a b.test", "a.test..", "x\xc3\xa9.test", "1.2:3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ok(dnsmsg_build_query(1, bad[i], DNS_TYPE_A, b, sizeof(b)) == -1,
           "not a name we ask for: \"%.20s\"", bad[i]);
    char label[80];
    memset(label, 'c', 64);
    strcpy(label + 64, ".test");
    ok(dnsmsg_build_query(1, label, DNS_TYPE_A, b, sizeof(b)) == -1, "a label of 64 bytes: -1");
}

/*
 * An upstream answer for www.example.test A: the question, then a CNAME to cdn.example.net
 * (its owner a pointer to the question), two A records for cdn.example.net (owners pointing into
 * the CNAME's rdata), one for another name, and an OPT.
 */
static void cname_answer(struct msg *m)
{
    header(m, 0xabcd, 0x8180, 1, 4, 0, 1);
    question(m, "www.example.test", DNS_TYPE_A, 1);
    ptr(m, 12);
    u16(m, DNS_TYPE_CNAME);
    u16(m, 1);
    u32(m, 600);
    size_t rdlen_at = m->n;
    u16(m, 0);
    size_t target = m->n;
    name(m, "cdn.example.net");
    set16(m, rdlen_at, (unsigned)(m->n - target));
    ptr(m, (unsigned)target);
    rr_tail(m, DNS_TYPE_A, 120, "\xc0\x00\x02\x0a", 4);
    u8(m, 5);
    raw(m, "other", 5);
    ptr(m, (unsigned)target + 4); /* other.example.net */
    rr_tail(m, DNS_TYPE_A, 30, "\x0a\x00\x00\x01", 4);
    ptr(m, (unsigned)target);
    rr_tail(m, DNS_TYPE_A, 300, "\xc0\x00\x02\x0b", 4);
    opt(m, 1232, 0, 0, 0);
}

static uint16_t get_id(const struct msg *m)
{
    return (uint16_t)(m->b[0] << 8 | m->b[1]);
}

static int answer(const struct msg *m, const char *qname, unsigned qtype, struct dns_addr *out,
                  size_t cap, size_t *n, uint32_t *ttl)
{
    return dnsmsg_parse_answer(m->b, m->n, get_id(m), qname, (uint16_t)qtype, out, cap, n, ttl);
}

static void answer_checks(void)
{
    struct msg m;
    struct dns_addr out[8];
    size_t n;
    uint32_t ttl;
    cname_answer(&m);
    int r = answer(&m, "www.example.test", DNS_TYPE_A, out, 8, &n, &ttl);
    ok(r == 0 && n == 2 && out[0].family == AF_INET &&
           memcmp(out[0].addr, "\xc0\x00\x02\x0a", 4) == 0 &&
           memcmp(out[1].addr, "\xc0\x00\x02\x0b", 4) == 0 && ttl == 120,
       "CNAME to two A records: both, the other name's left out, the smallest TTL (%d, %zu, %u)", r,
       n, ttl);
    ok(answer(&m, "WWW.Example.Test.", DNS_TYPE_A, out, 8, &n, &ttl) == 0 && n == 2,
       "the question compares without case");
    ok(answer(&m, "www.example.test", DNS_TYPE_A, out, 1, &n, &ttl) == 0 && n == 1,
       "no more than cap addresses");
    ok(answer(&m, "other.example.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_NOT_OURS &&
           answer(&m, "www.example.test", DNS_TYPE_AAAA, out, 8, &n, &ttl) == DNS_ANSWER_NOT_OURS &&
           dnsmsg_parse_answer(m.b, m.n, 0xabce, "www.example.test", DNS_TYPE_A, out, 8, &n,
                               &ttl) == DNS_ANSWER_NOT_OURS,
       "another name, type or id: not ours");
    m.b[2] &= 0x7f;
    ok(answer(&m, "www.example.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_NOT_OURS,
       "QR clear: not ours");
    m.b[2] |= 0x80 | 0x02;
    ok(answer(&m, "www.example.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_TRUNCATED,
       "TC: truncated");
    m.b[2] &= (uint8_t)~0x02;
    m.b[3] = 0x83;
    ok(answer(&m, "www.example.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_RCODE_NXDOMAIN && n == 2,
       "the rcode comes back (NXDOMAIN)");
    m.b[3] = 0x80;
    m.b[m.n - 11 + 5] = 1; /* the OPT's extended rcode */
    ok(answer(&m, "www.example.test", DNS_TYPE_A, out, 8, &n, &ttl) == 16,
       "an OPT's extended rcode counts");

    cname_answer(&m);
    size_t full = m.n;
    int bad = 1;
    for (size_t len = 0; len < full; len++) {
        r = dnsmsg_parse_answer(m.b, len, 0xabcd, "www.example.test", DNS_TYPE_A, out, 8, &n, &ttl);
        bad &= r < 0 && n == 0 && ttl == 0;
        if (len >= 12 + 22 && r != DNS_ANSWER_MALFORMED)
            bad = 0;
    }
    ok(bad, "every truncation: not ours before the question ends, malformed after (%zu)", full);
    m.b[m.n++] = 0;
    ok(answer(&m, "www.example.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_MALFORMED,
       "a byte after the last record: malformed");

    /* a CNAME chain written backwards: c -> d is listed before b -> c before a -> b */
    header(&m, 1, 0x8180, 1, 4, 0, 0);
    question(&m, "a.test", DNS_TYPE_AAAA, 1);
    name(&m, "C.test");
    rr_tail(&m, DNS_TYPE_CNAME, 50,
            "\x01"
            "d\x04test",
            8);
    name(&m, "b.test");
    rr_tail(&m, DNS_TYPE_CNAME, 40,
            "\x01"
            "c\x04test",
            8);
    ptr(&m, 12);
    rr_tail(&m, DNS_TYPE_CNAME, 60,
            "\x01"
            "B\x04TEST",
            8);
    name(&m, "d.test");
    rr_tail(&m, DNS_TYPE_AAAA, 70, "\x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x09", 16);
    r = answer(&m, "a.test", DNS_TYPE_AAAA, out, 8, &n, &ttl);
    ok(r == 0 && n == 1 && out[0].family == AF_INET6 && out[0].addr[15] == 9 && ttl == 40,
       "a chain of three CNAMEs in reverse order, names in mixed case, to an AAAA (%d, %zu, %u)", r,
       n, ttl);
    ok(answer(&m, "a.test", DNS_TYPE_AAAA, out, 0, &n, &ttl) == 0 && n == 0 && ttl == 0,
       "cap 0: no address, TTL 0");

    /* a -> b -> a */
    header(&m, 1, 0x8180, 1, 3, 0, 0);
    question(&m, "a.test", DNS_TYPE_A, 1);
    ptr(&m, 12);
    rr_tail(&m, DNS_TYPE_CNAME, 60,
            "\x01"
            "b\x04test",
            8);
    name(&m, "b.test");
    rr_tail(&m, DNS_TYPE_CNAME, 60,
            "\x01"
            "a\x04test",
            8);
    ptr(&m, 12);
    rr_tail(&m, DNS_TYPE_A, 60, "\x01\x02\x03\x04", 4);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == 0 && n == 0,
       "a CNAME loop: no address, and it ends");

    /* chains of exactly DNS_MAX_CNAMES hops and one more: h0 -> h1 -> ... -> hk, A at hk */
    for (int k = DNS_MAX_CNAMES; k <= DNS_MAX_CNAMES + 1; k++) {
        header(&m, 1, 0x8180, 1, (unsigned)k + 1, 0, 0);
        question(&m, "h0.test", DNS_TYPE_A, 1);
        for (int i = 0; i < k; i++) {
            char owner[16], target[16];
            snprintf(owner, sizeof(owner), "h%d.test", i);
            snprintf(target, sizeof(target), "h%d.test", i + 1);
            name(&m, owner);
            struct msg t = {.n = 0};
            name(&t, target);
            rr_tail(&m, DNS_TYPE_CNAME, 60, t.b, t.n);
        }
        char last[16];
        snprintf(last, sizeof(last), "h%d.test", k);
        name(&m, last);
        rr_tail(&m, DNS_TYPE_A, 60, "\x01\x02\x03\x04", 4);
        r = answer(&m, "h0.test", DNS_TYPE_A, out, 8, &n, &ttl);
        ok(r == 0 && n == (k == DNS_MAX_CNAMES ? 1u : 0u), "a chain of %d CNAMEs: %zu address", k,
           n);
    }

    header(&m, 1, 0x8180, 1, 2, 0, 0);
    question(&m, "a.test", DNS_TYPE_A, 1);
    ptr(&m, 12);
    u16(&m, DNS_TYPE_A);
    u16(&m, 3); /* class CH */
    u32(&m, 60);
    u16(&m, 4);
    raw(&m, "\x01\x01\x01\x01", 4);
    ptr(&m, 12);
    rr_tail(&m, DNS_TYPE_A, 0x80000000u, "\x02\x02\x02\x02", 4);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == 0 && n == 1 && out[0].addr[0] == 2 &&
           ttl == 0,
       "a record of class CH ignored; a TTL with the top bit set is 0");

    static const struct {
        const char *what;
        unsigned type;
        const char *rdata;
        size_t rdlen;
    } broken[] = {
        {"an A of 5 bytes", DNS_TYPE_A, "\x01\x02\x03\x04\x05", 5},
        {"an A of 3 bytes", DNS_TYPE_A, "\x01\x02\x03", 3},
        {"an AAAA of 4 bytes", DNS_TYPE_AAAA, "\x01\x02\x03\x04", 4},
        {"a CNAME with a byte after its name", DNS_TYPE_CNAME,
         "\x01"
         "b\0x",
         4},
        {"a CNAME cut short", DNS_TYPE_CNAME,
         "\x01"
         "b",
         2},
        {"a CNAME with a forward pointer", DNS_TYPE_CNAME, "\xc0\xff", 2},
    };
    for (size_t i = 0; i < sizeof(broken) / sizeof(broken[0]); i++) {
        header(&m, 1, 0x8180, 1, 1, 0, 0);
        question(&m, "a.test", DNS_TYPE_A, 1);
        ptr(&m, 12);
        rr_tail(&m, broken[i].type, 60, broken[i].rdata, broken[i].rdlen);
        ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_MALFORMED,
           "%s: malformed", broken[i].what);
    }
    header(&m, 1, 0x8180, 1, 1, 0, 0);
    question(&m, "a.test", DNS_TYPE_A, 1);
    ptr(&m, 12);
    rr_tail(&m, DNS_TYPE_A, 60, "\x01\x02\x03\x04", 4);
    set16(&m, m.n - 6, 5);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_MALFORMED,
       "an RDLENGTH past the end: malformed");
    header(&m, 1, 0x8180, 1, 0, 0, 2);
    question(&m, "a.test", DNS_TYPE_A, 1);
    opt(&m, 1232, 0, 0, 0);
    opt(&m, 1232, 0, 0, 0);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_MALFORMED,
       "two OPT records: malformed");
    header(&m, 1, 0x8180, 1, 0, 0, 0);
    question(&m, "a.test", DNS_TYPE_A, 1);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == 0 && n == 0, "NODATA: 0, nothing");
    header(&m, 1, 0x8185, 0, 0, 0, 0);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_NOT_OURS,
       "a REFUSED without the question: not ours");
    ok(dnsmsg_parse_answer(m.b, m.n, 1, "a..test", DNS_TYPE_A, out, 8, &n, &ttl) ==
           DNS_ANSWER_NOT_OURS,
       "not a name we could have asked: not ours");
}

/* An answer whose A record's owner is reached through `jumps` pointers, each before the last. */
static void jumps_answer(struct msg *m, int jumps)
{
    header(m, 1, 0x8180, 1, 2, 0, 0);
    question(m, "a.test", DNS_TYPE_A, 1);
    ptr(m, 12);
    u16(m, 99); /* a type we skip, its rdata a row of pointers */
    u16(m, 1);
    u32(m, 60);
    u16(m, (unsigned)(jumps - 1) * 2);
    unsigned prev = 12;
    for (int i = 0; i < jumps - 1; i++) {
        unsigned here = (unsigned)m->n;
        ptr(m, prev);
        prev = here;
    }
    ptr(m, prev);
    rr_tail(m, DNS_TYPE_A, 60, "\x01\x02\x03\x04", 4);
}

/* An answer whose second record's owner is a label of `first` bytes and a pointer to three
 * labels of 63 (193 bytes with the root): 1 + first + 193 bytes on the wire. */
static void long_owner(struct msg *m, size_t first)
{
    char lbl[64];
    memset(lbl, 'z', sizeof(lbl));
    header(m, 1, 0x8180, 1, 2, 0, 0);
    question(m, "a.test", DNS_TYPE_A, 1);
    ptr(m, 12);
    u16(m, 99);
    u16(m, 1);
    u32(m, 60);
    u16(m, 193);
    size_t start = m->n;
    for (int i = 0; i < 3; i++) {
        u8(m, 63);
        raw(m, lbl, 63);
    }
    u8(m, 0);
    u8(m, (unsigned)first);
    raw(m, lbl, first);
    ptr(m, (unsigned)start);
    rr_tail(m, 99, 60, "", 0);
}

static void pointer_checks(void)
{
    struct msg m;
    struct dns_addr out[8];
    size_t n;
    uint32_t ttl;
    jumps_answer(&m, DNS_MAX_JUMPS);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == 0 && n == 1,
       "an owner %d pointers away", DNS_MAX_JUMPS);
    jumps_answer(&m, DNS_MAX_JUMPS + 1);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_MALFORMED,
       "%d pointers: malformed", DNS_MAX_JUMPS + 1);

    static const struct {
        const char *what;
        unsigned target; /* of the answer's owner pointer, at offset 24 */
        const char *prefix;
        size_t prefix_len;
    } owners[] = {
        {"a pointer to itself", 24, "", 0},
        {"a pointer forwards", 26, "", 0},
        {"a pointer past the end", 0x3fff, "", 0},
        {"a pointer into the header", 4, "", 0},
        {"a label then a pointer to that label", 24, "\x01x", 2},
    };
    for (size_t i = 0; i < sizeof(owners) / sizeof(owners[0]); i++) {
        header(&m, 1, 0x8180, 1, 1, 0, 0);
        question(&m, "a.test", DNS_TYPE_A, 1);
        raw(&m, owners[i].prefix, owners[i].prefix_len);
        ptr(&m, owners[i].target);
        rr_tail(&m, DNS_TYPE_A, 60, "\x01\x02\x03\x04", 4);
        ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_MALFORMED,
           "%s: malformed", owners[i].what);
    }

    /* Pointers each before themselves that still loop: at X, "b" and a pointer back to X; the
     * owner points at that pointer. Every jump must land before the last one, so it ends. */
    header(&m, 1, 0x8180, 1, 2, 0, 0);
    question(&m, "a.test", DNS_TYPE_A, 1);
    ptr(&m, 12);
    unsigned x = (unsigned)m.n + 10;
    uint8_t chase[] = {1, 'b', 0xc0, (uint8_t)x};
    rr_tail(&m, 99, 60, chase, sizeof(chase));
    ptr(&m, x + 2);
    rr_tail(&m, DNS_TYPE_A, 60, "\x01\x02\x03\x04", 4);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_MALFORMED,
       "two pointers chasing each other backwards: malformed");

    long_owner(&m, 61);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == 0,
       "a name of 255 bytes on the wire, through a pointer");
    long_owner(&m, 62);
    ok(answer(&m, "a.test", DNS_TYPE_A, out, 8, &n, &ttl) == DNS_ANSWER_MALFORMED,
       "one more byte (256): malformed");
}

int main(void)
{
    query_ok_checks();
    query_name_checks();
    query_bad_checks();
    reply_checks();
    reply_addrs_checks();
    build_query_checks();
    answer_checks();
    pointer_checks();
    return tap_done();
}
