/*
 * Fuzz target: the egress proxy's ClientHello reader (net/sniff.h) on arbitrary bytes, checking
 * what the proxy relies on: an OK answer's name obeys the character rules and is in the records,
 * the hello lies within the input, the bytes after it change nothing, and a cut of an OK input is
 * MORE with a need that the whole input meets. Inputs are copied to allocations of their exact
 * size so that a read past the end is caught under ASan.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/sniff.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int on_copy(const uint8_t *data, size_t n, struct sniff_tls *t)
{
    uint8_t *p = malloc(n ? n : 1);
    if (!p)
        abort();
    memcpy(p, data, n);
    int r = sniff_tls(p, n, t);
    free(p);
    return r;
}

static char lower(uint8_t c)
{
    return (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
}

/* Whether name (lower case) occurs in buf, ignoring case. */
static int occurs(const uint8_t *buf, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i + len <= n; i++) {
        size_t k = 0;
        while (k < len && lower(buf[i + k]) == name[k])
            k++;
        if (k == len)
            return 1;
    }
    return 0;
}

static void check_ok(const uint8_t *data, size_t size, const struct sniff_tls *t)
{
    if (t->consumed > size || t->consumed < 5 + 4 + 41 || t->records == 0 ||
        t->records > t->consumed / 6)
        abort();
    if (t->has_sni) {
        if (t->sni_len < 1 || t->sni_len > SNIFF_NAME_MAX || strlen(t->sni) != t->sni_len ||
            strspn(t->sni, "abcdefghijklmnopqrstuvwxyz0123456789.-") != t->sni_len)
            abort();
        if (t->records == 1 && !occurs(data, t->consumed, t->sni, t->sni_len))
            abort();
    } else if (t->sni_len || t->sni[0]) {
        abort();
    }
    if ((t->alpn & ~(SNIFF_ALPN_H2 | SNIFF_ALPN_HTTP11 | SNIFF_ALPN_OTHER)) ||
        (t->alpn && !t->has_alpn) || (t->has_alpn && !t->alpn))
        abort();
    if (t->version >> 8 != 3)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sniff_tls t, u;
    int r = sniff_tls(data, size, &t);
    switch (r) {
    case SNIFF_OK: check_ok(data, size, &t); break;
    case SNIFF_MORE:
        if (t.need <= size)
            abort();
        return 0;
    case SNIFF_NOT_TLS:
        if (size == 0 || (data[0] == 0x16 && (size < 2 || data[1] == 3)))
            abort();
        return 0;
    case SNIFF_BAD: return 0;
    default: abort();
    }
    /* the hello alone gives the same answer */
    if (on_copy(data, t.consumed, &u) != SNIFF_OK || u.consumed != t.consumed ||
        u.has_sni != t.has_sni || strcmp(u.sni, t.sni) != 0 || u.alpn != t.alpn ||
        u.has_ech != t.has_ech || u.records != t.records)
        abort();
    /* cut anywhere (one byte short, and where the first byte says): MORE, need within it */
    size_t cuts[] = {t.consumed - 1, data[0] % t.consumed, t.consumed / 2};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        if (on_copy(data, cuts[i], &u) != SNIFF_MORE || u.need <= cuts[i] || u.need > t.consumed)
            abort();
    }
    return 0;
}
