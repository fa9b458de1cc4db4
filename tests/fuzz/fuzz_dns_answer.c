/*
 * Fuzz target: an upstream's answer to the daemon's own query (net/dnsmsg.h). Input: one byte
 * choosing the type asked (even: A, odd: AAAA), the name asked and a NUL byte, then the answer
 * (its first two bytes serve as the id we expect). Whatever the answer, the parse must not read
 * outside it or loop, must give no more addresses than asked and only of the asked family, must
 * refuse it under another id, and what it found must survive a round trip: our query for the name
 * parses as a sandbox's query, and our reply with those addresses reads back the same.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "net/dnsmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CAP 8

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint16_t qtype = data[0] % 2 ? DNS_TYPE_AAAA : DNS_TYPE_A;
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    if (!nul || (size_t)(nul - data) > DNS_NAME_MAX + 2)
        return 0;
    char qname[DNS_NAME_MAX + 3];
    memcpy(qname, data + 1, (size_t)(nul - data - 1));
    qname[nul - data - 1] = '\0';
    const uint8_t *msg = nul + 1;
    size_t len = size - (size_t)(msg - data);
    uint16_t id = len >= 2 ? (uint16_t)(msg[0] << 8 | msg[1]) : 0;

    struct dns_addr out[CAP];
    size_t n = 99;
    uint32_t ttl = 99;
    int r = dnsmsg_parse_answer(msg, len, id, qname, qtype, out, CAP, &n, &ttl);
    if (r < 0) {
        check(n == 0 && ttl == 0 &&
              (r == DNS_ANSWER_NOT_OURS || r == DNS_ANSWER_MALFORMED || r == DNS_ANSWER_TRUNCATED));
        return 0;
    }
    check(r <= 4095 && n <= CAP && ttl <= 0x7fffffffu && (n > 0 || ttl == 0));
    int family = qtype == DNS_TYPE_A ? AF_INET : AF_INET6;
    for (size_t i = 0; i < n; i++)
        check(out[i].family == family);
    size_t n2;
    uint32_t ttl2;
    check(dnsmsg_parse_answer(msg, len, (uint16_t)(id + 1), qname, qtype, out, CAP, &n2, &ttl2) ==
          DNS_ANSWER_NOT_OURS);

    /* The round trip: our query, read as a sandbox's, and our reply with what we found. */
    static uint8_t q[600], reply[2048];
    int qlen = dnsmsg_build_query(id, qname, qtype, q, sizeof(q));
    check(qlen > 0);
    struct dns_query parsed;
    check(dnsmsg_parse_query(q, (size_t)qlen, &parsed) == DNS_QUERY_OK && parsed.id == id &&
          parsed.qtype == qtype && parsed.edns && parsed.udp_size == DNS_EDNS_UDP);
    int rlen = dnsmsg_reply_addrs(&parsed, out, n, ttl, reply, sizeof(reply));
    check(rlen > 0 && !(reply[2] & 0x02));
    struct dns_addr back[CAP];
    check(dnsmsg_parse_answer(reply, (size_t)rlen, id, parsed.name, qtype, back, CAP, &n2, &ttl2) ==
              0 &&
          n2 == n && ttl2 == ttl);
    for (size_t i = 0; i < n; i++)
        check(back[i].family == out[i].family && memcmp(back[i].addr, out[i].addr, 16) == 0);
    return 0;
}
