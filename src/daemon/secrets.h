/*
 * Secrets bound to hosts: a value (a token, say) that code in a sandbox may use but never see.
 * A sandbox created with `secrets: ["NAME"]` has NAME=<placeholder> in its commands' environment,
 * a random placeholder of its own; the egress proxy, which terminates TLS to the sandbox, puts
 * the real value in place of the placeholder in the header fields of requests to the secret's
 * hosts, and nowhere else (never in a body, never to another host, never over plain HTTP).
 *
 * At rest each value is sealed with AES-256-GCM (the name as associated data) under a key kept
 * in STATE_DIR/secrets.key (mode 0600), never in the database: a copy of withruntime.db alone
 * holds no secret. In memory the daemon holds them open, since every intercepted request may
 * need one. Values never go to a log, an API answer or an error message.
 */
#ifndef WR_DAEMON_SECRETS_H
#define WR_DAEMON_SECRETS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define SECRET_NAME_MAX 64 /* an environment variable's name: [A-Z_][A-Z0-9_]* */
#define SECRET_VALUE_MAX 8192
#define SECRET_HOSTS_MAX 16
#define SECRETS_MAX 1024
#define SANDBOX_SECRETS_MAX 32
#define SECRET_PLACEHOLDER_LEN 47 /* "wr-placeholder-" + 32 hex digits */

struct secrets;
struct store;

/** Opens the secrets of state_dir: the sealing key (made on first use) and every stored secret,
 * unsealed. Returns NULL with err set. */
struct secrets *secrets_open(const char *state_dir, struct store *store, struct wr_err *err);

void secrets_free(struct secrets *s);

/** 1 if name is a valid secret name. */
int secrets_name_valid(const char *name);

/**
 * Stores (or replaces) a secret. hosts: an array of host names or "*."-wildcards (as a network
 * policy's entries); value: 1..SECRET_VALUE_MAX bytes of printable ASCII (no CR, LF or NUL: it
 * goes into header fields). Returns 0, or -1 with err set (WR_E_INVALID naming the field).
 */
int secrets_set(struct secrets *s, struct store *store, const char *name, const char *value,
                size_t len, json_t *hosts, struct wr_err *err);

/** Deletes a secret; WR_E_NOT_FOUND if there is none by that name. */
int secrets_delete(struct secrets *s, struct store *store, const char *name, struct wr_err *err);

/** 1 if a secret by that name exists. */
int secrets_exists(const struct secrets *s, const char *name);

/** {"secrets": [{"name", "hosts", "updated_at"}...]}: never a value. */
json_t *secrets_list_json(const struct secrets *s);

/** {"name", "hosts", "updated_at"} of one secret, or NULL. */
json_t *secrets_get_json(const struct secrets *s, const char *name);

/** Writes a fresh random placeholder (SECRET_PLACEHOLDER_LEN chars + NUL) into out. */
void secrets_placeholder(char out[SECRET_PLACEHOLDER_LEN + 1]);

/**
 * Whether any secret in placeholders ({NAME: placeholder}) is bound to host: the proxy
 * intercepts only such connections' requests to rewrite them.
 */
int secrets_bound(const struct secrets *s, json_t *placeholders, const char *host);

/**
 * A request head (len bytes, request line to blank line) on its way to host: for each secret in
 * placeholders ({NAME: placeholder}) bound to host, every occurrence of its placeholder in the
 * header fields (never the request line) becomes its value. Returns a new head (malloc'd,
 * *outlen bytes) if anything was replaced, else NULL.
 */
char *secrets_rewrite_head(const struct secrets *s, json_t *placeholders, const char *host,
                           const char *head, size_t len, size_t *outlen);

#endif
