/*
 * Tar archives both ways (see tar.h). The writer keeps a small queue of header bytes and at
 * most one open file and one open directory per level; the extractor keeps one block, at most
 * one pax or long-name record (TAR_MAX_EXT) and one open file, plus the list of directories
 * whose modes and mtimes are set at the end (at most TAR_MAX_DIR_BYTES). Every number, name
 * and length in a header is checked before it is used.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/tar.h"
#include "common/util.h"

#define OCTAL11_MAX 077777777777ULL /* largest value in an 11-digit octal field */
/* Room for a pax header (its block and records, padded) and the ustar block behind it. */
#define PEND_CAP (3 * TAR_BLOCK + 2 * TAR_MAX_NAME + 4 * TAR_BLOCK)

/*
 * Opens the directory `name` in dirfd for reading, never through a symlink. Not with
 * O_RDONLY | O_DIRECTORY | O_NOFOLLOW: gVisor (20240729) follows a final symlink for that
 * combination (O_PATH | O_DIRECTORY | O_NOFOLLOW refuses it, as Linux does for both). So the
 * directory is first pinned with O_PATH, then "." in it opened.
 */
int tar_open_dir(int dirfd, const char *name)
{
    int p = openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (p < 0) {
        if (errno == ENOTDIR) { /* a symlink says ENOTDIR here; tell it apart */
            struct stat st;
            if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
                errno = ELOOP;
            else
                errno = ENOTDIR;
        }
        return -1;
    }
    int fd = openat(p, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int e = errno;
    close(p);
    errno = e;
    return fd;
}

/* ---- numbers and headers ---- */

/* Reads a numeric field: octal digits (leading spaces, ended by NUL or space), or GNU base-256
 * (first byte 0x80; negative values refused). */
static int parse_num(const uint8_t *f, size_t n, uint64_t max, uint64_t *out, const char *what,
                     struct wr_err *err)
{
    uint64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] != 0x80)
            return wr_err_set(err, EINVAL, "tar header: %s is negative or too large", what);
        for (size_t i = 1; i < n; i++) {
            if (v > (max >> 8))
                return wr_err_set(err, EINVAL, "tar header: %s out of range", what);
            v = (v << 8) | f[i];
        }
    } else {
        size_t i = 0;
        while (i < n && f[i] == ' ')
            i++;
        for (; i < n && f[i] != '\0' && f[i] != ' '; i++) {
            if (f[i] < '0' || f[i] > '7')
                return wr_err_set(err, EINVAL, "tar header: %s is not an octal number", what);
            if (v > (max >> 3))
                return wr_err_set(err, EINVAL, "tar header: %s out of range", what);
            v = (v << 3) | (uint64_t)(f[i] - '0');
        }
        for (; i < n; i++)
            if (f[i] != '\0' && f[i] != ' ')
                return wr_err_set(err, EINVAL, "tar header: %s is not an octal number", what);
    }
    if (v > max)
        return wr_err_set(err, EINVAL, "tar header: %s out of range", what);
    *out = v;
    return 0;
}

static void copy_field(char *out, const uint8_t *f, size_t n)
{
    size_t len = strnlen((const char *)f, n);
    memcpy(out, f, len);
    out[len] = '\0';
}

int tar_parse_header(const uint8_t *blk, struct tar_hdr *h, struct wr_err *err)
{
    size_t i;
    for (i = 0; i < TAR_BLOCK && blk[i] == 0; i++)
        ;
    if (i == TAR_BLOCK)
        return 0;
    uint64_t want, sum = 0;
    int64_t ssum = 0;
    for (i = 0; i < TAR_BLOCK; i++) {
        uint8_t c = (i >= 148 && i < 156) ? ' ' : blk[i];
        sum += c;
        ssum += (signed char)c;
    }
    if (parse_num(blk + 148, 8, 07777777, &want, "checksum", err) < 0)
        return -1;
    if (want != sum && (int64_t)want != ssum)
        return wr_err_set(err, EINVAL, "tar header: bad checksum");
    uint64_t mode, size, mtime;
    if (parse_num(blk + 100, 8, 07777777, &mode, "mode", err) < 0 ||
        parse_num(blk + 124, 12, INT64_MAX, &size, "size", err) < 0 ||
        parse_num(blk + 136, 12, INT64_MAX, &mtime, "mtime", err) < 0)
        return -1;
    memset(h, 0, sizeof(*h));
    h->type = (char)blk[156];
    h->mode = (uint32_t)(mode & 07777);
    h->size = size;
    h->mtime = (int64_t)mtime;
    char name[101], prefix[156];
    copy_field(name, blk, 100);
    copy_field(h->link, blk + 157, 100);
    /* POSIX ustar only: GNU's "ustar  " keeps other things where the prefix would be. */
    if (memcmp(blk + 257, "ustar\0", 6) == 0) {
        copy_field(prefix, blk + 345, 155);
        if (prefix[0]) {
            snprintf(h->name, sizeof(h->name), "%s/%s", prefix, name);
            return 1;
        }
    }
    memcpy(h->name, name, strlen(name) + 1);
    return 1;
}

static int pax_str(const uint8_t *v, size_t n, char *out, const char *key, struct wr_err *err)
{
    if (n > TAR_MAX_NAME)
        return wr_err_set(err, ENAMETOOLONG, "pax %s longer than %d bytes", key, TAR_MAX_NAME);
    if (memchr(v, '\0', n))
        return wr_err_set(err, EINVAL, "pax %s contains a NUL byte", key);
    memcpy(out, v, n);
    out[n] = '\0';
    return 0;
}

static int pax_num(const uint8_t *v, size_t n, int frac, uint64_t *out, const char *key,
                   struct wr_err *err)
{
    uint64_t x = 0;
    size_t i = 0;
    if (n == 0)
        return wr_err_set(err, EINVAL, "pax %s is empty", key);
    for (; i < n && v[i] >= '0' && v[i] <= '9'; i++) {
        if (x > (uint64_t)(INT64_MAX - 9) / 10)
            return wr_err_set(err, EINVAL, "pax %s out of range", key);
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    if (i == 0)
        return wr_err_set(err, EINVAL, "pax %s is not a number", key);
    if (i < n && frac && v[i] == '.') {
        for (i++; i < n && v[i] >= '0' && v[i] <= '9'; i++)
            ;
    }
    if (i != n)
        return wr_err_set(err, EINVAL, "pax %s is not a number", key);
    *out = x;
    return 0;
}

int tar_apply_pax(const uint8_t *data, size_t len, struct tar_hdr *h, struct wr_err *err)
{
    size_t pos = 0;
    while (pos < len) {
        size_t rlen = 0, i = pos;
        for (; i < len && data[i] >= '0' && data[i] <= '9' && i - pos < 8; i++)
            rlen = rlen * 10 + (size_t)(data[i] - '0');
        if (i == pos || i >= len || data[i] != ' ' || rlen < (i - pos) + 4 || rlen > len - pos ||
            data[pos + rlen - 1] != '\n')
            return wr_err_set(err, EINVAL, "malformed pax record");
        const uint8_t *key = data + i + 1, *end = data + pos + rlen - 1;
        const uint8_t *eq = memchr(key, '=', (size_t)(end - key));
        if (!eq || eq == key)
            return wr_err_set(err, EINVAL, "malformed pax record");
        size_t klen = (size_t)(eq - key), vlen = (size_t)(end - eq - 1);
        const uint8_t *v = eq + 1;
        uint64_t x;
        if (klen == 4 && !memcmp(key, "path", 4)) {
            if (pax_str(v, vlen, h->name, "path", err) < 0)
                return -1;
        } else if (klen == 8 && !memcmp(key, "linkpath", 8)) {
            if (pax_str(v, vlen, h->link, "linkpath", err) < 0)
                return -1;
        } else if (klen == 4 && !memcmp(key, "size", 4)) {
            if (pax_num(v, vlen, 0, &x, "size", err) < 0)
                return -1;
            h->size = x;
        } else if (klen == 5 && !memcmp(key, "mtime", 5)) {
            /* before 1970: kept at 0 */
            if (vlen && v[0] == '-')
                h->mtime = 0;
            else if (pax_num(v, vlen, 1, &x, "mtime", err) < 0)
                return -1;
            else
                h->mtime = (int64_t)x;
        }
        pos += rlen;
    }
    return 0;
}

static void put_octal(uint8_t *f, size_t n, uint64_t v)
{
    /* n-1 digits and a NUL */
    f[n - 1] = '\0';
    for (size_t i = n - 1; i-- > 0;) {
        f[i] = (uint8_t)('0' + (v & 7));
        v >>= 3;
    }
}

static void put_base256(uint8_t *f, size_t n, uint64_t v)
{
    memset(f, 0, n);
    f[0] = 0x80;
    for (size_t i = n - 1; i > 0 && v; i--) {
        f[i] = (uint8_t)(v & 0xff);
        v >>= 8;
    }
}

static void finish_block(uint8_t *b)
{
    memset(b + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < TAR_BLOCK; i++)
        sum += b[i];
    snprintf((char *)b + 148, 8, "%06o", sum);
    b[155] = ' ';
}

static void ustar_block(uint8_t *b, const char *name, char type, uint32_t mode, uint64_t size,
                        int64_t mtime, const char *link)
{
    memset(b, 0, TAR_BLOCK);
    memcpy(b, name, strnlen(name, 100));
    put_octal(b + 100, 8, mode & 07777);
    put_octal(b + 108, 8, 0);
    put_octal(b + 116, 8, 0);
    if (size > OCTAL11_MAX)
        put_base256(b + 124, 12, size);
    else
        put_octal(b + 124, 12, size);
    put_octal(b + 136, 12,
              mtime < 0                       ? 0
              : (uint64_t)mtime > OCTAL11_MAX ? OCTAL11_MAX
                                              : (uint64_t)mtime);
    b[156] = (uint8_t)type;
    if (link)
        memcpy(b + 157, link, strnlen(link, 100));
    memcpy(b + 257,
           "ustar\0"
           "00",
           8);
    finish_block(b);
}

/* Appends "LEN key=value\n" (LEN counting itself) to out at *pos. Returns -1 if it does not fit. */
static int pax_record(uint8_t *out, size_t cap, size_t *pos, const char *key, const char *val)
{
    size_t base = strlen(key) + strlen(val) + 3, len = base + 1;
    while (snprintf(NULL, 0, "%zu", len) + base != len)
        len = snprintf(NULL, 0, "%zu", len) + base;
    if (*pos + len + 1 > cap)
        return -1;
    snprintf((char *)out + *pos, cap - *pos, "%zu %s=%s\n", len, key, val);
    *pos += len;
    return 0;
}

size_t tar_build_header(const struct tar_hdr *h, uint8_t *out, size_t outcap)
{
    size_t pos = 0;
    int long_name = strlen(h->name) > 100, long_link = strlen(h->link) > 100;
    if (long_name || long_link || h->size > OCTAL11_MAX) {
        uint8_t rec[2 * TAR_MAX_NAME + 128];
        size_t rlen = 0;
        char num[32];
        if ((long_name && pax_record(rec, sizeof(rec), &rlen, "path", h->name) < 0) ||
            (long_link && pax_record(rec, sizeof(rec), &rlen, "linkpath", h->link) < 0))
            return 0;
        if (h->size > OCTAL11_MAX) {
            snprintf(num, sizeof(num), "%llu", (unsigned long long)h->size);
            if (pax_record(rec, sizeof(rec), &rlen, "size", num) < 0)
                return 0;
        }
        size_t padded = (rlen + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
        if (outcap < TAR_BLOCK + padded + TAR_BLOCK)
            return 0;
        ustar_block(out, "././@PaxHeader", 'x', 0644, rlen, h->mtime, NULL);
        memset(out + TAR_BLOCK, 0, padded);
        memcpy(out + TAR_BLOCK, rec, rlen);
        pos = TAR_BLOCK + padded;
    }
    if (outcap - pos < TAR_BLOCK)
        return 0;
    ustar_block(out + pos, h->name, h->type, h->mode, h->size, h->mtime, h->link);
    return pos + TAR_BLOCK;
}

/* ---- the writer ---- */

struct wframe {
    DIR *d;
    size_t plen; /* length of the names' prefix for this directory's entries */
};

struct tarw {
    struct wframe st[TAR_MAX_DEPTH];
    int depth;
    char rel[TAR_MAX_NAME + NAME_MAX + 2];
    uint8_t pend[PEND_CAP];
    size_t poff, plen;
    int fd;
    uint64_t fleft, fpad;
    int end; /* the end marker is queued */
    uint64_t skipped;
    struct tar_hdr h;
};

static int queue_header(struct tarw *w, struct wr_err *err)
{
    size_t n = tar_build_header(&w->h, w->pend, sizeof(w->pend));
    if (!n)
        return wr_err_set(err, ENAMETOOLONG, "archive %.200s: name too long", w->h.name);
    w->poff = 0;
    w->plen = n;
    return 0;
}

/* Queues the entry for `name` in dirfd, w->rel holding its name in the archive. Returns 1 if
 * an entry was queued, 0 if it was skipped, -1 on error. */
static int add_entry(struct tarw *w, int dirfd, const char *name, struct wr_err *err)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno == ENOENT)
            return w->skipped++, 0;
        return wr_err_sys(err, errno, "archive %.200s", w->rel);
    }
    struct tar_hdr *h = &w->h;
    memset(h, 0, sizeof(*h));
    size_t rl = strlen(w->rel);
    if (rl > TAR_MAX_NAME - 1)
        return wr_err_set(err, ENAMETOOLONG, "archive %.200s...: name longer than %d bytes", w->rel,
                          TAR_MAX_NAME - 1);
    memcpy(h->name, w->rel, rl + 1);
    h->mode = st.st_mode & 07777;
    h->mtime = st.st_mtim.tv_sec;
    if (S_ISDIR(st.st_mode)) {
        if (w->depth >= TAR_MAX_DEPTH)
            return wr_err_set(err, ELOOP, "archive %.200s: more than %d levels deep", w->rel,
                              TAR_MAX_DEPTH);
        int fd = tar_open_dir(dirfd, name);
        DIR *d = fd < 0 ? NULL : fdopendir(fd);
        if (!d) {
            int e = errno;
            if (fd >= 0)
                close(fd);
            if (e == ENOENT)
                return w->skipped++, 0;
            return wr_err_sys(err, e, "archive %.200s", w->rel);
        }
        h->type = '5';
        if (rl) {
            h->name[rl] = '/';
            h->name[rl + 1] = '\0';
            w->rel[rl] = '/';
            w->rel[rl + 1] = '\0';
            rl++;
        }
        w->st[w->depth++] = (struct wframe){d, rl};
        if (!rl) /* the top directory itself has no entry */
            return 0;
        return queue_header(w, err) < 0 ? -1 : 1;
    }
    if (S_ISREG(st.st_mode)) {
        int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0) {
            if (errno == ENOENT)
                return w->skipped++, 0;
            return wr_err_sys(err, errno, "archive %.200s", w->rel);
        }
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) { /* swapped meanwhile */
            close(fd);
            return w->skipped++, 0;
        }
        h->type = '0';
        h->mode = st.st_mode & 07777;
        h->size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
        h->mtime = st.st_mtim.tv_sec;
        if (queue_header(w, err) < 0) {
            close(fd);
            return -1;
        }
        w->fd = fd;
        w->fleft = h->size;
        w->fpad = (TAR_BLOCK - h->size % TAR_BLOCK) % TAR_BLOCK;
        return 1;
    }
    if (S_ISLNK(st.st_mode)) {
        ssize_t n = readlinkat(dirfd, name, h->link, TAR_MAX_NAME);
        if (n <= 0 || n >= TAR_MAX_NAME)
            return w->skipped++, 0;
        h->link[n] = '\0';
        h->type = '2';
        h->mode = 0777;
        return queue_header(w, err) < 0 ? -1 : 1;
    }
    w->skipped++; /* device, FIFO, socket */
    return 0;
}

struct tarw *tarw_new(int dirfd, const char *name, struct wr_err *err)
{
    struct tarw *w = xcalloc(1, sizeof(*w));
    w->fd = -1;
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        wr_err_sys(err, errno, "archive %.200s", name);
        free(w);
        return NULL;
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
        wr_err_set(err, EINVAL, "archive %.200s: not a file, directory or symlink", name);
        free(w);
        return NULL;
    }
    if (!S_ISDIR(st.st_mode)) {
        const char *base = strrchr(name, '/');
        snprintf(w->rel, sizeof(w->rel), "%s", base ? base + 1 : name);
    }
    if (add_entry(w, dirfd, name, err) < 0 || (!S_ISDIR(st.st_mode) && !w->plen)) {
        if (!err->msg[0])
            wr_err_set(err, ENOENT, "archive %.200s: it vanished", name);
        tarw_free(w);
        return NULL;
    }
    return w;
}

/* Queues the next entry, or the end marker. Returns 0 or -1. */
static int next_entry(struct tarw *w, struct wr_err *err)
{
    while (w->depth > 0) {
        struct wframe *f = &w->st[w->depth - 1];
        errno = 0;
        struct dirent *e = readdir(f->d);
        if (!e) {
            if (errno)
                return wr_err_sys(err, errno, "archive %.200s", w->rel);
            closedir(f->d);
            w->depth--;
            if (w->depth > 0)
                w->rel[w->st[w->depth - 1].plen] = '\0';
            continue;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        size_t nl = strlen(e->d_name);
        if (f->plen + nl > TAR_MAX_NAME - 2)
            return wr_err_set(err, ENAMETOOLONG, "archive %.200s%.50s: name longer than %d bytes",
                              w->rel, e->d_name, TAR_MAX_NAME - 2);
        memcpy(w->rel + f->plen, e->d_name, nl + 1);
        int r = add_entry(w, dirfd(f->d), e->d_name, err);
        if (r < 0)
            return -1;
        if (w->st[w->depth - 1].d == f->d) /* not a directory: the prefix stays */
            w->rel[f->plen] = '\0';
        if (r > 0)
            return 0;
    }
    memset(w->pend, 0, 2 * TAR_BLOCK);
    w->poff = 0;
    w->plen = 2 * TAR_BLOCK;
    w->end = 1;
    return 0;
}

ssize_t tarw_read(struct tarw *w, uint8_t *buf, size_t cap, struct wr_err *err)
{
    size_t n = 0;
    while (n < cap) {
        if (w->poff < w->plen) {
            size_t k = w->plen - w->poff < cap - n ? w->plen - w->poff : cap - n;
            memcpy(buf + n, w->pend + w->poff, k);
            w->poff += k;
            n += k;
            continue;
        }
        if (w->fleft) {
            size_t want = w->fleft < cap - n ? (size_t)w->fleft : cap - n;
            ssize_t r = 0;
            if (w->fd >= 0) {
                r = read(w->fd, buf + n, want);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r < 0)
                    return wr_err_sys(err, errno, "archive %.200s", w->h.name);
                if (r == 0) { /* it shrank: zeros to the size the header gave */
                    close(w->fd);
                    w->fd = -1;
                }
            }
            if (w->fd < 0) {
                memset(buf + n, 0, want);
                r = (ssize_t)want;
            }
            n += (size_t)r;
            w->fleft -= (uint64_t)r;
            continue;
        }
        if (w->fd >= 0) {
            close(w->fd);
            w->fd = -1;
        }
        if (w->fpad) {
            memset(w->pend, 0, w->fpad);
            w->poff = 0;
            w->plen = w->fpad;
            w->fpad = 0;
            continue;
        }
        if (w->end)
            break;
        if (next_entry(w, err) < 0)
            return -1;
    }
    return (ssize_t)n;
}

uint64_t tarw_skipped(const struct tarw *w)
{
    return w->skipped;
}

void tarw_free(struct tarw *w)
{
    if (!w)
        return;
    while (w->depth > 0)
        closedir(w->st[--w->depth].d);
    if (w->fd >= 0)
        close(w->fd);
    free(w);
}

/* ---- the extractor ---- */

enum ustate { U_HDR, U_EXT, U_DATA, U_SKIP, U_END, U_FAIL };

struct fixup {
    char *path;
    uint32_t mode;
    int64_t mtime;
};

struct untar {
    int root;
    struct untar_limits lim;
    enum ustate st;
    uint8_t blk[TAR_BLOCK];
    size_t blen;
    char ext_type;  /* 'x', 'g', 'L', 'K' while U_EXT */
    uint8_t *ext;   /* TAR_MAX_EXT bytes */
    size_t ext_len; /* of the record being read */
    size_t ext_got;
    uint8_t *pax; /* the pending pax record for the next entry */
    size_t pax_len;
    int have_pax;
    char *longname, *longlink; /* pending GNU long names, or NULL */
    struct tar_hdr h;
    int fd;             /* U_DATA: the file being written, or -1 */
    uint64_t left, pad; /* U_DATA / U_SKIP: bytes of data, then of padding */
    uint64_t entries, bytes, skipped;
    char first_skipped[TAR_MAX_NAME + 1];
    const char *skipped_kind;
    struct fixup *fix;
    size_t nfix, capfix;
    size_t fix_bytes;  /* what fix holds, names included: at most TAR_MAX_DIR_BYTES */
    struct wr_err err; /* once failed */
};

struct untar *untar_new(int dirfd, const struct untar_limits *lim)
{
    struct untar *u = xcalloc(1, sizeof(*u));
    u->root = dirfd;
    u->fd = -1;
    if (lim)
        u->lim = *lim;
    u->ext = xmalloc(TAR_MAX_EXT);
    u->pax = xmalloc(TAR_MAX_EXT);
    return u;
}

void untar_free(struct untar *u)
{
    if (!u)
        return;
    if (u->fd >= 0)
        close(u->fd);
    if (u->root >= 0)
        close(u->root);
    for (size_t i = 0; i < u->nfix; i++)
        free(u->fix[i].path);
    free(u->fix);
    free(u->ext);
    free(u->pax);
    free(u->longname);
    free(u->longlink);
    free(u);
}

void untar_counts(const struct untar *u, uint64_t *entries, uint64_t *bytes, uint64_t *skipped)
{
    if (entries)
        *entries = u->entries;
    if (bytes)
        *bytes = u->bytes;
    if (skipped)
        *skipped = u->skipped;
}

const char *untar_first_skipped(const struct untar *u, const char **kind)
{
    if (!u->skipped)
        return NULL;
    if (kind)
        *kind = u->skipped_kind;
    return u->first_skipped;
}

/*
 * Splits an entry's name into clean components in out (NUL-separated, n of them): "" and "."
 * are dropped; an absolute name or a ".." is refused.
 */
static int clean_name(const char *name, char *out, int *n, struct wr_err *err)
{
    *n = 0;
    if (name[0] == '/')
        return wr_err_set(err, EPERM, "archive entry '%.200s' is an absolute path: refused", name);
    size_t o = 0;
    for (const char *p = name; *p;) {
        const char *s = p;
        while (*p && *p != '/')
            p++;
        size_t len = (size_t)(p - s);
        while (*p == '/')
            p++;
        if (len == 0 || (len == 1 && s[0] == '.'))
            continue;
        if (len == 2 && s[0] == '.' && s[1] == '.')
            return wr_err_set(err, EPERM,
                              "archive entry '%.200s' has a '..' component: it would land outside "
                              "the target; refused",
                              name);
        if (len > NAME_MAX)
            return wr_err_set(err, ENAMETOOLONG, "archive entry '%.200s': a name over %d bytes",
                              name, NAME_MAX);
        if (++*n > TAR_MAX_DEPTH)
            return wr_err_set(err, ELOOP, "archive entry '%.200s': more than %d levels deep", name,
                              TAR_MAX_DEPTH);
        memcpy(out + o, s, len);
        out[o + len] = '\0';
        o += len + 1;
    }
    return 0;
}

/* Opens the parent directory of the entry comps[n] (created when missing, never through a
 * symlink). *leaf points at the last component. Returns the fd (u->root itself for a top-level
 * entry: do not close that one), or -1. */
static int walk_parent(struct untar *u, const char *shown, char *comps, int n, char **leaf,
                       struct wr_err *err)
{
    int cur = u->root;
    char *c = comps;
    for (int i = 0; i < n - 1; i++, c += strlen(c) + 1) {
        int next = tar_open_dir(cur, c);
        if (next < 0 && errno == ENOENT) {
            if (mkdirat(cur, c, 0755) < 0 && errno != EEXIST) {
                wr_err_sys(err, errno, "archive entry '%.200s': mkdir %.100s", shown, c);
                goto fail;
            }
            next = tar_open_dir(cur, c);
        }
        if (next < 0) {
            int e = errno;
            struct stat st;
            if ((e == ELOOP || e == ENOTDIR) && fstatat(cur, c, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISLNK(st.st_mode))
                wr_err_set(err, EPERM,
                           "archive entry '%.200s' goes through the symlink '%.100s': refused",
                           shown, c);
            else
                wr_err_sys(err, e, "archive entry '%.200s': %.100s", shown, c);
            goto fail;
        }
        if (cur != u->root)
            close(cur);
        cur = next;
    }
    *leaf = c;
    return cur;
fail:
    if (cur != u->root)
        close(cur);
    return -1;
}

/* Makes room for a non-directory at leaf: whatever non-directory is there goes. */
static int clear_leaf(int dir, const char *leaf, const char *shown, struct wr_err *err)
{
    struct stat st;
    if (fstatat(dir, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : wr_err_sys(err, errno, "archive entry '%.200s'", shown);
    if (S_ISDIR(st.st_mode))
        return wr_err_set(err, EISDIR, "archive entry '%.200s': a directory is in the way", shown);
    if (unlinkat(dir, leaf, 0) < 0)
        return wr_err_sys(err, errno, "archive entry '%.200s'", shown);
    return 0;
}

static void skip_entry(struct untar *u, const char *kind)
{
    if (!u->skipped++) {
        snprintf(u->first_skipped, sizeof(u->first_skipped), "%s", u->h.name);
        u->skipped_kind = kind;
    }
}

/* Data follows only regular files and types we do not know, as in other readers. */
static int has_data(char t)
{
    return !strchr("1234569", t) || t == '\0';
}

static void expect_data(struct untar *u, uint64_t size, enum ustate st)
{
    u->left = size;
    u->pad = (TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK;
    u->st = (size || u->pad) ? st : U_HDR;
}

static void close_file(struct untar *u)
{
    struct timespec ts[2] = {{0, UTIME_OMIT}, {u->h.mtime, 0}};
    fchmod(u->fd, u->h.mode & 0777);
    futimens(u->fd, ts);
    close(u->fd);
    u->fd = -1;
}

/* A whole header (with its pax and long names applied) is in u->h: act on it. */
static int on_entry(struct untar *u, struct wr_err *err)
{
    struct tar_hdr *h = &u->h;
    char t = h->type;
    if (t == 'x' || t == 'g' || t == 'L' || t == 'K') {
        if (h->size > TAR_MAX_EXT)
            return wr_err_set(err, E2BIG, "archive: a %s record of %llu bytes (at most %u)",
                              t == 'x' || t == 'g' ? "pax" : "long-name",
                              (unsigned long long)h->size, TAR_MAX_EXT);
        u->ext_type = t;
        u->ext_len = (size_t)h->size;
        u->ext_got = 0;
        u->pad = (TAR_BLOCK - h->size % TAR_BLOCK) % TAR_BLOCK;
        u->st = U_EXT;
        return 0;
    }
    if (u->lim.max_entries && u->entries >= u->lim.max_entries)
        return wr_err_set(err, E2BIG, "archive: more than %llu entries (the limit)",
                          (unsigned long long)u->lim.max_entries);
    int isreg = t == '0' || t == '\0' || t == '7';
    const char *kind = t == '1'                        ? "hard link"
                       : t == '3' || t == '4'          ? "device"
                       : t == '6'                      ? "FIFO"
                       : isreg || t == '5' || t == '2' ? NULL
                                                       : "unknown type";
    if (kind) {
        skip_entry(u, kind);
        expect_data(u, has_data(t) ? h->size : 0, U_SKIP);
        return 0;
    }
    if (isreg && u->lim.max_bytes && h->size > u->lim.max_bytes - u->bytes)
        return wr_err_set(err, E2BIG,
                          "archive: more than %llu bytes of files (the limit), at '%.200s'",
                          (unsigned long long)u->lim.max_bytes, h->name);
    char comps[TAR_MAX_NAME + 2];
    int n;
    if (clean_name(h->name, comps, &n, err) < 0)
        return -1;
    if (n == 0) { /* "." or "./": the target itself */
        if (t != '5')
            return wr_err_set(err, EINVAL, "archive entry '%.200s': a file with no name", h->name);
        expect_data(u, 0, U_SKIP);
        return 0;
    }
    char *leaf;
    int dir = walk_parent(u, h->name, comps, n, &leaf, err);
    if (dir < 0)
        return -1;
    int ret = 0;
    u->entries++;
    if (t == '5') {
        struct stat st;
        if (mkdirat(dir, leaf, 0700) < 0) {
            if (errno != EEXIST || fstatat(dir, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0)
                ret = wr_err_sys(err, errno, "archive entry '%.200s'", h->name);
            else if (!S_ISDIR(st.st_mode) &&
                     (unlinkat(dir, leaf, 0) < 0 || mkdirat(dir, leaf, 0700) < 0))
                ret = wr_err_sys(err, errno, "archive entry '%.200s'", h->name);
        }
        /* Each directory is remembered until the end (its mode and mtime are set last), so
         * what that costs is bounded, not the entry count times the longest name: a million
         * entries repeating one 4 KiB name would have held 4 GiB. */
        size_t cost = sizeof(*u->fix) + strlen(h->name) + 1;
        if (ret == 0 && u->fix_bytes + cost > TAR_MAX_DIR_BYTES)
            ret = wr_err_set(err, E2BIG,
                             "archive: more directories than the extractor keeps track of (%zu, "
                             "their names over %u MiB), at '%.200s': refused",
                             u->nfix, TAR_MAX_DIR_BYTES >> 20, h->name);
        if (ret == 0) {
            u->fix_bytes += cost;
            if (u->nfix == u->capfix) {
                u->capfix = u->capfix ? 2 * u->capfix : 64;
                u->fix = xrealloc(u->fix, u->capfix * sizeof(*u->fix));
            }
            /* the clean name, '/'-joined */
            size_t len = 0;
            for (int i = 0; i < n; i++) {
                len += strlen(comps + len) + 1;
                if (i < n - 1)
                    comps[len - 1] = '/';
            }
            u->fix[u->nfix++] = (struct fixup){xstrdup(comps), h->mode & 0777, h->mtime};
        }
        expect_data(u, 0, U_SKIP);
    } else if (t == '2') {
        if (!h->link[0])
            ret = wr_err_set(err, EINVAL, "archive entry '%.200s': a symlink to nothing", h->name);
        else if (clear_leaf(dir, leaf, h->name, err) < 0)
            ret = -1;
        else if (symlinkat(h->link, dir, leaf) < 0)
            ret = wr_err_sys(err, errno, "archive entry '%.200s'", h->name);
        else {
            struct timespec ts[2] = {{0, UTIME_OMIT}, {h->mtime, 0}};
            utimensat(dir, leaf, ts, AT_SYMLINK_NOFOLLOW);
        }
        expect_data(u, 0, U_SKIP);
    } else {
        if (clear_leaf(dir, leaf, h->name, err) < 0)
            ret = -1;
        else if ((u->fd = openat(dir, leaf,
                                 O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY,
                                 0600)) < 0)
            ret = wr_err_sys(err, errno, "archive entry '%.200s'", h->name);
        else {
            expect_data(u, h->size, U_DATA);
            if (u->st != U_DATA)
                close_file(u);
        }
    }
    if (dir != u->root)
        close(dir);
    return ret;
}

static int on_header(struct untar *u, struct wr_err *err)
{
    int r = tar_parse_header(u->blk, &u->h, err);
    if (r <= 0) {
        if (r == 0)
            u->st = U_END;
        return r;
    }
    if (u->longname) {
        snprintf(u->h.name, sizeof(u->h.name), "%s", u->longname);
        free(u->longname);
        u->longname = NULL;
    }
    if (u->longlink) {
        snprintf(u->h.link, sizeof(u->h.link), "%s", u->longlink);
        free(u->longlink);
        u->longlink = NULL;
    }
    if (u->have_pax && !strchr("xgLK", u->h.type)) {
        u->have_pax = 0;
        if (tar_apply_pax(u->pax, u->pax_len, &u->h, err) < 0)
            return -1;
    }
    return on_entry(u, err);
}

static int on_ext_done(struct untar *u, struct wr_err *err)
{
    if (u->ext_type == 'x') {
        memcpy(u->pax, u->ext, u->ext_len);
        u->pax_len = u->ext_len;
        u->have_pax = 1;
        /* checked now, so a bad record is refused even before a header that uses it */
        struct tar_hdr scratch = {0};
        if (tar_apply_pax(u->pax, u->pax_len, &scratch, err) < 0)
            return -1;
    } else if (u->ext_type == 'L' || u->ext_type == 'K') {
        size_t n = strnlen((const char *)u->ext, u->ext_len);
        if (n > TAR_MAX_NAME)
            return wr_err_set(err, ENAMETOOLONG, "archive: a long name over %d bytes",
                              TAR_MAX_NAME);
        char *s = xmalloc(n + 1);
        memcpy(s, u->ext, n);
        s[n] = '\0';
        char **slot = u->ext_type == 'L' ? &u->longname : &u->longlink;
        free(*slot);
        *slot = s;
    }
    u->left = 0;
    u->st = u->pad ? U_SKIP : U_HDR;
    return 0;
}

int untar_feed(struct untar *u, const uint8_t *buf, size_t len, struct wr_err *err)
{
    if (u->st == U_FAIL) {
        *err = u->err;
        return -1;
    }
    size_t pos = 0;
    int r = 0;
    while (pos < len && r == 0) {
        size_t avail = len - pos;
        switch (u->st) {
        case U_HDR: {
            size_t k = TAR_BLOCK - u->blen < avail ? TAR_BLOCK - u->blen : avail;
            memcpy(u->blk + u->blen, buf + pos, k);
            u->blen += k;
            pos += k;
            if (u->blen == TAR_BLOCK) {
                u->blen = 0;
                r = on_header(u, err);
            }
            break;
        }
        case U_EXT: {
            size_t k = u->ext_len - u->ext_got < avail ? u->ext_len - u->ext_got : avail;
            memcpy(u->ext + u->ext_got, buf + pos, k);
            u->ext_got += k;
            pos += k;
            if (u->ext_got == u->ext_len)
                r = on_ext_done(u, err);
            break;
        }
        case U_DATA: {
            size_t k = u->left < avail ? (size_t)u->left : avail;
            if (k && write_all(u->fd, buf + pos, k) < 0) {
                r = wr_err_sys(err, errno, "archive entry '%.200s'", u->h.name);
                break;
            }
            pos += k;
            u->left -= k;
            u->bytes += k;
            if (!u->left) {
                close_file(u);
                u->st = u->pad ? U_SKIP : U_HDR;
            }
            break;
        }
        case U_SKIP: {
            uint64_t want = u->left + u->pad;
            size_t k = want < avail ? (size_t)want : avail;
            pos += k;
            uint64_t d = k < u->left ? k : u->left;
            u->left -= d;
            u->pad -= k - d;
            if (!u->left && !u->pad)
                u->st = U_HDR;
            break;
        }
        case U_END: pos = len; break; /* what follows the end marker is padding */
        case U_FAIL: break;
        }
    }
    if (r < 0) {
        u->err = *err;
        u->st = U_FAIL;
        if (u->fd >= 0) {
            close(u->fd);
            u->fd = -1;
        }
        return -1;
    }
    return 0;
}

int untar_finish(struct untar *u, struct wr_err *err)
{
    if (u->st == U_FAIL) {
        *err = u->err;
        return -1;
    }
    if (!(u->st == U_END ||
          (u->st == U_HDR && u->blen == 0 && !u->have_pax && !u->longname && !u->longlink))) {
        u->st = U_FAIL;
        return wr_err_set(&u->err, EINVAL, "archive: it ended in the middle of an entry"),
               *err = u->err, -1;
    }
    /* Deepest first, so a directory's mtime is set after its children were made. */
    for (size_t i = u->nfix; i-- > 0;) {
        char comps[TAR_MAX_NAME + 2], *leaf;
        int n;
        struct wr_err e2 = {0};
        if (clean_name(u->fix[i].path, comps, &n, &e2) < 0 || n == 0)
            continue;
        int dir = walk_parent(u, u->fix[i].path, comps, n, &leaf, &e2);
        if (dir < 0)
            continue;
        int fd = tar_open_dir(dir, leaf);
        if (fd >= 0) {
            struct timespec ts[2] = {{0, UTIME_OMIT}, {u->fix[i].mtime, 0}};
            fchmod(fd, u->fix[i].mode);
            futimens(fd, ts);
            close(fd);
        }
        if (dir != u->root)
            close(dir);
    }
    return 0;
}
