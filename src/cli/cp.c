/*
 * `withruntime sandbox cp`: files and directory trees between this machine and a sandbox.
 * A directory goes up as a tar stream (common/tar.c) written to a staging file in the sandbox in
 * pieces of the upload limit, then extracted there by the agent (POST files/extract); it comes
 * down as the agent's tar stream (GET files/archive) extracted here as it arrives. What a sandbox
 * sends is not trusted: the extractor never writes outside the target, never follows a symlink
 * (one it made or one that was there), drops setuid/setgid bits, makes no devices, and stops at
 * a size and entry limit. Memory: one piece (8 MiB) up, a block and a pax record down.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/sandbox.h"
#include "common/tar.h"
#include "common/util.h"

/* Uploads go in pieces of this size (the daemon's limit for one upload, 8 MiB by default). */
#define CP_PIECE ((size_t)8 << 20)
#define CP_MAX_BYTES (64ULL << 30)
#define CP_MAX_ENTRIES 1000000ULL

enum { OPT_MAX_BYTES = 2000, OPT_MAX_ENTRIES };

/* Splits "ID:PATH" when ID is a sandbox id; returns 0 with id and path set, else -1. */
static int split_remote(const char *arg, char *id, size_t idlen, const char **path)
{
    const char *colon = strchr(arg, ':');
    if (!colon || colon == arg || (size_t)(colon - arg) >= idlen || !colon[1])
        return -1;
    memcpy(id, arg, (size_t)(colon - arg));
    id[colon - arg] = '\0';
    if (!cli_id_ok(id) || strncmp(id, "sb-", 3) != 0)
        return -1;
    *path = colon + 1;
    return 0;
}

/* PUTs buf[len] to path in the sandbox at offset (the first piece replaces the file). */
static int put_piece(const struct cli_endpoint *ep, const char *id, const char *path,
                     const void *buf, size_t len, uint64_t offset, unsigned mode,
                     struct wr_err *err)
{
    char extra[64];
    if (offset)
        snprintf(extra, sizeof(extra), "&offset=%llu", (unsigned long long)offset);
    else
        snprintf(extra, sizeof(extra), "&mode=%04o", mode & 0777);
    cleanup_free char *url = cli_files_url(id, "content", path, extra);
    struct cli_request req;
    cli_request_init(&req, "PUT", url);
    req.content_type = "application/octet-stream";
    req.body = buf;
    req.body_len = len;
    struct cli_response resp;
    int r = cli_request_do(ep, &req, &resp, err);
    cli_response_free(&resp);
    return r;
}

static int upload_file(const struct cli_endpoint *ep, const char *id, int fd, unsigned mode,
                       const char *src, const char *dst)
{
    cleanup_free uint8_t *buf = xmalloc(CP_PIECE);
    struct wr_err err = {0};
    uint64_t off = 0;
    for (;;) {
        ssize_t n = read_full(fd, buf, CP_PIECE);
        if (n < 0) {
            cli_errorf("%s: %s", src, strerror(errno));
            return CLI_EXIT_ERR;
        }
        if ((n > 0 || off == 0) && put_piece(ep, id, dst, buf, (size_t)n, off, mode, &err) < 0)
            return cli_fail(&err);
        off += (uint64_t)n;
        if ((size_t)n < CP_PIECE)
            return CLI_EXIT_OK;
    }
}

static void remove_remote(const struct cli_endpoint *ep, const char *id, const char *path)
{
    cleanup_free char *q = cli_query_escape(path);
    cleanup_free char *url = NULL;
    if (asprintf(&url, "/v1/sandboxes/%s/files?path=%s", id, q) < 0)
        abort();
    struct wr_err err = {0};
    cli_json_call(ep, "DELETE", url, NULL, NULL, &err);
}

static int upload_dir(const struct cli_endpoint *ep, const char *id, int dirfd, const char *src,
                      const char *dst)
{
    struct wr_err err = {0};
    struct tarw *w = tarw_new(dirfd, ".", &err);
    if (!w) {
        cli_errorf("%s: %s", src, err.msg);
        return CLI_EXIT_ERR;
    }
    uint8_t rnd[8];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        memset(rnd, 0x5a, sizeof(rnd));
    char staging[64];
    snprintf(staging, sizeof(staging), "/tmp/.withruntime-cp-%02x%02x%02x%02x%02x%02x%02x%02x.tar",
             rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    cleanup_free uint8_t *buf = xmalloc(CP_PIECE);
    uint64_t off = 0;
    int rc = CLI_EXIT_OK;
    for (;;) {
        ssize_t n = tarw_read(w, buf, CP_PIECE, &err);
        if (n < 0) {
            cli_errorf("%s: %s", src, err.msg);
            rc = CLI_EXIT_ERR;
            break;
        }
        if (n == 0)
            break;
        if (put_piece(ep, id, staging, buf, (size_t)n, off, 0600, &err) < 0) {
            rc = cli_fail(&err);
            break;
        }
        off += (uint64_t)n;
    }
    uint64_t skipped = tarw_skipped(w);
    tarw_free(w);
    if (rc != CLI_EXIT_OK) {
        if (off)
            remove_remote(ep, id, staging);
        return rc;
    }
    if (skipped)
        fprintf(stderr,
                "withruntime: %llu entries of %s skipped (devices, FIFOs, sockets, or gone)\n",
                (unsigned long long)skipped, src);
    char url[128];
    snprintf(url, sizeof(url), "/v1/sandboxes/%s/files/extract", id);
    json_t *body =
        json_pack("{s:s, s:s, s:b}", "archive", staging, "path", dst, "remove_archive", 1);
    json_t *res = NULL;
    int r = cli_json_call(ep, "POST", url, body, &res, &err);
    json_decref(body);
    if (r < 0)
        return cli_fail(&err);
    const char *note = json_string_value(json_object_get(res, "skipped_note"));
    if (note)
        fprintf(stderr, "withruntime: %s\n", cli_safe(note));
    json_decref(res);
    return CLI_EXIT_OK;
}

/* The last component of path (trailing slashes ignored), or NULL for "/" or "". */
static char *base_name(const char *path)
{
    size_t end = strlen(path);
    while (end > 0 && path[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && path[start - 1] != '/')
        start--;
    if (end == start)
        return NULL;
    char *name = xmalloc(end - start + 1);
    memcpy(name, path + start, end - start);
    name[end - start] = '\0';
    return name;
}

/* A file copied onto a directory (or a DEST ending in '/') goes into it under its own name,
 * as cp(1) and docker cp do. Returns the path to write: into, or a new string in *joined. */
static const char *into_dir(const char *dst, int dst_is_dir, const char *src, char **joined)
{
    size_t n = strlen(dst);
    cleanup_free char *name = base_name(src);
    if (!name || (!dst_is_dir && (n == 0 || dst[n - 1] != '/')))
        return dst;
    if (asprintf(joined, "%s%s%s", dst, n && dst[n - 1] == '/' ? "" : "/", name) < 0)
        abort();
    return *joined;
}

/* 1 when PATH in the sandbox is a directory (following a symlink), else 0. */
static int remote_is_dir(const struct cli_endpoint *ep, const char *id, const char *path)
{
    cleanup_free char *url = cli_files_url(id, "list", path, NULL);
    cleanup_free char *stat_url = cli_files_url(id, "stat", path, NULL);
    json_t *st = NULL;
    struct wr_err err = {0};
    if (cli_json_call(ep, "GET", stat_url, NULL, &st, &err) < 0)
        return 0;
    const char *type = cli_str_or(st, "type", "");
    int dir = strcmp(type, "directory") == 0, link = strcmp(type, "symlink") == 0;
    json_decref(st);
    if (link) {
        json_t *ls = NULL;
        struct wr_err lerr = {0};
        dir = cli_json_call(ep, "GET", url, NULL, &ls, &lerr) == 0;
        json_decref(ls);
    }
    return dir;
}

static int cp_up(const struct cli_endpoint *ep, const char *src, const char *id, const char *dst)
{
    int fd = open(src, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        cli_errorf("%s: %s", src, strerror(errno));
        if (fd >= 0)
            close(fd);
        return CLI_EXIT_ERR;
    }
    int rc;
    if (S_ISDIR(st.st_mode)) {
        rc = upload_dir(ep, id, fd, src, dst);
    } else if (S_ISREG(st.st_mode)) {
        cleanup_free char *joined = NULL;
        size_t n = strlen(dst);
        int dir = (n && dst[n - 1] == '/') || remote_is_dir(ep, id, dst);
        rc = upload_file(ep, id, fd, st.st_mode, src, into_dir(dst, dir, src, &joined));
    } else {
        cli_errorf("%s: not a file or directory", src);
        rc = CLI_EXIT_ERR;
    }
    close(fd);
    return rc;
}

static int to_untar(void *ctx, const char *data, size_t len, struct wr_err *err)
{
    return untar_feed(ctx, (const uint8_t *)data, len, err);
}

static int to_fd(void *ctx, const char *data, size_t len, struct wr_err *err)
{
    if (write_all(*(int *)ctx, data, len) < 0)
        return wr_err_sys(err, errno, "writing");
    return 0;
}

static int cp_down(const struct cli_endpoint *ep, const char *id, const char *src, const char *dst,
                   const struct untar_limits *lim)
{
    struct wr_err err = {0};
    json_t *st = NULL;
    cleanup_free char *stat_url = cli_files_url(id, "stat", src, NULL);
    if (cli_json_call(ep, "GET", stat_url, NULL, &st, &err) < 0)
        return cli_fail(&err);
    const char *type = cli_str_or(st, "type", "");
    unsigned mode = (unsigned)strtoul(cli_str_or(st, "mode", "0644"), NULL, 8) & 0777;
    int is_file = strcmp(type, "file") == 0, keep_mode = 1;
    int is_link = strcmp(type, "symlink") == 0;
    json_decref(st); /* type was st's */
    if (is_link) {
        /* Followed, as cp does: a listing works for a directory only. */
        cleanup_free char *list_url = cli_files_url(id, "list", src, NULL);
        json_t *ls = NULL;
        struct wr_err lerr = {0};
        if (cli_json_call(ep, "GET", list_url, NULL, &ls, &lerr) < 0) {
            if (strstr(lerr.msg, "Not a directory") == NULL)
                return cli_fail(&lerr);
            is_file = 1;
            keep_mode = 0; /* the link's own 0777 is not the file's */
            mode = 0666;
        }
        json_decref(ls);
    }
    struct cli_request req;
    struct cli_response resp;
    if (is_file) {
        struct stat lst;
        cleanup_free char *joined = NULL;
        dst = into_dir(dst, stat(dst, &lst) == 0 && S_ISDIR(lst.st_mode), src, &joined);
        int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, mode);
        if (fd < 0) {
            cli_errorf("%s: %s", dst, strerror(errno));
            return CLI_EXIT_ERR;
        }
        cleanup_free char *url = cli_files_url(id, "content", src, NULL);
        cli_request_init(&req, "GET", url);
        req.on_data = to_fd;
        req.ctx = &fd;
        int r = cli_request_do(ep, &req, &resp, &err);
        cli_response_free(&resp);
        if (r == 0 && keep_mode && fchmod(fd, mode) < 0)
            r = wr_err_sys(&err, errno, "%s", dst);
        if (close(fd) < 0 && r == 0)
            r = wr_err_sys(&err, errno, "%s", dst);
        return r < 0 ? cli_fail(&err) : CLI_EXIT_OK;
    }
    if (mkdir(dst, 0755) < 0 && errno != EEXIST) {
        cli_errorf("%s: %s", dst, strerror(errno));
        return CLI_EXIT_ERR;
    }
    int dfd = open(dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        cli_errorf("%s: %s", dst, strerror(errno));
        return CLI_EXIT_ERR;
    }
    struct untar *u = untar_new(dfd, lim);
    cleanup_free char *url = cli_files_url(id, "archive", src, NULL);
    cli_request_init(&req, "GET", url);
    req.on_data = to_untar;
    req.ctx = u;
    int r = cli_request_do(ep, &req, &resp, &err);
    cli_response_free(&resp);
    if (r == 0)
        r = untar_finish(u, &err);
    if (r == 0) {
        const char *kind = NULL, *first = untar_first_skipped(u, &kind);
        uint64_t skipped;
        untar_counts(u, NULL, NULL, &skipped);
        if (first)
            fprintf(stderr, "withruntime: %llu entries skipped, the first: %s '%s'\n",
                    (unsigned long long)skipped, kind ? kind : "entry", cli_safe(first));
    }
    untar_free(u);
    return r < 0 ? cli_fail(&err) : CLI_EXIT_OK;
}

static int parse_count(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    if (!s[0] || s[0] < '0' || s[0] > '9')
        return -1;
    *out = strtoull(s, &end, 10);
    return errno || *end || *out == 0 ? -1 : 0;
}

int cli_sandbox_cp(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"max-bytes", required_argument, 0, OPT_MAX_BYTES},
        {"max-entries", required_argument, 0, OPT_MAX_ENTRIES},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox cp";
    struct untar_limits lim = {.max_bytes = CP_MAX_BYTES, .max_entries = CP_MAX_ENTRIES};
    unsigned long long v;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': return cli_print_help();
        case OPT_MAX_BYTES:
        case OPT_MAX_ENTRIES:
            if (parse_count(optarg, &v) < 0)
                return cli_usage_error(cmd, "%s wants a positive number, got '%s'",
                                       opt == OPT_MAX_BYTES ? "--max-bytes" : "--max-entries",
                                       optarg);
            if (opt == OPT_MAX_BYTES)
                lim.max_bytes = v;
            else
                lim.max_entries = v;
            break;
        default: return cli_bad_option(cmd, argc, argv);
        }
    }
    if (argc - optind != 2)
        return cli_usage_error(cmd, "expected SRC and DEST, one of them ID:PATH");
    const char *src = argv[optind], *dst = argv[optind + 1], *rsrc, *rdst;
    char sid[64], did[64];
    int src_remote = split_remote(src, sid, sizeof(sid), &rsrc) == 0;
    int dst_remote = split_remote(dst, did, sizeof(did), &rdst) == 0;
    if (src_remote == dst_remote)
        return cli_usage_error(cmd, "exactly one of SRC and DEST must be ID:PATH (a sandbox's "
                                    "id, a colon, a path in it)");
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    if (dst_remote)
        return cp_up(ep, src, did, rdst);
    return cp_down(ep, sid, rsrc, dst, &lim);
}
