/*
 * Directory trees in and out of the sandbox as tar streams (common/tar.c does the format).
 * FILE_ARCHIVE walks a tree from a path resolved in the commands' view and sends the archive
 * as DATA frames against the daemon's credit, produced only while the outbound queue has room,
 * like a file read. FILE_EXTRACT reads a tar file that the caller put in the sandbox (in
 * pieces, with offset writes) and extracts it under a target directory a megabyte per turn of
 * the loop, so pings and other requests are answered meanwhile; an entry that would land
 * outside the target, or go through a symlink, is refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/err.h"
#include "common/tar.h"
#include "common/util.h"

/* Archive bytes one EXTRACT step reads and extracts. */
#define EXTRACT_STEP (1u << 20)
/* Entries one extraction may make. */
#define EXTRACT_MAX_ENTRIES 1000000
/* An EXTRACTED progress frame at least this often, so the daemon sees a long one is alive. */
#define EXTRACT_PROGRESS_MS 5000
/* DATA frames an ARCHIVE step fills before the other jobs get a turn. */
#define ARCHIVE_BUDGET 16

struct archive_job {
    struct req r;
    struct tarw *w;
    char *path;
};

struct extract_job {
    struct req r;
    struct untar *u;
    int src;
    uint64_t off;
    uint64_t last_ms;
    int remove_source;
    char *source;
    char *path;
};

static int field_path(const uint8_t *payload, size_t len, uint16_t tag, const char *what, char *out,
                      struct wr_err *err)
{
    struct proto_field f;
    int r = proto_find(payload, len, tag, &f);
    if (r < 0)
        return wr_err_set(err, EINVAL, "malformed payload");
    if (r == 0)
        return wr_err_set(err, EINVAL, "no %s", what);
    return agent_path(&f, what, out, err);
}

void archive_start(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[AGENT_PATH_BUF];
    struct wr_err err = {0};
    struct rpath rp = {.dir = -1};
    if (req_admit(id) < 0)
        return;
    if (field_path(payload, len, PT_PATH, "PATH", path, &err) < 0 ||
        agent_resolve(path, R_FOLLOW, "archive", &rp, &err) < 0) {
        chan_error(id, err.code, "%s", err.msg);
        return;
    }
    struct tarw *w = tarw_new(rp.dir, rp.name, &err);
    rpath_close(&rp);
    if (!w) {
        chan_error(id, err.code, "%s", err.msg);
        return;
    }
    struct archive_job *j = xcalloc(1, sizeof(*j));
    j->r.id = id;
    j->r.kind = REQ_ARCHIVE;
    j->w = w;
    j->path = xstrdup(path);
    if (req_window(&j->r, payload, len) < 0) {
        chan_error(id, EINVAL, "malformed WINDOW");
        archive_free(&j->r);
        return;
    }
    req_add(&j->r);
}

static int archive_step(struct archive_job *j)
{
    struct wr_err err = {0};
    for (int i = 0; i < ARCHIVE_BUDGET && chan_pending() < AGENT_OUT_SOFT; i++) {
        size_t want = req_room(&j->r, PROTO_FILE_CHUNK);
        if (want == 0)
            return 0; /* out of credit: CREDIT wakes the loop */
        uint8_t *p = chan_reserve_data(want);
        ssize_t n = tarw_read(j->w, p, want, &err);
        if (n < 0) {
            chan_error(j->r.id, err.code, "%s", err.msg);
            return 1;
        }
        if (n == 0) {
            chan_ok(j->r.id);
            return 1;
        }
        chan_commit_data(j->r.id, PROTO_DATA, (size_t)n);
        req_spend(&j->r, (size_t)n);
    }
    return 0;
}

static void send_extracted(struct extract_job *j)
{
    struct proto_buf b = {0};
    uint64_t entries, bytes, skipped;
    untar_counts(j->u, &entries, &bytes, &skipped);
    proto_put_u64(&b, PT_ENTRIES, entries);
    proto_put_u64(&b, PT_SIZE, bytes);
    proto_put_u64(&b, PT_SKIPPED, skipped);
    const char *kind = NULL, *first = untar_first_skipped(j->u, &kind);
    if (first) {
        proto_put_str(&b, PT_NAME, first);
        proto_put_str(&b, PT_MESSAGE, kind ? kind : "");
    }
    chan_send_fields(j->r.id, PROTO_EXTRACTED, &b);
    proto_buf_free(&b);
    j->last_ms = now_ms_monotonic();
}

void extract_start(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[AGENT_PATH_BUF] = "", source[AGENT_PATH_BUF] = "";
    struct wr_err err = {0};
    struct rpath rp = {.dir = -1};
    struct proto_field f;
    uint32_t wflags = 0;
    int dfd = -1, src = -1;
    struct stat st;

    if (req_admit(id) < 0)
        return;
    if (field_path(payload, len, PT_PATH, "PATH", path, &err) < 0 ||
        field_path(payload, len, PT_SOURCE, "SOURCE", source, &err) < 0)
        goto fail;
    if (proto_find(payload, len, PT_WFLAGS, &f) == 1 &&
        (proto_field_u32(&f, &wflags) < 0 || (wflags & ~(uint32_t)PROTO_W_REMOVE_SOURCE))) {
        wr_err_set(&err, EINVAL, "bad WFLAGS for FILE_EXTRACT");
        goto fail;
    }
    if (agent_resolve(source, R_FOLLOW, "extract", &rp, &err) < 0)
        goto fail;
    src = openat(rp.dir, rp.name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    rpath_close(&rp);
    if (src < 0 || fstat(src, &st) < 0) {
        wr_err_sys(&err, errno, "extract %s", source);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        wr_err_set(&err, EINVAL, "extract %s: the archive is not a regular file", source);
        goto fail;
    }
    if (agent_resolve(path, R_PARENTS | R_FOLLOW, "extract", &rp, &err) < 0)
        goto fail;
    if (mkdirat(rp.dir, rp.name, 0755) < 0 && errno != EEXIST) {
        wr_err_sys(&err, errno, "extract into %s", path);
        goto fail;
    }
    dfd = tar_open_dir(rp.dir, rp.name);
    rpath_close(&rp);
    if (dfd < 0) {
        wr_err_sys(&err, errno, "extract into %s", path);
        goto fail;
    }
    struct untar_limits lim = {.max_entries = EXTRACT_MAX_ENTRIES};
    struct extract_job *j = xcalloc(1, sizeof(*j));
    j->r.id = id;
    j->r.kind = REQ_EXTRACT;
    j->u = untar_new(dfd, &lim);
    j->src = src;
    j->remove_source = (wflags & PROTO_W_REMOVE_SOURCE) != 0;
    j->source = xstrdup(source);
    j->path = xstrdup(path);
    j->last_ms = now_ms_monotonic();
    req_add(&j->r);
    return;
fail:
    rpath_close(&rp);
    if (src >= 0)
        close(src);
    if (wflags & PROTO_W_REMOVE_SOURCE) {
        struct wr_err ignored = {0};
        if (source[0] == '/' && agent_resolve(source, 0, "remove", &rp, &ignored) == 0) {
            unlinkat(rp.dir, rp.name, 0);
            rpath_close(&rp);
        }
    }
    chan_error(id, err.code, "%s", err.msg);
}

static int extract_step(struct extract_job *j)
{
    static uint8_t buf[EXTRACT_STEP];
    struct wr_err err = {0};
    ssize_t n;
    do
        n = pread(j->src, buf, sizeof(buf), (off_t)j->off);
    while (n < 0 && errno == EINTR);
    int r;
    if (n < 0)
        r = wr_err_sys(&err, errno, "extract %s", j->source);
    else if (n == 0)
        r = untar_finish(j->u, &err);
    else
        r = untar_feed(j->u, buf, (size_t)n, &err);
    if (r == 0 && n > 0) {
        j->off += (uint64_t)n;
        if (now_ms_monotonic() - j->last_ms >= EXTRACT_PROGRESS_MS)
            send_extracted(j);
        return 0;
    }
    if (r < 0) {
        chan_error(j->r.id, err.code ? err.code : EINVAL, "extract into %s: %s", j->path, err.msg);
    } else {
        send_extracted(j);
        chan_ok(j->r.id);
    }
    return 1;
}

int archive_job_step(struct req *r)
{
    if (r->kind == REQ_ARCHIVE)
        return archive_step((struct archive_job *)r);
    if (r->kind == REQ_EXTRACT)
        return extract_step((struct extract_job *)r);
    return 0;
}

void archive_free(struct req *r)
{
    if (r->kind == REQ_ARCHIVE) {
        struct archive_job *j = (struct archive_job *)r;
        tarw_free(j->w);
        free(j->path);
    } else if (r->kind == REQ_EXTRACT) {
        struct extract_job *j = (struct extract_job *)r;
        untar_free(j->u);
        close(j->src);
        if (j->remove_source) {
            struct rpath rp;
            struct wr_err ignored = {0};
            if (agent_resolve(j->source, 0, "remove", &rp, &ignored) == 0) {
                unlinkat(rp.dir, rp.name, 0);
                rpath_close(&rp);
            }
        }
        free(j->source);
        free(j->path);
    } else {
        return;
    }
    free(r);
}
