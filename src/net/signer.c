/*
 * The signer and its client: see signer.h. The signer's side is signer_handle, a function from one
 * datagram to one answer with no I/O, so the fuzz target and signer_serve run the same code;
 * signer_serve only moves datagrams. Names are checked by netpolicy_host, the function that made
 * them normalised in the proxy, so the signer takes exactly the names the proxy can ask for.
 */
#include "net/signer.h"

#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/objects.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "net/netpolicy.h"
#include "net/tlsmitm.h"

#define HOST_MAX 253

/* Whether sock keeps message boundaries: on a stream socket a request could be read in pieces or
 * run into the next, and every check here would be about the wrong bytes. */
static int is_seqpacket(int sock)
{
    int type = 0;
    socklen_t len = sizeof(type);
    return getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET;
}

/* ---- the signer ---- */

/* An ERR answer to id saying why. */
static void put_err(uint8_t *answer, size_t *answer_len, uint32_t id, const char *why)
{
    size_t n = strlen(why);
    if (n > SIGNER_ERR_TEXT_MAX)
        n = SIGNER_ERR_TEXT_MAX;
    answer[0] = SIGNER_ERR;
    put_be32(answer + 1, id);
    memcpy(answer + SIGNER_HEADER_LEN, why, n);
    *answer_len = SIGNER_HEADER_LEN + n;
}

/* A protocol violation: ERR to id, and err, and the session ends. Returns -1. */
static int violation(uint8_t *answer, size_t *answer_len, uint32_t id, struct wr_err *err,
                     const char *why)
{
    put_err(answer, answer_len, id, why);
    return wr_err_set(err, EPROTO, "signer: %s", why);
}

/* The HELLO's key: exactly one SubjectPublicKeyInfo, EC P-256, a valid point. NULL with *why. */
static EVP_PKEY *hello_key(const uint8_t *p, size_t n, const char **why)
{
    const unsigned char *q = p;
    EVP_PKEY *k = n > 0 ? d2i_PUBKEY(NULL, &q, (long)n) : NULL;
    char group[64] = "";
    size_t glen = 0;
    EVP_PKEY_CTX *check = NULL;
    *why = NULL;
    if (!k)
        *why = "the HELLO does not hold a public key";
    else if (q != p + n)
        *why = "the HELLO has bytes after its key";
    else if (EVP_PKEY_get_base_id(k) != EVP_PKEY_EC ||
             !EVP_PKEY_get_group_name(k, group, sizeof(group), &glen) ||
             OBJ_txt2nid(group) != NID_X9_62_prime256v1)
        *why = "the HELLO's key is not EC P-256";
    else if (!(check = EVP_PKEY_CTX_new_from_pkey(NULL, k, NULL)) ||
             EVP_PKEY_public_check(check) != 1)
        *why = "the HELLO's key is not a valid point";
    EVP_PKEY_CTX_free(check);
    ERR_clear_error();
    if (*why) {
        EVP_PKEY_free(k);
        return NULL;
    }
    return k;
}

/* Whether host (n bytes) is a name the proxy could ask for; copies it NUL-terminated to out. */
static int host_ok(const uint8_t *host, size_t n, char out[HOST_MAX + 1])
{
    char norm[HOST_MAX + 1];
    if (n == 0 || n > HOST_MAX || memchr(host, '\0', n))
        return 0;
    memcpy(out, host, n);
    out[n] = '\0';
    return netpolicy_host(out, norm, sizeof(norm)) == 0 && strcmp(out, norm) == 0;
}

static void answer_sign(struct signer_session *s, uint32_t id, const uint8_t *host_bytes, size_t n,
                        uint8_t *answer, size_t *answer_len)
{
    char host[HOST_MAX + 1];
    if (!host_ok(host_bytes, n, host)) {
        put_err(answer, answer_len, id, "not a normalised host name");
        return;
    }
    time_t not_after = 0;
    X509 *cert = tlsmitm_mint(s->ca, s->ca_key, s->leaf_pub, host, &not_after);
    int der_len = cert ? i2d_X509(cert, NULL) : -1;
    size_t at = SIGNER_HEADER_LEN + 8;
    if (der_len <= 0 || at + (size_t)der_len > SIGNER_MSG_MAX) {
        X509_free(cert);
        ERR_clear_error();
        put_err(answer, answer_len, id, "signing failed");
        return;
    }
    unsigned char *der = answer + at;
    i2d_X509(cert, &der);
    X509_free(cert);
    answer[0] = SIGNER_CERT;
    put_be32(answer + 1, id);
    put_be64(answer + SIGNER_HEADER_LEN, (uint64_t)(int64_t)not_after);
    *answer_len = at + (size_t)der_len;
}

int signer_handle(struct signer_session *s, const uint8_t *msg, size_t len, uint8_t *answer,
                  size_t *answer_len, struct wr_err *err)
{
    *answer_len = 0;
    if (len < SIGNER_HEADER_LEN)
        return violation(answer, answer_len, 0, err, "a message shorter than its header");
    uint32_t id = get_be32(msg + 1);
    if (len > SIGNER_MSG_MAX)
        return violation(answer, answer_len, id, err, "a message over SIGNER_MSG_MAX bytes");
    const uint8_t *body = msg + SIGNER_HEADER_LEN;
    size_t body_len = len - SIGNER_HEADER_LEN;
    switch (msg[0]) {
    case SIGNER_HELLO: {
        if (s->leaf_pub)
            return violation(answer, answer_len, id, err, "a second HELLO");
        const char *why;
        if (!(s->leaf_pub = hello_key(body, body_len, &why)))
            return violation(answer, answer_len, id, err, why);
        return 0;
    }
    case SIGNER_SIGN:
        if (!s->leaf_pub)
            return violation(answer, answer_len, id, err, "a SIGN before the HELLO");
        answer_sign(s, id, body, body_len, answer, answer_len);
        return 0;
    default: {
        char why[64];
        snprintf(why, sizeof(why), "a message of unknown type 0x%02x", msg[0]);
        return violation(answer, answer_len, id, err, why);
    }
    }
}

void signer_session_clear(struct signer_session *s)
{
    EVP_PKEY_free(s->leaf_pub);
    s->leaf_pub = NULL;
}

/* Receives one datagram into buf (SIGNER_MSG_MAX bytes), blocking. Returns its real length (it
 * may be longer than buf), 0 at the client's close, -1 with errno. */
static ssize_t recv_request(int sock, uint8_t *buf)
{
    for (;;) {
        ssize_t n = recv(sock, buf, SIGNER_MSG_MAX, MSG_TRUNC);
        if (n >= 0)
            return n;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd = {.fd = sock, .events = POLLIN};
            if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
                return -1;
        } else if (errno != EINTR) {
            return -1;
        }
    }
}

static int send_answer(int sock, const uint8_t *buf, size_t len)
{
    for (;;) {
        ssize_t n = send(sock, buf, len, MSG_NOSIGNAL);
        if (n == (ssize_t)len)
            return 0;
        if (n >= 0) {
            errno = EMSGSIZE;
            return -1;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd = {.fd = sock, .events = POLLOUT};
            if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
                return -1;
        } else if (errno != EINTR) {
            return -1;
        }
    }
}

int signer_serve(int sock, X509 *ca, EVP_PKEY *ca_key, struct wr_err *err)
{
    if (sock < 0 || !ca || !ca_key)
        return wr_err_set(err, EINVAL, "signer: bad arguments");
    if (!is_seqpacket(sock))
        return wr_err_set(err, EINVAL, "signer: the socket is not SOCK_SEQPACKET");
    if (X509_check_private_key(ca, ca_key) != 1) {
        ERR_clear_error();
        return wr_err_set(err, EINVAL, "signer: the CA key does not match its certificate");
    }
    struct signer_session s = {.ca = ca, .ca_key = ca_key};
    uint8_t *in = malloc(SIGNER_MSG_MAX), *out = malloc(SIGNER_MSG_MAX);
    int r = in && out ? 1 : wr_err_sys(err, ENOMEM, "signer");
    while (r == 1) {
        ssize_t n = recv_request(sock, in);
        if (n <= 0) {
            r = n == 0 ? 0 : wr_err_sys(err, errno, "signer: receiving");
            break;
        }
        size_t out_len = 0;
        int h = signer_handle(&s, in, (size_t)n, out, &out_len, err);
        if (out_len && send_answer(sock, out, out_len) < 0 && h == 0) {
            int gone = errno == EPIPE || errno == ECONNRESET;
            r = gone ? 0 : wr_err_sys(err, errno, "signer: sending");
        } else if (h < 0) {
            r = -1;
        }
    }
    signer_session_clear(&s);
    free(in);
    free(out);
    return r;
}

/* ---- reading answers ---- */

int signer_answer_parse(const uint8_t *msg, size_t len, struct signer_answer *out)
{
    if (len < SIGNER_HEADER_LEN || len > SIGNER_MSG_MAX)
        return -1;
    memset(out, 0, sizeof(*out));
    out->id = get_be32(msg + 1);
    out->body = msg + SIGNER_HEADER_LEN;
    out->body_len = len - SIGNER_HEADER_LEN;
    switch (msg[0]) {
    case SIGNER_CERT:
        if (out->body_len < 8 + 1)
            return -1;
        out->type = SIGNER_CERT;
        out->not_after = (int64_t)get_be64(out->body);
        out->body += 8;
        out->body_len -= 8;
        return 0;
    case SIGNER_ERR:
        if (out->body_len < 1 || out->body_len > SIGNER_ERR_TEXT_MAX)
            return -1;
        out->type = SIGNER_ERR;
        return 0;
    default: return -1;
    }
}

/* ---- the client ---- */

struct signer_client {
    int sock;
    int timeout_ms;
    uint32_t last_id;
    uint32_t hello_id;  /* 0 until the HELLO has gone */
    EVP_PKEY *leaf_pub; /* the HELLO's (a reference) */
    int over_code;      /* why the session is over, once it is: every call fails so */
    char over[SIGNER_ERR_TEXT_MAX + 64];
    uint8_t buf[SIGNER_MSG_MAX];
};

/* Ends the session for good: err now, and every later call the same. Returns -1. */
static int session_over(struct signer_client *c, int code, struct wr_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int session_over(struct signer_client *c, int code, struct wr_err *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->over, sizeof(c->over), fmt, ap);
    va_end(ap);
    c->over_code = code;
    return wr_err_set(err, code, "signer: %s", c->over);
}

static uint32_t next_id(struct signer_client *c)
{
    if (++c->last_id == 0)
        c->last_id = 1; /* 0 is the id of an ERR to a message without one */
    return c->last_id;
}

static void err_text(const struct signer_answer *a, char *out /* SIGNER_ERR_TEXT_MAX + 1 */);

/* The signer closed while a request was on its way. If it said why first (an ERR to the HELLO,
 * or to no message: it ended the session), that is the reason; else it has gone. */
static int gone(struct signer_client *c, struct wr_err *err)
{
    ssize_t n = recv(c->sock, c->buf, sizeof(c->buf), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && errno == ECONNRESET) /* reported once, before what is queued */
        n = recv(c->sock, c->buf, sizeof(c->buf), MSG_DONTWAIT | MSG_TRUNC);
    struct signer_answer a;
    if (n > 0 && (size_t)n <= sizeof(c->buf) && signer_answer_parse(c->buf, (size_t)n, &a) == 0 &&
        a.type == SIGNER_ERR && (a.id == 0 || a.id == c->hello_id)) {
        char text[SIGNER_ERR_TEXT_MAX + 1];
        err_text(&a, text);
        return session_over(c, EPROTO, err, "the signer ended the session: %s", text);
    }
    return session_over(c, EPIPE, err, "the signer has gone");
}

static int send_request(struct signer_client *c, enum signer_type type, uint32_t id,
                        const void *body, size_t len, struct wr_err *err)
{
    if (len > SIGNER_MSG_MAX - SIGNER_HEADER_LEN)
        return wr_err_set(err, EMSGSIZE, "signer: a request over SIGNER_MSG_MAX bytes");
    c->buf[0] = (uint8_t)type;
    put_be32(c->buf + 1, id);
    memcpy(c->buf + SIGNER_HEADER_LEN, body, len);
    ssize_t n;
    do
        n = send(c->sock, c->buf, SIGNER_HEADER_LEN + len, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)(SIGNER_HEADER_LEN + len))
        return 0;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) /* it may catch up: not over */
        return wr_err_set(err, EAGAIN, "signer: not taking requests (its socket is full)");
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN))
        return gone(c, err);
    return session_over(c, n < 0 ? errno : EMSGSIZE, err, "sending: %s",
                        strerror(n < 0 ? errno : EMSGSIZE));
}

static int send_hello(struct signer_client *c, EVP_PKEY *leaf_pub, struct wr_err *err)
{
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(leaf_pub, &der);
    if (n <= 0) {
        ERR_clear_error();
        return wr_err_set(err, EINVAL, "signer: the leaf key cannot be encoded");
    }
    uint32_t id = next_id(c);
    int r = send_request(c, SIGNER_HELLO, id, der, (size_t)n, err);
    OPENSSL_free(der);
    if (r < 0)
        return -1;
    c->hello_id = id;
    EVP_PKEY_up_ref(leaf_pub);
    c->leaf_pub = leaf_pub;
    return 0;
}

struct signer_client *signer_client_new(int sock, EVP_PKEY *leaf_pub, struct wr_err *err)
{
    if (sock < 0) {
        wr_err_set(err, EINVAL, "signer: bad arguments");
        return NULL;
    }
    if (!is_seqpacket(sock)) {
        close(sock);
        wr_err_set(err, EINVAL, "signer: the socket is not SOCK_SEQPACKET");
        return NULL;
    }
    struct signer_client *c = calloc(1, sizeof(*c));
    if (!c) {
        close(sock);
        wr_err_sys(err, ENOMEM, "signer");
        return NULL;
    }
    c->sock = sock;
    c->timeout_ms = SIGNER_TIMEOUT_MS;
    if (leaf_pub && send_hello(c, leaf_pub, err) < 0) {
        signer_client_free(c);
        return NULL;
    }
    return c;
}

void signer_client_free(struct signer_client *c)
{
    if (!c)
        return;
    close(c->sock);
    EVP_PKEY_free(c->leaf_pub);
    free(c);
}

void signer_client_set_timeout(struct signer_client *c, int timeout_ms)
{
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 1;
}

/* The signer's ERR text, printable: it ends up in logs. */
static void err_text(const struct signer_answer *a, char *out /* SIGNER_ERR_TEXT_MAX + 1 */)
{
    size_t i;
    for (i = 0; i < a->body_len; i++)
        out[i] = a->body[i] >= 0x20 && a->body[i] < 0x7f ? (char)a->body[i] : '?';
    out[i] = '\0';
}

/* Waits for the answer to id. NULL with err on anything but a certificate. */
static X509 *await_answer(struct signer_client *c, uint32_t id, const char *host, time_t *not_after,
                          struct wr_err *err)
{
    uint64_t deadline = now_ms_monotonic() + (uint64_t)c->timeout_ms;
    for (;;) {
        uint64_t now = now_ms_monotonic();
        if (now >= deadline) {
            wr_err_set(err, ETIMEDOUT, "signer: no answer for %s in %d ms", host, c->timeout_ms);
            return NULL;
        }
        struct pollfd pfd = {.fd = c->sock, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(deadline - now));
        if (pr < 0 && errno != EINTR) {
            wr_err_sys(err, errno, "signer: poll");
            return NULL;
        }
        if (pr <= 0)
            continue;
        ssize_t n = recv(c->sock, c->buf, sizeof(c->buf), MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            continue;
        if (n < 0 && errno == ECONNRESET)
            continue; /* reported once, before what the signer sent ahead of its close */
        if (n < 0) {
            session_over(c, errno, err, "receiving: %s", strerror(errno));
            return NULL;
        }
        if (n == 0) {
            session_over(c, EPIPE, err, "the signer closed the session");
            return NULL;
        }
        struct signer_answer a;
        if (signer_answer_parse(c->buf, (size_t)n, &a) < 0) {
            session_over(c, EPROTO, err, "a malformed answer (%zd bytes, type 0x%02x)", n,
                         c->buf[0]);
            return NULL;
        }
        char text[SIGNER_ERR_TEXT_MAX + 1];
        if (a.type == SIGNER_ERR)
            err_text(&a, text);
        if (a.type == SIGNER_ERR && (a.id == 0 || a.id == c->hello_id)) {
            session_over(c, EPROTO, err, "the signer ended the session: %s", text);
            return NULL;
        }
        if (a.id != id)
            continue; /* late: the answer to a request that timed out */
        if (a.type == SIGNER_ERR) {
            wr_err_set(err, EINVAL, "signer: refused %s: %s", host, text);
            return NULL;
        }
        const unsigned char *p = a.body;
        X509 *cert = d2i_X509(NULL, &p, (long)a.body_len);
        if (!cert || p != a.body + a.body_len) {
            X509_free(cert);
            ERR_clear_error();
            session_over(c, EPROTO, err, "an answer whose certificate is not DER");
            return NULL;
        }
        *not_after = (time_t)a.not_after;
        return cert;
    }
}

X509 *signer_client_sign(void *client, const char *host, EVP_PKEY *leaf_pub, time_t *not_after,
                         struct wr_err *err)
{
    struct signer_client *c = client;
    if (c->over_code) {
        wr_err_set(err, c->over_code, "signer: %s", c->over);
        return NULL;
    }
    if (!host || !not_after) {
        wr_err_set(err, EINVAL, "signer: bad arguments");
        return NULL;
    }
    if (!c->hello_id) {
        if (!leaf_pub) {
            wr_err_set(err, EINVAL, "signer: no leaf key for the HELLO");
            return NULL;
        }
        if (send_hello(c, leaf_pub, err) < 0)
            return NULL;
    } else if (leaf_pub && EVP_PKEY_eq(leaf_pub, c->leaf_pub) != 1) {
        wr_err_set(err, EINVAL, "signer: a leaf key other than the HELLO's");
        return NULL;
    }
    uint32_t id = next_id(c);
    if (send_request(c, SIGNER_SIGN, id, host, strlen(host), err) < 0)
        return NULL;
    return await_answer(c, id, host, not_after, err);
}
