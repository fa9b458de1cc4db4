/*
 * Fuzz target: the WebSocket frame reader (common/ws.c) on arbitrary bytes. Input: one byte of
 * options (bit 0: frames come from a client; bits 1-3: how the rest is cut into feeds), then
 * the stream. The reader must never read out of bounds, hand on more than it was fed, or go on
 * after it refused something.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/ws.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct seen {
    size_t bytes;
    int closed;
};

static int cb(void *arg, int op, const uint8_t *d, size_t len, int fin, int code)
{
    struct seen *s = arg;
    s->bytes += len;
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < len; i++)
        sum ^= d[i];
    if (s->closed)
        abort(); /* nothing after a close */
    if (op == WS_OP_CLOSE)
        s->closed = 1;
    (void)fin;
    (void)code;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int from_client = data[0] & 1;
    size_t step = ((size_t)(data[0] >> 1) & 7) * 7 + 1;
    uint8_t *buf = malloc(size);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    struct ws_reader r;
    struct seen s = {0};
    ws_reader_init(&r, from_client, 4096, 512);
    size_t left = size - 1;
    for (size_t off = 0; off < left;) {
        size_t n = left - off < step ? left - off : step;
        int rc = ws_reader_feed(&r, buf + off, n, cb, &s);
        off += n;
        if (rc) {
            if (ws_reader_feed(&r, buf, 0, cb, &s) == 0 && left)
                abort(); /* a reader that refused stays refused */
            break;
        }
    }
    if (s.bytes > left)
        abort();
    ws_reader_free(&r);
    free(buf);
    return 0;
}
