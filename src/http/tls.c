/*
 * The API's TLS server context. OpenSSL's own messages for a bad file are terse ("PEM lib",
 * "no start line"), so each step is checked on its own and the error names the file and what
 * was wrong with it; OpenSSL's reason follows in parentheses.
 */
#include "http/tls.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <unistd.h>

/* The reason of OpenSSL's first queued error (the queue is emptied: the later ones are its
 * consequences, like "PEM lib"), or "unknown"; its code in *code (0 if none). */
static const char *ssl_reason(char *buf, size_t len, int *code)
{
    unsigned long e, last = 0;
    while ((e = ERR_get_error()) != 0)
        if (!last)
            last = e;
    *code = last ? ERR_GET_REASON(last) : 0;
    if (!last)
        return "unknown";
    const char *r = ERR_reason_error_string(last);
    snprintf(buf, len, "%s", r ? r : "unknown");
    return buf;
}

/* 0 if path can be opened for reading, else -1 with err naming what it is (what). */
static int readable(const char *what, const char *path, struct wr_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wr_err_sys(err, errno, "cannot read the TLS %s %s", what, path);
    close(fd);
    return 0;
}

SSL_CTX *tls_server_ctx(const char *cert_file, const char *key_file, struct wr_err *err)
{
    char why[256];
    int code;
    if (readable("certificate", cert_file, err) < 0 || readable("key", key_file, err) < 0)
        return NULL;
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        wr_err_set(err, ENOMEM, "cannot make a TLS context (%s)",
                   ssl_reason(why, sizeof(why), &code));
        return NULL;
    }
    /* No renegotiation (a client could make the daemon do handshakes for ever on one
     * connection), no compression (CRIME), nothing older than TLS 1.2. */
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* Sessions are not resumed: each connection is one request or a short keep-alive. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
        wr_err_set(err, EINVAL, "the TLS certificate %s is not a PEM certificate (chain) (%s)",
                   cert_file, ssl_reason(why, sizeof(why), &code));
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1) {
        ssl_reason(why, sizeof(why), &code);
        if (code == X509_R_KEY_VALUES_MISMATCH)
            wr_err_set(err, EINVAL, "the TLS key %s does not match the certificate in %s", key_file,
                       cert_file);
        else
            wr_err_set(err, EINVAL, "the TLS key %s is not a PEM private key (%s)", key_file, why);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        wr_err_set(err, EINVAL, "the TLS key %s does not match the certificate in %s", key_file,
                   cert_file);
        goto fail;
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}
