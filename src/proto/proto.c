/*
 * The frame codec shared by the daemon and the agent. Both ends read bytes the
 * other side chose, so every length here is checked against what is actually
 * in the buffer before it is used; nothing trusts a length prefix.
 */
#include "proto/proto.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* u16 tag + u32 len in front of every field */
#define FIELD_HDR_LEN 6

void proto_header_encode(const struct proto_header *h, uint8_t *out)
{
    put_be32(out, h->len);
    put_be32(out + 4, h->id);
    put_be16(out + 8, h->type);
    put_be16(out + 10, h->flags);
}

int proto_type_known(uint16_t type)
{
    switch (type) {
    case PROTO_HELLO:
    case PROTO_PING:
    case PROTO_PONG:
    case PROTO_CANCEL:
    case PROTO_CREDIT:
    case PROTO_EXEC:
    case PROTO_STDIN:
    case PROTO_SIGNAL:
    case PROTO_STDOUT:
    case PROTO_STDERR:
    case PROTO_EXIT:
    case PROTO_FILE_READ:
    case PROTO_FILE_WRITE:
    case PROTO_FILE_LIST:
    case PROTO_FILE_STAT:
    case PROTO_FILE_MKDIR:
    case PROTO_FILE_REMOVE:
    case PROTO_DATA:
    case PROTO_STAT_RESULT:
    case PROTO_DIR_ENTRIES:
    case PROTO_OK:
    case PROTO_ERROR:
    case PROTO_FILE_ARCHIVE:
    case PROTO_FILE_EXTRACT:
    case PROTO_EXTRACTED: return 1;
    case PROTO_SESSION:
    case PROTO_RESIZE: return 1;
    default: return 0;
    }
}

int proto_type_is_raw(uint16_t type)
{
    return type == PROTO_STDIN || type == PROTO_STDOUT || type == PROTO_STDERR ||
           type == PROTO_DATA;
}

int proto_header_decode(const uint8_t *in, struct proto_header *out)
{
    struct proto_header h = {
        .len = get_be32(in),
        .id = get_be32(in + 4),
        .type = get_be16(in + 8),
        .flags = get_be16(in + 10),
    };
    if (h.len > PROTO_MAX_PAYLOAD || !proto_type_known(h.type) || (h.flags & ~PROTO_F_KNOWN))
        return -1;
    *out = h;
    return 0;
}

const char *proto_type_name(uint16_t type)
{
    switch (type) {
    case PROTO_HELLO: return "HELLO";
    case PROTO_PING: return "PING";
    case PROTO_PONG: return "PONG";
    case PROTO_CANCEL: return "CANCEL";
    case PROTO_CREDIT: return "CREDIT";
    case PROTO_EXEC: return "EXEC";
    case PROTO_STDIN: return "STDIN";
    case PROTO_SIGNAL: return "SIGNAL";
    case PROTO_STDOUT: return "STDOUT";
    case PROTO_STDERR: return "STDERR";
    case PROTO_EXIT: return "EXIT";
    case PROTO_FILE_READ: return "FILE_READ";
    case PROTO_FILE_WRITE: return "FILE_WRITE";
    case PROTO_FILE_LIST: return "FILE_LIST";
    case PROTO_FILE_STAT: return "FILE_STAT";
    case PROTO_FILE_MKDIR: return "FILE_MKDIR";
    case PROTO_FILE_REMOVE: return "FILE_REMOVE";
    case PROTO_DATA: return "DATA";
    case PROTO_STAT_RESULT: return "STAT_RESULT";
    case PROTO_DIR_ENTRIES: return "DIR_ENTRIES";
    case PROTO_OK: return "OK";
    case PROTO_ERROR: return "ERROR";
    case PROTO_FILE_ARCHIVE: return "FILE_ARCHIVE";
    case PROTO_FILE_EXTRACT: return "FILE_EXTRACT";
    case PROTO_EXTRACTED: return "EXTRACTED";
    case PROTO_SESSION: return "SESSION";
    case PROTO_RESIZE: return "RESIZE";
    default: return "UNKNOWN";
    }
}

/* ---- building ---- */

void proto_buf_free(struct proto_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void proto_buf_reset(struct proto_buf *b)
{
    b->len = 0;
}

/* Returns a pointer to n fresh bytes at the end of b; aborts rather than overflow. */
static uint8_t *buf_grow(struct proto_buf *b, size_t n)
{
    if (n > SIZE_MAX - b->len)
        abort();
    size_t need = b->len + n;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need)
            cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        b->data = xrealloc(b->data, cap);
        b->cap = cap;
    }
    uint8_t *p = b->data + b->len;
    b->len = need;
    return p;
}

void proto_put_bytes(struct proto_buf *b, uint16_t tag, const void *data, size_t len)
{
    /* A field longer than its u32 length can say is a caller bug, not input. */
    if (len > UINT32_MAX)
        abort();
    uint8_t *p = buf_grow(b, FIELD_HDR_LEN + len);
    put_be16(p, tag);
    put_be32(p + 2, (uint32_t)len);
    if (len)
        memcpy(p + FIELD_HDR_LEN, data, len);
}

void proto_put_str(struct proto_buf *b, uint16_t tag, const char *s)
{
    proto_put_bytes(b, tag, s, strlen(s));
}

void proto_put_u32(struct proto_buf *b, uint16_t tag, uint32_t v)
{
    uint8_t raw[4];
    put_be32(raw, v);
    proto_put_bytes(b, tag, raw, sizeof(raw));
}

void proto_put_u64(struct proto_buf *b, uint16_t tag, uint64_t v)
{
    uint8_t raw[8];
    put_be64(raw, v);
    proto_put_bytes(b, tag, raw, sizeof(raw));
}

int proto_frame_build(struct proto_buf *out, uint32_t id, uint16_t type, uint16_t flags,
                      const void *payload, size_t len)
{
    if (len > PROTO_MAX_PAYLOAD)
        return -1;
    proto_buf_reset(out);
    struct proto_header h = {.len = (uint32_t)len, .id = id, .type = type, .flags = flags};
    uint8_t *p = buf_grow(out, PROTO_HEADER_LEN + len);
    proto_header_encode(&h, p);
    if (len)
        memcpy(p + PROTO_HEADER_LEN, payload, len);
    return 0;
}

/* ---- reading fields ---- */

void proto_iter_init(struct proto_iter *it, const void *payload, size_t len)
{
    it->p = payload;
    it->left = payload ? len : 0;
}

int proto_iter_next(struct proto_iter *it, struct proto_field *f)
{
    if (it->left == 0)
        return 0;
    if (it->left < FIELD_HDR_LEN)
        return -1;
    uint32_t len = get_be32(it->p + 2);
    if (len > it->left - FIELD_HDR_LEN)
        return -1;
    f->tag = get_be16(it->p);
    f->len = len;
    f->data = it->p + FIELD_HDR_LEN;
    it->p += FIELD_HDR_LEN + (size_t)len;
    it->left -= FIELD_HDR_LEN + (size_t)len;
    return 1;
}

int proto_fields_valid(const void *payload, size_t len)
{
    struct proto_iter it;
    struct proto_field f;
    int r;
    proto_iter_init(&it, payload, len);
    while ((r = proto_iter_next(&it, &f)) > 0)
        ;
    return r;
}

int proto_find(const void *payload, size_t len, uint16_t tag, struct proto_field *out)
{
    struct proto_iter it;
    struct proto_field f;
    int r;
    /* Validate the whole payload first: "absent" must not hide a broken tail. */
    if (proto_fields_valid(payload, len) < 0)
        return -1;
    proto_iter_init(&it, payload, len);
    while ((r = proto_iter_next(&it, &f)) > 0) {
        if (f.tag == tag) {
            *out = f;
            return 1;
        }
    }
    return r;
}

int proto_field_u32(const struct proto_field *f, uint32_t *out)
{
    if (f->len != 4)
        return -1;
    *out = get_be32(f->data);
    return 0;
}

int proto_field_u64(const struct proto_field *f, uint64_t *out)
{
    if (f->len != 8)
        return -1;
    *out = get_be64(f->data);
    return 0;
}

int proto_field_str(const struct proto_field *f, char *out, size_t outlen)
{
    if (outlen == 0 || f->len > outlen - 1)
        return -1;
    if (f->len && memchr(f->data, '\0', f->len))
        return -1;
    if (f->len)
        memcpy(out, f->data, f->len);
    out[f->len] = '\0';
    return 0;
}

char *proto_field_strdup(const struct proto_field *f)
{
    if (f->len && memchr(f->data, '\0', f->len))
        return NULL;
    char *s = xmalloc((size_t)f->len + 1);
    if (f->len)
        memcpy(s, f->data, f->len);
    s[f->len] = '\0';
    return s;
}

/* ---- reading frames ---- */

void proto_reader_init(struct proto_reader *r)
{
    memset(r, 0, sizeof(*r));
}

void proto_reader_free(struct proto_reader *r)
{
    free(r->payload);
    memset(r, 0, sizeof(*r));
}

int proto_reader_idle(const struct proto_reader *r)
{
    return !r->bad &&
           (r->hdr_got == 0 || (r->hdr_got == PROTO_HEADER_LEN && r->payload_got == r->h.len));
}

size_t proto_reader_feed(struct proto_reader *r, const uint8_t *buf, size_t len, int *done)
{
    size_t used = 0;
    *done = 0;
    if (r->bad)
        return (size_t)-1;
    /* The frame handed out by the previous call is released now. */
    if (r->hdr_got == PROTO_HEADER_LEN && r->payload_got == r->h.len) {
        r->hdr_got = 0;
        r->payload_got = 0;
    }
    if (r->hdr_got < PROTO_HEADER_LEN) {
        size_t n = PROTO_HEADER_LEN - r->hdr_got;
        if (n > len)
            n = len;
        if (n)
            memcpy(r->hdr + r->hdr_got, buf, n);
        r->hdr_got += n;
        used += n;
        if (r->hdr_got < PROTO_HEADER_LEN)
            return used;
        if (proto_header_decode(r->hdr, &r->h) < 0) {
            r->bad = 1;
            return (size_t)-1;
        }
        /* Allocated even for an empty payload so a complete frame never has payload NULL. */
        if (!r->payload)
            r->payload = xmalloc(PROTO_MAX_PAYLOAD);
    }
    size_t n = r->h.len - r->payload_got;
    if (n > len - used)
        n = len - used;
    if (n)
        memcpy(r->payload + r->payload_got, buf + used, n);
    r->payload_got += n;
    used += n;
    if (r->payload_got == r->h.len)
        *done = 1;
    return used;
}
