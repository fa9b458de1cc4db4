/*
 * The WebSocket wire format (common/ws.c) and the handshake's accept key (http/wsconn.c):
 * frames built and read back, masking, fragmentation, control frames between fragments, bytes
 * fed one at a time, and every hostile frame the reader must refuse with its close code.
 */
#include <stdlib.h>
#include <string.h>

#include "common/ws.h"
#include "http/wsconn.h"
#include "tap.h"

struct got {
    int n;
    int op[32];
    size_t len[32];
    int fin[32], code[32];
    uint8_t data[32][256];
    int stop_with; /* returned by the callback once set */
};

static int cb(void *arg, int op, const uint8_t *data, size_t len, int fin, int code)
{
    struct got *g = arg;
    if (g->n < 32) {
        g->op[g->n] = op;
        g->len[g->n] = len;
        g->fin[g->n] = fin;
        g->code[g->n] = code;
        memcpy(g->data[g->n], data, len < 256 ? len : 256);
        g->n++;
    }
    return g->stop_with;
}

/* A client frame (masked unless mask is 0) into out; returns its length. */
static size_t frame(uint8_t *out, int b0, const void *payload, size_t len, int mask,
                    uint64_t claimed)
{
    uint8_t key[4] = {0x12, 0x34, 0x56, 0x78};
    size_t hl = ws_header_build(out, b0 & 0x0f, claimed ? claimed : len, mask ? key : NULL);
    out[0] = (uint8_t)b0;
    memcpy(out + hl, payload, len);
    if (mask)
        ws_mask(out + hl, len, key, 0);
    return hl + len;
}

static int feed(struct ws_reader *r, uint8_t *buf, size_t len, struct got *g, int bytewise)
{
    if (!bytewise)
        return ws_reader_feed(r, buf, len, cb, g);
    for (size_t i = 0; i < len; i++) {
        int rc = ws_reader_feed(r, buf + i, 1, cb, g);
        if (rc)
            return rc;
    }
    return 0;
}

static void test_good(int bytewise)
{
    struct ws_reader r;
    struct got g = {0};
    uint8_t buf[4096];
    size_t n = 0;
    ws_reader_init(&r, 1, 1 << 20, 1 << 10);
    n += frame(buf + n, 0x82, "bin", 3, 1, 0);
    n += frame(buf + n, 0x01, "{\"a\":", 5, 1, 0); /* text, not fin */
    n += frame(buf + n, 0x89, "ping", 4, 1, 0);    /* a ping between the fragments */
    n += frame(buf + n, 0x80, "1}", 2, 1, 0);      /* continuation, fin */
    n += frame(buf + n, 0x02, "ab", 2, 1, 0);      /* binary in two parts */
    n += frame(buf + n, 0x80, "cd", 2, 1, 0);
    n += frame(buf + n, 0x88,
               "\x03\xe8"
               "bye",
               5, 1, 0); /* close 1000 "bye" */
    int rc = feed(&r, buf, n, &g, bytewise);
    ok(rc == 0, "%s: well-formed frames are read without complaint",
       bytewise ? "bytewise" : "whole");
    int i = 0;
    size_t bin = 0;
    char bytes[16] = "";
    while (i < g.n && g.op[i] == WS_OP_BINARY && g.len[i]) {
        memcpy(bytes + bin, g.data[i], g.len[i]);
        bin += g.len[i++];
    }
    ok(bin == 3 && !memcmp(bytes, "bin", 3), "binary data unmasked");
    ok(i < g.n && g.op[i] == WS_OP_PING && g.len[i] == 4 && !memcmp(g.data[i], "ping", 4),
       "a ping between fragments comes first");
    i++;
    ok(i < g.n && g.op[i] == WS_OP_TEXT && g.len[i] == 7 && !memcmp(g.data[i], "{\"a\":1}", 7),
       "the fragmented text message whole");
    i++;
    bin = 0;
    int fin = 0;
    while (i < g.n && g.op[i] == WS_OP_BINARY) {
        memcpy(bytes + bin, g.data[i], g.len[i]);
        bin += g.len[i];
        fin = g.fin[i++];
    }
    ok(bin == 4 && !memcmp(bytes, "abcd", 4) && fin, "a fragmented binary message, fin on its end");
    ok(i < g.n && g.op[i] == WS_OP_CLOSE && g.code[i] == 1000 && g.len[i] == 3,
       "close with its code and reason");
    ws_reader_free(&r);
}

/* One hostile input; returns the reader's close code. */
static int bad(const uint8_t *in, size_t len, int from_client)
{
    struct ws_reader r;
    struct got g = {0};
    uint8_t buf[256];
    memcpy(buf, in, len);
    ws_reader_init(&r, from_client, 1 << 20, 64);
    int rc = ws_reader_feed(&r, buf, len, cb, &g);
    ws_reader_free(&r);
    return rc;
}

static void test_hostile(void)
{
    uint8_t b[256];
    size_t n;
    n = frame(b, 0x82, "x", 1, 0, 0);
    ok(bad(b, n, 1) == WS_CLOSE_PROTOCOL, "an unmasked client frame: 1002");
    n = frame(b, 0x82, "x", 1, 1, 0);
    ok(bad(b, n, 0) == WS_CLOSE_PROTOCOL, "a masked server frame: 1002");
    n = frame(b, 0xC2, "x", 1, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_PROTOCOL, "a reserved bit: 1002");
    for (int op = 3; op <= 15; op++) {
        if (op >= 8 && op <= 10)
            continue;
        n = frame(b, 0x80 | op, "x", 1, 1, 0);
        if (bad(b, n, 1) != WS_CLOSE_PROTOCOL) {
            ok(0, "opcode %d: 1002", op);
            return;
        }
    }
    ok(1, "every unknown opcode: 1002");
    uint8_t big[200];
    memset(big, 'p', sizeof(big));
    n = frame(b, 0x89, big, 126, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_PROTOCOL, "a ping over 125 bytes: 1002");
    n = frame(b, 0x09, "p", 1, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_PROTOCOL, "a fragmented ping: 1002");
    n = frame(b, 0x80, "x", 1, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_PROTOCOL, "a continuation with no message: 1002");
    n = frame(b, 0x01, "a", 1, 1, 0);
    n += frame(b + n, 0x81, "b", 1, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_PROTOCOL, "a new message inside an unfinished one: 1002");
    n = frame(b, 0x82, "", 0, 1, (uint64_t)1 << 40);
    ok(bad(b, n, 1) == WS_CLOSE_TOO_BIG, "a frame claiming 1 TiB: 1009, before any payload");
    uint8_t huge[14] = {0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4};
    ok(bad(huge, sizeof(huge), 1) == WS_CLOSE_PROTOCOL, "a 64-bit length with its top bit: 1002");
    n = frame(b, 0x81, big, 65, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_TOO_BIG, "a text message over the text limit: 1009");
    n = frame(b, 0x01, big, 40, 1, 0);
    n += frame(b + n, 0x80, big, 40, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_TOO_BIG, "fragments adding up over the text limit: 1009");
    n = frame(b, 0x81, "\xff\xfe", 2, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_BAD_DATA, "text that is not UTF-8: 1007");
    n = frame(b, 0x81, "\xed\xa0\x80", 3, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_BAD_DATA, "a UTF-16 surrogate in text: 1007");
    n = frame(b, 0x88, "\x03", 1, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_PROTOCOL, "a close body of one byte: 1002");
    n = frame(b, 0x88, "\x03\xed", 2, 1, 0); /* 1005 may not be sent */
    ok(bad(b, n, 1) == WS_CLOSE_PROTOCOL, "close code 1005 on the wire: 1002");
    n = frame(b, 0x88, "\x03\xe8\xff", 3, 1, 0);
    ok(bad(b, n, 1) == WS_CLOSE_BAD_DATA, "a close reason that is not UTF-8: 1007");

    /* after a violation nothing more is read */
    struct ws_reader r;
    struct got g = {0};
    ws_reader_init(&r, 1, 1 << 20, 64);
    n = frame(b, 0x82, "x", 1, 0, 0);
    ws_reader_feed(&r, b, n, cb, &g);
    n = frame(b, 0x82, "y", 1, 1, 0);
    ok(ws_reader_feed(&r, b, n, cb, &g) != 0 && g.n == 0, "a reader that refused stays closed");
    ws_reader_free(&r);

    /* the callback stops the reader with its own code */
    ws_reader_init(&r, 1, 1 << 20, 64);
    g = (struct got){.stop_with = 4001};
    n = frame(b, 0x82, "x", 1, 1, 0);
    ok(ws_reader_feed(&r, b, n, cb, &g) == 4001, "a callback's code stops the reader");
    ws_reader_free(&r);
}

static void test_header_sizes(void)
{
    uint8_t h[WS_MAX_HEADER];
    ok(ws_header_build(h, WS_OP_BINARY, 125, NULL) == 2 && h[1] == 125, "125 bytes: 7-bit length");
    ok(ws_header_build(h, WS_OP_BINARY, 126, NULL) == 4 && h[1] == 126 && h[2] == 0 && h[3] == 126,
       "126 bytes: 16-bit length");
    ok(ws_header_build(h, WS_OP_BINARY, 70000, NULL) == 10 && h[1] == 127,
       "70000 bytes: 64-bit length");
    ok(ws_header_build(h, WS_OP_TEXT, 5, (const uint8_t *)"abcd") == 6 && (h[1] & 0x80),
       "a client's header carries the mask");
}

static void test_accept(void)
{
    char out[32];
    /* RFC 6455 section 1.3's example */
    ok(wsconn_accept_key("dGhlIHNhbXBsZSBub25jZQ==", out) == 0 &&
           !strcmp(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
       "Sec-WebSocket-Accept of the RFC's example");
    ok(wsconn_accept_key("c2hvcnQ=", out) < 0, "a key that is not 16 bytes is refused");
    ok(wsconn_accept_key("not base64!!", out) < 0, "a key that is not base64 is refused");
    ok(wsconn_accept_key(NULL, out) < 0, "no key is refused");
}

int main(void)
{
    test_good(0);
    test_good(1);
    test_hostile();
    test_header_sizes();
    test_accept();
    return tap_done();
}
