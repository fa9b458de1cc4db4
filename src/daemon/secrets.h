/*
 * Secrets bound to hosts: a value (a token, say) that code in a sandbox may use but never see.
 * A sandbox created with `secrets: ["NAME"]` has NAME=<placeholder> in its commands' environment,
 * a random placeholder of its own; the egress proxy, which terminates TLS to the sandbox, puts
 * the real value in place of the placeholder in the credential fields (Authorization, and the
 * header names the secret declares) of requests to the secret's hosts and ports, and nowhere
 * else (never in a body, the request line or Host, never to another host or port, never over
 * plain HTTP). A header that a server may echo back (Origin, a custom one) keeps the placeholder.
 *
 * A secret belongs to the admin, who names the keys whose sandboxes may use it (`keys`); the
 * admin's own sandboxes may use every one. That is checked when a sandbox is created with it
 * and again at every request, so taking a key off the list (or revoking the key) stops the
 * value going out of that key's sandboxes at once.
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
#define SECRET_KEYS_MAX 64
#define SECRET_HEADERS_MAX 8
#define SECRET_HEADER_NAME_MAX 64
#define SECRET_PORT 443 /* a host entry's port when it names none */

struct secrets;
struct store;

/** Opens the secrets of state_dir: the sealing key (made on first use) and every stored secret,
 * unsealed. Returns NULL with err set. */
struct secrets *secrets_open(const char *state_dir, struct store *store, struct wr_err *err);

void secrets_free(struct secrets *s);

/** 1 if name is a valid secret name. */
int secrets_name_valid(const char *name);

/** Who may use a secret and where it goes; in an update, a NULL field is left as it is. */
struct secret_fields {
    /* 1..SECRET_HOSTS_MAX entries written as a network policy's ("api.example.com",
     * "*.example.com", with an optional ":port"); an entry without a port means 443 */
    json_t *hosts;
    /* the ids of the keys whose sandboxes may use it (a key made --of another acts for it, so
     * owners only: the caller checks that they exist); [] or NULL on a set: the admin's alone */
    json_t *keys;
    /* header names, besides Authorization, whose values may carry it; NULL on a set: none */
    json_t *headers;
};

/**
 * Stores (or replaces) a secret. value: 1..SECRET_VALUE_MAX bytes of printable ASCII (no CR, LF
 * or NUL: it goes into header fields); f->hosts is required. Returns 0, or -1 with err set
 * (WR_E_INVALID naming the field).
 */
int secrets_set(struct secrets *s, struct store *store, const char *name, const char *value,
                size_t len, const struct secret_fields *f, struct wr_err *err);

/**
 * Changes the fields f gives of a stored secret, keeping its value. WR_E_NOT_FOUND if there is
 * none by that name, WR_E_CONFLICT if its value cannot be opened (set it again).
 */
int secrets_update(struct secrets *s, struct store *store, const char *name,
                   const struct secret_fields *f, struct wr_err *err);

/** Deletes a secret; WR_E_NOT_FOUND if there is none by that name. */
int secrets_delete(struct secrets *s, struct store *store, const char *name, struct wr_err *err);

/** 1 if a secret by that name exists. */
int secrets_exists(const struct secrets *s, const char *name);

/**
 * 1 if a secret by that name exists, has a value, and the sandboxes of owner may use it: owner
 * "" (the admin's) may use every secret, a key only those that name it in their keys.
 */
int secrets_usable(const struct secrets *s, const char *name, const char *owner);

/** {"secrets": [{"name", "hosts", "keys", "headers", "updated_at"}...]}: never a value. */
json_t *secrets_list_json(const struct secrets *s);

/** {"name", "hosts", "keys", "headers", "updated_at"} of one secret, or NULL. */
json_t *secrets_get_json(const struct secrets *s, const char *name);

/** Writes a fresh random placeholder (SECRET_PLACEHOLDER_LEN chars + NUL) into out. */
void secrets_placeholder(char out[SECRET_PLACEHOLDER_LEN + 1]);

/**
 * A request head (len bytes, request line to blank line) on its way to host:port from a sandbox
 * of owner ("" for the admin's): for each secret in placeholders ({NAME: placeholder}) that owner
 * may use (secrets_usable, asked now: a grant taken back stops it on the next request) and that
 * is bound to host on that port, each occurrence of its placeholder in the value of an
 * Authorization field or of a field the secret declares becomes its value. Never in the request
 * line, Host or any other field, and never for a method other than GET, HEAD, POST, PUT, PATCH
 * and DELETE (TRACE echoes the request back; OPTIONS carries no credential). Returns a new head
 * (malloc'd, *outlen bytes) if anything was replaced, else NULL.
 */
char *secrets_rewrite_head(const struct secrets *s, json_t *placeholders, const char *owner,
                           const char *host, int port, const char *head, size_t len,
                           size_t *outlen);

/**
 * What the egress process needs to apply a sandbox's secrets (net/inject.h): for each secret in
 * placeholders that owner may use now, {"placeholder", "value", "policy", "headers"}, as a new
 * array. It holds the values: wipe what it is serialised into.
 */
json_t *secrets_injections_json(const struct secrets *s, json_t *placeholders, const char *owner);

#endif
