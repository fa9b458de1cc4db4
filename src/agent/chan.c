/*
 * The agent's outbound side: every frame goes into one queue that the loop
 * writes to the channel without blocking. The loop itself never waits for the
 * daemon to read; producers (command pipes, file reads, listings) look at
 * chan_pending() and hold back instead, which is the whole of flow control.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/log.h"
#include "common/util.h"

/* After a burst, give memory back once the queue is empty again. */
#define OBUF_KEEP (1u << 20)

size_t obuf_pending(const struct obuf *b)
{
    return b->len - b->off;
}

uint8_t *obuf_reserve(struct obuf *b, size_t n)
{
    if (b->cap - b->len >= n)
        return b->data + b->len;
    /* Moving the pending bytes forward costs no more than the space it frees, so appends stay
     * amortised O(1); otherwise grow. */
    size_t pending = obuf_pending(b);
    if (b->off >= pending && b->cap - pending >= n) {
        memmove(b->data, b->data + b->off, pending);
        b->off = 0;
        b->len = pending;
        return b->data + b->len;
    }
    if (n > SIZE_MAX / 2 - b->len)
        abort();
    size_t cap = b->cap ? b->cap : 65536;
    while (cap - b->len < n)
        cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
    return b->data + b->len;
}

void obuf_commit(struct obuf *b, size_t n)
{
    b->len += n;
}

void obuf_append(struct obuf *b, const void *data, size_t n)
{
    if (!n)
        return;
    memcpy(obuf_reserve(b, n), data, n);
    obuf_commit(b, n);
}

void obuf_consume(struct obuf *b, size_t n)
{
    b->off += n;
    if (b->off == b->len) {
        b->off = b->len = 0;
        if (b->cap > OBUF_KEEP)
            obuf_free(b);
    }
}

void obuf_free(struct obuf *b)
{
    free(b->data);
    b->data = NULL;
    b->off = b->len = b->cap = 0;
}

void chan_send(uint32_t id, uint16_t type, uint16_t flags, const void *payload, size_t len)
{
    /* Every payload the agent builds is bounded well below the limit; crossing it would be a
     * bug here, and a frame the daemon must reject would kill the channel anyway. */
    if (len > PROTO_MAX_PAYLOAD) {
        log_error(NULL, "agent.frame_too_big", "type=%s len=%zu", proto_type_name(type), len);
        abort();
    }
    struct proto_header h = {.len = (uint32_t)len, .id = id, .type = type, .flags = flags};
    uint8_t *p = obuf_reserve(&ag.out, PROTO_HEADER_LEN + len);
    proto_header_encode(&h, p);
    if (len)
        memcpy(p + PROTO_HEADER_LEN, payload, len);
    obuf_commit(&ag.out, PROTO_HEADER_LEN + len);
}

void chan_send_fields(uint32_t id, uint16_t type, const struct proto_buf *fields)
{
    chan_send(id, type, 0, fields->data, fields->len);
}

void chan_ok(uint32_t id)
{
    chan_send(id, PROTO_OK, 0, NULL, 0);
}

void chan_error(uint32_t id, int err, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct proto_buf b = {0};
    proto_put_u32(&b, PT_ERRNO, (uint32_t)err);
    proto_put_str(&b, PT_MESSAGE, msg);
    chan_send_fields(id, PROTO_ERROR, &b);
    proto_buf_free(&b);
}

uint8_t *chan_reserve_data(size_t max)
{
    return obuf_reserve(&ag.out, PROTO_HEADER_LEN + max) + PROTO_HEADER_LEN;
}

uint8_t *chan_reserve_frames(size_t n, size_t each)
{
    return obuf_reserve(&ag.out, n * (PROTO_HEADER_LEN + each)) + PROTO_HEADER_LEN;
}

void chan_commit_data(uint32_t id, uint16_t type, size_t n)
{
    struct proto_header h = {.len = (uint32_t)n, .id = id, .type = type, .flags = 0};
    proto_header_encode(&h, ag.out.data + ag.out.len);
    obuf_commit(&ag.out, PROTO_HEADER_LEN + n);
}

size_t chan_pending(void)
{
    return obuf_pending(&ag.out);
}

int chan_flush(void)
{
    while (obuf_pending(&ag.out)) {
        ssize_t n = write(ag.out_fd, ag.out.data + ag.out.off, obuf_pending(&ag.out));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            log_warn(NULL, "agent.channel_write", "error=\"%s\"", strerror(errno));
            return -1;
        }
        obuf_consume(&ag.out, (size_t)n);
    }
    return 0;
}
