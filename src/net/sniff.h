/*
 * What a sandbox's connection wants, from its first bytes. Every connection out of a sandbox is
 * DNAT'ed to the egress proxy, which must decide where it goes before it dials anything: from the
 * TLS ClientHello's server name (SNI), or from an HTTP/1.x request head's Host. These are the
 * parsers it decides with: pure functions over the bytes received so far, no allocation, no I/O,
 * bounded work, and strict: whatever two readers could understand differently (a second SNI, two
 * Hosts, a target naming another host, Content-Length beside Transfer-Encoding) is refused, since
 * the proxy must never check one thing and forward another.
 *
 * Each call takes the whole buffer received so far: call again with more bytes on SNIFF_MORE.
 * On a kept-alive HTTP connection, the head's body framing (and sniff_chunked for chunked bodies)
 * says where the next request starts; sniff_http_answer does the same for the upstream's answers,
 * which the proxy follows to know which answer a 101 is and when the answers before a refusal
 * have all gone out.
 */
#ifndef WR_NET_SNIFF_H
#define WR_NET_SNIFF_H

#include <stddef.h>
#include <stdint.h>

enum sniff_result {
    SNIFF_BAD = -1,    /* malformed or ambiguous: refuse the connection */
    SNIFF_OK = 0,      /* parsed; the output is filled */
    SNIFF_MORE = 1,    /* not enough bytes yet: read more and call again with all of them */
    SNIFF_DONE = 2,    /* sniff_chunked_feed: the body ended */
    SNIFF_NOT_TLS = 3, /* sniff_tls: the first bytes are not a TLS handshake record */
    SNIFF_NOT_HTTP = 4 /* sniff_http: the first bytes are not an HTTP request line */
};

/* A host name: DNS's limit in text (253, with a trailing dot 254), rounded to one length byte. */
#define SNIFF_NAME_MAX 255
/* The ClientHello (handshake header included) may take this much; real ones take 0.3–2 KiB. */
#define SNIFF_TLS_HELLO_MAX (16 * 1024)
/* TLS plaintext records carry at most 2^14 bytes (RFC 8446 5.1). */
#define SNIFF_TLS_RECORD_MAX (16 * 1024)
/* Request line, header fields and the blank line: the API's own limit for its heads. */
#define SNIFF_HTTP_HEAD_MAX (16 * 1024)
/* A method longer than this is not one (the longest registered, UPDATEREDIRECTREF, has 17). */
#define SNIFF_HTTP_METHOD_MAX 32
/* Content-Length digits: 18 keeps the value below 2^63 with no overflow to check. */
#define SNIFF_HTTP_LENGTH_DIGITS_MAX 18
/* A chunk-size line with its extensions (not its CRLF), and a body's trailer section (its
   fields and the final CRLF). */
#define SNIFF_CHUNK_LINE_MAX 1024
#define SNIFF_CHUNK_TRAILER_MAX (8 * 1024)

/* ALPN protocols offered in a ClientHello. */
#define SNIFF_ALPN_H2 0x1u     /* "h2" */
#define SNIFF_ALPN_HTTP11 0x2u /* "http/1.1" */
#define SNIFF_ALPN_OTHER 0x4u  /* anything else */

/** What a ClientHello says. Holds copies, no pointers into the caller's buffer. */
struct sniff_tls {
    int has_sni;                  /* a server_name extension with its one host_name */
    char sni[SNIFF_NAME_MAX + 1]; /* that name, lower-cased, NUL-terminated; "" without one */
    size_t sni_len;               /* 1..SNIFF_NAME_MAX, 0 without one */
    int has_ech;                  /* an encrypted_client_hello extension (0xfe0d) */
    int has_alpn;                 /* an ALPN extension */
    unsigned alpn;                /* SNIFF_ALPN_* of the protocols it offers */
    uint16_t version;             /* the hello's legacy_version (0x0303 for TLS 1.2 and 1.3) */
    size_t consumed;              /* the bytes of buf its records take */
    unsigned records;             /* how many records carried it */
    size_t need;                  /* on SNIFF_MORE: it cannot be complete in fewer bytes */
};

/**
 * Reads a TLS ClientHello from the first len bytes a client sent (record headers included; the
 * hello may be fragmented over several handshake records, up to SNIFF_TLS_HELLO_MAX). Returns
 * SNIFF_OK with out filled; SNIFF_MORE with out->need set (a lower bound on the total length; a
 * call with fewer bytes can only answer SNIFF_MORE or, as bytes arrive, BAD); SNIFF_NOT_TLS when
 * the first bytes are not a handshake record (another protocol); SNIFF_BAD when it is TLS but
 * not a well-formed ClientHello: any length that disagrees with what encloses it, a message
 * other than ClientHello, trailing bytes in its last record, or a server_name extension that is
 * not exactly one host_name of 1..255 bytes of [A-Za-z0-9.-]; a repeated server_name, ALPN or
 * encrypted_client_hello extension, or an empty ALPN protocol, is BAD too. Never reads past len.
 */
int sniff_tls(const uint8_t *buf, size_t len, struct sniff_tls *out /* OUT */);

/** How the request's body is framed, so the proxy can find the next request. */
enum sniff_body {
    SNIFF_BODY_NONE,    /* no body: the next request starts right after the head */
    SNIFF_BODY_LENGTH,  /* content_length bytes follow the head */
    SNIFF_BODY_CHUNKED, /* Transfer-Encoding: chunked; feed what follows to sniff_chunked */
    SNIFF_BODY_TUNNEL,  /* CONNECT: after the proxy's 2xx the connection is a raw tunnel */
    SNIFF_BODY_CLOSE,   /* an answer's body that runs until the server closes */
};

/* What a request's Upgrade field asks for. */
enum sniff_upgrade {
    SNIFF_UPGRADE_NONE = 0,
    SNIFF_UPGRADE_WEBSOCKET, /* one Upgrade field whose value is "websocket" alone */
    SNIFF_UPGRADE_OTHER,     /* anything else: h2c, a list, a second field, ... */
};

/** A run of bytes inside the buffer given to sniff_http (not NUL-terminated). */
struct sniff_span {
    const char *p;
    size_t len;
};

/** What an HTTP/1.x request head says. Spans point into the caller's buffer. */
struct sniff_http {
    struct sniff_span method;      /* a token, case kept ("GET", "CONNECT") */
    struct sniff_span target;      /* the request-target as sent */
    struct sniff_span path;        /* the target in origin-form: the target itself, or in
                                      absolute-form what follows the authority (put a "/" before
                                      it if it does not start with one); "" for CONNECT */
    struct sniff_span host_hdr;    /* the Host field's value, without surrounding whitespace */
    int minor;                     /* HTTP/1.minor: 0 or 1 */
    int is_connect;                /* CONNECT host:port (target in authority-form) */
    int absolute;                  /* target in absolute-form ("http://host[:port]/...") */
    char host[SNIFF_NAME_MAX + 1]; /* where it goes, lower-cased, IPv6 without brackets */
    int port;                      /* 1..65535: given, else 80 (CONNECT always gives one) */
    int port_given;                /* the port was written (in Host or in the target) */
    int host_is_addr;              /* host is an address literal (addr_parse_literal) */
    int host_is_v6;                /* ... an IPv6 one, written in brackets */
    enum sniff_upgrade upgrade;    /* what an Upgrade field asks (a tunnel after a 101) */
    size_t head_len;               /* request line to blank line inclusive: forward exactly it */
    enum sniff_body body;
    uint64_t content_length; /* SNIFF_BODY_LENGTH: the body's length */
};

/**
 * Parses an HTTP/1.0 or 1.1 request head at the start of buf. Returns SNIFF_OK with out filled;
 * SNIFF_MORE when the head is not complete yet (and within SNIFF_HTTP_HEAD_MAX); SNIFF_NOT_HTTP
 * when the first bytes cannot start a request line (not a method token and a space); SNIFF_BAD
 * for anything the proxy cannot read unambiguously: lines not ending in CRLF, obsolete line
 * folding, control bytes, a head over SNIFF_HTTP_HEAD_MAX, a target that is not origin-form
 * ("/..."), absolute-form ("http://authority/...", no userinfo), authority-form (CONNECT only) or
 * "*" (OPTIONS only); no Host or more than one; a Host, or a target's authority, that is not a
 * name of [A-Za-z0-9.-], "[IPv6]", with an optional port 1..65535; an authority that disagrees
 * with Host; Content-Length that is not plain digits, or repeated with another value;
 * Transfer-Encoding other than "chunked" alone, in HTTP/1.0, or beside Content-Length; a body on
 * CONNECT; names that become Host, Content-Length or Transfer-Encoding with '_' read as '-'.
 */
int sniff_http(const uint8_t *buf, size_t len, struct sniff_http *out /* OUT */);

/** What an HTTP/1.x answer's head says, as far as the proxy needs to follow answers. */
struct sniff_answer {
    int status;      /* 100..999 */
    int minor;       /* HTTP/1.minor: 0 or 1 */
    int websocket;   /* an Upgrade field naming websocket (what a 101 must switch to) */
    size_t head_len; /* status line to blank line inclusive */
    /* How the body is framed for a request other than HEAD, ignoring the status (1xx, 204 and
       304 have none whatever the fields say: that is the caller's to apply): LENGTH,
       CHUNKED (Transfer-Encoding ending in chunked), or CLOSE (neither). */
    enum sniff_body body;
    uint64_t content_length; /* SNIFF_BODY_LENGTH: the body's length */
};

/**
 * Finds the status and the end of an HTTP/1.0 or 1.1 answer head at the start of buf, and how
 * its body is framed: read only that far, since the proxy relays answers as they are and only
 * needs to know where each ends. Returns SNIFF_OK with out filled; SNIFF_MORE when the head is
 * not complete yet (and within SNIFF_HTTP_HEAD_MAX); SNIFF_BAD for a status line that is not
 * "HTTP/1.x DDD" followed by a space or the line end, lines not ending in CRLF, control bytes, a
 * head over SNIFF_HTTP_HEAD_MAX, a Content-Length that is not plain digits or repeated with
 * another value.
 */
int sniff_http_answer(const uint8_t *buf, size_t len, struct sniff_answer *out /* OUT */);

/** State of a chunked-body scanner; start it with sniff_chunked_init. Holds no pointers. */
struct sniff_chunked {
    int state;
    uint64_t left;  /* data bytes left in the current chunk */
    size_t line;    /* bytes of the current chunk-size line */
    size_t trailer; /* bytes of the trailer section so far */
    unsigned digits;
    uint64_t size; /* the current chunk-size being read */
};

/** Starts a scanner at the beginning of a chunked body. */
void sniff_chunked_init(struct sniff_chunked *c);

/**
 * Scans the next len bytes of a chunked body (input may be split anywhere; the data itself is
 * skipped, not copied). Returns SNIFF_DONE when the body ended (the last chunk, the trailer
 * section and its blank line): *consumed says how many of these bytes belong to it, and the next
 * request starts right after. SNIFF_MORE: all len bytes belong to the body (*consumed = len).
 * SNIFF_BAD: a chunk-size that is not 1..16 hex digits followed by ';' or CRLF, a size line over
 * SNIFF_CHUNK_LINE_MAX, data not followed by CRLF, a malformed or folded trailer field, trailers
 * over SNIFF_CHUNK_TRAILER_MAX, or a bare CR or LF anywhere; *consumed is the offending byte's
 * index. Once DONE or BAD, later calls answer the same with *consumed = 0.
 */
int sniff_chunked_feed(struct sniff_chunked *c, const uint8_t *buf, size_t len,
                       size_t *consumed /* OUT */);

/** A constant name for a result ("ok", "more", "bad", ...), for logs. */
const char *sniff_result_name(int result);

#endif
