/*
 * Fuzz target: the signer's side of a session (net/signer.h), fed what a hostile client could
 * send. The input is a sequence of datagrams, each after a 2-byte big-endian length (up to 65535,
 * so datagrams over SIGNER_MSG_MAX are reachable). Each goes through signer_handle on one
 * session, as signer_serve would pass it, and the answer must be one the client can read: at most
 * SIGNER_MSG_MAX bytes, a well-formed CERT or ERR with the request's id (0 if it had none), an
 * ERR whenever the session ends, nothing for an accepted HELLO, and a CERT only for a SIGN after
 * a HELLO, its certificate naming exactly the host asked for (a normalised name), carrying the
 * HELLO's key and issued by the CA. Every datagram also goes through signer_answer_parse, the
 * client's reader, which must keep within it.
 */
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "net/netpolicy.h"
#include "net/signer.h"
#include "net/tlsmitm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Each SIGN costs a signature: enough datagrams for any ordering of HELLO, SIGN and junk. */
#define MAX_DATAGRAMS 32

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

static X509 *ca;
static EVP_PKEY *ca_key;

/* The CA, made once per process in a scratch directory that is removed at once. */
static void make_ca(void)
{
    char dir[] = "/tmp/wr-fuzz-signer-XXXXXX", cert[64], key[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cert, sizeof(cert), "%s/ca.pem", dir);
    snprintf(key, sizeof(key), "%s/ca.key", dir);
    struct wr_err err = {0};
    CHECK(tlsmitm_ca_create(cert, key, "fuzz CA", &err) == 0);
    FILE *f = fopen(cert, "r");
    ca = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    f = fopen(key, "r");
    ca_key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    unlink(cert);
    unlink(key);
    rmdir(dir);
    CHECK(ca && ca_key);
}

/* The client's reader keeps within the datagram and reads only CERT and ERR. */
static void check_parse(const uint8_t *msg, size_t len)
{
    struct signer_answer a;
    if (signer_answer_parse(msg, len, &a) < 0)
        return;
    CHECK(a.type == SIGNER_CERT || a.type == SIGNER_ERR);
    CHECK(a.body >= msg && a.body + a.body_len == msg + len && a.body_len > 0);
    CHECK(a.type != SIGNER_ERR || a.body_len <= SIGNER_ERR_TEXT_MAX);
}

/* A CERT answer to SIGN body[len]: only for a name the proxy could ask for, and for it alone. */
static void check_cert(const struct signer_session *s, const struct signer_answer *a,
                       const uint8_t *body, size_t len)
{
    char host[254], norm[254];
    CHECK(s->leaf_pub != NULL);
    CHECK(len >= 1 && len <= 253 && !memchr(body, 0, len));
    memcpy(host, body, len);
    host[len] = '\0';
    CHECK(netpolicy_host(host, norm, sizeof(norm)) == 0 && strcmp(host, norm) == 0);
    const unsigned char *p = a->body;
    X509 *x = d2i_X509(NULL, &p, (long)a->body_len);
    CHECK(x && p == a->body + a->body_len);
    CHECK(X509_check_host(x, host, len, X509_CHECK_FLAG_NO_WILDCARDS, NULL) == 1);
    GENERAL_NAMES *san = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    CHECK(san && sk_GENERAL_NAME_num(san) == 1);
    GENERAL_NAMES_free(san);
    CHECK(EVP_PKEY_eq(X509_get0_pubkey(x), s->leaf_pub) == 1);
    CHECK(X509_check_issued(ca, x) == X509_V_OK && X509_verify(x, X509_get0_pubkey(ca)) == 1);
    CHECK(X509_check_ca(x) == 0);
    X509_free(x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t answer[SIGNER_MSG_MAX];
    if (!ca)
        make_ca();
    struct signer_session s = {.ca = ca, .ca_key = ca_key};
    for (int i = 0; i < MAX_DATAGRAMS && size >= 2; i++) {
        size_t len = get_be16(data);
        data += 2;
        size -= 2;
        if (len > size)
            len = size;
        const uint8_t *msg = data;
        data += len;
        size -= len;
        check_parse(msg, len);

        int had_hello = s.leaf_pub != NULL;
        size_t answer_len = 12345;
        struct wr_err err = {0};
        int r = signer_handle(&s, msg, len, answer, &answer_len, &err);
        CHECK(r == 0 || r == -1);
        CHECK(answer_len <= SIGNER_MSG_MAX);
        if (r < 0)
            CHECK(answer_len > 0 && err.msg[0]);
        if (answer_len == 0) { /* only an accepted HELLO goes unanswered */
            CHECK(r == 0 && len >= SIGNER_HEADER_LEN && msg[0] == SIGNER_HELLO && !had_hello &&
                  s.leaf_pub);
            continue;
        }
        struct signer_answer a;
        CHECK(signer_answer_parse(answer, answer_len, &a) == 0);
        CHECK(a.id == (len >= SIGNER_HEADER_LEN ? get_be32(msg + 1) : 0));
        if (r < 0) {
            CHECK(a.type == SIGNER_ERR);
            break; /* the session is over */
        }
        CHECK(len >= SIGNER_HEADER_LEN && msg[0] == SIGNER_SIGN && had_hello);
        if (a.type == SIGNER_CERT)
            check_cert(&s, &a, msg + SIGNER_HEADER_LEN, len - SIGNER_HEADER_LEN);
    }
    signer_session_clear(&s);
    return 0;
}
