/*
 * Fuzz target: the egress proxy's HTTP request-head parser and chunked-body scanner
 * (net/sniff.h) on arbitrary bytes. For an OK head: every span lies inside the head, the host
 * obeys the character rules, the port is a port, the framing is consistent, the head alone gives
 * the same answer and one byte less is MORE. The chunked scanner must give the same answer, and
 * stop at the same byte, however its input is split: on the bytes after a chunked head, and on
 * the raw input. The answer-head parser (sniff_http_answer) gets the same bytes: an OK head ends
 * in a blank line within the limit, its status and framing are in range, the head alone gives
 * the same answer and one byte less is MORE. Inputs are copied to allocations of their exact
 * size (ASan catches over-reads).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/sniff.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *dup_exact(const uint8_t *data, size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    if (!p)
        abort();
    memcpy(p, data, n);
    return p;
}

static int within(struct sniff_span s, const uint8_t *buf, size_t n)
{
    const char *b = (const char *)buf;
    return s.p && s.p >= b && s.p <= b + n && s.len <= (size_t)(b + n - s.p);
}

static int no_line_ends(struct sniff_span s)
{
    return !memchr(s.p, '\r', s.len) && !memchr(s.p, '\n', s.len);
}

/* Whole, then split at cut: the same result, and the same end or failing byte. */
static void chunked_consistent(const uint8_t *data, size_t size, size_t cut)
{
    struct sniff_chunked a, b;
    size_t whole = 0, u1 = 0, u2 = 0;
    uint8_t *p = dup_exact(data, size);
    sniff_chunked_init(&a);
    int r1 = sniff_chunked_feed(&a, p, size, &whole);
    sniff_chunked_init(&b);
    int r2 = sniff_chunked_feed(&b, p, cut, &u1);
    size_t at = u1;
    if (r2 == SNIFF_MORE) {
        r2 = sniff_chunked_feed(&b, p + cut, size - cut, &u2);
        at = cut + u2;
    }
    free(p);
    if (r1 != SNIFF_DONE && r1 != SNIFF_MORE && r1 != SNIFF_BAD)
        abort();
    if (r1 != r2 || whole != at || whole > size || (r1 == SNIFF_MORE && whole != size))
        abort();
}

static void check_ok(const uint8_t *buf, size_t size, const struct sniff_http *h)
{
    size_t n = h->head_len;
    if (n < 4 || n > size || n > SNIFF_HTTP_HEAD_MAX || memcmp(buf + n - 4, "\r\n\r\n", 4) != 0)
        abort();
    if (!within(h->method, buf, n) || !within(h->target, buf, n) || !within(h->path, buf, n) ||
        !within(h->host_hdr, buf, n))
        abort();
    if (h->method.p != (const char *)buf || h->method.len < 1 ||
        h->method.len > SNIFF_HTTP_METHOD_MAX || h->target.len < 1 || h->host_hdr.len < 1 ||
        !no_line_ends(h->target) || !no_line_ends(h->host_hdr))
        abort();
    size_t hl = strlen(h->host);
    const char *chars =
        h->host_is_v6 ? "0123456789abcdef:." : "abcdefghijklmnopqrstuvwxyz0123456789.-";
    if (hl < 1 || hl > SNIFF_NAME_MAX || strspn(h->host, chars) != hl)
        abort();
    if (h->host_is_v6 && !h->host_is_addr)
        abort();
    if (h->port < 1 || h->port > 65535 || (!h->port_given && h->port != 80))
        abort();
    if (h->minor != 0 && h->minor != 1)
        abort();
    if (h->is_connect != (h->body == SNIFF_BODY_TUNNEL) || (h->is_connect && !h->port_given))
        abort();
    if (h->body != SNIFF_BODY_LENGTH && h->content_length != 0)
        abort();
}

/* sniff_http_answer on the input as an upstream's answer. */
static void answer_consistent(const uint8_t *data, size_t size)
{
    struct sniff_answer a, u;
    uint8_t *p = dup_exact(data, size);
    int r = sniff_http_answer(p, size, &a);
    free(p);
    if (r == SNIFF_MORE && size >= SNIFF_HTTP_HEAD_MAX)
        abort();
    if (r != SNIFF_OK) {
        if (r != SNIFF_MORE && r != SNIFF_BAD)
            abort();
        return;
    }
    size_t n = a.head_len;
    if (n < 4 || n > size || n > SNIFF_HTTP_HEAD_MAX || memcmp(data + n - 4, "\r\n\r\n", 4) != 0)
        abort();
    if (a.status < 100 || a.status > 999 || (a.minor != 0 && a.minor != 1))
        abort();
    if (a.body != SNIFF_BODY_LENGTH && a.body != SNIFF_BODY_CHUNKED && a.body != SNIFF_BODY_CLOSE)
        abort();
    if (a.body != SNIFF_BODY_LENGTH && a.content_length != 0)
        abort();
    p = dup_exact(data, n);
    if (sniff_http_answer(p, n, &u) != SNIFF_OK || u.head_len != n || u.status != a.status ||
        u.body != a.body || u.content_length != a.content_length || u.websocket != a.websocket)
        abort();
    free(p);
    p = dup_exact(data, n - 1);
    if (sniff_http_answer(p, n - 1, &u) != SNIFF_MORE)
        abort();
    free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sniff_http h, u;
    int r = sniff_http(data, size, &h);
    size_t cut = size ? data[0] % (size + 1) : 0;
    chunked_consistent(data, size, cut);
    answer_consistent(data, size);
    switch (r) {
    case SNIFF_OK: check_ok(data, size, &h); break;
    case SNIFF_MORE:
        if (size >= SNIFF_HTTP_HEAD_MAX)
            abort();
        return 0;
    case SNIFF_NOT_HTTP:
        if (size == 0)
            abort();
        return 0;
    case SNIFF_BAD: return 0;
    default: abort();
    }
    uint8_t *p = dup_exact(data, h.head_len);
    if (sniff_http(p, h.head_len, &u) != SNIFF_OK || u.head_len != h.head_len ||
        strcmp(u.host, h.host) != 0 || u.port != h.port || u.body != h.body ||
        u.content_length != h.content_length)
        abort();
    free(p);
    p = dup_exact(data, h.head_len - 1);
    if (sniff_http(p, h.head_len - 1, &u) != SNIFF_MORE)
        abort();
    free(p);
    if (h.body == SNIFF_BODY_CHUNKED) {
        size_t rest = size - h.head_len;
        chunked_consistent(data + h.head_len, rest, rest ? cut % (rest + 1) : 0);
    }
    return 0;
}
