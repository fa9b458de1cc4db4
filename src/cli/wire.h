/*
 * The CLI's wire formats as pure functions over buffers: base URLs, HTTP/1.1 response heads,
 * the chunked transfer coding, NDJSON line splitting, and the API's error envelope.
 * Nothing here touches a socket, so every parser can be unit-tested (and fuzzed) without a
 * network; client.c drives them with bytes as they arrive.
 */
#ifndef WR_CLI_WIRE_H
#define WR_CLI_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* A response head larger than this is refused (the daemon's are a few hundred bytes). */
#define CLI_HEAD_MAX (64 * 1024)
/* At most this many header fields in one response head. */
#define CLI_HEADERS_MAX 100
/* A chunk-size line (size plus extensions) longer than this is refused. */
#define CLI_CHUNK_LINE_MAX 4096
/* Trailer section of a chunked body: at most this many bytes in all. */
#define CLI_TRAILER_MAX (16 * 1024)

/** Where the daemon is: a Unix socket path, or a TCP host and port plus an optional path prefix. */
struct cli_url {
    bool is_unix;
    bool tls;         /* https:// */
    char path[108];   /* Unix socket path (sun_path size) */
    char host[256];   /* TCP host name or address, without IPv6 brackets */
    char port[8];     /* TCP port as text */
    char prefix[256]; /* path prefix put before "/v1/..." (no trailing slash), may be "" */
};

/**
 * Parses a base URL: "http[s]://host[:port][/prefix]", "http[s]://[v6addr]:port",
 * "unix:/path.sock" or "unix:///path.sock" (default ports 80 and 443). Returns 0, or -1 with err
 * set (other schemes are refused).
 */
int cli_url_parse(const char *s, struct cli_url *out /* OUT */, struct wr_err *err);

/**
 * Returns true if host (a URL's, without brackets) is this machine's loopback by its spelling
 * alone: "localhost", an address in 127.0.0.0/8 or ::1 (IPv4-mapped too). Nothing is looked up,
 * so a name that only resolves to loopback is not one.
 */
bool cli_host_is_loopback(const char *host);

/**
 * Returns true if a key may be sent to url: over TLS, the Unix socket, or plain HTTP to a
 * loopback host (cli_host_is_loopback). Anything else would carry it readable over a network.
 */
bool cli_url_key_safe(const struct cli_url *url);

/** A parsed HTTP/1.x response head. */
struct cli_head {
    int status;             /* 100..599 */
    int minor;              /* HTTP/1.minor */
    char reason[64];        /* reason phrase, truncated */
    int64_t content_length; /* -1 when absent */
    bool chunked;           /* Transfer-Encoding: chunked */
    bool close;             /* Connection: close, or HTTP/1.0 without keep-alive */
    char content_type[128]; /* "" when absent; truncated */
};

/**
 * Parses a response head (status line, header fields, blank line) at the start of buf.
 * Accepts CRLF or bare LF line ends. Returns the number of bytes the head takes (the body
 * starts there), 0 when buf holds only part of a head (read more and call again with the whole
 * buffer), or -1 with err set on garbage or when no complete head fits in CLI_HEAD_MAX bytes.
 */
ssize_t cli_head_parse(const char *buf, size_t len, struct cli_head *h /* OUT */,
                       struct wr_err *err);

/** Receives body bytes; returns 0, or -1 with err set to stop. */
typedef int (*cli_data_fn)(void *ctx, const char *data, size_t len, struct wr_err *err);

/** State of a chunked-body decoder; zero-initialise with cli_chunked_init. */
struct cli_chunked {
    int state;
    uint64_t remaining; /* bytes left in the current chunk */
    unsigned digits;    /* hex digits seen in the current size line */
    size_t line_len;    /* bytes seen in the current size or trailer line */
    size_t trailer_len; /* bytes seen in the trailer section */
};

/** Resets a chunked decoder to the start of a body. */
void cli_chunked_init(struct cli_chunked *d);

/**
 * Feeds len bytes of a chunked body; chunk data goes to out as it is decoded (in pieces that
 * need not match the sender's chunks). Input may be split anywhere. Stops at the end of the
 * body: returns the number of input bytes used (less than len only when the body ended), or -1
 * with err set on a malformed size line, a missing CRLF, or a callback failure.
 */
ssize_t cli_chunked_feed(struct cli_chunked *d, const char *in, size_t len, cli_data_fn out,
                         void *ctx, struct wr_err *err);

/** True once the last chunk and the trailer section have been consumed. */
bool cli_chunked_done(const struct cli_chunked *d);

/** Receives one NDJSON line, without its "\n" (or "\r\n"); not NUL-terminated. */
typedef int (*cli_line_fn)(void *ctx, const char *line, size_t len, struct wr_err *err);

/** Splits a byte stream into lines; lines may arrive split across any number of feeds. */
struct cli_ndjson {
    char *buf; /* pending partial line, owned */
    size_t len, cap;
    size_t max_line;
};

/** Initialises a splitter that refuses lines longer than max_line bytes. */
void cli_ndjson_init(struct cli_ndjson *s, size_t max_line);

/** Feeds bytes; every complete non-empty line goes to fn. Returns 0, or -1 with err set. */
int cli_ndjson_feed(struct cli_ndjson *s, const char *data, size_t len, cli_line_fn fn, void *ctx,
                    struct wr_err *err);

/** At end of stream: returns 0 if no partial line is pending, else -1 with err set. */
int cli_ndjson_finish(const struct cli_ndjson *s, struct wr_err *err);

/** Frees the splitter's buffer. */
void cli_ndjson_free(struct cli_ndjson *s);

/**
 * Turns an error response into a message: the envelope's error.message when the body is
 * {"error":{"code":...,"message":...}}, else "HTTP <status> <reason>" plus the body's first line.
 * code (may be NULL) receives error.code or "".
 */
void cli_error_describe(int status, const char *reason, const char *body, size_t len, char *msg,
                        size_t msglen, char *code, size_t codelen);

/**
 * Percent-encodes s for a query parameter value (RFC 3986 unreserved and "/" pass through).
 * Returns a malloc'd string the caller frees.
 */
char *cli_query_escape(const char *s);

#endif
