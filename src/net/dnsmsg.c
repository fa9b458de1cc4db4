/*
 * DNS messages: see dnsmsg.h. Everything a sandbox sends is read with explicit bounds on every
 * access, and a name is only ever copied into a fixed 255-byte buffer; compression pointers (only
 * in upstream answers) must each point before the previous one, so following them ends.
 */
#include "net/dnsmsg.h"

#include <string.h>
#include <sys/socket.h>

#define FLAG_QR 0x8000
#define FLAG_OPCODE 0x7800
#define FLAG_TC 0x0200
#define FLAG_RD 0x0100
#define FLAG_RA 0x0080
#define FLAG_RCODE 0x000f

#define LABEL_PTR 0xc0  /* the top two bits of a length byte: 11 a pointer, 01 and 10 reserved */
#define RR_FIXED_LEN 10 /* type, class, TTL, RDLENGTH after a record's owner name */
#define OPT_DO 0x8000   /* in the low 16 bits of an OPT record's TTL */
#define TTL_MAX 0x7fffffffu /* RFC 2181 8: a TTL with the top bit set is read as 0 */
#define RCODE_MAX 4095      /* 4 bits in the header, 8 more in an OPT record */

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* An output buffer that stops taking bytes once one does not fit. */
struct out {
    uint8_t *p;
    size_t cap, len;
    int full;
};

static void put(struct out *o, const void *b, size_t n)
{
    if (o->full || n > o->cap - o->len) {
        o->full = 1;
        return;
    }
    memcpy(o->p + o->len, b, n);
    o->len += n;
}

static void put8(struct out *o, unsigned v)
{
    uint8_t b = (uint8_t)v;
    put(o, &b, 1);
}

static void put16(struct out *o, unsigned v)
{
    uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};
    put(o, b, 2);
}

static void put32(struct out *o, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    put(o, b, 4);
}

static int host_byte(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static uint8_t lower(uint8_t c)
{
    return c >= 'A' && c <= 'Z' ? (uint8_t)(c - 'A' + 'a') : c;
}

/* Two names on the wire, ASCII case ignored (length bytes are at most 63, below 'A'). */
static int name_eq(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    if (alen != blen)
        return 0;
    for (size_t i = 0; i < alen; i++)
        if (lower(a[i]) != lower(b[i]))
            return 0;
    return 1;
}

/*
 * Reads the name at *pos of msg[0..len) into wire (DNS_WIRE_NAME_MAX bytes, uncompressed, bytes
 * as they are), its length into *wlen, and moves *pos past it. With ptrs, compression pointers may
 * appear: each must point after the header and before the name's start or the previous pointer's
 * target (so no loop), at most DNS_MAX_JUMPS of them. Returns 0, or -1 if the name is malformed.
 */
static int read_name(const uint8_t *msg, size_t len, size_t *pos, int ptrs, uint8_t *wire,
                     size_t *wlen)
{
    size_t p = *pos, bound = *pos, n = 0, resume = 0;
    int jumps = 0;
    for (;;) {
        if (p >= len)
            return -1;
        uint8_t c = msg[p];
        if ((c & LABEL_PTR) == LABEL_PTR) {
            if (!ptrs || len - p < 2 || ++jumps > DNS_MAX_JUMPS)
                return -1;
            size_t target = (size_t)(c & ~LABEL_PTR) << 8 | msg[p + 1];
            if (target < DNS_HEADER_LEN || target >= bound)
                return -1;
            if (jumps == 1)
                resume = p + 2;
            bound = p = target;
            continue;
        }
        if (c & LABEL_PTR)
            return -1; /* extended (RFC 6891 obsoleted them) and reserved label types */
        if (c == 0) {
            wire[n++] = 0;
            break;
        }
        /* the label, its length byte, and room for the root's 0 */
        if (n + 1 + c + 1 > DNS_WIRE_NAME_MAX || len - p - 1 < c)
            return -1;
        memcpy(wire + n, msg + p, 1 + (size_t)c);
        n += 1 + (size_t)c;
        p += 1 + (size_t)c;
    }
    *wlen = n;
    *pos = jumps ? resume : p + 1;
    return 0;
}

/* A name on the wire in presentation form (lower case, no trailing dot, "" for the root) into
 * text (DNS_NAME_MAX + 1 bytes). Returns how many bytes outside [A-Za-z0-9_-] it had ('?' now). */
static int wire_to_text(const uint8_t *wire, size_t wlen, char *text)
{
    size_t i = 0, t = 0;
    int bad = 0;
    while (i < wlen && wire[i] != 0) {
        size_t l = wire[i++];
        if (t > 0)
            text[t++] = '.';
        for (size_t k = 0; k < l; k++, i++) {
            uint8_t c = wire[i];
            bad += !host_byte(c);
            text[t++] = host_byte(c) ? (char)lower(c) : '?';
        }
    }
    text[t] = '\0';
    return bad;
}

/* A name in presentation form (labels of [A-Za-z0-9_-], an optional trailing dot; "" or "." is
 * the root) on the wire, lower case, into wire (cap bytes). Returns its length, or -1. */
static int text_to_wire(const char *text, uint8_t *wire, size_t cap)
{
    size_t n = strlen(text);
    if (n > 0 && text[n - 1] == '.')
        n--;
    if (n > DNS_NAME_MAX || n + 2 > cap)
        return -1;
    size_t w = 0;
    if (n > 0) {
        size_t start = 0;
        for (size_t i = 0; i <= n; i++) {
            if (i < n && text[i] != '.')
                continue;
            size_t l = i - start;
            if (l == 0 || l > DNS_LABEL_MAX)
                return -1;
            wire[w++] = (uint8_t)l;
            for (size_t k = start; k < i; k++) {
                uint8_t c = (uint8_t)text[k];
                if (!host_byte(c))
                    return -1;
                wire[w++] = lower(c);
            }
            start = i + 1;
        }
    }
    wire[w++] = 0;
    return (int)w;
}

/* The OPT record at *pos (the one additional record a query may have) into q. Returns 0 or -1. */
static int read_opt(const uint8_t *msg, size_t len, size_t *pos, struct dns_query *q)
{
    size_t p = *pos;
    if (len - p < 1 + RR_FIXED_LEN || msg[p] != 0 || get16(msg + p + 1) != DNS_TYPE_OPT)
        return -1; /* not an OPT, or not owned by the root */
    uint16_t size = get16(msg + p + 3);
    uint32_t ttl = get32(msg + p + 5);
    size_t rdlen = get16(msg + p + 9);
    p += 1 + RR_FIXED_LEN;
    if (len - p < rdlen)
        return -1;
    for (size_t o = 0; o < rdlen;) { /* options: code, length, data; each must fit */
        if (rdlen - o < 4 || rdlen - o - 4 < get16(msg + p + o + 2))
            return -1;
        o += 4 + (size_t)get16(msg + p + o + 2);
    }
    q->edns = 1;
    q->edns_version = (uint8_t)(ttl >> 16);
    q->do_bit = (ttl & OPT_DO) != 0;
    q->udp_size = size > DNS_UDP_CLASSIC ? size : DNS_UDP_CLASSIC;
    *pos = p + rdlen;
    return 0;
}

enum dns_query_result dnsmsg_parse_query(const uint8_t *buf, size_t len, struct dns_query *out)
{
    memset(out, 0, sizeof(*out));
    out->udp_size = DNS_UDP_CLASSIC;
    if (len < DNS_HEADER_LEN)
        return DNS_QUERY_DROP;
    uint16_t flags = get16(buf + 2);
    if (flags & FLAG_QR)
        return DNS_QUERY_DROP; /* never answer an answer: two resolvers would loop */
    out->id = get16(buf);
    out->rd = (flags & FLAG_RD) != 0;
    if (flags & FLAG_OPCODE)
        return DNS_QUERY_NOTIMP;
    uint16_t arcount = get16(buf + 10);
    if (get16(buf + 4) != 1 || get16(buf + 6) != 0 || get16(buf + 8) != 0 || arcount > 1)
        return DNS_QUERY_FORMERR;
    size_t pos = DNS_HEADER_LEN;
    if (read_name(buf, len, &pos, 0, out->qwire, &out->qwire_len) < 0 || len - pos < 4)
        return DNS_QUERY_FORMERR;
    out->qtype = get16(buf + pos);
    out->qclass = get16(buf + pos + 2);
    pos += 4;
    out->has_question = 1;
    int bad = wire_to_text(out->qwire, out->qwire_len, out->name);
    if (arcount == 1 && read_opt(buf, len, &pos, out) < 0)
        return DNS_QUERY_FORMERR;
    /* Nothing may follow. Without an OPT that also holds a query to 12 + 255 + 4 bytes, well
     * under the 512 a UDP query without EDNS0 may have. */
    if (pos != len)
        return DNS_QUERY_FORMERR;
    if (out->edns && out->edns_version != 0)
        return DNS_QUERY_BADVERS;
    if (out->qclass != DNS_CLASS_IN)
        return DNS_QUERY_NOTIMP;
    return bad ? DNS_QUERY_BADNAME : DNS_QUERY_OK;
}

const char *dnsmsg_query_result_name(enum dns_query_result r)
{
    switch (r) {
    case DNS_QUERY_OK: return "ok";
    case DNS_QUERY_BADNAME: return "bad_name";
    case DNS_QUERY_NOTIMP: return "not_implemented";
    case DNS_QUERY_BADVERS: return "bad_edns_version";
    case DNS_QUERY_FORMERR: return "malformed";
    case DNS_QUERY_DROP: return "dropped";
    }
    return "unknown";
}

/* A reply's header, question, and where its answers go; the OPT comes last (put_opt). */
static void put_head(struct out *o, const struct dns_query *q, int rcode, int tc, size_t an)
{
    unsigned flags = FLAG_QR | FLAG_RA | (q->rd ? FLAG_RD : 0) | (tc ? FLAG_TC : 0) |
                     ((unsigned)rcode & FLAG_RCODE);
    put16(o, q->id);
    put16(o, flags);
    put16(o, q->has_question ? 1 : 0);
    put16(o, (unsigned)an);
    put16(o, 0);
    put16(o, q->edns ? 1 : 0);
    if (q->has_question) {
        put(o, q->qwire, q->qwire_len);
        put16(o, q->qtype);
        put16(o, q->qclass);
    }
}

static void put_opt(struct out *o, const struct dns_query *q, int rcode)
{
    if (!q->edns)
        return;
    put8(o, 0);
    put16(o, DNS_TYPE_OPT);
    put16(o, DNS_EDNS_UDP);
    put32(o, (uint32_t)(rcode >> 4) << 24); /* version 0, DO clear: we serve no signatures */
    put16(o, 0);
}

int dnsmsg_reply_error(const struct dns_query *q, int rcode, uint8_t *buf, size_t cap)
{
    if (rcode < 0 || rcode > RCODE_MAX || (rcode > FLAG_RCODE && !q->edns))
        return -1;
    struct out o = {buf, cap, 0, 0};
    put_head(&o, q, rcode, 0, 0);
    put_opt(&o, q, rcode);
    return o.full ? -1 : (int)o.len;
}

int dnsmsg_reply_addrs(const struct dns_query *q, const struct dns_addr *addrs, size_t n,
                       uint32_t ttl, uint8_t *buf, size_t cap)
{
    if (!q->has_question)
        return -1;
    int family = q->qtype == DNS_TYPE_A ? AF_INET : q->qtype == DNS_TYPE_AAAA ? AF_INET6 : 0;
    size_t rdlen = family == AF_INET ? 4 : 16, an = 0;
    for (size_t i = 0; family && i < n; i++)
        an += addrs[i].family == family;
    size_t need = DNS_HEADER_LEN + q->qwire_len + 4 + (q->edns ? 1 + RR_FIXED_LEN : 0) +
                  an * (2 + RR_FIXED_LEN + rdlen);
    size_t limit = cap < q->udp_size ? cap : q->udp_size;
    int tc = need > limit;
    struct out o = {buf, cap, 0, 0};
    put_head(&o, q, DNS_RCODE_NOERROR, tc, tc ? 0 : an);
    for (size_t i = 0; !tc && family && i < n; i++) {
        if (addrs[i].family != family)
            continue;
        put16(&o, LABEL_PTR << 8 | DNS_HEADER_LEN); /* the question's name */
        put16(&o, q->qtype);
        put16(&o, DNS_CLASS_IN);
        put32(&o, ttl);
        put16(&o, (unsigned)rdlen);
        put(&o, addrs[i].addr, rdlen);
    }
    put_opt(&o, q, DNS_RCODE_NOERROR);
    return o.full ? -1 : (int)o.len;
}

int dnsmsg_build_query(uint16_t id, const char *qname, uint16_t qtype, uint8_t *buf, size_t cap)
{
    uint8_t wire[DNS_WIRE_NAME_MAX];
    int wlen = text_to_wire(qname, wire, sizeof(wire));
    if (wlen < 0)
        return -1;
    struct out o = {buf, cap, 0, 0};
    put16(&o, id);
    put16(&o, FLAG_RD);
    put16(&o, 1);
    put16(&o, 0);
    put16(&o, 0);
    put16(&o, 1);
    put(&o, wire, (size_t)wlen);
    put16(&o, qtype);
    put16(&o, DNS_CLASS_IN);
    put8(&o, 0);
    put16(&o, DNS_TYPE_OPT);
    put16(&o, DNS_EDNS_UDP);
    put32(&o, 0);
    put16(&o, 0);
    return o.full ? -1 : (int)o.len;
}

/* A resource record's fixed part, read by read_rr. */
struct rr {
    uint8_t owner[DNS_WIRE_NAME_MAX];
    size_t owner_len;
    uint16_t type, class;
    uint32_t ttl;
    size_t rdata, rdlen; /* rdata's offset in the message */
};

static int read_rr(const uint8_t *msg, size_t len, size_t *pos, struct rr *rr)
{
    if (read_name(msg, len, pos, 1, rr->owner, &rr->owner_len) < 0 || len - *pos < RR_FIXED_LEN)
        return -1;
    const uint8_t *p = msg + *pos;
    rr->type = get16(p);
    rr->class = get16(p + 2);
    rr->ttl = get32(p + 4);
    if (rr->ttl > TTL_MAX)
        rr->ttl = 0;
    rr->rdlen = get16(p + 8);
    rr->rdata = *pos + RR_FIXED_LEN;
    if (len - rr->rdata < rr->rdlen)
        return -1;
    *pos = rr->rdata + rr->rdlen;
    return 0;
}

/* A CNAME's target: a name filling its rdata exactly. Returns 0 or -1. */
static int read_cname(const uint8_t *msg, size_t len, const struct rr *rr, uint8_t *wire,
                      size_t *wlen)
{
    size_t p = rr->rdata;
    if (read_name(msg, len, &p, 1, wire, wlen) < 0 || p != rr->rdata + rr->rdlen)
        return -1;
    return 0;
}

/*
 * Checks every record after the question (from pos: an answers, then the rest), their bounds,
 * A and AAAA sizes and CNAME targets in the answer section, and at most one OPT, whose extended
 * rcode bits go into *rcode. Returns 0, or -1 if malformed.
 */
static int check_records(const uint8_t *msg, size_t len, size_t pos, size_t an, size_t total,
                         int *rcode)
{
    struct rr rr;
    int opts = 0;
    for (size_t i = 0; i < total; i++) {
        if (read_rr(msg, len, &pos, &rr) < 0)
            return -1;
        if (i < an && rr.class == DNS_CLASS_IN) {
            uint8_t target[DNS_WIRE_NAME_MAX];
            size_t tlen;
            if ((rr.type == DNS_TYPE_A && rr.rdlen != 4) ||
                (rr.type == DNS_TYPE_AAAA && rr.rdlen != 16) ||
                (rr.type == DNS_TYPE_CNAME && read_cname(msg, len, &rr, target, &tlen) < 0))
                return -1;
        }
        if (rr.type == DNS_TYPE_OPT) {
            if (i < an || opts++ || rr.owner_len != 1)
                return -1; /* only one, in the additional section, owned by the root */
            /* the OPT's TTL holds flags, not a time: read it again as it was */
            *rcode |= (int)msg[rr.rdata - RR_FIXED_LEN + 4] << 4;
        }
    }
    return pos == len ? 0 : -1;
}

int dnsmsg_parse_answer(const uint8_t *buf, size_t len, uint16_t id, const char *qname,
                        uint16_t qtype, struct dns_addr *out, size_t cap, size_t *n,
                        uint32_t *min_ttl)
{
    *n = 0;
    *min_ttl = 0;
    uint8_t want[DNS_WIRE_NAME_MAX], qwire[DNS_WIRE_NAME_MAX];
    size_t qwire_len, pos = DNS_HEADER_LEN;
    int want_len = text_to_wire(qname, want, sizeof(want));
    if (want_len < 0 || len < DNS_HEADER_LEN || get16(buf) != id)
        return DNS_ANSWER_NOT_OURS;
    uint16_t flags = get16(buf + 2);
    if (!(flags & FLAG_QR) || get16(buf + 4) != 1 ||
        read_name(buf, len, &pos, 1, qwire, &qwire_len) < 0 || len - pos < 4 ||
        !name_eq(qwire, qwire_len, want, (size_t)want_len) || get16(buf + pos) != qtype ||
        get16(buf + pos + 2) != DNS_CLASS_IN)
        return DNS_ANSWER_NOT_OURS;
    pos += 4;
    if (flags & FLAG_OPCODE)
        return DNS_ANSWER_MALFORMED;
    if (flags & FLAG_TC)
        return DNS_ANSWER_TRUNCATED;
    size_t an = get16(buf + 6), total = an + get16(buf + 8) + get16(buf + 10);
    int rcode = flags & FLAG_RCODE;
    if (check_records(buf, len, pos, an, total, &rcode) < 0)
        return DNS_ANSWER_MALFORMED;

    /* From the asked name along CNAMEs in the answer section (in any order) to the final one. */
    uint8_t cur[DNS_WIRE_NAME_MAX];
    size_t cur_len = (size_t)want_len, hops = 0;
    uint32_t ttl = TTL_MAX;
    memcpy(cur, want, cur_len);
    struct rr rr;
    for (int found = 1; found;) {
        found = 0;
        size_t p = pos;
        for (size_t i = 0; i < an && !found; i++) {
            if (read_rr(buf, len, &p, &rr) < 0)
                return DNS_ANSWER_MALFORMED;
            if (rr.type != DNS_TYPE_CNAME || rr.class != DNS_CLASS_IN ||
                !name_eq(rr.owner, rr.owner_len, cur, cur_len))
                continue;
            if (++hops > DNS_MAX_CNAMES)
                return rcode; /* too long, or a loop: no address */
            if (read_cname(buf, len, &rr, cur, &cur_len) < 0)
                return DNS_ANSWER_MALFORMED;
            ttl = rr.ttl < ttl ? rr.ttl : ttl;
            found = 1;
        }
    }

    int family = qtype == DNS_TYPE_A ? AF_INET : qtype == DNS_TYPE_AAAA ? AF_INET6 : 0;
    size_t p = pos;
    for (size_t i = 0; family && i < an; i++) {
        if (read_rr(buf, len, &p, &rr) < 0)
            return DNS_ANSWER_MALFORMED;
        if (rr.type != qtype || rr.class != DNS_CLASS_IN ||
            !name_eq(rr.owner, rr.owner_len, cur, cur_len) || *n >= cap)
            continue;
        out[*n].family = family;
        memset(out[*n].addr, 0, sizeof(out[*n].addr));
        memcpy(out[*n].addr, buf + rr.rdata, rr.rdlen);
        (*n)++;
        ttl = rr.ttl < ttl ? rr.ttl : ttl;
    }
    *min_ttl = *n ? ttl : 0;
    return rcode;
}
