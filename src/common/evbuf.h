/*
 * Libevent buffers in heap-sized chains, for the daemon's side (the agent does not link
 * libevent). One chain for a big payload is a block over glibc's mmap threshold: mapped afresh
 * and faulted in at every use. Chains of EVBUF_BLOCK bytes (64 KiB with libevent's chain
 * header) come from the heap and are reused. Both the agent's channel (daemon/agentconn.c) and
 * an HTTP stream (http/http.c) build their buffers this way.
 */
#ifndef WR_COMMON_EVBUF_H
#define WR_COMMON_EVBUF_H

#include <event2/buffer.h>
#include <stddef.h>
#include <stdlib.h>

/** A chain's data: with libevent's chain header, a 64 KiB heap block. */
#define EVBUF_BLOCK ((size_t)65536 - 64)

/** Copies len bytes at p onto buf in chains of at most EVBUF_BLOCK. Aborts when out of memory,
 * as xmalloc does. */
static inline void evbuf_add_pieces(struct evbuffer *buf, const void *p, size_t len)
{
    const unsigned char *b = p;
    for (size_t off = 0; off < len; off += EVBUF_BLOCK)
        if (evbuffer_add(buf, b + off, len - off < EVBUF_BLOCK ? len - off : EVBUF_BLOCK) < 0)
            abort();
}

#endif
