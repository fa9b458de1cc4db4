/*
 * evhttp behind the interface in http.h. Each incoming request gets a small
 * wrapper that lives until its reply ends; a client that disconnects early
 * is reported through the connection's close callback, and evhttp keeps the
 * detached request alive until we answer it (answering then only frees it).
 */
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/evbuf.h"
#include "common/log.h"
#include "common/util.h"
#include "http/conn.h"
#include "http/tls.h"

#define MAX_LISTENERS 4

/* Idle connections close after this long unless told otherwise (serve --idle-timeout). */
#define HTTP_DEFAULT_IDLE_S 60

/* How often a client awaiting a whole answer is checked for having left (on_probe). */
#define PROBE_MS 1000

/* A listener that ran out of fds pauses, then tries again, instead of spinning on accept. */
#define ACCEPT_PAUSE_MS 200

/* Defaults of the connection layer (serve sets its own from the command line). */
#define HTTP_DEFAULT_MAX_CONNS 4096
#define HTTP_DEFAULT_HEADER_S 10
#define HTTP_MAX_HEADER (16 * 1024)
#define HTTP_DEFAULT_BODY_BUDGET ((size_t)256 << 20)

struct http_server {
    struct event_base *base;
    struct evhttp *http;  /* plain listeners */
    struct evhttp *https; /* TLS listeners (evhttp 2.1 has one bufferevent factory per evhttp) */
    SSL_CTX *tls;         /* http_server_set_tls's */
    size_t max_body;
    http_handler handler;
    void *ctx;
    struct evhttp_bound_socket *bound[MAX_LISTENERS];
    struct evhttp *bound_http[MAX_LISTENERS]; /* the evhttp each listener belongs to */
    int nbound;
    struct event *resume; /* re-enables paused listeners */
    uint64_t accept_errors;
    char unix_path[108];
    int idle_s;
    struct conns *conns;
    struct conn_limits lim;
    int error_paused; /* out of fds: accepting again after ACCEPT_PAUSE_MS */
    int cap_paused;   /* at the connection cap: accepting again after a close */
    http_reply_hook reply_hook;
    void *reply_hook_ctx;
    struct http_server *next; /* in servers */
};

struct http_req {
    struct http_server *server;
    struct evhttp_request *req;
    struct evhttp_connection *evcon;
    char *path;
    struct evkeyvalq query;
    int query_ok;
    int query_bad;
    int has_nul; /* "%00" somewhere in the path or query */
    int gone;
    int tracked; /* the connection layer watches the connection's close for us */
    void (*close_cb)(void *);
    void *close_arg;
    void (*drain_cb)(void *); /* one-shot: the connection's output was all sent */
    void *drain_arg;
    struct event *probe; /* looks for a client that left while a whole answer is awaited */
    int streaming;       /* the reply has started: evhttp watches the connection itself */
    void *data;          /* the handler's (http_req_set_data) */
    void (*data_free)(void *);
};

static const char *method_name(enum evhttp_cmd_type t)
{
    switch (t) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PATCH: return "PATCH";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_TRACE: return "TRACE";
    case EVHTTP_REQ_CONNECT: return "CONNECT";
    default: return "OTHER";
    }
}

static void set_accepting(struct http_server *s)
{
    int on = !s->error_paused && !s->cap_paused;
    for (int i = 0; i < s->nbound; i++) {
        struct evconnlistener *l = evhttp_bound_socket_get_listener(s->bound[i]);
        if (on)
            evconnlistener_enable(l);
        else
            evconnlistener_disable(l);
    }
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    struct http_server *s = arg;
    s->error_paused = 0;
    set_accepting(s);
}

/* The connection layer is at its cap (on = 0) or below it again (on = 1). */
static void on_cap(int on, void *arg)
{
    struct http_server *s = arg;
    s->cap_paused = !on;
    set_accepting(s);
}

/* Every live server, to find one from its evhttp: a listener's error callback gets the
 * listener's user data, which evhttp_bind_listener set to the evhttp (its own accept callback
 * needs it), not to our server. Servers are few and accept errors rare: a list will do. A lock,
 * because each server's loop may run on a thread of its own. */
static struct http_server *servers;
static pthread_mutex_t servers_lock = PTHREAD_MUTEX_INITIALIZER;

static void servers_add(struct http_server *s)
{
    pthread_mutex_lock(&servers_lock);
    s->next = servers;
    servers = s;
    pthread_mutex_unlock(&servers_lock);
}

static void servers_remove(struct http_server *s)
{
    pthread_mutex_lock(&servers_lock);
    for (struct http_server **p = &servers; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&servers_lock);
}

/* The server h (an evhttp) belongs to, or NULL. */
static struct http_server *servers_find(const struct evhttp *h)
{
    pthread_mutex_lock(&servers_lock);
    struct http_server *s = servers;
    while (s && s->http != h && s->https != h)
        s = s->next;
    pthread_mutex_unlock(&servers_lock);
    return s;
}

/* accept failed (out of fds, most likely): stop accepting for a moment rather than retrying at
 * once, forever, with a log line each time. Clients wait in the backlog meanwhile. arg is the
 * listener's evhttp (see servers). */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    int e = EVUTIL_SOCKET_ERROR();
    struct http_server *s = servers_find(arg);
    if (!s) { /* not one of ours: at least never spin on it */
        evconnlistener_disable(l);
        log_warn(NULL, "http.accept_failed", "error=\"%s\" listener=unknown", strerror(e));
        return;
    }
    if (s->accept_errors++ % 1000 == 0)
        log_warn(NULL, "http.accept_failed", "error=\"%s\" times=%llu", strerror(e),
                 (unsigned long long)s->accept_errors);
    s->error_paused = 1;
    set_accepting(s);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    evtimer_add(s->resume, &tv);
}

/* Takes b (of h) into the server's list of listeners. */
static void add_bound(struct http_server *s, struct evhttp *h, struct evhttp_bound_socket *b)
{
    evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(b), on_accept_error);
    s->bound_http[s->nbound] = h;
    s->bound[s->nbound++] = b;
    set_accepting(s);
}

static void on_gone(void *arg)
{
    struct http_req *r = arg;
    r->gone = 1;
    r->evcon = NULL;
    void (*cb)(void *) = r->close_cb;
    r->close_cb = NULL;
    if (cb)
        cb(r->close_arg);
}

static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    on_gone(arg);
}

static void req_free(struct http_req *r)
{
    if (r->data_free)
        r->data_free(r->data);
    if (r->probe)
        event_free(r->probe);
    if (r->evcon && r->tracked)
        conns_request_end(r->server->conns, r->evcon);
    else if (r->evcon)
        evhttp_connection_set_closecb(r->evcon, NULL, NULL);
    if (r->query_ok)
        evhttp_clear_headers(&r->query);
    free(r->path);
    free(r);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct http_server *s = arg;
    struct http_req *r = xcalloc(1, sizeof(*r));
    r->server = s;
    r->req = req;
    r->evcon = evhttp_request_get_connection(req);
    const char *raw = evhttp_request_get_uri(req);
    r->has_nul = raw && strcasestr(raw, "%00") != NULL;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *raw_path = uri ? evhttp_uri_get_path(uri) : NULL;
    r->path = raw_path ? evhttp_uridecode(raw_path, 0, NULL) : NULL;
    if (!r->path)
        r->path = xstrdup("");
    TAILQ_INIT(&r->query);
    const char *q = uri ? evhttp_uri_get_query(uri) : NULL;
    if (q) {
        if (evhttp_parse_query_str(q, &r->query) == 0)
            r->query_ok = 1;
        else {
            evhttp_clear_headers(&r->query);
            r->query_bad = 1;
        }
    }
    if (r->evcon) {
        r->tracked = conns_request_begin(s->conns, r->evcon, on_gone, r);
        if (!r->tracked) /* a connection the layer did not make: watched here */
            evhttp_connection_set_closecb(r->evcon, on_conn_close, r);
    }
    /* evhttp does not read a TRACE or CONNECT request's body: on a kept-alive connection it
     * would be parsed as the next request. Such a connection ends with its answer. */
    enum evhttp_cmd_type t = evhttp_request_get_command(req);
    if (t == EVHTTP_REQ_TRACE || t == EVHTTP_REQ_CONNECT)
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
    s->handler(r, s->ctx);
}

/* An evhttp set up the way every listener's is; its connections come from bevcb. */
static struct evhttp *evhttp_make(struct http_server *s,
                                  struct bufferevent *(*bevcb)(struct event_base *, void *))
{
    struct evhttp *h = evhttp_new(s->base);
    if (!h)
        return NULL;
    evhttp_set_max_body_size(h, (ev_ssize_t)s->max_body);
    evhttp_set_max_headers_size(h, HTTP_MAX_HEADER);
    evhttp_set_bevcb(h, bevcb, s->conns);
    /* Every method evhttp knows reaches the router, so an undeclared one gets a JSON 405
     * naming the allowed methods, not evhttp's own HTML 501. */
    evhttp_set_allowed_methods(h, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                      EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD | EVHTTP_REQ_PATCH |
                                      EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT);
    evhttp_set_timeout(h, s->idle_s);
    evhttp_set_gencb(h, on_request, s);
    return h;
}

struct http_server *http_server_new(struct event_base *base, http_handler handler, void *ctx,
                                    size_t max_body, struct wr_err *err)
{
    struct http_server *s = xcalloc(1, sizeof(*s));
    s->base = base;
    s->handler = handler;
    s->ctx = ctx;
    s->max_body = max_body;
    s->idle_s = HTTP_DEFAULT_IDLE_S;
    s->lim = (struct conn_limits){.max_conns = HTTP_DEFAULT_MAX_CONNS,
                                  .header_timeout_s = HTTP_DEFAULT_HEADER_S,
                                  .max_header = HTTP_MAX_HEADER,
                                  .max_body = max_body,
                                  .body_budget = HTTP_DEFAULT_BODY_BUDGET,
                                  .wait_s = HTTP_DEFAULT_IDLE_S};
    s->conns = conns_new(base, &s->lim, on_cap, s);
    s->http = evhttp_make(s, conns_new_bev);
    if (!s->http) {
        conns_free(s->conns);
        free(s);
        wr_err_set(err, ENOMEM, "cannot create the HTTP server");
        return NULL;
    }
    s->resume = evtimer_new(base, on_resume, s);
    servers_add(s);
    return s;
}

int http_server_set_tls(struct http_server *s, const char *cert_file, const char *key_file,
                        struct wr_err *err)
{
    if (s->tls)
        return wr_err_set(err, EINVAL, "TLS is set already");
    SSL_CTX *ctx = tls_server_ctx(cert_file, key_file, err);
    if (!ctx)
        return -1;
    s->https = evhttp_make(s, conns_new_tls_bev);
    if (!s->https) {
        SSL_CTX_free(ctx);
        return wr_err_set(err, ENOMEM, "cannot create the HTTPS server");
    }
    s->tls = ctx;
    conns_set_tls(s->conns, ctx);
    return 0;
}

void http_server_set_idle_timeout(struct http_server *s, int secs)
{
    s->idle_s = secs;
    evhttp_set_timeout(s->http, secs);
    if (s->https)
        evhttp_set_timeout(s->https, secs);
    if (s->conns) {
        s->lim.wait_s = secs;
        conns_set_limits(s->conns, &s->lim);
    }
}

void http_server_set_limits(struct http_server *s, int max_conns, int header_timeout_s,
                            size_t body_budget)
{
    if (max_conns > 0)
        s->lim.max_conns = max_conns;
    if (header_timeout_s > 0)
        s->lim.header_timeout_s = header_timeout_s;
    if (body_budget > 0)
        s->lim.body_budget = body_budget;
    conns_set_limits(s->conns, &s->lim);
}

void http_server_set_body_limit(struct http_server *s, http_body_limit_fn fn, void *ctx)
{
    conns_set_body_limit(s->conns, fn, ctx);
}

void http_server_conn_stats(struct http_server *s, struct http_conn_stats *out)
{
    conns_stats(s->conns, out);
    out->accept_errors = s->accept_errors;
}

int http_server_listen_tcp(struct http_server *s, const char *host, int port, struct wr_err *err)
{
    if (s->nbound >= MAX_LISTENERS)
        return wr_err_set(err, EINVAL, "too many listeners");
    struct evhttp *h = s->https ? s->https : s->http;
    struct evhttp_bound_socket *b = evhttp_bind_socket_with_handle(h, host, (uint16_t)port);
    if (!b)
        return wr_err_sys(err, errno, "listen on %s:%d", host, port);
    add_bound(s, h, b);
    return 0;
}

int http_server_listen_unix(struct http_server *s, const char *path, struct wr_err *err)
{
    if (s->nbound >= MAX_LISTENERS)
        return wr_err_set(err, EINVAL, "too many listeners");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return wr_err_set(err, ENAMETOOLONG, "socket path too long: %s", path);
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return wr_err_sys(err, errno, "socket");
    /* A stale socket from a daemon that died is replaced; a live one is an error. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        close(fd);
        return wr_err_set(err, EADDRINUSE, "another daemon is already listening on %s", path);
    }
    close(fd);
    unlink(path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return wr_err_sys(err, errno, "socket");
    /* Anyone who can reach it may connect: who may do what is the API's to say (root is the
     * admin, everyone else needs a key). The default path is in a root-only directory. */
    mode_t old = umask(0111);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (rc < 0 || listen(fd, 128) < 0) {
        int e = errno;
        close(fd);
        return wr_err_sys(err, e, "listen on %s", path);
    }
    struct evconnlistener *l = evconnlistener_new(
        s->base, NULL, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
    if (!l) {
        close(fd);
        return wr_err_set(err, ENOMEM, "listen on %s", path);
    }
    struct evhttp_bound_socket *b = evhttp_bind_listener(s->http, l);
    if (!b) {
        evconnlistener_free(l);
        return wr_err_set(err, ENOMEM, "listen on %s", path);
    }
    add_bound(s, s->http, b);
    snprintf(s->unix_path, sizeof(s->unix_path), "%s", path);
    return 0;
}

void http_server_stop_accepting(struct http_server *s)
{
    if (s->resume)
        evtimer_del(s->resume);
    for (int i = 0; i < s->nbound; i++)
        evhttp_del_accept_socket(s->bound_http[i], s->bound[i]);
    s->nbound = 0;
    if (s->unix_path[0]) {
        unlink(s->unix_path);
        s->unix_path[0] = '\0';
    }
}

void http_server_free(struct http_server *s)
{
    if (!s)
        return;
    servers_remove(s);
    http_server_stop_accepting(s);
    if (s->resume)
        event_free(s->resume);
    evhttp_free(s->http);
    if (s->https)
        evhttp_free(s->https);
    conns_free(s->conns);
    if (s->tls)
        SSL_CTX_free(s->tls);
    free(s);
}

const char *http_req_method(struct http_req *r)
{
    return method_name(evhttp_request_get_command(r->req));
}

const char *http_req_path(struct http_req *r)
{
    return r->path;
}

const char *http_req_query(struct http_req *r, const char *name)
{
    return r->query_ok ? evhttp_find_header(&r->query, name) : NULL;
}

const char *http_req_query_unknown(struct http_req *r, const char *allowed)
{
    if (!r->query_ok)
        return NULL;
    struct evkeyval *kv;
    TAILQ_FOREACH(kv, &r->query, next)
    {
        size_t n = strlen(kv->key);
        const char *p = allowed;
        int found = 0;
        while (p && *p && !found) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            found = len == n && memcmp(p, kv->key, n) == 0;
            p = comma ? comma + 1 : NULL;
        }
        if (!found)
            return kv->key;
    }
    return NULL;
}

int http_req_has_nul(struct http_req *r)
{
    return r->has_nul;
}

int http_req_query_bad(struct http_req *r)
{
    return r->query_bad;
}

const char *http_req_header(struct http_req *r, const char *name)
{
    return evhttp_find_header(evhttp_request_get_input_headers(r->req), name);
}

size_t http_req_body_len(struct http_req *r)
{
    return evbuffer_get_length(evhttp_request_get_input_buffer(r->req));
}

size_t http_req_body_read(struct http_req *r, void *buf, size_t n)
{
    int got = evbuffer_remove(evhttp_request_get_input_buffer(r->req), buf, n);
    return got > 0 ? (size_t)got : 0;
}

size_t http_req_body_move(struct http_req *r, struct evbuffer *dst, size_t n)
{
    int got = evbuffer_remove_buffer(evhttp_request_get_input_buffer(r->req), dst, n);
    return got > 0 ? (size_t)got : 0;
}

char *http_req_body_string(struct http_req *r)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    size_t n = evbuffer_get_length(in);
    char *s = xmalloc(n + 1);
    if (n)
        evbuffer_copyout(in, s, n);
    s[n] = '\0';
    if (memchr(s, '\0', n)) {
        free(s);
        return NULL;
    }
    return s;
}

void http_server_set_reply_hook(struct http_server *s, http_reply_hook fn, void *ctx)
{
    s->reply_hook = fn;
    s->reply_hook_ctx = ctx;
}

void http_req_set_data(struct http_req *r, void *data, void (*free_fn)(void *))
{
    r->data = data;
    r->data_free = free_fn;
}

void *http_req_data(struct http_req *r)
{
    return r->data;
}

/* An address as text, without its port; "" for anything but IPv4 and IPv6. */
static int addr_text(const struct sockaddr_storage *ss, char *out, size_t len, int *port)
{
    const void *a = NULL;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)ss;
        a = &in->sin_addr;
        *port = ntohs(in->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)ss;
        a = &in6->sin6_addr;
        *port = ntohs(in6->sin6_port);
    }
    out[0] = '\0';
    return a && inet_ntop(ss->ss_family, a, out, (socklen_t)len) ? 0 : -1;
}

int http_req_peer(struct http_req *r, struct http_peer *out)
{
    memset(out, 0, sizeof(*out));
    out->uid = -1;
    struct bufferevent *bev = r->evcon ? evhttp_connection_get_bufferevent(r->evcon) : NULL;
    int fd = bev ? bufferevent_getfd(bev) : -1;
    struct sockaddr_storage local, peer;
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&local, &llen) < 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &plen) < 0)
        return -1;
    out->tls = bufferevent_openssl_get_ssl(bev) != NULL;
    if (local.ss_family == AF_UNIX) {
        struct ucred cred;
        socklen_t clen = sizeof(cred);
        out->unix_socket = 1;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0)
            out->uid = (long)cred.uid;
        return 0;
    }
    int port = 0;
    if (addr_text(&peer, out->addr, sizeof(out->addr), &port) < 0 ||
        addr_text(&local, out->local_addr, sizeof(out->local_addr), &out->local_port) < 0)
        return -1;
    return 0;
}

void http_reply_header(struct http_req *r, const char *name, const char *value)
{
    evhttp_add_header(evhttp_request_get_output_headers(r->req), name, value);
}

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
    }
}

/* An entity tag for a body: its length and its 64-bit FNV-1a, quoted. Cheap, and a body that
 * changes gets another tag but for a 2^-64 chance. */
static void etag_of(const void *body, size_t len, char out[48])
{
    uint64_t h = 14695981039346656037ull;
    const unsigned char *p = body;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    snprintf(out, 48, "\"%zx-%016llx\"", len, (unsigned long long)h);
}

/* Returns 1 if an If-None-Match list (`"a", W/"b"` or `*`) holds tag. */
static int etag_listed(const char *list, const char *tag)
{
    size_t n = strlen(tag);
    for (const char *p = list; *p;) {
        p += strspn(p, " \t,");
        if (*p == '*')
            return 1;
        if (strncmp(p, "W/", 2) == 0)
            p += 2;
        size_t l = strcspn(p, ",");
        while (l && (p[l - 1] == ' ' || p[l - 1] == '\t'))
            l--;
        if (l == n && memcmp(p, tag, n) == 0)
            return 1;
        p += strcspn(p, ",");
    }
    return 0;
}

void http_reply(struct http_req *r, int status, const char *content_type, const void *body,
                size_t len)
{
    /* A successful GET carries an ETag; one that sends it back (If-None-Match) gets 304 and no
     * body, so a page polling a route pays for a hash, not a transfer. */
    const char *method = http_req_method(r);
    if (status == 200 && (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0)) {
        char tag[48];
        etag_of(body, len, tag);
        http_reply_header(r, "ETag", tag);
        const char *inm = http_req_header(r, "If-None-Match");
        if (inm && etag_listed(inm, tag)) {
            status = 304;
            len = 0;
        }
    }
    if (content_type)
        http_reply_header(r, "Content-Type", content_type);
    /* A HEAD is answered as its GET, without the body but with the body's length (evhttp sends
     * none for a HEAD by itself). */
    int head = strcmp(method, "HEAD") == 0;
    if (head && status != 304 && status >= 200 && status != 204) {
        char v[24];
        snprintf(v, sizeof(v), "%zu", len);
        http_reply_header(r, "Content-Length", v);
    }
    if (r->server->reply_hook)
        r->server->reply_hook(r, status, r->server->reply_hook_ctx);
    struct evbuffer *buf = evbuffer_new();
    if (len && !head)
        evbuffer_add(buf, body, len);
    evhttp_send_reply(r->req, status, reason_phrase(status), buf);
    evbuffer_free(buf);
    req_free(r);
}

void http_reply_json(struct http_req *r, int status, json_t *obj)
{
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s) {
        static const char fallback[] =
            "{\"error\":{\"code\":\"internal\",\"message\":\"cannot encode the response\"}}";
        http_reply(r, 500, "application/json", fallback, sizeof(fallback) - 1);
        return;
    }
    size_t n = strlen(s);
    s = xrealloc(s, n + 2);
    s[n] = '\n';
    http_reply(r, status, "application/json", s, n + 1);
    free(s);
}

static void reply_error_v(struct http_req *r, int status, const char *code, json_t *extra,
                          const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    json_t *e = json_pack("{s:s, s:s}", "code", code, "message", msg);
    if (!e) /* message not valid UTF-8: it came from somewhere untrusted */
        e = json_pack("{s:s, s:s}", "code", code, "message", "(message not valid UTF-8)");
    if (extra) {
        json_object_update(e, extra);
        json_decref(extra);
    }
    http_reply_json(r, status, json_pack("{s:o}", "error", e));
}

void http_reply_error(struct http_req *r, int status, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(r, status, code, NULL, fmt, ap);
    va_end(ap);
}

void http_reply_error_extra(struct http_req *r, int status, const char *code, json_t *extra,
                            const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(r, status, code, extra, fmt, ap);
    va_end(ap);
}

void http_stream_start(struct http_req *r, int status, const char *content_type)
{
    http_reply_header(r, "Content-Type", content_type);
    http_reply_header(r, "Cache-Control", "no-store");
    /* A stream may be quiet for as long as its command runs: no idle timeout while it lasts
     * (evhttp's would cut it between two chunks). */
    if (r->evcon)
        bufferevent_set_timeouts(evhttp_connection_get_bufferevent(r->evcon), NULL, NULL);
    r->streaming = 1;
    if (r->probe) /* evhttp watches a streamed answer's connection itself */
        event_del(r->probe);
    if (r->server->reply_hook)
        r->server->reply_hook(r, status, r->server->reply_hook_ctx);
    evhttp_send_reply_start(r->req, status, reason_phrase(status));
}

void http_stream_start_sized(struct http_req *r, int status, const char *content_type,
                             uint64_t length)
{
    char v[24];
    snprintf(v, sizeof(v), "%" PRIu64, length);
    http_reply_header(r, "Content-Length", v); /* evhttp then sends the body as it is */
    http_stream_start(r, status, content_type);
}

/* evhttp calls this when the connection's output buffer has been written out. It is set
 * again with every chunk, and replaced by evhttp's own when the reply ends, so r is alive. */
static void on_chunk_sent(struct evhttp_connection *evcon, void *arg)
{
    struct http_req *r = arg;
    void (*cb)(void *) = r->drain_cb;
    r->drain_cb = NULL;
    if (cb)
        cb(r->drain_arg);
}

void http_stream_write(struct http_req *r, const void *data, size_t len)
{
    if (r->gone || len == 0)
        return;
    /* copied in heap-sized pieces (common/evbuf.h), not one big chain */
    struct evbuffer *buf = evbuffer_new();
    evbuf_add_pieces(buf, data, len);
    http_stream_write_buffer(r, buf);
    evbuffer_free(buf);
}

void http_stream_write_buffer(struct http_req *r, struct evbuffer *buf)
{
    if (!r->gone && evbuffer_get_length(buf))
        evhttp_send_reply_chunk_with_cb(r->req, buf, on_chunk_sent, r);
    evbuffer_drain(buf, evbuffer_get_length(buf)); /* what evhttp did not take (a HEAD) */
}

size_t http_stream_backlog(struct http_req *r)
{
    if (r->gone || !r->evcon)
        return 0;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(r->evcon);
    return bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

void http_stream_on_drain(struct http_req *r, void (*cb)(void *arg), void *arg)
{
    r->drain_cb = cb;
    r->drain_arg = arg;
}

void http_stream_abort(struct http_req *r)
{
    struct evhttp_connection *evcon = r->gone ? NULL : r->evcon;
    if (!evcon) { /* the client is gone already: answering just frees the request */
        http_stream_end(r);
        return;
    }
    req_free(r);
    /* What is queued (the status, the bytes so far) goes out first if the socket takes it now,
     * so the client sees which answer was cut short; on TLS it is dropped with the rest. */
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    evutil_socket_t fd = bev && !bufferevent_openssl_get_ssl(bev) ? bufferevent_getfd(bev) : -1;
    if (fd >= 0)
        evbuffer_write(bufferevent_get_output(bev), fd);
    /* Closing mid-stream (no last chunk, or short of the Content-Length): the client sees its
     * answer was cut short. */
    evhttp_connection_free(evcon);
}

void http_stream_end(struct http_req *r)
{
    if (r->evcon) { /* the connection may be kept alive: idle again from now on */
        struct timeval tv = {r->server->idle_s, 0};
        bufferevent_set_timeouts(evhttp_connection_get_bufferevent(r->evcon), &tv, &tv);
    }
    evhttp_send_reply_end(r->req);
    req_free(r);
}

/*
 * While a handler works on a whole answer, evhttp does not read the connection, so it would
 * not notice a client that left until the answer is written (for a long exec: at its timeout).
 * This looks every PROBE_MS instead: an orderly close (EOF) or a reset on the socket means the
 * client is gone. Bytes waiting there (a pipelined request) mean it is still there.
 */
static void on_probe(evutil_socket_t unused, short what, void *arg)
{
    struct http_req *r = arg;
    if (!r->close_cb || !r->evcon)
        return;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(r->evcon);
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    char c;
    ssize_t n = fd >= 0 ? recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) : 1;
    if (n > 0 && bufferevent_openssl_get_ssl(bev)) {
        /* On TLS a leaving client's close_notify sits before its end of stream: ask the kernel
         * whether the client has shut its side instead. */
        struct pollfd pfd = {.fd = fd, .events = POLLRDHUP};
        if (poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            n = 0;
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        void (*cb)(void *) = r->close_cb;
        r->close_cb = NULL;
        cb(r->close_arg); /* may answer, and so free r: nothing after this */
        return;
    }
    struct timeval tv = {PROBE_MS / 1000, (PROBE_MS % 1000) * 1000};
    evtimer_add(r->probe, &tv);
}

void http_req_on_close(struct http_req *r, void (*cb)(void *arg), void *arg)
{
    if (r->gone) { /* already gone: the caller hears it now */
        cb(arg);
        return;
    }
    r->close_cb = cb;
    r->close_arg = arg;
    if (!r->probe && r->evcon && !r->streaming) {
        r->probe = evtimer_new(r->server->base, on_probe, r);
        struct timeval tv = {PROBE_MS / 1000, (PROBE_MS % 1000) * 1000};
        evtimer_add(r->probe, &tv);
    }
}

/* ------------------------------------------------------------------ switching protocols */

struct http_upgraded {
    struct evhttp_connection *evcon; /* NULL once closed */
    void (*gone)(void *);
    void *gone_arg;
};

static void on_upgraded_gone(void *arg)
{
    struct http_upgraded *u = arg;
    u->evcon = NULL;
    void (*cb)(void *) = u->gone;
    u->gone = NULL;
    if (cb)
        cb(u->gone_arg);
}

struct http_upgraded *http_req_upgrade(struct http_req *r, const char *const *headers,
                                       void (*gone)(void *arg), void *arg)
{
    struct evhttp_connection *evcon = r->gone ? NULL : r->evcon;
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    if (!bev || !r->tracked) {
        http_reply_error(r, 500, "internal", "this connection cannot switch protocols");
        return NULL;
    }
    if (r->server->reply_hook)
        r->server->reply_hook(r, 101, r->server->reply_hook_ctx);
    struct http_upgraded *u = xcalloc(1, sizeof(*u));
    u->evcon = evcon;
    u->gone = gone;
    u->gone_arg = arg;
    /* evhttp keeps the request, unanswered, until the connection is freed; it reads and writes
     * nothing of it any more: its callbacks are replaced by the caller's. */
    conns_upgrade(r->server->conns, evcon, on_upgraded_gone, u);
    r->evcon = NULL;
    r->tracked = 0;
    req_free(r);
    bufferevent_set_timeouts(bev, NULL, NULL);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    struct evbuffer *out = bufferevent_get_output(bev);
    evbuffer_add_printf(out, "HTTP/1.1 101 Switching Protocols\r\n");
    for (const char *const *h = headers; h && *h; h++)
        evbuffer_add_printf(out, "%s\r\n", *h);
    evbuffer_add(out, "\r\n", 2);
    return u;
}

struct bufferevent *http_upgraded_bev(struct http_upgraded *u)
{
    return u->evcon ? evhttp_connection_get_bufferevent(u->evcon) : NULL;
}

void http_upgraded_close(struct http_upgraded *u)
{
    struct evhttp_connection *evcon = u->evcon;
    u->gone = NULL;
    if (evcon)
        evhttp_connection_free(evcon); /* the layer's close callback clears u->evcon */
    free(u);
}
