/*
 * net/tlsmitm.h: the CA files as the daemon will find them (modes, constraints), the leaves as a
 * sandbox's TLS client will judge them (name, purpose, issuer, validity), the cache, and the
 * errors tlsmitm_new reports for files that are missing or do not belong together; then a
 * tlsmitm without the CA key (tlsmitm_new_signed) and what it does with what its sign function
 * answers, right or wrong.
 */
#include <errno.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "net/tlsmitm.h"
#include "tap.h"

static char dir[] = "/tmp/wr-tlsmitm-XXXXXX";

static const char *path(const char *name)
{
    static char buf[8][256];
    static int i;
    char *p = buf[i++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static X509 *load_cert(const char *p)
{
    FILE *f = fopen(p, "r");
    if (!f)
        return NULL;
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    return x;
}

static int mode_of(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

static int critical(X509 *x, int nid)
{
    int at = X509_get_ext_by_NID(x, nid, -1);
    return at >= 0 && X509_EXTENSION_get_critical(X509_get_ext(x, at));
}

/* Seconds from now to t (negative: in the past). */
static long from_now(const ASN1_TIME *t)
{
    int days = 0, secs = 0;
    ASN1_TIME_diff(&days, &secs, NULL, t);
    return (long)days * 86400 + secs;
}

static void ca(void)
{
    struct wr_err err = {0};
    umask(022);
    ok(tlsmitm_ca_create(path("ca.pem"), path("ca.key"), "withruntime test CA", &err) == 0,
       "tlsmitm_ca_create %s", err.msg);
    ok(mode_of(path("ca.key")) == 0600 && mode_of(path("ca.pem")) == 0644,
       "the key is 0600, the certificate 0644 (%o, %o)", mode_of(path("ca.key")),
       mode_of(path("ca.pem")));
    ok(access(path("ca.pem.tmp"), F_OK) < 0, "no temporary file left");

    X509 *x = load_cert(path("ca.pem"));
    ok(x != NULL, "the certificate reads as PEM");
    ok(X509_get_version(x) == X509_VERSION_3, "X.509 v3");
    ok(X509_check_ca(x) == 1 && critical(x, NID_basic_constraints),
       "basicConstraints CA:TRUE, critical");
    ok((X509_get_extension_flags(x) & EXFLAG_KUSAGE) &&
           X509_get_key_usage(x) == (KU_KEY_CERT_SIGN | KU_CRL_SIGN) && critical(x, NID_key_usage),
       "keyUsage keyCertSign+cRLSign only, critical");
    ok(X509_get0_subject_key_id(x) != NULL, "a subjectKeyIdentifier");
    ok(X509_check_issued(x, x) == X509_V_OK, "self-signed");
    EVP_PKEY *k = X509_get0_pubkey(x);
    char group[64] = "";
    size_t glen = 0;
    ok(k && EVP_PKEY_is_a(k, "EC") &&
           EVP_PKEY_get_utf8_string_param(k, "group", group, sizeof(group), &glen) &&
           strcmp(group, "prime256v1") == 0,
       "an EC P-256 key (%s)", group);
    long left = from_now(X509_get0_notAfter(x));
    ok(left > 3649L * 86400 && left <= 3650L * 86400, "valid for 10 years (%ld days)",
       left / 86400);
    char cn[128] = "";
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
    ok(strcmp(cn, "withruntime test CA") == 0, "CN is the name given");
    X509_free(x);

    ok(tlsmitm_ca_create(path("ca.pem"), path("ca.key"), "again", &err) < 0 && err.code == EEXIST,
       "over an existing CA: EEXIST (%s)", err.msg);
    x = load_cert(path("ca.pem"));
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
    ok(strcmp(cn, "withruntime test CA") == 0, "and the existing one is untouched");
    X509_free(x);
    ok(tlsmitm_ca_create(path("ca2.pem"), path("ca.key"), "again", &err) < 0 &&
           access(path("ca2.pem"), F_OK) < 0,
       "over an existing key: fails, nothing left behind");
    ok(tlsmitm_ca_create(path("nodir/ca.pem"), path("nodir/ca.key"), "x", &err) < 0 &&
           err.code == ENOENT,
       "into a missing directory: ENOENT");
}

static void leaves(void)
{
    struct wr_err err = {0};
    struct tlsmitm *m = tlsmitm_new(path("ca.pem"), path("ca.key"), NULL, &err);
    ok(m != NULL, "tlsmitm_new %s", err.msg);
    X509 *caf = tlsmitm_ca_cert(m);

    X509 *leaf = tlsmitm_leaf(m, "allowed.test", &err);
    ok(leaf != NULL, "a leaf for allowed.test %s", err.msg);
    ok(X509_check_host(leaf, "allowed.test", 0, 0, NULL) == 1 &&
           X509_check_host(leaf, "evil.test", 0, 0, NULL) != 1 &&
           X509_check_host(leaf, "x.allowed.test", 0, 0, NULL) != 1,
       "its SAN names allowed.test and nothing else");
    GENERAL_NAMES *san = X509_get_ext_d2i(leaf, NID_subject_alt_name, NULL, NULL);
    ok(san && sk_GENERAL_NAME_num(san) == 1 && sk_GENERAL_NAME_value(san, 0)->type == GEN_DNS,
       "one SAN, a DNS name");
    GENERAL_NAMES_free(san);
    ok((X509_get_extension_flags(leaf) & EXFLAG_XKUSAGE) &&
           X509_get_extended_key_usage(leaf) == XKU_SSL_SERVER,
       "EKU serverAuth only");
    ok(X509_check_ca(leaf) == 0, "not a CA");
    ok(X509_check_issued(caf, leaf) == X509_V_OK, "issued by the CA");
    const ASN1_OCTET_STRING *akid = X509_get0_authority_key_id(leaf);
    const ASN1_OCTET_STRING *skid = X509_get0_subject_key_id(caf);
    ok(akid && skid && ASN1_OCTET_STRING_cmp(akid, skid) == 0,
       "authorityKeyIdentifier is the CA's key id");
    long nb = from_now(X509_get0_notBefore(leaf)), na = from_now(X509_get0_notAfter(leaf));
    ok(nb <= -3590 && nb >= -3610, "notBefore an hour ago (%ld s)", nb);
    ok(na >= 7 * 86400 - 10 && na <= 7 * 86400, "notAfter in 7 days (%ld s)", na);

    X509_STORE *store = X509_STORE_new();
    X509_STORE_add_cert(store, caf);
    X509_STORE_CTX *vctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(vctx, store, leaf, NULL);
    X509_STORE_CTX_set_purpose(vctx, X509_PURPOSE_SSL_SERVER);
    X509_VERIFY_PARAM_set1_host(X509_STORE_CTX_get0_param(vctx), "allowed.test", 0);
    int v = X509_verify_cert(vctx);
    ok(v == 1, "verifies against the CA as a server for allowed.test (%s)",
       X509_verify_cert_error_string(X509_STORE_CTX_get_error(vctx)));
    X509_STORE_CTX_free(vctx);
    X509_STORE_free(store);

    BIGNUM *s1 = ASN1_INTEGER_to_BN(X509_get0_serialNumber(leaf), NULL);
    X509 *other = tlsmitm_leaf(m, "other.test", &err);
    BIGNUM *s2 = ASN1_INTEGER_to_BN(X509_get0_serialNumber(other), NULL);
    ok(BN_num_bits(s1) > 64 && BN_num_bits(s1) <= 128 && BN_cmp(s1, s2) != 0,
       "serials are random, up to 128 bits (%d bits), and differ", BN_num_bits(s1));
    BN_free(s1);
    BN_free(s2);

    ok(tlsmitm_leaf(m, "allowed.test", &err) == leaf, "the second ask gets the cached leaf");
    SSL *ssl = tlsmitm_server_ssl(m, "allowed.test", &err);
    ok(ssl && SSL_get_certificate(ssl) == leaf,
       "and a server SSL for it carries that same certificate");
    SSL_free(ssl);
    struct tlsmitm_stats st;
    tlsmitm_stats(m, &st);
    ok(st.minted == 2 && st.cache_hits == 2 && st.cached == 2, "2 minted, 2 hits (%llu, %llu)",
       (unsigned long long)st.minted, (unsigned long long)st.cache_hits);

    ssl = tlsmitm_client_ssl(m, "allowed.test", &err);
    ok(ssl && SSL_get_verify_mode(ssl) == SSL_VERIFY_PEER &&
           strcmp(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name), "allowed.test") == 0 &&
           strcmp(X509_VERIFY_PARAM_get0_host(SSL_get0_param(ssl), 0), "allowed.test") == 0,
       "a client SSL: peer verified, SNI and expected host set");
    SSL_free(ssl);

    /* The cache keeps TLSMITM_CACHE_MAX hosts and drops the least recently used one. */
    char name[64];
    for (int i = 0; i < TLSMITM_CACHE_MAX - 2; i++) {
        snprintf(name, sizeof(name), "h%d.test", i);
        tlsmitm_leaf(m, name, &err);
    }
    tlsmitm_leaf(m, "allowed.test", &err); /* other.test is now the oldest */
    tlsmitm_stats(m, &st);
    ok(st.cached == TLSMITM_CACHE_MAX, "the cache is full (%u)", st.cached);
    tlsmitm_leaf(m, "one-more.test", &err);
    tlsmitm_stats(m, &st);
    uint64_t minted = st.minted;
    ok(st.cached == TLSMITM_CACHE_MAX, "one more host: still %u cached", st.cached);
    ok(tlsmitm_leaf(m, "allowed.test", &err) == leaf, "the recently used one stayed");
    tlsmitm_leaf(m, "other.test", &err);
    tlsmitm_stats(m, &st);
    ok(st.minted == minted + 1, "the least recently used one was dropped (minted again)");
    ok(tlsmitm_leaf(m, "", &err) == NULL, "an empty host: refused");
    tlsmitm_free(m);
}

static int verifies(X509 *caf, X509 *leaf, const char *host)
{
    X509_STORE *store = X509_STORE_new();
    X509_STORE_add_cert(store, caf);
    X509_STORE_CTX *vctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(vctx, store, leaf, NULL);
    X509_STORE_CTX_set_purpose(vctx, X509_PURPOSE_SSL_SERVER);
    X509_VERIFY_PARAM_set1_host(X509_STORE_CTX_get0_param(vctx), host, 0);
    int v = X509_verify_cert(vctx);
    X509_STORE_CTX_free(vctx);
    X509_STORE_free(store);
    return v == 1;
}

/* Names longer than a CN can hold (64) are in the SAN only, which is then critical. */
static void long_names(void)
{
    struct wr_err err = {0};
    struct tlsmitm *m = tlsmitm_new(path("ca.pem"), path("ca.key"), NULL, &err);
    char host[254];
    memset(host, 'a', 253);
    for (int i = 63; i < 253; i += 64)
        host[i] = '.';
    host[253] = '\0';
    X509 *leaf = tlsmitm_leaf(m, host, &err);
    ok(leaf && verifies(tlsmitm_ca_cert(m), leaf, host),
       "a 253-byte name gets a leaf that verifies for it %s", err.msg);
    ok(leaf && X509_NAME_entry_count(X509_get_subject_name(leaf)) == 0 &&
           critical(leaf, NID_subject_alt_name),
       "with an empty subject and a critical SAN");
    host[64] = '\0';
    host[63] = 'a';
    leaf = tlsmitm_leaf(m, host, &err);
    char cn[128] = "";
    if (leaf)
        X509_NAME_get_text_by_NID(X509_get_subject_name(leaf), NID_commonName, cn, sizeof(cn));
    ok(leaf && strcmp(cn, host) == 0 && !critical(leaf, NID_subject_alt_name),
       "a 64-byte label still gets its CN, and a SAN not critical");
    tlsmitm_free(m);
}

/* ---- without the CA key ---- */

static X509 *ca_x;
static EVP_PKEY *ca_k, *b_k;

enum fake { FAKE_RIGHT, FAKE_OTHER_HOST, FAKE_OTHER_KEY, FAKE_OTHER_CA, FAKE_WRONG_END, FAKE_FAIL };

/* A sign function that answers as *mode says, and counts its calls. */
static int fake_calls;
static X509 *fake_sign(void *ctx, const char *host, EVP_PKEY *leaf_pub, time_t *not_after,
                       struct wr_err *err)
{
    enum fake mode = *(enum fake *)ctx;
    fake_calls++;
    if (mode == FAKE_FAIL) {
        wr_err_set(err, EIO, "fake: cannot");
        return NULL;
    }
    EVP_PKEY *other = mode == FAKE_OTHER_KEY ? EVP_EC_gen("P-256") : NULL;
    X509 *x = tlsmitm_mint(ca_x, mode == FAKE_OTHER_CA ? b_k : ca_k, other ? other : leaf_pub,
                           mode == FAKE_OTHER_HOST ? "other.test" : host, not_after);
    EVP_PKEY_free(other);
    if (mode == FAKE_WRONG_END)
        *not_after += 3600;
    return x;
}

static void signed_elsewhere(void)
{
    struct wr_err err = {0};
    FILE *f = fopen(path("ca.key"), "r");
    ca_k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    f = fopen(path("b.key"), "r");
    b_k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    ca_x = load_cert(path("ca.pem"));
    char pem[8192] = "";
    f = fopen(path("ca.pem"), "r");
    fread(pem, 1, sizeof(pem) - 1, f);
    fclose(f);

    enum fake mode = FAKE_RIGHT;
    ok(tlsmitm_new_signed("not PEM", fake_sign, &mode, NULL, &err) == NULL && err.code == EINVAL,
       "tlsmitm_new_signed with no certificate in the PEM: refused (%s)", err.msg);
    ok(tlsmitm_new_signed(pem, NULL, NULL, NULL, &err) == NULL && err.code == EINVAL,
       "without a sign function: refused");
    struct tlsmitm *m = tlsmitm_new_signed(pem, fake_sign, &mode, NULL, &err);
    ok(m != NULL, "tlsmitm_new_signed %s", err.msg);
    EVP_PKEY *pub = tlsmitm_leaf_key(m);
    BIGNUM *priv = NULL;
    ok(pub && EVP_PKEY_is_a(pub, "EC") &&
           !EVP_PKEY_get_bn_param(pub, OSSL_PKEY_PARAM_PRIV_KEY, &priv),
       "tlsmitm_leaf_key: an EC key without its private half");
    BN_free(priv);

    /* A leaf's PEM is not a CA's. */
    X509 *leaf = tlsmitm_leaf(m, "allowed.test", &err);
    ok(leaf && verifies(ca_x, leaf, "allowed.test") &&
           EVP_PKEY_eq(X509_get0_pubkey(leaf), pub) == 1,
       "a leaf through the sign function verifies and carries the leaf key %s", err.msg);
    BIO *bio = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(bio, leaf);
    char leaf_pem[8192] = "";
    BIO_read(bio, leaf_pem, sizeof(leaf_pem) - 1);
    BIO_free(bio);
    ok(tlsmitm_new_signed(leaf_pem, fake_sign, &mode, NULL, &err) == NULL &&
           strstr(err.msg, "not a CA"),
       "a PEM that is not a CA's: refused (%s)", err.msg);

    /* What the sign function answers is checked, and a failure is not cached. */
    struct {
        enum fake mode;
        const char *what, *why;
    } wrong[] = {
        {FAKE_OTHER_HOST, "a certificate for another host", "does not name the host"},
        {FAKE_OTHER_KEY, "a certificate for another key", "not for the leaf key"},
        {FAKE_OTHER_CA, "a certificate signed by another key", "not signed by the CA"},
        {FAKE_WRONG_END, "a not_after other than the certificate's", "notAfter"},
        {FAKE_FAIL, "a failure", "fake: cannot"},
    };
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        struct tlsmitm_stats before, after;
        tlsmitm_stats(m, &before);
        mode = wrong[i].mode;
        int calls = fake_calls;
        ok(tlsmitm_leaf(m, "new.test", &err) == NULL && strstr(err.msg, wrong[i].why),
           "%s: refused (%s)", wrong[i].what, err.msg);
        tlsmitm_stats(m, &after);
        ok(after.cached == before.cached && after.minted == before.minted &&
               tlsmitm_leaf(m, "new.test", &err) == NULL && fake_calls == calls + 2,
           "%s: not cached, the next ask signs again", wrong[i].what);
    }
    mode = FAKE_RIGHT;
    ok(tlsmitm_leaf(m, "new.test", &err) != NULL, "then a right answer is taken %s", err.msg);
    ok(tlsmitm_leaf(m, "allowed.test", &err) == leaf, "and the earlier leaf is still cached");
    tlsmitm_free(m);

    /* tlsmitm_mint builds the SAN as a value: a ',' in a name adds no name. */
    time_t na;
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = tlsmitm_mint(ca_x, ca_k, k, "a.test,DNS:evil.test", &na);
    ok(x && X509_check_host(x, "evil.test", 0, 0, NULL) != 1 &&
           X509_check_host(x, "a.test", 0, 0, NULL) != 1,
       "tlsmitm_mint of \"a.test,DNS:evil.test\" names neither a.test nor evil.test");
    X509_free(x);
    ok(tlsmitm_mint(ca_x, ca_k, k, "", &na) == NULL &&
           tlsmitm_mint(ca_x, NULL, k, "a", &na) == NULL,
       "tlsmitm_mint without a host or a key: NULL");
    EVP_PKEY_free(k);
    X509_free(ca_x);
    EVP_PKEY_free(ca_k);
    EVP_PKEY_free(b_k);
}

static void errors(void)
{
    struct wr_err err = {0};
    ok(tlsmitm_new(path("missing.pem"), path("ca.key"), NULL, &err) == NULL && err.code == ENOENT,
       "a missing certificate: ENOENT (%s)", err.msg);
    ok(tlsmitm_new(path("ca.pem"), path("missing.key"), NULL, &err) == NULL && err.code == ENOENT,
       "a missing key: ENOENT");
    ok(tlsmitm_ca_create(path("b.pem"), path("b.key"), "other CA", &err) == 0, "a second CA");
    ok(tlsmitm_new(path("ca.pem"), path("b.key"), NULL, &err) == NULL && err.code == EINVAL &&
           strstr(err.msg, "does not match"),
       "a key of another CA: refused (%s)", err.msg);
    ok(tlsmitm_new(path("ca.key"), path("ca.key"), NULL, &err) == NULL && err.code == EINVAL,
       "a key where the certificate goes: refused");
    ok(tlsmitm_new(path("ca.pem"), path("ca.key"), path("missing-extra.pem"), &err) == NULL,
       "a missing extra upstream CA file: refused (%s)", err.msg);
    struct tlsmitm *m = tlsmitm_new(path("ca.pem"), path("ca.key"), path("b.pem"), &err);
    ok(m != NULL, "an extra upstream CA file that exists: fine %s", err.msg);
    tlsmitm_free(m);
    tlsmitm_free(NULL);
}

int main(void)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    ca();
    leaves();
    long_names();
    errors();
    signed_elsewhere();
    const char *names[] = {"ca.pem", "ca.key", "b.pem", "b.key"};
    for (size_t i = 0; i < 4; i++)
        unlink(path(names[i]));
    rmdir(dir);
    return tap_done();
}
