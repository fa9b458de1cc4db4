/*
 * Fuzz target: a sandbox's DNS query (net/dnsmsg.h), the bytes of one UDP datagram. Whatever
 * they are, the parse must not read outside them, an OK query's name must be one the resolver can
 * check (lower case, labels of 1 to 63 bytes of [a-z0-9_-], at most 253 in all), and every reply
 * we build to it must fit the client's size, be dropped if fed back to us as a query, and read
 * back as an answer to that query with the same id, question and addresses.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "net/dnsmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static int name_ok(const char *name)
{
    size_t n = strlen(name), label = 0;
    if (n > DNS_NAME_MAX || (n > 0 && (name[0] == '.' || name[n - 1] == '.')))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (c == '.') {
            if (label == 0)
                return 0;
            label = 0;
            continue;
        }
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_') ||
            ++label > DNS_LABEL_MAX)
            return 0;
    }
    return 1;
}

static int rcode_for(enum dns_query_result r)
{
    switch (r) {
    case DNS_QUERY_OK: return DNS_RCODE_REFUSED; /* as for a name the policy does not allow */
    case DNS_QUERY_BADNAME: return DNS_RCODE_NXDOMAIN;
    case DNS_QUERY_NOTIMP: return DNS_RCODE_NOTIMP;
    case DNS_QUERY_BADVERS: return DNS_RCODE_BADVERS;
    case DNS_QUERY_FORMERR: return DNS_RCODE_FORMERR;
    case DNS_QUERY_DROP: break;
    }
    return -1;
}

/* Addresses answered with: some of each family, more than fit in 512 bytes when n is large. */
static size_t make_addrs(struct dns_addr *a, size_t n, const uint8_t *data, size_t size)
{
    for (size_t i = 0; i < n; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].family = i % 3 == 2 ? AF_INET6 : AF_INET;
        for (size_t k = 0; k < 16; k++)
            a[i].addr[k] = size ? data[(i * 16 + k) % size] : (uint8_t)k;
    }
    return n;
}

static void check_addrs_reply(const struct dns_query *q, const struct dns_addr *a, size_t na,
                              uint8_t *buf, size_t cap)
{
    int len = dnsmsg_reply_addrs(q, a, na, 300, buf, cap);
    size_t least = DNS_HEADER_LEN + q->qwire_len + 4 + (q->edns ? 11 : 0);
    if (least > cap) {
        check(len == -1);
        return;
    }
    check(len >= DNS_HEADER_LEN && (size_t)len <= q->udp_size && (size_t)len <= cap);
    struct dns_query again;
    check(dnsmsg_parse_query(buf, (size_t)len, &again) == DNS_QUERY_DROP);
    int family = q->qtype == DNS_TYPE_A ? AF_INET : q->qtype == DNS_TYPE_AAAA ? AF_INET6 : 0;
    size_t want = 0;
    for (size_t i = 0; family && i < na; i++)
        want += a[i].family == family;
    struct dns_addr out[64];
    size_t n;
    uint32_t ttl;
    int r = dnsmsg_parse_answer(buf, (size_t)len, q->id, q->name, q->qtype, out, 64, &n, &ttl);
    if (buf[2] & 0x02) { /* TC */
        check(r == DNS_ANSWER_TRUNCATED && want > 0);
        return;
    }
    check(r == DNS_RCODE_NOERROR && n == want && (n == 0 || ttl == 300));
    for (size_t i = 0, k = 0; i < na && k < n; i++) {
        if (a[i].family != family)
            continue;
        check(out[k].family == family &&
              memcmp(out[k].addr, a[i].addr, family == AF_INET ? 4 : 16) == 0);
        k++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dns_query q;
    enum dns_query_result r = dnsmsg_parse_query(data, size, &q);
    if (r == DNS_QUERY_DROP)
        return 0;
    check(size >= DNS_HEADER_LEN && q.id == (data[0] << 8 | data[1]));
    check(q.udp_size >= DNS_UDP_CLASSIC && q.qwire_len <= DNS_WIRE_NAME_MAX);
    check(strlen(q.name) <= DNS_NAME_MAX);
    if (r == DNS_QUERY_OK) {
        check(q.has_question && name_ok(q.name) && q.qclass == DNS_CLASS_IN);
        check(!q.edns || q.edns_version == 0);
    }
    if (r == DNS_QUERY_BADNAME)
        check(q.has_question && strchr(q.name, '?') && q.qclass == DNS_CLASS_IN);

    static uint8_t buf[65536];
    int rcode = rcode_for(r);
    int len = dnsmsg_reply_error(&q, rcode, buf, sizeof(buf));
    check(len >= DNS_HEADER_LEN && (size_t)len <= DNS_UDP_CLASSIC);
    struct dns_query again;
    check(dnsmsg_parse_query(buf, (size_t)len, &again) == DNS_QUERY_DROP);
    check((buf[0] << 8 | buf[1]) == q.id);
    if (r == DNS_QUERY_OK) {
        struct dns_addr out[4];
        size_t n;
        uint32_t ttl;
        int back = dnsmsg_parse_answer(buf, (size_t)len, q.id, q.name, q.qtype, out, 4, &n, &ttl);
        check(back == rcode && n == 0 && ttl == 0);

        struct dns_addr a[90];
        check_addrs_reply(&q, a, make_addrs(a, 5, data, size), buf, q.udp_size);
        check_addrs_reply(&q, a, make_addrs(a, 90, data, size), buf, q.udp_size);
        check_addrs_reply(&q, a, make_addrs(a, 90, data, size), buf, 100);
    }
    return 0;
}
