/*
 * The HTTP server, as the rest of the daemon sees it. This directory is the
 * only place that knows the HTTP library (libevent's evhttp); handlers get an
 * opaque request, read its parts, and answer exactly once: a whole reply, or
 * a stream (start, writes, end).
 */
#ifndef WR_HTTP_H
#define WR_HTTP_H

#include <event2/event.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

struct http_server;
struct http_req;
struct evbuffer;

typedef void (*http_handler)(struct http_req *req, void *ctx);

/** Creates a server on base; every request goes to handler. max_body bounds request bodies. */
struct http_server *http_server_new(struct event_base *base, http_handler handler, void *ctx,
                                    size_t max_body, struct wr_err *err);

/**
 * Closes a connection that has nothing to read between requests, or whose client takes no bytes
 * of an answer, for secs seconds. A request being answered is not idle: evhttp stops reading
 * while a handler runs and has nothing to write until the answer, and a streamed answer (a
 * streaming exec, a download) has no idle timeout until it ends.
 */
void http_server_set_idle_timeout(struct http_server *s, int secs);

/**
 * The connection layer's limits (0 leaves one as it is): at most max_conns connections (at the
 * cap the one idle the longest is closed for a new one; with none idle, new ones wait in the
 * backlog); a request's header block must arrive within header_timeout_s of its first byte;
 * request bodies being read or answered hold body_budget bytes at most (their Content-Length,
 * or the largest body for a chunked one), and a body that does not fit waits, unread, until it
 * does (for the idle timeout at most, then its connection is closed).
 */
void http_server_set_limits(struct http_server *s, int max_conns, int header_timeout_s,
                            size_t body_budget);

/** A route's body limit, from a request line's method and raw target (path and query). A
 * Content-Length over it is answered 413 (JSON, code payload_too_large) before the body is read;
 * a chunked body is cut there (evhttp's own 413). */
typedef size_t (*http_body_limit_fn)(const char *method, const char *target, void *ctx);
void http_server_set_body_limit(struct http_server *s, http_body_limit_fn fn, void *ctx);

struct http_conn_stats {
    int open;                           /* connections open now */
    int waiting;                        /* connections whose body waits for room */
    size_t body_bytes;                  /* of the body budget, in use */
    unsigned long long evicted;         /* idle connections closed to make room */
    unsigned long long header_timeouts; /* closed at the header deadline */
    unsigned long long wait_timeouts;   /* bodies that waited for room past the idle timeout */
    unsigned long long refused;         /* answered 413 or 400 by the layer (no handler) */
    unsigned long long paused;          /* times accepting paused at the cap */
    unsigned long long accept_errors;   /* accept() failed (out of fds): paused for a moment */
};
void http_server_conn_stats(struct http_server *s, struct http_conn_stats *out);

/**
 * Makes the TCP listeners opened after this speak TLS (1.2 or later; the Unix socket stays
 * plain) with the certificate chain in cert_file and its key in key_file (PEM). Returns 0, or -1
 * with err naming the file that is missing, unreadable or wrong, or a key that is not the
 * certificate's.
 */
int http_server_set_tls(struct http_server *s, const char *cert_file, const char *key_file,
                        struct wr_err *err);

/** Listens on host:port (TCP; TLS after http_server_set_tls). */
int http_server_listen_tcp(struct http_server *s, const char *host, int port, struct wr_err *err);

/** Listens on a Unix socket at path (replacing a stale one), mode 0666 (callers check who). */
int http_server_listen_unix(struct http_server *s, const char *path, struct wr_err *err);

/** Stops accepting new connections (existing ones carry on). */
void http_server_stop_accepting(struct http_server *s);

/** Frees the server and closes every connection. */
void http_server_free(struct http_server *s);

/** "GET", "POST", ... ("OTHER" for methods the server does not know). */
const char *http_req_method(struct http_req *r);

/** The decoded path, without the query string. Never NULL. */
const char *http_req_path(struct http_req *r);

/** A query parameter's decoded value, or NULL if absent. */
const char *http_req_query(struct http_req *r, const char *name);

/**
 * Returns the name of the first query parameter not in allowed (comma-separated; NULL allows
 * none), or NULL if every parameter is allowed. The name is valid while r is.
 */
const char *http_req_query_unknown(struct http_req *r, const char *allowed);

/**
 * Returns 1 if the path or query holds an encoded NUL byte (%00). Decoded strings end at a
 * NUL, so such a request would be read as something it does not say.
 */
int http_req_has_nul(struct http_req *r);

/** Returns 1 if the query string was malformed (the parameters are then empty). */
int http_req_query_bad(struct http_req *r);

/** Attaches the handler's data to a request: free_fn (if any) frees it with the request. */
void http_req_set_data(struct http_req *r, void *data, void (*free_fn)(void *));

/** What http_req_set_data attached, or NULL. */
void *http_req_data(struct http_req *r);

/** Where a request came from. */
struct http_peer {
    int unix_socket;     /* 1: the Unix socket; 0: TCP */
    int tls;             /* 1: TCP with TLS */
    long uid;            /* the Unix socket's peer (SO_PEERCRED); -1 if unknown */
    char addr[64];       /* TCP: the client's address, without the port */
    char local_addr[64]; /* TCP: the daemon's address the client connected to */
    int local_port;
};

/** Fills out for r's connection. -1 if the client has gone (or is neither Unix nor IP). */
int http_req_peer(struct http_req *r, struct http_peer *out);

/** Called once per request when its answer starts, with its status (audit, metrics). */
typedef void (*http_reply_hook)(struct http_req *r, int status, void *ctx);
void http_server_set_reply_hook(struct http_server *s, http_reply_hook fn, void *ctx);

/** A request header's value, or NULL. */
const char *http_req_header(struct http_req *r, const char *name);

/** Bytes of request body not yet consumed. */
size_t http_req_body_len(struct http_req *r);

/** Moves up to n body bytes into buf; returns how many. */
size_t http_req_body_read(struct http_req *r, void *buf, size_t n);

struct evbuffer;

/** Moves up to n body bytes onto the end of dst, handing over whole pieces of memory rather
 * than copying where it can; returns how many. */
size_t http_req_body_move(struct http_req *r, struct evbuffer *dst, size_t n);

/** The whole body as a NUL-terminated string (caller frees); NULL if it has a NUL byte. */
char *http_req_body_string(struct http_req *r);

/** Adds a response header; call before replying. */
void http_reply_header(struct http_req *r, const char *name, const char *value);

/** Sends a whole reply. Frees r. */
void http_reply(struct http_req *r, int status, const char *content_type, const void *body,
                size_t len);

/** Sends obj as JSON (takes the reference). Frees r. */
void http_reply_json(struct http_req *r, int status, json_t *obj);

/** Sends the error envelope {"error":{"code","message"}}. Frees r. */
void http_reply_error(struct http_req *r, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** Like http_reply_error with extra members merged into the error object (takes extra). */
void http_reply_error_extra(struct http_req *r, int status, const char *code, json_t *extra,
                            const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/** Starts a chunked reply. */
void http_stream_start(struct http_req *r, int status, const char *content_type);

/** Like http_stream_start for a body of exactly length bytes: sent with a Content-Length, not
 * in chunks (cheaper for a client to read). One that ends short must be aborted. */
void http_stream_start_sized(struct http_req *r, int status, const char *content_type,
                             uint64_t length);

/** Sends one chunk of a stream (nothing happens if the client has gone). */
void http_stream_write(struct http_req *r, const void *data, size_t len);

/** Like http_stream_write with all of buf, whose memory moves onto the connection (no copy);
 * buf is left empty either way. */
void http_stream_write_buffer(struct http_req *r, struct evbuffer *buf);

/** Bytes of the reply queued for the client and not yet sent (0 once the client is gone). */
size_t http_stream_backlog(struct http_req *r);

/**
 * Calls cb once, when everything queued for the client has been sent. Forgotten when the
 * reply ends; never called if the client goes away (http_req_on_close reports that).
 */
void http_stream_on_drain(struct http_req *r, void (*cb)(void *arg), void *arg);

/** Ends a stream. Frees r. */
void http_stream_end(struct http_req *r);

/**
 * Ends a stream that failed: the connection is closed without the last chunk, so the client
 * can tell the body is incomplete. Frees r.
 */
void http_stream_abort(struct http_req *r);

/**
 * Asks to be told if the client goes away before the reply ends. cb runs at most once (at
 * once, if the client is already gone); r stays valid (it must still be answered, which then
 * just frees it).
 */
void http_req_on_close(struct http_req *r, void (*cb)(void *arg), void *arg);

/* ---- switching protocols (a WebSocket, http/wsconn.h) ---- */

struct http_upgraded;
struct bufferevent;

/**
 * Answers r with 101 Switching Protocols and the given header lines (each "Name: value", NULL
 * ends the list), and takes its connection away from evhttp: from here on its bufferevent
 * (http_upgraded_bev) is the caller's to read and write, with no timeouts set. r is freed.
 * gone(arg) is called once if the connection is closed by anything but http_upgraded_close
 * (the server being freed); the caller must still call http_upgraded_close then. Returns NULL
 * (r answered 500 and freed) if the connection cannot be taken over.
 */
struct http_upgraded *http_req_upgrade(struct http_req *r, const char *const *headers,
                                       void (*gone)(void *arg), void *arg);

/** The upgraded connection's bufferevent (NULL once gone). */
struct bufferevent *http_upgraded_bev(struct http_upgraded *u);

/** Closes the upgraded connection (what is queued and unsent is dropped) and frees u. */
void http_upgraded_close(struct http_upgraded *u);

#endif
