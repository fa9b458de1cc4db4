/*
 * Fuzz target for the agent frame codec (src/proto): arbitrary bytes go
 * through the incremental reader, the field iterator and every getter, and
 * the properties both ends rely on are checked (abort on violation): feeding
 * in one go or in pieces yields the same frames, getters agree with the
 * field lengths, and a valid field list rebuilds to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Exercises every getter on a payload read as a field list. */
static void check_fields(const uint8_t *p, size_t len)
{
    struct proto_iter it;
    struct proto_field f, found;
    struct proto_buf rebuilt = {0};
    int r, n = 0;
    char str[PROTO_MAX_PATH + 1];

    proto_iter_init(&it, p, len);
    while ((r = proto_iter_next(&it, &f)) > 0) {
        n++;
        CHECK(f.data >= p && f.data + f.len <= p + len);
        uint32_t u32;
        uint64_t u64;
        CHECK((proto_field_u32(&f, &u32) == 0) == (f.len == 4));
        CHECK((proto_field_u64(&f, &u64) == 0) == (f.len == 8));
        int has_nul = f.len && memchr(f.data, '\0', f.len) != NULL;
        if (proto_field_str(&f, str, sizeof(str)) == 0)
            CHECK(!has_nul && strlen(str) == f.len && !memcmp(str, f.data, f.len));
        else
            CHECK(has_nul || f.len >= sizeof(str));
        char *dup = proto_field_strdup(&f);
        CHECK((dup == NULL) == has_nul);
        if (dup)
            CHECK(strlen(dup) == f.len);
        free(dup);
        proto_put_bytes(&rebuilt, f.tag, f.data, f.len);
    }
    CHECK(r == proto_fields_valid(p, len));
    if (r == 0) {
        CHECK(rebuilt.len == len && (len == 0 || !memcmp(rebuilt.data, p, len)));
        /* find returns the first field with a tag, as the iterator met it */
        proto_iter_init(&it, p, len);
        if (proto_iter_next(&it, &f) > 0) {
            CHECK(proto_find(p, len, f.tag, &found) == 1);
            CHECK(found.data == f.data && found.len == f.len);
        }
    } else {
        CHECK(proto_find(p, len, PT_PATH, &found) < 0);
    }
    proto_buf_free(&rebuilt);
    (void)n;
}

/*
 * Feeds the input to a reader in pieces whose sizes come from `pattern` (0 = all at once).
 * Returns a hash of every frame seen and whether the stream went bad.
 */
static uint64_t run_reader(const uint8_t *data, size_t size, unsigned pattern, int inspect,
                           int *bad, unsigned *frames)
{
    struct proto_reader r;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t pos = 0;
    unsigned step = 0;

    proto_reader_init(&r);
    *bad = 0;
    *frames = 0;
    while (pos < size) {
        size_t n = size - pos;
        if (pattern) {
            size_t want = 1 + (pattern * 7919u + step++ * 104729u) % 37u;
            if (n > want)
                n = want;
        }
        int done;
        size_t used = proto_reader_feed(&r, data + pos, n, &done);
        if (used == (size_t)-1) {
            CHECK(r.bad && !done);
            *bad = 1;
            break;
        }
        CHECK(used <= n);
        pos += used;
        if (!done) {
            CHECK(used == n); /* a call stops early only when a frame completes */
            continue;
        }
        (*frames)++;
        CHECK(r.h.len <= PROTO_MAX_PAYLOAD && proto_type_known(r.h.type));
        CHECK((r.h.flags & ~PROTO_F_KNOWN) == 0 && r.payload != NULL);
        uint8_t hdr[PROTO_HEADER_LEN];
        proto_header_encode(&r.h, hdr);
        CHECK(!memcmp(hdr, r.hdr, PROTO_HEADER_LEN));
        h = fnv(h, hdr, sizeof(hdr));
        h = fnv(h, r.payload, r.h.len);
        CHECK(proto_type_name(r.h.type)[0] != 'U');
        if (inspect && !proto_type_is_raw(r.h.type))
            check_fields(r.payload, r.h.len);
    }
    proto_reader_free(&r);
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct proto_header h;
    if (size >= PROTO_HEADER_LEN && proto_header_decode(data, &h) == 0) {
        uint8_t again[PROTO_HEADER_LEN];
        proto_header_encode(&h, again);
        CHECK(!memcmp(again, data, PROTO_HEADER_LEN));
    }

    /* The bytes as one payload, and past a would-be header. */
    check_fields(data, size);
    if (size > PROTO_HEADER_LEN)
        check_fields(data + PROTO_HEADER_LEN, size - PROTO_HEADER_LEN);

    int bad1, bad2;
    unsigned frames1, frames2;
    uint64_t h1 = run_reader(data, size, 0, 1, &bad1, &frames1);
    uint64_t h2 = run_reader(data, size, size ? data[0] | 1u : 1u, 0, &bad2, &frames2);
    CHECK(h1 == h2 && bad1 == bad2 && frames1 == frames2);
    return 0;
}
