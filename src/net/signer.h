/*
 * The CA key's own process, and the protocol through which the egress proxy's process gets leaf
 * certificates from it (OpenBSD relayd's "ca" process is the model). The proxy parses sandboxes'
 * bytes, so it runs unprivileged and never holds the CA key: its tlsmitm (net/tlsmitm.h) asks
 * signer_client_sign, which asks signer_serve in the process that holds the key. A compromised
 * proxy can get certificates for names, for the one leaf key it announced, but not the CA key.
 *
 * One AF_UNIX SOCK_SEQPACKET socket carries one session: one message a datagram, at most
 * SIGNER_MSG_MAX bytes, laid out as
 *
 *   byte 0      type
 *   bytes 1-4   request id, big-endian; chosen by the client (never 0), echoed in the answer
 *   bytes 5-    payload, to the end of the datagram:
 *     SIGNER_HELLO  client, first and only once: the leaf public key, SubjectPublicKeyInfo DER,
 *                   EC P-256, nothing after it
 *     SIGNER_SIGN   client: the host, a normalised name as the proxy has it (what netpolicy_host
 *                   returns for a name: lower case, no trailing dot, not an address), no NUL
 *     SIGNER_CERT   signer: notAfter (int64, big-endian, seconds since the epoch), then the
 *                   certificate's DER (tlsmitm_mint's, for the host and the HELLO's key)
 *     SIGNER_ERR    signer: 1 to SIGNER_ERR_TEXT_MAX bytes of text saying why
 *
 * The signer answers every SIGN with CERT or ERR, in order, and a HELLO only to refuse it. A SIGN
 * for a host that is not a normalised name, or one whose signing fails, is answered ERR and the
 * session goes on. What only a broken or hostile client sends ends the session, after an ERR
 * (with the message's id, or 0 if it had none) saying why: a datagram shorter than the header or
 * longer than SIGNER_MSG_MAX, a type other than HELLO and SIGN, a SIGN before the HELLO, a second
 * HELLO, a HELLO whose payload is not exactly one EC P-256 public key. An empty datagram cannot be
 * told from the peer's close on a SOCK_SEQPACKET socket and is taken as one. There is no rate
 * limit: the signer does work only as fast as its one client asks, one request at a time, and a
 * limit would fail handshakes of a burst of new hosts that the cache would have made cheap.
 *
 * Threads: signer_serve blocks its process, which does nothing else. A signer_client is used from
 * one thread (the proxy's loop), which it blocks for at most its timeout per leaf minted (leaves
 * are cached for days, net/tlsmitm.h). signer_handle and signer_answer_parse do no I/O (the fuzz
 * target drives them).
 */
#ifndef WR_NET_SIGNER_H
#define WR_NET_SIGNER_H

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/err.h"

/* Longest datagram either side may send; anything longer is a protocol error. */
#define SIGNER_MSG_MAX (16 * 1024)
/* Type byte and request id. */
#define SIGNER_HEADER_LEN 5
/* Longest ERR text. */
#define SIGNER_ERR_TEXT_MAX 200
/* How long signer_client_sign waits for its answer, unless signer_client_set_timeout says. */
#define SIGNER_TIMEOUT_MS 2000

enum signer_type {
    SIGNER_HELLO = 0x01,
    SIGNER_SIGN = 0x02,
    SIGNER_CERT = 0x81,
    SIGNER_ERR = 0x82,
};

/**
 * The signer process's loop: serves the session on sock (blocking; EINTR is retried) with ca and
 * ca_key (borrowed; they must match) until the client closes (returns 0, also if it goes while
 * an answer is on its way) or breaks the protocol (answers ERR, returns -1 with err saying how).
 * -1 with err too for bad arguments, a socket that is not SOCK_SEQPACKET, or a socket error.
 * Does not close sock.
 */
int signer_serve(int sock, X509 *ca, EVP_PKEY *ca_key, struct wr_err *err);

/** The signer's side of one session, for signer_handle. Zero it, set ca and ca_key (borrowed). */
struct signer_session {
    X509 *ca;
    EVP_PKEY *ca_key;
    EVP_PKEY *leaf_pub; /* the HELLO's key (owned); NULL before it */
};

/**
 * Handles one datagram from the client: len is its real length, however long, and msg holds its
 * first len or SIGNER_MSG_MAX bytes, whichever is fewer (what recv with MSG_TRUNC gives). Writes
 * the answer, if there is one, to answer (SIGNER_MSG_MAX bytes) and its length to *answer_len (0:
 * no answer). Returns 0 to go on, or -1 if the datagram broke the protocol: then err says how, the
 * answer is an ERR saying so, and the session must end after it is sent.
 */
int signer_handle(struct signer_session *s, const uint8_t *msg, size_t len,
                  uint8_t *answer /* OUT: SIGNER_MSG_MAX bytes */, size_t *answer_len /* OUT */,
                  struct wr_err *err);

/** Frees what the session holds (its HELLO's key) and zeroes leaf_pub. */
void signer_session_clear(struct signer_session *s);

/** An answer from the signer, as signer_answer_parse reads it; pointers into the datagram. */
struct signer_answer {
    enum signer_type type; /* SIGNER_CERT or SIGNER_ERR */
    uint32_t id;
    int64_t not_after;   /* CERT */
    const uint8_t *body; /* CERT: the DER; ERR: the text (not NUL-terminated) */
    size_t body_len;
};

/**
 * Reads one datagram from the signer. Returns 0 with *out set, or -1 if it is not a well-formed
 * CERT (a header, 8 bytes of notAfter, at least one byte of DER) or ERR (a header and 1 to
 * SIGNER_ERR_TEXT_MAX bytes of text), or is longer than SIGNER_MSG_MAX. The DER is not decoded.
 */
int signer_answer_parse(const uint8_t *msg, size_t len, struct signer_answer *out /* OUT */);

struct signer_client;

/**
 * The client's end of a session on sock (taken: closed by signer_client_free, or here on
 * failure; it must be SOCK_SEQPACKET). If leaf_pub is given (borrowed), sends the HELLO with it
 * now; if it is NULL the HELLO goes with the first signer_client_sign's leaf_pub, for a caller that
 * must make the client before the key (tlsmitm_new_signed takes the client as its sign function's
 * ctx and makes the key). Returns the client, or NULL with err set.
 */
struct signer_client *signer_client_new(int sock, EVP_PKEY *leaf_pub, struct wr_err *err);

/** Closes the socket (the signer sees its client close) and frees c. NULL is a no-op. */
void signer_client_free(struct signer_client *c);

/** How long each signer_client_sign waits for its answer (default SIGNER_TIMEOUT_MS). */
void signer_client_set_timeout(struct signer_client *c, int timeout_ms);

/**
 * A tlsmitm_sign_fn (client is a struct signer_client): sends SIGN host (the HELLO first, with
 * leaf_pub, if it has not gone; later calls must pass the same key or NULL) and waits at most the
 * timeout for the answer with this request's id, dropping answers to earlier requests that timed
 * out. Returns the certificate (the caller owns it) with *not_after, or NULL with err:
 *   EINVAL     the signer refused the request (err has its text); the session goes on
 *   ETIMEDOUT  no answer in time; the session goes on, its late answer is dropped when it comes
 *   EAGAIN     the signer's socket is full; the session goes on
 *   EPIPE      the signer has closed the session or gone
 *   EPROTO     an answer that is not well-formed, or an ERR to the HELLO or without an id: the
 *              signer is ending the session
 * After EPIPE, EPROTO or a socket error the session is over and every later call fails the same
 * way at once. Only the answer's form is checked here; its content (host, key, issuer) is checked
 * by tlsmitm_leaf, which has the CA.
 */
X509 *signer_client_sign(void *client, const char *host, EVP_PKEY *leaf_pub,
                         time_t *not_after /* OUT */, struct wr_err *err);

#endif
