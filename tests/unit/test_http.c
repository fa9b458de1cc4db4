/*
 * The HTTP layer (http/http.h, http/router.h) as the API relies on it, driven by a plain
 * blocking client over TCP and a Unix socket while the server's loop runs in a thread:
 * decoded path and query, unknown and malformed query strings, headers, bodies within and
 * beyond the limit (413 before any handler runs), the error envelope, a chunked stream, the
 * close callback when a client leaves mid-stream (and not after a whole reply), TRACE
 * reaching the handler and closing its connection, keep-alive, the Unix socket's mode and
 * stale-socket replacement, stop_accepting; then route_find's matches, params, 405 Allow
 * lists and 404s.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "http/http.h"
#include "http/router.h"
#include "tap.h"

#define MAX_BODY 1024

static struct event_base *base;
static struct http_server *server;
static atomic_int handled, closes, onclose_after_reply, late_done;
static char tmpdir[] = "/tmp/wr-test-http-XXXXXX";
static char sock_path[256];
static int diag_errno;

/* ---- the server side (loop thread) ---- */

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static void count_close(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
}

struct later {
    struct http_req *r;
    struct event *ev;
    int step;
};

static void stream_more(evutil_socket_t fd, short what, void *arg)
{
    struct later *l = arg;
    http_stream_write(l->r, "two\n", 4);
    http_stream_end(l->r);
    event_free(l->ev);
    free(l);
}

static void hang_closed(evutil_socket_t fd, short what, void *arg)
{
    struct later *l = arg;
    http_stream_write(l->r, "late\n", 5); /* the client is gone: nothing happens */
    http_stream_end(l->r);
    event_free(l->ev);
    free(l);
    atomic_fetch_add(&late_done, 1);
}

static void hang_on_close(void *arg)
{
    struct later *l = arg;
    atomic_fetch_add(&closes, 1);
    struct timeval zero = {0, 0};
    evtimer_add(l->ev, &zero);
}

static void handler(struct http_req *r, void *ctx)
{
    atomic_fetch_add(&handled, 1);
    const char *path = http_req_path(r);
    if (strncmp(path, "/echo", 5) == 0) {
        if (strcmp(path, "/echo/onclose") == 0)
            http_req_on_close(r, count_close, &onclose_after_reply);
        char *body = http_req_body_string(r);
        json_t *o =
            json_pack("{s:s, s:s, s:o, s:o, s:o, s:i, s:o, s:o, s:I}", "method", http_req_method(r),
                      "path", path, "a", str_or_null(http_req_query(r, "a")), "b",
                      str_or_null(http_req_query(r, "b")), "unknown",
                      str_or_null(http_req_query_unknown(r, "a,b")), "bad", http_req_query_bad(r),
                      "hdr", str_or_null(http_req_header(r, "X-Test")), "body", str_or_null(body),
                      "body_len", (json_int_t)http_req_body_len(r));
        free(body);
        http_reply_header(r, "X-Reply", "yes");
        http_reply_json(r, 200, o);
    } else if (strcmp(path, "/read") == 0) {
        char buf[100];
        size_t total = 0, n;
        while ((n = http_req_body_read(r, buf, sizeof(buf))) > 0)
            total += n;
        char out[64];
        int len = snprintf(out, sizeof(out), "%zu %zu", total, http_req_body_len(r));
        http_reply(r, 200, "text/plain", out, (size_t)len);
    } else if (strcmp(path, "/error") == 0) {
        http_reply_error(r, 409, "conflict", "sandbox %s is busy", "sb-1");
    } else if (strcmp(path, "/error-extra") == 0) {
        http_reply_error_extra(r, 405, "method_not_allowed", json_pack("{s:s}", "allow", "GET"),
                               "use %s", "GET");
    } else if (strcmp(path, "/stream") == 0) {
        struct later *l = calloc(1, sizeof(*l));
        l->r = r;
        l->ev = evtimer_new(base, stream_more, l);
        http_stream_start(r, 200, "application/x-ndjson");
        http_stream_write(r, "one\n", 4);
        struct timeval tv = {0, 50000};
        evtimer_add(l->ev, &tv);
    } else if (strcmp(path, "/hang") == 0) {
        struct later *l = calloc(1, sizeof(*l));
        l->r = r;
        l->ev = evtimer_new(base, hang_closed, l);
        http_req_on_close(r, hang_on_close, l);
        http_stream_start(r, 200, "application/x-ndjson");
        http_stream_write(r, "x\n", 2);
    } else if (strcmp(path, "/conn-stats") == 0) {
        struct http_conn_stats st;
        http_server_conn_stats(server, &st);
        http_reply_json(r, 200,
                        json_pack("{s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I}", "open", st.open,
                                  "refused", (json_int_t)st.refused, "waiting", st.waiting,
                                  "body_bytes", (json_int_t)st.body_bytes, "evicted",
                                  (json_int_t)st.evicted, "header_timeouts",
                                  (json_int_t)st.header_timeouts, "wait_timeouts",
                                  (json_int_t)st.wait_timeouts, "paused", (json_int_t)st.paused));
    } else if (strcmp(path, "/bigreply") == 0) {
        size_t n = 1 << 20;
        char *big = malloc(n);
        memset(big, 'z', n);
        http_reply(r, 200, "application/octet-stream", big, n);
        free(big);
    } else if (strcmp(path, "/stop") == 0) {
        http_server_stop_accepting(server);
        http_reply(r, 200, "text/plain", "stopped", 7);
    } else {
        http_reply_error(r, 404, "not_found", "no route");
    }
}

static void keepalive(evutil_socket_t fd, short what, void *arg)
{
}

static void *loop_main(void *arg)
{
    event_base_dispatch(base);
    return NULL;
}

/* Runs base's loop in a thread (kept alive by a timer, which the caller frees after joining). */
static struct event *start_loop(pthread_t *loop)
{
    struct event *ka = event_new(base, -1, EV_PERSIST, keepalive, NULL);
    struct timeval sec = {1, 0};
    event_add(ka, &sec);
    pthread_create(loop, NULL, loop_main, NULL);
    return ka;
}

/* ---- the client side (main thread) ---- */

struct resp {
    int status;
    char head[4096];
    char *body;
    size_t body_len;
};

static int set_timeout(int fd, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static int connect_tcp(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        errno = e;
        return -1;
    }
    set_timeout(fd, 3000);
    return fd;
}

static int connect_unix(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    set_timeout(fd, 3000);
    return fd;
}

static int send_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_str(int fd, const char *s)
{
    return send_all(fd, s, strlen(s));
}

/* Reads exactly n bytes. */
static int read_n(int fd, char *buf, size_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, buf, n);
        if (r <= 0)
            return -1;
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Reads one line ending in \r\n into buf (without it). */
static int read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        if (read(fd, &c, 1) != 1)
            return -1;
        if (c == '\n')
            break;
        if (n + 1 < cap)
            buf[n++] = c;
    }
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    buf[n] = '\0';
    return 0;
}

/* The value of header name in r->head (case-insensitive), or "". */
static const char *header(const struct resp *r, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    size_t nl = strlen(name);
    for (const char *p = r->head; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            size_t len = strcspn(v, "\n");
            if (len >= cap)
                len = cap - 1;
            memcpy(out, v, len);
            out[len] = '\0';
            break;
        }
    }
    return out;
}

static void resp_free(struct resp *r)
{
    free(r->body);
    r->body = NULL;
}

/* Reads the status line and headers only. */
static int read_head(int fd, struct resp *r)
{
    memset(r, 0, sizeof(*r));
    char line[1024];
    if (read_line(fd, line, sizeof(line)) < 0 || sscanf(line, "HTTP/1.%*d %d", &r->status) != 1)
        return -1;
    size_t used = 0;
    for (;;) {
        if (read_line(fd, line, sizeof(line)) < 0)
            return -1;
        if (!line[0])
            return 0;
        used += (size_t)snprintf(r->head + used, sizeof(r->head) - used, "%s\n", line);
        if (used >= sizeof(r->head))
            return -1;
    }
}

/* Reads one chunk of a chunked body onto r->body. Returns its size, 0 at the end, -1. */
static long read_chunk(int fd, struct resp *r)
{
    char line[64];
    if (read_line(fd, line, sizeof(line)) < 0)
        return -1;
    long n = strtol(line, NULL, 16);
    if (n < 0)
        return -1;
    r->body = realloc(r->body, r->body_len + (size_t)n + 1);
    if (n > 0 && read_n(fd, r->body + r->body_len, (size_t)n) < 0)
        return -1;
    r->body_len += (size_t)n;
    r->body[r->body_len] = '\0';
    if (read_line(fd, line, sizeof(line)) < 0)
        return -1;
    return n;
}

/* Reads a whole response (Content-Length or chunked). */
static int read_resp(int fd, struct resp *r)
{
    if (read_head(fd, r) < 0)
        return -1;
    char v[64];
    r->body = calloc(1, 1);
    if (strcasecmp(header(r, "Transfer-Encoding", v, sizeof(v)), "chunked") == 0) {
        long n;
        while ((n = read_chunk(fd, r)) > 0)
            ;
        return n == 0 ? 0 : -1;
    }
    long len = atol(header(r, "Content-Length", v, sizeof(v)));
    r->body = realloc(r->body, (size_t)len + 1);
    if (len > 0 && read_n(fd, r->body, (size_t)len) < 0)
        return -1;
    r->body_len = (size_t)len;
    r->body[len] = '\0';
    return 0;
}

/* 1 if the server closes fd within timeout_ms (read returns 0 or a reset). */
static int closed_by_server(int fd, int timeout_ms)
{
    set_timeout(fd, timeout_ms);
    char c;
    ssize_t n = read(fd, &c, 1);
    set_timeout(fd, 3000);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* Sends one request on fd and reads the answer; its body as JSON into *obj if asked. */
static int roundtrip(int fd, const char *req, struct resp *r, json_t **obj)
{
    if (send_str(fd, req) < 0 || read_resp(fd, r) < 0)
        return -1;
    if (obj)
        *obj = json_loads(r->body, 0, NULL);
    return 0;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "(null)";
}

static int wait_for(atomic_int *v, int want, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 10) {
        if (atomic_load(v) >= want)
            return 1;
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    return atomic_load(v) >= want;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void http_checks(void)
{
    struct wr_err err = {0};
    int port = free_port();
    snprintf(sock_path, sizeof(sock_path), "%s/wr.sock", tmpdir);

    /* A stale socket file (its daemon died) is replaced. */
    int stale = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
    int made = stale >= 0 && bind(stale, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (stale >= 0)
        close(stale);
    ok(made, "a stale socket file at %s", sock_path);

    server = http_server_new(base, handler, NULL, MAX_BODY, &err);
    ok(server != NULL, "http_server_new");
    ok(port > 0 && http_server_listen_tcp(server, "127.0.0.1", port, &err) == 0,
       "listening on 127.0.0.1:%d (%s)", port, err.msg);
    ok(http_server_listen_unix(server, sock_path, &err) == 0,
       "listening on the Unix socket, replacing the stale one (%s)", err.msg);
    struct stat st;
    ok(stat(sock_path, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0666,
       "the Unix socket has mode 0666: who reaches it is up to its directory, keys to the door "
       "(%o)",
       (unsigned)(st.st_mode & 0777));

    /* A live socket is not taken over. */
    struct http_server *other = http_server_new(base, handler, NULL, MAX_BODY, &err);
    wr_err_clear(&err);
    ok(other && http_server_listen_unix(other, sock_path, &err) == -1 && err.code == EADDRINUSE,
       "a second server cannot take a live socket (%s)", err.msg);
    http_server_free(other);
    ok(stat(sock_path, &st) == 0 && S_ISSOCK(st.st_mode),
       "and freeing it leaves the live socket in place");

    pthread_t loop;
    struct event *ka = start_loop(&loop);

    struct resp r;
    json_t *o = NULL;

    /* Path, query, headers; keep-alive carries a second request. */
    int fd = connect_tcp(port);
    ok(fd >= 0, "client connects over TCP");
    int rc = roundtrip(fd,
                       "GET /echo/a%20b?a=1&b=hello%20world HTTP/1.1\r\nHost: x\r\n"
                       "X-Test: t-value\r\n\r\n",
                       &r, &o);
    char v[128];
    ok(rc == 0 && r.status == 200 && o, "GET /echo answers 200 with JSON");
    ok(strcmp(jstr(o, "method"), "GET") == 0, "method is GET");
    ok(strcmp(jstr(o, "path"), "/echo/a b") == 0, "the path is decoded, without the query (%s)",
       jstr(o, "path"));
    ok(strcmp(jstr(o, "a"), "1") == 0 && strcmp(jstr(o, "b"), "hello world") == 0,
       "query parameters are decoded (a=%s b=%s)", jstr(o, "a"), jstr(o, "b"));
    ok(json_is_null(json_object_get(o, "unknown")) &&
           json_integer_value(json_object_get(o, "bad")) == 0,
       "every parameter is allowed and the query is well-formed");
    ok(strcmp(jstr(o, "hdr"), "t-value") == 0, "a request header is read");
    ok(strcmp(header(&r, "X-Reply", v, sizeof(v)), "yes") == 0, "a reply header is sent");
    ok(strncmp(header(&r, "Content-Type", v, sizeof(v)), "application/json", 16) == 0,
       "http_reply_json's Content-Type is application/json");
    ok(r.body_len > 0 && r.body[r.body_len - 1] == '\n', "a JSON reply ends with a newline");
    json_decref(o);
    resp_free(&r);

    rc = roundtrip(fd, "GET /echo?a=1&zz=2&b=3 HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    ok(rc == 0 && r.status == 200 && strcmp(jstr(o, "unknown"), "zz") == 0,
       "keep-alive: a second request on the connection; the unknown parameter is zz (%s)",
       jstr(o, "unknown"));
    json_decref(o);
    resp_free(&r);

    rc = roundtrip(fd, "GET /echo?a=1&novalue HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    ok(rc == 0 && json_integer_value(json_object_get(o, "bad")) == 1 &&
           json_is_null(json_object_get(o, "a")) && json_is_null(json_object_get(o, "unknown")),
       "a malformed query: bad is 1 and the parameters are empty");
    json_decref(o);
    resp_free(&r);

    rc = roundtrip(fd, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    ok(rc == 0 && json_is_null(json_object_get(o, "a")) &&
           json_integer_value(json_object_get(o, "bad")) == 0 &&
           json_is_null(json_object_get(o, "hdr")),
       "no query: parameters and a missing header are NULL, not bad");
    json_decref(o);
    resp_free(&r);

    /* Bodies */
    rc = roundtrip(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", &r, &o);
    ok(rc == 0 && strcmp(jstr(o, "body"), "hello") == 0 &&
           json_integer_value(json_object_get(o, "body_len")) == 5,
       "a body is read whole (http_req_body_string leaves it in place)");
    json_decref(o);
    resp_free(&r);

    close(fd);

    fd = connect_tcp(port);
    static const char nul_req[] =
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhe\0lo";
    rc = send_all(fd, nul_req, sizeof(nul_req) - 1) == 0 ? read_resp(fd, &r) : -1;
    o = rc == 0 ? json_loads(r.body, 0, NULL) : NULL;
    ok(rc == 0 && json_is_null(json_object_get(o, "body")),
       "a body with a NUL byte: http_req_body_string is NULL");
    json_decref(o);
    resp_free(&r);

    char req[4096];
    char body[MAX_BODY + 1];
    memset(body, 'b', sizeof(body));
    int n = snprintf(req, sizeof(req),
                     "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", MAX_BODY);
    rc = send_all(fd, req, (size_t)n) == 0 && send_all(fd, body, MAX_BODY) == 0 ? read_resp(fd, &r)
                                                                                : -1;
    ok(rc == 0 && r.status == 200 && strcmp(r.body, "1024 0") == 0,
       "a body of exactly the limit is read in pieces, then nothing is left (%s)",
       r.body ? r.body : "");
    resp_free(&r);

    int before = atomic_load(&handled);
    n = snprintf(req, sizeof(req), "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",
                 MAX_BODY + 1);
    rc = send_all(fd, req, (size_t)n) == 0 ? read_resp(fd, &r) : -1;
    ok(rc == 0 && r.status == 413, "a declared body over the limit: 413 (%d)", r.status);
    ok(atomic_load(&handled) == before, "and the handler never ran");
    resp_free(&r);
    close(fd);

    fd = connect_tcp(port);
    n = snprintf(req, sizeof(req),
                 "POST /read HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n",
                 MAX_BODY + 1);
    /* One write of the whole request (~1.1 KB arrives at once on loopback): the server reads
     * all of it before it answers and closes, so no unread byte turns its close into a reset
     * that could wipe the 413 before we read it. */
    char whole[sizeof(req) + MAX_BODY + 16];
    memcpy(whole, req, (size_t)n);
    memcpy(whole + n, body, MAX_BODY + 1);
    memcpy(whole + n + MAX_BODY + 1, "\r\n0\r\n\r\n", 7);
    int sent = send_all(fd, whole, (size_t)n + MAX_BODY + 1 + 7) == 0;
    rc = read_resp(fd, &r);
    if (rc < 0)
        diag_errno = errno;
    ok(rc == 0 && r.status == 413 && atomic_load(&handled) == before,
       "a chunked body over the limit: 413, no handler (status %d, handler ran %d times, "
       "body %s, read %s)",
       r.status, atomic_load(&handled) - before, sent ? "sent" : "cut short",
       rc < 0 ? strerror(diag_errno) : "ok");
    resp_free(&r);
    close(fd);

    /* The error envelope */
    fd = connect_tcp(port);
    rc = roundtrip(fd, "GET /error HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    json_t *e = json_object_get(o, "error");
    ok(rc == 0 && r.status == 409 &&
           strncmp(header(&r, "Content-Type", v, sizeof(v)), "application/json", 16) == 0,
       "http_reply_error: status 409, JSON");
    ok(json_object_size(o) == 1 && json_object_size(e) == 2 &&
           strcmp(jstr(e, "code"), "conflict") == 0 &&
           strcmp(jstr(e, "message"), "sandbox sb-1 is busy") == 0,
       "the envelope is exactly {\"error\":{\"code\",\"message\"}} with the formatted message");
    json_decref(o);
    resp_free(&r);
    rc = roundtrip(fd, "GET /error-extra HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    e = json_object_get(o, "error");
    ok(rc == 0 && r.status == 405 && strcmp(jstr(e, "code"), "method_not_allowed") == 0 &&
           strcmp(jstr(e, "message"), "use GET") == 0 && strcmp(jstr(e, "allow"), "GET") == 0,
       "http_reply_error_extra merges its members into the error object");
    json_decref(o);
    resp_free(&r);

    /* A stream: chunked, in two writes 50 ms apart. */
    rc = roundtrip(fd, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", &r, NULL);
    ok(rc == 0 && r.status == 200 &&
           strcasecmp(header(&r, "Transfer-Encoding", v, sizeof(v)), "chunked") == 0,
       "a stream is a chunked 200");
    ok(strcmp(header(&r, "Content-Type", v, sizeof(v)), "application/x-ndjson") == 0,
       "with the stream's Content-Type");
    ok(r.body && strcmp(r.body, "one\ntwo\n") == 0, "its body is what was written, in order");
    resp_free(&r);
    rc = roundtrip(fd, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, NULL);
    ok(rc == 0 && r.status == 200, "the connection carries on after a stream");
    resp_free(&r);
    close(fd);

    /* The client leaves mid-stream: the close callback runs once; answering afterwards is
     * safe. */
    fd = connect_tcp(port);
    rc = send_str(fd, "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n") == 0 ? read_head(fd, &r) : -1;
    long first = rc == 0 ? read_chunk(fd, &r) : -1;
    ok(rc == 0 && r.status == 200 && first == 2 && strcmp(r.body, "x\n") == 0,
       "a hanging stream's first chunk arrives");
    resp_free(&r);
    close(fd);
    ok(wait_for(&closes, 1, 3000), "the close callback runs when the client disconnects");
    ok(wait_for(&late_done, 1, 3000), "writing to and ending the stream afterwards is safe");
    struct timespec pause = {0, 200000000L};
    nanosleep(&pause, NULL);
    ok(atomic_load(&closes) == 1, "the close callback ran once");

    /* A whole reply, then the client leaves: no close callback. */
    fd = connect_tcp(port);
    rc = roundtrip(fd, "GET /echo/onclose HTTP/1.1\r\nHost: x\r\n\r\n", &r, NULL);
    ok(rc == 0 && r.status == 200, "a request with a close callback is answered");
    resp_free(&r);
    close(fd);
    nanosleep(&pause, NULL);
    ok(atomic_load(&onclose_after_reply) == 0,
       "the close callback does not run once the reply has ended");

    /* TRACE reaches the handler, and its connection closes after the answer. */
    fd = connect_tcp(port);
    rc = roundtrip(fd, "TRACE /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    ok(rc == 0 && r.status == 200 && strcmp(jstr(o, "method"), "TRACE") == 0,
       "TRACE reaches the handler as \"TRACE\" (%d %s)", r.status, jstr(o, "method"));
    ok(strcasecmp(header(&r, "Connection", v, sizeof(v)), "close") == 0,
       "its answer says Connection: close");
    ok(closed_by_server(fd, 2000), "and the server closes the connection");
    json_decref(o);
    resp_free(&r);
    close(fd);

    /* The Unix socket */
    fd = connect_unix(sock_path);
    rc = fd >= 0 ? roundtrip(fd, "GET /echo?a=u HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o) : -1;
    ok(rc == 0 && r.status == 200 && strcmp(jstr(o, "a"), "u") == 0,
       "a request over the Unix socket");
    json_decref(o);
    resp_free(&r);
    if (fd >= 0)
        close(fd);

    /* stop_accepting: no new connections, existing ones carry on. */
    fd = connect_tcp(port);
    rc = roundtrip(fd, "GET /stop HTTP/1.1\r\nHost: x\r\n\r\n", &r, NULL);
    ok(rc == 0 && r.status == 200, "stop accepting");
    resp_free(&r);
    int nfd = connect_tcp(port);
    ok(nfd < 0, "a new TCP connection is refused afterwards");
    if (nfd >= 0)
        close(nfd);
    nfd = connect_unix(sock_path);
    ok(nfd < 0, "and a new Unix-socket connection too");
    if (nfd >= 0)
        close(nfd);
    rc = roundtrip(fd, "GET /echo?b=still HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    ok(rc == 0 && r.status == 200 && strcmp(jstr(o, "b"), "still") == 0,
       "an existing connection carries on");
    json_decref(o);
    resp_free(&r);
    close(fd);

    event_base_loopbreak(base);
    pthread_join(loop, NULL);
    event_free(ka);
    http_server_free(server);
}

/* ---- the connection layer: cap, header deadline, route limits, body budget ---- */

#define CONN_CAP 4
#define CONN_BUDGET 3000

static size_t route_limit(const char *method, const char *target, void *ctx)
{
    return strcmp(method, "PUT") == 0 && strncmp(target, "/echo/big", 9) == 0 ? 4000 : 1000;
}

static json_t *conn_stats(int port)
{
    int fd = connect_tcp(port);
    struct resp r;
    json_t *o = NULL;
    if (fd < 0 || roundtrip(fd, "GET /conn-stats HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o) < 0)
        o = NULL;
    if (fd >= 0) {
        resp_free(&r);
        close(fd);
    }
    return o ? o : json_object();
}

static long long stat_of(int port, const char *k)
{
    json_t *o = conn_stats(port);
    long long v = json_integer_value(json_object_get(o, k));
    json_decref(o);
    return v;
}

/* Whether fd has bytes (or its end) to read within ms. */
static int readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

static void conn_checks(void)
{
    struct wr_err err = {0};
    int port = free_port();
    server = http_server_new(base, handler, NULL, 8000, &err);
    http_server_set_idle_timeout(server, 4); /* also how long a body waits for room */
    http_server_set_limits(server, CONN_CAP, 2, CONN_BUDGET);
    http_server_set_body_limit(server, route_limit, NULL);
    ok(server && http_server_listen_tcp(server, "127.0.0.1", port, &err) == 0,
       "a server with a cap of %d connections, a 2 s header deadline, a %d-byte body budget",
       CONN_CAP, CONN_BUDGET);
    pthread_t loop;
    struct event *ka = start_loop(&loop);
    struct resp r;
    json_t *o = NULL;
    char v[64];

    /* An answer on a connection the server closes arrives whole. */
    int fd = connect_tcp(port);
    int rc =
        roundtrip(fd, "GET /bigreply HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &r, NULL);
    ok(rc == 0 && r.status == 200 && r.body_len == (1u << 20),
       "a 1 MiB answer with Connection: close arrives whole (%zu bytes)", r.body_len);
    ok(closed_by_server(fd, 2000), "and the connection closes after it");
    resp_free(&r);
    close(fd);

    /* Header deadline: a request line and half a header, then nothing. */
    fd = connect_tcp(port);
    send_str(fd, "GET /echo HTTP/1.1\r\nHost: x\r\nX-Te");
    ok(closed_by_server(fd, 6000), "headers that stop coming: closed at the header deadline");
    close(fd);
    ok(stat_of(port, "header_timeouts") == 1, "counted as a header timeout");
    /* Headers dribbled in, but complete within the deadline, are answered. */
    fd = connect_tcp(port);
    const char *parts[] = {"GET /echo?a=slow HTTP/1.1\r\n", "Host: x\r\n", "X-Test: 1\r\n", "\r\n"};
    for (int i = 0; i < 4; i++) {
        send_str(fd, parts[i]);
        struct timespec ts = {0, 150000000L};
        nanosleep(&ts, NULL);
    }
    rc = read_resp(fd, &r);
    o = rc == 0 ? json_loads(r.body, 0, NULL) : NULL;
    ok(rc == 0 && r.status == 200 && strcmp(jstr(o, "a"), "slow") == 0,
       "headers sent in four pieces within the deadline are answered");
    json_decref(o);
    resp_free(&r);
    /* The deadline is per request: an idle kept-alive connection is not cut by it. */
    ok(!readable(fd, 2500), "a kept-alive connection idle past the header deadline stays open");
    rc = roundtrip(fd, "GET /echo?a=again HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    ok(rc == 0 && r.status == 200 && strcmp(jstr(o, "a"), "again") == 0,
       "and answers its next request");
    json_decref(o);
    resp_free(&r);
    close(fd);

    /* Route limits, from the headers. */
    int before = atomic_load(&handled);
    char body[4001];
    memset(body, 'b', sizeof(body) - 1);
    body[sizeof(body) - 1] = '\0';
    fd = connect_tcp(port);
    send_str(fd, "PUT /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n");
    rc = read_resp(fd, &r);
    o = rc == 0 ? json_loads(r.body, 0, NULL) : NULL;
    ok(rc == 0 && r.status == 413 &&
           strcmp(jstr(json_object_get(o, "error"), "code"), "payload_too_large") == 0,
       "a Content-Length over the route's limit (2000 > 1000): a JSON 413 before any body (%d %s)",
       r.status, r.body ? r.body : "");
    json_decref(o);
    resp_free(&r);
    ok(send_all(fd, body, 2000) == 0, "the body sent anyway is taken (dropped) without a reset");
    ok(closed_by_server(fd, 5000), "then the connection closes");
    close(fd);
    ok(atomic_load(&handled) == before, "no handler saw the refused request");
    /* A request line longer than a header block may be: the API's 400, not evhttp's HTML. */
    static char longreq[20000];
    int ll = snprintf(longreq, sizeof(longreq), "GET /echo?a=");
    memset(longreq + ll, 'q', 17000);
    snprintf(longreq + ll + 17000, sizeof(longreq) - (size_t)ll - 17000,
             " HTTP/1.1\r\nHost: x\r\n\r\n");
    fd = connect_tcp(port);
    rc = roundtrip(fd, longreq, &r, &o);
    ok(rc == 0 && r.status == 400 &&
           strcmp(jstr(json_object_get(o, "error"), "code"), "invalid_request") == 0 &&
           strcasecmp(header(&r, "Content-Type", v, sizeof(v)), "application/json") == 0,
       "a 17 KB request line: a JSON 400 (%d %s)", r.status, r.body ? r.body : "");
    json_decref(o);
    resp_free(&r);
    close(fd);
    ok(atomic_load(&handled) == before, "and no handler saw it either");
    ok(stat_of(port, "refused") == 2, "both counted as refused");
    char req[5000];
    snprintf(req, sizeof(req),
             "PUT /echo/big HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n%.2000s", body);
    fd = connect_tcp(port);
    rc = roundtrip(fd, req, &r, &o);
    ok(rc == 0 && r.status == 200 && json_integer_value(json_object_get(o, "body_len")) == 2000,
       "the same body to a route with a larger limit is taken");
    json_decref(o);
    resp_free(&r);
    close(fd);
    fd = connect_tcp(port);
    send_str(fd, "PUT /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; i++)
        send_str(fd, "1f4\r\n"), send_all(fd, body, 500), send_str(fd, "\r\n");
    send_str(fd, "0\r\n\r\n");
    rc = read_head(fd, &r);
    ok(rc == 0 && r.status == 413, "a chunked body is cut at the route's limit: 413 (%d)",
       r.status);
    close(fd);

    /* The body budget: a body that does not fit waits, unread, for one that does. */
    int a = connect_tcp(port);
    send_str(a, "PUT /echo/big HTTP/1.1\r\nHost: x\r\nContent-Length: 2500\r\n\r\n");
    send_all(a, body, 100);
    /* (a body that came whole with its headers is in memory already, and is let in) */
    const char *head_b = "PUT /echo/big HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
    int b = connect_tcp(port);
    send_str(b, head_b);
    send_all(b, body, 100);
    ok(!readable(b, 500), "a 1000-byte body waits while 2500 of the %d-byte budget are taken",
       CONN_BUDGET);
    o = conn_stats(port);
    ok(json_integer_value(json_object_get(o, "waiting")) == 1 &&
           json_integer_value(json_object_get(o, "body_bytes")) == 2500,
       "one connection waits; 2500 bytes are admitted");
    json_decref(o);
    send_all(b, body, 900); /* stays in the socket until b's turn */
    send_all(a, body, 2400);
    rc = read_resp(a, &r);
    ok(rc == 0 && r.status == 200, "the first body completes and is answered");
    resp_free(&r);
    rc = read_resp(b, &r);
    o = rc == 0 ? json_loads(r.body, 0, NULL) : NULL;
    ok(rc == 0 && r.status == 200 && json_integer_value(json_object_get(o, "body_len")) == 1000,
       "then the waiting one is let in and answered whole");
    json_decref(o);
    resp_free(&r);
    close(a);
    close(b);
    /* ... and one that waits longer than the idle timeout is closed. */
    a = connect_tcp(port);
    send_str(a, "PUT /echo/big HTTP/1.1\r\nHost: x\r\nContent-Length: 2500\r\n\r\n");
    send_all(a, body, 100);
    b = connect_tcp(port);
    send_str(b, head_b);
    send_all(b, body, 100);
    ok(closed_by_server(b, 10000),
       "a body that waits past the idle timeout: its connection closes");
    close(a);
    ok(stat_of(port, "wait_timeouts") == 1, "counted as a wait timeout");
    o = conn_stats(port);
    ok(json_integer_value(json_object_get(o, "body_bytes")) == 0 &&
           json_integer_value(json_object_get(o, "waiting")) == 0,
       "and nothing of the budget is left taken once they are gone");
    json_decref(o);
    /* Expect: 100-continue (curl sends it for bodies over 1 MiB): the 100 comes at once, the
     * body then waits for room like any other. */
    a = connect_tcp(port);
    send_str(a, "PUT /echo/big HTTP/1.1\r\nHost: x\r\nContent-Length: 2500\r\n\r\n");
    send_all(a, body, 100);
    b = connect_tcp(port);
    send_str(b, "PUT /echo/big HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                "Content-Length: 1000\r\n\r\n");
    rc = read_head(b, &r);
    ok(rc == 0 && r.status == 100, "Expect: 100-continue is answered 100 (%d)", r.status);
    send_all(b, body, 1000);
    ok(!readable(b, 500), "the body sent after it waits while the budget is taken");
    send_all(a, body, 2400);
    rc = read_resp(a, &r);
    resp_free(&r);
    rc = read_resp(b, &r);
    o = rc == 0 ? json_loads(r.body, 0, NULL) : NULL;
    ok(rc == 0 && r.status == 200 && json_integer_value(json_object_get(o, "body_len")) == 1000,
       "and is taken whole once there is room");
    json_decref(o);
    resp_free(&r);
    close(a);
    close(b);

    /* The cap: the connection idle the longest makes room for a new one. */
    int idle[CONN_CAP - 1];
    for (int i = 0; i < CONN_CAP - 1; i++) {
        idle[i] = connect_tcp(port);
        rc = roundtrip(idle[i], "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r, NULL);
        resp_free(&r);
    }
    fd = connect_tcp(port);
    rc = roundtrip(fd, "GET /echo?a=new HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o);
    ok(rc == 0 && r.status == 200 && strcmp(jstr(o, "a"), "new") == 0,
       "at the cap of %d, a new connection is answered", CONN_CAP);
    json_decref(o);
    resp_free(&r);
    ok(closed_by_server(idle[0], 2000), "the connection idle the longest was closed for it");
    ok(!readable(idle[CONN_CAP - 2], 200), "the most recent idle one was not");
    close(fd);
    for (int i = 0; i < CONN_CAP - 1; i++)
        close(idle[i]);
    ok(stat_of(port, "evicted") >= 1, "counted as evicted");
    /* With no connection idle (all of them sending headers slowly), a new one waits in the
     * backlog until the header deadline closes them, then is answered. */
    int slow[CONN_CAP];
    for (int i = 0; i < CONN_CAP; i++) {
        slow[i] = connect_tcp(port);
        send_str(slow[i], "GET /echo HTTP/1.1\r\nHost: x\r\n");
    }
    fd = connect_tcp(port);
    set_timeout(fd, 8000);
    rc = fd >= 0 ? roundtrip(fd, "GET /echo?a=late HTTP/1.1\r\nHost: x\r\n\r\n", &r, &o) : -1;
    ok(rc == 0 && r.status == 200 && strcmp(jstr(o, "a"), "late") == 0,
       "with %d slow connections at the cap, a new one is answered once they are closed", CONN_CAP);
    json_decref(o);
    resp_free(&r);
    int all_closed = 1;
    for (int i = 0; i < CONN_CAP; i++) {
        all_closed &= closed_by_server(slow[i], 100);
        close(slow[i]);
    }
    ok(all_closed, "the slow connections were all closed by the deadline");
    if (fd >= 0)
        close(fd);
    ok(stat_of(port, "paused") >= 1, "accepting paused at the cap meanwhile");
    ok(stat_of(port, "open") == 1, "only the connection asking is open at the end");

    event_base_loopbreak(base);
    pthread_join(loop, NULL);
    event_free(ka);
    http_server_free(server);
    server = NULL;
}

static void router_checks(void)
{
    static const struct route routes[] = {
        {"GET", "/v1/sandboxes", 1, "limit,state"},
        {"POST", "/v1/sandboxes", 2, NULL},
        {"GET", "/v1/sandboxes/{id}", 3, NULL},
        {"DELETE", "/v1/sandboxes/{id}", 4, "force"},
        {"POST", "/v1/sandboxes/{id}/exec", 5, NULL},
        {"GET", "/v1/sandboxes/{id}/commands/{cmd}", 6, NULL},
        {"DELETE", "/v1/sandboxes/{id}/commands/{cmd}", 7, NULL},
    };
    size_t n = sizeof(routes) / sizeof(routes[0]);
    struct route_match m;

    ok(route_find(routes, n, "GET", "/v1/sandboxes", &m) == ROUTE_OK && m.handler == 1 &&
           m.nparams == 0 && m.query && strcmp(m.query, "limit,state") == 0,
       "a fixed route matches, with its query parameters");
    ok(route_find(routes, n, "POST", "/v1/sandboxes", &m) == ROUTE_OK && m.handler == 2 &&
           m.query == NULL,
       "the same path with another method is another route");
    ok(route_find(routes, n, "DELETE", "/v1/sandboxes/sb-abc", &m) == ROUTE_OK && m.handler == 4 &&
           m.nparams == 1 && strcmp(m.params[0], "sb-abc") == 0 && strcmp(m.query, "force") == 0,
       "a parameter is captured");
    ok(route_find(routes, n, "DELETE", "/v1/sandboxes/sb-1/commands/c-2", &m) == ROUTE_OK &&
           m.handler == 7 && m.nparams == 2 && strcmp(m.params[0], "sb-1") == 0 &&
           strcmp(m.params[1], "c-2") == 0,
       "two parameters, in order");

    ok(route_find(routes, n, "PUT", "/v1/sandboxes/sb-1", &m) == ROUTE_BAD_METHOD &&
           strcmp(m.allow, "GET, DELETE") == 0,
       "a known path with another method: BAD_METHOD, Allow \"GET, DELETE\" (%s)", m.allow);
    ok(route_find(routes, n, "GET", "/v1/sandboxes/sb-1/exec", &m) == ROUTE_BAD_METHOD &&
           strcmp(m.allow, "POST") == 0,
       "GET on exec: Allow \"POST\" (%s)", m.allow);
    ok(route_find(routes, n, "get", "/v1/sandboxes", &m) == ROUTE_BAD_METHOD,
       "methods are case-sensitive");

    ok(route_find(routes, n, "GET", "/v1/nothing", &m) == ROUTE_NOT_FOUND, "an unknown path");
    ok(route_find(routes, n, "GET", "/v1/sandboxes/", &m) == ROUTE_NOT_FOUND,
       "a trailing slash: an empty parameter never matches");
    ok(route_find(routes, n, "POST", "/v1/sandboxes//exec", &m) == ROUTE_NOT_FOUND,
       "an empty segment never matches a parameter");
    ok(route_find(routes, n, "GET", "/v1/sandboxes/a/b", &m) == ROUTE_NOT_FOUND,
       "an extra segment is not swallowed by a parameter");
    ok(route_find(routes, n, "GET", "", &m) == ROUTE_NOT_FOUND &&
           route_find(routes, n, "GET", "/", &m) == ROUTE_NOT_FOUND &&
           route_find(routes, n, "GET", "v1/sandboxes", &m) == ROUTE_NOT_FOUND,
       "empty, root and relative paths");
    ok(route_find(routes, n, "GET", "/v1/sandboxesX", &m) == ROUTE_NOT_FOUND &&
           route_find(routes, n, "GET", "/v1/sandboxes/x/commandsX/y", &m) == ROUTE_NOT_FOUND,
       "a fixed segment must match whole");

    /* "longer than ROUTE_MAX_PARAM_LEN - 1 never matches": 128 bytes do not, 127 do */
    char path[ROUTE_MAX_PARAM_LEN + 32];
    char seg[ROUTE_MAX_PARAM_LEN + 1];
    memset(seg, 'a', ROUTE_MAX_PARAM_LEN);
    seg[ROUTE_MAX_PARAM_LEN] = '\0';
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", seg);
    ok(route_find(routes, n, "GET", path, &m) == ROUTE_NOT_FOUND,
       "a %d-byte segment never matches a parameter", ROUTE_MAX_PARAM_LEN);
    seg[ROUTE_MAX_PARAM_LEN - 1] = '\0';
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", seg);
    ok(route_find(routes, n, "GET", path, &m) == ROUTE_OK && strcmp(m.params[0], seg) == 0,
       "a %d-byte segment does", ROUTE_MAX_PARAM_LEN - 1);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp");
        return tap_done();
    }
    evthread_use_pthreads();
    base = event_base_new();
    http_checks();
    conn_checks();
    event_base_free(base);
    unlink(sock_path);
    rmdir(tmpdir);
    router_checks();
    return tap_done();
}
