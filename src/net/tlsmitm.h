/*
 * TLS interception for the egress proxy. Secrets must reach upstream servers in request headers
 * without ever entering a sandbox, so the proxy has to see (and rewrite) the requests inside a
 * sandbox's TLS connections: it answers the sandbox's handshake itself, with a certificate for
 * the SNI signed by a per-daemon CA that sandboxes trust, and opens its own TLS connection to
 * the upstream, verified against the system's trust store (plus, for the tests' fake internet,
 * an extra CA file).
 *
 * This module holds the OpenSSL side of that: the CA (made once per daemon with
 * tlsmitm_ca_create), one leaf key made at start, the leaf certificates minted per host and kept
 * in a small LRU cache, and the two SSL_CTXs (towards the sandbox and towards upstreams). Both
 * speak TLS 1.2 or later and HTTP/1.1 only (ALPN), since the proxy reads what goes through as
 * HTTP/1.x. The proxy (net/proxy.h) does the I/O.
 *
 * Who signs the leaves is a function: tlsmitm_new loads the CA key and signs in process;
 * tlsmitm_new_signed never sees the key and asks a sign function, which in the daemon asks the
 * signer process (net/signer.h) so that the process parsing sandboxes' bytes cannot leak the key.
 * Either way tlsmitm_mint makes the certificate, and tlsmitm_leaf checks what the sign function
 * answered before a sandbox sees it.
 *
 * One tlsmitm is used from one thread (the proxy's loop); a sign function is called on it.
 */
#ifndef WR_NET_TLSMITM_H
#define WR_NET_TLSMITM_H

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdint.h>
#include <time.h>

#include "common/err.h"

/* Hosts whose leaf certificate is kept; past it the least recently used one goes. */
#define TLSMITM_CACHE_MAX 1024
/* A leaf is valid from an hour ago (clocks in sandboxes may lag) for a week (or until the CA
 * expires, if sooner); the cache mints a new one once less than a day is left. */
#define TLSMITM_LEAF_BACKDATE_S 3600
#define TLSMITM_LEAF_DAYS 7
#define TLSMITM_LEAF_RENEW_S (24 * 3600)
/* The CA's lifetime. */
#define TLSMITM_CA_DAYS 3650

struct tlsmitm;

/** Counters since tlsmitm_new. */
struct tlsmitm_stats {
    uint64_t minted;     /* leaf certificates made */
    uint64_t cache_hits; /* leaves served from the cache */
    unsigned cached;     /* hosts in the cache now */
};

/**
 * Makes a new CA: an EC P-256 key and a self-signed X.509 v3 certificate for common_name, valid
 * TLSMITM_CA_DAYS, with basicConstraints CA:TRUE and keyUsage keyCertSign+cRLSign (both
 * critical) and a subjectKeyIdentifier. The key goes to key_path (mode 0600), the certificate to
 * cert_path (0644), both PEM, each written to a temporary file in its directory and then linked
 * into place, so neither appears half-written and neither replaces an existing file (EEXIST).
 * Returns 0, or -1 with err set (and neither file left behind).
 */
int tlsmitm_ca_create(const char *cert_path, const char *key_path, const char *common_name,
                      struct wr_err *err);

/**
 * Loads the CA (PEM certificate and its private key; they must match and the certificate must
 * be a CA), makes the leaf key and both SSL_CTXs. upstream_extra_ca_path (PEM, may be NULL) is
 * trusted for upstreams besides the system's default store. Returns it (free with
 * tlsmitm_free), or NULL with err set.
 */
struct tlsmitm *tlsmitm_new(const char *ca_cert_path, const char *ca_key_path,
                            const char *upstream_extra_ca_path, struct wr_err *err);

/**
 * How a tlsmitm gets a leaf signed: returns a new certificate (the caller owns it) for host and
 * leaf_pub, as tlsmitm_mint makes it, with its notAfter in *not_after; or NULL with err set.
 * Called from tlsmitm_leaf, on its thread.
 */
typedef X509 *(*tlsmitm_sign_fn)(void *ctx, const char *host, EVP_PKEY *leaf_pub,
                                 time_t *not_after /* OUT */, struct wr_err *err);

/**
 * A tlsmitm that never holds the CA key: ca_cert_pem is the CA certificate (PEM text; it must be
 * a CA and not expired), the leaf key is made here, and leaves come from sign(ctx, ...). Each one
 * must name the host asked for (and no wildcard), carry the leaf key, be issued and signed by the
 * CA, not be a CA, and have the notAfter sign reported, still ahead; else tlsmitm_leaf fails.
 * Otherwise as tlsmitm_new. ctx is borrowed: it must outlive m.
 */
struct tlsmitm *tlsmitm_new_signed(const char *ca_cert_pem, tlsmitm_sign_fn sign, void *ctx,
                                   const char *upstream_extra_ca_path, struct wr_err *err);

/**
 * Mints host's leaf for leaf_pub, signed with ca_key: X.509 v3, a random 128-bit serial, CN and
 * one subjectAltName DNS:host (for a host over 64 bytes, the most a CN holds, no CN and the SAN
 * critical), basicConstraints CA:FALSE and keyUsage digitalSignature (both
 * critical), extendedKeyUsage serverAuth, the CA's authorityKeyIdentifier; valid from
 * TLSMITM_LEAF_BACKDATE_S ago for TLSMITM_LEAF_DAYS, or until the CA expires if sooner. host is
 * not checked beyond 1 to 253 bytes (the SAN is built as a value, never parsed from text); the
 * signer checks it first (net/signer.h). Sets *not_after; returns the certificate (the caller
 * owns it), or NULL if an argument is missing, the CA has expired or OpenSSL failed (its error
 * queue says which).
 */
X509 *tlsmitm_mint(X509 *ca, EVP_PKEY *ca_key, EVP_PKEY *leaf_pub, const char *host,
                   time_t *not_after /* OUT */);

/**
 * The leaf key's public half (borrowed, valid until m is freed; it holds no private key): what
 * the signer is told in its HELLO (net/signer.h).
 */
EVP_PKEY *tlsmitm_leaf_key(const struct tlsmitm *m);

/** Frees m and its cache. NULL is a no-op. */
void tlsmitm_free(struct tlsmitm *m);

/**
 * A server-side SSL to answer a sandbox's handshake for host (a normalised name: lower case, no
 * trailing dot), with host's leaf certificate (minted or from the cache) and the leaf key set on
 * it; ALPN selects "http/1.1", and a client that offers ALPN without it fails the handshake with
 * a no_application_protocol alert. The caller owns the SSL (SSL_free). NULL with err set on
 * failure.
 */
SSL *tlsmitm_server_ssl(struct tlsmitm *m, const char *host, struct wr_err *err);

/**
 * A client-side SSL to an upstream for host: SNI host, the peer verified against the upstream
 * trust (SSL_VERIFY_PEER) and its certificate required to name host, ALPN offering "http/1.1".
 * The caller owns the SSL. NULL with err set on failure.
 */
SSL *tlsmitm_client_ssl(struct tlsmitm *m, const char *host, struct wr_err *err);

/**
 * host's leaf certificate, minted or from the cache (and marked recently used). Borrowed: valid
 * until m is freed or host leaves the cache (take a reference with X509_up_ref to keep it). NULL
 * with err set on failure; a failure is not cached, the next call asks again.
 */
X509 *tlsmitm_leaf(struct tlsmitm *m, const char *host, struct wr_err *err);

/** The CA certificate (borrowed, valid until m is freed). */
X509 *tlsmitm_ca_cert(const struct tlsmitm *m);

/** Copies m's counters into out. */
void tlsmitm_stats(const struct tlsmitm *m, struct tlsmitm_stats *out /* OUT */);

#endif
