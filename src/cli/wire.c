/*
 * Parsers for what the CLI reads off the wire. They are strict where laxness could make a
 * truncated or foreign response look like a good one (status line, sizes, chunk framing), and
 * lenient only where RFC 9112 allows a recipient to be (bare LF line ends).
 */
#include "cli/wire.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"

/* ---- base URLs ---- */

static int copy_field(char *dst, size_t dstlen, const char *src, size_t n)
{
    if (n >= dstlen)
        return -1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

static int parse_port(const char *s, size_t n, char *out, size_t outlen)
{
    if (n == 0 || n > 5)
        return -1;
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v == 0 || v > 65535)
        return -1;
    snprintf(out, outlen, "%u", v);
    return 0;
}

int cli_url_parse(const char *s, struct cli_url *out, struct wr_err *err)
{
    memset(out, 0, sizeof(*out));
    if (strncmp(s, "unix:", 5) == 0) {
        const char *p = s + 5;
        if (strncmp(p, "//", 2) == 0)
            p += 2;
        if (*p == '\0')
            return wr_err_set(err, EINVAL, "bad URL '%s': no socket path after 'unix:'", s);
        if (copy_field(out->path, sizeof(out->path), p, strlen(p)) < 0)
            return wr_err_set(err, ENAMETOOLONG, "bad URL '%s': socket path too long", s);
        out->is_unix = true;
        return 0;
    }
    if (strncasecmp(s, "https://", 8) == 0)
        out->tls = true;
    else if (strncasecmp(s, "http://", 7) != 0)
        return wr_err_set(
            err, EINVAL,
            "bad URL '%s': expected https://HOST:PORT, http://HOST:PORT or unix:/path/to.sock", s);

    const char *auth = s + (out->tls ? 8 : 7);
    size_t alen = strcspn(auth, "/?#");
    const char *rest = auth + alen;
    if (*rest == '?' || *rest == '#' || strpbrk(rest, "?#"))
        return wr_err_set(err, EINVAL, "bad URL '%s': no query or fragment allowed", s);
    if (memchr(auth, '@', alen))
        return wr_err_set(err, EINVAL, "bad URL '%s': no user info allowed", s);
    if (alen == 0)
        return wr_err_set(err, EINVAL, "bad URL '%s': no host", s);

    const char *host = auth;
    size_t hlen;
    const char *port = NULL;
    size_t plen = 0;
    if (auth[0] == '[') {
        const char *close = memchr(auth, ']', alen);
        if (!close || close == auth + 1)
            return wr_err_set(err, EINVAL, "bad URL '%s': bad IPv6 address", s);
        host = auth + 1;
        hlen = (size_t)(close - host);
        const char *after = close + 1;
        if (after < auth + alen) {
            if (*after != ':')
                return wr_err_set(err, EINVAL, "bad URL '%s': junk after ']'", s);
            port = after + 1;
            plen = (size_t)(auth + alen - port);
        }
    } else {
        const char *colon = memchr(auth, ':', alen);
        hlen = colon ? (size_t)(colon - auth) : alen;
        if (colon) {
            port = colon + 1;
            plen = (size_t)(auth + alen - port);
        }
        if (hlen == 0)
            return wr_err_set(err, EINVAL, "bad URL '%s': no host", s);
    }
    if (copy_field(out->host, sizeof(out->host), host, hlen) < 0)
        return wr_err_set(err, EINVAL, "bad URL '%s': host too long", s);
    for (size_t i = 0; i < hlen; i++) {
        unsigned char c = (unsigned char)out->host[i];
        if (c <= ' ' || c >= 0x7f || c == '[' || c == ']' || (c == ':' && auth[0] != '['))
            return wr_err_set(err, EINVAL, "bad URL '%s': bad character in host", s);
    }
    if (port) {
        if (parse_port(port, plen, out->port, sizeof(out->port)) < 0)
            return wr_err_set(err, EINVAL, "bad URL '%s': bad port", s);
    } else {
        snprintf(out->port, sizeof(out->port), "%s", out->tls ? "443" : "80");
    }

    size_t rlen = strlen(rest);
    while (rlen > 0 && rest[rlen - 1] == '/')
        rlen--;
    if (copy_field(out->prefix, sizeof(out->prefix), rest, rlen) < 0)
        return wr_err_set(err, EINVAL, "bad URL '%s': path too long", s);
    for (size_t i = 0; i < rlen; i++) {
        unsigned char c = (unsigned char)rest[i];
        if (c <= ' ' || c >= 0x7f)
            return wr_err_set(err, EINVAL, "bad URL '%s': bad character in path", s);
    }
    return 0;
}

bool cli_host_is_loopback(const char *host)
{
    if (strcasecmp(host, "localhost") == 0 || strcasecmp(host, "localhost.") == 0)
        return true;
    unsigned char a[16];
    if (inet_pton(AF_INET, host, a) == 1)
        return a[0] == 127;
    if (inet_pton(AF_INET6, host, a) != 1)
        return false;
    static const unsigned char one[16] = {[15] = 1};
    static const unsigned char mapped[12] = {[10] = 0xff, [11] = 0xff};
    return memcmp(a, one, 16) == 0 || (memcmp(a, mapped, 12) == 0 && a[12] == 127);
}

bool cli_url_key_safe(const struct cli_url *url)
{
    return url->is_unix || url->tls || cli_host_is_loopback(url->host);
}

/* ---- response heads ---- */

static bool is_tchar(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Copies [s, s+n) into dst, truncated to fit, always NUL-terminated. */
static void copy_trunc(char *dst, size_t dstlen, const char *s, size_t n)
{
    if (n >= dstlen)
        n = dstlen - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

/* Does the comma-separated list [v, v+n) contain token tok (case-insensitive)? */
static bool list_has(const char *v, size_t n, const char *tok)
{
    size_t tlen = strlen(tok);
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t start = i;
        while (i < n && v[i] != ',')
            i++;
        size_t end = i;
        while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t'))
            end--;
        if (end - start == tlen && strncasecmp(v + start, tok, tlen) == 0)
            return true;
    }
    return false;
}

/* The last element of the list [v, v+n), trimmed. */
static void list_last(const char *v, size_t n, const char **out, size_t *outlen)
{
    size_t end = n;
    while (end > 0 && (v[end - 1] == ' ' || v[end - 1] == '\t' || v[end - 1] == ','))
        end--;
    size_t start = end;
    while (start > 0 && v[start - 1] != ',')
        start--;
    while (start < end && (v[start] == ' ' || v[start] == '\t'))
        start++;
    *out = v + start;
    *outlen = end - start;
}

static int parse_status_line(const char *l, size_t n, struct cli_head *h, struct wr_err *err)
{
    /* "HTTP/1.x SP 3DIGIT [SP reason]" */
    if (n < 12 || memcmp(l, "HTTP/1.", 7) != 0 || !isdigit((unsigned char)l[7]) || l[8] != ' ')
        return wr_err_set(err, EPROTO, "bad HTTP status line");
    for (int i = 9; i < 12; i++)
        if (!isdigit((unsigned char)l[i]))
            return wr_err_set(err, EPROTO, "bad HTTP status code");
    h->minor = l[7] - '0';
    h->status = (l[9] - '0') * 100 + (l[10] - '0') * 10 + (l[11] - '0');
    if (h->status < 100 || h->status > 599)
        return wr_err_set(err, EPROTO, "bad HTTP status code %d", h->status);
    if (n > 12) {
        if (l[12] != ' ')
            return wr_err_set(err, EPROTO, "bad HTTP status line");
        for (size_t i = 13; i < n; i++) {
            unsigned char c = (unsigned char)l[i];
            if ((c < ' ' && c != '\t') || c == 0x7f)
                return wr_err_set(err, EPROTO, "control character in HTTP status line");
        }
        copy_trunc(h->reason, sizeof(h->reason), l + 13, n - 13);
    }
    h->close = h->minor == 0;
    return 0;
}

static int parse_content_length(const char *v, size_t n, int64_t *out)
{
    if (n == 0 || n > 18)
        return -1;
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        x = x * 10 + (v[i] - '0');
    }
    *out = x;
    return 0;
}

static int parse_field(const char *l, size_t n, struct cli_head *h, bool *seen_te,
                       struct wr_err *err)
{
    if (l[0] == ' ' || l[0] == '\t')
        return wr_err_set(err, EPROTO, "folded HTTP header line");
    const char *colon = memchr(l, ':', n);
    if (!colon || colon == l)
        return wr_err_set(err, EPROTO, "bad HTTP header line");
    size_t nlen = (size_t)(colon - l);
    for (size_t i = 0; i < nlen; i++)
        if (!is_tchar((unsigned char)l[i]))
            return wr_err_set(err, EPROTO, "bad character in HTTP header name");
    const char *v = colon + 1;
    size_t vlen = n - nlen - 1;
    while (vlen > 0 && (*v == ' ' || *v == '\t'))
        v++, vlen--;
    while (vlen > 0 && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
        vlen--;
    for (size_t i = 0; i < vlen; i++) {
        unsigned char c = (unsigned char)v[i];
        if ((c < ' ' && c != '\t') || c == 0x7f)
            return wr_err_set(err, EPROTO, "control character in HTTP header value");
    }

    if (nlen == 14 && strncasecmp(l, "Content-Length", nlen) == 0) {
        int64_t cl;
        if (parse_content_length(v, vlen, &cl) < 0)
            return wr_err_set(err, EPROTO, "bad Content-Length");
        if (h->content_length >= 0 && h->content_length != cl)
            return wr_err_set(err, EPROTO, "conflicting Content-Length headers");
        h->content_length = cl;
    } else if (nlen == 17 && strncasecmp(l, "Transfer-Encoding", nlen) == 0) {
        const char *last;
        size_t lastlen;
        list_last(v, vlen, &last, &lastlen);
        if (lastlen != 7 || strncasecmp(last, "chunked", 7) != 0 || *seen_te)
            return wr_err_set(err, EPROTO, "unsupported Transfer-Encoding");
        if (list_has(v, vlen, "gzip") || list_has(v, vlen, "deflate") ||
            list_has(v, vlen, "compress"))
            return wr_err_set(err, EPROTO, "unsupported Transfer-Encoding");
        *seen_te = true;
        h->chunked = true;
    } else if (nlen == 10 && strncasecmp(l, "Connection", nlen) == 0) {
        if (list_has(v, vlen, "close"))
            h->close = true;
        else if (list_has(v, vlen, "keep-alive"))
            h->close = false;
    } else if (nlen == 12 && strncasecmp(l, "Content-Type", nlen) == 0) {
        copy_trunc(h->content_type, sizeof(h->content_type), v, vlen);
    }
    return 0;
}

ssize_t cli_head_parse(const char *buf, size_t len, struct cli_head *h, struct wr_err *err)
{
    memset(h, 0, sizeof(*h));
    h->content_length = -1;

    /* Refuse a foreign protocol as soon as its first bytes show, not after 64 KiB. */
    size_t pre = len < 5 ? len : 5;
    if (memcmp(buf, "HTTP/", pre) != 0)
        return wr_err_set(err, EPROTO, "not an HTTP response");

    size_t scan = len < CLI_HEAD_MAX ? len : CLI_HEAD_MAX;
    size_t line_start = 0;
    size_t end = 0;
    for (size_t i = 0; i < scan; i++) {
        if (buf[i] != '\n')
            continue;
        size_t llen = i - line_start;
        if (llen > 0 && buf[i - 1] == '\r')
            llen--;
        if (llen == 0 && line_start > 0) {
            end = i + 1;
            break;
        }
        line_start = i + 1;
    }
    if (end == 0) {
        if (len >= CLI_HEAD_MAX)
            return wr_err_set(err, EMSGSIZE, "HTTP response head larger than %d bytes",
                              CLI_HEAD_MAX);
        return 0;
    }

    bool seen_te = false;
    int nfields = 0;
    line_start = 0;
    for (size_t i = 0; i < end; i++) {
        if (buf[i] != '\n')
            continue;
        size_t llen = i - line_start;
        if (llen > 0 && buf[i - 1] == '\r')
            llen--;
        const char *l = buf + line_start;
        line_start = i + 1;
        if (memchr(l, '\0', llen))
            return wr_err_set(err, EPROTO, "NUL byte in HTTP response head");
        if (l == buf) {
            if (parse_status_line(l, llen, h, err) < 0)
                return -1;
            continue;
        }
        if (llen == 0)
            break;
        if (++nfields > CLI_HEADERS_MAX)
            return wr_err_set(err, EMSGSIZE, "more than %d HTTP header fields", CLI_HEADERS_MAX);
        if (parse_field(l, llen, h, &seen_te, err) < 0)
            return -1;
    }
    if (h->chunked && h->content_length >= 0)
        return wr_err_set(err, EPROTO, "both Content-Length and Transfer-Encoding in response");
    return (ssize_t)end;
}

/* ---- chunked transfer coding ---- */

enum {
    CH_SIZE,
    CH_EXT,
    CH_SIZE_LF,
    CH_DATA,
    CH_DATA_CR,
    CH_DATA_LF,
    CH_TRAILER,
    CH_TRAILER_LF,
    CH_DONE,
};

void cli_chunked_init(struct cli_chunked *d)
{
    memset(d, 0, sizeof(*d));
    d->state = CH_SIZE;
}

bool cli_chunked_done(const struct cli_chunked *d)
{
    return d->state == CH_DONE;
}

static void size_line_done(struct cli_chunked *d)
{
    d->line_len = 0;
    d->state = d->remaining == 0 ? CH_TRAILER : CH_DATA;
}

ssize_t cli_chunked_feed(struct cli_chunked *d, const char *in, size_t len, cli_data_fn out,
                         void *ctx, struct wr_err *err)
{
    size_t i = 0;
    while (i < len && d->state != CH_DONE) {
        unsigned char c = (unsigned char)in[i];
        switch (d->state) {
        case CH_SIZE: {
            int v = hex_digit(c);
            if (v >= 0) {
                /* 15 hex digits keep the size below 2^60: no overflow, no absurd sizes. */
                if (++d->digits > 15)
                    return wr_err_set(err, EPROTO, "chunk size too large");
                d->remaining = d->remaining * 16 + (uint64_t)v;
                d->line_len++;
                i++;
                break;
            }
            if (d->digits == 0)
                return wr_err_set(err, EPROTO, "bad chunk size");
            if (c == ';' || c == ' ' || c == '\t') {
                d->state = CH_EXT;
            } else if (c == '\r') {
                d->state = CH_SIZE_LF;
                i++;
            } else if (c == '\n') {
                size_line_done(d);
                i++;
            } else {
                return wr_err_set(err, EPROTO, "bad chunk size");
            }
            break;
        }
        case CH_EXT:
            if (c == '\r') {
                d->state = CH_SIZE_LF;
            } else if (c == '\n') {
                size_line_done(d);
            } else if ((c < ' ' && c != '\t') || c == 0x7f) {
                return wr_err_set(err, EPROTO, "control character in chunk extension");
            } else if (++d->line_len > CLI_CHUNK_LINE_MAX) {
                return wr_err_set(err, EMSGSIZE, "chunk size line too long");
            }
            i++;
            break;
        case CH_SIZE_LF:
            if (c != '\n')
                return wr_err_set(err, EPROTO, "bad chunk size line end");
            size_line_done(d);
            i++;
            break;
        case CH_DATA: {
            size_t n = len - i;
            if ((uint64_t)n > d->remaining)
                n = (size_t)d->remaining;
            if (out && out(ctx, in + i, n, err) < 0)
                return -1;
            d->remaining -= n;
            i += n;
            if (d->remaining == 0)
                d->state = CH_DATA_CR;
            break;
        }
        case CH_DATA_CR:
            if (c == '\r')
                d->state = CH_DATA_LF;
            else if (c == '\n')
                d->state = CH_SIZE;
            else
                return wr_err_set(err, EPROTO, "missing CRLF after chunk data");
            d->digits = 0;
            d->line_len = 0;
            i++;
            break;
        case CH_DATA_LF:
            if (c != '\n')
                return wr_err_set(err, EPROTO, "missing CRLF after chunk data");
            d->state = CH_SIZE;
            i++;
            break;
        case CH_TRAILER:
            if (++d->trailer_len > CLI_TRAILER_MAX)
                return wr_err_set(err, EMSGSIZE, "chunked trailer too long");
            if (c == '\n') {
                if (d->line_len == 0)
                    d->state = CH_DONE;
                d->line_len = 0;
            } else if (c == '\r') {
                if (d->line_len == 0)
                    d->state = CH_TRAILER_LF;
            } else {
                d->line_len++;
            }
            i++;
            break;
        case CH_TRAILER_LF:
            if (c != '\n')
                return wr_err_set(err, EPROTO, "bad end of chunked body");
            d->state = CH_DONE;
            i++;
            break;
        default: return wr_err_set(err, EPROTO, "chunked decoder in a bad state");
        }
    }
    return (ssize_t)i;
}

/* ---- NDJSON ---- */

void cli_ndjson_init(struct cli_ndjson *s, size_t max_line)
{
    memset(s, 0, sizeof(*s));
    s->max_line = max_line;
}

void cli_ndjson_free(struct cli_ndjson *s)
{
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
}

static int deliver_line(const char *l, size_t n, cli_line_fn fn, void *ctx, struct wr_err *err)
{
    if (n > 0 && l[n - 1] == '\r')
        n--;
    if (n == 0)
        return 0;
    return fn(ctx, l, n, err);
}

static int ndjson_append(struct cli_ndjson *s, const char *p, size_t n, struct wr_err *err)
{
    if (s->len + n > s->max_line)
        return wr_err_set(err, EMSGSIZE, "stream line longer than %zu bytes", s->max_line);
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n)
            cap *= 2;
        s->buf = xrealloc(s->buf, cap);
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    return 0;
}

int cli_ndjson_feed(struct cli_ndjson *s, const char *data, size_t len, cli_line_fn fn, void *ctx,
                    struct wr_err *err)
{
    while (len > 0) {
        const char *nl = memchr(data, '\n', len);
        if (!nl)
            return ndjson_append(s, data, len, err);
        size_t n = (size_t)(nl - data);
        if (s->len == 0) {
            /* The common case: a whole line inside this piece, passed on without a copy. */
            if (n > s->max_line)
                return wr_err_set(err, EMSGSIZE, "stream line longer than %zu bytes", s->max_line);
            if (deliver_line(data, n, fn, ctx, err) < 0)
                return -1;
        } else {
            if (ndjson_append(s, data, n, err) < 0)
                return -1;
            size_t total = s->len;
            s->len = 0; /* reset first: the callback may fail, and the line is gone anyway */
            if (deliver_line(s->buf, total, fn, ctx, err) < 0)
                return -1;
        }
        data = nl + 1;
        len -= n + 1;
    }
    return 0;
}

int cli_ndjson_finish(const struct cli_ndjson *s, struct wr_err *err)
{
    if (s->len > 0)
        return wr_err_set(err, EPROTO, "stream ended in the middle of a line");
    return 0;
}

/* ---- the API's error envelope ---- */

static void first_line(const char *body, size_t len, char *out, size_t outlen)
{
    size_t j = 0;
    for (size_t i = 0; i < len && j + 1 < outlen && j < 200; i++) {
        unsigned char c = (unsigned char)body[i];
        if (c == '\n' || c == '\r')
            break;
        out[j++] = (c < ' ' || c == 0x7f) ? '?' : (char)c;
    }
    out[j] = '\0';
}

void cli_error_describe(int status, const char *reason, const char *body, size_t len, char *msg,
                        size_t msglen, char *code, size_t codelen)
{
    if (code && codelen)
        code[0] = '\0';
    json_t *root = body && len ? json_loadb(body, len, 0, NULL) : NULL;
    json_t *e = root ? json_object_get(root, "error") : NULL;
    const char *m = json_string_value(json_object_get(e, "message"));
    const char *c = json_string_value(json_object_get(e, "code"));
    if (c && code && codelen)
        snprintf(code, codelen, "%s", c);
    if (m && *m) {
        snprintf(msg, msglen, "%s", m);
    } else if (c && *c) {
        snprintf(msg, msglen, "%s (HTTP %d)", c, status);
    } else {
        char line[256];
        first_line(body ? body : "", body ? len : 0, line, sizeof(line));
        snprintf(msg, msglen, "HTTP %d%s%s%s%s", status, reason && *reason ? " " : "",
                 reason ? reason : "", line[0] ? ": " : "", line);
    }
    json_decref(root);
}

/* ---- query strings ---- */

char *cli_query_escape(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = xmalloc(n * 3 + 1);
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
            out[j++] = (char)c;
        } else {
            out[j++] = '%';
            out[j++] = hex[c >> 4];
            out[j++] = hex[c & 15];
        }
    }
    out[j] = '\0';
    return out;
}
