/*
 * API keys and who is asking. A key is "wr_" and 52 base32 characters (260 random bits),
 * shown once when it is made; the daemon keeps only its SHA-256, with its id, name and limits,
 * in the database. Root on the daemon's Unix socket, without a key, is the admin: the only one
 * who makes, changes or revokes keys or handles secrets. An auditor key (made by the admin) may
 * read the key list, the audit trail and everyone's usage, and nothing else: so a browser, which
 * can never be root on the socket, can show them without being able to change them. Everyone else,
 * and everything on TCP, needs a key; a key sees only its owner's sandboxes. A key is its own
 * owner unless it was made for another's (`owner_id`: a read-only key for a dashboard, say).
 */
#ifndef WR_DAEMON_KEYS_H
#define WR_DAEMON_KEYS_H

#include <jansson.h>
#include <stdint.h>

#include "common/err.h"

struct daemon;
struct sink;
struct store;

/** Keys kept, revoked ones included: making one more is refused. */
#define KEYS_MAX 10000

/** A key as presented: "wr_" + 52 base32 characters. */
#define KEY_TOKEN_LEN 55

/** Who a request is from. The daemon's own work (leases, the watchdog) has none (NULL). */
struct principal {
    int admin;         /* root on the Unix socket, without a key */
    int read_only;     /* a read-only key: reads, nothing else */
    int metrics_only;  /* a metrics key: GET /metrics, nothing else */
    int auditor;       /* an auditor key: reads keys, audit and usage; nothing else */
    char key_id[32];   /* the key's id; "" for the admin */
    char owner_id[32]; /* whose sandboxes it sees and makes: its own id, or its owner's */
};

struct api_key {
    char id[32];       /* "key_" + 16 base32 characters */
    char owner_id[32]; /* whose sandboxes it sees: its own id, or another key's (made --of) */
    char name[65];     /* the admin's label */
    unsigned char hash[32];
    int read_only;
    int metrics;                /* a metrics key: may GET /metrics and nothing else */
    int auditor;                /* an auditor key: GET /v1/keys, /v1/audit, /v1/usage, whoami */
    int64_t daily_limit_micros; /* spend per UTC day; -1: none */
    int max_sandboxes;          /* sandboxes it may keep at once; -1: none */
    int64_t created_at;         /* unix seconds */
    int64_t revoked_at;         /* unix seconds; 0: in use */
    /* Money (daemon/meter.c), in memory, rebuilt from the usage ledger at start: what its
     * sandboxes were charged on UTC day spent_day, and what their reservations hold. */
    int64_t spent_day; /* unix days */
    int64_t spent_micros;
    int64_t reserved_micros;
    int64_t exhausted_day; /* the day its limit was reached (0: not): nothing more that day,
                              unless the admin changes the limit */
    struct api_key *next;
};

struct keys;

/** Loads the keys from the store. */
struct keys *keys_open(struct store *st, struct wr_err *err);

void keys_free(struct keys *k);

/**
 * The key in use that token is, or NULL (unknown, revoked or malformed). Takes the same time
 * whichever key, if any, it matches.
 */
const struct api_key *keys_check(struct keys *k, const char *token);

/** The key with this id (revoked or not), or NULL. */
const struct api_key *keys_find(struct keys *k, const char *id);

/** The first key (for walking the list with ->next, to update its spend), or NULL. */
struct api_key *keys_head(struct keys *k);

/** Returns 1 if who may see a sandbox owned by key_id ("" for the admin's). */
int principal_sees(const struct principal *who, const char *key_id);

/** What a create or an update says; has_* tells which fields an update gives. */
struct key_opts {
    const char *name;
    const char *owner_id; /* create: the key whose sandboxes it sees (NULL: its own) */
    int read_only, has_read_only;
    int metrics;                /* create: a metrics key */
    int auditor;                /* create: an auditor key */
    int64_t daily_limit_micros; /* -1: none */
    int has_daily_limit;
    int max_sandboxes; /* -1: none */
    int has_max_sandboxes;
};

/**
 * Makes a key: its token ("wr_..."; shown to the caller once, never kept) goes into
 * token[KEY_TOKEN_LEN + 1]. Returns the key, or NULL with err (invalid options, too many keys,
 * the store failed).
 */
const struct api_key *keys_create(struct keys *k, const struct key_opts *o,
                                  char token[KEY_TOKEN_LEN + 1], struct wr_err *err);

/** Changes a key's limits or read-only flag (the fields o has). */
const struct api_key *keys_update(struct keys *k, const char *id, const struct key_opts *o,
                                  struct wr_err *err);

/**
 * Revokes a key and every key made for its sandboxes (owner_id, "--of"): they stop working at
 * once; their records stay (usage and audit name them). Calls also(arg, dep) for each key
 * revoked with it (not those revoked before). Revoking a revoked key revokes what it left.
 */
const struct api_key *keys_revoke(struct keys *k, const char *id,
                                  void (*also)(void *arg, const struct api_key *dep), void *arg,
                                  struct wr_err *err);

/** Every key, oldest first (never a key itself), as a JSON array. */
json_t *keys_list_json(const struct keys *k);

/** The API's object for a key (never the key itself). */
json_t *key_to_json(const struct api_key *k);

#endif
