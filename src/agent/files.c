/*
 * File operations inside the sandbox. Paths resolve as the sandbox's commands see them: from
 * the root of the commands' mount namespace (pidns.c), whose /proc is theirs, not the agent's.
 * The kernel is never handed a whole path: resolve() walks it one component at a time with
 * O_NOFOLLOW, following ordinary symlinks itself and refusing every symlink that lives in a
 * /proc (the "magic" ones: fd/N, root, cwd, exe, map_files/..., self, thread-self), whose
 * target is an open file or a process's root rather than a path. A link planted in the
 * workspace (ln -s /proc/1/fd/2 x) can then never turn a write into a write to a descriptor
 * the agent or the sandbox's init holds. Requests are not trusted either: every field is
 * checked, reads and listings run as jobs that only produce while the outbound queue has room,
 * and a recursive remove never follows a symlink out of the tree.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/err.h"
#include "common/tar.h"
#include "common/util.h"

/* A DIR_ENTRIES frame is sent once its payload passes this; one entry adds at most ~4.4 KiB. */
#define LIST_FRAME (64u << 10)
/* Work one job does per loop iteration before the others get a turn. */
#define READ_BUDGET 16
/* DATA frames one read fills (preadv): each system call is a trip through gVisor's sentry. */
#define READ_FRAMES 4
#define LIST_BUDGET 1024
/* Passes over a directory while removing it: entries created meanwhile get this many tries. */
#define REMOVE_PASSES 8

#define W_KNOWN (PROTO_W_PARENTS | PROTO_W_APPEND | PROTO_W_RECURSIVE | PROTO_W_EXCL)
/* Symlinks one resolution follows before ELOOP (Linux's MAXSYMLINKS). */
#define MAX_LINKS 40
/* A path being resolved, with the targets of the symlinks met spliced in. */
#define RESOLVE_BUF (2 * PROTO_MAX_PATH + 2)

struct read_job {
    struct req r;
    int fd;
    uint64_t off, left;
    char *path;
};

struct write_req {
    struct req r;
    int fd;
    char *path;
};

struct list_job {
    struct req r;
    DIR *d;
    unsigned long count;
    struct proto_buf buf;
    char *path;
};

int agent_path(const struct proto_field *f, const char *what, char *out, struct wr_err *err)
{
    if (f->len == 0)
        return wr_err_set(err, EINVAL, "empty %s", what);
    if (f->len > PROTO_MAX_PATH)
        return wr_err_set(err, ENAMETOOLONG, "%s longer than %d bytes", what, PROTO_MAX_PATH);
    if (memchr(f->data, '\0', f->len))
        return wr_err_set(err, EINVAL, "%s contains a NUL byte", what);
    size_t n = 0;
    if (f->data[0] != '/') {
        memcpy(out, AGENT_WORKSPACE "/", sizeof(AGENT_WORKSPACE));
        n = sizeof(AGENT_WORKSPACE);
    }
    memcpy(out + n, f->data, f->len);
    out[n + f->len] = '\0';
    return 0;
}

/* Checks the payload and takes PATH from it. */
static int req_path(const uint8_t *payload, size_t len, const char *type, char *out,
                    struct wr_err *err)
{
    struct proto_field f;
    int r = proto_find(payload, len, PT_PATH, &f);
    if (r < 0)
        return wr_err_set(err, EINVAL, "malformed %s payload", type);
    if (r == 0)
        return wr_err_set(err, EINVAL, "%s without PATH", type);
    return agent_path(&f, "PATH", out, err);
}

/* Reads an optional u32 field; *out keeps its default when absent. Returns 1 if present. */
static int opt_u32(const uint8_t *payload, size_t len, uint16_t tag, const char *name,
                   uint32_t *out, struct wr_err *err)
{
    struct proto_field f;
    int r = proto_find(payload, len, tag, &f);
    if (r <= 0)
        return r; /* the payload was validated by req_path already */
    if (proto_field_u32(&f, out) < 0)
        return wr_err_set(err, EINVAL, "%s must be 4 bytes", name);
    return 1;
}

static int opt_u64(const uint8_t *payload, size_t len, uint16_t tag, const char *name,
                   uint64_t *out, struct wr_err *err)
{
    struct proto_field f;
    int r = proto_find(payload, len, tag, &f);
    if (r <= 0)
        return r;
    if (proto_field_u64(&f, out) < 0)
        return wr_err_set(err, EINVAL, "%s must be 8 bytes", name);
    return 1;
}

static int get_mode(const uint8_t *payload, size_t len, uint32_t *mode, struct wr_err *err)
{
    int r = opt_u32(payload, len, PT_MODE, "MODE", mode, err);
    if (r > 0 && *mode > 07777)
        return wr_err_set(err, EINVAL, "MODE %#o has bits beyond 07777", *mode);
    return r;
}

static int get_wflags(const uint8_t *payload, size_t len, uint32_t *wflags, struct wr_err *err)
{
    int r = opt_u32(payload, len, PT_WFLAGS, "WFLAGS", wflags, err);
    if (r > 0 && (*wflags & ~(uint32_t)W_KNOWN))
        return wr_err_set(err, EINVAL, "unknown WFLAGS bits %#x", *wflags & ~(uint32_t)W_KNOWN);
    return r;
}

static uint32_t ftype(mode_t m)
{
    if (S_ISREG(m))
        return PROTO_FT_FILE;
    if (S_ISDIR(m))
        return PROTO_FT_DIR;
    if (S_ISLNK(m))
        return PROTO_FT_SYMLINK;
    return PROTO_FT_OTHER;
}

/* Appends TYPE, SIZE, MODE, MTIME and, for a symlink, TARGET (read relative to dirfd). */
static void put_stat(struct proto_buf *b, const struct stat *st, int dirfd, const char *name)
{
    proto_put_u32(b, PT_TYPE, ftype(st->st_mode));
    proto_put_u64(b, PT_SIZE, st->st_size > 0 ? (uint64_t)st->st_size : 0);
    proto_put_u32(b, PT_MODE, (uint32_t)(st->st_mode & 07777));
    proto_put_u64(b, PT_MTIME, st->st_mtim.tv_sec > 0 ? (uint64_t)st->st_mtim.tv_sec : 0);
    if (S_ISLNK(st->st_mode) && name) {
        char target[PROTO_MAX_PATH];
        ssize_t n = readlinkat(dirfd, name, target, sizeof(target));
        if (n >= 0 && (size_t)n < sizeof(target))
            proto_put_bytes(b, PT_TARGET, target, (size_t)n);
    }
}

static void send_stat(uint32_t id, const struct stat *st, int dirfd, const char *name)
{
    struct proto_buf b = {0};
    put_stat(&b, st, dirfd, name);
    chan_send_fields(id, PROTO_STAT_RESULT, &b);
    proto_buf_free(&b);
}

/* ---- paths in the commands' view ---- */

void rpath_close(struct rpath *rp)
{
    if (rp->dir >= 0)
        close(rp->dir);
    rp->dir = -1;
}

/* The root of the commands' view: that of their namespace, whose holder is started afresh if
 * it died; the agent's own when there is no namespace (the agent run on a host, in tests). */
static int view_root(struct wr_err *err)
{
    static int own = -1;
    if (ag.pidns) {
        if (pidns_ready(err) < 0)
            return -1;
        if (ag.holder_root < 0)
            return wr_err_set(err, ESRCH, "the commands' namespace has no root");
        return ag.holder_root;
    }
    if (own < 0 && (own = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        return wr_err_sys(err, errno, "opening /");
    return own;
}

static int is_root(int fd, const struct stat *root)
{
    struct stat st;
    return fstat(fd, &st) == 0 && st.st_dev == root->st_dev && st.st_ino == root->st_ino;
}

/*
 * Resolves path (absolute, as agent_path makes it) from the root of the commands' view, one
 * component at a time, into rp. Symlinks are followed here, never by the kernel, except one in
 * /proc: those are refused with ELOOP, whatever they point to. The last component is followed
 * only with R_FOLLOW or a trailing '/'. `what` and path make the messages. Returns 0, or -1
 * with err set and rp->dir -1.
 */
int agent_resolve(const char *path, int flags, const char *what, struct rpath *rp,
                  struct wr_err *err)
{
    char buf[RESOLVE_BUF], link[PROTO_MAX_PATH + 1], name[NAME_MAX + 1];
    struct stat rst, st;
    int links = 0, tries = 0, cur = -1, fresh = 1;
    size_t pos = 0;

    rp->dir = -1;
    rp->slash = 0;
    int root = view_root(err);
    if (root < 0)
        return -1;
    if (fstat(root, &rst) < 0)
        return wr_err_sys(err, errno, "%s %s", what, path);
    size_t len = strlen(path);
    if (len >= sizeof(buf))
        return wr_err_sys(err, ENAMETOOLONG, "%s %s", what, path);
    memcpy(buf, path, len + 1);
    for (;;) {
        if (fresh) {
            /* A new path to walk: the request's, or a symlink's target and what followed it. */
            fresh = 0;
            pos = 0;
            if (buf[0] == '/' || cur < 0) {
                if (cur >= 0)
                    close(cur);
                if ((cur = fcntl(root, F_DUPFD_CLOEXEC, 0)) < 0)
                    return wr_err_sys(err, errno, "%s %s", what, path);
            }
        }
        while (buf[pos] == '/')
            pos++;
        if (!buf[pos]) { /* "/", or a symlink to it: the directory itself */
            rp->dir = cur;
            strcpy(rp->name, ".");
            return 0;
        }
        size_t start = pos;
        while (buf[pos] && buf[pos] != '/')
            pos++;
        if (pos - start > NAME_MAX) {
            close(cur);
            return wr_err_sys(err, ENAMETOOLONG, "%s %s", what, path);
        }
        memcpy(name, buf + start, pos - start);
        name[pos - start] = '\0';
        size_t after = pos;
        while (buf[after] == '/')
            after++;
        int last = !buf[after], slash = last && after > pos;
        int dots = !strcmp(name, ".") || !strcmp(name, "..");

        if (dots || fstatat(cur, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            int e = dots ? 0 : errno;
            if (!dots && e == ENOENT && !last && (flags & R_PARENTS) && tries++ < MAX_LINKS) {
                if (mkdirat(cur, name, 0755) < 0 && errno != EEXIST) {
                    e = errno;
                    close(cur);
                    return wr_err_sys(err, e, "%s %s: mkdir %s", what, path, name);
                }
                pos = start; /* look again: it is there now (or a racing symlink is) */
                continue;
            }
            if (!dots && !(e == ENOENT && last)) {
                close(cur);
                return wr_err_sys(err, e, "%s %s", what, path);
            }
            if (last) { /* ".", "..", or a name to create */
                rp->dir = cur;
                rp->slash = slash;
                strcpy(rp->name, !strcmp(name, "..") && is_root(cur, &rst) ? "." : name);
                return 0;
            }
            if (!strcmp(name, ".."))
                goto enter;
            continue; /* "." */
        }
        if (S_ISLNK(st.st_mode) && (!last || slash || (flags & R_FOLLOW))) {
            struct statfs fs;
            if (fstatfs(cur, &fs) < 0) {
                int e = errno;
                close(cur);
                return wr_err_sys(err, e, "%s %s", what, path);
            }
            if (fs.f_type == PROC_SUPER_MAGIC) {
                close(cur);
                return wr_err_set(err, ELOOP,
                                  "%s %s: %s is a link in /proc, which file operations never "
                                  "follow",
                                  what, path, name);
            }
            ssize_t n = readlinkat(cur, name, link, sizeof(link));
            int e = n < 0 ? errno : n == 0 ? ENOENT : ++links > MAX_LINKS ? ELOOP : 0;
            if (!e && (size_t)n + strlen(buf + pos) >= sizeof(buf))
                e = ENAMETOOLONG;
            if (e) {
                close(cur);
                return wr_err_sys(err, e, "%s %s", what, path);
            }
            /* The target, then the rest of the path (with its trailing '/', if any). */
            memmove(buf + n, buf + pos, strlen(buf + pos) + 1);
            memcpy(buf, link, (size_t)n);
            fresh = 1;
            continue;
        }
        if (last) {
            if (slash && !S_ISDIR(st.st_mode)) {
                close(cur);
                return wr_err_sys(err, ENOTDIR, "%s %s", what, path);
            }
            rp->dir = cur;
            rp->slash = slash;
            strcpy(rp->name, name);
            return 0;
        }
        if (!S_ISDIR(st.st_mode)) {
            close(cur);
            return wr_err_sys(err, ENOTDIR, "%s %s", what, path);
        }
    enter:;
        /* ".." of the root is the root, as for a process chrooted there. */
        if (!strcmp(name, "..") && is_root(cur, &rst))
            continue;
        int next = openat(cur, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            int e = errno;
            close(cur);
            return wr_err_sys(err, e, "%s %s", what, path);
        }
        close(cur);
        cur = next;
    }
}

/* ---- FILE_READ ---- */

void file_read_start(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[AGENT_PATH_BUF];
    struct wr_err err = {0};
    uint64_t off = 0, length = UINT64_MAX;
    struct stat st;
    struct rpath rp = {.dir = -1};
    int fd = -1;

    if (req_admit(id) < 0)
        return;
    struct req window = {0};
    if (req_path(payload, len, "FILE_READ", path, &err) < 0 ||
        opt_u64(payload, len, PT_OFFSET, "OFFSET", &off, &err) < 0 ||
        opt_u64(payload, len, PT_LENGTH, "LENGTH", &length, &err) < 0)
        goto fail;
    if (req_window(&window, payload, len) < 0) {
        wr_err_set(&err, EINVAL, "malformed WINDOW");
        goto fail;
    }
    if (off > INT64_MAX) {
        wr_err_set(&err, EINVAL, "OFFSET past the largest file offset");
        goto fail;
    }
    if (agent_resolve(path, R_FOLLOW, "read", &rp, &err) < 0)
        goto fail;
    /* O_NONBLOCK: opening a FIFO must not hang the loop (it is refused below anyway). */
    fd = openat(rp.dir, rp.name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
    rpath_close(&rp);
    if (fd < 0) {
        wr_err_sys(&err, errno, "read %s", path);
        goto fail;
    }
    if (fstat(fd, &st) < 0) {
        wr_err_sys(&err, errno, "read %s", path);
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        wr_err_sys(&err, EISDIR, "read %s", path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        wr_err_set(&err, EINVAL, "read %s: not a regular file", path);
        goto fail;
    }
    send_stat(id, &st, -1, NULL);
    struct read_job *j = xcalloc(1, sizeof(*j));
    j->r.id = id;
    j->r.kind = REQ_READ;
    j->r.windowed = window.windowed;
    j->r.credit = window.credit;
    j->fd = fd;
    j->off = off;
    j->left = length;
    j->path = xstrdup(path);
    req_add(&j->r);
    return;
fail:
    rpath_close(&rp);
    if (fd >= 0)
        close(fd);
    chan_error(id, err.code, "%s", err.msg);
}

static int read_step(struct read_job *j)
{
    for (int i = 0; i < READ_BUDGET && chan_pending() < AGENT_OUT_SOFT; i++) {
        if (j->left == 0 || j->off >= (uint64_t)INT64_MAX) {
            chan_ok(j->r.id);
            return 1;
        }
        const size_t most = READ_FRAMES * (size_t)PROTO_FILE_CHUNK;
        size_t want = j->left < most ? (size_t)j->left : most;
        if ((uint64_t)INT64_MAX - j->off < want)
            want = (size_t)((uint64_t)INT64_MAX - j->off);
        want = req_room(&j->r, want);
        if (want == 0)
            return 0; /* out of credit: CREDIT wakes the loop */
        /* the frames' payloads, back to back in the queue, filled by one read */
        size_t k = (want + PROTO_FILE_CHUNK - 1) / PROTO_FILE_CHUNK;
        uint8_t *p = chan_reserve_frames(k, PROTO_FILE_CHUNK);
        struct iovec iov[READ_FRAMES];
        for (size_t f = 0; f < k; f++) {
            size_t at = f * PROTO_FILE_CHUNK;
            iov[f].iov_base = p + f * (PROTO_HEADER_LEN + PROTO_FILE_CHUNK);
            iov[f].iov_len = want - at < PROTO_FILE_CHUNK ? want - at : PROTO_FILE_CHUNK;
        }
        ssize_t n = preadv(j->fd, iov, (int)k, (off_t)j->off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            chan_error(j->r.id, errno, "read %s: %s", j->path, strerror(errno));
            return 1;
        }
        if (n == 0) {
            chan_ok(j->r.id);
            return 1;
        }
        for (size_t f = 0, rest = (size_t)n; f < k && rest; f++) {
            size_t m = rest < iov[f].iov_len ? rest : iov[f].iov_len;
            chan_commit_data(j->r.id, PROTO_DATA, m);
            rest -= m;
        }
        req_spend(&j->r, (size_t)n);
        j->off += (uint64_t)n;
        j->left -= (uint64_t)n;
    }
    return 0;
}

/* ---- FILE_WRITE ---- */

void file_write_start(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[AGENT_PATH_BUF];
    struct wr_err err = {0};
    uint32_t mode = 0644, wflags = 0;
    uint64_t off = 0;
    int have_mode = 0, have_off = 0, fd = -1;
    struct stat st;
    struct rpath rp = {.dir = -1};

    if (req_admit(id) < 0)
        return;
    if (req_path(payload, len, "FILE_WRITE", path, &err) < 0 ||
        (have_mode = get_mode(payload, len, &mode, &err)) < 0 ||
        get_wflags(payload, len, &wflags, &err) < 0 ||
        (have_off = opt_u64(payload, len, PT_OFFSET, "OFFSET", &off, &err)) < 0)
        goto fail;
    if (have_off && (wflags & PROTO_W_APPEND)) {
        wr_err_set(&err, EINVAL, "OFFSET and APPEND together");
        goto fail;
    }
    if (have_off && off > INT64_MAX) {
        wr_err_set(&err, EINVAL, "OFFSET past the largest file offset");
        goto fail;
    }
    /* O_EXCL fails on an existing symlink rather than following it, as open(2) does. */
    if (agent_resolve(path,
                      ((wflags & PROTO_W_PARENTS) ? R_PARENTS : 0) |
                          ((wflags & PROTO_W_EXCL) ? 0 : R_FOLLOW),
                      "write", &rp, &err) < 0)
        goto fail;
    if (rp.slash) {
        wr_err_sys(&err, EISDIR, "write %s", path);
        goto fail;
    }
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    /* With OFFSET the file is written in place, never truncated. */
    if (wflags & PROTO_W_APPEND)
        flags |= O_APPEND;
    else if (!have_off)
        flags |= O_TRUNC;
    if (wflags & PROTO_W_EXCL)
        flags |= O_EXCL;
    /* Only a write from the start may create the file: anything else would begin with a hole. */
    if (have_off && off > 0)
        flags &= ~O_CREAT;
    /* O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of hanging the loop. */
    fd = openat(rp.dir, rp.name, flags | O_NOFOLLOW, (mode_t)mode);
    rpath_close(&rp);
    if (fd < 0 && errno == ENOENT && have_off && off > 0) {
        wr_err_set(&err, EINVAL,
                   "write %s: offset %llu is past the end of the file (it does not exist); a "
                   "write at an offset may start at most at the end",
                   path, (unsigned long long)off);
        goto fail;
    }
    if (fd < 0 || fstat(fd, &st) < 0) {
        wr_err_sys(&err, errno, "write %s", path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        wr_err_set(&err, EINVAL, "write %s: not a regular file", path);
        goto fail;
    }
    /* A write may continue a file or rewrite part of it, but never leave a hole. */
    if (have_off && off > (uint64_t)st.st_size) {
        wr_err_set(&err, EINVAL,
                   "write %s: offset %llu is past the end of the file (%lld bytes); a write at "
                   "an offset may start at most at the end",
                   path, (unsigned long long)off, (long long)st.st_size);
        goto fail;
    }
    if (fcntl(fd, F_SETFL, flags & O_APPEND) < 0 || (have_mode && fchmod(fd, (mode_t)mode) < 0)) {
        wr_err_sys(&err, errno, "write %s", path);
        goto fail;
    }
    if (have_off && lseek(fd, (off_t)off, SEEK_SET) < 0) {
        wr_err_sys(&err, errno, "write %s", path);
        goto fail;
    }
    struct write_req *w = xcalloc(1, sizeof(*w));
    w->r.id = id;
    w->r.kind = REQ_WRITE;
    w->fd = fd;
    w->path = xstrdup(path);
    req_add(&w->r);
    return;
fail:
    rpath_close(&rp);
    if (fd >= 0)
        close(fd);
    chan_error(id, err.code, "%s", err.msg);
}

void file_write_data(struct req *r, const uint8_t *data, size_t len, int fin)
{
    struct write_req *w = (struct write_req *)r;
    struct stat st;
    if (len && write_all(w->fd, data, len) < 0) {
        chan_error(r->id, errno, "write %s: %s", w->path, strerror(errno));
        goto done;
    }
    if (!fin)
        return;
    if (fstat(w->fd, &st) < 0) {
        chan_error(r->id, errno, "write %s: %s", w->path, strerror(errno));
        goto done;
    }
    /* close() is where a network or quota filesystem reports a failed write. */
    int fd = steal_fd(&w->fd);
    if (close(fd) < 0 && errno != EINTR) {
        chan_error(r->id, errno, "write %s: %s", w->path, strerror(errno));
        goto done;
    }
    send_stat(r->id, &st, -1, NULL);
    chan_ok(r->id);
done:
    req_remove(r);
    file_free(r);
}

/* ---- FILE_LIST ---- */

void file_list_start(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[AGENT_PATH_BUF];
    struct wr_err err = {0};

    if (req_admit(id) < 0)
        return;
    if (req_path(payload, len, "FILE_LIST", path, &err) < 0) {
        chan_error(id, err.code, "%s", err.msg);
        return;
    }
    struct rpath rp;
    if (agent_resolve(path, R_FOLLOW, "list", &rp, &err) < 0) {
        chan_error(id, err.code, "%s", err.msg);
        return;
    }
    int dfd = tar_open_dir(rp.dir, rp.name);
    rpath_close(&rp);
    DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
    if (!d) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        chan_error(id, e, "list %s: %s", path, strerror(e));
        return;
    }
    struct list_job *j = xcalloc(1, sizeof(*j));
    j->r.id = id;
    j->r.kind = REQ_LIST;
    j->d = d;
    j->path = xstrdup(path);
    req_add(&j->r);
}

static void list_flush(struct list_job *j)
{
    if (!j->buf.len)
        return;
    chan_send_fields(j->r.id, PROTO_DIR_ENTRIES, &j->buf);
    proto_buf_reset(&j->buf);
}

static int list_step(struct list_job *j)
{
    for (int i = 0; i < LIST_BUDGET && chan_pending() < AGENT_OUT_SOFT; i++) {
        errno = 0;
        struct dirent *e = readdir(j->d);
        if (!e) {
            list_flush(j);
            if (errno)
                chan_error(j->r.id, errno, "list %s: %s", j->path, strerror(errno));
            else
                chan_ok(j->r.id);
            return 1;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(j->d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* removed since readdir saw it */
        if (j->count == AGENT_LIST_MAX) {
            list_flush(j);
            chan_error(j->r.id, E2BIG, "list %s: more than %d entries", j->path, AGENT_LIST_MAX);
            return 1;
        }
        j->count++;
        proto_put_str(&j->buf, PT_NAME, e->d_name);
        put_stat(&j->buf, &st, dirfd(j->d), e->d_name);
        if (j->buf.len >= LIST_FRAME)
            list_flush(j);
    }
    return 0;
}

int file_job_step(struct req *r)
{
    if (r->kind == REQ_READ)
        return read_step((struct read_job *)r);
    if (r->kind == REQ_LIST)
        return list_step((struct list_job *)r);
    return 0;
}

void file_free(struct req *r)
{
    switch (r->kind) {
    case REQ_READ: {
        struct read_job *j = (struct read_job *)r;
        close(j->fd);
        free(j->path);
        break;
    }
    case REQ_WRITE: {
        struct write_req *w = (struct write_req *)r;
        if (w->fd >= 0)
            close(w->fd);
        free(w->path);
        break;
    }
    case REQ_LIST: {
        struct list_job *j = (struct list_job *)r;
        closedir(j->d);
        proto_buf_free(&j->buf);
        free(j->path);
        break;
    }
    default: return;
    }
    free(r);
}

/* ---- FILE_STAT, FILE_MKDIR ---- */

void file_stat(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[AGENT_PATH_BUF];
    struct wr_err err = {0};
    struct stat st;
    if (req_path(payload, len, "FILE_STAT", path, &err) < 0) {
        chan_error(id, err.code, "%s", err.msg);
        return;
    }
    struct rpath rp;
    if (agent_resolve(path, 0, "stat", &rp, &err) < 0) {
        chan_error(id, err.code, "%s", err.msg);
        return;
    }
    if (fstatat(rp.dir, rp.name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        int e = errno;
        rpath_close(&rp);
        chan_error(id, e, "stat %s: %s", path, strerror(e));
        return;
    }
    send_stat(id, &st, rp.dir, rp.name);
    rpath_close(&rp);
    chan_ok(id);
}

/* Whether path, its last symlink followed too, is a directory. */
static int is_dir(const char *path)
{
    struct rpath rp;
    struct stat st;
    if (agent_resolve(path, R_FOLLOW, "mkdir", &rp, NULL) < 0)
        return 0;
    int r = fstatat(rp.dir, rp.name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    rpath_close(&rp);
    return r;
}

void file_mkdir(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[AGENT_PATH_BUF];
    struct wr_err err = {0};
    uint32_t mode = 0755, wflags = 0;
    int have_mode = 0;
    struct rpath rp = {.dir = -1};

    if (req_path(payload, len, "FILE_MKDIR", path, &err) < 0 ||
        (have_mode = get_mode(payload, len, &mode, &err)) < 0 ||
        get_wflags(payload, len, &wflags, &err) < 0 ||
        agent_resolve(path, (wflags & PROTO_W_PARENTS) ? R_PARENTS : 0, "mkdir", &rp, &err) < 0)
        goto fail;
    if (mkdirat(rp.dir, rp.name, (mode_t)mode) < 0) {
        int e = errno;
        if (e == EEXIST && (wflags & PROTO_W_PARENTS) && is_dir(path)) {
            rpath_close(&rp);
            chan_ok(id);
            return;
        }
        wr_err_sys(&err, e, "mkdir %s", path);
        goto fail;
    }
    /* mkdir's mode passes through the umask; an explicit MODE is meant exactly. */
    if (have_mode) {
        int fd = tar_open_dir(rp.dir, rp.name);
        if (fd < 0 || fchmod(fd, (mode_t)mode) < 0) {
            wr_err_sys(&err, errno, "mkdir %s", path);
            if (fd >= 0)
                close(fd);
            goto fail;
        }
        close(fd);
    }
    rpath_close(&rp);
    chan_ok(id);
    return;
fail:
    rpath_close(&rp);
    chan_error(id, err.code, "%s", err.msg);
}

/* ---- FILE_REMOVE ---- */

/*
 * Empties the directory open at dfd (consumed). `shown` holds its path for messages, grown
 * and restored in place. Entries are never followed: subdirectories are opened with
 * O_NOFOLLOW relative to their parent's fd, so a symlink swapped in mid-way is unlinked, not
 * entered.
 */
static int remove_tree(int dfd, char *shown, size_t shown_len, int depth, struct wr_err *err)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        int e = errno;
        close(dfd);
        return wr_err_sys(err, e, "remove %s", shown);
    }
    int ret = 0;
    for (int pass = 0; pass < REMOVE_PASSES && ret == 0; pass++) {
        int seen = 0;
        struct dirent *e;
        errno = 0;
        while (ret == 0 && (e = readdir(d))) {
            const char *name = e->d_name;
            if (!strcmp(name, ".") || !strcmp(name, ".."))
                continue;
            seen = 1;
            size_t nlen = strlen(name);
            int fits = shown_len + 1 + nlen < AGENT_PATH_BUF;
            if (fits) {
                shown[shown_len] = '/';
                memcpy(shown + shown_len + 1, name, nlen + 1);
            }
            int isdir = e->d_type == DT_DIR;
            if (e->d_type == DT_UNKNOWN) {
                struct stat st;
                isdir =
                    fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
            }
            if (isdir) {
                if (depth + 1 >= AGENT_REMOVE_DEPTH) {
                    ret = wr_err_set(err, ELOOP, "remove %s: more than %d levels deep", shown,
                                     AGENT_REMOVE_DEPTH);
                } else {
                    int cfd = tar_open_dir(dirfd(d), name);
                    if (cfd < 0)
                        ret = errno == ENOENT ? 0 : wr_err_sys(err, errno, "remove %s", shown);
                    else
                        ret = remove_tree(cfd, shown, fits ? shown_len + 1 + nlen : shown_len,
                                          depth + 1, err);
                    if (ret == 0 && unlinkat(dirfd(d), name, AT_REMOVEDIR) < 0 && errno != ENOENT)
                        ret = wr_err_sys(err, errno, "remove %s", shown);
                }
            } else if (unlinkat(dirfd(d), name, 0) < 0 && errno != ENOENT) {
                ret = wr_err_sys(err, errno, "remove %s", shown);
            }
            shown[shown_len] = '\0';
            errno = 0;
        }
        if (ret == 0 && errno)
            ret = wr_err_sys(err, errno, "remove %s", shown);
        if (!seen)
            break;
        rewinddir(d);
    }
    closedir(d);
    return ret;
}

void file_remove(uint32_t id, const uint8_t *payload, size_t len)
{
    char path[AGENT_PATH_BUF];
    struct wr_err err = {0};
    uint32_t wflags = 0;
    struct stat st;
    struct rpath rp = {.dir = -1};

    if (req_path(payload, len, "FILE_REMOVE", path, &err) < 0 ||
        get_wflags(payload, len, &wflags, &err) < 0)
        goto fail;
    /* "link/" would resolve the symlink: remove the link itself, never what it points to. */
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
    if (agent_resolve(path, 0, "remove", &rp, &err) < 0)
        goto fail;
    if (fstatat(rp.dir, rp.name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        wr_err_sys(&err, errno, "remove %s", path);
        goto fail;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (unlinkat(rp.dir, rp.name, 0) < 0) {
            wr_err_sys(&err, errno, "remove %s", path);
            goto fail;
        }
    } else {
        if (wflags & PROTO_W_RECURSIVE) {
            int dfd = tar_open_dir(rp.dir, rp.name);
            if (dfd < 0) {
                wr_err_sys(&err, errno, "remove %s", path);
                goto fail;
            }
            char shown[AGENT_PATH_BUF];
            memcpy(shown, path, n + 1);
            if (remove_tree(dfd, shown, n, 0, &err) < 0)
                goto fail;
        }
        if (unlinkat(rp.dir, rp.name, AT_REMOVEDIR) < 0) {
            wr_err_sys(&err, errno, "remove %s", path);
            goto fail;
        }
    }
    rpath_close(&rp);
    chan_ok(id);
    return;
fail:
    rpath_close(&rp);
    chan_error(id, err.code, "%s", err.msg);
}
