/*
 * The WebSocket wire format (RFC 6455), without any I/O: a frame header builder and an
 * incremental reader that turns bytes into messages, checking everything a hostile peer could
 * get wrong. Shared by the daemon (src/http/wsconn.c, the server side) and the CLI
 * (src/cli/shell.c, a client).
 *
 * What the reader refuses, with the close code to answer (RFC 6455 section 7.4.1):
 *   1002 protocol error: reserved bits set (no extensions are negotiated), an unknown opcode,
 *        a client frame without a mask (or a server frame with one), a fragmented or too long
 *        (> 125 bytes) control frame, a continuation without a message begun or a new message
 *        while one is unfinished, a 64-bit length with the top bit set, a close frame of 1 byte
 *        or with a code that may not be sent;
 *   1007 a text message (or a close reason) that is not valid UTF-8;
 *   1009 a frame over max_frame bytes, or a text message over max_text bytes.
 * Binary data is handed on as it arrives (a binary message is a byte stream here: nothing of
 * it is buffered); text messages are buffered whole (up to max_text) and handed on at their end.
 */
#ifndef WR_COMMON_WS_H
#define WR_COMMON_WS_H

#include <stddef.h>
#include <stdint.h>

enum ws_opcode {
    WS_OP_CONT = 0x0,
    WS_OP_TEXT = 0x1,
    WS_OP_BINARY = 0x2,
    WS_OP_CLOSE = 0x8,
    WS_OP_PING = 0x9,
    WS_OP_PONG = 0xA,
};

/* Close codes used here. */
#define WS_CLOSE_NORMAL 1000
#define WS_CLOSE_GOING_AWAY 1001
#define WS_CLOSE_PROTOCOL 1002
#define WS_CLOSE_BAD_DATA 1007
#define WS_CLOSE_POLICY 1008
#define WS_CLOSE_TOO_BIG 1009
#define WS_CLOSE_INTERNAL 1011

/* The largest frame header: 2 + 8 (length) + 4 (mask). */
#define WS_MAX_HEADER 14
/* The largest control frame payload. */
#define WS_MAX_CONTROL 125

/**
 * Writes a frame header (FIN set) for a payload of len bytes into out[WS_MAX_HEADER]; with mask
 * (4 bytes, a client's) the mask bit and key too. Returns the header's length. The caller
 * masks the payload itself (ws_mask).
 */
size_t ws_header_build(uint8_t *out, int opcode, uint64_t len, const uint8_t *mask);

/** XORs data[len] with the mask, as the payload's bytes from offset on. */
void ws_mask(uint8_t *data, size_t len, const uint8_t mask[4], uint64_t offset);

/**
 * Called for each message part: op WS_OP_BINARY with data as it arrives (fin set on the
 * message's last part, possibly empty), WS_OP_TEXT once with the whole message, WS_OP_PING /
 * WS_OP_PONG with their payload, WS_OP_CLOSE with the peer's code (1005 when it gave none) and
 * reason. Returns 0 to go on, or a close code to stop reading (returned by ws_reader_feed).
 */
typedef int (*ws_msg_fn)(void *arg, int op, const uint8_t *data, size_t len, int fin, int code);

struct ws_reader {
    int from_client;  /* frames come from a client: they must be masked */
    size_t max_frame; /* payload bytes per frame at most */
    size_t max_text;  /* bytes per text message at most */
    /* the frame being read */
    uint8_t hdr[WS_MAX_HEADER];
    size_t hdr_got, hdr_need;
    int op, fin, masked;
    uint8_t key[4];
    uint64_t len, got;
    /* the message being read */
    int msg_op; /* WS_OP_TEXT or WS_OP_BINARY while one is unfinished, else 0 */
    uint8_t *text;
    size_t text_len;
    uint8_t ctl[WS_MAX_CONTROL];
    int closed; /* a close frame was read, or a violation: nothing more is read */
};

/** Sets r up (no memory is taken until a text message arrives). */
void ws_reader_init(struct ws_reader *r, int from_client, size_t max_frame, size_t max_text);
/** Frees r's buffer. */
void ws_reader_free(struct ws_reader *r);

/**
 * Reads buf[len] (which may be changed: masked payloads are unmasked in place), calling fn for
 * each message part. Returns 0 when everything was taken, or a close code: the peer broke the
 * protocol (1002, 1007, 1009) or fn returned one; nothing more may be fed then.
 */
int ws_reader_feed(struct ws_reader *r, uint8_t *buf, size_t len, ws_msg_fn fn, void *arg);

#endif
