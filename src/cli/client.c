/*
 * The CLI's HTTP client. One request per connection keeps it simple and makes every answer's
 * end unambiguous (Content-Length, chunked, or EOF). Sockets are non-blocking and every wait is
 * a ppoll, so timeouts and Ctrl-C work in the middle of a 100 MiB upload or an hour-long exec
 * stream without a race between checking for a signal and blocking.
 */
#include "cli/client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define CONNECT_TIMEOUT_MS 10000
#define IO_CHUNK (64 * 1024)
/* An error answer's body is kept up to this size (it is a small JSON envelope). */
#define ERROR_BODY_MAX (64 * 1024)

volatile sig_atomic_t cli_stop_signal;

static bool g_signals_set;
static sigset_t g_orig_mask;    /* the mask before setup: stop signals deliverable */
static sigset_t g_blocked_mask; /* the mask outside cancelable waits */

static void on_stop_signal(int sig)
{
    cli_stop_signal = sig;
}

void cli_signals_setup(void)
{
    if (g_signals_set)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a wait must return EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    sigprocmask(SIG_BLOCK, &stop, &g_orig_mask);
    sigprocmask(SIG_BLOCK, NULL, &g_blocked_mask);
    sigdelset(&g_orig_mask, SIGINT);
    sigdelset(&g_orig_mask, SIGTERM);
    sigdelset(&g_orig_mask, SIGHUP);
    g_signals_set = true;
}

int cli_signals_poll(void)
{
    if (g_signals_set) {
        sigset_t cur;
        sigprocmask(SIG_SETMASK, &g_orig_mask, &cur);
        sigprocmask(SIG_SETMASK, &cur, NULL);
    }
    return cli_stop_signal;
}

void cli_signals_child_reset(void)
{
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* ---- waiting ---- */

struct io {
    int fd;
    SSL *ssl; /* https: the TLS session over fd */
    const struct cli_request *req;
    const struct cli_endpoint *ep;
    uint64_t deadline_ms; /* 0: none */
};

static int io_wait(struct io *io, short events, struct wr_err *err)
{
    struct pollfd pfd = {.fd = io->fd, .events = events};
    for (;;) {
        struct timespec ts, *tsp = NULL;
        if (io->deadline_ms) {
            uint64_t now = now_ms_monotonic();
            uint64_t left = io->deadline_ms > now ? io->deadline_ms - now : 0;
            ts.tv_sec = (time_t)(left / 1000);
            ts.tv_nsec = (long)(left % 1000) * 1000000L;
            tsp = &ts;
        }
        const sigset_t *mask = NULL;
        if (g_signals_set)
            mask = io->req->cancelable ? &g_orig_mask : &g_blocked_mask;
        int r = ppoll(&pfd, 1, tsp, mask);
        if (r > 0)
            return 0;
        if (r == 0)
            return wr_err_set(err, ETIMEDOUT, "no answer from the daemon at %s", io->ep->desc);
        if (errno != EINTR)
            return wr_err_sys(err, errno, "poll");
        if (io->req->cancelable && cli_stop_signal)
            return wr_err_set(err, ECANCELED, "interrupted");
    }
}

/* Pushes the deadline forward after progress: the timeout bounds silence, not the whole call. */
static void io_progress(struct io *io)
{
    if (io->req->timeout_ms > 0)
        io->deadline_ms = now_ms_monotonic() + (uint64_t)io->req->timeout_ms;
    else
        io->deadline_ms = 0;
}

/* The reason of OpenSSL's first queued error (the queue is emptied), or "unknown". */
static const char *ssl_reason(char *buf, size_t len)
{
    unsigned long e, first = 0;
    while ((e = ERR_get_error()) != 0)
        if (!first)
            first = e;
    const char *r = first ? ERR_reason_error_string(first) : NULL;
    snprintf(buf, len, "%s", r ? r : "unknown");
    return buf;
}

/* What an SSL_read/SSL_write/SSL_connect that returned r wants: 0 after waiting for the socket
 * (call again), or -1 with err set (errno-like codes, so a reset reads as one). */
static int tls_want(struct io *io, int r, const char *doing, struct wr_err *err)
{
    int e = SSL_get_error(io->ssl, r);
    char why[256];
    switch (e) {
    case SSL_ERROR_WANT_READ: return io_wait(io, POLLIN, err);
    case SSL_ERROR_WANT_WRITE: return io_wait(io, POLLOUT, err);
    case SSL_ERROR_SYSCALL:
        if (errno == EINTR)
            return 0;
        if (errno)
            return wr_err_sys(err, errno, "%s the daemon at %s", doing, io->ep->desc);
        return wr_err_set(err, ECONNRESET, "%s the daemon at %s: the connection closed", doing,
                          io->ep->desc);
    default:
        return wr_err_set(err, EPROTO, "%s the daemon at %s: TLS error (%s)", doing, io->ep->desc,
                          ssl_reason(why, sizeof(why)));
    }
}

static int io_send(struct io *io, const char *p, size_t n, struct wr_err *err)
{
    while (n > 0 && io->ssl) {
        ERR_clear_error();
        errno = 0;
        int w = SSL_write(io->ssl, p, n > INT_MAX ? INT_MAX : (int)n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            io_progress(io);
        } else if (tls_want(io, w, "sending to", err) < 0) {
            return -1;
        }
    }
    while (n > 0) {
        ssize_t w = send(io->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            io_progress(io);
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (io_wait(io, POLLOUT, err) < 0)
                return -1;
            continue;
        }
        return wr_err_sys(err, errno, "sending to the daemon at %s", io->ep->desc);
    }
    return 0;
}

/* Reads what is there (waiting for something). Returns bytes read, 0 at EOF, -1 on error. */
static ssize_t io_recv(struct io *io, char *buf, size_t cap, struct wr_err *err)
{
    while (io->ssl) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_read(io->ssl, buf, cap > INT_MAX ? INT_MAX : (int)cap);
        if (r > 0) {
            io_progress(io);
            return r;
        }
        /* The end of the stream, with or without a close_notify (the daemon closes without
         * one): every answer is framed (Content-Length or chunked), so a cut one is still seen
         * as cut where it matters. */
        if (SSL_get_error(io->ssl, r) == SSL_ERROR_ZERO_RETURN)
            return 0;
        if (tls_want(io, r, "reading from", err) < 0)
            return -1;
    }
    for (;;) {
        ssize_t r = recv(io->fd, buf, cap, 0);
        if (r >= 0) {
            io_progress(io);
            return r;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (io_wait(io, POLLIN, err) < 0)
                return -1;
            continue;
        }
        return wr_err_sys(err, errno, "reading from the daemon at %s", io->ep->desc);
    }
}

/* ---- connecting ---- */

static int connect_unix(struct io *io, struct wr_err *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", io->ep->url.path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return wr_err_sys(err, errno, "socket");
    /* Blocking connect: on a Unix socket it only waits while the listen backlog is full. */
    int r;
    do
        r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    while (r < 0 && errno == EINTR);
    if (r < 0) {
        int e = errno;
        close(fd);
        return wr_err_sys(err, e, "cannot connect to the daemon at %s", io->ep->desc);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    io->fd = fd;
    return 0;
}

static int connect_tcp(struct io *io, struct wr_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(io->ep->url.host, io->ep->url.port, &hints, &res);
    if (g != 0)
        return wr_err_set(err, EHOSTUNREACH, "cannot resolve '%s': %s", io->ep->url.host,
                          gai_strerror(g));
    int last = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            io->fd = fd;
            freeaddrinfo(res);
            return 0;
        }
        if (errno != EINPROGRESS) {
            last = errno;
            close(fd);
            continue;
        }
        io->fd = fd;
        struct wr_err werr;
        if (io_wait(io, POLLOUT, &werr) < 0) {
            io->fd = -1;
            close(fd);
            if (werr.code == ECANCELED || werr.code == ETIMEDOUT) {
                freeaddrinfo(res);
                *err = werr;
                return -1;
            }
            last = werr.code;
            continue;
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr == 0) {
            freeaddrinfo(res);
            return 0;
        }
        io->fd = -1;
        last = soerr;
        close(fd);
    }
    freeaddrinfo(res);
    return wr_err_sys(err, last, "cannot connect to the daemon at %s", io->ep->desc);
}

/* ---- TLS ---- */

/* A client context trusting ep's CA file, or the system's CAs. NULL with err set. */
static SSL_CTX *tls_ctx(const struct cli_endpoint *ep, struct wr_err *err)
{
    char why[256];
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        wr_err_set(err, ENOMEM, "cannot make a TLS context (%s)", ssl_reason(why, sizeof(why)));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    int ok;
    if (ep->ca_file[0]) {
        if (access(ep->ca_file, R_OK) < 0) {
            wr_err_sys(err, errno, "cannot read the CA file %s", ep->ca_file);
            SSL_CTX_free(ctx);
            return NULL;
        }
        ok = SSL_CTX_load_verify_locations(ctx, ep->ca_file, NULL) == 1;
    } else {
        ok = SSL_CTX_set_default_verify_paths(ctx) == 1;
    }
    if (!ok) {
        if (ep->ca_file[0])
            wr_err_set(err, EINVAL, "the CA file %s holds no PEM certificate (%s)", ep->ca_file,
                       ssl_reason(why, sizeof(why)));
        else
            wr_err_set(err, EINVAL, "cannot load the system's CA certificates (%s)",
                       ssl_reason(why, sizeof(why)));
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* The TLS handshake on io->fd: the daemon's certificate must chain to a trusted CA and name
 * the URL's host (an IP address in the URL must be among its IP addresses). */
static int tls_start(struct io *io, struct wr_err *err)
{
    const struct cli_endpoint *ep = io->ep;
    SSL_CTX *ctx = tls_ctx(ep, err);
    if (!ctx)
        return -1;
    io->ssl = SSL_new(ctx);
    SSL_CTX_free(ctx); /* the session keeps its own reference */
    if (!io->ssl)
        return wr_err_set(err, ENOMEM, "cannot start TLS");
    unsigned char addr[16];
    const char *host = ep->url.host;
    int is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
    if (is_ip) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(io->ssl), host);
    } else {
        SSL_set_tlsext_host_name(io->ssl, host);
        SSL_set_hostflags(io->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        SSL_set1_host(io->ssl, host);
    }
    SSL_set_fd(io->ssl, io->fd);
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_connect(io->ssl);
        if (r == 1)
            return 0;
        long v = SSL_get_verify_result(io->ssl);
        if (v != X509_V_OK) {
            ERR_clear_error();
            return wr_err_set(err, EPROTO,
                              "the certificate of the daemon at %s is not trusted: %s (give its "
                              "CA with RUNTIME_CA_FILE, or `withruntime login URL --ca-file FILE`)",
                              ep->desc, X509_verify_cert_error_string(v));
        }
        int e = SSL_get_error(io->ssl, r);
        if (e == SSL_ERROR_SSL) {
            char why[256];
            return wr_err_set(err, EPROTO,
                              "TLS handshake with the daemon at %s failed (%s); is it serving "
                              "https (serve --tls-cert)?",
                              ep->desc, ssl_reason(why, sizeof(why)));
        }
        if (tls_want(io, r, "TLS handshake with", err) < 0)
            return -1;
    }
}

/* ---- the request ---- */

static bool header_safe(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < ' ' || *s == 0x7f)
            return false;
    return true;
}

static char *build_head(const struct cli_endpoint *ep, const struct cli_request *req,
                        struct wr_err *err)
{
    if (!header_safe(req->method) || !header_safe(req->path) ||
        (req->content_type && !header_safe(req->content_type)) || !header_safe(ep->key)) {
        wr_err_set(err, EINVAL, "control character in a request header");
        return NULL;
    }
    char host[300];
    if (ep->url.is_unix)
        snprintf(host, sizeof(host), "localhost");
    else if (strchr(ep->url.host, ':'))
        snprintf(host, sizeof(host), "[%s]:%s", ep->url.host, ep->url.port);
    else
        snprintf(host, sizeof(host), "%s:%s", ep->url.host, ep->url.port);

    char *head = NULL;
    size_t headlen = 0;
    FILE *f = open_memstream(&head, &headlen);
    if (!f) {
        wr_err_sys(err, errno, "open_memstream");
        return NULL;
    }
    fprintf(f, "%s %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: withruntime-cli/%s\r\n", req->method,
            ep->url.is_unix ? "" : ep->url.prefix, req->path, host, WR_VERSION);
    fprintf(f, "Accept: application/json, application/x-ndjson, */*\r\nConnection: close\r\n");
    if (ep->key[0])
        fprintf(f, "Authorization: Bearer %s\r\n", ep->key);
    if (req->content_type)
        fprintf(f, "Content-Type: %s\r\n", req->content_type);
    bool has_body = req->body_fd >= 0 || req->body || strcmp(req->method, "POST") == 0 ||
                    strcmp(req->method, "PUT") == 0 || strcmp(req->method, "PATCH") == 0;
    if (has_body)
        fprintf(f, "Content-Length: %zu\r\n", req->body_len);
    fprintf(f, "\r\n");
    if (fclose(f) != 0) {
        free(head);
        wr_err_sys(err, errno, "building the request");
        return NULL;
    }
    return head;
}

static int send_body_fd(struct io *io, const struct cli_request *req, struct wr_err *err)
{
    cleanup_free char *buf = xmalloc(IO_CHUNK);
    size_t left = req->body_len;
    while (left > 0) {
        size_t want = left < IO_CHUNK ? left : IO_CHUNK;
        ssize_t r = read(req->body_fd, buf, want);
        if (r < 0 && errno == EINTR) {
            if (req->cancelable && cli_stop_signal)
                return wr_err_set(err, ECANCELED, "interrupted");
            continue;
        }
        if (r < 0)
            return wr_err_sys(err, errno, "reading the upload");
        if (r == 0)
            return wr_err_set(err, EIO, "the upload ended %zu bytes early (file changed?)", left);
        if (io_send(io, buf, (size_t)r, err) < 0)
            return -1;
        left -= (size_t)r;
    }
    return 0;
}

/* Where body bytes go. */
struct sink {
    const struct cli_request *req;
    struct cli_response *resp;
    bool stream; /* to req->on_data */
    bool error;  /* a non-2xx answer: keep the first ERROR_BODY_MAX bytes, drop the rest */
    bool failed; /* the sink itself failed: its error says more than the decoder's context */
    size_t cap;
};

static int sink_data(void *ctx, const char *data, size_t len, struct wr_err *err)
{
    struct sink *s = ctx;
    if (len == 0)
        return 0;
    if (s->stream) {
        int r = s->req->on_data(s->req->ctx, data, len, err);
        s->failed = r < 0;
        s->resp->local_error = r < 0;
        return r;
    }
    struct cli_response *r = s->resp;
    if (r->body_len + len > s->cap) {
        if (!s->error) {
            s->failed = true;
            return wr_err_set(err, EMSGSIZE, "answer larger than %zu bytes", s->cap);
        }
        len = s->cap - r->body_len;
        if (len == 0)
            return 0;
    }
    r->body = xrealloc(r->body, r->body_len + len + 1);
    memcpy(r->body + r->body_len, data, len);
    r->body_len += len;
    r->body[r->body_len] = '\0';
    return 0;
}

enum body_mode { BODY_NONE, BODY_LENGTH, BODY_CHUNKED, BODY_EOF };

struct body_reader {
    enum body_mode mode;
    uint64_t left; /* BODY_LENGTH */
    struct cli_chunked ch;
    bool done;
};

/* Feeds bytes of the body to the sink. Returns 0, or -1 with err set. */
static int body_feed(struct body_reader *b, struct sink *s, const char *p, size_t n,
                     struct wr_err *err)
{
    switch (b->mode) {
    case BODY_NONE: b->done = true; return 0;
    case BODY_LENGTH:
        if ((uint64_t)n > b->left)
            n = (size_t)b->left;
        if (sink_data(s, p, n, err) < 0)
            return -1;
        b->left -= n;
        b->done = b->left == 0;
        return 0;
    case BODY_CHUNKED:
        if (cli_chunked_feed(&b->ch, p, n, sink_data, s, err) < 0)
            return s->failed ? -1 : wr_err_prefix(err, "bad chunked answer from the daemon");
        b->done = cli_chunked_done(&b->ch);
        return 0;
    case BODY_EOF: return sink_data(s, p, n, err);
    }
    return 0;
}

static int read_response(struct io *io, const struct cli_request *req, struct cli_response *resp,
                         bool send_failed, struct wr_err *err)
{
    size_t cap = IO_CHUNK * 2;
    cleanup_free char *buf = xmalloc(cap);
    size_t len = 0;
    struct cli_head h;
    ssize_t hlen;

    /* The head: skip interim 1xx answers. */
    for (;;) {
        hlen = len ? cli_head_parse(buf, len, &h, err) : 0;
        if (hlen < 0)
            return wr_err_prefix(err, "bad answer from the daemon at %s", io->ep->desc);
        if (hlen > 0 && h.status >= 200) {
            break;
        } else if (hlen > 0) {
            memmove(buf, buf + hlen, len - (size_t)hlen);
            len -= (size_t)hlen;
            continue;
        }
        if (len == cap) {
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        struct wr_err rerr;
        ssize_t r = io_recv(io, buf + len, cap - len, &rerr);
        if (r < 0) {
            if (send_failed && rerr.code != ECANCELED)
                return -1; /* keep the send error: it says more */
            *err = rerr;
            return -1;
        }
        if (r == 0) {
            if (send_failed)
                return -1;
            return wr_err_set(err, ECONNRESET,
                              len ? "the daemon at %s closed the connection mid-answer"
                                  : "the daemon at %s closed the connection without answering",
                              io->ep->desc);
        }
        len += (size_t)r;
    }

    resp->status = h.status;
    snprintf(resp->reason, sizeof(resp->reason), "%s", h.reason);
    snprintf(resp->content_type, sizeof(resp->content_type), "%s", h.content_type);
    bool ok = h.status >= 200 && h.status < 300;

    struct sink s = {.req = req, .resp = resp};
    s.stream = ok && req->on_data;
    s.error = !ok;
    s.cap = ok ? (req->max_body ? req->max_body : CLI_BODY_MAX) : ERROR_BODY_MAX;

    struct body_reader b = {0};
    if (h.status == 204 || h.status == 304 || strcmp(req->method, "HEAD") == 0) {
        b.mode = BODY_NONE;
    } else if (h.chunked) {
        b.mode = BODY_CHUNKED;
        cli_chunked_init(&b.ch);
    } else if (h.content_length >= 0) {
        b.mode = BODY_LENGTH;
        b.left = (uint64_t)h.content_length;
    } else {
        b.mode = BODY_EOF;
    }
    if (!s.stream && b.mode == BODY_LENGTH && b.left > s.cap && !s.error)
        return wr_err_set(err, EMSGSIZE, "answer of %llu bytes is larger than %zu bytes",
                          (unsigned long long)b.left, s.cap);
    b.done = b.mode == BODY_NONE || (b.mode == BODY_LENGTH && b.left == 0);

    size_t have = len - (size_t)hlen;
    if (!b.done && have > 0 && body_feed(&b, &s, buf + hlen, have, err) < 0)
        return -1;
    while (!b.done) {
        ssize_t r = io_recv(io, buf, cap, err);
        if (r < 0)
            return -1;
        if (r == 0) {
            if (b.mode == BODY_EOF)
                break;
            return wr_err_set(err, ECONNRESET, "the daemon at %s closed the connection mid-answer",
                              io->ep->desc);
        }
        if (body_feed(&b, &s, buf, (size_t)r, err) < 0)
            return -1;
    }
    if (!s.stream && !resp->body) {
        resp->body = xstrdup("");
        resp->body_len = 0;
    }
    if (!ok) {
        char msg[WR_ERR_MSG_MAX];
        cli_error_describe(h.status, h.reason, resp->body, resp->body_len, msg, sizeof(msg),
                           resp->error_code, sizeof(resp->error_code));
        return wr_err_set(err, CLI_EAPI, "%s", msg);
    }
    return 0;
}

void cli_request_init(struct cli_request *req, const char *method, const char *path)
{
    memset(req, 0, sizeof(*req));
    req->method = method;
    req->path = path;
    req->body_fd = -1;
}

static int request_do(const struct cli_endpoint *ep, const struct cli_request *req,
                      struct cli_response *resp, struct wr_err *err)
{
    struct io io = {.fd = -1, .req = req, .ep = ep};
    io.deadline_ms =
        now_ms_monotonic() + (uint64_t)(req->timeout_ms > 0 ? req->timeout_ms : CONNECT_TIMEOUT_MS);

    if (ep->key[0] && !cli_url_key_safe(&ep->url))
        return wr_err_set(err, EPERM,
                          "refusing to send the API key in clear text to %s: use https:// (the "
                          "daemon's serve --tls-cert), or reach it on a loopback address (an SSH "
                          "tunnel)",
                          ep->desc);
    cleanup_free char *head = build_head(ep, req, err);
    if (!head)
        return -1;
    int r = ep->url.is_unix ? connect_unix(&io, err) : connect_tcp(&io, err);
    if (r < 0)
        return -1;
    cleanup_close int fd = io.fd;
    if (ep->url.tls && tls_start(&io, err) < 0) {
        SSL_free(io.ssl);
        return -1;
    }
    io_progress(&io);

    bool send_failed = false;
    r = io_send(&io, head, strlen(head), err);
    if (r == 0 && req->body_fd >= 0)
        r = send_body_fd(&io, req, err);
    else if (r == 0 && req->body_len > 0)
        r = io_send(&io, req->body, req->body_len, err);
    if (r < 0) {
        /* The daemon may have answered early (say, 413) and closed: read that answer. */
        if (err->code != EPIPE && err->code != ECONNRESET) {
            SSL_free(io.ssl);
            return -1;
        }
        send_failed = true;
    }
    /* No shutdown(SHUT_WR): some servers take a half-close as the client going away. */
    r = read_response(&io, req, resp, send_failed, err);
    SSL_free(io.ssl);
    return r;
}

int cli_request_do(const struct cli_endpoint *ep, const struct cli_request *req,
                   struct cli_response *resp, struct wr_err *err)
{
    memset(resp, 0, sizeof(*resp));
    int r = request_do(ep, req, resp, err);
    if (r == 0)
        return 0;
    /* What kind of failure, for the exit code (cli_exit_code): the daemon's answer by its
     * status; a connection that failed is the daemon unreachable; the rest is ours. */
    if (err->code == CLI_EAPI && resp->status == 404)
        err->kind = WR_E_NOT_FOUND;
    else if (err->code == CLI_EAPI && resp->status == 503 &&
             strcmp(resp->error_code, "capacity") == 0)
        err->kind = WR_E_CAPACITY;
    else if (err->code == CLI_EAPI)
        err->kind = resp->status >= 500 ? WR_E_UNAVAILABLE : WR_E_INVALID;
    else if (!resp->local_error && err->code != EPERM && err->code != ECANCELED)
        err->kind = WR_E_UNAVAILABLE;
    return r;
}

void cli_response_free(struct cli_response *resp)
{
    free(resp->body);
    memset(resp, 0, sizeof(*resp));
}

int cli_json_call(const struct cli_endpoint *ep, const char *method, const char *path, json_t *body,
                  json_t **out, struct wr_err *err)
{
    if (out)
        *out = NULL;
    struct cli_request req;
    cli_request_init(&req, method, path);
    cleanup_free char *text = NULL;
    if (body) {
        text = json_dumps(body, JSON_COMPACT);
        if (!text)
            return wr_err_set(err, ENOMEM, "cannot encode the request");
        req.body = text;
        req.body_len = strlen(text);
        req.content_type = "application/json";
    }
    struct cli_response resp;
    int r = cli_request_do(ep, &req, &resp, err);
    if (r == 0 && out) {
        json_error_t je;
        *out = json_loadb(resp.body, resp.body_len, 0, &je);
        if (!*out)
            r = wr_err_set(err, EPROTO, "bad JSON from the daemon: %s", je.text);
    }
    cli_response_free(&resp);
    return r;
}

/* ---- a raw connection ---- */

struct cli_conn {
    struct io io;
    struct cli_request req; /* io's: no timeout after the connect, not cancelable */
};

struct cli_conn *cli_conn_open(const struct cli_endpoint *ep, struct wr_err *err)
{
    if (ep->key[0] && !cli_url_key_safe(&ep->url)) {
        wr_err_set(err, EPERM,
                   "refusing to send the API key in clear text to %s: use https:// (the "
                   "daemon's serve --tls-cert), or reach it on a loopback address (an SSH "
                   "tunnel)",
                   ep->desc);
        return NULL;
    }
    struct cli_conn *c = xcalloc(1, sizeof(*c));
    cli_request_init(&c->req, "GET", "/");
    c->io = (struct io){.fd = -1, .req = &c->req, .ep = ep};
    c->io.deadline_ms = now_ms_monotonic() + CONNECT_TIMEOUT_MS;
    int r = ep->url.is_unix ? connect_unix(&c->io, err) : connect_tcp(&c->io, err);
    if (r == 0 && ep->url.tls && tls_start(&c->io, err) < 0)
        r = -1;
    if (r < 0) {
        cli_conn_close(c);
        return NULL;
    }
    io_progress(&c->io);
    return c;
}

int cli_conn_fd(const struct cli_conn *c)
{
    return c->io.fd;
}

size_t cli_conn_buffered(const struct cli_conn *c)
{
    return c->io.ssl ? (size_t)SSL_pending(c->io.ssl) : 0;
}

int cli_conn_send(struct cli_conn *c, const void *p, size_t n, struct wr_err *err)
{
    return io_send(&c->io, p, n, err);
}

ssize_t cli_conn_recv(struct cli_conn *c, void *buf, size_t cap, struct wr_err *err)
{
    return io_recv(&c->io, buf, cap, err);
}

void cli_conn_host(const struct cli_endpoint *ep, char *out, size_t len)
{
    if (ep->url.is_unix)
        snprintf(out, len, "localhost");
    else if (strchr(ep->url.host, ':'))
        snprintf(out, len, "[%s]:%s", ep->url.host, ep->url.port);
    else
        snprintf(out, len, "%s:%s", ep->url.host, ep->url.port);
}

void cli_conn_close(struct cli_conn *c)
{
    if (!c)
        return;
    SSL_free(c->io.ssl);
    if (c->io.fd >= 0)
        close(c->io.fd);
    free(c);
}
