/*
 * A WebSocket connection, server side (RFC 6455), over a connection http_req_upgrade took from
 * evhttp. Frames are read with common/ws.h's reader (client frames must be masked; frames over
 * WSCONN_MAX_FRAME and text messages over WSCONN_MAX_TEXT end the connection with 1009; every
 * other violation with 1002 or 1007). Pings are answered; the server pings an idle peer every
 * WSCONN_PING_S seconds and closes (1001) one that sent nothing for WSCONN_DEAD_S. The owner
 * bounds what it sends (wsconn_backlog) and may stop reading (wsconn_pause); the peer is not
 * read either while more than 2 MiB wait to go to it (so pings it does not read the pongs of,
 * for one, cannot pile up).
 */
#ifndef WR_HTTP_WSCONN_H
#define WR_HTTP_WSCONN_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"

#define WSCONN_MAX_FRAME ((size_t)1 << 20)
#define WSCONN_MAX_TEXT ((size_t)64 << 10)
#define WSCONN_PING_S 20
#define WSCONN_DEAD_S 60

struct wsconn;

struct wsconn_ops {
    /** Binary data as it arrives (a message may come in several parts). */
    void (*binary)(void *arg, const uint8_t *data, size_t len);
    /** A whole text message (valid UTF-8, not NUL-terminated). */
    void (*text)(void *arg, const char *data, size_t len);
    /** What was sent has all been written out (after wsconn_on_drain). */
    void (*drained)(void *arg);
    /** The connection is over (the peer closed it, broke the protocol, went silent, or the
     * server is going away). The wsconn is freed after this returns: never touch it again. */
    void (*closed)(void *arg);
};

/**
 * Computes Sec-WebSocket-Accept for a request's Sec-WebSocket-Key into out[29]. Returns 0, or
 * -1 if the key is not the base64 of 16 bytes.
 */
int wsconn_accept_key(const char *key, char *out);

/**
 * Upgrades r (a checked WebSocket handshake) and starts the connection; protocol, if not NULL,
 * is the Sec-WebSocket-Protocol to answer. Returns it, or NULL (r was answered and freed).
 */
struct wsconn *wsconn_accept(struct event_base *base, struct http_req *r, const char *accept,
                             const char *protocol, const struct wsconn_ops *ops, void *arg);

/** Sends one binary (WS_OP_BINARY) or text (WS_OP_TEXT) message. */
void wsconn_send(struct wsconn *c, int opcode, const void *data, size_t len);

/** Bytes queued for the peer and not yet written. */
size_t wsconn_backlog(struct wsconn *c);

/** Asks for ops->drained once the queue is empty. */
void wsconn_on_drain(struct wsconn *c);

/** Stops (1) or resumes (0) reading the peer: what it sends waits in the socket. */
void wsconn_pause(struct wsconn *c, int on);

/**
 * Sends a close frame with code and reason, lets what is queued go out, and closes the TCP
 * connection once the peer's close frame answers it (or the peer hangs up, or a few seconds
 * pass): the closing handshake of RFC 6455 5.5.1, so browsers see a clean close. What the peer
 * sends meanwhile is read and dropped. ops->closed is not called; c must not be used again.
 */
void wsconn_close(struct wsconn *c, int code, const char *reason);

#endif
