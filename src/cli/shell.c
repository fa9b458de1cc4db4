/*
 * `withruntime sandbox shell ID [-- CMD [ARG...]]` and `sandbox exec -i`: an interactive session
 * (POST /v1/sandboxes/{id}/sessions) driven over its WebSocket (GET .../connect; the frames are
 * common/ws.h's). On a terminal the local one is put in raw mode, and restored on every way out
 * (the end, an error, SIGTERM, SIGHUP, SIGINT, SIGQUIT); SIGWINCH becomes a resize. Without a
 * terminal the session has pipes: stdin is sent until its end (then EOF), SIGINT is passed on.
 * The exit status is the remote command's (128+N for a signal).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <termios.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/sandbox.h"
#include "common/base64.h"
#include "common/util.h"
#include "common/ws.h"

/* Set by the signal handlers; the self-pipe wakes the loop. */
static volatile sig_atomic_t g_winch, g_stop;
static int g_wake[2] = {-1, -1};
static struct termios g_saved;
static volatile sig_atomic_t g_raw; /* the terminal is in raw mode: restore it on the way out */

static void tty_restore(void)
{
    if (g_raw) {
        tcsetattr(0, TCSAFLUSH, &g_saved);
        g_raw = 0;
    }
}

static void on_signal(int sig)
{
    int e = errno;
    if (sig == SIGWINCH)
        g_winch = 1;
    else
        g_stop = sig;
    if (g_wake[1] >= 0)
        (void)!write(g_wake[1], "x", 1);
    errno = e;
}

/* A fatal signal while raw: the terminal is restored before the process dies of it. */
static void on_fatal(int sig)
{
    tty_restore();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int tty_raw(void)
{
    if (tcgetattr(0, &g_saved) < 0)
        return -1;
    struct termios raw = g_saved;
    cfmakeraw(&raw);
    g_raw = 1;
    atexit(tty_restore);
    if (tcsetattr(0, TCSAFLUSH, &raw) < 0) {
        g_raw = 0;
        return -1;
    }
    return 0;
}

static void window_size(int *rows, int *cols)
{
    struct winsize ws;
    *rows = 24;
    *cols = 80;
    if (ioctl(1, TIOCGWINSZ, &ws) == 0 || ioctl(0, TIOCGWINSZ, &ws) == 0) {
        if (ws.ws_row > 0 && ws.ws_row <= 10000)
            *rows = ws.ws_row;
        if (ws.ws_col > 0 && ws.ws_col <= 10000)
            *cols = ws.ws_col;
    }
}

/* Sends one masked frame (a client's). */
static int ws_send(struct cli_conn *c, int op, const void *data, size_t len, struct wr_err *err)
{
    uint8_t h[WS_MAX_HEADER], mask[4];
    if (getrandom(mask, sizeof(mask), 0) != (ssize_t)sizeof(mask))
        memset(mask, 0x5a, sizeof(mask)); /* masking is for proxies' caches, not secrecy */
    size_t hl = ws_header_build(h, op, len, mask);
    uint8_t *buf = xmalloc(hl + len + 1);
    memcpy(buf, h, hl);
    if (len)
        memcpy(buf + hl, data, len);
    ws_mask(buf + hl, len, mask, 0);
    int r = cli_conn_send(c, buf, hl + len, err);
    free(buf);
    return r;
}

static int ws_send_json(struct cli_conn *c, json_t *o, struct wr_err *err)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    int r = ws_send(c, WS_OP_TEXT, s, strlen(s), err);
    free(s);
    return r;
}

static int out_all(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, -1);
            continue;
        }
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* What the session's WebSocket said. */
struct ws_state {
    struct cli_conn *conn;
    int got_exit;
    int exit_code, signal;
    int closed;
    struct wr_err err;
};

static int on_ws_msg(void *arg, int op, const uint8_t *data, size_t len, int fin, int code)
{
    struct ws_state *st = arg;
    switch (op) {
    case WS_OP_BINARY:
        if (len && out_all(1, data, len) < 0)
            return WS_CLOSE_GOING_AWAY;
        return 0;
    case WS_OP_TEXT: {
        json_t *o = json_loadb((const char *)data, len, 0, NULL);
        const char *type = json_string_value(json_object_get(o, "type"));
        if (type && !strcmp(type, "exit")) {
            st->got_exit = 1;
            json_t *ec = json_object_get(o, "exit_code"), *sg = json_object_get(o, "signal");
            st->exit_code = json_is_integer(ec) ? (int)json_integer_value(ec) : -1;
            st->signal = json_is_integer(sg) ? (int)json_integer_value(sg) : 0;
            const char *e = json_string_value(json_object_get(o, "error"));
            if (e)
                wr_err_set(&st->err, EIO, "the session failed: %s", e);
        } else if (type && !strcmp(type, "error")) {
            tty_restore();
            const char *m = json_string_value(json_object_get(o, "message"));
            cli_errorf("the daemon: %s", m ? m : "(error)");
        }
        json_decref(o);
        return 0;
    }
    case WS_OP_PING: return ws_send(st->conn, WS_OP_PONG, data, len, &st->err) < 0 ? 1011 : 0;
    case WS_OP_CLOSE:
        st->closed = 1;
        if (code != WS_CLOSE_NORMAL && !st->got_exit && !st->err.msg[0])
            wr_err_set(&st->err, ECONNRESET,
                       "the daemon closed the session's connection (%d%s%.*s)", code,
                       len ? ": " : "", (int)len, (const char *)data);
        /* The answering close frame; the daemon may have closed the connection already (it
         * does once its own close frame is out), which is no error. */
        struct wr_err ignored = {0};
        ws_send(st->conn, WS_OP_CLOSE, (uint8_t[]){code >> 8, code & 0xff}, 2, &ignored);
        return 0;
    }
    return 0;
}

/* The WebSocket handshake on c for path. Leftover bytes after the head go to *rest. */
static int handshake(struct cli_conn *c, const struct cli_endpoint *ep, const char *path,
                     char **rest, size_t *rest_len, struct wr_err *err)
{
    uint8_t rnd[16];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        return wr_err_set(err, EIO, "getrandom failed");
    cleanup_free char *key = base64_encode(rnd, sizeof(rnd));
    char host[300];
    cli_conn_host(ep, host, sizeof(host));
    char *req = NULL;
    size_t rl = 0;
    FILE *f = open_memstream(&req, &rl);
    fprintf(f,
            "GET %s%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n"
            "User-Agent: withruntime-cli/%s\r\n",
            ep->url.is_unix ? "" : ep->url.prefix, path, host, key, WR_VERSION);
    if (ep->key[0])
        fprintf(f, "Authorization: Bearer %s\r\n", ep->key);
    fprintf(f, "\r\n");
    fclose(f);
    int r = cli_conn_send(c, req, rl, err);
    free(req);
    if (r < 0)
        return -1;
    size_t cap = CLI_HEAD_MAX, len = 0;
    cleanup_free char *buf = xmalloc(cap + 1);
    char *end = NULL;
    while (!end) {
        if (len == cap)
            return wr_err_set(err, EPROTO, "the daemon's answer to the handshake is too long");
        ssize_t n = cli_conn_recv(c, buf + len, cap - len, err);
        if (n < 0)
            return -1;
        if (n == 0)
            return wr_err_set(err, ECONNRESET, "the daemon closed the connection");
        len += (size_t)n;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    struct cli_head h;
    if (cli_head_parse(buf, len, &h, err) < 0)
        return -1;
    size_t head_len = (size_t)(end + 4 - buf);
    if (h.status != 101) {
        /* An error envelope: read the body (it is small) and say what it says. */
        size_t want = h.content_length >= 0 ? head_len + (size_t)h.content_length : cap;
        if (want > cap)
            want = cap;
        while (len < want) {
            ssize_t n = cli_conn_recv(c, buf + len, want - len, err);
            if (n <= 0)
                break;
            len += (size_t)n;
        }
        char msg[512], code[64];
        cli_error_describe(h.status, h.reason, buf + head_len, len - head_len, msg, sizeof(msg),
                           code, sizeof(code));
        return wr_err_set(err, CLI_EAPI, "%s", msg);
    }
    /* The accept key proves the answer is to this handshake. */
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    char kg[64];
    snprintf(kg, sizeof(kg), "%s%s", key, guid);
    unsigned char md[20];
    unsigned int mdlen = 0;
    EVP_Digest(kg, strlen(kg), md, &mdlen, EVP_sha1(), NULL);
    cleanup_free char *want = base64_encode(md, sizeof(md));
    /* what came after the head is the first frames: kept before the head is cut off there */
    *rest_len = len - head_len;
    *rest = xmalloc(*rest_len + 1);
    memcpy(*rest, buf + head_len, *rest_len);
    buf[head_len] = '\0';
    const char *a = strcasestr(buf, "\r\nSec-WebSocket-Accept:");
    if (!a) {
        free(*rest);
        *rest = NULL;
        return wr_err_set(err, EPROTO, "the daemon's handshake has no Sec-WebSocket-Accept");
    }
    a += strlen("\r\nSec-WebSocket-Accept:");
    while (*a == ' ')
        a++;
    if (strncmp(a, want, strlen(want)) != 0) {
        free(*rest);
        *rest = NULL;
        return wr_err_set(err, EPROTO, "the daemon's Sec-WebSocket-Accept is wrong");
    }
    return 0;
}

static void delete_session(const struct cli_endpoint *ep, const char *path)
{
    struct wr_err err = {0};
    json_t *out = NULL;
    cli_json_call(ep, "DELETE", path, NULL, &out, &err);
    json_decref(out);
}

/* The loop: stdin to the session, the session to stdout, until it ends. */
static int pump(struct ws_state *st, int tty, char *rest, size_t rest_len, struct wr_err *err)
{
    struct ws_reader rd;
    ws_reader_init(&rd, 0, (size_t)16 << 20, (size_t)1 << 20);
    int in_open = 1;
    /* A send failed (err says how): nothing more is sent, the connection is read to its end,
     * where the session's exit may still be. */
    int lost = 0;
    uint8_t buf[65536];
    int rc = 0;
    /* frames that came with the handshake's answer (the last one possibly in part) */
    if (rest_len && ws_reader_feed(&rd, (uint8_t *)rest, rest_len, on_ws_msg, st) != 0)
        rc = wr_err_set(err, EPROTO, "the daemon broke the WebSocket protocol");
    while (!st->closed && rc == 0) {
        if (g_stop) {
            if (!tty && g_stop == SIGINT) {
                g_stop = 0;
                if (!lost &&
                    ws_send_json(st->conn,
                                 json_pack("{s:s, s:s}", "type", "signal", "signal", "INT"),
                                 err) < 0)
                    lost = 1;
                continue;
            }
            break;
        }
        if (g_winch) {
            g_winch = 0;
            int rows, cols;
            window_size(&rows, &cols);
            if (!lost && ws_send_json(st->conn,
                                      json_pack("{s:s, s:i, s:i}", "type", "resize", "rows", rows,
                                                "cols", cols),
                                      err) < 0)
                lost = 1;
        }
        struct pollfd pfd[3] = {
            {.fd = cli_conn_fd(st->conn), .events = POLLIN},
            {.fd = g_wake[0], .events = POLLIN},
            {.fd = in_open && !lost ? 0 : -1, .events = POLLIN},
        };
        if (!cli_conn_buffered(st->conn) && poll(pfd, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            rc = wr_err_sys(err, errno, "poll");
            break;
        }
        if (pfd[1].revents & POLLIN)
            (void)!read(g_wake[0], buf, sizeof(buf));
        if (cli_conn_buffered(st->conn) || (pfd[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t n = cli_conn_recv(st->conn, buf, sizeof(buf), err);
            if (n <= 0) {
                if (n == 0 && !st->got_exit && !lost)
                    wr_err_set(err, ECONNRESET, "the daemon closed the session's connection");
                rc = st->got_exit ? 0 : -1;
                break;
            }
            int r = ws_reader_feed(&rd, buf, (size_t)n, on_ws_msg, st);
            if (r) {
                rc = wr_err_set(err, EPROTO, "the daemon broke the WebSocket protocol (%d)", r);
                break;
            }
            if (st->err.msg[0] && !st->got_exit) {
                *err = st->err;
                rc = -1;
                break;
            }
        }
        if (pfd[2].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = read(0, buf, sizeof(buf));
            if (n < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (n <= 0) {
                in_open = 0;
                if (ws_send_json(st->conn, json_pack("{s:s}", "type", "eof"), err) < 0)
                    lost = 1;
                continue;
            }
            if (ws_send(st->conn, WS_OP_BINARY, buf, (size_t)n, err) < 0)
                lost = 1;
        }
    }
    ws_reader_free(&rd);
    return rc;
}

int cli_session_run(struct cli_ctx *ctx, const char *id, json_t *argv, json_t *env, const char *cwd,
                    int want_tty)
{
    const struct cli_endpoint *ep;
    if (cli_endpoint(ctx, &ep) != 0)
        return CLI_EXIT_ERR;
    int tty = want_tty && isatty(0) && isatty(1);
    int rows, cols;
    window_size(&rows, &cols);
    json_t *body = json_pack("{s:b, s:i, s:i}", "tty", tty, "rows", rows, "cols", cols);
    if (argv)
        json_object_set(body, "argv", argv);
    if (env && json_object_size(env))
        json_object_set(body, "env", env);
    if (cwd)
        json_object_set_new(body, "cwd", json_string(cwd));
    char path[256];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/sessions", id);
    struct wr_err err = {0};
    json_t *ses = NULL;
    int r = cli_json_call(ep, "POST", path, body, &ses, &err);
    json_decref(body);
    if (r < 0)
        return cli_fail(&err);
    const char *sid = json_string_value(json_object_get(ses, "id"));
    char spath[300];
    snprintf(spath, sizeof(spath), "/v1/sandboxes/%s/sessions/%s", id, sid ? sid : "");
    json_decref(ses);

    char cpath[320];
    snprintf(cpath, sizeof(cpath), "%s/connect", spath);
    struct ws_state st = {0};
    st.conn = cli_conn_open(ep, &err);
    char *rest = NULL;
    size_t rest_len = 0;
    if (!st.conn || handshake(st.conn, ep, cpath, &rest, &rest_len, &err) < 0) {
        cli_conn_close(st.conn);
        delete_session(ep, spath);
        return cli_fail(&err);
    }

    if (pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        cli_conn_close(st.conn);
        return cli_fail(&(struct wr_err){.code = errno, .msg = "pipe failed"});
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGWINCH, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (tty) {
        struct sigaction fa = {.sa_handler = on_fatal};
        sigemptyset(&fa.sa_mask);
        sigaction(SIGQUIT, &fa, NULL);
        sigaction(SIGABRT, &fa, NULL);
        sigaction(SIGSEGV, &fa, NULL);
        if (tty_raw() < 0) {
            cli_conn_close(st.conn);
            delete_session(ep, spath);
            return cli_fail(&(struct wr_err){.code = errno, .msg = "cannot set the terminal raw"});
        }
    }
    r = pump(&st, tty, rest, rest_len, &err);
    free(rest);
    tty_restore();
    cli_conn_close(st.conn);
    if (g_stop) {
        delete_session(ep, spath);
        return 128 + g_stop;
    }
    if (!st.got_exit) {
        if (!err.msg[0])
            wr_err_set(&err, ECONNRESET, "the session's connection ended without its exit status");
        return cli_fail(&err);
    }
    (void)r;
    if (st.err.msg[0])
        return cli_fail(&st.err);
    if (st.signal)
        return 128 + st.signal;
    return st.exit_code >= 0 && st.exit_code <= 255 ? st.exit_code : CLI_EXIT_ERR;
}

int cli_sandbox_shell(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"cwd", required_argument, 0, OPT_CWD},
        {"env", required_argument, 0, OPT_ENV},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *cmd = "sandbox shell";
    const char *cwd = NULL;
    json_t *env = json_object();
    int code = CLI_EXIT_USAGE;
    optind = 0;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h': json_decref(env); return cli_print_help();
        case OPT_CWD: cwd = optarg; break;
        case OPT_ENV:
            if (cli_parse_kv(optarg, env) < 0) {
                json_decref(env);
                return cli_usage_error(cmd, "--env wants K=V, got '%s'", optarg);
            }
            break;
        default: json_decref(env); return cli_bad_option(cmd, argc, argv);
        }
    }
    if (optind >= argc) {
        json_decref(env);
        return cli_usage_error(cmd, "expected a sandbox ID");
    }
    const char *id = argv[optind++];
    if (!cli_id_ok(id)) {
        json_decref(env);
        return cli_usage_error(cmd, "bad sandbox id '%s'", id);
    }
    if (optind < argc && strcmp(argv[optind], "--") == 0)
        optind++;
    json_t *av = NULL;
    if (optind < argc) {
        av = json_object();
        if ((code = cli_exec_set_argv(cmd, av, argc - optind, argv + optind)) != CLI_GO_ON) {
            json_decref(av);
            json_decref(env);
            return code;
        }
    }
    code = cli_session_run(c, id, av ? json_object_get(av, "argv") : NULL, env, cwd, 1);
    json_decref(av);
    json_decref(env);
    return code;
}
