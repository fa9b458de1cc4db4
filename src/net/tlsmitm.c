/*
 * TLS interception for the egress proxy: the CA, leaf minting and its cache, the two SSL_CTXs.
 * See tlsmitm.h. tlsmitm_new is tlsmitm_new_signed with a sign function of its own (sign_here,
 * over the key it loaded), so both take one path through the cache and the checks. The cache is an
 * array searched linearly: TLSMITM_CACHE_MAX short string compares per new connection cost far less
 * than the handshake that follows, and need no second structure to keep consistent.
 */
#include "net/tlsmitm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define TLSMITM_CN_MAX 64

/* ALPN in wire format: the only protocol spoken through the proxy's interception. */
static const unsigned char alpn_http11[] = "\x08http/1.1";
#define ALPN_HTTP11_LEN (sizeof(alpn_http11) - 1)

struct leaf {
    char *host;
    X509 *cert;
    time_t not_after;
    uint64_t used; /* m->clock when last handed out */
};

struct tlsmitm {
    X509 *ca;
    EVP_PKEY *ca_key; /* tlsmitm_new's, for sign_here; NULL in a tlsmitm_new_signed */
    time_t ca_not_after;
    tlsmitm_sign_fn sign;
    void *sign_ctx;
    EVP_PKEY *leaf_key; /* the private key, for the server SSLs */
    EVP_PKEY *leaf_pub; /* its public half only, for the sign function */
    SSL_CTX *server, *client;
    struct leaf cache[TLSMITM_CACHE_MAX];
    unsigned ncache;
    uint64_t clock;
    struct tlsmitm_stats stats;
};

/* Sets err to msg and the first queued OpenSSL error (the queue is cleared). Returns -1. */
static int ssl_err(struct wr_err *err, int code, const char *msg)
{
    unsigned long e = ERR_get_error();
    char text[256] = "";
    if (e)
        ERR_error_string_n(e, text, sizeof(text));
    ERR_clear_error();
    return wr_err_set(err, code, "%s%s%s", msg, text[0] ? ": " : "", text);
}

static EVP_PKEY *p256_key(void)
{
    return EVP_EC_gen("P-256");
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!ext)
        return -1;
    int r = X509_add_ext(cert, ext, -1) ? 0 : -1;
    X509_EXTENSION_free(ext);
    return r;
}

static int random_serial(X509 *cert)
{
    BIGNUM *bn = BN_new();
    int r = -1;
    if (bn && BN_rand(bn, 128, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) &&
        BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)))
        r = 0;
    BN_free(bn);
    return r;
}

static int set_name_cn(X509_NAME *name, const char *cn)
{
    return X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1,
                                      0)
               ? 0
               : -1;
}

/* ---- the CA ---- */

/* Writes what put writes to a new file at path (mode), through a temporary file in the same
 * directory linked into place: never half-written, never over an existing file. */
static int write_new_file(const char *path, mode_t mode, int (*put)(FILE *f, void *arg), void *arg,
                          struct wr_err *err)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
        return wr_err_set(err, ENAMETOOLONG, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return wr_err_sys(err, errno, "%s", tmp);
    FILE *f = fdopen(fd, "w");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return wr_err_sys(err, e, "%s", tmp);
    }
    int bad = fchmod(fd, mode) < 0 || put(f, arg) < 0;
    bad |= fflush(f) != 0 || fsync(fd) != 0;
    bad |= fclose(f) != 0;
    if (bad) {
        unlink(tmp);
        return ssl_err(err, EIO, "could not write the CA");
    }
    if (link(tmp, path) < 0) {
        int e = errno;
        unlink(tmp);
        return wr_err_sys(err, e, "%s", path);
    }
    unlink(tmp);
    return 0;
}

static int put_key(FILE *f, void *arg)
{
    return PEM_write_PrivateKey(f, arg, NULL, NULL, 0, NULL, NULL) ? 0 : -1;
}

static int put_cert(FILE *f, void *arg)
{
    return PEM_write_X509(f, arg) ? 0 : -1;
}

int tlsmitm_ca_create(const char *cert_path, const char *key_path, const char *common_name,
                      struct wr_err *err)
{
    if (!cert_path || !key_path || !common_name || !*common_name)
        return wr_err_set(err, EINVAL, "tlsmitm: bad arguments");
    EVP_PKEY *key = p256_key();
    X509 *cert = X509_new();
    int r = -1;
    if (!key || !cert) {
        ssl_err(err, ENOMEM, "tlsmitm: CA key");
        goto out;
    }
    if (!X509_set_version(cert, X509_VERSION_3) || random_serial(cert) < 0 ||
        !X509_gmtime_adj(X509_getm_notBefore(cert), -TLSMITM_LEAF_BACKDATE_S) ||
        !X509_time_adj_ex(X509_getm_notAfter(cert), TLSMITM_CA_DAYS, 0, NULL) ||
        set_name_cn(X509_get_subject_name(cert), common_name) < 0 ||
        !X509_set_issuer_name(cert, X509_get_subject_name(cert)) || !X509_set_pubkey(cert, key) ||
        add_ext(cert, cert, NID_basic_constraints, "critical,CA:TRUE") < 0 ||
        add_ext(cert, cert, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
        add_ext(cert, cert, NID_subject_key_identifier, "hash") < 0 ||
        !X509_sign(cert, key, EVP_sha256())) {
        ssl_err(err, EIO, "tlsmitm: making the CA certificate");
        goto out;
    }
    if (write_new_file(key_path, 0600, put_key, key, err) < 0)
        goto out;
    if (write_new_file(cert_path, 0644, put_cert, cert, err) < 0) {
        unlink(key_path);
        goto out;
    }
    r = 0;
out:
    X509_free(cert);
    EVP_PKEY_free(key);
    return r;
}

/* ---- leaves ---- */

static time_t asn1_to_time(const ASN1_TIME *t)
{
    struct tm tm;
    if (!ASN1_TIME_to_tm(t, &tm))
        return 0;
    return timegm(&tm);
}

/* subjectAltName DNS:host, built as a value: a host with a ',' cannot add a name of its own, as
 * it could through X509V3_EXT_conf's text. */
static int add_san_dns(X509 *cert, const char *host, int critical)
{
    GENERAL_NAMES *names = GENERAL_NAMES_new();
    GENERAL_NAME *name = GENERAL_NAME_new();
    ASN1_IA5STRING *dns = ASN1_IA5STRING_new();
    int r = -1;
    if (names && name && dns && ASN1_STRING_set(dns, host, -1)) {
        GENERAL_NAME_set0_value(name, GEN_DNS, steal_pointer(&dns));
        if (sk_GENERAL_NAME_push(names, name) > 0) {
            name = NULL;
            r = X509_add1_ext_i2d(cert, NID_subject_alt_name, names, critical,
                                  X509V3_ADD_DEFAULT) == 1
                    ? 0
                    : -1;
        }
    }
    ASN1_IA5STRING_free(dns);
    GENERAL_NAME_free(name);
    GENERAL_NAMES_free(names);
    return r;
}

X509 *tlsmitm_mint(X509 *ca, EVP_PKEY *ca_key, EVP_PKEY *leaf_pub, const char *host,
                   time_t *not_after)
{
    if (!ca || !ca_key || !leaf_pub || !host || !*host || strlen(host) > 253 || !not_after)
        return NULL;
    time_t now = time(NULL);
    time_t end = now + (time_t)TLSMITM_LEAF_DAYS * 24 * 3600;
    time_t ca_end = asn1_to_time(X509_get0_notAfter(ca));
    if (end > ca_end)
        end = ca_end;
    if (end <= now)
        return NULL; /* the CA has expired */
    X509 *cert = X509_new();
    if (!cert)
        return NULL;
    /* A CN holds at most 64 characters (X.520's ub-common-name): a longer name goes only in the
     * SAN, under an empty subject, and the SAN is then critical (RFC 5280, 4.2.1.6). */
    int cn = strlen(host) <= TLSMITM_CN_MAX;
    X509_NAME *name = X509_get_subject_name(cert);
    if (!X509_set_version(cert, X509_VERSION_3) || random_serial(cert) < 0 ||
        !X509_time_adj(X509_getm_notBefore(cert), -TLSMITM_LEAF_BACKDATE_S, &now) ||
        !X509_time_adj(X509_getm_notAfter(cert), 0, &end) || (cn && set_name_cn(name, host) < 0) ||
        !X509_set_issuer_name(cert, X509_get_subject_name(ca)) ||
        !X509_set_pubkey(cert, leaf_pub) ||
        add_ext(cert, ca, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
        add_ext(cert, ca, NID_key_usage, "critical,digitalSignature") < 0 ||
        add_ext(cert, ca, NID_ext_key_usage, "serverAuth") < 0 ||
        add_san_dns(cert, host, !cn) < 0 ||
        add_ext(cert, ca, NID_authority_key_identifier, "keyid:always") < 0 ||
        !X509_sign(cert, ca_key, EVP_sha256())) {
        X509_free(cert);
        return NULL;
    }
    *not_after = end;
    return cert;
}

/* tlsmitm_new's sign function: the CA key is in this process. */
static X509 *sign_here(void *ctx, const char *host, EVP_PKEY *leaf_pub, time_t *not_after,
                       struct wr_err *err)
{
    struct tlsmitm *m = ctx;
    X509 *cert = tlsmitm_mint(m->ca, m->ca_key, leaf_pub, host, not_after);
    if (!cert)
        ssl_err(err, EIO, "tlsmitm: minting a certificate");
    return cert;
}

/* Whether cert is a leaf tlsmitm_mint would make for host and m's leaf key, with not_after: what a
 * sign function answers comes from another process, and goes to sandboxes only if it is. */
static int leaf_ok(struct tlsmitm *m, X509 *cert, const char *host, time_t not_after,
                   struct wr_err *err)
{
    const char *bad = NULL;
    if (X509_check_host(cert, host, strlen(host), X509_CHECK_FLAG_NO_WILDCARDS, NULL) != 1)
        bad = "does not name the host";
    else if (EVP_PKEY_eq(X509_get0_pubkey(cert), m->leaf_pub) != 1)
        bad = "is not for the leaf key";
    else if (X509_check_issued(m->ca, cert) != X509_V_OK ||
             X509_verify(cert, X509_get0_pubkey(m->ca)) != 1)
        bad = "is not signed by the CA";
    else if (X509_check_ca(cert) != 0)
        bad = "is a CA";
    else if (not_after != asn1_to_time(X509_get0_notAfter(cert)) || not_after <= time(NULL))
        bad = "has a notAfter other than the one given, or in the past";
    ERR_clear_error();
    if (bad)
        return wr_err_set(err, EPROTO, "tlsmitm: the certificate signed for %s %s", host, bad);
    return 0;
}

X509 *tlsmitm_leaf(struct tlsmitm *m, const char *host, struct wr_err *err)
{
    if (!host || !*host || strlen(host) > 253) {
        wr_err_set(err, EINVAL, "tlsmitm: bad host");
        return NULL;
    }
    time_t now = time(NULL);
    struct leaf *slot = NULL;
    for (unsigned i = 0; i < m->ncache; i++) {
        struct leaf *l = &m->cache[i];
        if (strcmp(l->host, host) != 0)
            continue;
        if (l->not_after - now > TLSMITM_LEAF_RENEW_S || l->not_after >= m->ca_not_after) {
            l->used = ++m->clock;
            m->stats.cache_hits++;
            return l->cert;
        }
        slot = l; /* about to expire: replaced below */
        break;
    }
    time_t not_after = 0;
    X509 *cert = m->sign(m->sign_ctx, host, m->leaf_pub, &not_after, err);
    if (!cert)
        return NULL;
    if (leaf_ok(m, cert, host, not_after, err) < 0) {
        X509_free(cert);
        return NULL;
    }
    char *copy = strdup(host);
    if (!copy) {
        X509_free(cert);
        wr_err_sys(err, ENOMEM, "tlsmitm");
        return NULL;
    }
    if (!slot && m->ncache < TLSMITM_CACHE_MAX) {
        slot = &m->cache[m->ncache++];
    } else if (!slot) {
        slot = &m->cache[0];
        for (unsigned i = 1; i < m->ncache; i++)
            if (m->cache[i].used < slot->used)
                slot = &m->cache[i];
    }
    if (slot->cert) {
        X509_free(slot->cert);
        free(slot->host);
    }
    slot->host = copy;
    slot->cert = cert;
    slot->not_after = not_after;
    slot->used = ++m->clock;
    m->stats.minted++;
    return cert;
}

/* ---- SSLs ---- */

static int on_alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned inlen, void *arg)
{
    unsigned char *sel = NULL;
    unsigned char sel_len = 0;
    if (SSL_select_next_proto(&sel, &sel_len, alpn_http11, ALPN_HTTP11_LEN, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL; /* no_application_protocol */
    *out = sel;
    *outlen = sel_len;
    return SSL_TLSEXT_ERR_OK;
}

SSL *tlsmitm_server_ssl(struct tlsmitm *m, const char *host, struct wr_err *err)
{
    X509 *leaf = tlsmitm_leaf(m, host, err);
    if (!leaf)
        return NULL;
    SSL *ssl = SSL_new(m->server);
    if (!ssl || SSL_use_certificate(ssl, leaf) != 1 || SSL_use_PrivateKey(ssl, m->leaf_key) != 1) {
        ssl_err(err, ENOMEM, "tlsmitm: server SSL");
        SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

SSL *tlsmitm_client_ssl(struct tlsmitm *m, const char *host, struct wr_err *err)
{
    SSL *ssl = SSL_new(m->client);
    if (!ssl || SSL_set_tlsext_host_name(ssl, host) != 1 || SSL_set1_host(ssl, host) != 1) {
        ssl_err(err, ENOMEM, "tlsmitm: client SSL");
        SSL_free(ssl);
        return NULL;
    }
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    return ssl;
}

/* ---- the whole ---- */

static SSL_CTX *server_ctx(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* Renegotiation would run a handshake under the proxy's relay; nothing needs it. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_alpn_select_cb(ctx, on_alpn_select, NULL);
    return ctx;
}

static SSL_CTX *client_ctx(const char *extra, struct wr_err *err)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        ssl_err(err, ENOMEM, "tlsmitm: client context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_set_default_verify_paths(ctx) != 1 ||
        (extra && SSL_CTX_load_verify_locations(ctx, extra, NULL) != 1) ||
        SSL_CTX_set_alpn_protos(ctx, alpn_http11, ALPN_HTTP11_LEN) != 0) {
        ssl_err(err, EINVAL, extra ? extra : "tlsmitm: the system's trust store");
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static void *read_pem(const char *path, int is_key, struct wr_err *err)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        wr_err_sys(err, errno, "%s", path);
        return NULL;
    }
    void *v = is_key ? (void *)PEM_read_PrivateKey(f, NULL, NULL, NULL)
                     : (void *)PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (!v)
        ssl_err(err, EINVAL, path);
    return v;
}

/* Makes the leaf key and its public half. */
static int leaf_keys(struct tlsmitm *m, struct wr_err *err)
{
    unsigned char *der = NULL;
    if (!(m->leaf_key = p256_key()))
        return ssl_err(err, ENOMEM, "tlsmitm: leaf key");
    int n = i2d_PUBKEY(m->leaf_key, &der);
    const unsigned char *p = der;
    if (n > 0)
        m->leaf_pub = d2i_PUBKEY(NULL, &p, n);
    OPENSSL_free(der);
    return m->leaf_pub ? 0 : ssl_err(err, ENOMEM, "tlsmitm: leaf key");
}

/* The rest of a constructor once m->ca and m->sign are set: checks the CA (named ca_name in
 * errors), makes the leaf key and both contexts. Frees m on failure. */
static struct tlsmitm *finish(struct tlsmitm *m, const char *ca_name, const char *extra,
                              struct wr_err *err)
{
    if (X509_check_ca(m->ca) != 1) {
        wr_err_set(err, EINVAL, "tlsmitm: %s is not a CA certificate", ca_name);
        goto fail;
    }
    m->ca_not_after = asn1_to_time(X509_get0_notAfter(m->ca));
    if (m->ca_not_after <= time(NULL)) {
        wr_err_set(err, EINVAL, "tlsmitm: the CA certificate (%s) has expired", ca_name);
        goto fail;
    }
    if (leaf_keys(m, err) < 0)
        goto fail;
    if (!(m->server = server_ctx())) {
        ssl_err(err, ENOMEM, "tlsmitm: server context");
        goto fail;
    }
    if (!(m->client = client_ctx(extra, err)))
        goto fail;
    return m;
fail:
    tlsmitm_free(m);
    return NULL;
}

struct tlsmitm *tlsmitm_new(const char *ca_cert_path, const char *ca_key_path,
                            const char *upstream_extra_ca_path, struct wr_err *err)
{
    if (!ca_cert_path || !ca_key_path) {
        wr_err_set(err, EINVAL, "tlsmitm: bad arguments");
        return NULL;
    }
    struct tlsmitm *m = calloc(1, sizeof(*m));
    if (!m) {
        wr_err_sys(err, ENOMEM, "tlsmitm");
        return NULL;
    }
    m->sign = sign_here;
    m->sign_ctx = m;
    if (!(m->ca = read_pem(ca_cert_path, 0, err)) || !(m->ca_key = read_pem(ca_key_path, 1, err)))
        goto fail;
    if (X509_check_private_key(m->ca, m->ca_key) != 1) {
        ssl_err(err, EINVAL, "tlsmitm: the CA key does not match its certificate");
        goto fail;
    }
    return finish(m, ca_cert_path, upstream_extra_ca_path, err);
fail:
    tlsmitm_free(m);
    return NULL;
}

struct tlsmitm *tlsmitm_new_signed(const char *ca_cert_pem, tlsmitm_sign_fn sign, void *ctx,
                                   const char *upstream_extra_ca_path, struct wr_err *err)
{
    if (!ca_cert_pem || !sign) {
        wr_err_set(err, EINVAL, "tlsmitm: bad arguments");
        return NULL;
    }
    struct tlsmitm *m = calloc(1, sizeof(*m));
    if (!m) {
        wr_err_sys(err, ENOMEM, "tlsmitm");
        return NULL;
    }
    m->sign = sign;
    m->sign_ctx = ctx;
    BIO *bio = BIO_new_mem_buf(ca_cert_pem, -1);
    m->ca = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    if (!m->ca) {
        ssl_err(err, EINVAL, "tlsmitm: the CA certificate (PEM)");
        tlsmitm_free(m);
        return NULL;
    }
    return finish(m, "the certificate given as PEM", upstream_extra_ca_path, err);
}

void tlsmitm_free(struct tlsmitm *m)
{
    if (!m)
        return;
    for (unsigned i = 0; i < m->ncache; i++) {
        X509_free(m->cache[i].cert);
        free(m->cache[i].host);
    }
    SSL_CTX_free(m->server);
    SSL_CTX_free(m->client);
    EVP_PKEY_free(m->leaf_key);
    EVP_PKEY_free(m->leaf_pub);
    EVP_PKEY_free(m->ca_key);
    X509_free(m->ca);
    free(m);
}

X509 *tlsmitm_ca_cert(const struct tlsmitm *m)
{
    return m->ca;
}

EVP_PKEY *tlsmitm_leaf_key(const struct tlsmitm *m)
{
    return m->leaf_pub;
}

void tlsmitm_stats(const struct tlsmitm *m, struct tlsmitm_stats *out)
{
    *out = m->stats;
    out->cached = m->ncache;
}
