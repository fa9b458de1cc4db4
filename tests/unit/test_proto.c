/*
 * Unit tests for the frame codec (src/proto): round trips, and every way a
 * frame or a field list can be malformed, since both ends feed it bytes the
 * other side chose.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "proto/proto.h"
#include "tap.h"

static void hdr_bytes(uint8_t *out, uint32_t len, uint32_t id, uint16_t type, uint16_t flags)
{
    put_be32(out, len);
    put_be32(out + 4, id);
    put_be16(out + 8, type);
    put_be16(out + 10, flags);
}

static void test_header(void)
{
    struct proto_header h = {.len = 77, .id = 0xdeadbeef, .type = PROTO_EXEC, .flags = 0};
    struct proto_header g;
    uint8_t raw[PROTO_HEADER_LEN];
    proto_header_encode(&h, raw);
    ok(raw[0] == 0 && raw[3] == 77 && raw[4] == 0xde && raw[9] == PROTO_EXEC,
       "header is big-endian len, id, type, flags");
    ok(proto_header_decode(raw, &g) == 0 && g.len == 77 && g.id == 0xdeadbeef &&
           g.type == PROTO_EXEC && g.flags == 0,
       "header round trip");

    hdr_bytes(raw, PROTO_MAX_PAYLOAD, 1, PROTO_DATA, PROTO_F_FIN);
    ok(proto_header_decode(raw, &g) == 0 && g.len == PROTO_MAX_PAYLOAD && g.flags == PROTO_F_FIN,
       "len == PROTO_MAX_PAYLOAD with FIN is accepted");
    hdr_bytes(raw, PROTO_MAX_PAYLOAD + 1, 1, PROTO_DATA, 0);
    ok(proto_header_decode(raw, &g) < 0, "len > PROTO_MAX_PAYLOAD is rejected");
    hdr_bytes(raw, 0xffffffffu, 1, PROTO_DATA, 0);
    ok(proto_header_decode(raw, &g) < 0, "len 0xffffffff is rejected");
    hdr_bytes(raw, 0, 1, 0, 0);
    ok(proto_header_decode(raw, &g) < 0, "type 0 is rejected");
    hdr_bytes(raw, 0, 1, 999, 0);
    ok(proto_header_decode(raw, &g) < 0, "unknown type 999 is rejected");
    hdr_bytes(raw, 0, 1, 6, 0);
    ok(proto_header_decode(raw, &g) < 0, "type 6 (gap in the numbering) is rejected");
    hdr_bytes(raw, 0, 1, PROTO_PING, 2);
    ok(proto_header_decode(raw, &g) < 0, "unknown flag bit is rejected");
    hdr_bytes(raw, 0, 1, PROTO_PING, 0x8000);
    ok(proto_header_decode(raw, &g) < 0, "high flag bit is rejected");

    int all = 1;
    for (unsigned t = 0; t < 65536; t++) {
        int known = proto_type_known((uint16_t)t);
        int named = strcmp(proto_type_name((uint16_t)t), "UNKNOWN") != 0;
        if (known != named)
            all = 0;
    }
    ok(all, "proto_type_known and proto_type_name agree on all 65536 types");
    ok(!strcmp(proto_type_name(PROTO_FILE_REMOVE), "FILE_REMOVE"), "type name");
    ok(proto_type_known(PROTO_SESSION) && proto_type_known(PROTO_RESIZE) &&
           !strcmp(proto_type_name(PROTO_SESSION), "SESSION") &&
           !strcmp(proto_type_name(PROTO_RESIZE), "RESIZE") && !proto_type_known(42) &&
           !proto_type_is_raw(PROTO_SESSION) && !proto_type_is_raw(PROTO_RESIZE),
       "SESSION (40) and RESIZE (41) are field frames; 42 is unknown");
    ok(proto_type_is_raw(PROTO_STDIN) && proto_type_is_raw(PROTO_DATA) &&
           !proto_type_is_raw(PROTO_EXEC) && !proto_type_is_raw(PROTO_ERROR),
       "raw types are STDIN/STDOUT/STDERR/DATA");
}

static void test_fields(void)
{
    struct proto_buf b = {0};
    proto_put_str(&b, PT_ARG, "echo");
    proto_put_str(&b, PT_ARG, "hi there");
    proto_put_u32(&b, PT_STDIN_PIPE, 1);
    proto_put_u64(&b, PT_OFFSET, 0x0102030405060708ull);
    proto_put_bytes(&b, PT_NAME, "", 0);
    ok(b.len == (6 + 4) + (6 + 8) + (6 + 4) + (6 + 8) + 6, "field sizes add up");
    ok(proto_fields_valid(b.data, b.len) == 0, "built payload is valid");

    struct proto_iter it;
    struct proto_field f;
    proto_iter_init(&it, b.data, b.len);
    int n = 0, args = 0;
    while (proto_iter_next(&it, &f) > 0) {
        n++;
        if (f.tag == PT_ARG)
            args++;
    }
    ok(n == 5 && args == 2, "iterator yields every field, repeats included");

    char s[64];
    ok(proto_find(b.data, b.len, PT_ARG, &f) == 1 && proto_field_str(&f, s, sizeof(s)) == 0 &&
           !strcmp(s, "echo"),
       "find returns the first of repeated fields");
    uint32_t u32;
    uint64_t u64;
    ok(proto_find(b.data, b.len, PT_STDIN_PIPE, &f) == 1 && proto_field_u32(&f, &u32) == 0 &&
           u32 == 1,
       "u32 round trip");
    ok(proto_field_u64(&f, &u64) < 0, "u32 field read as u64 fails");
    ok(proto_find(b.data, b.len, PT_OFFSET, &f) == 1 && proto_field_u64(&f, &u64) == 0 &&
           u64 == 0x0102030405060708ull,
       "u64 round trip");
    ok(proto_field_u32(&f, &u32) < 0, "u64 field read as u32 fails");
    ok(proto_find(b.data, b.len, PT_NAME, &f) == 1 && f.len == 0 &&
           proto_field_str(&f, s, sizeof(s)) == 0 && s[0] == '\0',
       "empty field");
    ok(proto_find(b.data, b.len, PT_CWD, &f) == 0, "absent field");
    ok(proto_find(NULL, 0, PT_CWD, &f) == 0 && proto_fields_valid(NULL, 0) == 0,
       "empty payload is a valid empty list");

    /* string getters */
    ok(proto_find(b.data, b.len, PT_ARG, &f) == 1 && proto_field_str(&f, s, 5) == 0 &&
           !strcmp(s, "echo"),
       "str fits exactly (len + NUL)");
    ok(proto_field_str(&f, s, 4) < 0, "str one byte short fails");
    ok(proto_field_str(&f, s, 0) < 0, "str into zero-size buffer fails");
    char *dup = proto_field_strdup(&f);
    ok(dup && !strcmp(dup, "echo"), "strdup");
    free(dup);

    struct proto_buf nul = {0};
    proto_put_bytes(&nul, PT_PATH, "a\0b", 3);
    ok(proto_find(nul.data, nul.len, PT_PATH, &f) == 1 && f.len == 3, "NUL inside a field parses");
    ok(proto_field_str(&f, s, sizeof(s)) < 0, "str with NUL fails");
    ok(proto_field_strdup(&f) == NULL, "strdup with NUL fails");
    proto_buf_free(&nul);

    /* wrong int sizes */
    struct proto_buf w = {0};
    proto_put_bytes(&w, PT_SIGNUM, "\0\0\0\0\x09", 5);
    proto_put_bytes(&w, PT_OFFSET, "\0\0\0\x09", 4);
    proto_put_bytes(&w, PT_LENGTH, "", 0);
    ok(proto_find(w.data, w.len, PT_SIGNUM, &f) == 1 && proto_field_u32(&f, &u32) < 0,
       "5-byte u32 is rejected");
    ok(proto_find(w.data, w.len, PT_OFFSET, &f) == 1 && proto_field_u64(&f, &u64) < 0,
       "4-byte u64 is rejected");
    ok(proto_find(w.data, w.len, PT_LENGTH, &f) == 1 && proto_field_u64(&f, &u64) < 0 &&
           proto_field_u32(&f, &u32) < 0,
       "empty int field is rejected");
    proto_buf_free(&w);

    /* truncations: every proper prefix that cuts a field is malformed */
    int bad = 0, good = 0;
    size_t boundaries[] = {0, 10, 24, 34, 48, 54};
    for (size_t cut = 0; cut <= b.len; cut++) {
        int at_boundary = 0;
        for (size_t i = 0; i < WR_ARRAY_LEN(boundaries); i++)
            at_boundary |= boundaries[i] == cut;
        int r = proto_fields_valid(b.data, cut);
        if (at_boundary ? r == 0 : r < 0)
            good++;
        else
            bad++;
    }
    ok(bad == 0 && good == (int)b.len + 1, "every cut inside a field is malformed, others fine");
    ok(proto_find(b.data, b.len - 1, PT_ARG, &f) < 0,
       "find fails on a broken tail even when the tag comes first");

    uint8_t hostile[6];
    put_be16(hostile, PT_PATH);
    put_be32(hostile + 2, 0xffffffffu);
    ok(proto_fields_valid(hostile, sizeof(hostile)) < 0, "field len 0xffffffff is malformed");
    put_be32(hostile + 2, 1);
    ok(proto_fields_valid(hostile, sizeof(hostile)) < 0, "field len past the end is malformed");
    put_be32(hostile + 2, 0);
    ok(proto_fields_valid(hostile, sizeof(hostile)) == 0, "6-byte empty field is fine");
    ok(proto_fields_valid(hostile, 5) < 0, "5 bytes are not a field header");

    proto_iter_init(&it, hostile, 3);
    ok(proto_iter_next(&it, &f) < 0, "iterator reports a short field header");

    proto_buf_reset(&b);
    ok(b.len == 0 && b.data != NULL, "reset keeps memory");
    proto_buf_free(&b);
    ok(b.data == NULL && b.len == 0 && b.cap == 0, "free zeroes");
}

static void test_frame_build(void)
{
    struct proto_buf fr = {0};
    ok(proto_frame_build(&fr, 7, PROTO_STDOUT, 0, "hello", 5) == 0 &&
           fr.len == PROTO_HEADER_LEN + 5 && !memcmp(fr.data + PROTO_HEADER_LEN, "hello", 5),
       "frame build");
    struct proto_header h;
    ok(proto_header_decode(fr.data, &h) == 0 && h.len == 5 && h.id == 7 && h.type == PROTO_STDOUT,
       "built header decodes");
    ok(proto_frame_build(&fr, 8, PROTO_PING, 0, NULL, 0) == 0 && fr.len == PROTO_HEADER_LEN,
       "frame build resets first and allows an empty payload");
    uint8_t *big = calloc(1, PROTO_MAX_PAYLOAD + 1);
    ok(proto_frame_build(&fr, 9, PROTO_DATA, 0, big, PROTO_MAX_PAYLOAD) == 0 &&
           fr.len == PROTO_HEADER_LEN + PROTO_MAX_PAYLOAD,
       "frame of PROTO_MAX_PAYLOAD builds");
    ok(proto_frame_build(&fr, 9, PROTO_DATA, 0, big, PROTO_MAX_PAYLOAD + 1) < 0,
       "oversized frame is refused");
    free(big);
    proto_buf_free(&fr);
}

/* A stream of three frames, the middle one with fields, the last empty. */
static void make_stream(struct proto_buf *s)
{
    struct proto_buf fr = {0}, fields = {0};
    proto_put_str(&fields, PT_ARG, "true");
    proto_put_str(&fields, PT_CWD, "/tmp");
    proto_frame_build(&fr, 1, PROTO_STDIN, PROTO_F_FIN, "abc", 3);
    memcpy(s->data = realloc(s->data, fr.len), fr.data, fr.len);
    s->len = fr.len;
    proto_frame_build(&fr, 2, PROTO_EXEC, 0, fields.data, fields.len);
    s->data = realloc(s->data, s->len + fr.len);
    memcpy(s->data + s->len, fr.data, fr.len);
    s->len += fr.len;
    proto_frame_build(&fr, 3, PROTO_PING, 0, NULL, 0);
    s->data = realloc(s->data, s->len + fr.len);
    memcpy(s->data + s->len, fr.data, fr.len);
    s->len += fr.len;
    s->cap = s->len;
    proto_buf_free(&fr);
    proto_buf_free(&fields);
}

/* Feeds the stream in pieces of `step` bytes; checks the three frames come out intact. */
static int feed_stream(const struct proto_buf *s, size_t step)
{
    struct proto_reader r;
    proto_reader_init(&r);
    int frames = 0, okay = 1;
    size_t pos = 0;
    while (pos < s->len) {
        size_t n = s->len - pos < step ? s->len - pos : step;
        size_t off = 0;
        /* Also exercises the empty feed: must consume nothing and complete nothing. */
        int done;
        if (proto_reader_feed(&r, s->data + pos, 0, &done) != 0 || done)
            okay = 0;
        while (off < n) {
            size_t used = proto_reader_feed(&r, s->data + pos + off, n - off, &done);
            if (used == (size_t)-1) {
                okay = 0;
                break;
            }
            off += used;
            if (!done)
                continue;
            frames++;
            if (frames == 1)
                okay &= r.h.id == 1 && r.h.type == PROTO_STDIN && r.h.flags == PROTO_F_FIN &&
                        r.h.len == 3 && !memcmp(r.payload, "abc", 3);
            else if (frames == 2) {
                struct proto_field f;
                char cwd[16];
                okay &= r.h.id == 2 && r.h.type == PROTO_EXEC &&
                        proto_find(r.payload, r.h.len, PT_CWD, &f) == 1 &&
                        proto_field_str(&f, cwd, sizeof(cwd)) == 0 && !strcmp(cwd, "/tmp");
            } else if (frames == 3)
                okay &= r.h.id == 3 && r.h.type == PROTO_PING && r.h.len == 0 && r.payload;
        }
        pos += n;
    }
    proto_reader_free(&r);
    return okay && frames == 3;
}

static void test_reader(void)
{
    struct proto_buf s = {0};
    make_stream(&s);
    ok(feed_stream(&s, 1), "reader fed byte by byte");
    ok(feed_stream(&s, s.len), "reader fed in one go");
    int all = 1;
    for (size_t step = 2; step < s.len; step++)
        all &= feed_stream(&s, step);
    ok(all, "reader fed in pieces of every size");

    /* one call consumes at most one frame */
    struct proto_reader r;
    int done;
    proto_reader_init(&r);
    size_t used = proto_reader_feed(&r, s.data, s.len, &done);
    ok(done && used == PROTO_HEADER_LEN + 3, "one frame per call, the rest left unconsumed");
    proto_reader_free(&r);

    /* malformed headers poison the stream */
    uint8_t raw[PROTO_HEADER_LEN + 4];
    hdr_bytes(raw, PROTO_MAX_PAYLOAD + 1, 1, PROTO_DATA, 0);
    proto_reader_init(&r);
    ok(proto_reader_feed(&r, raw, PROTO_HEADER_LEN - 1, &done) == PROTO_HEADER_LEN - 1 && !done,
       "oversized len: partial header is consumed");
    ok(proto_reader_feed(&r, raw + PROTO_HEADER_LEN - 1, 1, &done) == (size_t)-1 && r.bad,
       "oversized len: rejected as soon as the header is complete");
    ok(proto_reader_feed(&r, s.data, s.len, &done) == (size_t)-1 && !done,
       "a bad stream stays bad");
    proto_reader_free(&r);

    hdr_bytes(raw, 0, 5, 0x7777, 0);
    proto_reader_init(&r);
    ok(proto_reader_feed(&r, raw, PROTO_HEADER_LEN, &done) == (size_t)-1, "unknown type");
    proto_reader_free(&r);
    hdr_bytes(raw, 0, 5, PROTO_DATA, 0x4);
    proto_reader_init(&r);
    ok(proto_reader_feed(&r, raw, PROTO_HEADER_LEN, &done) == (size_t)-1, "unknown flags");
    proto_reader_free(&r);

    /* truncated stream: frame never completes */
    proto_reader_init(&r);
    used = proto_reader_feed(&r, s.data, PROTO_HEADER_LEN + 2, &done);
    ok(used == PROTO_HEADER_LEN + 2 && !done && r.payload_got == 2, "truncated frame is pending");
    proto_reader_free(&r);

    /* a full-size payload */
    struct proto_buf fr = {0};
    uint8_t *big = malloc(PROTO_MAX_PAYLOAD);
    for (size_t i = 0; i < PROTO_MAX_PAYLOAD; i++)
        big[i] = (uint8_t)(i * 31);
    proto_frame_build(&fr, 42, PROTO_DATA, PROTO_F_FIN, big, PROTO_MAX_PAYLOAD);
    proto_reader_init(&r);
    size_t pos = 0;
    int frames = 0;
    while (pos < fr.len) {
        size_t chunk = fr.len - pos < 70000 ? fr.len - pos : 70000;
        pos += proto_reader_feed(&r, fr.data + pos, chunk, &done);
        frames += done;
    }
    ok(frames == 1 && r.h.len == PROTO_MAX_PAYLOAD && !memcmp(r.payload, big, PROTO_MAX_PAYLOAD),
       "1 MiB payload arrives intact");
    proto_reader_free(&r);
    proto_buf_free(&fr);
    free(big);
    proto_buf_free(&s);
}

int main(void)
{
    test_header();
    test_fields();
    test_frame_build();
    test_reader();
    return tap_done();
}
