/*
 * TLS for the API's TCP listener (internal to src/http/): the server's SSL_CTX, loaded once at
 * start from PEM files, so that every mistake in them is found before the daemon serves.
 */
#ifndef WR_HTTP_TLS_H
#define WR_HTTP_TLS_H

#include <openssl/ssl.h>

#include "common/err.h"

/**
 * A server context for TLS 1.2 and later with the certificate chain in cert_file (the server's
 * certificate first) and its private key in key_file, both PEM. Returns it (the caller frees it
 * with SSL_CTX_free), or NULL with err saying which file is wrong and why: missing or unreadable,
 * no certificate or key in it, or a key that is not the certificate's.
 */
SSL_CTX *tls_server_ctx(const char *cert_file, const char *key_file, struct wr_err *err);

#endif
