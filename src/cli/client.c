/*
 * The CLI's HTTP client. One request per connection keeps it simple and makes every answer's
 * end unambiguous (Content-Length, chunked, or EOF). Sockets are non-blocking and every wait is
 * a ppoll, so timeouts and Ctrl-C work in the middle of a 100 MiB upload or an hour-long exec
 * stream without a race between checking for a signal and blocking.
 */
#include "cli/client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
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

static int io_send(struct io *io, const char *p, size_t n, struct wr_err *err)
{
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

int cli_request_do(const struct cli_endpoint *ep, const struct cli_request *req,
                   struct cli_response *resp, struct wr_err *err)
{
    memset(resp, 0, sizeof(*resp));
    struct io io = {.fd = -1, .req = req, .ep = ep};
    io.deadline_ms =
        now_ms_monotonic() + (uint64_t)(req->timeout_ms > 0 ? req->timeout_ms : CONNECT_TIMEOUT_MS);

    cleanup_free char *head = build_head(ep, req, err);
    if (!head)
        return -1;
    int r = ep->url.is_unix ? connect_unix(&io, err) : connect_tcp(&io, err);
    if (r < 0)
        return -1;
    cleanup_close int fd = io.fd;
    io_progress(&io);

    bool send_failed = false;
    r = io_send(&io, head, strlen(head), err);
    if (r == 0 && req->body_fd >= 0)
        r = send_body_fd(&io, req, err);
    else if (r == 0 && req->body_len > 0)
        r = io_send(&io, req->body, req->body_len, err);
    if (r < 0) {
        /* The daemon may have answered early (say, 413) and closed: read that answer. */
        if (err->code != EPIPE && err->code != ECONNRESET)
            return -1;
        send_failed = true;
    }
    /* No shutdown(SHUT_WR): some servers take a half-close as the client going away. */
    return read_response(&io, req, resp, send_failed, err);
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
