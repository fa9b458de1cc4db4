/*
 * The agent's FILE_ARCHIVE and FILE_EXTRACT (agent_harness.h starts the real agent binary): an
 * archive comes within its window and credit, whole and extractable; CANCEL stops it; an
 * extraction answers EXTRACTED then OK, removes its source when asked, and refuses an entry that
 * would land outside the target (nothing written there) with EPERM; bad requests are EINVAL.
 */
#include "agent_harness.h"
#include "common/tar.h"

struct xres {
    struct result r;
    int extracted;
    uint64_t entries, bytes, skipped;
};

/* Collects a request's frames, EXTRACTED included, until its terminal frame. */
static int collect_x(struct agent *a, uint32_t id, struct xres *x)
{
    for (;;) {
        struct frame *f = read_frame(a, TIMEOUT_MS);
        if (!f)
            return -1;
        if (f->h.id != id) {
            free(f->payload);
            free(f);
            continue;
        }
        if (f->h.type == PROTO_EXTRACTED) {
            struct proto_field fl;
            x->extracted++;
            if (proto_find(f->payload, f->h.len, PT_ENTRIES, &fl) == 1)
                proto_field_u64(&fl, &x->entries);
            if (proto_find(f->payload, f->h.len, PT_SIZE, &fl) == 1)
                proto_field_u64(&fl, &x->bytes);
            if (proto_find(f->payload, f->h.len, PT_SKIPPED, &fl) == 1)
                proto_field_u64(&fl, &x->skipped);
        } else {
            absorb(&x->r, f);
        }
        int end = terminal(f->h.type);
        free(f->payload);
        free(f);
        if (end)
            return 0;
    }
}

static uint32_t archive_req(struct agent *a, const char *path, int64_t window)
{
    struct proto_buf b = {0};
    uint32_t id = next_id++;
    proto_put_str(&b, PT_PATH, path);
    if (window >= 0)
        proto_put_u64(&b, PT_WINDOW, (uint64_t)window);
    send_fields(a, id, PROTO_FILE_ARCHIVE, &b);
    proto_buf_free(&b);
    return id;
}

static uint32_t extract_req(struct agent *a, const char *path, const char *source, int64_t wflags)
{
    struct proto_buf b = {0};
    uint32_t id = next_id++;
    if (path)
        proto_put_str(&b, PT_PATH, path);
    if (source)
        proto_put_str(&b, PT_SOURCE, source);
    if (wflags >= 0)
        proto_put_u32(&b, PT_WFLAGS, (uint32_t)wflags);
    send_fields(a, id, PROTO_FILE_EXTRACT, &b);
    proto_buf_free(&b);
    return id;
}

/* DATA bytes for id within quiet_ms of silence; *ended when its terminal frame came. */
static size_t drain(struct agent *a, uint32_t id, int quiet_ms, int *ended, struct proto_buf *keep)
{
    size_t got = 0;
    *ended = 0;
    struct frame *f;
    while (!*ended && (f = read_frame(a, quiet_ms))) {
        if (f->h.id == id) {
            if (f->h.type == PROTO_DATA) {
                got += f->h.len;
                if (keep)
                    append(keep, f->payload, f->h.len);
            }
            *ended = terminal(f->h.type);
        }
        free(f->payload);
        free(f);
    }
    return got;
}

static void send_credit(struct agent *a, uint32_t id, uint64_t n)
{
    struct proto_buf b = {0};
    proto_put_u64(&b, PT_LENGTH, n);
    send_fields(a, id, PROTO_CREDIT, &b);
    proto_buf_free(&b);
}

static int file_is(const char *path, const void *want, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    uint8_t *buf = malloc(n + 1);
    size_t got = fread(buf, 1, n + 1, f);
    fclose(f);
    int same = got == n && memcmp(buf, want, n) == 0;
    free(buf);
    return same;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

static void test_archive(struct agent *a)
{
    char src[PATH_MAX], p[PATH_MAX + 64], dst[PATH_MAX];
    tpath(src, sizeof(src), "src");
    mkdir(src, 0755);
    snprintf(p, sizeof(p), "%s/sub", src);
    mkdir(p, 0750);
    size_t n = 700000;
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)(i * 7 + (i >> 9));
    snprintf(p, sizeof(p), "%s/sub/data.bin", src);
    write_file(p, data, n);
    snprintf(p, sizeof(p), "%s/link", src);
    symlink("sub/data.bin", p);

    /* A window of 10000 bytes: exactly that, then nothing until CREDIT. */
    uint32_t id = archive_req(a, src, 10000);
    struct proto_buf tar = {0};
    int ended;
    size_t got = drain(a, id, 300, &ended, &tar);
    ok(got == 10000 && !ended, "FILE_ARCHIVE with WINDOW 10000 sends exactly 10000 bytes");
    send_credit(a, id, 1 << 30);
    got += drain(a, id, TIMEOUT_MS, &ended, &tar);
    ok(ended && got > n && got % 512 == 0, "CREDIT lets the rest through, then OK (%zu bytes)",
       got);

    /* What came is a whole archive of the tree. */
    tpath(dst, sizeof(dst), "copy");
    mkdir(dst, 0755);
    struct untar *u = untar_new(open(dst, O_RDONLY | O_DIRECTORY), NULL);
    struct wr_err err = {0};
    int r = untar_feed(u, tar.data, tar.len, &err);
    if (r == 0)
        r = untar_finish(u, &err);
    untar_free(u);
    char l[64] = "";
    snprintf(p, sizeof(p), "%s/link", dst);
    ssize_t ln = readlink(p, l, sizeof(l) - 1);
    snprintf(p, sizeof(p), "%s/sub/data.bin", dst);
    ok(r == 0 && file_is(p, data, n) && ln == 12 && !memcmp(l, "sub/data.bin", 12),
       "the archive extracts to the same tree (%s)", err.msg);

    /* CANCEL stops it: nothing more for that id, and PING is answered. */
    id = archive_req(a, src, 4096);
    drain(a, id, 300, &ended, NULL);
    send_frame(a, id, PROTO_CANCEL, 0, NULL, 0);
    send_credit(a, id, 1 << 30);
    uint32_t ping = next_id++;
    send_frame(a, ping, PROTO_PING, 0, NULL, 0);
    int late = 0, pong = 0;
    struct frame *f;
    while (!pong && (f = read_frame(a, TIMEOUT_MS))) {
        late += f->h.id == id;
        pong = f->h.id == ping;
        free(f->payload);
        free(f);
    }
    ok(pong && late == 0, "after CANCEL the archive sends nothing more; PING is answered");

    /* A single file is one entry under its own name. */
    snprintf(p, sizeof(p), "%s/sub/data.bin", src);
    id = archive_req(a, p, -1);
    proto_buf_reset(&tar);
    drain(a, id, TIMEOUT_MS, &ended, &tar);
    struct tar_hdr h;
    ok(ended && tar.len >= 512 && tar_parse_header(tar.data, &h, &err) == 1 &&
           !strcmp(h.name, "data.bin") && h.size == n,
       "FILE_ARCHIVE of a file: one entry named data.bin of %zu bytes", n);

    struct xres x = {0};
    tpath(p, sizeof(p), "nope");
    id = archive_req(a, p, -1);
    ok(collect_x(a, id, &x) == 0 && x.r.error && x.r.err_no == ENOENT,
       "FILE_ARCHIVE of a missing path: ERROR ENOENT");
    result_free(&x.r);

    /* Extraction of that archive (saved as a file), source removed after. */
    tpath(p, sizeof(p), "a.tar");
    write_file(p, tar.data, tar.len);
    tpath(dst, sizeof(dst), "x/y/z");
    memset(&x, 0, sizeof(x));
    id = extract_req(a, dst, p, PROTO_W_REMOVE_SOURCE);
    char q[PATH_MAX + 64];
    snprintf(q, sizeof(q), "%s/data.bin", dst);
    ok(collect_x(a, id, &x) == 0 && x.r.ok && x.extracted >= 1 && x.entries == 1 && x.bytes == n &&
           x.skipped == 0 && file_is(q, data, n) && access(p, F_OK) < 0,
       "FILE_EXTRACT: EXTRACTED (1 entry, %zu bytes), OK; the target made with its parents, the "
       "source removed",
       n);
    result_free(&x.r);
    proto_buf_free(&tar);
    free(data);
}

static void test_extract_refusals(struct agent *a)
{
    /* An archive whose second entry climbs out, and one through a symlink it made. */
    struct tar_hdr h = {0};
    uint8_t buf[8192] = {0};
    size_t len = 0;
    h.type = '0';
    h.mode = 0644;
    h.size = 2;
    strcpy(h.name, "ok.txt");
    len += tar_build_header(&h, buf + len, sizeof(buf) - len);
    memcpy(buf + len, "ok", 2);
    len += 512;
    strcpy(h.name, "../escaped.txt");
    len += tar_build_header(&h, buf + len, sizeof(buf) - len);
    memcpy(buf + len, "no", 2);
    len += 1024 + 512;
    char src[PATH_MAX], dst[PATH_MAX], p[PATH_MAX + 64];
    tpath(src, sizeof(src), "evil.tar");
    write_file(src, buf, len);
    tpath(dst, sizeof(dst), "t1");
    struct xres x = {0};
    uint32_t id = extract_req(a, dst, src, PROTO_W_REMOVE_SOURCE);
    tpath(p, sizeof(p), "escaped.txt");
    char q[PATH_MAX + 64];
    snprintf(q, sizeof(q), "%s/ok.txt", dst);
    ok(collect_x(a, id, &x) == 0 && x.r.error && x.r.err_no == EPERM && strstr(x.r.msg, "'..'") &&
           access(p, F_OK) < 0 && file_is(q, "ok", 2) && access(src, F_OK) < 0,
       "'../escaped.txt' is refused with EPERM, nothing outside, the entry before it stays, the "
       "source is removed even so (%s)",
       x.r.msg);
    result_free(&x.r);

    memset(buf, 0, sizeof(buf));
    len = 0;
    memset(&h, 0, sizeof(h));
    h.type = '2';
    h.mode = 0777;
    strcpy(h.name, "up");
    strcpy(h.link, "..");
    len += tar_build_header(&h, buf + len, sizeof(buf) - len);
    h.type = '0';
    h.size = 1;
    h.link[0] = '\0';
    strcpy(h.name, "up/escaped2.txt");
    len += tar_build_header(&h, buf + len, sizeof(buf) - len);
    len += 512 + 1024;
    write_file(src, buf, len);
    tpath(dst, sizeof(dst), "t2");
    memset(&x, 0, sizeof(x));
    id = extract_req(a, dst, src, 0);
    tpath(p, sizeof(p), "escaped2.txt");
    ok(collect_x(a, id, &x) == 0 && x.r.error && x.r.err_no == EPERM &&
           strstr(x.r.msg, "symlink") && access(p, F_OK) < 0 && access(src, F_OK) == 0,
       "a path through a symlink the archive made is refused; without REMOVE_SOURCE the source "
       "stays (%s)",
       x.r.msg);
    result_free(&x.r);

    struct {
        const char *path, *source;
        int64_t wflags;
        int err;
        const char *what;
    } bad[] = {
        {dst, NULL, -1, EINVAL, "no SOURCE"},
        {NULL, src, -1, EINVAL, "no PATH"},
        {dst, src, 1, EINVAL, "WFLAGS PARENTS (only REMOVE_SOURCE is taken)"},
        {dst, tmpdir, -1, EINVAL, "a SOURCE that is a directory"},
        {dst, "/nonexistent/a.tar", -1, ENOENT, "a missing SOURCE"},
        {src, src, -1, ENOTDIR, "a PATH that is a file"},
    };
    for (size_t i = 0; i < WR_ARRAY_LEN(bad); i++) {
        memset(&x, 0, sizeof(x));
        id = extract_req(a, bad[i].path, bad[i].source, bad[i].wflags);
        ok(collect_x(a, id, &x) == 0 && x.r.error && (int)x.r.err_no == bad[i].err,
           "FILE_EXTRACT with %s: ERROR %d (got %u: %s)", bad[i].what, bad[i].err, x.r.err_no,
           x.r.msg);
        result_free(&x.r);
    }
}

int main(int argc, char **argv)
{
    struct agent a;
    if (harness_begin(argc, argv, &a) < 0)
        return tap_done();
    ok(agent_skip_hello(&a), "the agent says HELLO first");
    test_archive(&a);
    test_extract_refusals(&a);
    harness_stop_agent(&a);
    return harness_done();
}
