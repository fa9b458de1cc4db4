/*
 * Secrets into request heads: the one place a secret's real value replaces its placeholder. The
 * daemon decides which secrets a sandbox may use now (daemon/secrets.h); the egress process,
 * which sees the sandbox's requests inside its intercepted TLS, applies them with inject_head.
 * A value goes only into the credential fields (Authorization, and the field names the secret
 * declares) of a request to a host and port its policy allows, and only for methods that carry a
 * credential without echoing it; never into the request line, Host or any other field.
 */
#ifndef WR_NET_INJECT_H
#define WR_NET_INJECT_H

#include <jansson.h>
#include <stddef.h>

/** One secret as applied to a sandbox's requests (all borrowed). */
struct inject {
    const char *placeholder; /* what the sandbox's commands see */
    const char *value;       /* what goes upstream instead (len bytes) */
    size_t len;
    json_t *policy;  /* where it may go: a normalised network policy (net/netpolicy.h) */
    json_t *headers; /* field names besides Authorization that may carry it (array of strings) */
};

/**
 * A request head (len bytes, request line to blank line) on its way to host:port: for each of
 * the n injections whose policy allows host:port, each occurrence of its placeholder in the value
 * of an Authorization field or of a field it declares becomes its value, for GET, HEAD, POST,
 * PUT, PATCH and DELETE only (TRACE echoes the request back; OPTIONS carries no credential).
 * Returns a new head (malloc'd, *outlen bytes) if anything was replaced, else NULL. Intermediate
 * copies are wiped before they are freed.
 */
char *inject_head(const struct inject *in, size_t n, const char *host, int port, const char *head,
                  size_t len, size_t *outlen);

#endif
