/*
 * `withruntime sandbox cat`, `write` and `ls`: a sandbox's files as bytes on stdout, from a
 * local file or stdin, and as a directory listing. Bodies are streamed both ways, never held
 * whole in memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/sandbox.h"
#include "common/util.h"

/* Uploads go in pieces of this size (the daemon's limit for one upload, 8 MiB by default). */
#define WRITE_PIECE ((size_t)8 << 20)

static int to_stdout(void *ctx, const char *data, size_t len, struct wr_err *err)
{
    if (write_all(1, data, len) < 0)
        return wr_err_sys(err, errno, "writing to stdout");
    return 0;
}

char *cli_files_url(const char *id, const char *what, const char *path, const char *extra)
{
    cleanup_free char *q = cli_query_escape(path);
    char *out = NULL;
    if (asprintf(&out, "/v1/sandboxes/%s/files/%s?path=%s%s", id, what, q, extra ? extra : "") < 0)
        abort();
    return out;
}

int cli_sandbox_cat(struct cli_ctx *c, int argc, char **argv)
{
    int r = cli_simple_opts("sandbox cat", argc, argv, NULL);
    if (r != CLI_GO_ON)
        return r;
    if (argc - optind != 2)
        return cli_usage_error("sandbox cat", "expected a sandbox ID and a PATH");
    const char *id = argv[optind];
    if (!cli_id_ok(id))
        return cli_usage_error("sandbox cat", "bad sandbox id '%s'", id);
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    cleanup_free char *path = cli_files_url(id, "content", argv[optind + 1], NULL);
    struct cli_request req;
    cli_request_init(&req, "GET", path);
    req.on_data = to_stdout;
    struct cli_response resp;
    struct wr_err err = {0};
    signal(SIGPIPE, SIG_IGN);
    r = cli_request_do(ep, &req, &resp, &err);
    cli_response_free(&resp);
    if (r < 0 && err.code == EPIPE)
        return 128 + SIGPIPE;
    return r < 0 ? cli_fail(&err) : CLI_EXIT_OK;
}

/* Copies stdin into an unlinked temporary file, so an upload of unknown size gets a length. */
static int spool_stdin(struct wr_err *err)
{
    const char *tmpdir = getenv("TMPDIR");
    if (!tmpdir || !*tmpdir)
        tmpdir = "/tmp";
    int fd = open(tmpdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        char tmpl[PATH_MAX];
        snprintf(tmpl, sizeof(tmpl), "%s/withruntime-upload-XXXXXX", tmpdir);
        fd = mkostemp(tmpl, O_CLOEXEC);
        if (fd < 0)
            return wr_err_sys(err, errno, "cannot create a temporary file in %s", tmpdir);
        unlink(tmpl);
    }
    cleanup_free char *buf = xmalloc(64 * 1024);
    for (;;) {
        ssize_t n = read(0, buf, 64 * 1024);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            return wr_err_sys(err, e, "reading stdin");
        }
        if (n == 0)
            break;
        if (write_all(fd, buf, (size_t)n) < 0) {
            int e = errno;
            close(fd);
            return wr_err_sys(err, e, "writing a temporary file in %s", tmpdir);
        }
    }
    if (lseek(fd, 0, SEEK_SET) < 0) {
        int e = errno;
        close(fd);
        return wr_err_sys(err, e, "lseek");
    }
    return fd;
}

static bool mode_ok(const char *m)
{
    size_t n = strlen(m);
    if (n < 3 || n > 4)
        return false;
    for (size_t i = 0; i < n; i++)
        if (m[i] < '0' || m[i] > '7')
            return false;
    return true;
}

/*
 * Opens what `write` sends: the local file src, or stdin when src is "-" (as it is when it is a
 * regular file, else copied to a temporary file). Returns an fd (the caller closes it) at the
 * first byte to send, with *len the bytes to send; or -1 (printed).
 */
static int write_source(const char *src, size_t *len /* OUT */)
{
    struct wr_err err = {0};
    int fd;
    if (strcmp(src, "-") == 0) {
        struct stat st;
        if (fstat(0, &st) == 0 && S_ISREG(st.st_mode))
            fd = dup(0); /* `< file`: send it as it is, no copy */
        else
            fd = spool_stdin(&err);
        if (fd < 0) {
            if (err.msg[0])
                cli_fail(&err);
            else
                cli_errorf("stdin: %s", strerror(errno));
            return -1;
        }
    } else {
        fd = open(src, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            cli_errorf("%s: %s", src, strerror(errno));
            return -1;
        }
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        cli_errorf("%s: not a regular file", src);
        close(fd);
        return -1;
    }
    off_t pos = lseek(fd, 0, SEEK_CUR);
    if (pos < 0 || pos > st.st_size)
        pos = 0;
    *len = (size_t)(st.st_size - pos);
    return fd;
}

int cli_sandbox_write(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"mode", required_argument, 0, OPT_MODE},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox write";
    const char *mode = NULL;
    bool as_json = false;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': return cli_print_help();
        case OPT_MODE:
            if (!mode_ok(optarg))
                return cli_usage_error(cmd, "--mode wants an octal mode like 0644, got '%s'",
                                       optarg);
            mode = optarg;
            break;
        case OPT_JSON: as_json = true; break;
        default: return cli_bad_option(cmd, argc, argv);
        }
    }
    int npos = argc - optind;
    if (npos < 2 || npos > 3)
        return cli_usage_error(cmd, "expected a sandbox ID, a PATH and optionally a FILE");
    const char *id = argv[optind];
    const char *dst = argv[optind + 1];
    const char *src = npos == 3 ? argv[optind + 2] : "-";
    if (!cli_id_ok(id))
        return cli_usage_error(cmd, "bad sandbox id '%s'", id);

    size_t len;
    cleanup_close int fd = write_source(src, &len);
    if (fd < 0)
        return CLI_EXIT_ERR;

    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    /* The first piece replaces the file, each next one is written at its offset. */
    size_t sent = 0;
    struct wr_err err = {0};
    int r = 0;
    do {
        size_t piece = len - sent < WRITE_PIECE ? len - sent : WRITE_PIECE;
        char extra[48] = "";
        if (sent == 0 && mode)
            snprintf(extra, sizeof(extra), "&mode=%s", mode);
        else if (sent > 0)
            snprintf(extra, sizeof(extra), "&offset=%zu", sent);
        cleanup_free char *path = cli_files_url(id, "content", dst, extra);
        struct cli_request req;
        cli_request_init(&req, "PUT", path);
        req.content_type = "application/octet-stream";
        req.body_fd = fd;
        req.body_len = piece;
        struct cli_response resp;
        r = cli_request_do(ep, &req, &resp, &err);
        if (r == 0)
            sent += piece;
        if (r == 0 && as_json && sent == len) {
            json_t *o = json_loadb(resp.body, resp.body_len, 0, NULL);
            if (o)
                cli_print_json(o);
            json_decref(o);
        }
        cli_response_free(&resp);
    } while (r == 0 && sent < len);
    if (r < 0 && sent > 0)
        fprintf(stderr, "withruntime: %s in the sandbox holds only the first %zu bytes\n",
                cli_safe(dst), sent);
    return r < 0 ? cli_fail(&err) : CLI_EXIT_OK;
}

int cli_sandbox_ls(struct cli_ctx *c, int argc, char **argv)
{
    bool as_json = false;
    int r = cli_simple_opts("sandbox ls", argc, argv, &as_json);
    if (r != CLI_GO_ON)
        return r;
    int npos = argc - optind;
    if (npos < 1 || npos > 2)
        return cli_usage_error("sandbox ls", "expected a sandbox ID and optionally a PATH");
    const char *id = argv[optind];
    if (!cli_id_ok(id))
        return cli_usage_error("sandbox ls", "bad sandbox id '%s'", id);
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    const char *where = npos == 2 ? argv[optind + 1] : "/workspace";
    cleanup_free char *path = cli_files_url(id, "list", where, NULL);
    struct wr_err err = {0};
    json_t *res = NULL;
    if (cli_json_call(ep, "GET", path, NULL, &res, &err) < 0) {
        /* A file (or a symlink to one) is shown as one row, as ls(1) does; anything else that
         * the daemon refused is its error. */
        cleanup_free char *stat_path = cli_files_url(id, "stat", where, NULL);
        struct wr_err serr = {0};
        json_t *st = NULL;
        if (err.code != CLI_EAPI || cli_json_call(ep, "GET", stat_path, NULL, &st, &serr) < 0 ||
            !json_is_object(st) || !strcmp(cli_str_or(st, "type", "directory"), "directory")) {
            json_decref(st);
            return cli_fail(&err);
        }
        if (as_json) {
            cli_print_json(st);
            json_decref(st);
            return CLI_EXIT_OK;
        }
        json_object_set_new(st, "name", json_string(where));
        res = json_pack("{s:[o]}", "entries", st);
    }
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    printf("%-9s  %-4s  %12s  %-20s  %s\n", "TYPE", "MODE", "SIZE", "MTIME", "NAME");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "entries"), i, e)
    {
        const char *target = json_string_value(json_object_get(e, "target"));
        printf("%-9s  %-4s  %12lld  %-20s  %s%s%s\n", cli_shown(e, "type", "?"),
               cli_shown(e, "mode", "-"), (long long)json_integer_value(json_object_get(e, "size")),
               cli_shown(e, "mtime", "-"), cli_shown(e, "name", "?"), target ? " -> " : "",
               target ? cli_safe(target) : "");
    }
    json_decref(res);
    return CLI_EXIT_OK;
}
