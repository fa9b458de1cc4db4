/* The WebSocket wire format: see ws.h. */
#include "common/ws.h"

#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "common/util.h"

size_t ws_header_build(uint8_t *out, int opcode, uint64_t len, const uint8_t *mask)
{
    size_t n = 0;
    out[n++] = (uint8_t)(0x80 | (opcode & 0x0f));
    uint8_t m = mask ? 0x80 : 0;
    if (len < 126) {
        out[n++] = (uint8_t)(m | len);
    } else if (len <= 0xffff) {
        out[n++] = m | 126;
        out[n++] = (uint8_t)(len >> 8);
        out[n++] = (uint8_t)len;
    } else {
        out[n++] = m | 127;
        for (int i = 7; i >= 0; i--)
            out[n++] = (uint8_t)(len >> (8 * i));
    }
    if (mask) {
        memcpy(out + n, mask, 4);
        n += 4;
    }
    return n;
}

void ws_mask(uint8_t *data, size_t len, const uint8_t mask[4], uint64_t offset)
{
    for (size_t i = 0; i < len; i++)
        data[i] ^= mask[(offset + i) & 3];
}

void ws_reader_init(struct ws_reader *r, int from_client, size_t max_frame, size_t max_text)
{
    memset(r, 0, sizeof(*r));
    r->from_client = from_client;
    r->max_frame = max_frame;
    r->max_text = max_text;
    r->hdr_need = 2;
}

void ws_reader_free(struct ws_reader *r)
{
    free(r->text);
    r->text = NULL;
    r->text_len = 0;
}

/* A close code a peer may send (RFC 6455 7.4.1 and the registry: 1004-1006 and 1015 never). */
static int close_code_ok(int c)
{
    if (c >= 3000 && c <= 4999)
        return 1;
    return c >= 1000 && c <= 1014 && c != 1004 && c != 1005 && c != 1006;
}

/* The header is complete in r->hdr: checks it. Returns 0 or a close code. */
static int header_check(struct ws_reader *r)
{
    uint8_t b0 = r->hdr[0], b1 = r->hdr[1];
    if (b0 & 0x70)
        return WS_CLOSE_PROTOCOL; /* RSV1-3: no extension was agreed */
    r->fin = (b0 & 0x80) != 0;
    r->op = b0 & 0x0f;
    r->masked = (b1 & 0x80) != 0;
    if (r->masked != r->from_client)
        return WS_CLOSE_PROTOCOL;
    size_t p = 2;
    uint64_t len = b1 & 0x7f;
    if (len == 126) {
        len = ((uint64_t)r->hdr[2] << 8) | r->hdr[3];
        p = 4;
    } else if (len == 127) {
        len = 0;
        for (int i = 0; i < 8; i++)
            len = (len << 8) | r->hdr[2 + i];
        p = 10;
        if (len >> 63)
            return WS_CLOSE_PROTOCOL;
    }
    if (r->masked)
        memcpy(r->key, r->hdr + p, 4);
    r->len = len;
    r->got = 0;
    switch (r->op) {
    case WS_OP_CLOSE:
    case WS_OP_PING:
    case WS_OP_PONG:
        if (!r->fin || len > WS_MAX_CONTROL)
            return WS_CLOSE_PROTOCOL;
        return 0;
    case WS_OP_CONT:
        if (!r->msg_op)
            return WS_CLOSE_PROTOCOL;
        break;
    case WS_OP_TEXT:
    case WS_OP_BINARY:
        if (r->msg_op)
            return WS_CLOSE_PROTOCOL;
        r->msg_op = r->op;
        break;
    default: return WS_CLOSE_PROTOCOL;
    }
    if (len > r->max_frame)
        return WS_CLOSE_TOO_BIG;
    if (r->msg_op == WS_OP_TEXT && len > r->max_text - r->text_len)
        return WS_CLOSE_TOO_BIG;
    return 0;
}

/* How many header bytes the first two announce. */
static size_t header_len(const uint8_t *h)
{
    size_t n = 2;
    uint8_t l = h[1] & 0x7f;
    if (l == 126)
        n += 2;
    else if (l == 127)
        n += 8;
    if (h[1] & 0x80)
        n += 4;
    return n;
}

/* The frame's payload is complete (control frames and the end of a text message). */
static int frame_done(struct ws_reader *r, ws_msg_fn fn, void *arg)
{
    int rc = 0;
    if (r->op == WS_OP_CLOSE) {
        int code = 1005;
        const uint8_t *reason = r->ctl;
        size_t rlen = 0;
        if (r->len == 1)
            return WS_CLOSE_PROTOCOL;
        if (r->len >= 2) {
            code = (r->ctl[0] << 8) | r->ctl[1];
            if (!close_code_ok(code))
                return WS_CLOSE_PROTOCOL;
            reason = r->ctl + 2;
            rlen = (size_t)r->len - 2;
            if (!utf8_valid(reason, rlen))
                return WS_CLOSE_BAD_DATA;
        }
        r->closed = 1;
        return fn(arg, WS_OP_CLOSE, reason, rlen, 1, code);
    }
    if (r->op == WS_OP_PING || r->op == WS_OP_PONG)
        return fn(arg, r->op, r->ctl, (size_t)r->len, 1, 0);
    if (!r->fin)
        return 0;
    if (r->msg_op == WS_OP_TEXT) {
        if (!utf8_valid(r->text ? r->text : (const uint8_t *)"", r->text_len))
            return WS_CLOSE_BAD_DATA;
        rc = fn(arg, WS_OP_TEXT, r->text ? r->text : (const uint8_t *)"", r->text_len, 1, 0);
        ws_reader_free(r);
    } else if (r->len == 0) {
        rc = fn(arg, WS_OP_BINARY, (const uint8_t *)"", 0, 1, 0); /* the message's end */
    }
    r->msg_op = 0;
    return rc;
}

int ws_reader_feed(struct ws_reader *r, uint8_t *buf, size_t len, ws_msg_fn fn, void *arg)
{
    size_t pos = 0;
    if (r->closed)
        return WS_CLOSE_PROTOCOL;
    while (pos < len) {
        if (r->hdr_got < r->hdr_need) {
            size_t n = r->hdr_need - r->hdr_got;
            if (n > len - pos)
                n = len - pos;
            memcpy(r->hdr + r->hdr_got, buf + pos, n);
            r->hdr_got += n;
            pos += n;
            if (r->hdr_got == 2)
                r->hdr_need = header_len(r->hdr);
            if (r->hdr_got < r->hdr_need)
                continue;
            int rc = header_check(r);
            if (rc) {
                r->closed = 1;
                return rc;
            }
            if (r->len == 0) {
                r->hdr_got = 0;
                r->hdr_need = 2;
                if ((rc = frame_done(r, fn, arg))) {
                    r->closed = 1;
                    return rc;
                }
                if (r->closed)
                    return 0;
            }
            continue;
        }
        /* payload */
        size_t n = (size_t)(r->len - r->got) < len - pos ? (size_t)(r->len - r->got) : len - pos;
        uint8_t *p = buf + pos;
        if (r->masked)
            ws_mask(p, n, r->key, r->got);
        int rc = 0;
        if (r->op >= WS_OP_CLOSE) {
            memcpy(r->ctl + r->got, p, n);
        } else if (r->msg_op == WS_OP_TEXT) {
            r->text = xrealloc(r->text, r->text_len + n + 1);
            memcpy(r->text + r->text_len, p, n);
            r->text_len += n;
        } else {
            rc = fn(arg, WS_OP_BINARY, p, n, r->fin && r->got + n == r->len, 0);
        }
        r->got += n;
        pos += n;
        if (!rc && r->got == r->len) {
            r->hdr_got = 0;
            r->hdr_need = 2;
            if (r->op == WS_OP_BINARY || r->op == WS_OP_CONT) {
                if (r->msg_op == WS_OP_BINARY) {
                    if (r->fin)
                        r->msg_op = 0; /* its last part went with fin set */
                } else {
                    rc = frame_done(r, fn, arg);
                }
            } else {
                rc = frame_done(r, fn, arg);
            }
        }
        if (rc) {
            r->closed = 1;
            return rc;
        }
        if (r->closed)
            return 0;
    }
    return 0;
}
