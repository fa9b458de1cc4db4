/*
 * net/signer.h: a real signer in a child process (signer_serve on one end of a socketpair) and,
 * in the test, what the proxy's process does with it (signer_client under tlsmitm_new_signed):
 * the leaves a sandbox would see, the names refused, hostile datagrams from the client's end
 * (the signer answers or ends the session as documented, and exits rather than crashes), a signer
 * that dies, and a signer that never answers, whose late answers must not be taken for new ones.
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "net/signer.h"
#include "net/tlsmitm.h"
#include "tap.h"

/* A signer's exit status when signer_serve returned -1 (the client broke the protocol). */
#define EXIT_VIOLATION 3

static char dir[] = "/tmp/wr-signer-XXXXXX";
static char cert_path[256], key_path[256];
static char *ca_pem;
static X509 *ca;
static EVP_PKEY *ca_key;

static char *read_text(const char *p)
{
    FILE *f = fopen(p, "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 16);
    fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    return buf;
}

/* A signer in a child: returns the client's end; *pid is the child. */
static int spawn_signer(pid_t *pid)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return -1;
    fflush(stdout);
    *pid = fork();
    if (*pid == 0) {
        close(sv[0]);
        struct wr_err err = {0};
        int r = signer_serve(sv[1], ca, ca_key, &err);
        _exit(r == 0 ? 0 : EXIT_VIOLATION);
    }
    close(sv[1]);
    return sv[0];
}

/* The child's exit status, or 128 + the signal that ended it. */
static int reap(pid_t pid)
{
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Verifies leaf as a sandbox's client would: chain to the CA, TLS server, host. */
static int verifies(X509 *leaf, const char *host)
{
    X509_STORE *store = X509_STORE_new();
    X509_STORE_add_cert(store, ca);
    X509_STORE_CTX *v = X509_STORE_CTX_new();
    X509_STORE_CTX_init(v, store, leaf, NULL);
    X509_STORE_CTX_set_purpose(v, X509_PURPOSE_SSL_SERVER);
    X509_VERIFY_PARAM_set1_host(X509_STORE_CTX_get0_param(v), host, 0);
    int r = X509_verify_cert(v);
    X509_STORE_CTX_free(v);
    X509_STORE_free(store);
    return r == 1;
}

static int names(X509 *cert, const char *host)
{
    return cert && X509_check_host(cert, host, 0, X509_CHECK_FLAG_NO_WILDCARDS, NULL) == 1;
}

/* ---- raw datagrams, as a hostile client or a fake signer sends them ---- */

static int send_raw(int fd, uint8_t type, uint32_t id, const void *body, size_t len)
{
    uint8_t *buf = malloc(SIGNER_HEADER_LEN + len);
    buf[0] = type;
    put_be32(buf + 1, id);
    memcpy(buf + SIGNER_HEADER_LEN, body, len);
    ssize_t n = send(fd, buf, SIGNER_HEADER_LEN + len, MSG_NOSIGNAL);
    free(buf);
    return n == (ssize_t)(SIGNER_HEADER_LEN + len) ? 0 : -1;
}

static int send_hello(int fd, uint32_t id, EVP_PKEY *k)
{
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(k, &der);
    int r = send_raw(fd, SIGNER_HELLO, id, der, (size_t)n);
    OPENSSL_free(der);
    return r;
}

/* Reads one datagram (10 s at most, a bound on a hang, not a timing). Returns its length, 0 at
 * EOF, -1 if none came. */
static ssize_t recv_raw(int fd, uint8_t *buf, size_t cap)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 10000) != 1)
        return -1;
    return recv(fd, buf, cap, 0);
}

static uint8_t rbuf[SIGNER_MSG_MAX];

/* Reads an answer: 1 if it is an ERR to id (its text in why), 2 if a CERT to id, 0 at EOF. */
static int answer(int fd, uint32_t id, char *why, size_t cap)
{
    ssize_t n = recv_raw(fd, rbuf, sizeof(rbuf));
    struct signer_answer a;
    if (n <= 0)
        return (int)n;
    if (signer_answer_parse(rbuf, (size_t)n, &a) < 0 || a.id != id)
        return -1;
    if (why)
        snprintf(why, cap, "%.*s", (int)a.body_len, (const char *)a.body);
    return a.type == SIGNER_ERR ? 1 : 2;
}

/* ---- through tlsmitm, as the proxy will ---- */

static void leaves(void)
{
    struct wr_err err = {0};
    pid_t pid;
    int fd = spawn_signer(&pid);
    /* The proxy's order: the client first (it is the sign function's ctx), then the tlsmitm
     * that makes the leaf key; the HELLO goes with the first leaf. */
    struct signer_client *c = signer_client_new(fd, NULL, &err);
    ok(c != NULL, "signer_client_new without a key yet %s", err.msg);
    struct tlsmitm *m = tlsmitm_new_signed(ca_pem, signer_client_sign, c, NULL, &err);
    ok(m != NULL, "tlsmitm_new_signed %s", err.msg);

    X509 *leaf = tlsmitm_leaf(m, "api.example.com", &err);
    ok(leaf != NULL, "a leaf for api.example.com from the signer %s", err.msg);
    ok(leaf && verifies(leaf, "api.example.com"),
       "it verifies against the CA as a TLS server for api.example.com");
    ok(leaf && !verifies(leaf, "other.example.com"), "and not for another name");
    ok(leaf && EVP_PKEY_eq(X509_get0_pubkey(leaf), tlsmitm_leaf_key(m)) == 1,
       "it carries the tlsmitm's leaf key");
    ok(X509_check_ca(leaf) == 0 && X509_get_extended_key_usage(leaf) == XKU_SSL_SERVER,
       "not a CA; EKU serverAuth");
    SSL *ssl = tlsmitm_server_ssl(m, "api.example.com", &err);
    ok(ssl && SSL_get_certificate(ssl) == leaf && SSL_check_private_key(ssl) == 1,
       "a server SSL carries it, with the matching private key");
    SSL_free(ssl);

    /* Names the proxy never asks for: refused with ERR, and the session goes on. */
    char long_name[300], long_label[80];
    memset(long_name, 'a', 254);
    for (int i = 63; i < 254; i += 64)
        long_name[i] = '.';
    long_name[254] = '\0';
    memset(long_label, 'b', 64);
    strcpy(long_label + 64, ".example");
    const char *bad[] = {"a..b",           "",
                         long_name,        long_label,
                         "1.2.3.4",        "127.1",
                         "UPPER.example",  "-x.com",
                         "x-.com",         "a.com.",
                         ".a.com",         "a b.com",
                         "a,DNS:evil.com", "*.example.com",
                         "under_score.com"};
    for (size_t i = 0; i < WR_ARRAY_LEN(bad); i++) {
        time_t na;
        X509 *x = signer_client_sign(c, bad[i], tlsmitm_leaf_key(m), &na, &err);
        ok(x == NULL && err.code == EINVAL && strstr(err.msg, "not a normalised host name"),
           "\"%.20s\"%s (%zu bytes): refused by the signer (%s)", bad[i],
           strlen(bad[i]) > 20 ? "..." : "", strlen(bad[i]), err.msg);
        X509_free(x);
    }
    char name253[254];
    memcpy(name253, long_name, 253);
    name253[253] = '\0';
    X509 *x = tlsmitm_leaf(m, name253, &err);
    ok(x && verifies(x, name253), "a 253-byte name is signed, the session went on %s", err.msg);

    struct tlsmitm_stats st, st2;
    tlsmitm_stats(m, &st);
    ok(tlsmitm_leaf(m, "Upper.example", &err) == NULL && strstr(err.msg, "refused"),
       "through tlsmitm_leaf, a refusal is its error (%s)", err.msg);
    tlsmitm_stats(m, &st2);
    ok(st2.cached == st.cached && st2.minted == st.minted, "and is not cached");
    ok(tlsmitm_leaf(m, "api.example.com", &err) == leaf, "the cache still answers");

    /* The client checks the key it is asked to sign for against its HELLO. */
    EVP_PKEY *other = EVP_EC_gen("P-256");
    time_t na;
    ok(signer_client_sign(c, "x.example", other, &na, &err) == NULL && err.code == EINVAL,
       "a leaf key other than the HELLO's: refused by the client (%s)", err.msg);
    EVP_PKEY_free(other);

    tlsmitm_free(m);
    signer_client_free(c);
    ok(reap(pid) == 0, "the client closed: the signer returned 0 and exited");

    /* The other order: the HELLO at signer_client_new. */
    fd = spawn_signer(&pid);
    EVP_PKEY *k = EVP_EC_gen("P-256");
    c = signer_client_new(fd, k, &err);
    x = c ? signer_client_sign(c, "db.internal.example", NULL, &na, &err) : NULL;
    ok(x && verifies(x, "db.internal.example") && EVP_PKEY_eq(X509_get0_pubkey(x), k) == 1,
       "a client given its key at once: the leaf is for that key %s", err.msg);
    ok(x && na > time(NULL) + 6 * 86400 && na <= time(NULL) + 7 * 86400,
       "not_after is a week ahead");
    X509_free(x);
    signer_client_free(c);
    EVP_PKEY_free(k);
    ok(reap(pid) == 0, "and that signer exited 0 too");
}

/* ---- a hostile client ---- */

struct hostile {
    const char *what;
    int hello_first;  /* send a good HELLO (id 1) before the case's datagram */
    uint8_t type;     /* the datagram: a header with id 7 and the body below */
    const void *body; /* NULL: the raw bytes in raw */
    size_t len;
    const uint8_t *raw; /* a datagram given whole */
    size_t raw_len;
    uint32_t err_id; /* the id the ERR must carry */
    const char *why; /* in the ERR's text */
};

static void hostile_one(const struct hostile *h, EVP_PKEY *good)
{
    pid_t pid;
    int fd = spawn_signer(&pid);
    if (h->hello_first)
        send_hello(fd, 1, good);
    if (h->raw)
        send(fd, h->raw, h->raw_len, MSG_NOSIGNAL);
    else
        send_raw(fd, h->type, 7, h->body, h->len);
    char why[256] = "";
    int a = answer(fd, h->err_id, why, sizeof(why));
    int eof = answer(fd, 0, NULL, 0);
    ok(a == 1 && strstr(why, h->why) && eof == 0, "%s: ERR \"%s\", then the session ends", h->what,
       why);
    close(fd);
    ok(reap(pid) == EXIT_VIOLATION, "%s: the signer returned -1 and exited, no crash", h->what);
}

static void hostile(void)
{
    EVP_PKEY *good = EVP_EC_gen("P-256");
    EVP_PKEY *rsa = EVP_RSA_gen(1024);
    EVP_PKEY *p384 = EVP_EC_gen("P-384");
    unsigned char *good_der = NULL, *rsa_der = NULL, *p384_der = NULL;
    int good_len = i2d_PUBKEY(good, &good_der);
    int rsa_len = i2d_PUBKEY(rsa, &rsa_der);
    int p384_len = i2d_PUBKEY(p384, &p384_der);
    uint8_t *trailing = malloc((size_t)good_len + 1);
    memcpy(trailing, good_der, (size_t)good_len);
    trailing[good_len] = 0;
    static const uint8_t shorter[] = {SIGNER_SIGN, 0, 0};
    static uint8_t oversize[SIGNER_MSG_MAX + 1];
    oversize[0] = SIGNER_SIGN;
    put_be32(oversize + 1, 7);
    memset(oversize + SIGNER_HEADER_LEN, 'a', sizeof(oversize) - SIGNER_HEADER_LEN);
    static const char garbage[] = "\x30\x82\xff\xff not DER";
    uint8_t zero = 0;

    const struct hostile cases[] = {
        {"a datagram shorter than the header", 0, 0, NULL, 0, shorter, sizeof(shorter), 0,
         "shorter than its header"},
        {"a datagram of SIGNER_MSG_MAX + 1 bytes", 1, 0, NULL, 0, oversize, sizeof(oversize), 7,
         "over SIGNER_MSG_MAX"},
        {"an unknown type", 1, 0x7f, "x", 1, NULL, 0, 7, "unknown type 0x7f"},
        {"a CERT sent to the signer", 1, SIGNER_CERT, "12345678x", 9, NULL, 0, 7,
         "unknown type 0x81"},
        {"a SIGN before the HELLO", 0, SIGNER_SIGN, "api.example.com", 15, NULL, 0, 7,
         "before the HELLO"},
        {"a second HELLO", 1, SIGNER_HELLO, good_der, (size_t)good_len, NULL, 0, 7,
         "a second HELLO"},
        {"a HELLO with an RSA key", 0, SIGNER_HELLO, rsa_der, (size_t)rsa_len, NULL, 0, 7,
         "not EC P-256"},
        {"a HELLO with a P-384 key", 0, SIGNER_HELLO, p384_der, (size_t)p384_len, NULL, 0, 7,
         "not EC P-256"},
        {"a HELLO with garbage", 0, SIGNER_HELLO, garbage, sizeof(garbage) - 1, NULL, 0, 7,
         "does not hold a public key"},
        {"a HELLO cut short", 0, SIGNER_HELLO, good_der, (size_t)good_len - 10, NULL, 0, 7,
         "does not hold a public key"},
        {"an empty HELLO", 0, SIGNER_HELLO, "", 0, NULL, 0, 7, "does not hold a public key"},
        {"a HELLO with a byte after its key", 0, SIGNER_HELLO, trailing, (size_t)good_len + 1, NULL,
         0, 7, "bytes after its key"},
        {"a HELLO of a single 0", 0, SIGNER_HELLO, &zero, 1, NULL, 0, 7,
         "does not hold a public key"},
    };
    for (size_t i = 0; i < WR_ARRAY_LEN(cases); i++)
        hostile_one(&cases[i], good);

    /* Not violations: a SIGN of exactly SIGNER_MSG_MAX bytes and one with a NUL in its name
     * are refused, and the session goes on. */
    pid_t pid;
    int fd = spawn_signer(&pid);
    send_hello(fd, 1, good);
    send_raw(fd, SIGNER_SIGN, 2, oversize + SIGNER_HEADER_LEN, SIGNER_MSG_MAX - SIGNER_HEADER_LEN);
    send_raw(fd, SIGNER_SIGN, 3, "a\0b.example", 11);
    send_raw(fd, SIGNER_SIGN, 4, "ok.example", 10);
    char why[256] = "";
    ok(answer(fd, 2, why, sizeof(why)) == 1, "a SIGN of exactly SIGNER_MSG_MAX bytes: ERR (%s)",
       why);
    ok(answer(fd, 3, why, sizeof(why)) == 1, "a name with a NUL in it: ERR (%s)", why);
    ok(answer(fd, 4, NULL, 0) == 2, "then a good SIGN gets its CERT, with its id");
    /* An empty datagram cannot be told from a close on SOCK_SEQPACKET; the signer takes it so. */
    send(fd, "", 0, MSG_NOSIGNAL);
    ok(answer(fd, 0, NULL, 0) == 0, "an empty datagram: the signer ends the session");
    close(fd);
    ok(reap(pid) == 0, "as at a close (exit 0)");

    free(trailing);
    OPENSSL_free(good_der);
    OPENSSL_free(rsa_der);
    OPENSSL_free(p384_der);
    EVP_PKEY_free(good);
    EVP_PKEY_free(rsa);
    EVP_PKEY_free(p384);
}

/* ---- a signer that dies, one that refuses the HELLO, one that never answers ---- */

static void dying(void)
{
    struct wr_err err = {0};
    EVP_PKEY *k = EVP_EC_gen("P-256");
    pid_t pid;
    int fd = spawn_signer(&pid);
    struct signer_client *c = signer_client_new(fd, k, &err);
    time_t na;
    X509 *x = signer_client_sign(c, "first.example", NULL, &na, &err);
    ok(x != NULL, "a leaf before the signer dies %s", err.msg);
    X509_free(x);
    kill(pid, SIGKILL);
    ok(reap(pid) == 128 + SIGKILL, "the signer is killed");
    ok(signer_client_sign(c, "second.example", NULL, &na, &err) == NULL && err.code == EPIPE,
       "then signing fails with EPIPE, not a timeout (%s)", err.msg);
    ok(signer_client_sign(c, "third.example", NULL, &na, &err) == NULL && err.code == EPIPE,
       "and so does every later call (%s)", err.msg);
    signer_client_free(c);

    /* A HELLO the signer refuses: the client reports the signer's reason. */
    pid_t pid2;
    fd = spawn_signer(&pid2);
    EVP_PKEY *rsa = EVP_RSA_gen(1024);
    c = signer_client_new(fd, rsa, &err);
    ok(c && signer_client_sign(c, "a.example", NULL, &na, &err) == NULL && err.code == EPROTO &&
           strstr(err.msg, "not EC P-256"),
       "a HELLO the signer refuses: EPROTO with its reason (%s)", err.msg);
    signer_client_free(c);
    ok(reap(pid2) == EXIT_VIOLATION, "and that signer ended the session");
    EVP_PKEY_free(rsa);
    EVP_PKEY_free(k);
}

/* Reads a request from the fake signer's end: its type, id and body (NUL-terminated). */
static int read_request(int fd, uint8_t *type, uint32_t *id, char *body, size_t cap)
{
    ssize_t n = recv_raw(fd, rbuf, sizeof(rbuf));
    if (n < SIGNER_HEADER_LEN || (size_t)n - SIGNER_HEADER_LEN >= cap)
        return -1;
    *type = rbuf[0];
    *id = get_be32(rbuf + 1);
    memcpy(body, rbuf + SIGNER_HEADER_LEN, (size_t)n - SIGNER_HEADER_LEN);
    body[n - SIGNER_HEADER_LEN] = '\0';
    return (int)(n - SIGNER_HEADER_LEN);
}

static int send_cert(int fd, uint32_t id, const char *host, EVP_PKEY *k)
{
    time_t na;
    X509 *x = tlsmitm_mint(ca, ca_key, k, host, &na);
    uint8_t buf[4096];
    put_be64(buf, (uint64_t)na);
    unsigned char *p = buf + 8;
    int n = i2d_X509(x, &p);
    X509_free(x);
    return send_raw(fd, SIGNER_CERT, id, buf, 8 + (size_t)n);
}

static void silent(void)
{
    struct wr_err err = {0};
    EVP_PKEY *k = EVP_EC_gen("P-256");
    int sv[2];
    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
    struct signer_client *c = signer_client_new(sv[0], k, &err);
    signer_client_set_timeout(c, 50);
    time_t na;
    ok(signer_client_sign(c, "slow.example", NULL, &na, &err) == NULL && err.code == ETIMEDOUT,
       "a signer that never answers: ETIMEDOUT (%s)", err.msg);

    uint8_t type;
    uint32_t hello_id, sign_id;
    char body[SIGNER_MSG_MAX];
    int n = read_request(sv[1], &type, &hello_id, body, sizeof(body));
    ok(n > 0 && type == SIGNER_HELLO && hello_id != 0, "on the wire: a HELLO first (id %u)",
       hello_id);
    n = read_request(sv[1], &type, &sign_id, body, sizeof(body));
    ok(n == 12 && type == SIGNER_SIGN && strcmp(body, "slow.example") == 0 && sign_id != hello_id,
       "then SIGN slow.example, with an id of its own (%u)", sign_id);

    /* The late answer to the request that timed out comes, then the answer to the next one
     * (ids go up by one). The client must take the second. */
    send_cert(sv[1], sign_id, "slow.example", k);
    send_cert(sv[1], sign_id + 1, "api.example.com", k);
    X509 *x = signer_client_sign(c, "api.example.com", NULL, &na, &err);
    ok(names(x, "api.example.com") && !names(x, "slow.example"),
       "the late answer is dropped, the right one taken %s", err.msg);
    X509_free(x);
    read_request(sv[1], &type, &sign_id, body, sizeof(body));

    /* An answer to another id that is an ERR is dropped the same way. */
    send_raw(sv[1], SIGNER_ERR, sign_id + 5, "stale", 5);
    send_raw(sv[1], SIGNER_ERR, sign_id + 1, "no \x01 thanks", 11);
    ok(signer_client_sign(c, "b.example", NULL, &na, &err) == NULL && err.code == EINVAL &&
           strstr(err.msg, "no ? thanks") && !strstr(err.msg, "stale"),
       "an ERR to this request: EINVAL with its text, made printable (%s)", err.msg);
    read_request(sv[1], &type, &sign_id, body, sizeof(body));

    /* A malformed answer ends the session. */
    send_raw(sv[1], SIGNER_CERT, sign_id + 1, "\0\0\0\0\0\0\0\0not DER", 15);
    ok(signer_client_sign(c, "c.example", NULL, &na, &err) == NULL && err.code == EPROTO,
       "a CERT whose certificate is not DER: EPROTO (%s)", err.msg);
    ok(signer_client_sign(c, "d.example", NULL, &na, &err) == NULL && err.code == EPROTO,
       "and the session is over (%s)", err.msg);
    signer_client_free(c);
    close(sv[1]);

    /* An ERR without an id (the signer could not read one) ends the session too, as does a
     * datagram over SIGNER_MSG_MAX. */
    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
    c = signer_client_new(sv[0], k, &err);
    send_raw(sv[1], SIGNER_ERR, 0, "a message shorter than its header", 33);
    ok(signer_client_sign(c, "e.example", NULL, &na, &err) == NULL && err.code == EPROTO &&
           strstr(err.msg, "ended the session: a message shorter"),
       "an ERR with id 0: the session is over (%s)", err.msg);
    signer_client_free(c);
    close(sv[1]);
    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
    c = signer_client_new(sv[0], k, &err);
    static uint8_t big[SIGNER_MSG_MAX + 1];
    big[0] = SIGNER_CERT;
    put_be32(big + 1, 2);
    send(sv[1], big, sizeof(big), 0);
    ok(signer_client_sign(c, "f.example", NULL, &na, &err) == NULL && err.code == EPROTO,
       "an answer over SIGNER_MSG_MAX: EPROTO (%s)", err.msg);
    signer_client_free(c);
    close(sv[1]);
    EVP_PKEY_free(k);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    snprintf(cert_path, sizeof(cert_path), "%s/ca.pem", dir);
    snprintf(key_path, sizeof(key_path), "%s/ca.key", dir);
    struct wr_err err = {0};
    ok(tlsmitm_ca_create(cert_path, key_path, "signer test CA", &err) == 0, "tlsmitm_ca_create %s",
       err.msg);
    ca_pem = read_text(cert_path);
    FILE *f = fopen(key_path, "r");
    ca_key = f ? PEM_read_PrivateKey(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    f = fopen(cert_path, "r");
    ca = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    ok(ca_pem && ca && ca_key, "the CA reads back");

    ok(signer_serve(-1, ca, ca_key, &err) < 0 && err.code == EINVAL, "signer_serve: bad fd");
    EVP_PKEY *stranger = EVP_EC_gen("P-256");
    int sp[2];
    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp);
    ok(signer_serve(sp[1], ca, stranger, &err) < 0 && strstr(err.msg, "does not match"),
       "signer_serve with a key not the CA's: refused (%s)", err.msg);
    close(sp[0]);
    close(sp[1]);
    EVP_PKEY_free(stranger);
    int st[2];
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, st);
    ok(signer_serve(st[1], ca, ca_key, &err) < 0 && strstr(err.msg, "SOCK_SEQPACKET"),
       "signer_serve on a stream socket: refused (%s)", err.msg);
    ok(signer_client_new(st[0], NULL, &err) == NULL && strstr(err.msg, "SOCK_SEQPACKET") &&
           fcntl(st[0], F_GETFD) < 0,
       "signer_client_new on a stream socket: refused, the socket closed");
    close(st[1]);

    leaves();
    hostile();
    dying();
    silent();

    X509_free(ca);
    EVP_PKEY_free(ca_key);
    free(ca_pem);
    unlink(cert_path);
    unlink(key_path);
    rmdir(dir);
    return tap_done();
}
