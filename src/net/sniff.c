/*
 * First-bytes parsers for the egress proxy: see sniff.h. Every length read from the wire is
 * checked against the bytes that enclose it before anything is read through it; indexes into the
 * caller's buffer are always below len.
 */
#include "net/sniff.h"

#include <arpa/inet.h>
#include <string.h>

#include "common/util.h"
#include "net/addr.h"

/* ---- TLS ---- */

#define TLS_RECORD_HEADER 5
#define TLS_HANDSHAKE_HEADER 4
#define TLS_CONTENT_HANDSHAKE 0x16
#define TLS_CLIENT_HELLO 1
#define TLS_RANDOM_LEN 32
#define TLS_SESSION_ID_MAX 32
#define TLS_EXT_SERVER_NAME 0x0000
#define TLS_EXT_ALPN 0x0010
#define TLS_EXT_ECH 0xfe0d
#define TLS_NAME_TYPE_HOST 0

/* The characters a host name is made of. */
static int name_char(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-';
}

static char lower(uint8_t c)
{
    return (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
}

/*
 * The ClientHello's bytes, read through the records that carry it: when a record's fragment is
 * used up the next header is stepped over. sniff_tls has checked every header first; the reader
 * still refuses to go past the message or the records (bad is set, reads give 0).
 */
struct hello_reader {
    const uint8_t *buf;
    size_t end;      /* the records end here */
    size_t pos;      /* next byte of buf */
    size_t frag_end; /* the current record's fragment ends here */
    size_t off;      /* offset in the handshake message */
    size_t msg_len;  /* the message's length, its header included */
    int bad;
};

/* Whether n more bytes lie before limit (an offset in the message, at most msg_len). */
static int hr_has(const struct hello_reader *r, size_t limit, size_t n)
{
    return !r->bad && limit <= r->msg_len && r->off <= limit && limit - r->off >= n;
}

static uint8_t hr_u8(struct hello_reader *r)
{
    if (r->bad || r->off >= r->msg_len) {
        r->bad = 1;
        return 0;
    }
    if (r->pos == r->frag_end) {
        if (r->end - r->pos <= TLS_RECORD_HEADER) {
            r->bad = 1;
            return 0;
        }
        size_t rlen = (size_t)r->buf[r->pos + 3] << 8 | r->buf[r->pos + 4];
        r->pos += TLS_RECORD_HEADER;
        r->frag_end = r->pos + rlen;
        if (rlen == 0 || r->frag_end > r->end) {
            r->bad = 1;
            return 0;
        }
    }
    r->off++;
    return r->buf[r->pos++];
}

static unsigned hr_u16(struct hello_reader *r)
{
    unsigned hi = hr_u8(r);
    return hi << 8 | hr_u8(r);
}

static void hr_skip(struct hello_reader *r, size_t n)
{
    while (n > 0 && !r->bad) {
        if (r->pos == r->frag_end) {
            hr_u8(r); /* steps over the header */
            n--;
            continue;
        }
        size_t take = r->frag_end - r->pos;
        if (take > n)
            take = n;
        if (r->msg_len - r->off < take) {
            r->bad = 1;
            return;
        }
        r->pos += take;
        r->off += take;
        n -= take;
    }
}

/* server_name: exactly one host_name (RFC 6066 3). Its extension data ends at ext_end. */
static int parse_sni(struct hello_reader *r, size_t ext_end, struct sniff_tls *out)
{
    if (!hr_has(r, ext_end, 2))
        return -1;
    size_t list = hr_u16(r);
    if (list == 0 || r->off + list != ext_end)
        return -1;
    while (r->off < ext_end) {
        if (!hr_has(r, ext_end, 3))
            return -1;
        unsigned type = hr_u8(r);
        size_t n = hr_u16(r);
        /* other name types have no length to skip them by, and a second name is ambiguous */
        if (type != TLS_NAME_TYPE_HOST || out->has_sni)
            return -1;
        if (n == 0 || n > SNIFF_NAME_MAX || !hr_has(r, ext_end, n))
            return -1;
        for (size_t i = 0; i < n; i++) {
            uint8_t c = hr_u8(r);
            if (!name_char(c))
                return -1;
            out->sni[i] = lower(c);
        }
        out->sni[n] = '\0';
        out->sni_len = n;
        out->has_sni = 1;
    }
    return r->bad ? -1 : 0;
}

/* application_layer_protocol_negotiation: a non-empty list of non-empty names (RFC 7301 3.1). */
static int parse_alpn(struct hello_reader *r, size_t ext_end, struct sniff_tls *out)
{
    if (!hr_has(r, ext_end, 2))
        return -1;
    size_t list = hr_u16(r);
    if (list < 2 || r->off + list != ext_end)
        return -1;
    while (r->off < ext_end) {
        size_t n = hr_u8(r);
        if (n == 0 || !hr_has(r, ext_end, n))
            return -1;
        char name[256];
        for (size_t i = 0; i < n; i++)
            name[i] = (char)hr_u8(r);
        if (n == 2 && memcmp(name, "h2", 2) == 0)
            out->alpn |= SNIFF_ALPN_H2;
        else if (n == 8 && memcmp(name, "http/1.1", 8) == 0)
            out->alpn |= SNIFF_ALPN_HTTP11;
        else
            out->alpn |= SNIFF_ALPN_OTHER;
    }
    out->has_alpn = 1;
    return r->bad ? -1 : 0;
}

/* The ClientHello body (RFC 8446 4.1.2; the same layout since TLS 1.0). */
static int parse_hello(struct hello_reader *r, struct sniff_tls *out)
{
    size_t end = r->msg_len;
    hr_skip(r, TLS_HANDSHAKE_HEADER);
    if (!hr_has(r, end, 2 + TLS_RANDOM_LEN + 1))
        return -1;
    out->version = (uint16_t)hr_u16(r);
    if (out->version >> 8 != 3)
        return -1;
    hr_skip(r, TLS_RANDOM_LEN);
    size_t n = hr_u8(r); /* legacy_session_id */
    if (n > TLS_SESSION_ID_MAX || !hr_has(r, end, n))
        return -1;
    hr_skip(r, n);
    if (!hr_has(r, end, 2))
        return -1;
    n = hr_u16(r); /* cipher_suites, two bytes each */
    if (n < 2 || n % 2 || !hr_has(r, end, n))
        return -1;
    hr_skip(r, n);
    if (!hr_has(r, end, 1))
        return -1;
    n = hr_u8(r); /* legacy_compression_methods */
    if (n < 1 || !hr_has(r, end, n))
        return -1;
    hr_skip(r, n);
    if (r->off == end)
        return r->bad ? -1 : 0; /* no extensions (TLS 1.2 and older allow it): no SNI */
    if (!hr_has(r, end, 2))
        return -1;
    n = hr_u16(r);
    if (r->off + n != end)
        return -1;
    while (r->off < end) {
        if (!hr_has(r, end, 4))
            return -1;
        unsigned type = hr_u16(r);
        size_t elen = hr_u16(r);
        if (!hr_has(r, end, elen))
            return -1;
        size_t ext_end = r->off + elen;
        int rc = 0;
        switch (type) {
        case TLS_EXT_SERVER_NAME:
            rc = out->has_sni ? -1 : parse_sni(r, ext_end, out);
            if (rc == 0 && !out->has_sni)
                rc = -1;
            break;
        case TLS_EXT_ALPN: rc = out->has_alpn ? -1 : parse_alpn(r, ext_end, out); break;
        case TLS_EXT_ECH:
            rc = out->has_ech ? -1 : 0;
            out->has_ech = 1;
            hr_skip(r, elen);
            break;
        default: hr_skip(r, elen); break;
        }
        if (rc < 0 || r->bad || r->off != ext_end)
            return -1;
    }
    return r->bad ? -1 : 0;
}

int sniff_tls(const uint8_t *buf, size_t len, struct sniff_tls *out)
{
    memset(out, 0, sizeof(*out));
    /*
     * First the records: every header checked, the handshake header gathered from the first
     * fragments (it may be split too), and the hello's end found. Only then is it parsed.
     */
    size_t pos = 0, have = 0, msg_len = 0; /* msg_len 0: not known yet */
    uint8_t hs[TLS_HANDSHAKE_HEADER] = {0};
    unsigned records = 0;
    for (;;) {
        size_t hdr = len - pos < TLS_RECORD_HEADER ? len - pos : TLS_RECORD_HEADER;
        /* the first record decides whether this is TLS at all; a later odd one is bad TLS */
        if (hdr >= 1 && buf[pos] != TLS_CONTENT_HANDSHAKE)
            return records == 0 ? SNIFF_NOT_TLS : SNIFF_BAD;
        if (hdr >= 2 && buf[pos + 1] != 3)
            return records == 0 ? SNIFF_NOT_TLS : SNIFF_BAD;
        if (hdr >= 3 && buf[pos + 2] > 4) /* record versions 3.0 (SSL 3) to 3.4 */
            return SNIFF_BAD;
        if (hdr < TLS_RECORD_HEADER) {
            size_t rest = msg_len ? msg_len - have : TLS_HANDSHAKE_HEADER - have;
            out->need = pos + TLS_RECORD_HEADER + rest;
            return SNIFF_MORE;
        }
        size_t rlen = (size_t)buf[pos + 3] << 8 | buf[pos + 4];
        if (rlen == 0 || rlen > SNIFF_TLS_RECORD_MAX)
            return SNIFF_BAD;
        size_t frag = pos + TLS_RECORD_HEADER;
        size_t avail = len - frag < rlen ? len - frag : rlen;
        for (size_t i = 0; i < avail && have + i < TLS_HANDSHAKE_HEADER; i++)
            hs[have + i] = buf[frag + i];
        size_t known = have + avail;
        if (known >= 1 && hs[0] != TLS_CLIENT_HELLO)
            return SNIFF_BAD; /* a client speaks first with a ClientHello, nothing else */
        if (!msg_len && known >= TLS_HANDSHAKE_HEADER) {
            msg_len = TLS_HANDSHAKE_HEADER + ((size_t)hs[1] << 16 | (size_t)hs[2] << 8 | hs[3]);
            if (msg_len > SNIFF_TLS_HELLO_MAX)
                return SNIFF_BAD;
        }
        /* nothing may follow the hello in its record, and no hello is longer than the limit */
        if ((msg_len && have + rlen > msg_len) || have + rlen > SNIFF_TLS_HELLO_MAX)
            return SNIFF_BAD;
        if (avail < rlen) {
            size_t after = have + rlen;
            size_t rest = msg_len                        ? msg_len - after
                          : after < TLS_HANDSHAKE_HEADER ? TLS_HANDSHAKE_HEADER - after
                                                         : 0;
            out->need = frag + rlen + (rest ? TLS_RECORD_HEADER + rest : 0);
            return SNIFF_MORE;
        }
        have += rlen;
        pos = frag + rlen;
        records++;
        if (msg_len && have == msg_len)
            break;
    }

    struct hello_reader r = {.buf = buf, .end = pos, .msg_len = msg_len};
    if (parse_hello(&r, out) < 0 || r.off != msg_len || r.pos != pos) {
        memset(out, 0, sizeof(*out));
        return SNIFF_BAD;
    }
    out->consumed = pos;
    out->records = records;
    return SNIFF_OK;
}

/* ---- HTTP/1.x ---- */

#define HTTP_DEFAULT_PORT 80
#define HTTP_VERSION_LEN 8 /* "HTTP/1.1" */
#define PORT_DIGITS_MAX 5
#define CHUNK_SIZE_DIGITS_MAX 16 /* fits in 64 bits */

/* RFC 9110 5.6.2: the characters of a token (methods, field names). */
static int tchar(uint8_t c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* A byte allowed in a field value (and chunk extensions): visible, space, tab, obs-text. */
static int value_char(uint8_t c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

/* Whether n bytes at p are want, ignoring ASCII case. */
static int same_ci(const char *p, size_t n, const char *want)
{
    if (strlen(want) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (lower((uint8_t)p[i]) != want[i])
            return 0;
    return 1;
}

/* The same with '_' read as '-' (how some servers and CGI map field names). */
static int same_loose(const char *p, size_t n, const char *want)
{
    if (strlen(want) != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i] == '_' ? '-' : lower((uint8_t)p[i]);
        if (c != want[i])
            return 0;
    }
    return 1;
}

/* host[:port] as it appears in Host, an absolute-form target or CONNECT's target. */
struct authority {
    char host[SNIFF_NAME_MAX + 1];
    int port;
    int port_given;
    int v6;
};

static int parse_authority(const char *s, size_t n, struct authority *a)
{
    memset(a, 0, sizeof(*a));
    size_t i = 0;
    if (n > 0 && s[0] == '[') {
        /* an IPv6 literal; no zone ("%25..."), no IPvFuture */
        while (i + 1 < n && s[i + 1] != ']')
            i++;
        size_t inner = i;
        if (i + 1 >= n || inner < 2 || inner >= INET6_ADDRSTRLEN)
            return -1;
        for (size_t k = 0; k < inner; k++) {
            char c = lower((uint8_t)s[1 + k]);
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == ':' || c == '.'))
                return -1;
            a->host[k] = c;
        }
        a->host[inner] = '\0';
        uint8_t bin[16];
        if (inet_pton(AF_INET6, a->host, bin) != 1)
            return -1;
        a->v6 = 1;
        i = inner + 2;
    } else {
        while (i < n && s[i] != ':') {
            if (!name_char((uint8_t)s[i]) || i >= SNIFF_NAME_MAX)
                return -1;
            a->host[i] = lower((uint8_t)s[i]);
            i++;
        }
        if (i == 0)
            return -1;
        a->host[i] = '\0';
    }
    a->port = HTTP_DEFAULT_PORT;
    if (i == n)
        return 0;
    if (s[i] != ':')
        return -1;
    size_t digits = n - i - 1;
    if (digits == 0 || digits > PORT_DIGITS_MAX)
        return -1;
    int port = 0;
    for (size_t k = i + 1; k < n; k++) {
        if (s[k] < '0' || s[k] > '9')
            return -1;
        port = port * 10 + (s[k] - '0');
    }
    if (port < 1 || port > 65535)
        return -1;
    a->port = port;
    a->port_given = 1;
    return 0;
}

static int same_authority(const struct authority *a, const struct authority *b)
{
    return a->v6 == b->v6 && strcmp(a->host, b->host) == 0 && a->port == b->port;
}

/* What the header fields said, gathered line by line. */
struct fields {
    int hosts;
    struct authority host;
    int has_length;
    uint64_t length;
    int chunked;
};

/* A Content-Length value (vn bytes at v): 1..SNIFF_HTTP_LENGTH_DIGITS_MAX digits, nothing else.
 * 0 with *out set, or -1. */
static int parse_length(const char *v, size_t vn, uint64_t *out)
{
    if (vn == 0 || vn > SNIFF_HTTP_LENGTH_DIGITS_MAX)
        return -1;
    uint64_t len = 0;
    for (size_t i = 0; i < vn; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        len = len * 10 + (uint64_t)(v[i] - '0');
    }
    *out = len;
    return 0;
}

/* Splits a field line (n bytes, no CRLF) into its name's length (*colon) and its value without
 * the white space around it (*v, *vn). -1 if it is no field: a name that is not a token (white
 * space before the colon, folding), no colon, an empty name, or a byte no value may hold. */
static int split_field(const char *p, size_t n, size_t *colon, const char **v, size_t *vn)
{
    size_t c = 0;
    while (c < n && p[c] != ':') {
        if (!tchar((uint8_t)p[c]))
            return -1;
        c++;
    }
    if (c == 0 || c == n)
        return -1;
    for (size_t i = c + 1; i < n; i++)
        if (!value_char((uint8_t)p[i]))
            return -1;
    size_t vs = c + 1, ve = n;
    while (vs < ve && (p[vs] == ' ' || p[vs] == '\t'))
        vs++;
    while (ve > vs && (p[ve - 1] == ' ' || p[ve - 1] == '\t'))
        ve--;
    *colon = c;
    *v = p + vs;
    *vn = ve - vs;
    return 0;
}

/* One header field line (without its CRLF); 0, or -1 if the request must be refused. */
static int parse_field(const char *p, size_t n, int minor, struct sniff_http *out, struct fields *f)
{
    size_t colon, vn;
    const char *v;
    if (split_field(p, n, &colon, &v, &vn) < 0)
        return -1;

    static const char *const framing[] = {"host", "content-length", "transfer-encoding"};
    for (size_t k = 0; k < sizeof(framing) / sizeof(framing[0]); k++)
        if (same_loose(p, colon, framing[k]) && !same_ci(p, colon, framing[k]))
            return -1; /* "Content_Length": another reader may take it for the real one */

    if (same_ci(p, colon, "host")) {
        if (++f->hosts > 1 || parse_authority(v, vn, &f->host) < 0)
            return -1;
        out->host_hdr.p = v;
        out->host_hdr.len = vn;
    } else if (same_ci(p, colon, "content-length")) {
        uint64_t len;
        if (f->chunked || parse_length(v, vn, &len) < 0)
            return -1;
        if (f->has_length && len != f->length)
            return -1;
        f->has_length = 1;
        f->length = len;
    } else if (same_ci(p, colon, "transfer-encoding")) {
        /* chunked alone: other codings would need the proxy to decode them to find the end */
        if (f->chunked || f->has_length || minor == 0 || !same_ci(v, vn, "chunked"))
            return -1;
        f->chunked = 1;
    } else if (same_ci(p, colon, "upgrade")) {
        /* Only a lone "websocket" may become a tunnel; h2c and lists are refused whole. */
        int ws = out->upgrade == SNIFF_UPGRADE_NONE && same_ci(v, vn, "websocket");
        out->upgrade = ws ? SNIFF_UPGRADE_WEBSOCKET : SNIFF_UPGRADE_OTHER;
    }
    return 0;
}

/* The request line (without its CRLF) after the method and its space. */
static int parse_request_line(const char *p, size_t n, size_t method_len, struct sniff_http *out)
{
    size_t ts = method_len + 1, te = ts;
    while (te < n && p[te] != ' ') {
        if ((uint8_t)p[te] < 0x21 || (uint8_t)p[te] > 0x7e)
            return -1;
        te++;
    }
    if (te == ts || n - te != 1 + HTTP_VERSION_LEN)
        return -1;
    if (memcmp(p + te + 1, "HTTP/1.1", HTTP_VERSION_LEN) == 0)
        out->minor = 1;
    else if (memcmp(p + te + 1, "HTTP/1.0", HTTP_VERSION_LEN) == 0)
        out->minor = 0;
    else
        return -1;
    out->method.p = p;
    out->method.len = method_len;
    out->target.p = p + ts;
    out->target.len = te - ts;
    return 0;
}

/* The target against the Host field, once all fields are in. */
static int check_target(struct sniff_http *out, const struct fields *f)
{
    const char *t = out->target.p;
    size_t tn = out->target.len;
    struct authority a;
    out->path = out->target;
    out->is_connect = out->method.len == 7 && memcmp(out->method.p, "CONNECT", 7) == 0;
    if (out->is_connect) {
        /* authority-form, port required; Host names the same host (and port, if it has one) */
        if (parse_authority(t, tn, &a) < 0 || !a.port_given)
            return -1;
        if (a.v6 != f->host.v6 || strcmp(a.host, f->host.host) != 0 ||
            (f->host.port_given && f->host.port != a.port))
            return -1;
        if (f->has_length || f->chunked)
            return -1;
        out->path.p = t + tn;
        out->path.len = 0;
    } else if (t[0] == '/') {
        a = f->host; /* origin-form */
    } else if (tn == 1 && t[0] == '*') {
        if (!(out->method.len == 7 && memcmp(out->method.p, "OPTIONS", 7) == 0))
            return -1;
        a = f->host;
    } else if (tn > 7 && same_ci(t, 7, "http://")) {
        size_t as = 7, ae = as;
        while (ae < tn && t[ae] != '/' && t[ae] != '?')
            ae++;
        if (parse_authority(t + as, ae - as, &a) < 0 || !same_authority(&a, &f->host))
            return -1;
        out->absolute = 1;
        out->path.p = t + ae;
        out->path.len = tn - ae;
    } else {
        return -1; /* "pypi.org@evil.test", "https://...", authority-form without CONNECT */
    }
    memcpy(out->host, a.host, sizeof(out->host));
    out->port = a.port;
    out->port_given = a.port_given;
    out->host_is_v6 = a.v6;
    struct sockaddr_storage ss;
    out->host_is_addr = a.v6 || addr_parse_literal(a.host, &ss) != 0;
    return 0;
}

int sniff_http(const uint8_t *buf, size_t len, struct sniff_http *out)
{
    memset(out, 0, sizeof(*out));
    const char *s = (const char *)buf;
    size_t m = 0;
    while (m < len && m <= SNIFF_HTTP_METHOD_MAX && tchar(buf[m]))
        m++;
    if (m > SNIFF_HTTP_METHOD_MAX)
        return SNIFF_NOT_HTTP;
    if (m == len)
        return SNIFF_MORE;
    if (m == 0 || buf[m] != ' ')
        return SNIFF_NOT_HTTP;

    size_t limit = len < SNIFF_HTTP_HEAD_MAX ? len : SNIFF_HTTP_HEAD_MAX;
    struct fields f = {0};
    size_t ls = 0; /* start of the current line */
    for (;;) {
        const uint8_t *lf = memchr(buf + ls, '\n', limit - ls);
        if (!lf)
            return len >= SNIFF_HTTP_HEAD_MAX ? SNIFF_BAD : SNIFF_MORE;
        size_t le = (size_t)(lf - buf);
        if (le == ls || buf[le - 1] != '\r')
            return SNIFF_BAD; /* a bare LF */
        size_t n = le - 1 - ls;
        if (ls == 0) {
            if (parse_request_line(s, n, m, out) < 0)
                return SNIFF_BAD;
        } else if (n == 0) {
            out->head_len = le + 1;
            break;
        } else if (parse_field(s + ls, n, out->minor, out, &f) < 0) {
            return SNIFF_BAD;
        }
        ls = le + 1;
    }
    if (f.hosts != 1 || check_target(out, &f) < 0) {
        memset(out, 0, sizeof(*out));
        return SNIFF_BAD;
    }
    if (out->is_connect) {
        out->body = SNIFF_BODY_TUNNEL;
    } else if (f.chunked) {
        out->body = SNIFF_BODY_CHUNKED;
    } else if (f.has_length) {
        out->body = SNIFF_BODY_LENGTH;
        out->content_length = f.length;
    }
    return SNIFF_OK;
}

/* ---- answers ---- */

/* One answer field line (without its CRLF); 0, or -1 if the head cannot be followed. */
static int answer_field(const char *p, size_t n, struct sniff_answer *out, int *has_length,
                        int *has_te)
{
    size_t colon, vn;
    const char *v;
    if (split_field(p, n, &colon, &v, &vn) < 0)
        return -1;
    if (same_ci(p, colon, "content-length")) {
        uint64_t len;
        if (parse_length(v, vn, &len) < 0)
            return -1;
        if (*has_length && len != out->content_length)
            return -1;
        *has_length = 1;
        out->content_length = len;
    } else if (same_ci(p, colon, "transfer-encoding")) {
        /* RFC 9112 6.3: chunked last frames the body, any other coding last runs to the close,
           and either way Content-Length is ignored. */
        size_t ls = vn;
        while (ls > 0 && v[ls - 1] != ',')
            ls--;
        while (ls < vn && (v[ls] == ' ' || v[ls] == '\t'))
            ls++;
        out->body = same_ci(v + ls, vn - ls, "chunked") ? SNIFF_BODY_CHUNKED : SNIFF_BODY_CLOSE;
        *has_te = 1;
    } else if (same_ci(p, colon, "upgrade")) {
        out->websocket = same_ci(v, vn, "websocket");
    }
    return 0;
}

int sniff_http_answer(const uint8_t *buf, size_t len, struct sniff_answer *out)
{
    memset(out, 0, sizeof(*out));
    const char *s = (const char *)buf;
    size_t limit = len < SNIFF_HTTP_HEAD_MAX ? len : SNIFF_HTTP_HEAD_MAX;
    static const char version[] = "HTTP/1.";
    size_t vl = sizeof(version) - 1;
    if (memcmp(buf, version, limit < vl ? limit : vl) != 0)
        return SNIFF_BAD;
    int has_length = 0, has_te = 0;
    size_t ls = 0;
    for (;;) {
        const uint8_t *lf = memchr(buf + ls, '\n', limit - ls);
        if (!lf)
            return len >= SNIFF_HTTP_HEAD_MAX ? SNIFF_BAD : SNIFF_MORE;
        size_t le = (size_t)(lf - buf);
        if (le == ls || buf[le - 1] != '\r')
            return SNIFF_BAD;
        size_t n = le - 1 - ls;
        if (ls == 0) {
            /* "HTTP/1.x DDD" then " reason" or nothing */
            if (n < vl + 5 || (s[vl] != '0' && s[vl] != '1') || s[vl + 1] != ' ' ||
                (n > vl + 5 && s[vl + 5] != ' '))
                return SNIFF_BAD;
            int status = 0;
            for (size_t i = vl + 2; i < vl + 5; i++) {
                if (s[i] < '0' || s[i] > '9')
                    return SNIFF_BAD;
                status = status * 10 + (s[i] - '0');
            }
            for (size_t i = vl + 5; i < n; i++)
                if (!value_char((uint8_t)s[i]))
                    return SNIFF_BAD;
            if (status < 100)
                return SNIFF_BAD;
            out->status = status;
            out->minor = s[vl] - '0';
        } else if (n == 0) {
            out->head_len = le + 1;
            break;
        } else {
            if (answer_field(s + ls, n, out, &has_length, &has_te) < 0)
                return SNIFF_BAD;
        }
        ls = le + 1;
    }
    if (!has_te)
        out->body = has_length ? SNIFF_BODY_LENGTH : SNIFF_BODY_CLOSE;
    if (out->body != SNIFF_BODY_LENGTH)
        out->content_length = 0;
    return SNIFF_OK;
}

/* ---- chunked bodies ---- */

enum {
    CH_SIZE,     /* chunk-size digits */
    CH_EXT,      /* after ';': chunk extensions */
    CH_SIZE_LF,  /* the size line's CR seen */
    CH_DATA,     /* chunk data */
    CH_DATA_CR,  /* the CRLF after the data */
    CH_DATA_LF,  /* ... its LF */
    CH_TR_START, /* the start of a trailer line, or the final CRLF */
    CH_TR_NAME,  /* a trailer field name */
    CH_TR_VALUE, /* its value */
    CH_TR_LF,    /* its CR seen */
    CH_END_LF,   /* the final CR seen */
    CH_DONE,
    CH_BAD,
};

void sniff_chunked_init(struct sniff_chunked *c)
{
    memset(c, 0, sizeof(*c));
    c->state = CH_SIZE;
}

int sniff_chunked_feed(struct sniff_chunked *c, const uint8_t *buf, size_t len, size_t *consumed)
{
    *consumed = 0;
    if (c->state == CH_DONE)
        return SNIFF_DONE;
    if (c->state == CH_BAD)
        return SNIFF_BAD;
    size_t i = 0;
    while (i < len) {
        if (c->state == CH_DATA) {
            size_t take = len - i;
            if (c->left < take)
                take = (size_t)c->left;
            i += take;
            c->left -= take;
            if (c->left == 0)
                c->state = CH_DATA_CR;
            continue;
        }
        uint8_t b = buf[i];
        int d;
        switch (c->state) {
        case CH_SIZE:
            if (b != '\r' && ++c->line > SNIFF_CHUNK_LINE_MAX)
                goto bad;
            d = hex_digit(b);
            if (d >= 0) {
                if (++c->digits > CHUNK_SIZE_DIGITS_MAX)
                    goto bad;
                c->size = c->size << 4 | (uint64_t)d;
            } else if (c->digits == 0) {
                goto bad;
            } else if (b == ';') {
                c->state = CH_EXT;
            } else if (b == '\r') {
                c->state = CH_SIZE_LF;
            } else {
                goto bad; /* whitespace after the size is where readers disagree */
            }
            break;
        case CH_EXT:
            if (b != '\r' && ++c->line > SNIFF_CHUNK_LINE_MAX)
                goto bad;
            if (b == '\r')
                c->state = CH_SIZE_LF;
            else if (!value_char(b))
                goto bad;
            break;
        case CH_SIZE_LF:
            if (b != '\n')
                goto bad;
            c->left = c->size;
            c->state = c->size ? CH_DATA : CH_TR_START;
            c->line = 0;
            c->digits = 0;
            c->size = 0;
            break;
        case CH_DATA_CR:
            if (b != '\r')
                goto bad;
            c->state = CH_DATA_LF;
            break;
        case CH_DATA_LF:
            if (b != '\n')
                goto bad;
            c->state = CH_SIZE;
            break;
        case CH_TR_START:
        case CH_TR_NAME:
        case CH_TR_VALUE:
        case CH_TR_LF:
        case CH_END_LF:
            if (++c->trailer > SNIFF_CHUNK_TRAILER_MAX)
                goto bad;
            if (c->state == CH_TR_START) {
                if (b == '\r')
                    c->state = CH_END_LF;
                else if (tchar(b))
                    c->state = CH_TR_NAME;
                else
                    goto bad; /* folding, or whitespace before a name */
            } else if (c->state == CH_TR_NAME) {
                if (b == ':')
                    c->state = CH_TR_VALUE;
                else if (!tchar(b))
                    goto bad;
            } else if (c->state == CH_TR_VALUE) {
                if (b == '\r')
                    c->state = CH_TR_LF;
                else if (!value_char(b))
                    goto bad;
            } else if (c->state == CH_TR_LF) {
                if (b != '\n')
                    goto bad;
                c->state = CH_TR_START;
            } else {
                if (b != '\n')
                    goto bad;
                c->state = CH_DONE;
                *consumed = i + 1;
                return SNIFF_DONE;
            }
            break;
        default: goto bad;
        }
        i++;
    }
    *consumed = len;
    return SNIFF_MORE;
bad:
    c->state = CH_BAD;
    *consumed = i;
    return SNIFF_BAD;
}

const char *sniff_result_name(int result)
{
    switch (result) {
    case SNIFF_BAD: return "bad";
    case SNIFF_OK: return "ok";
    case SNIFF_MORE: return "more";
    case SNIFF_DONE: return "done";
    case SNIFF_NOT_TLS: return "not_tls";
    case SNIFF_NOT_HTTP: return "not_http";
    }
    return "unknown";
}
