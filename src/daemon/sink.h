/*
 * How the service answers whoever asked. The service (src/daemon/) knows
 * nothing of HTTP: each operation gets a sink and answers through it exactly
 * once, either whole (reply or fail) or as a stream (begin, then writes or
 * records, then end or fail). The HTTP side (src/api/) implements it; a test
 * can implement it too. After the answer is finished the sink is gone and
 * the service must not touch it again.
 */
#ifndef WR_DAEMON_SINK_H
#define WR_DAEMON_SINK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

enum sink_status {
    SINK_OK,      /* the operation's result */
    SINK_CREATED, /* the result is something new (a sandbox, a background command) */
};

struct sink;
struct evbuffer;

struct sink_ops {
    /** A whole answer: obj (taken). Finishes the sink. */
    void (*reply)(struct sink *s, enum sink_status st, json_t *obj);
    /**
     * A failure. Before begin: the whole answer. In a stream: its last record (a record
     * stream) or a body cut short (a byte stream). Finishes the sink.
     */
    void (*fail)(struct sink *s, const struct wr_err *err);
    /** Starts a stream of raw bytes of content_type (NULL: a stream of JSON records). */
    void (*begin)(struct sink *s, const char *content_type);
    /**
     * Optional: starts a byte stream that will be exactly length bytes, so the caller can be
     * told its size up front (a stream ended short must then end with fail, never end).
     * NULL: begin is used.
     */
    void (*begin_sized)(struct sink *s, const char *content_type, uint64_t length);
    /** Sends bytes of a byte stream. */
    void (*write)(struct sink *s, const void *data, size_t len);
    /**
     * Optional: sends all of buf's bytes of a byte stream, moving its memory on rather than
     * copying it; buf is left empty. NULL: write is used.
     */
    void (*write_buffer)(struct sink *s, struct evbuffer *buf);
    /** Sends one record (obj taken) of a record stream. */
    void (*record)(struct sink *s, json_t *obj);
    /** Ends a stream. Finishes the sink. */
    void (*end)(struct sink *s);
    /**
     * Asks to be told if the caller goes away before the answer is finished. cb runs at most
     * once (at once, inside this call, if the caller is already gone); the sink stays valid and
     * must still be finished (cb may finish it).
     */
    void (*on_cancel)(struct sink *s, void (*cb)(void *arg), void *arg);
    /**
     * Bytes of a stream written but not yet taken by the caller (optional: NULL means the
     * caller takes everything at once). The service stops producing while this is high.
     */
    size_t (*backlog)(struct sink *s);
    /**
     * Calls cb once, when the caller has taken everything written so far (optional, with
     * backlog). Forgotten when the sink is finished.
     */
    void (*on_drain)(struct sink *s, void (*cb)(void *arg), void *arg);
    /** Bytes of the caller's input (an upload) not yet read. */
    size_t (*input_len)(struct sink *s);
    /** Moves up to n input bytes into buf; returns how many. */
    size_t (*input_read)(struct sink *s, void *buf, size_t n);
    /**
     * Optional: moves up to n input bytes onto the end of dst (a libevent buffer) without
     * copying where it can; returns how many. NULL: the service uses input_read.
     */
    size_t (*input_move)(struct sink *s, struct evbuffer *dst, size_t n);
};

struct principal;

struct sink {
    const struct sink_ops *ops;
    const struct principal *who; /* who asked (daemon/keys.h); NULL: the daemon itself */
};

static inline void sink_reply(struct sink *s, enum sink_status st, json_t *obj)
{
    s->ops->reply(s, st, obj);
}

static inline void sink_fail(struct sink *s, const struct wr_err *err)
{
    s->ops->fail(s, err);
}

static inline void sink_begin(struct sink *s, const char *content_type)
{
    s->ops->begin(s, content_type);
}

static inline void sink_begin_sized(struct sink *s, const char *content_type, uint64_t length)
{
    if (s->ops->begin_sized)
        s->ops->begin_sized(s, content_type, length);
    else
        s->ops->begin(s, content_type);
}

static inline void sink_write(struct sink *s, const void *data, size_t len)
{
    s->ops->write(s, data, len);
}

/** Sends buf's bytes (a libevent buffer) of a byte stream, leaving buf empty. */
void sink_write_buffer(struct sink *s, struct evbuffer *buf);

static inline void sink_record(struct sink *s, json_t *obj)
{
    s->ops->record(s, obj);
}

static inline void sink_end(struct sink *s)
{
    s->ops->end(s);
}

static inline void sink_on_cancel(struct sink *s, void (*cb)(void *arg), void *arg)
{
    s->ops->on_cancel(s, cb, arg);
}

static inline size_t sink_backlog(struct sink *s)
{
    return s->ops->backlog ? s->ops->backlog(s) : 0;
}

static inline void sink_on_drain(struct sink *s, void (*cb)(void *arg), void *arg)
{
    if (s->ops->on_drain)
        s->ops->on_drain(s, cb, arg);
}

/** Fails s with a new error of kind (a shorthand for wr_err_kind + sink_fail). */
void sink_failf(struct sink *s, enum wr_kind kind, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
