/*
 * DNS messages for the sandboxes' resolver. A sandbox's lookups are untrusted bytes and a leak
 * channel, so the resolver reads exactly one kind of message from it (a standard query with one
 * question in class IN, optionally with EDNS0) and writes its replies itself: addresses it got
 * from its own upstream for allowed names, or an error. It never relays a sandbox's bytes and never
 * serves HTTPS or SVCB records (types 64, 65), whose ECH keys would hide the SNI from the proxy:
 * anything but A and AAAA gets an empty answer. The daemon's own queries to the configured
 * upstream and the answers to them are here too.
 *
 * Pure and bounded: no allocation, no sockets, no global state; names are at most 255 bytes on
 * the wire, compression pointers are followed a bounded number of times and only backwards, and
 * every output goes into a caller's buffer with a cap.
 */
#ifndef WR_DNSMSG_H
#define WR_DNSMSG_H

#include <stddef.h>
#include <stdint.h>

#define DNS_HEADER_LEN 12
/* A name's presentation form without the trailing dot; 255 bytes on the wire (RFC 1035 2.3.4). */
#define DNS_NAME_MAX 253
#define DNS_WIRE_NAME_MAX 255 /* length bytes, labels and the root's 0 */
#define DNS_LABEL_MAX 63
#define DNS_UDP_CLASSIC 512 /* a reply's limit for a client without EDNS0 (RFC 1035 4.2.1) */
/* The UDP size we advertise, upstream and to clients: no IP fragmentation on any path that
 * carries IPv6's minimum MTU (DNS flag day 2020). */
#define DNS_EDNS_UDP 1232
#define DNS_MAX_JUMPS 16 /* compression pointers followed in one name */
#define DNS_MAX_CNAMES 8 /* CNAME hops followed in one answer; a longer chain gives no address */

enum dns_type {
    DNS_TYPE_A = 1,
    DNS_TYPE_NS = 2,
    DNS_TYPE_CNAME = 5,
    DNS_TYPE_SOA = 6,
    DNS_TYPE_PTR = 12,
    DNS_TYPE_MX = 15,
    DNS_TYPE_TXT = 16,
    DNS_TYPE_AAAA = 28,
    DNS_TYPE_OPT = 41,
    DNS_TYPE_SVCB = 64,
    DNS_TYPE_HTTPS = 65,
    DNS_TYPE_ANY = 255,
};

#define DNS_CLASS_IN 1

enum dns_rcode {
    DNS_RCODE_NOERROR = 0,
    DNS_RCODE_FORMERR = 1,
    DNS_RCODE_SERVFAIL = 2,
    DNS_RCODE_NXDOMAIN = 3,
    DNS_RCODE_NOTIMP = 4,
    DNS_RCODE_REFUSED = 5,
    DNS_RCODE_BADVERS = 16, /* extended (EDNS0): only in a reply to a query with an OPT record */
};

/** A sandbox's query as read by dnsmsg_parse_query; which fields hold depends on the result. */
struct dns_query {
    uint16_t id;                      /* always, unless the result is DNS_QUERY_DROP */
    int rd;                           /* recursion desired: echoed in replies */
    int has_question;                 /* the question was read and is echoed in replies */
    uint8_t qwire[DNS_WIRE_NAME_MAX]; /* the name as asked, on the wire, its case kept */
    size_t qwire_len;
    char name[DNS_NAME_MAX + 1]; /* lower case, no trailing dot, "" for the root; a byte no host
                                    name has shows as '?' (DNS_QUERY_BADNAME) */
    uint16_t qtype, qclass;
    int edns; /* it had an OPT record: replies carry one */
    uint8_t edns_version;
    int do_bit;        /* DNSSEC OK; recorded, not echoed (we serve no signatures) */
    uint16_t udp_size; /* the largest reply the client takes over UDP: 512, or its OPT's size */
};

enum dns_query_result {
    DNS_QUERY_OK,
    DNS_QUERY_BADNAME, /* well formed, but the name has a byte outside [A-Za-z0-9_-]: no allowed
                          host has one; answer NXDOMAIN or REFUSED */
    DNS_QUERY_NOTIMP,  /* an opcode other than QUERY, or a class other than IN: answer NOTIMP */
    DNS_QUERY_BADVERS, /* an EDNS version other than 0: answer BADVERS */
    DNS_QUERY_FORMERR, /* malformed, but the id is known: answer FORMERR */
    DNS_QUERY_DROP,    /* shorter than a header, or a response: answer nothing */
};

/**
 * Reads a query from one UDP datagram (len bytes) into out: header (QR=0, OPCODE=0, one question,
 * no answer or authority records, at most one additional record which must be an OPT), the
 * question (no compression pointers, labels of 1 to 63 bytes, at most 255 bytes on the wire), the
 * OPT (root owner, well-formed options, ignored) and nothing after it. Never reads outside buf.
 * Returns a dns_query_result; out->id is set for all but DNS_QUERY_DROP and the question for
 * DNS_QUERY_OK and DNS_QUERY_BADNAME (and for the others when it was read before the fault).
 */
enum dns_query_result dnsmsg_parse_query(const uint8_t *buf, size_t len, struct dns_query *out);

/** A short name for a parse result, for logs. */
const char *dnsmsg_query_result_name(enum dns_query_result r);

/** An address in an answer: family AF_INET (4 bytes of addr used) or AF_INET6 (16). */
struct dns_addr {
    int family;
    uint8_t addr[16];
};

/**
 * Writes a reply to q carrying rcode and no records into buf (cap bytes): q's id, q's question if
 * it had one, RD echoed, RA set, AA clear, and an OPT (our UDP size, the extended rcode's high
 * bits) if q had one. rcode: a DNS_RCODE_*, above 15 only when q->edns. Returns the reply's length,
 * or -1 if cap is too small or rcode cannot be written.
 */
int dnsmsg_reply_error(const struct dns_query *q, int rcode, uint8_t *buf, size_t cap);

/**
 * Writes a NOERROR reply to q (parsed DNS_QUERY_OK) into buf (cap bytes): for an A question the
 * AF_INET addresses of addrs[0..n), for AAAA the AF_INET6 ones, each with ttl; for any other type
 * (HTTPS, SVCB, TXT, MX, ANY, ...) no records (NODATA). If the answers do not fit in the smaller
 * of cap and q->udp_size, the reply has the TC bit and no answers, so the client asks again over
 * TCP (give cap >= q->udp_size over UDP, 65535 over TCP). Returns the reply's length, or -1 if q
 * has no question or not even the truncated reply fits.
 */
int dnsmsg_reply_addrs(const struct dns_query *q, const struct dns_addr *addrs, size_t n,
                       uint32_t ttl, uint8_t *buf, size_t cap);

/**
 * Writes the daemon's own query for qname (presentation form, optional trailing dot, labels of
 * [A-Za-z0-9_-], written lower case) and qtype into buf (cap bytes): RD set, one question in class
 * IN, an OPT advertising DNS_EDNS_UDP. Returns the length, or -1 if qname is not such a name or cap
 * is too small.
 */
int dnsmsg_build_query(uint16_t id, const char *qname, uint16_t qtype, uint8_t *buf, size_t cap);

enum dns_answer_error {
    DNS_ANSWER_NOT_OURS = -1,  /* another id, not a response, or another question: ignore it */
    DNS_ANSWER_MALFORMED = -2, /* ours, but broken: give up on this upstream reply */
    DNS_ANSWER_TRUNCATED = -3, /* ours, with the TC bit: ask again over TCP */
};

/**
 * Reads an upstream's answer (len bytes) to our query id for qname and qtype (as given to
 * dnsmsg_build_query). Checks the id, QR, the echoed question (names compare case-insensitively)
 * and every record's bounds; follows CNAMEs from qname through the answer section, at most
 * DNS_MAX_CNAMES hops, then stores up to cap records of type qtype (A or AAAA, class IN) owned by
 * the final name into out, their count in *n. *min_ttl is the smallest TTL of the CNAMEs followed
 * and the addresses stored (0 if none; TTLs above 2^31-1 count as 0). Compression pointers must
 * point backwards, each before the last, at most DNS_MAX_JUMPS per name.
 * Returns the rcode (0 to 4095, extended by an OPT record), or a negative dns_answer_error;
 * *n and *min_ttl are 0 unless the rcode is returned.
 */
int dnsmsg_parse_answer(const uint8_t *buf, size_t len, uint16_t id, const char *qname,
                        uint16_t qtype, struct dns_addr *out, size_t cap, size_t *n,
                        uint32_t *min_ttl);

#endif
