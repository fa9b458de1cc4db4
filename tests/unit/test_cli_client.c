/*
 * Unit tests for the CLI's HTTP client: the pure parsers in src/cli/wire.c (base URLs, response
 * heads, chunked bodies, NDJSON lines, error envelopes) fed every way a network can split
 * them, then cli_request_do end to end against a tiny forked server on a Unix socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/client.h"
#include "cli/wire.h"
#include "tap.h"

/* ---- base URLs ---- */

static void test_url(void)
{
    struct cli_url u;
    struct wr_err err = {0};
    ok(cli_url_parse("http://127.0.0.1:7070", &u, &err) == 0 && !u.is_unix &&
           strcmp(u.host, "127.0.0.1") == 0 && strcmp(u.port, "7070") == 0 && u.prefix[0] == 0,
       "url: http host:port");
    ok(cli_url_parse("http://example.com", &u, &err) == 0 && strcmp(u.port, "80") == 0,
       "url: default port 80");
    ok(cli_url_parse("http://[::1]:8080/base//", &u, &err) == 0 && strcmp(u.host, "::1") == 0 &&
           strcmp(u.port, "8080") == 0 && strcmp(u.prefix, "/base") == 0,
       "url: IPv6 with a path prefix, trailing slashes dropped");
    ok(cli_url_parse("unix:/run/wr.sock", &u, &err) == 0 && u.is_unix &&
           strcmp(u.path, "/run/wr.sock") == 0,
       "url: unix:/path");
    ok(cli_url_parse("unix:///run/wr.sock", &u, &err) == 0 && strcmp(u.path, "/run/wr.sock") == 0,
       "url: unix:///path");
    ok(cli_url_parse("https://h:1", &u, &err) == 0 && u.tls && strcmp(u.host, "h") == 0 &&
           strcmp(u.port, "1") == 0,
       "url: https host:port");
    ok(cli_url_parse("HTTPS://[::1]/p", &u, &err) == 0 && u.tls && strcmp(u.port, "443") == 0 &&
           strcmp(u.host, "::1") == 0 && strcmp(u.prefix, "/p") == 0,
       "url: https default port 443");
    ok(cli_url_parse("http://h", &u, &err) == 0 && !u.tls, "url: http is not tls");
    ok(cli_url_parse("httpsx://h", &u, &err) < 0, "url: httpsx refused");
    ok(cli_url_parse("ftp://h", &u, &err) < 0, "url: other scheme refused");
    ok(cli_url_parse("http://h:0", &u, &err) < 0, "url: port 0 refused");
    ok(cli_url_parse("http://h:65536", &u, &err) < 0, "url: port 65536 refused");
    ok(cli_url_parse("http://h:7x", &u, &err) < 0, "url: non-numeric port refused");
    ok(cli_url_parse("http://:7070", &u, &err) < 0, "url: empty host refused");
    ok(cli_url_parse("http://u:p@h:1", &u, &err) < 0, "url: user info refused");
    ok(cli_url_parse("http://h:1/?q=1", &u, &err) < 0, "url: query refused");
    ok(cli_url_parse("unix:", &u, &err) < 0, "url: unix without a path refused");
    char longp[200];
    memset(longp, 'a', sizeof(longp));
    memcpy(longp, "unix:/", 6);
    longp[sizeof(longp) - 1] = 0;
    ok(cli_url_parse(longp, &u, &err) < 0, "url: over-long socket path refused");
}

/* ---- where a key may go ---- */

static void test_key_safe(void)
{
    static const char *const loop[] = {"localhost", "LOCALHOST", "localhost.",
                                       "127.0.0.1", "127.1.2.3", "127.255.255.254",
                                       "::1",       "0:0::1",    "::ffff:127.0.0.1"};
    for (size_t i = 0; i < sizeof(loop) / sizeof(loop[0]); i++)
        ok(cli_host_is_loopback(loop[i]), "loopback: %s", loop[i]);
    static const char *const not_loop[] = {"10.0.0.1",
                                           "128.0.0.1",
                                           "0.0.0.0",
                                           "::",
                                           "::2",
                                           "::ffff:10.0.0.1",
                                           "127.1",
                                           "0x7f000001",
                                           "localhost.evil",
                                           "evil.localhost",
                                           "127.0.0.1.nip.io",
                                           "localhost:1",
                                           "",
                                           "2130706433"};
    for (size_t i = 0; i < sizeof(not_loop) / sizeof(not_loop[0]); i++)
        ok(!cli_host_is_loopback(not_loop[i]), "not loopback by its spelling: '%s'", not_loop[i]);

    struct cli_url u;
    struct wr_err err = {0};
    cli_url_parse("http://127.0.0.1:7070", &u, &err);
    ok(cli_url_key_safe(&u), "key safe: plain http to 127.0.0.1");
    cli_url_parse("http://[::1]:7070", &u, &err);
    ok(cli_url_key_safe(&u), "key safe: plain http to [::1]");
    cli_url_parse("unix:/run/wr.sock", &u, &err);
    ok(cli_url_key_safe(&u), "key safe: the Unix socket");
    cli_url_parse("https://10.0.0.1:7070", &u, &err);
    ok(cli_url_key_safe(&u), "key safe: https anywhere");
    cli_url_parse("http://10.0.0.1:7070", &u, &err);
    ok(!cli_url_key_safe(&u), "key not safe: plain http to 10.0.0.1");
    cli_url_parse("http://api.example.com", &u, &err);
    ok(!cli_url_key_safe(&u), "key not safe: plain http to a name");

    /* Refused before any connect: 0.0.0.0 is not loopback by its spelling, but a connect to
     * it would stay on this host (and be refused), so a broken check cannot send anything
     * anywhere, and shows as ECONNREFUSED instead of EPERM. */
    struct cli_endpoint ep = {0};
    cli_url_parse("http://0.0.0.0:1", &ep.url, &err);
    snprintf(ep.desc, sizeof(ep.desc), "http://0.0.0.0:1");
    snprintf(ep.key, sizeof(ep.key), "wr_secret");
    struct cli_request req;
    cli_request_init(&req, "GET", "/v1/health");
    struct cli_response resp;
    int r = cli_request_do(&ep, &req, &resp, &err);
    ok(r < 0 && err.code == EPERM && strstr(err.msg, "clear text") && !strstr(err.msg, "wr_"),
       "a key over plain http to a non-loopback host is refused before connecting: %s", err.msg);
    cli_response_free(&resp);
    ep.key[0] = '\0';
    r = cli_request_do(&ep, &req, &resp, &err);
    ok(r < 0 && err.code == ECONNREFUSED, "without a key it is tried (%s)", err.msg);
    cli_response_free(&resp);
}

/* ---- response heads ---- */

static ssize_t head(const char *s, struct cli_head *h, struct wr_err *err)
{
    return cli_head_parse(s, strlen(s), h, err);
}

static void test_head(void)
{
    struct cli_head h;
    struct wr_err err = {0};
    const char *r = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    "Content-Length: 12\r\n\r\n{\"a\":1}xxxxx";
    ssize_t n = head(r, &h, &err);
    ok(n == (ssize_t)(strstr(r, "{") - r), "head: length up to the body");
    ok(h.status == 200 && strcmp(h.reason, "OK") == 0 && h.minor == 1, "head: status and reason");
    ok(h.content_length == 12 && !h.chunked, "head: content length");
    ok(strcmp(h.content_type, "application/json") == 0, "head: content type");

    /* Every strict prefix is "need more", never an error or a false success. */
    size_t hl = (size_t)n;
    int bad = 0;
    for (size_t i = 0; i < hl; i++)
        if (cli_head_parse(r, i, &h, &err) != 0)
            bad++;
    ok(bad == 0, "head: every prefix of a head asks for more");

    ok(head("HTTP/1.1 204 No Content\n\n", &h, &err) == 25 && h.status == 204,
       "head: bare LF line ends");
    ok(head("HTTP/1.1 200\r\n\r\n", &h, &err) > 0 && h.reason[0] == 0, "head: no reason phrase");
    ok(head("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", &h, &err) == 25 &&
           h.status == 100,
       "head: interim 100 parsed on its own");
    ok(head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", &h, &err) > 0 && h.chunked &&
           h.content_length == -1,
       "head: chunked");
    ok(head("HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n\r\n", &h, &err) > 0 && h.close,
       "head: Connection list with close");
    ok(head("HTTP/1.1 200 OK\r\ncontent-length:  7 \r\n\r\n", &h, &err) > 0 &&
           h.content_length == 7,
       "head: field names are case-insensitive, values trimmed");
    ok(head("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nContent-Length: 7\r\n\r\n", &h, &err) > 0,
       "head: equal duplicate Content-Length accepted");

    /* Garbage. */
    ok(cli_head_parse("SSH-", 4, &h, &err) < 0, "head: foreign protocol refused at once");
    ok(head("HTTP/1.1 2x0 OK\r\n\r\n", &h, &err) < 0, "head: bad status code");
    ok(head("HTTP/1.1 099 Low\r\n\r\n", &h, &err) < 0, "head: status below 100");
    ok(head("HTTP/2 200 OK\r\n\r\n", &h, &err) < 0, "head: not HTTP/1.x");
    ok(head("HTTP/1.1 200OK\r\n\r\n", &h, &err) < 0, "head: no space after the code");
    ok(head("HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", &h, &err) < 0, "head: field without colon");
    ok(head("HTTP/1.1 200 OK\r\nA: b\r\n folded\r\n\r\n", &h, &err) < 0, "head: obs-fold");
    ok(head("HTTP/1.1 200 OK\r\nBad Name: b\r\n\r\n", &h, &err) < 0, "head: space in name");
    ok(head("HTTP/1.1 200 OK\r\nA: b\x01\r\n\r\n", &h, &err) < 0, "head: control char in value");
    ok(head("HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n", &h, &err) < 0,
       "head: bad Content-Length");
    ok(head("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", &h, &err) < 0,
       "head: negative Content-Length");
    ok(head("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", &h, &err) < 0,
       "head: conflicting Content-Length");
    ok(head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &h, &err) < 0,
       "head: compressed transfer coding refused");
    ok(head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", &h,
            &err) < 0,
       "head: both Content-Length and chunked refused");
    ok(cli_head_parse("HTTP/1.1 200 OK\r\n\0\r\n\r\n", 22, &h, &err) < 0, "head: NUL byte");

    /* Oversized: a head that never ends, and one with too many fields. */
    size_t big = CLI_HEAD_MAX + 100;
    char *b = malloc(big);
    memcpy(b, "HTTP/1.1 200 OK\r\n", 17);
    for (size_t i = 17; i < big; i += 10)
        memcpy(b + i, "X-A: bbb\r\n", big - i < 10 ? big - i : 10);
    n = cli_head_parse(b, big, &h, &err);
    ok(n < 0 && err.code == EMSGSIZE, "head: over CLI_HEAD_MAX without an end refused");
    ok(cli_head_parse(b, 4096, &h, &err) == 0, "head: a long head below the limit asks for more");
    size_t off = 17 + (CLI_HEADERS_MAX + 1) * 10;
    memcpy(b + off, "\r\n", 2);
    n = cli_head_parse(b, off + 2, &h, &err);
    ok(n < 0 && err.code == EMSGSIZE, "head: more than CLI_HEADERS_MAX fields refused");
    off = 17 + CLI_HEADERS_MAX * 10;
    memcpy(b + off, "\r\n", 2);
    ok(cli_head_parse(b, off + 2, &h, &err) > 0, "head: exactly CLI_HEADERS_MAX fields accepted");
    free(b);
}

/* ---- chunked ---- */

struct collect {
    char buf[4096];
    size_t len;
    int calls;
    int fail_at; /* make the Nth call fail (1-based); 0 never */
};

static int collect_fn(void *ctx, const char *data, size_t len, struct wr_err *err)
{
    struct collect *c = ctx;
    if (++c->calls == c->fail_at)
        return wr_err_set(err, EIO, "sink failed");
    if (c->len + len > sizeof(c->buf))
        return wr_err_set(err, EMSGSIZE, "too much");
    memcpy(c->buf + c->len, data, len);
    c->len += len;
    return 0;
}

/* Decodes s fed in pieces of `step` bytes; returns total bytes consumed or -1. */
static ssize_t chunked_steps(const char *s, size_t len, size_t step, struct collect *c,
                             struct cli_chunked *d, struct wr_err *err)
{
    cli_chunked_init(d);
    memset(c->buf, 0, sizeof(c->buf));
    c->len = 0;
    c->calls = 0;
    size_t used = 0;
    while (used < len && !cli_chunked_done(d)) {
        size_t n = len - used < step ? len - used : step;
        ssize_t r = cli_chunked_feed(d, s + used, n, collect_fn, c, err);
        if (r < 0)
            return -1;
        used += (size_t)r;
        if ((size_t)r < n)
            break;
    }
    return (ssize_t)used;
}

static ssize_t chunked(const char *s, struct collect *c, struct cli_chunked *d, struct wr_err *err)
{
    return chunked_steps(s, strlen(s), strlen(s), c, d, err);
}

static void test_chunked(void)
{
    struct collect c = {0};
    struct cli_chunked d;
    struct wr_err err = {0};
    const char *body = "5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n";
    size_t blen = strlen(body);
    ok(chunked(body, &c, &d, &err) == (ssize_t)blen && cli_chunked_done(&d) && c.len == 12 &&
           memcmp(c.buf, "hello, world", 12) == 0,
       "chunked: two chunks in one piece");

    int bad = 0;
    for (size_t step = 1; step <= blen; step++) {
        if (chunked_steps(body, blen, step, &c, &d, &err) != (ssize_t)blen ||
            !cli_chunked_done(&d) || c.len != 12 || memcmp(c.buf, "hello, world", 12) != 0)
            bad++;
    }
    ok(bad == 0, "chunked: same result for every piece size 1..%zu", blen);

    /* Every split point into two feeds. */
    bad = 0;
    for (size_t cut = 0; cut <= blen; cut++) {
        cli_chunked_init(&d);
        c.len = 0;
        ssize_t a = cli_chunked_feed(&d, body, cut, collect_fn, &c, &err);
        ssize_t b = cli_chunked_feed(&d, body + cut, blen - cut, collect_fn, &c, &err);
        if (a != (ssize_t)cut || b != (ssize_t)(blen - cut) || !cli_chunked_done(&d) || c.len != 12)
            bad++;
    }
    ok(bad == 0, "chunked: split at every position");

    ok(chunked("A\r\n0123456789\r\n0\r\n\r\n", &c, &d, &err) > 0 && c.len == 10,
       "chunked: uppercase hex size");
    ok(chunked("5;name=value;x=\"q\"\r\nhello\r\n0;last\r\n\r\n", &c, &d, &err) > 0 && c.len == 5 &&
           cli_chunked_done(&d),
       "chunked: extensions ignored");
    ok(chunked("5 ;ext\r\nhello\r\n0\r\n\r\n", &c, &d, &err) > 0 && c.len == 5,
       "chunked: whitespace before an extension");
    ok(chunked("5\r\nhello\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n", &c, &d, &err) > 0 &&
           cli_chunked_done(&d) && c.len == 5,
       "chunked: trailer fields skipped");
    ok(chunked("5\nhello\n0\n\n", &c, &d, &err) > 0 && cli_chunked_done(&d) && c.len == 5,
       "chunked: bare LF accepted");
    ok(chunked("0005\r\nhello\r\n0\r\n\r\n", &c, &d, &err) > 0 && c.len == 5,
       "chunked: leading zeros");

    const char *extra = "3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK";
    ok(chunked(extra, &c, &d, &err) == (ssize_t)(strlen(extra) - 15) && cli_chunked_done(&d),
       "chunked: stops at the end of the body");

    ok(chunked("g\r\nx\r\n0\r\n\r\n", &c, &d, &err) < 0, "chunked: non-hex size refused");
    ok(chunked("\r\nx\r\n0\r\n\r\n", &c, &d, &err) < 0, "chunked: empty size refused");
    ok(chunked("-5\r\nhello\r\n", &c, &d, &err) < 0, "chunked: negative size refused");
    ok(chunked(";ext\r\n", &c, &d, &err) < 0, "chunked: extension without size refused");
    ok(chunked("1000000000000000\r\n", &c, &d, &err) < 0, "chunked: 16 hex digits refused");
    ok(chunked("5\r\nhelloX\r\n", &c, &d, &err) < 0, "chunked: missing CRLF after data");
    ok(chunked("5\r\nhello\rX", &c, &d, &err) < 0, "chunked: CR without LF after data");
    ok(chunked("5\rX", &c, &d, &err) < 0, "chunked: CR without LF after size");
    ok(chunked("5;a\x01\r\n", &c, &d, &err) < 0, "chunked: control char in extension");

    char *longext = malloc(CLI_CHUNK_LINE_MAX + 16);
    memcpy(longext, "5;", 2);
    memset(longext + 2, 'x', CLI_CHUNK_LINE_MAX + 4);
    memcpy(longext + CLI_CHUNK_LINE_MAX + 6, "\r\n", 3);
    ok(chunked(longext, &c, &d, &err) < 0 && err.code == EMSGSIZE,
       "chunked: over-long extension refused");
    free(longext);

    char *trailer = malloc(CLI_TRAILER_MAX + 64);
    strcpy(trailer, "0\r\n");
    memset(trailer + 3, 'x', CLI_TRAILER_MAX + 8);
    strcpy(trailer + 3 + CLI_TRAILER_MAX + 8, "\r\n\r\n");
    ok(chunked(trailer, &c, &d, &err) < 0 && err.code == EMSGSIZE,
       "chunked: over-long trailer refused");
    free(trailer);

    c.fail_at = 2;
    ok(chunked(body, &c, &d, &err) < 0 && err.code == EIO && strcmp(err.msg, "sink failed") == 0,
       "chunked: a sink failure stops decoding with its error");
    c.fail_at = 0;

    /* Truncated bodies are not done (the client turns that into an error at EOF). */
    cli_chunked_init(&d);
    cli_chunked_feed(&d, "5\r\nhel", 6, collect_fn, &c, &err);
    ok(!cli_chunked_done(&d), "chunked: truncated body is not done");
    cli_chunked_init(&d);
    cli_chunked_feed(&d, "0\r\n", 3, collect_fn, &c, &err);
    ok(!cli_chunked_done(&d), "chunked: last chunk without the final CRLF is not done");
}

/* ---- NDJSON ---- */

struct lines {
    char got[16][64];
    int n;
};

static int line_fn(void *ctx, const char *l, size_t len, struct wr_err *err)
{
    struct lines *ls = ctx;
    if (ls->n >= 16 || len >= 64)
        return wr_err_set(err, EMSGSIZE, "test buffer");
    memcpy(ls->got[ls->n], l, len);
    ls->got[ls->n][len] = 0;
    ls->n++;
    return 0;
}

static void test_ndjson(void)
{
    const char *s = "{\"a\":1}\n{\"type\":\"stdout\"}\r\n\n{\"b\":[1,2]}\n";
    size_t len = strlen(s);
    struct wr_err err = {0};
    int bad = 0;
    for (size_t cut1 = 0; cut1 <= len; cut1++) {
        for (size_t cut2 = cut1; cut2 <= len; cut2++) {
            struct cli_ndjson nd;
            struct lines ls = {0};
            cli_ndjson_init(&nd, 1024);
            int r = cli_ndjson_feed(&nd, s, cut1, line_fn, &ls, &err);
            r |= cli_ndjson_feed(&nd, s + cut1, cut2 - cut1, line_fn, &ls, &err);
            r |= cli_ndjson_feed(&nd, s + cut2, len - cut2, line_fn, &ls, &err);
            r |= cli_ndjson_finish(&nd, &err);
            if (r != 0 || ls.n != 3 || strcmp(ls.got[0], "{\"a\":1}") != 0 ||
                strcmp(ls.got[1], "{\"type\":\"stdout\"}") != 0 ||
                strcmp(ls.got[2], "{\"b\":[1,2]}") != 0)
                bad++;
            cli_ndjson_free(&nd);
        }
    }
    ok(bad == 0, "ndjson: lines split across three feeds at every pair of points");

    struct cli_ndjson nd;
    struct lines ls = {0};
    cli_ndjson_init(&nd, 1024);
    for (size_t i = 0; i < len; i++)
        cli_ndjson_feed(&nd, s + i, 1, line_fn, &ls, &err);
    ok(ls.n == 3 && cli_ndjson_finish(&nd, &err) == 0, "ndjson: one byte at a time");
    cli_ndjson_free(&nd);

    cli_ndjson_init(&nd, 1024);
    ls.n = 0;
    ok(cli_ndjson_feed(&nd, "{\"a\":1}\n{\"b\"", 12, line_fn, &ls, &err) == 0 && ls.n == 1 &&
           cli_ndjson_finish(&nd, &err) < 0,
       "ndjson: a partial last line is an error at the end");
    cli_ndjson_free(&nd);

    cli_ndjson_init(&nd, 8);
    ls.n = 0;
    ok(cli_ndjson_feed(&nd, "123456789\n", 10, line_fn, &ls, &err) < 0 && err.code == EMSGSIZE,
       "ndjson: an over-long whole line is refused");
    cli_ndjson_free(&nd);
    cli_ndjson_init(&nd, 8);
    ok(cli_ndjson_feed(&nd, "12345", 5, line_fn, &ls, &err) == 0 &&
           cli_ndjson_feed(&nd, "6789", 4, line_fn, &ls, &err) < 0,
       "ndjson: an over-long split line is refused");
    cli_ndjson_free(&nd);
    cli_ndjson_init(&nd, 8);
    ls.n = 0;
    ok(cli_ndjson_feed(&nd, "12345678\n", 9, line_fn, &ls, &err) == 0 && ls.n == 1,
       "ndjson: a line of exactly the limit passes");
    cli_ndjson_free(&nd);
}

/* ---- error envelope, query escaping ---- */

static void test_errors(void)
{
    char msg[256], code[64];
    const char *env = "{\"error\":{\"code\":\"not_found\",\"message\":\"sandbox sb-x not found\"}}";
    cli_error_describe(404, "Not Found", env, strlen(env), msg, sizeof(msg), code, sizeof(code));
    ok(strcmp(msg, "sandbox sb-x not found") == 0 && strcmp(code, "not_found") == 0,
       "error: envelope message and code");
    const char *onlycode = "{\"error\":{\"code\":\"internal\"}}";
    cli_error_describe(500, "Internal", onlycode, strlen(onlycode), msg, sizeof(msg), code,
                       sizeof(code));
    ok(strcmp(msg, "internal (HTTP 500)") == 0, "error: code without message");
    const char *html = "<html>bad gateway</html>\nmore";
    cli_error_describe(502, "Bad Gateway", html, strlen(html), msg, sizeof(msg), code,
                       sizeof(code));
    ok(strcmp(msg, "HTTP 502 Bad Gateway: <html>bad gateway</html>") == 0 && code[0] == 0,
       "error: not an envelope -> status and first line");
    cli_error_describe(503, "", NULL, 0, msg, sizeof(msg), NULL, 0);
    ok(strcmp(msg, "HTTP 503") == 0, "error: empty body");

    char *q = cli_query_escape("/workspace/a b&c=d%é");
    ok(strcmp(q, "/workspace/a%20b%26c%3Dd%25%C3%A9") == 0, "query escape: %s", q);
    free(q);
}

/* ---- end to end over a Unix socket ---- */

static char sock_path[108];

/* Forks a server that accepts one connection, reads the request head (and body per
 * Content-Length, checked with `expect_body_len`), writes `answer` in pieces, and exits. */
static pid_t serve_once(const char *answer, size_t answer_len, long expect_body_len)
{
    int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
    unlink(sock_path);
    if (bind(ls, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(ls, 1) < 0)
        abort();
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0) {
        close(ls);
        return pid;
    }
    int fd = accept(ls, NULL, NULL);
    char req[65536];
    size_t len = 0;
    char *end = NULL;
    while (!end && len < sizeof(req) - 1) {
        ssize_t n = read(fd, req + len, sizeof(req) - 1 - len);
        if (n <= 0)
            _exit(3);
        len += (size_t)n;
        req[len] = 0;
        end = strstr(req, "\r\n\r\n");
    }
    if (!end)
        _exit(3);
    long got = (long)(len - (size_t)(end + 4 - req));
    char *cl = strcasestr(req, "Content-Length:");
    long want = cl ? strtol(cl + 15, NULL, 10) : 0;
    char buf[65536];
    while (got < want) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0)
            _exit(4);
        got += n;
    }
    if (expect_body_len >= 0 && (got != expect_body_len || want != expect_body_len))
        _exit(5);
    if (!strstr(req, "Connection: close\r\n") || !strstr(req, "Host: localhost\r\n"))
        _exit(6);
    if (getenv("TEST_EXPECT_AUTH") && !strstr(req, "Authorization: Bearer k3y\r\n"))
        _exit(7);
    /* Dribble the answer out in small pieces to exercise reassembly. */
    for (size_t i = 0; i < answer_len; i += 7) {
        size_t n = answer_len - i < 7 ? answer_len - i : 7;
        if (write(fd, answer + i, n) < 0)
            _exit(8);
        if (i % 70 == 0)
            usleep(1000);
    }
    close(fd);
    _exit(0);
}

static int reap(pid_t pid)
{
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int nd_line(void *ctx, const char *l, size_t len, struct wr_err *err)
{
    return line_fn(ctx, l, len, err);
}

struct nd_ctx {
    struct cli_ndjson nd;
    struct lines ls;
};

static int nd_data(void *ctx, const char *data, size_t len, struct wr_err *err)
{
    struct nd_ctx *c = ctx;
    return cli_ndjson_feed(&c->nd, data, len, nd_line, &c->ls, err);
}

/* Reads a whole small file into buf (NUL-terminated); returns its length. */
static size_t slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, cap - 1) : -1;
    if (fd >= 0)
        close(fd);
    buf[n > 0 ? n : 0] = 0;
    return n > 0 ? (size_t)n : 0;
}

/* Runs cli_exec_stream against a canned NDJSON answer with fds 1 and 2 sent to files. */
static int stream_case(const struct cli_endpoint *ep, const char *dir, const char *ndjson,
                       char *out, char *errout, size_t *outlen)
{
    char ans[4096];
    int alen = snprintf(ans, sizeof(ans),
                        "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
                        strlen(ndjson), ndjson);
    pid_t pid = serve_once(ans, (size_t)alen, -1);
    char po[256], pe[256];
    snprintf(po, sizeof(po), "%s/out", dir);
    snprintf(pe, sizeof(pe), "%s/err", dir);
    fflush(stdout);
    fflush(stderr);
    int save1 = dup(1), save2 = dup(2);
    int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    dup2(fo, 1);
    dup2(fe, 2);
    json_t *exec = json_pack("{s:[s]}", "argv", "true");
    int code = cli_exec_stream(ep, "sb-test", exec);
    json_decref(exec);
    fflush(stdout);
    fflush(stderr);
    dup2(save1, 1);
    dup2(save2, 2);
    close(save1);
    close(save2);
    close(fo);
    close(fe);
    reap(pid);
    *outlen = slurp(po, out, 256);
    slurp(pe, errout, 256);
    unlink(po);
    unlink(pe);
    return code;
}

static void test_exec_stream(const struct cli_endpoint *ep, const char *dir)
{
    char out[256], errout[256];
    size_t olen;
    int code =
        stream_case(ep, dir,
                    "{\"type\":\"stdout\",\"data\":\"a\\u0000b\\n\",\"encoding\":\"utf-8\"}\n"
                    "{\"type\":\"stderr\",\"data\":\"/w==\",\"encoding\":\"base64\"}\n"
                    "{\"type\":\"future\",\"x\":1}\n"
                    "{\"type\":\"exit\",\"exit_code\":3,\"signal\":null,\"timed_out\":false}\n",
                    out, errout, &olen);
    ok(code == 3 && olen == 4 && memcmp(out, "a\0b\n", 4) == 0 &&
           (unsigned char)errout[0] == 0xff && errout[1] == 0,
       "exec stream: NUL in UTF-8 text, base64 stderr, unknown type skipped, exit 3");
    code = stream_case(ep, dir, "{\"type\":\"exit\",\"exit_code\":-1,\"signal\":9}\n", out, errout,
                       &olen);
    ok(code == 137 && olen == 0, "exec stream: killed by signal 9 -> 137");
    code = stream_case(ep, dir,
                       "{\"type\":\"exit\",\"exit_code\":-1,\"signal\":9,\"timed_out\":true}\n",
                       out, errout, &olen);
    ok(code == 124 && strstr(errout, "timed out"), "exec stream: timed out -> 124 and a message");
    code = stream_case(
        ep, dir, "{\"type\":\"error\",\"code\":\"exec_failed\",\"message\":\"nope: not found\"}\n",
        out, errout, &olen);
    ok(code == 127 && strcmp(errout, "withruntime: nope: not found\n") == 0,
       "exec stream: exec_failed line -> 127 and the daemon's message");
    code = stream_case(ep, dir, "{\"type\":\"stdout\",\"data\":\"x\"}\n", out, errout, &olen);
    ok(code == 1 && strstr(errout, "without the command's exit status"),
       "exec stream: no exit line -> error 1");
    code = stream_case(ep, dir, "{\"type\":\"stdout\",\"data\":\"%%%\",\"encoding\":\"base64\"}\n",
                       out, errout, &olen);
    ok(code == 1 && strstr(errout, "base64"), "exec stream: bad base64 -> error 1");
    code = stream_case(ep, dir, "not json\n", out, errout, &olen);
    ok(code == 1 && strstr(errout, "bad line"), "exec stream: a non-JSON line -> error 1");
}

static void test_e2e(void)
{
    char dir[] = "/tmp/test_cli_client.XXXXXX";
    if (!mkdtemp(dir)) {
        ok(0, "mkdtemp");
        return;
    }
    snprintf(sock_path, sizeof(sock_path), "%s/s.sock", dir);
    struct cli_endpoint ep = {0};
    ep.url.is_unix = true;
    snprintf(ep.url.path, sizeof(ep.url.path), "%s", sock_path);
    snprintf(ep.desc, sizeof(ep.desc), "unix:%s", sock_path);
    struct wr_err err = {0};
    struct cli_response resp;
    struct cli_request req;

    const char *a1 = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     "Content-Length: 15\r\n\r\n{\"status\":\"ok\"}";
    pid_t pid = serve_once(a1, strlen(a1), 0);
    json_t *out = NULL;
    int r = cli_json_call(&ep, "GET", "/v1/health", NULL, &out, &err);
    ok(r == 0 && strcmp(json_string_value(json_object_get(out, "status")), "ok") == 0,
       "e2e: JSON call with Content-Length (%s)", r ? err.msg : "ok");
    json_decref(out);
    ok(reap(pid) == 0, "e2e: server saw a well-formed request");

    const char *a2 = "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n"
                     "1f\r\n{\"error\":{\"code\":\"not_found\",\"m\r\n"
                     "1c\r\nessage\":\"no such sandbox\"}}\n\r\n0\r\n\r\n";
    pid = serve_once(a2, strlen(a2), 2);
    cli_request_init(&req, "POST", "/v1/sandboxes");
    req.body = "{}";
    req.body_len = 2;
    req.content_type = "application/json";
    r = cli_request_do(&ep, &req, &resp, &err);
    ok(r < 0 && err.code == CLI_EAPI && resp.status == 404 &&
           strcmp(err.msg, "no such sandbox") == 0 && strcmp(resp.error_code, "not_found") == 0,
       "e2e: chunked error envelope -> message '%s'", err.msg);
    ok(cli_exit_code(&err) == CLI_EXIT_NOT_FOUND, "e2e: a 404 exits 3");
    cli_response_free(&resp);
    ok(reap(pid) == 0, "e2e: server got the 2-byte body");

    /* Every other 4xx is the daemon refusing (exit 4), a 5xx the daemon failing (exit 5). */
    static const struct {
        const char *answer;
        int code;
    } refusals[] = {
        {"HTTP/1.1 409 Conflict\r\nContent-Length: 0\r\n\r\n", CLI_EXIT_REFUSED},
        {"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", CLI_EXIT_REFUSED},
        {"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", CLI_EXIT_REFUSED},
        {"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", CLI_EXIT_DAEMON},
        {"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n", CLI_EXIT_DAEMON},
    };
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        pid = serve_once(refusals[i].answer, strlen(refusals[i].answer), -1);
        r = cli_json_call(&ep, "GET", "/v1/x", NULL, NULL, &err);
        ok(r < 0 && err.code == CLI_EAPI && cli_exit_code(&err) == refusals[i].code,
           "e2e: a %.3s answer exits %d", refusals[i].answer + 9, refusals[i].code);
        reap(pid);
    }

    const char *a3 = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n"
                     "c\r\n{\"type\":\"std\r\n"
                     "19\r\nout\",\"data\":\"hi\"}\n{\"type\"\r\n"
                     "15\r\n:\"exit\",\"exit_code\":0\r\n"
                     "2\r\n}\n\r\n0\r\n\r\n";
    pid = serve_once(a3, strlen(a3), -1);
    struct nd_ctx nc = {0};
    cli_ndjson_init(&nc.nd, 4096);
    cli_request_init(&req, "POST", "/v1/sandboxes/sb-x/exec");
    req.on_data = nd_data;
    req.ctx = &nc;
    r = cli_request_do(&ep, &req, &resp, &err);
    ok(r == 0 && resp.body == NULL && nc.ls.n == 2 &&
           strcmp(nc.ls.got[0], "{\"type\":\"stdout\",\"data\":\"hi\"}") == 0 &&
           strcmp(nc.ls.got[1], "{\"type\":\"exit\",\"exit_code\":0}") == 0 &&
           cli_ndjson_finish(&nc.nd, &err) == 0,
       "e2e: streamed NDJSON across chunk boundaries (%s)", r ? err.msg : "ok");
    cli_response_free(&resp);
    cli_ndjson_free(&nc.nd);
    reap(pid);

    /* Upload streamed from a file descriptor. */
    char fpath[128];
    snprintf(fpath, sizeof(fpath), "%s/upload", dir);
    int fd = open(fpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    size_t up = 3 * 1024 * 1024 + 17;
    char *blob = malloc(up);
    for (size_t i = 0; i < up; i++)
        blob[i] = (char)(i * 31);
    ok(write(fd, blob, up) == (ssize_t)up, "e2e: wrote the upload file");
    free(blob);
    lseek(fd, 0, SEEK_SET);
    const char *a4 = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
    pid = serve_once(a4, strlen(a4), (long)up);
    cli_request_init(&req, "PUT", "/v1/sandboxes/sb-x/files/content?path=a");
    req.body_fd = fd;
    req.body_len = up;
    setenv("TEST_EXPECT_AUTH", "1", 1);
    snprintf(ep.key, sizeof(ep.key), "k3y");
    r = cli_request_do(&ep, &req, &resp, &err);
    unsetenv("TEST_EXPECT_AUTH");
    ep.key[0] = 0;
    ok(r == 0 && resp.status == 200, "e2e: 3 MiB upload from an fd (%s)", r ? err.msg : "ok");
    cli_response_free(&resp);
    ok(reap(pid) == 0, "e2e: server got exactly the file's bytes and the bearer key");
    close(fd);

    /* Truncated answers are errors, not short successes. */
    const char *a5 = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\":";
    pid = serve_once(a5, strlen(a5), -1);
    r = cli_json_call(&ep, "GET", "/v1/x", NULL, NULL, &err);
    ok(r < 0 && err.code == ECONNRESET && cli_exit_code(&err) == CLI_EXIT_DAEMON,
       "e2e: short Content-Length body is an error (the daemon's: exit 5)");
    reap(pid);
    const char *a6 = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel";
    pid = serve_once(a6, strlen(a6), -1);
    r = cli_json_call(&ep, "GET", "/v1/x", NULL, NULL, &err);
    ok(r < 0 && err.code == ECONNRESET, "e2e: truncated chunked body is an error");
    reap(pid);
    const char *a7 = "garbage\r\n\r\n";
    pid = serve_once(a7, strlen(a7), -1);
    r = cli_json_call(&ep, "GET", "/v1/x", NULL, NULL, &err);
    ok(r < 0 && err.code == EPROTO, "e2e: a non-HTTP answer is refused: %s", err.msg);
    reap(pid);
    const char *a8 = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n{\"z\":1}";
    pid = serve_once(a8, strlen(a8), -1);
    r = cli_json_call(&ep, "GET", "/v1/x", NULL, &out, &err);
    ok(r == 0 && json_integer_value(json_object_get(out, "z")) == 1,
       "e2e: interim 1xx skipped, body read to EOF");
    json_decref(out);
    reap(pid);

    test_exec_stream(&ep, dir);

    unlink(sock_path);
    r = cli_json_call(&ep, "GET", "/v1/x", NULL, NULL, &err);
    ok(r < 0 && err.code == ENOENT && strstr(err.msg, sock_path) &&
           cli_exit_code(&err) == CLI_EXIT_DAEMON,
       "e2e: no socket -> ENOENT naming the socket, exit 5");

    unlink(fpath);
    rmdir(dir);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    test_url();
    test_key_safe();
    test_head();
    test_chunked();
    test_ndjson();
    test_errors();
    test_e2e();
    return tap_done();
}
