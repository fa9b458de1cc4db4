/*
 * Durable state in SQLite (WAL) in the state directory: sandboxes and their
 * event history. Used from the event-loop thread only.
 */
#ifndef WR_STORE_H
#define WR_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

struct store;

/** Opens (creating if needed) the database at path and migrates its schema. */
struct store *store_open(const char *path, struct wr_err *err);

/** Closes the database. NULL is fine. */
void store_close(struct store *s);

/** Inserts or replaces a sandbox row: its state and its whole JSON document. */
int store_sandbox_put(struct store *s, const char *id, const char *state, const char *doc,
                      struct wr_err *err);

/** Deletes a sandbox row (its events stay, for history). Deleting a missing row succeeds. */
int store_sandbox_delete(struct store *s, const char *id, struct wr_err *err);

/** Calls cb for each stored sandbox, oldest first. A non-zero return from cb stops the walk. */
int store_sandbox_foreach(struct store *s,
                          int (*cb)(void *arg, const char *id, const char *state, const char *doc),
                          void *arg, struct wr_err *err);

/** Events kept per sandbox: adding one past this drops its oldest. */
#define STORE_EVENTS_KEPT 1000

/** Appends an event ("state change to X because Y") to a sandbox's history (see above). */
int store_event_add(struct store *s, const char *sandbox_id, const char *type, const char *state,
                    const char *reason, struct wr_err *err);

/**
 * Calls cb for each event of a sandbox, oldest first (at most `limit`).
 */
int store_event_foreach(struct store *s, const char *sandbox_id, int limit,
                        int (*cb)(void *arg, int64_t at, const char *type, const char *state,
                                  const char *reason),
                        void *arg, struct wr_err *err);

/**
 * Stores (or replaces) a secret: its name, its hosts (JSON text), who may use it and where it
 * goes (access: JSON text, daemon/secrets.c's) and its sealed value. A row from before `access`
 * existed reads as "{}".
 */
int store_secret_put(struct store *s, const char *name, const char *hosts, const char *access,
                     const void *sealed, size_t len, int64_t updated_at, struct wr_err *err);

/** Deletes a secret (none by that name is fine). */
int store_secret_delete(struct store *s, const char *name, struct wr_err *err);

/** Calls cb for every secret, by name; cb returning < 0 stops early. */
int store_secret_foreach(struct store *s,
                         int (*cb)(void *arg, const char *name, const char *hosts,
                                   const char *access, const void *sealed, size_t len,
                                   int64_t updated_at),
                         void *arg, struct wr_err *err);

/** Stores (or replaces) an API key's document (daemon/keys.c: its hash, never the key). */
int store_key_put(struct store *s, const char *id, const char *doc, struct wr_err *err);

/** Calls cb for every API key, oldest first; cb returning < 0 stops early. */
int store_key_foreach(struct store *s, int (*cb)(void *arg, const char *id, const char *doc),
                      void *arg, struct wr_err *err);

/** Audit entries kept: older ones are dropped. */
#define STORE_AUDIT_KEPT 100000

/** One entry of the audit trail: who did what to which sandbox, and how it was answered. */
struct store_audit {
    int64_t at_ms;          /* wall clock */
    const char *key_id;     /* "" for the admin */
    const char *method;     /* "POST" */
    const char *route;      /* the route's pattern: "/v1/sandboxes/{id}/exec" */
    const char *sandbox_id; /* "" when the route names none */
    int status;             /* the HTTP status answered */
};

/** Appends n entries to the audit trail in one transaction (and trims it to about
 * STORE_AUDIT_KEPT): all or none. */
int store_audit_add(struct store *s, const struct store_audit *a, size_t n, struct wr_err *err);

/** Calls cb for the newest `limit` entries with seq < before_seq, newest first. */
int store_audit_foreach(struct store *s, int64_t before_seq, int limit,
                        int (*cb)(void *arg, int64_t seq, const struct store_audit *a), void *arg,
                        struct wr_err *err);

/** Charges for one sandbox in one UTC minute (the usage ledger). */
struct store_usage {
    const char *sandbox_id;
    const char *key_id;  /* its key's owner; "" for the admin's */
    int64_t minute;      /* unix minutes */
    int64_t cost_micros; /* micro-dollars */
    int64_t cpu_usec;    /* CPU billed */
    int64_t memory_mib_ms;
};

/** Adds rows to the ledger in one transaction: a row for a (sandbox, minute) it already has
 * adds to it. */
int store_usage_add(struct store *s, const struct store_usage *rows, size_t n, struct wr_err *err);

/** Folds the ledger's rows from days before before_minute's into one row per sandbox per day
 * (the ledger keeps minutes for recent days only, so it grows with sandbox-days). */
int store_usage_compact(struct store *s, int64_t before_minute, struct wr_err *err);

enum store_usage_group {
    STORE_USAGE_BY_SANDBOX,
    STORE_USAGE_BY_KEY,
    STORE_USAGE_BY_DAY,
    STORE_USAGE_BY_MINUTE
};

/**
 * Sums the ledger's rows with from_minute <= minute < to_minute (of key_id's sandboxes only,
 * unless NULL; of sandbox_id only, unless NULL) by group, in the group's order, at most limit
 * groups: cb gets the group's sandbox or key id (by day or minute: "" and sum->minute is the
 * day's or the minute's first minute). cb returns non-zero to stop.
 */
int store_usage_sum(struct store *s, enum store_usage_group g, int64_t from_minute,
                    int64_t to_minute, const char *key_id, const char *sandbox_id, int limit,
                    int (*cb)(void *arg, const char *group, const struct store_usage *sum),
                    void *arg, struct wr_err *err);

#endif
