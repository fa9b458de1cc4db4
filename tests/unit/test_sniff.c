/*
 * The egress proxy's first-bytes parsers (net/sniff.h). TLS: a ClientHello captured from
 * `openssl s_client` and hellos built here, whole, cut at every byte, fragmented over records of
 * every small size, and broken one field at a time (lengths that overflow what encloses them,
 * names with NUL, '_' or '@', two names, two extensions). HTTP: request heads in every target
 * form, the lookalikes and disagreements a sandbox could use to reach one host while naming
 * another, and the request-smuggling shapes. Chunked bodies split anywhere, and where the next
 * request on a kept-alive connection starts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "net/netpolicy.h"
#include "net/sniff.h"
#include "tap.h"

/*
 * `openssl s_client -connect 127.0.0.1:PORT -servername pypi.org -alpn h2,http/1.1` (OpenSSL
 * 3.0.19), the bytes it sent to a listener on loopback: one record, TLS 1.3 with 1.2 fallback.
 */
static const uint8_t openssl_hello[] = {
    0x16, 0x03, 0x01, 0x01, 0x47, 0x01, 0x00, 0x01, 0x43, 0x03, 0x03, 0x43, 0xe2, 0xd2, 0x8d, 0x16,
    0xa4, 0x0b, 0x1c, 0xa0, 0x75, 0x61, 0xc2, 0xaa, 0x57, 0x3b, 0x1a, 0x71, 0x46, 0x84, 0xb3, 0x49,
    0x76, 0x2e, 0xab, 0xb3, 0x29, 0xdf, 0xa8, 0x3d, 0x25, 0x06, 0xd8, 0x20, 0x49, 0xe5, 0x71, 0xd1,
    0x49, 0x70, 0xf9, 0xec, 0x3b, 0xc3, 0xd3, 0xb0, 0xe7, 0x5d, 0xd6, 0xa0, 0xfc, 0x13, 0x79, 0x61,
    0xf8, 0x44, 0x52, 0xb4, 0x5e, 0xa7, 0x45, 0x8d, 0x87, 0x3d, 0x65, 0xb9, 0x00, 0x3e, 0x13, 0x02,
    0x13, 0x03, 0x13, 0x01, 0xc0, 0x2c, 0xc0, 0x30, 0x00, 0x9f, 0xcc, 0xa9, 0xcc, 0xa8, 0xcc, 0xaa,
    0xc0, 0x2b, 0xc0, 0x2f, 0x00, 0x9e, 0xc0, 0x24, 0xc0, 0x28, 0x00, 0x6b, 0xc0, 0x23, 0xc0, 0x27,
    0x00, 0x67, 0xc0, 0x0a, 0xc0, 0x14, 0x00, 0x39, 0xc0, 0x09, 0xc0, 0x13, 0x00, 0x33, 0x00, 0x9d,
    0x00, 0x9c, 0x00, 0x3d, 0x00, 0x3c, 0x00, 0x35, 0x00, 0x2f, 0x00, 0xff, 0x01, 0x00, 0x00, 0xbc,
    0x00, 0x00, 0x00, 0x0d, 0x00, 0x0b, 0x00, 0x00, 0x08, 0x70, 0x79, 0x70, 0x69, 0x2e, 0x6f, 0x72,
    0x67, 0x00, 0x0b, 0x00, 0x04, 0x03, 0x00, 0x01, 0x02, 0x00, 0x0a, 0x00, 0x16, 0x00, 0x14, 0x00,
    0x1d, 0x00, 0x17, 0x00, 0x1e, 0x00, 0x19, 0x00, 0x18, 0x01, 0x00, 0x01, 0x01, 0x01, 0x02, 0x01,
    0x03, 0x01, 0x04, 0x00, 0x23, 0x00, 0x00, 0x00, 0x10, 0x00, 0x0e, 0x00, 0x0c, 0x02, 0x68, 0x32,
    0x08, 0x68, 0x74, 0x74, 0x70, 0x2f, 0x31, 0x2e, 0x31, 0x00, 0x16, 0x00, 0x00, 0x00, 0x17, 0x00,
    0x00, 0x00, 0x0d, 0x00, 0x2a, 0x00, 0x28, 0x04, 0x03, 0x05, 0x03, 0x06, 0x03, 0x08, 0x07, 0x08,
    0x08, 0x08, 0x09, 0x08, 0x0a, 0x08, 0x0b, 0x08, 0x04, 0x08, 0x05, 0x08, 0x06, 0x04, 0x01, 0x05,
    0x01, 0x06, 0x01, 0x03, 0x03, 0x03, 0x01, 0x03, 0x02, 0x04, 0x02, 0x05, 0x02, 0x06, 0x02, 0x00,
    0x2b, 0x00, 0x09, 0x08, 0x03, 0x04, 0x03, 0x03, 0x03, 0x02, 0x03, 0x01, 0x00, 0x2d, 0x00, 0x02,
    0x01, 0x01, 0x00, 0x33, 0x00, 0x26, 0x00, 0x24, 0x00, 0x1d, 0x00, 0x20, 0x6e, 0xac, 0x21, 0xf5,
    0x91, 0x45, 0xc7, 0x4e, 0x2b, 0xe4, 0x64, 0x69, 0xd1, 0x0f, 0x84, 0x88, 0x8a, 0x2f, 0xae, 0xb5,
    0xf3, 0x44, 0x4b, 0x11, 0xe6, 0xcb, 0x2f, 0x04, 0x32, 0x38, 0xba, 0x21,
};

/* ---- helpers ---- */

/*
 * The bytes are copied into an allocation of exactly their size, so that with ASan a read past
 * the end is caught. The copy lives until the next call (spans from sniff_http point into it).
 */
static uint8_t *copy;

static const uint8_t *exact(const void *p, size_t n)
{
    free(copy);
    copy = malloc(n ? n : 1);
    if (n)
        memcpy(copy, p, n);
    return copy;
}

static int tls(const void *p, size_t n, struct sniff_tls *t)
{
    return sniff_tls(exact(p, n), n, t);
}

static int http_n(const void *p, size_t n, struct sniff_http *h)
{
    return sniff_http(exact(p, n), n, h);
}

static int answer_n(const char *p, size_t n, struct sniff_answer *a)
{
    return sniff_http_answer(exact(p, n), n, a);
}

static int http(const char *text, struct sniff_http *h)
{
    return http_n(text, strlen(text), h);
}

/* s with bytes outside printable ASCII as \xNN, for test names (one call per ok()). */
static const char *shown(const char *s)
{
    static char out[256];
    size_t n = 0;
    for (; *s && n + 5 < sizeof(out); s++) {
        uint8_t c = (uint8_t)*s;
        if (c >= 0x20 && c < 0x7f)
            out[n++] = (char)c;
        else
            n += (size_t)snprintf(out + n, sizeof(out) - n, "\\x%02x", c);
    }
    out[n] = '\0';
    return out;
}

static int span_is(struct sniff_span s, const char *want)
{
    return s.p && s.len == strlen(want) && memcmp(s.p, want, s.len) == 0;
}

/* A byte buffer to build messages in. */
struct bb {
    uint8_t b[40000];
    size_t n;
};

static void put8(struct bb *m, unsigned v)
{
    if (m->n < sizeof(m->b))
        m->b[m->n++] = (uint8_t)v;
}

static void put16(struct bb *m, unsigned v)
{
    put8(m, v >> 8);
    put8(m, v & 0xff);
}

static void putn(struct bb *m, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put8(m, ((const uint8_t *)p)[i]);
}

/* Reserves a 16-bit length; close16 fills it with what was put since, plus adj. */
static size_t open16(struct bb *m)
{
    size_t at = m->n;
    put16(m, 0);
    return at;
}

static void close16(struct bb *m, size_t at, int adj)
{
    size_t n = m->n - at - 2 + (size_t)adj;
    m->b[at] = (uint8_t)(n >> 8);
    m->b[at + 1] = (uint8_t)n;
}

/* A server_name extension, one entry per name (type 0 unless types says); lengths skewable. */
static void ext_sni(struct bb *m, const char *const *names, const size_t *lens, const int *types,
                    size_t count, int list_adj)
{
    put16(m, 0x0000);
    size_t e = open16(m);
    size_t l = open16(m);
    for (size_t i = 0; i < count; i++) {
        size_t n = lens ? lens[i] : strlen(names[i]);
        put8(m, types ? (unsigned)types[i] : 0);
        put16(m, (unsigned)n);
        putn(m, names[i], n);
    }
    close16(m, l, list_adj);
    close16(m, e, 0);
}

/* An ALPN extension from "h2,http/1.1" ("" entries give empty names). */
static void ext_alpn(struct bb *m, const char *csv)
{
    put16(m, 0x0010);
    size_t e = open16(m);
    size_t l = open16(m);
    const char *p = csv;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        put8(m, (unsigned)n);
        putn(m, p, n);
        if (!c)
            break;
        p = c + 1;
    }
    close16(m, l, 0);
    close16(m, e, 0);
}

static void ext_raw(struct bb *m, unsigned type, const void *data, size_t n)
{
    put16(m, type);
    put16(m, (unsigned)n);
    putn(m, data, n);
}

/* Offsets in a built hello (the handshake message, without a record header). */
#define H_LEN 1     /* 24-bit message length */
#define H_VERSION 4 /* legacy_version */
#define H_SID 38    /* session id length (32 follow) */
#define H_SUITES 71 /* cipher suites length (6 follow) */
#define H_COMP 79   /* compression methods length (1 follows) */
#define H_EXTS 81   /* extensions length */
#define H_FIRST 83  /* the first extension */

/* A ClientHello message: TLS 1.3-shaped, with the given extension bytes (or none at all). */
static void build_hello(struct bb *m, const struct bb *exts, int no_ext)
{
    m->n = 0;
    put8(m, 1);
    size_t len_at = m->n;
    put8(m, 0);
    put16(m, 0);
    put16(m, 0x0303);
    for (int i = 0; i < 32; i++)
        put8(m, 0x11);
    put8(m, 32);
    for (int i = 0; i < 32; i++)
        put8(m, 0x22);
    put16(m, 6);
    put16(m, 0x1301);
    put16(m, 0x1302);
    put16(m, 0xc02f);
    put8(m, 1);
    put8(m, 0);
    if (!no_ext) {
        size_t e = open16(m);
        static const uint8_t versions[] = {4, 0x03, 0x04, 0x03, 0x03};
        ext_raw(m, 0x002b, versions, sizeof(versions));
        if (exts)
            putn(m, exts->b, exts->n);
        close16(m, e, 0);
    }
    size_t n = m->n - 4;
    m->b[len_at] = (uint8_t)(n >> 16);
    m->b[len_at + 1] = (uint8_t)(n >> 8);
    m->b[len_at + 2] = (uint8_t)n;
}

/* msg in records of at most frag bytes each (record version 3.1, as clients send). */
static void wrap(struct bb *out, const uint8_t *msg, size_t n, size_t frag)
{
    out->n = 0;
    for (size_t off = 0; off < n; off += frag) {
        size_t k = n - off < frag ? n - off : frag;
        put8(out, 0x16);
        put16(out, 0x0301);
        put16(out, (unsigned)k);
        putn(out, msg + off, k);
    }
}

/* A hello with these extensions in one record. */
static void hello_record(struct bb *rec, const struct bb *exts)
{
    static struct bb msg;
    build_hello(&msg, exts, 0);
    wrap(rec, msg.b, msg.n, SNIFF_TLS_RECORD_MAX);
}

static int sni_hello(const char *name, size_t n, struct sniff_tls *t)
{
    static struct bb e, rec;
    e.n = 0;
    const char *names[] = {name};
    size_t lens[] = {n};
    ext_sni(&e, names, lens, NULL, 1, 0);
    hello_record(&rec, &e);
    return tls(rec.b, rec.n, t);
}

/* Whether every proper prefix of b is MORE, with a need beyond it and within n. */
static int prefixes_more(const uint8_t *b, size_t n, size_t *bad_at)
{
    struct sniff_tls t;
    for (size_t k = 0; k < n; k++) {
        int r = tls(b, k, &t);
        if (r != SNIFF_MORE || t.need <= k || t.need > n) {
            *bad_at = k;
            return 0;
        }
    }
    return 1;
}

/* ---- TLS ---- */

static void tls_real(void)
{
    struct sniff_tls t;
    size_t n = sizeof(openssl_hello);
    int r = tls(openssl_hello, n, &t);
    ok(r == SNIFF_OK && t.has_sni && strcmp(t.sni, "pypi.org") == 0 && t.sni_len == 8,
       "openssl s_client's hello: SNI pypi.org (%s)", sniff_result_name(r));
    ok(t.has_alpn && t.alpn == (SNIFF_ALPN_H2 | SNIFF_ALPN_HTTP11) && !t.has_ech,
       "... ALPN h2 and http/1.1, no ECH");
    ok(t.consumed == n && t.records == 1 && t.version == 0x0303,
       "... one record, all %zu bytes, legacy_version 3.3", n);

    size_t at = 0;
    ok(prefixes_more(openssl_hello, n, &at),
       "cut at every byte: MORE, with need beyond the cut and within the hello (first wrong: %zu)",
       at);

    /* a ChangeCipherSpec record and early data may follow: not part of the hello */
    struct bb b = {.n = 0};
    putn(&b, openssl_hello, n);
    static const uint8_t ccs[] = {0x14, 0x03, 0x03, 0x00, 0x01, 0x01, 0x17, 0x03, 0x03};
    putn(&b, ccs, sizeof(ccs));
    r = tls(b.b, b.n, &t);
    ok(r == SNIFF_OK && t.consumed == n && strcmp(t.sni, "pypi.org") == 0,
       "bytes after the hello's record are left alone (consumed %zu of %zu)", t.consumed, b.n);

    /* the same message fragmented over records of every size from 1 byte */
    const uint8_t *msg = openssl_hello + 5;
    size_t mn = n - 5;
    int all = 1;
    size_t worst = 0;
    for (size_t frag = 1; frag <= mn; frag++) {
        static struct bb rec;
        wrap(&rec, msg, mn, frag);
        r = tls(rec.b, rec.n, &t);
        if (r != SNIFF_OK || strcmp(t.sni, "pypi.org") != 0 || t.consumed != rec.n ||
            t.records != (mn + frag - 1) / frag || t.alpn != (SNIFF_ALPN_H2 | SNIFF_ALPN_HTTP11)) {
            all = 0;
            worst = frag;
        }
    }
    ok(all, "fragmented into records of 1..%zu bytes: the same hello each time (first wrong: %zu)",
       mn, worst);

    static const size_t frags[] = {1, 2, 3, 4, 5, 7, 38, 64, 100, 326};
    all = 1;
    for (size_t i = 0; i < sizeof(frags) / sizeof(frags[0]); i++) {
        static struct bb rec;
        wrap(&rec, msg, mn, frags[i]);
        if (!prefixes_more(rec.b, rec.n, &at)) {
            printf("# records of %zu bytes, cut at %zu: not MORE\n", frags[i], at);
            all = 0;
        }
    }
    ok(all, "fragmented and cut at every byte: MORE each time, need within the records");

    static struct bb rec;
    wrap(&rec, msg, mn, 100);
    rec.b[5 + 100] = 0x17; /* the second record is application data */
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "a non-handshake record inside the hello: BAD");
    wrap(&rec, msg, mn, 100);
    rec.b[5 + 100 + 1] = 0x02;
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "a later record's version 2.x: BAD");
    wrap(&rec, msg, mn, 100);
    rec.b[5 + 100 + 3] = 0;
    rec.b[5 + 100 + 4] = 0;
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "an empty record inside the hello: BAD");

    /* every byte changed to a few values: never a crash, never a bad name accepted */
    int oks = 0, names_ok = 1;
    struct bb mut;
    for (size_t i = 0; i < n; i++) {
        const uint8_t vals[] = {0x00, 0xff, (uint8_t)(openssl_hello[i] ^ 1),
                                (uint8_t)(openssl_hello[i] + 1), 0x80};
        for (size_t v = 0; v < sizeof(vals); v++) {
            mut.n = 0;
            putn(&mut, openssl_hello, n);
            mut.b[i] = vals[v];
            if (tls(mut.b, n, &t) != SNIFF_OK)
                continue;
            oks++;
            if (t.has_sni && (t.sni_len == 0 || strlen(t.sni) != t.sni_len ||
                              strspn(t.sni, "abcdefghijklmnopqrstuvwxyz0123456789.-") != t.sni_len))
                names_ok = 0;
        }
    }
    ok(names_ok, "every byte of the hello mutated: no OK answer carries a bad name (%d OK)", oks);
}

static void tls_built(void)
{
    struct sniff_tls t;
    static struct bb e, rec, msg;
    const char *pypi[] = {"pypi.org"};

    e.n = 0;
    ext_sni(&e, pypi, NULL, NULL, 1, 0);
    ext_alpn(&e, "h2,http/1.1");
    hello_record(&rec, &e);
    int r = tls(rec.b, rec.n, &t);
    ok(r == SNIFF_OK && strcmp(t.sni, "pypi.org") == 0 &&
           t.alpn == (SNIFF_ALPN_H2 | SNIFF_ALPN_HTTP11) && t.consumed == rec.n,
       "built hello: pypi.org, h2 and http/1.1 (%s)", sniff_result_name(r));

    r = sni_hello("PyPI.ORG", 8, &t);
    ok(r == SNIFF_OK && strcmp(t.sni, "pypi.org") == 0, "SNI PyPI.ORG comes back lower-cased: %s",
       t.sni);
    r = sni_hello("pypi.org.", 9, &t);
    ok(r == SNIFF_OK && strcmp(t.sni, "pypi.org.") == 0, "a trailing dot is kept (%s)", t.sni);

    e.n = 0;
    ext_alpn(&e, "h2");
    hello_record(&rec, &e);
    r = tls(rec.b, rec.n, &t);
    ok(r == SNIFF_OK && !t.has_sni && t.sni[0] == '\0' && t.sni_len == 0 && t.alpn == SNIFF_ALPN_H2,
       "no server_name: OK without SNI, ALPN h2 only");
    build_hello(&msg, NULL, 1);
    wrap(&rec, msg.b, msg.n, SNIFF_TLS_RECORD_MAX);
    r = tls(rec.b, rec.n, &t);
    ok(r == SNIFF_OK && !t.has_sni && !t.has_alpn, "no extensions at all (TLS 1.2 allows): no SNI");

    e.n = 0;
    ext_alpn(&e, "acme-tls/1");
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_OK && t.alpn == SNIFF_ALPN_OTHER, "ALPN acme-tls/1: other");
    e.n = 0;
    ext_alpn(&e, "h2,spdy/3,http/1.1,h2");
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_OK &&
           t.alpn == (SNIFF_ALPN_H2 | SNIFF_ALPN_HTTP11 | SNIFF_ALPN_OTHER),
       "ALPN h2, spdy/3, http/1.1: all three flags");
    e.n = 0;
    ext_alpn(&e, "h2,,http/1.1");
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "ALPN with an empty protocol name: BAD");
    e.n = 0;
    ext_raw(&e, 0x0010, "\x00\x00", 2);
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "ALPN with an empty list: BAD");
    e.n = 0;
    ext_raw(&e, 0x0010, "\x00\x03\x05h2", 5);
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "ALPN name longer than its list: BAD");
    e.n = 0;
    ext_alpn(&e, "h2");
    ext_alpn(&e, "http/1.1");
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "two ALPN extensions: BAD");

    static const uint8_t ech[] = {0x00, 0x00, 0x01, 0x00, 0x01, 0x07, 0x00, 0x00, 0x00, 0x00};
    e.n = 0;
    ext_sni(&e, pypi, NULL, NULL, 1, 0);
    ext_raw(&e, 0xfe0d, ech, sizeof(ech));
    hello_record(&rec, &e);
    r = tls(rec.b, rec.n, &t);
    ok(r == SNIFF_OK && t.has_ech && strcmp(t.sni, "pypi.org") == 0,
       "encrypted_client_hello is reported (the outer SNI is what is visible)");
    ext_raw(&e, 0xfe0d, ech, sizeof(ech));
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "two encrypted_client_hello extensions: BAD");

    /* names */
    char longest[SNIFF_NAME_MAX + 2];
    memset(longest, 'a', sizeof(longest));
    for (size_t i = 63; i < sizeof(longest); i += 64)
        longest[i] = '.';
    r = sni_hello(longest, SNIFF_NAME_MAX, &t);
    ok(r == SNIFF_OK && t.sni_len == SNIFF_NAME_MAX && strlen(t.sni) == SNIFF_NAME_MAX,
       "a 255-byte name: OK");
    ok(sni_hello(longest, SNIFF_NAME_MAX + 1, &t) == SNIFF_BAD, "a 256-byte name: BAD");
    ok(sni_hello("", 0, &t) == SNIFF_BAD, "an empty name: BAD");
    ok(sni_hello("pypi.org\0evil.test", 18, &t) == SNIFF_BAD && !t.has_sni,
       "a name with a NUL (pypi.org\\0evil.test): BAD");
    ok(sni_hello("pypi.org\0", 9, &t) == SNIFF_BAD, "a name ending in NUL: BAD");
    static const char *const bad_names[] = {
        "pypi.org@evil.test", "evil.test/pypi.org", "pypi_org.test",   "pypi.org:443",
        "pypi org",           "*.pypi.org",         "p\xc3\xa9pi.org", "[::1]",
        "pypi.org\r\n",       "pypi.org\x7f",       "%70ypi.org",
    };
    for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++)
        ok(sni_hello(bad_names[i], strlen(bad_names[i]), &t) == SNIFF_BAD,
           "SNI \"%s\": BAD (a character outside [A-Za-z0-9.-])", shown(bad_names[i]));

    const char *two[] = {"pypi.org", "evil.test"};
    e.n = 0;
    ext_sni(&e, two, NULL, NULL, 2, 0);
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "two host_name entries: BAD");
    const char *same[] = {"pypi.org", "pypi.org"};
    e.n = 0;
    ext_sni(&e, same, NULL, NULL, 2, 0);
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "the same host_name twice: BAD");
    int type1[] = {1};
    e.n = 0;
    ext_sni(&e, pypi, NULL, type1, 1, 0);
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "a name of type 1 (not host_name): BAD");
    const char *evil[] = {"evil.test"};
    e.n = 0;
    ext_sni(&e, pypi, NULL, NULL, 1, 0);
    ext_sni(&e, evil, NULL, NULL, 1, 0);
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "two server_name extensions: BAD");
    e.n = 0;
    ext_raw(&e, 0x0000, "", 0);
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "an empty server_name extension: BAD");
    e.n = 0;
    ext_raw(&e, 0x0000, "\x00\x00", 2);
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "a server_name list of length 0: BAD");
    static const int adj[] = {1, -1, 100, -11};
    for (size_t i = 0; i < sizeof(adj) / sizeof(adj[0]); i++) {
        e.n = 0;
        ext_sni(&e, pypi, NULL, NULL, 1, adj[i]);
        hello_record(&rec, &e);
        ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "server_name list length off by %d: BAD", adj[i]);
    }
    size_t longer[] = {9};
    e.n = 0;
    ext_sni(&e, pypi, longer, NULL, 1, 0);
    e.n--; /* the entry claims 9 bytes, 8 are there */
    e.b[3]--;
    e.b[5]--;
    hello_record(&rec, &e);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "a name longer than its list: BAD");
}

/* A default hello in one record with byte at (a message offset) set to v; its result. */
static int poke(size_t at, int v, int v2)
{
    static struct bb e, msg, rec;
    const char *pypi[] = {"pypi.org"};
    e.n = 0;
    ext_sni(&e, pypi, NULL, NULL, 1, 0);
    build_hello(&msg, &e, 0);
    msg.b[at] = (uint8_t)v;
    if (v2 >= 0)
        msg.b[at + 1] = (uint8_t)v2;
    wrap(&rec, msg.b, msg.n, SNIFF_TLS_RECORD_MAX);
    struct sniff_tls t;
    return tls(rec.b, rec.n, &t);
}

static void tls_lengths(void)
{
    struct sniff_tls t;
    static struct bb e, msg, rec;
    const char *pypi[] = {"pypi.org"};
    e.n = 0;
    ext_sni(&e, pypi, NULL, NULL, 1, 0);
    build_hello(&msg, &e, 0);
    size_t mlen = msg.n - 4;

    ok(poke(0, 2, -1) == SNIFF_BAD, "a ServerHello (type 2) first: BAD");
    ok(poke(H_VERSION, 2, 0) == SNIFF_BAD, "legacy_version 2.0: BAD");
    ok(poke(H_SID, 33, -1) == SNIFF_BAD, "session id of 33 bytes: BAD");
    ok(poke(H_SID, 200, -1) == SNIFF_BAD, "session id longer than the message: BAD");
    ok(poke(H_SUITES, 0, 5) == SNIFF_BAD, "odd cipher suites length: BAD");
    ok(poke(H_SUITES, 0, 0) == SNIFF_BAD, "no cipher suites: BAD");
    ok(poke(H_SUITES, 0xff, 0xfe) == SNIFF_BAD, "cipher suites longer than the message: BAD");
    ok(poke(H_COMP, 0, -1) == SNIFF_BAD, "no compression methods: BAD");
    size_t exts = msg.n - H_FIRST;
    ok(poke(H_EXTS, (int)((exts + 1) >> 8), (int)((exts + 1) & 0xff)) == SNIFF_BAD,
       "extensions length one beyond the message: BAD");
    ok(poke(H_EXTS, (int)((exts - 1) >> 8), (int)((exts - 1) & 0xff)) == SNIFF_BAD,
       "extensions length one short of the message: BAD");
    ok(poke(H_EXTS, 0xff, 0xff) == SNIFF_BAD, "extensions length 65535: BAD");
    ok(poke(H_FIRST + 2, 0xff, 0xff) == SNIFF_BAD, "an extension of 65535 bytes: BAD");
    ok(poke(H_FIRST + 2, 0, 6) == SNIFF_BAD, "an extension one byte longer than it is: BAD");

    /* the handshake length against the records */
    msg.b[H_LEN + 2] = (uint8_t)(mlen - 1);
    msg.b[H_LEN + 1] = (uint8_t)((mlen - 1) >> 8);
    wrap(&rec, msg.b, msg.n, SNIFF_TLS_RECORD_MAX);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "a hello one byte shorter than its record: BAD");
    msg.b[H_LEN + 2] = (uint8_t)(mlen + 1);
    msg.b[H_LEN + 1] = (uint8_t)((mlen + 1) >> 8);
    wrap(&rec, msg.b, msg.n, SNIFF_TLS_RECORD_MAX);
    int r = tls(rec.b, rec.n, &t);
    ok(r == SNIFF_MORE && t.need == rec.n + 5 + 1,
       "a hello one byte longer than its record: MORE, need a header and the byte (%zu)", t.need);
    put8(&rec, 0x16);
    put16(&rec, 0x0301);
    put16(&rec, 1);
    put8(&rec, 0);
    ok(tls(rec.b, rec.n, &t) == SNIFF_BAD, "... and given that byte, the extensions disagree: BAD");

    static const uint8_t huge[] = {0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0xff, 0xff, 0xff};
    ok(tls(huge, sizeof(huge), &t) == SNIFF_BAD, "handshake length 0xffffff: BAD at once");
    static const uint8_t split_huge[] = {0x16, 0x03, 0x01, 0x00, 0x02, 0x01, 0x00,
                                         0x16, 0x03, 0x01, 0x00, 0x02, 0x40, 0x01};
    ok(tls(split_huge, sizeof(split_huge), &t) == SNIFF_BAD,
       "handshake length 16 KiB + 1, its header split over two records: BAD");
    static const uint8_t big_rec[] = {0x16, 0x03, 0x01, 0x40, 0x01, 0x01};
    ok(tls(big_rec, sizeof(big_rec), &t) == SNIFF_BAD, "a record of 2^14 + 1 bytes: BAD");
    static const uint8_t empty_rec[] = {0x16, 0x03, 0x01, 0x00, 0x00, 0x16};
    ok(tls(empty_rec, sizeof(empty_rec), &t) == SNIFF_BAD, "an empty first record: BAD");
    static const uint8_t tiny[] = {0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00};
    ok(tls(tiny, sizeof(tiny), &t) == SNIFF_BAD, "an empty ClientHello: BAD");

    /* the 16 KiB bound, exactly and one over, in two records */
    for (int over = 0; over <= 1; over++) {
        e.n = 0;
        ext_sni(&e, pypi, NULL, NULL, 1, 0);
        build_hello(&msg, &e, 0);
        size_t pad = SNIFF_TLS_HELLO_MAX - msg.n - 4 + (size_t)over;
        static uint8_t zeros[SNIFF_TLS_HELLO_MAX];
        ext_raw(&e, 0x0015, zeros, pad);
        build_hello(&msg, &e, 0);
        wrap(&rec, msg.b, msg.n, SNIFF_TLS_RECORD_MAX - 100);
        r = tls(rec.b, rec.n, &t);
        if (!over)
            ok(msg.n == SNIFF_TLS_HELLO_MAX && r == SNIFF_OK && t.records == 2 &&
                   strcmp(t.sni, "pypi.org") == 0,
               "a hello of exactly 16 KiB over two records: OK (%s)", sniff_result_name(r));
        else
            ok(r == SNIFF_BAD && tls(rec.b, 9, &t) == SNIFF_BAD,
               "a hello of 16 KiB + 1: BAD, as soon as its length is seen");
    }
}

static void tls_not(void)
{
    struct sniff_tls t;
    ok(tls("", 0, &t) == SNIFF_MORE && t.need == 9, "nothing yet: MORE (need %zu)", t.need);
    ok(tls("\x16", 1, &t) == SNIFF_MORE, "one handshake byte: MORE");
    ok(tls("\x16\x03\x01\x00", 4, &t) == SNIFF_MORE, "a partial record header: MORE");
    ok(tls("GET / HTTP/1.1\r\n", 16, &t) == SNIFF_NOT_TLS, "an HTTP request: NOT_TLS");
    ok(tls("G", 1, &t) == SNIFF_NOT_TLS, "one byte of it is enough: NOT_TLS");
    ok(tls("SSH-2.0-OpenSSH_9.6\r\n", 21, &t) == SNIFF_NOT_TLS, "SSH: NOT_TLS");
    ok(tls("\x16\x02", 2, &t) == SNIFF_NOT_TLS, "0x16 then not 3: NOT_TLS");
    static const uint8_t sslv2[] = {0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15};
    ok(tls(sslv2, sizeof(sslv2), &t) == SNIFF_NOT_TLS, "an SSLv2-format hello: NOT_TLS");
    ok(tls("\x17\x03\x03\x00\x10", 5, &t) == SNIFF_NOT_TLS, "application data first: NOT_TLS");
    ok(tls("\x16\x03\x05", 3, &t) == SNIFF_BAD, "record version 3.5: BAD");
    ok(tls("\x16\x03\x01\x00\x05\x02", 6, &t) == SNIFF_BAD,
       "a handshake that is not a ClientHello, first byte seen: BAD");
}

/* ---- HTTP ---- */

static void http_ok(void)
{
    struct sniff_http h;
    const char *get = "GET /simple/requests/ HTTP/1.1\r\nHost: pypi.org\r\nAccept: */*\r\n\r\n";
    int r = http(get, &h);
    ok(r == SNIFF_OK && span_is(h.method, "GET") && span_is(h.target, "/simple/requests/") &&
           span_is(h.path, "/simple/requests/") && h.minor == 1,
       "GET in origin-form (%s)", sniff_result_name(r));
    ok(strcmp(h.host, "pypi.org") == 0 && h.port == 80 && !h.port_given && !h.host_is_addr &&
           span_is(h.host_hdr, "pypi.org"),
       "... host pypi.org, port 80 by default");
    ok(h.head_len == strlen(get) && h.body == SNIFF_BODY_NONE && !h.is_connect && !h.absolute,
       "... the head is all %zu bytes, no body", strlen(get));

    size_t n = strlen(get), wrong = 0;
    int all = 1;
    for (size_t k = 0; k < n; k++)
        if (http_n(get, k, &h) != SNIFF_MORE) {
            all = 0;
            wrong = k;
        }
    ok(all, "cut at every byte: MORE (first wrong: %zu)", wrong);

    r = http("GET / HTTP/1.1\r\nHost: PyPI.Org:8080\r\n\r\n", &h);
    ok(r == SNIFF_OK && strcmp(h.host, "pypi.org") == 0 && h.port == 8080 && h.port_given &&
           span_is(h.host_hdr, "PyPI.Org:8080"),
       "Host with a port and capitals: pypi.org, 8080 (the field's value kept as sent)");
    r = http("GET / HTTP/1.1\r\nHost: \t pypi.org \t\r\n\r\n", &h);
    ok(r == SNIFF_OK && span_is(h.host_hdr, "pypi.org"),
       "spaces and tabs around Host are not in it");
    r = http("GET / HTTP/1.1\r\nhOST: pypi.org\r\n\r\n", &h);
    ok(r == SNIFF_OK && strcmp(h.host, "pypi.org") == 0, "field names are case-insensitive");

    r = http("GET http://pypi.org/simple/?q=1 HTTP/1.1\r\nHost: pypi.org\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.absolute && span_is(h.path, "/simple/?q=1") &&
           strcmp(h.host, "pypi.org") == 0 && h.port == 80,
       "absolute-form agreeing with Host: OK, path /simple/?q=1");
    r = http("GET HTTP://PyPI.org:80 HTTP/1.1\r\nHost: pypi.org\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.absolute && h.path.len == 0 && h.port == 80,
       "absolute-form with the default port written, no path: OK (path \"\")");
    r = http("GET http://pypi.org?x HTTP/1.1\r\nHost: pypi.org\r\n\r\n", &h);
    ok(r == SNIFF_OK && span_is(h.path, "?x"), "absolute-form with a query and no path: \"?x\"");
    r = http("GET http://[2001:db8::1]:8080/ HTTP/1.1\r\nHost: [2001:DB8::1]:8080\r\n\r\n", &h);
    ok(r == SNIFF_OK && strcmp(h.host, "2001:db8::1") == 0 && h.host_is_v6 && h.host_is_addr &&
           h.port == 8080,
       "absolute-form with an IPv6 literal: 2001:db8::1 port 8080, an address");

    r = http("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.is_connect && strcmp(h.host, "pypi.org") == 0 && h.port == 443 &&
           h.body == SNIFF_BODY_TUNNEL && h.path.len == 0,
       "CONNECT pypi.org:443: a tunnel to pypi.org port 443");
    r = http("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.port == 443, "CONNECT with Host naming no port: OK, port 443");
    r = http("CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.host_is_v6 && h.host_is_addr && strcmp(h.host, "::1") == 0,
       "CONNECT [::1]:443: an address (the proxy refuses it)");

    static const struct {
        const char *host, *want;
        int port, v6;
    } addrs[] = {
        {"127.0.0.1", "127.0.0.1", 80, 0},
        {"127.1", "127.1", 80, 0},
        {"0x7f000001", "0x7f000001", 80, 0},
        {"2130706433:8080", "2130706433", 8080, 0},
        {"017700000001", "017700000001", 80, 0},
        {"[::1]:8080", "::1", 8080, 1},
        {"[::ffff:169.254.169.254]", "::ffff:169.254.169.254", 80, 1},
    };
    for (size_t i = 0; i < sizeof(addrs) / sizeof(addrs[0]); i++) {
        char req[256];
        snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", addrs[i].host);
        r = http(req, &h);
        ok(r == SNIFF_OK && h.host_is_addr && h.host_is_v6 == addrs[i].v6 &&
               strcmp(h.host, addrs[i].want) == 0 && h.port == addrs[i].port,
           "Host: %s is an address literal (%s port %d)", addrs[i].host, h.host, h.port);
    }
    r = http("GET / HTTP/1.1\r\nHost: 127.0.0.1.nip.io\r\n\r\n", &h);
    ok(r == SNIFF_OK && !h.host_is_addr, "127.0.0.1.nip.io is a name (its address is checked "
                                         "after the proxy resolves it)");

    r = http("POST /upload HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 5\r\n\r\nhello", &h);
    ok(r == SNIFF_OK && h.body == SNIFF_BODY_LENGTH && h.content_length == 5,
       "POST with Content-Length: 5");
    r = http("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.body == SNIFF_BODY_LENGTH && h.content_length == 0,
       "Content-Length: 0 is a body of 0 bytes");
    r = http("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
             &h);
    ok(r == SNIFF_OK && h.content_length == 5, "Content-Length twice with the same value: OK");
    r = http("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 999999999999999999\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.content_length == 999999999999999999ull, "an 18-digit Content-Length");
    r = http("POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: Chunked \r\n\r\n", &h);
    ok(r == SNIFF_OK && h.body == SNIFF_BODY_CHUNKED, "Transfer-Encoding: chunked");
    r = http("OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n", &h);
    ok(r == SNIFF_OK && span_is(h.target, "*"), "OPTIONS *");
    r = http("GET / HTTP/1.0\r\nHost: a.test\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.minor == 0, "HTTP/1.0 with Host");
    r = http("GET /chat HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "\r\n",
             &h);
    ok(r == SNIFF_OK && h.upgrade == SNIFF_UPGRADE_WEBSOCKET, "Upgrade: websocket is reported");
    r = http("GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: WebSocket \r\n\r\n", &h);
    ok(r == SNIFF_OK && h.upgrade == SNIFF_UPGRADE_WEBSOCKET, "in any case, spaces around it");
    static const char *const others[] = {
        "Upgrade: h2c\r\n",
        "Upgrade: websocket, h2c\r\n",
        "Upgrade: websocket/13\r\n",
        "Upgrade: websocket\r\nUpgrade: websocket\r\n",
        "Upgrade: h2c\r\nUpgrade: websocket\r\n",
        "Upgrade:\r\n",
    };
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        char req[256];
        snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: a.test\r\n%s\r\n", others[i]);
        r = http(req, &h);
        ok(r == SNIFF_OK && h.upgrade == SNIFF_UPGRADE_OTHER, "%s: another upgrade",
           shown(others[i]));
    }
    r = http("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.upgrade == SNIFF_UPGRADE_NONE, "no Upgrade: none");
    r = http("GET / HTTP/1.1\r\nHost: a.test\r\nUser-Agent: caf\xc3\xa9/1.0\r\nX-Empty:\r\n\r\n",
             &h);
    ok(r == SNIFF_OK, "UTF-8 in a value (obs-text) and an empty value: OK");
    r = http("M-SEARCH /a%20b?c=d|e{f} HTTP/1.1\r\nHost: a.test\r\n\r\n", &h);
    ok(r == SNIFF_OK && span_is(h.method, "M-SEARCH"), "any token method, a path with | { }");
    r = http("GET /@evil.test HTTP/1.1\r\nHost: pypi.org\r\n\r\n", &h);
    ok(r == SNIFF_OK && strcmp(h.host, "pypi.org") == 0,
       "/@evil.test is a path: the host is still pypi.org");

    const char *two =
        "GET /a HTTP/1.1\r\nHost: a.test\r\n\r\nGET /b HTTP/1.1\r\nHost: b.test\r\n\r\n";
    r = http(two, &h);
    size_t first = h.head_len;
    ok(r == SNIFF_OK && span_is(h.target, "/a") && first == 33, "pipelined: the first head ends at "
                                                                "33");
    r = http(two + first, &h);
    ok(r == SNIFF_OK && strcmp(h.host, "b.test") == 0, "... and the second starts there");

    /* the size bound, exactly and one over */
    static char big[SNIFF_HTTP_HEAD_MAX + 64];
    const char *start = "GET / HTTP/1.1\r\nHost: a.test\r\nX-Pad: ";
    size_t sl = strlen(start);
    for (int over = 0; over <= 1; over++) {
        size_t pad = SNIFF_HTTP_HEAD_MAX - sl - 4 + (size_t)over;
        memcpy(big, start, sl);
        memset(big + sl, 'x', pad);
        memcpy(big + sl + pad, "\r\n\r\n", 4);
        size_t total = sl + pad + 4;
        r = http_n(big, total, &h);
        if (!over)
            ok(r == SNIFF_OK && h.head_len == SNIFF_HTTP_HEAD_MAX, "a head of exactly 16 KiB: OK");
        else
            ok(r == SNIFF_BAD && http_n(big, SNIFF_HTTP_HEAD_MAX, &h) == SNIFF_BAD,
               "a head of 16 KiB + 1: BAD once 16 KiB are in without its end");
    }
}

static void http_not(void)
{
    struct sniff_http h;
    ok(http("", &h) == SNIFF_MORE, "nothing yet: MORE");
    ok(http("GE", &h) == SNIFF_MORE, "part of a method: MORE");
    ok(http("GET ", &h) == SNIFF_MORE, "a method and a space: MORE");
    ok(http_n(openssl_hello, sizeof(openssl_hello), &h) == SNIFF_NOT_HTTP,
       "a ClientHello: NOT_HTTP");
    ok(http("\x16", &h) == SNIFF_NOT_HTTP, "its first byte: NOT_HTTP");
    ok(http("SSH-2.0-OpenSSH_9.6\r\n", &h) == SNIFF_NOT_HTTP, "SSH: NOT_HTTP");
    ok(http(" GET / HTTP/1.1\r\n", &h) == SNIFF_NOT_HTTP, "a leading space: NOT_HTTP");
    ok(http("\r\nGET / HTTP/1.1\r\nHost: a.test\r\n\r\n", &h) == SNIFF_NOT_HTTP,
       "a leading empty line: NOT_HTTP");
    ok(http("GET\t/ HTTP/1.1\r\n", &h) == SNIFF_NOT_HTTP, "a tab after the method: NOT_HTTP");
    ok(http("ABCDEFGHIJABCDEFGHIJABCDEFGHIJABC", &h) == SNIFF_NOT_HTTP,
       "33 token bytes without a space: NOT_HTTP");
    ok(http("ABCDEFGHIJABCDEFGHIJABCDEFGHIJAB / HTTP/1.1\r\nHost: a.test\r\n\r\n", &h) == SNIFF_OK,
       "a 32-byte method: OK");
}

static void http_bad(void)
{
    static const struct {
        const char *req, *why;
    } bad[] = {
        /* where it goes */
        {"GET / HTTP/1.1\r\n\r\n", "no Host"},
        {"GET / HTTP/1.0\r\n\r\n", "no Host in HTTP/1.0 either"},
        {"GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: pypi.org\r\n\r\n", "Host twice, same value"},
        {"GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.test\r\n\r\n", "Host twice"},
        {"GET / HTTP/1.1\r\nHost:\r\n\r\n", "an empty Host"},
        {"GET / HTTP/1.1\r\nHost: pypi.org evil.test\r\n\r\n", "Host with a space inside"},
        {"GET / HTTP/1.1\r\nHost: pypi.org@evil.test\r\n\r\n", "Host with userinfo"},
        {"GET / HTTP/1.1\r\nHost: pypi_org.test\r\n\r\n", "Host with '_'"},
        {"GET / HTTP/1.1\r\nHost: pypi.org/\r\n\r\n", "Host with '/'"},
        {"GET / HTTP/1.1\r\nHost: pypi.org:\r\n\r\n", "Host with an empty port"},
        {"GET / HTTP/1.1\r\nHost: pypi.org:0\r\n\r\n", "port 0"},
        {"GET / HTTP/1.1\r\nHost: pypi.org:65536\r\n\r\n", "port 65536"},
        {"GET / HTTP/1.1\r\nHost: pypi.org:000443\r\n\r\n", "a 6-digit port"},
        {"GET / HTTP/1.1\r\nHost: pypi.org:+80\r\n\r\n", "port +80"},
        {"GET / HTTP/1.1\r\nHost: pypi.org:80:80\r\n\r\n", "two ports"},
        {"GET / HTTP/1.1\r\nHost: ::1\r\n\r\n", "IPv6 without brackets"},
        {"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", "an unclosed bracket"},
        {"GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n", "bytes after the bracket"},
        {"GET / HTTP/1.1\r\nHost: [fe80::1%25eth0]\r\n\r\n", "an IPv6 zone"},
        {"GET / HTTP/1.1\r\nHost: [127.0.0.1]\r\n\r\n", "IPv4 in brackets"},
        {"GET / HTTP/1.1\r\nHost: [v1.x]\r\n\r\n", "IPvFuture"},
        {"GET / HTTP/1.1\r\nHost: p\xc3\xa9pi.org\r\n\r\n", "Host with UTF-8"},
        {"GET / HTTP/1.1\r\nHost: %70ypi.org\r\n\r\n", "Host percent-encoded"},
        /* the target */
        {"GET pypi.org@evil.test HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "target pypi.org@evil.test"},
        {"GET http://evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
         "Host pypi.org, target http://evil.test/"},
        {"GET http://pypi.org@evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
         "userinfo in the target"},
        {"GET http://evil.test@pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
         "userinfo in the target, Host matching what follows it"},
        {"GET http://evil.test#@pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
         "a '#' in the authority"},
        {"GET http://pypi.org\\@evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "a backslash"},
        {"GET http://pypi.org:8080/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "ports disagree"},
        {"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org:8080\r\n\r\n", "ports disagree (Host)"},
        {"GET http://pypi.org.evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "a longer name"},
        {"GET http:///x HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "an empty authority"},
        {"GET http:// HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "only a scheme"},
        {"GET https://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "https in the target"},
        {"GET ftp://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "another scheme"},
        {"GET pypi.org:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "authority-form without CONNECT"},
        {"GET * HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "'*' without OPTIONS"},
        {"CONNECT evil.test:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
         "CONNECT evil.test, Host pypi.org"},
        {"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:80\r\n\r\n", "CONNECT ports disagree"},
        {"CONNECT pypi.org HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "CONNECT without a port"},
        {"CONNECT / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "CONNECT to a path"},
        {"CONNECT http://pypi.org:443/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "CONNECT to a URL"},
        {"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 5\r\n\r\n",
         "CONNECT with a body"},
        {"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n", "CONNECT without Host"},
        {"GET /\x01 HTTP/1.1\r\nHost: a.test\r\n\r\n", "a control byte in the target"},
        {"GET /\x80 HTTP/1.1\r\nHost: a.test\r\n\r\n", "a byte over 0x7f in the target"},
        /* the request line */
        {"GET  / HTTP/1.1\r\nHost: a.test\r\n\r\n", "two spaces"},
        {"GET / HTTP/1.1 \r\nHost: a.test\r\n\r\n", "a space after the version"},
        {"GET / HTTP/1.2\r\nHost: a.test\r\n\r\n", "HTTP/1.2"},
        {"GET / HTTP/2.0\r\nHost: a.test\r\n\r\n", "HTTP/2.0"},
        {"GET / http/1.1\r\nHost: a.test\r\n\r\n", "http/1.1 in lower case"},
        {"GET /\r\nHost: a.test\r\n\r\n", "no version (HTTP/0.9)"},
        {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "the HTTP/2 preface"},
        /* lines */
        {"GET / HTTP/1.1\nHost: a.test\r\n\r\n", "a bare LF after the request line"},
        {"GET / HTTP/1.1\r\nHost: a.test\n\r\n", "a bare LF after a field"},
        {"GET / HTTP/1.1\r\nHost: a.test\r\n\n", "a bare LF ending the head"},
        {"GET / HTTP/1.1\r\nHost: a.test\rX: y\r\n\r\n", "a bare CR"},
        {"GET / HTTP/1.1\r\nHost: a.test\r\nX-A: b\r\n c\r\n\r\n", "obsolete line folding"},
        {"GET / HTTP/1.1\r\nHost: a.test\r\nX-A: b\r\n\tc\r\n\r\n", "folding with a tab"},
        {"GET / HTTP/1.1\r\n Host: a.test\r\n\r\n", "whitespace before the first field"},
        {"GET / HTTP/1.1\r\nHost : a.test\r\n\r\n", "whitespace before the colon"},
        {"GET / HTTP/1.1\r\nHost\t: a.test\r\n\r\n", "a tab before the colon"},
        {"GET / HTTP/1.1\r\nHost: a.test\r\nNoColon\r\n\r\n", "a field without a colon"},
        {"GET / HTTP/1.1\r\nHost: a.test\r\n: x\r\n\r\n", "a field without a name"},
        {"GET / HTTP/1.1\r\nHost: a.test\r\nX(y): z\r\n\r\n", "'(' in a field name"},
        {"GET / HTTP/1.1\r\nHost: a.test\r\nX: a\x7f\r\n\r\n", "DEL in a value"},
        {"GET / HTTP/1.1\r\nHost: a.test\r\nX: a\x01\r\n\r\n", "a control byte in a value"},
        /* framing: request smuggling */
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nTransfer-Encoding: "
         "chunked\r\n\r\n",
         "Content-Length then Transfer-Encoding"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nContent-Length: "
         "5\r\n\r\n",
         "Transfer-Encoding then Content-Length"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
         "two different Content-Lengths"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5, 5\r\n\r\n", "Content-Length: 5, 5"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: +5\r\n\r\n", "Content-Length: +5"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: -1\r\n\r\n", "Content-Length: -1"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0x10\r\n\r\n", "Content-Length: 0x10"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5 5\r\n\r\n", "Content-Length: 5 5"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1e3\r\n\r\n", "Content-Length: 1e3"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length:\r\n\r\n", "an empty Content-Length"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1000000000000000000\r\n\r\n",
         "a 19-digit Content-Length"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 18446744073709551621\r\n\r\n",
         "a Content-Length that wraps 64 bits to 5"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
         "chunked\r\n\r\n",
         "Transfer-Encoding twice"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
         "Transfer-Encoding: gzip, chunked"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
         "Transfer-Encoding: chunked, identity"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: xchunked\r\n\r\n",
         "Transfer-Encoding: xchunked"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: \"chunked\"\r\n\r\n",
         "Transfer-Encoding quoted"},
        {"POST / HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n",
         "Transfer-Encoding in HTTP/1.0"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nContent_Length: 5\r\n\r\n", "Content_Length"},
        {"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer_Encoding: chunked\r\n\r\n",
         "Transfer_Encoding"},
    };
    struct sniff_http h;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int r = http(bad[i].req, &h);
        ok(r == SNIFF_BAD && h.head_len == 0 && h.host[0] == '\0', "%s: BAD (%s)", bad[i].why,
           sniff_result_name(r));
    }
    /* not bad: a path "//evil.test" goes to Host, and HOST_ is not Host */
    int r = http("GET //evil.test HTTP/1.1\r\nHost: pypi.org\r\n\r\n", &h);
    ok(r == SNIFF_OK && strcmp(h.host, "pypi.org") == 0, "origin-form //evil.test: to pypi.org");
    r = http("GET / HTTP/1.1\r\nHost: a.test\r\nHOST_: b.test\r\n\r\n", &h);
    ok(r == SNIFF_OK && strcmp(h.host, "a.test") == 0, "HOST_ is another field (not Host)");

    /* BAD is seen as soon as the offending line is complete */
    r = http("GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n", &h);
    ok(r == SNIFF_BAD, "a second Host: BAD before the head is complete");
    r = http("GET / HTTP/1.1\r\nX: a\r\n b\r\n", &h);
    ok(r == SNIFF_BAD, "folding: BAD before the head is complete");
}

/* The proxy's view: parse, then ask the sandbox's policy about the host it found. */
static void http_policy(void)
{
    json_t *in = json_loads("{\"internet\": true, \"allow\": [\"pypi.org\"]}", 0, NULL);
    struct wr_err err = {0};
    json_t *policy = netpolicy_parse(in, &err);
    json_decref(in);
    struct sniff_http h;
    int r = http("CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n", &h);
    ok(r == SNIFF_OK && netpolicy_check(policy, h.host, h.port) == NETPOLICY_NOT_ALLOWED,
       "CONNECT evil.test:443 parses, and the policy allowing pypi.org refuses it");
    r = http("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n", &h);
    ok(r == SNIFF_OK && netpolicy_check(policy, h.host, h.port) == NETPOLICY_ALLOW,
       "CONNECT pypi.org:443: allowed");
    r = http("GET / HTTP/1.1\r\nHost: 0x7f000001\r\n\r\n", &h);
    ok(r == SNIFF_OK && h.host_is_addr &&
           netpolicy_check(policy, h.host, h.port) == NETPOLICY_BAD_NAME,
       "Host 0x7f000001: an address, never a name");
    struct sniff_tls t;
    r = tls(openssl_hello, sizeof(openssl_hello), &t);
    ok(r == SNIFF_OK && netpolicy_check(policy, t.sni, 443) == NETPOLICY_ALLOW,
       "the captured hello's SNI pypi.org:443: allowed");
    json_decref(policy);
}

/* ---- chunked bodies ---- */

/* Feeds s split at every point (two feeds); whether each gives want with total consumed. */
static int chunked_splits(const char *s, size_t n, int want, size_t want_consumed)
{
    for (size_t cut = 0; cut <= n; cut++) {
        struct sniff_chunked c;
        sniff_chunked_init(&c);
        size_t used1 = 0, used2 = 0;
        int r = sniff_chunked_feed(&c, exact(s, cut), cut, &used1);
        if (r == SNIFF_MORE)
            r = sniff_chunked_feed(&c, exact(s + cut, n - cut), n - cut, &used2);
        if (r != want || (want != SNIFF_BAD && used1 + used2 != want_consumed))
            return 0;
    }
    return 1;
}

static int chunked(const char *s, size_t n, size_t *used)
{
    struct sniff_chunked c;
    sniff_chunked_init(&c);
    return sniff_chunked_feed(&c, exact(s, n), n, used);
}

static void chunked_checks(void)
{
    const char *body = "5\r\nhello\r\nA;name=\"v\"\r\n0123456789\r\n0\r\nX-Sum: 1\r\n\r\n";
    const char *next = "GET /next HTTP/1.1\r\nHost: a.test\r\n\r\n";
    char both[256];
    snprintf(both, sizeof(both), "%s%s", body, next);
    size_t bl = strlen(body), n = strlen(both), used = 0;
    int r = chunked(both, n, &used);
    ok(r == SNIFF_DONE && used == bl, "chunks, an extension, a trailer: DONE after %zu bytes",
       used);
    ok(chunked_splits(both, n, SNIFF_DONE, bl), "... the same split at every byte");
    struct sniff_chunked c;
    sniff_chunked_init(&c);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        r = sniff_chunked_feed(&c, (const uint8_t *)both + i, 1, &used);
        total += used;
        if (r != SNIFF_MORE)
            break;
    }
    ok(r == SNIFF_DONE && total == bl, "... and fed one byte at a time");
    r = sniff_chunked_feed(&c, (const uint8_t *)"x", 1, &used);
    ok(r == SNIFF_DONE && used == 0, "after DONE: DONE, nothing consumed");

    /* the whole connection: head, body, next head */
    char conn[512];
    snprintf(conn, sizeof(conn),
             "POST /a HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
             "\r\n%s%s",
             body, next);
    struct sniff_http h;
    r = http(conn, &h);
    size_t at = h.head_len;
    ok(r == SNIFF_OK && h.body == SNIFF_BODY_CHUNKED, "a chunked POST's head");
    r = chunked(conn + at, strlen(conn) - at, &used);
    at += used;
    r = r == SNIFF_DONE ? http(conn + at, &h) : r;
    ok(r == SNIFF_OK && span_is(h.target, "/next"),
       "... its body ends where the next request starts");

    ok(chunked("0\r\n\r\n", 5, &used) == SNIFF_DONE && used == 5, "only the last chunk: DONE");
    ok(chunked("000\r\n\r\n", 7, &used) == SNIFF_DONE, "last chunk 000: DONE");
    ok(chunked("0000000000000005\r\nhello\r\n0\r\n\r\n", 30, &used) == SNIFF_DONE,
       "16 hex digits: DONE");
    ok(chunked("fF\r\n", 4, &used) == SNIFF_MORE && used == 4,
       "mixed-case hex, data to come: MORE");
    ok(chunked("ffffffffffffffff\r\nabc", 21, &used) == SNIFF_MORE && used == 21,
       "a 2^64-1 chunk: MORE, all consumed");

    static const struct {
        const char *s, *why;
    } bad[] = {
        {"\r\n", "no size"},
        {"5 \r\nhello\r\n0\r\n\r\n", "a space after the size"},
        {" 5\r\nhello\r\n0\r\n\r\n", "a space before the size"},
        {"5\t;x\r\nhello\r\n0\r\n\r\n", "a tab before the extension"},
        {"0x5\r\nhello\r\n0\r\n\r\n", "a 0x prefix"},
        {"-1\r\n", "a negative size"},
        {"+5\r\n", "a plus sign"},
        {"g\r\n", "not hex"},
        {"00000000000000005\r\nhello\r\n0\r\n\r\n", "17 hex digits"},
        {"5\nhello\r\n0\r\n\r\n", "a bare LF after the size"},
        {"5\rhello\r\n0\r\n\r\n", "a bare CR after the size"},
        {"5\r\nhelloX\r\n0\r\n\r\n", "data longer than the size"},
        {"5\r\nhell\r\n0\r\n\r\n", "data shorter than the size"},
        {"5\r\nhello\n0\r\n\r\n", "a bare LF after the data"},
        {"5;a\x01\r\nhello\r\n", "a control byte in an extension"},
        {"0\r\nX: 1\n\r\n", "a bare LF after a trailer"},
        {"0\r\nX: 1\r\n 2\r\n\r\n", "a folded trailer"},
        {"0\r\n X: 1\r\n\r\n", "a trailer starting with a space"},
        {"0\r\nX : 1\r\n\r\n", "a space before a trailer's colon"},
        {"0\r\nX\r\n\r\n", "a trailer without a colon"},
        {"0\r\n\n", "a bare LF at the end"},
        {"0\r\n\rx", "a CR then not LF at the end"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t len = strlen(bad[i].s);
        r = chunked(bad[i].s, len, &used);
        ok(r == SNIFF_BAD && used < len && chunked_splits(bad[i].s, len, SNIFF_BAD, 0),
           "chunked, %s: BAD at byte %zu, however split", bad[i].why, used);
    }
    r = chunked("0\r\nX: a\0\r\n\r\n", 12, &used);
    ok(r == SNIFF_BAD && used == 7, "chunked, a NUL in a trailer: BAD at byte %zu", used);
    sniff_chunked_init(&c);
    sniff_chunked_feed(&c, (const uint8_t *)"x", 1, &used);
    r = sniff_chunked_feed(&c, (const uint8_t *)"0\r\n\r\n", 5, &used);
    ok(r == SNIFF_BAD && used == 0, "after BAD: BAD, nothing consumed");

    /* the bounds */
    static char line[SNIFF_CHUNK_LINE_MAX + 16];
    memset(line, 0, sizeof(line));
    line[0] = '0';
    line[1] = ';';
    memset(line + 2, 'e', SNIFF_CHUNK_LINE_MAX - 2);
    memcpy(line + SNIFF_CHUNK_LINE_MAX, "\r\n\r\n", 4);
    r = chunked(line, SNIFF_CHUNK_LINE_MAX + 4, &used);
    ok(r == SNIFF_DONE, "a size line of exactly %d bytes: DONE", SNIFF_CHUNK_LINE_MAX);
    memset(line + 2, 'e', SNIFF_CHUNK_LINE_MAX - 1);
    memcpy(line + SNIFF_CHUNK_LINE_MAX + 1, "\r\n\r\n", 4);
    r = chunked(line, SNIFF_CHUNK_LINE_MAX + 5, &used);
    ok(r == SNIFF_BAD && used == SNIFF_CHUNK_LINE_MAX, "one byte longer: BAD at byte %zu", used);

    static char tr[SNIFF_CHUNK_TRAILER_MAX + 64];
    for (int over = 0; over <= 1; over++) {
        /* "0\r\n" + "X: " + pad + "\r\n" + "\r\n": the trailer section is all but the first 3 */
        size_t pad = SNIFF_CHUNK_TRAILER_MAX - 3 - 4 + (size_t)over;
        memcpy(tr, "0\r\nX: ", 6);
        memset(tr + 6, 'v', pad);
        memcpy(tr + 6 + pad, "\r\n\r\n", 4);
        size_t len = 6 + pad + 4;
        r = chunked(tr, len, &used);
        if (!over)
            ok(r == SNIFF_DONE && used == len, "a trailer section of exactly %d bytes: DONE",
               SNIFF_CHUNK_TRAILER_MAX);
        else
            ok(r == SNIFF_BAD, "one byte more: BAD");
    }
}

static int answer(const char *text, struct sniff_answer *a)
{
    size_t n = strlen(text);
    return sniff_http_answer(exact(text, n), n, a);
}

static void answers(void)
{
    struct sniff_answer a;
    const char *ok200 = "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n";
    int r = answer(ok200, &a);
    ok(r == SNIFF_OK && a.status == 200 && a.minor == 1 && a.body == SNIFF_BODY_LENGTH &&
           a.content_length == 12 && a.head_len == strlen(ok200) - 12,
       "200 with a Content-Length: its head and framing");
    for (size_t k = 0; k < strlen(ok200) - 12; k++) {
        if (answer_n(ok200, k, &a) != SNIFF_MORE) {
            ok(0, "a head cut at %zu: more", k);
            break;
        }
    }
    ok(1, "any head cut short: more");
    r = answer("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "\r\n\x81\x05hello",
               &a);
    ok(r == SNIFF_OK && a.status == 101 && a.websocket && a.head_len == 77,
       "a 101 to websocket, a frame behind it (%d)", (int)a.head_len);
    r = answer("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", &a);
    ok(r == SNIFF_OK && a.status == 101 && !a.websocket, "a 101 to h2c: not websocket");
    r = answer("HTTP/1.0 204\r\n\r\n", &a);
    ok(r == SNIFF_OK && a.status == 204 && a.minor == 0 && a.body == SNIFF_BODY_CLOSE,
       "no reason phrase; unframed reads as to the close (the caller knows 204 has none)");
    r = answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n",
               &a);
    ok(r == SNIFF_OK && a.body == SNIFF_BODY_CHUNKED && a.content_length == 0,
       "Transfer-Encoding ending in chunked wins over Content-Length");
    r = answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", &a);
    ok(r == SNIFF_OK && a.body == SNIFF_BODY_CLOSE, "another coding last: to the close");
    r = answer("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", &a);
    ok(r == SNIFF_OK && a.content_length == 5, "the same Content-Length twice");
    static const char *const bad[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1234567890123456789\r\n\r\n",
        "HTTP/1.1 200 OK\nContent-Length: 5\n\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 099 OK\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.2 200 OK\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n",
        "HTTP/1.1 200 O\x01K\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX: a\x7f\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ok(answer(bad[i], &a) == SNIFF_BAD, "bad: %s", shown(bad[i]));
    ok(answer("ICY", &a) == SNIFF_BAD && answer("HTTP/1", &a) == SNIFF_MORE,
       "a wrong start is bad at once; a right one cut short is more");
    /* A head that never ends: more up to the limit, bad from there. */
    size_t big = SNIFF_HTTP_HEAD_MAX + 10;
    char *huge = malloc(big + 1);
    memset(huge, 'a', big);
    memcpy(huge, "HTTP/1.1 200 OK\r\nX: ", 20);
    huge[big] = '\0';
    ok(answer_n(huge, SNIFF_HTTP_HEAD_MAX - 1, &a) == SNIFF_MORE &&
           answer_n(huge, SNIFF_HTTP_HEAD_MAX, &a) == SNIFF_BAD && answer(huge, &a) == SNIFF_BAD,
       "a head over SNIFF_HTTP_HEAD_MAX: bad");
    free(huge);
}

int main(void)
{
    tls_real();
    tls_built();
    tls_lengths();
    tls_not();
    http_ok();
    http_not();
    http_bad();
    http_policy();
    chunked_checks();
    answers();
    free(copy);
    return tap_done();
}
