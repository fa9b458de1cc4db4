/*
 * The connection layer under evhttp (internal to src/http/). Every accepted connection's socket
 * bufferevent comes from here (evhttp_set_bevcb), and what arrives on it is looked at before
 * evhttp parses it, so the layer knows where each request's header block starts and ends and
 * can do what evhttp 2.1 has no hook for:
 *
 *   - a connection cap: at the cap the connection idle the longest is closed for the new one;
 *     with none idle, the listeners pause until one closes (clients wait in the backlog);
 *   - a header deadline: a request's header block must arrive within header_timeout seconds of
 *     its first byte (a slowloris client is closed); on TLS, the first one within that long of
 *     the connection (the handshake counts);
 *   - per-route body limits, from the headers: a Content-Length over the route's limit is
 *     answered 413 (the API's JSON error) before any of the body is read, and the connection's
 *     body limit is set to the route's before evhttp reads the headers, so evhttp cuts a
 *     chunked body there (with its own 413);
 *   - a memory budget for request bodies: a body is admitted only when its size (its
 *     Content-Length, or the largest body for a chunked one) fits in what the bodies being
 *     read or answered hold; otherwise its connection waits, unread, in line.
 */
#ifndef WR_HTTP_CONN_H
#define WR_HTTP_CONN_H

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"

struct conns;

/** The route's body limit for a request line's method and raw target (path and query). */
typedef size_t (*conn_body_limit_fn)(const char *method, const char *target, void *ctx);

/** Pauses (on = 0) or resumes (on = 1) accepting; called when the cap is reached or left. */
typedef void (*conn_accept_fn)(int on, void *ctx);

struct conn_limits {
    int max_conns;        /* open connections at most */
    int header_timeout_s; /* a request's headers must all arrive this soon after its first byte */
    size_t max_header;    /* bytes of a header block; longer is evhttp's to refuse */
    size_t max_body;      /* the largest body any route takes (a chunked body reserves this) */
    size_t body_budget;   /* bytes of request bodies admitted at once */
    int wait_s;           /* a body waits this long for room at most (then: closed) */
};

struct conns *conns_new(struct event_base *base, const struct conn_limits *lim,
                        conn_accept_fn accept_fn, void *accept_ctx);
void conns_free(struct conns *cs);

void conns_set_limits(struct conns *cs, const struct conn_limits *lim);
void conns_set_body_limit(struct conns *cs, conn_body_limit_fn fn, void *ctx);

/** evhttp's bufferevent factory (evhttp_set_bevcb): a socket bufferevent the layer watches. */
struct bufferevent *conns_new_bev(struct event_base *base, void *cs);

/** The TLS context of conns_new_tls_bev (not owned: it must outlive cs's connections). */
void conns_set_tls(struct conns *cs, SSL_CTX *ctx);

/**
 * The same for a TLS listener: an OpenSSL bufferevent accepting a handshake with conns_set_tls's
 * context. The layer sees the decrypted bytes; the handshake and the first header block share
 * the header deadline. NULL without a context.
 */
struct bufferevent *conns_new_tls_bev(struct event_base *base, void *cs);

struct evhttp_connection;

/**
 * A request on evcon reached its handler. The layer owns evcon's close callback: gone(arg) is
 * called if the connection ends before conns_request_end. Returns 0 if evcon is not one of the
 * layer's (its bufferevent was not made here); the caller then watches the close itself.
 */
int conns_request_begin(struct conns *cs, struct evhttp_connection *evcon, void (*gone)(void *arg),
                        void *arg);

/** The request on evcon was answered (or given up). */
void conns_request_end(struct conns *cs, struct evhttp_connection *evcon);

/**
 * The request on evcon switched protocols (a WebSocket): the layer stops looking at the bytes
 * (no header deadline, no body accounting; it is never taken for idle and evicted) and calls
 * gone(arg) when the connection closes, whoever closes it.
 */
void conns_upgrade(struct conns *cs, struct evhttp_connection *evcon, void (*gone)(void *arg),
                   void *arg);

/** The layer's counters (struct http_conn_stats, http.h). */
void conns_stats(struct conns *cs, struct http_conn_stats *out);

#endif
