/*
 * SQLite-backed state. Sandboxes are stored as one JSON document per row
 * (the same object the API returns), so adding an option needs no
 * migration; the state column is kept beside it for queries at start-up.
 * Fault points (common/fault.h), one per operation: store.open, store.put, store.delete,
 * store.list, store.event, store.events, store.secret, store.key, store.audit, store.usage.
 */
#include "store/store.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
#include "common/util.h"

struct store {
    sqlite3 *db;
};

static const char *schema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "PRAGMA foreign_keys=ON;"
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '1');"
    "CREATE TABLE IF NOT EXISTS sandboxes ("
    "  id TEXT PRIMARY KEY,"
    "  state TEXT NOT NULL,"
    "  doc TEXT NOT NULL,"
    "  created_seq INTEGER NOT NULL DEFAULT 0,"
    "  updated_at INTEGER NOT NULL"
    ");"
    "CREATE TABLE IF NOT EXISTS events ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  sandbox_id TEXT NOT NULL,"
    "  at INTEGER NOT NULL,"
    "  type TEXT NOT NULL,"
    "  state TEXT,"
    "  reason TEXT"
    ");"
    "CREATE INDEX IF NOT EXISTS events_by_sandbox ON events (sandbox_id, seq);"
    "CREATE TABLE IF NOT EXISTS secrets ("
    "  name TEXT PRIMARY KEY,"
    "  hosts TEXT NOT NULL,"
    "  sealed BLOB NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  access TEXT NOT NULL DEFAULT '{}'"
    ");"
    "CREATE TABLE IF NOT EXISTS api_keys ("
    "  id TEXT PRIMARY KEY,"
    "  doc TEXT NOT NULL"
    ");"
    "CREATE TABLE IF NOT EXISTS audit ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  at_ms INTEGER NOT NULL,"
    "  key_id TEXT NOT NULL,"
    "  method TEXT NOT NULL,"
    "  route TEXT NOT NULL,"
    "  sandbox_id TEXT NOT NULL,"
    "  status INTEGER NOT NULL"
    ");"
    "CREATE TABLE IF NOT EXISTS usage ("
    "  sandbox_id TEXT NOT NULL,"
    "  minute INTEGER NOT NULL,"
    "  key_id TEXT NOT NULL,"
    "  cost_micros INTEGER NOT NULL,"
    "  cpu_usec INTEGER NOT NULL,"
    "  memory_mib_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (sandbox_id, minute)"
    ");"
    "CREATE INDEX IF NOT EXISTS usage_by_minute ON usage (minute);";

static int db_err(struct store *s, struct wr_err *err, const char *what)
{
    return wr_err_set(err, EIO, "%s: %s", what, sqlite3_errmsg(s->db));
}

/*
 * Fault point for tests: fails the operation the way SQLite would (EBUSY reads "database is
 * locked", ENOSPC "database or disk is full"), naming the point. Returns 0 if not armed.
 */
static int db_fault(const char *point, const char *what, struct wr_err *err)
{
    struct wr_err e = {0};
    if (fault_hit(point, &e) == 0)
        return 0;
    const char *as = e.code == EBUSY    ? sqlite3_errstr(SQLITE_BUSY)
                     : e.code == ENOSPC ? sqlite3_errstr(SQLITE_FULL)
                                        : sqlite3_errstr(SQLITE_IOERR);
    return wr_err_set(err, e.code, "%s: %s (%s)", what, as, e.msg);
}

/*
 * Adds a column that a database from an older daemon lacks (its rows take the default). SQLite
 * has no ADD COLUMN IF NOT EXISTS: a statement naming the column tells. Returns 0, or -1 with
 * *msg from sqlite3_exec.
 */
static int add_column(struct store *s, const char *table, const char *column, const char *decl,
                      char **msg)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT %s FROM %s LIMIT 0", column, table);
    sqlite3_stmt *st = NULL;
    int have = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) == SQLITE_OK;
    sqlite3_finalize(st);
    if (have)
        return 0;
    snprintf(sql, sizeof(sql), "ALTER TABLE %s ADD COLUMN %s %s", table, column, decl);
    return sqlite3_exec(s->db, sql, NULL, NULL, msg) == SQLITE_OK ? 0 : -1;
}

struct store *store_open(const char *path, struct wr_err *err)
{
    char what[64 + 4096];
    snprintf(what, sizeof(what), "open database %s", path);
    if (db_fault("store.open", what, err) < 0)
        return NULL;
    struct store *s = xcalloc(1, sizeof(*s));
    if (sqlite3_open_v2(path, &s->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        wr_err_set(err, EIO, "open database %s: %s", path,
                   s->db ? sqlite3_errmsg(s->db) : "out of memory");
        store_close(s);
        return NULL;
    }
    sqlite3_busy_timeout(s->db, 5000);
    char *msg = NULL;
    if (sqlite3_exec(s->db, schema, NULL, NULL, &msg) != SQLITE_OK ||
        add_column(s, "secrets", "access", "TEXT NOT NULL DEFAULT '{}'", &msg) < 0) {
        wr_err_set(err, EIO, "initialise database %s: %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        store_close(s);
        return NULL;
    }
    return s;
}

void store_close(struct store *s)
{
    if (!s)
        return;
    sqlite3_close(s->db);
    free(s);
}

int store_sandbox_put(struct store *s, const char *id, const char *state, const char *doc,
                      struct wr_err *err)
{
    static const char sql[] =
        "INSERT INTO sandboxes (id, state, doc, created_seq, updated_at) "
        "VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(created_seq), 0) + 1 FROM sandboxes), ?4) "
        "ON CONFLICT(id) DO UPDATE SET state = ?2, doc = ?3, updated_at = ?4";
    sqlite3_stmt *st;
    if (db_fault("store.put", "store sandbox", err) < 0)
        return -1;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "store sandbox");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, doc, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now_unix());
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_err(s, err, "store sandbox");
    return 0;
}

int store_sandbox_delete(struct store *s, const char *id, struct wr_err *err)
{
    sqlite3_stmt *st;
    if (db_fault("store.delete", "delete sandbox", err) < 0)
        return -1;
    if (sqlite3_prepare_v2(s->db, "DELETE FROM sandboxes WHERE id = ?1", -1, &st, NULL) !=
        SQLITE_OK)
        return db_err(s, err, "delete sandbox");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_err(s, err, "delete sandbox");
    return 0;
}

int store_sandbox_foreach(struct store *s,
                          int (*cb)(void *arg, const char *id, const char *state, const char *doc),
                          void *arg, struct wr_err *err)
{
    sqlite3_stmt *st;
    if (db_fault("store.list", "list sandboxes", err) < 0)
        return -1;
    if (sqlite3_prepare_v2(s->db, "SELECT id, state, doc FROM sandboxes ORDER BY created_seq", -1,
                           &st, NULL) != SQLITE_OK)
        return db_err(s, err, "list sandboxes");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (cb(arg, (const char *)sqlite3_column_text(st, 0),
               (const char *)sqlite3_column_text(st, 1), (const char *)sqlite3_column_text(st, 2)))
            break;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return db_err(s, err, "list sandboxes");
    return 0;
}

int store_event_add(struct store *s, const char *sandbox_id, const char *type, const char *state,
                    const char *reason, struct wr_err *err)
{
    sqlite3_stmt *st;
    if (db_fault("store.event", "add event", err) < 0)
        return -1;
    if (sqlite3_prepare_v2(s->db,
                           "INSERT INTO events (sandbox_id, at, type, state, reason) "
                           "VALUES (?1, ?2, ?3, ?4, ?5)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "add event");
    sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now_unix());
    sqlite3_bind_text(st, 3, type, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, reason, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_err(s, err, "add event");
    /* A client can start and stop a sandbox for ever: its history keeps the newest events. */
    if (sqlite3_prepare_v2(s->db,
                           "DELETE FROM events WHERE sandbox_id = ?1 AND seq <= "
                           "(SELECT seq FROM events WHERE sandbox_id = ?1 "
                           "ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "trim events");
    sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, STORE_EVENTS_KEPT);
    rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_err(s, err, "trim events");
    return 0;
}

int store_event_foreach(struct store *s, const char *sandbox_id, int limit,
                        int (*cb)(void *arg, int64_t at, const char *type, const char *state,
                                  const char *reason),
                        void *arg, struct wr_err *err)
{
    sqlite3_stmt *st;
    if (db_fault("store.events", "list events", err) < 0)
        return -1;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT at, type, state, reason FROM events WHERE sandbox_id = ?1 "
                           "ORDER BY seq LIMIT ?2",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "list events");
    sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (cb(arg, sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
               (const char *)sqlite3_column_text(st, 2), (const char *)sqlite3_column_text(st, 3)))
            break;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return db_err(s, err, "list events");
    return 0;
}

/* ---- secrets (sealed by daemon/secrets.c; the store never sees a value) ---- */

int store_secret_put(struct store *s, const char *name, const char *hosts, const char *access,
                     const void *sealed, size_t len, int64_t updated_at, struct wr_err *err)
{
    if (db_fault("store.secret", "store a secret", err) < 0)
        return -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "INSERT INTO secrets (name, hosts, sealed, updated_at, access) "
                           "VALUES (?,?,?,?,?) "
                           "ON CONFLICT(name) DO UPDATE SET hosts=excluded.hosts, "
                           "sealed=excluded.sealed, updated_at=excluded.updated_at, "
                           "access=excluded.access",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "store a secret");
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, hosts, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, sealed, (int)len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, updated_at);
    sqlite3_bind_text(st, 5, access, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_err(s, err, "store a secret");
}

int store_secret_delete(struct store *s, const char *name, struct wr_err *err)
{
    if (db_fault("store.secret", "delete a secret", err) < 0)
        return -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "DELETE FROM secrets WHERE name = ?", -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "delete a secret");
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_err(s, err, "delete a secret");
}

int store_secret_foreach(struct store *s,
                         int (*cb)(void *arg, const char *name, const char *hosts,
                                   const char *access, const void *sealed, size_t len,
                                   int64_t updated_at),
                         void *arg, struct wr_err *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT name, hosts, sealed, updated_at, access FROM secrets "
                           "ORDER BY name",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "list secrets");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        const char *hosts = (const char *)sqlite3_column_text(st, 1);
        const void *blob = sqlite3_column_blob(st, 2);
        size_t len = (size_t)sqlite3_column_bytes(st, 2);
        const char *access = (const char *)sqlite3_column_text(st, 4);
        if (!name || !hosts)
            continue;
        if (cb(arg, name, hosts, access ? access : "{}", blob, len, sqlite3_column_int64(st, 3)) <
            0)
            break;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(s, err, "list secrets");
}

/* ---- API keys (daemon/keys.c; a key's document holds its hash, never the key) ---- */

int store_key_put(struct store *s, const char *id, const char *doc, struct wr_err *err)
{
    if (db_fault("store.key", "store an API key", err) < 0)
        return -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "INSERT INTO api_keys (id, doc) VALUES (?,?) "
                           "ON CONFLICT(id) DO UPDATE SET doc=excluded.doc",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "store an API key");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, doc, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_err(s, err, "store an API key");
}

int store_key_foreach(struct store *s, int (*cb)(void *arg, const char *id, const char *doc),
                      void *arg, struct wr_err *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT id, doc FROM api_keys ORDER BY rowid", -1, &st, NULL) !=
        SQLITE_OK)
        return db_err(s, err, "list API keys");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(st, 0);
        const char *doc = (const char *)sqlite3_column_text(st, 1);
        if (id && doc && cb(arg, id, doc) < 0)
            break;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(s, err, "list API keys");
}

/* ---- the audit trail ---- */

/* Drops the oldest entries when the trail crossed a multiple of 256 (from before to after
 * this seq): trimmed now and then, not on every insert, so the table stays within a few per
 * cent of STORE_AUDIT_KEPT. */
static int audit_trim(struct store *s, sqlite3_int64 before, sqlite3_int64 after,
                      struct wr_err *err)
{
    if (after / 256 == before / 256)
        return 0;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "DELETE FROM audit WHERE seq <= ?", -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "trim the audit trail");
    sqlite3_bind_int64(st, 1, after - STORE_AUDIT_KEPT);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : db_err(s, err, "trim the audit trail");
}

int store_audit_add(struct store *s, const struct store_audit *a, size_t n, struct wr_err *err)
{
    if (n == 0)
        return 0;
    if (db_fault("store.audit", "record an audit entry", err) < 0)
        return -1;
    if (sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return db_err(s, err, "record an audit entry");
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "INSERT INTO audit (at_ms, key_id, method, route, sandbox_id, status) "
                           "VALUES (?,?,?,?,?,?)",
                           -1, &st, NULL) != SQLITE_OK)
        goto fail;
    sqlite3_int64 first = 0;
    for (size_t i = 0; i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, a[i].at_ms);
        sqlite3_bind_text(st, 2, a[i].key_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, a[i].method, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, a[i].route, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, a[i].sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 6, a[i].status);
        if (sqlite3_step(st) != SQLITE_DONE)
            goto fail;
        if (i == 0)
            first = sqlite3_last_insert_rowid(s->db);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (audit_trim(s, first - 1, sqlite3_last_insert_rowid(s->db), err) < 0) {
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        goto fail;
    return 0;
fail:
    db_err(s, err, "record an audit entry");
    sqlite3_finalize(st);
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

int store_audit_foreach(struct store *s, int64_t before_seq, int limit,
                        int (*cb)(void *arg, int64_t seq, const struct store_audit *a), void *arg,
                        struct wr_err *err)
{
    if (db_fault("store.audit", "read the audit trail", err) < 0)
        return -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT seq, at_ms, key_id, method, route, sandbox_id, status FROM "
                           "audit WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "read the audit trail");
    sqlite3_bind_int64(st, 1, before_seq);
    sqlite3_bind_int(st, 2, limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_audit a = {
            .at_ms = sqlite3_column_int64(st, 1),
            .key_id = (const char *)sqlite3_column_text(st, 2),
            .method = (const char *)sqlite3_column_text(st, 3),
            .route = (const char *)sqlite3_column_text(st, 4),
            .sandbox_id = (const char *)sqlite3_column_text(st, 5),
            .status = sqlite3_column_int(st, 6),
        };
        if (!a.key_id || !a.method || !a.route || !a.sandbox_id)
            continue;
        if (cb(arg, sqlite3_column_int64(st, 0), &a) < 0)
            break;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(s, err, "read the audit trail");
}

/* ---- the usage ledger ---- */

int store_usage_add(struct store *s, const struct store_usage *rows, size_t n, struct wr_err *err)
{
    if (n == 0)
        return 0;
    if (db_fault("store.usage", "record usage", err) < 0)
        return -1;
    if (sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return db_err(s, err, "record usage");
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "INSERT INTO usage (sandbox_id, minute, key_id, cost_micros, cpu_usec, "
                           "memory_mib_ms) VALUES (?,?,?,?,?,?) ON CONFLICT (sandbox_id, minute) "
                           "DO UPDATE SET cost_micros = cost_micros + excluded.cost_micros, "
                           "cpu_usec = cpu_usec + excluded.cpu_usec, "
                           "memory_mib_ms = memory_mib_ms + excluded.memory_mib_ms",
                           -1, &st, NULL) != SQLITE_OK) {
        db_err(s, err, "record usage");
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, rows[i].sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, rows[i].minute);
        sqlite3_bind_text(st, 3, rows[i].key_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, rows[i].cost_micros);
        sqlite3_bind_int64(st, 5, rows[i].cpu_usec);
        sqlite3_bind_int64(st, 6, rows[i].memory_mib_ms);
        if (sqlite3_step(st) != SQLITE_DONE) {
            db_err(s, err, "record usage");
            sqlite3_finalize(st);
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
    }
    sqlite3_finalize(st);
    if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        db_err(s, err, "record usage");
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return 0;
}

int store_usage_sum(struct store *s, enum store_usage_group g, int64_t from_minute,
                    int64_t to_minute, const char *key_id, const char *sandbox_id, int limit,
                    int (*cb)(void *arg, const char *group, const struct store_usage *sum),
                    void *arg, struct wr_err *err)
{
    if (db_fault("store.usage", "read usage", err) < 0)
        return -1;
    /* The group's column is one of three fixed expressions, never text from a request. */
    static const char *const cols[] = {"sandbox_id", "key_id", "minute / 1440", "minute"};
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT %s AS g, SUM(cost_micros), SUM(cpu_usec), SUM(memory_mib_ms) FROM usage "
             "WHERE minute >= ?1 AND minute < ?2 AND (?3 IS NULL OR key_id = ?3) AND "
             "(?4 IS NULL OR sandbox_id = ?4) GROUP BY g ORDER BY g LIMIT ?5",
             cols[g]);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return db_err(s, err, "read usage");
    sqlite3_bind_int64(st, 1, from_minute);
    sqlite3_bind_int64(st, 2, to_minute);
    if (key_id)
        sqlite3_bind_text(st, 3, key_id, -1, SQLITE_STATIC);
    if (sandbox_id)
        sqlite3_bind_text(st, 4, sandbox_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        char group[64];
        int timed = g == STORE_USAGE_BY_DAY || g == STORE_USAGE_BY_MINUTE;
        snprintf(group, sizeof(group), "%s", timed ? "" : (const char *)sqlite3_column_text(st, 0));
        struct store_usage u = {
            .minute = g == STORE_USAGE_BY_DAY      ? sqlite3_column_int64(st, 0) * 1440
                      : g == STORE_USAGE_BY_MINUTE ? sqlite3_column_int64(st, 0)
                                                   : 0,
            .cost_micros = sqlite3_column_int64(st, 1),
            .cpu_usec = sqlite3_column_int64(st, 2),
            .memory_mib_ms = sqlite3_column_int64(st, 3),
        };
        if (cb(arg, group, &u) != 0)
            break;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return db_err(s, err, "read usage");
    return 0;
}

int store_usage_compact(struct store *s, int64_t before_minute, struct wr_err *err)
{
    if (db_fault("store.usage", "compact usage", err) < 0)
        return -1;
    /* Rows before the cutoff's day become one row per sandbox per day (at the day's first
     * minute, which is inside the range deleted, so it never meets a row it would add to). */
    int64_t cut = before_minute - before_minute % 1440;
    static const char *const steps[] = {
        "CREATE TEMP TABLE IF NOT EXISTS usage_days (sandbox_id TEXT, minute INTEGER, key_id "
        "TEXT, cost_micros INTEGER, cpu_usec INTEGER, memory_mib_ms INTEGER)",
        "DELETE FROM usage_days",
        "INSERT INTO usage_days SELECT sandbox_id, (minute / 1440) * 1440, MAX(key_id), "
        "SUM(cost_micros), SUM(cpu_usec), SUM(memory_mib_ms) FROM usage WHERE minute < ?1 "
        "GROUP BY sandbox_id, minute / 1440",
        "DELETE FROM usage WHERE minute < ?1",
        "INSERT INTO usage SELECT * FROM usage_days",
        "DELETE FROM usage_days",
    };
    if (sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return db_err(s, err, "compact usage");
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(s->db, steps[i], -1, &st, NULL);
        if (rc == SQLITE_OK) {
            if (sqlite3_bind_parameter_count(st) > 0)
                sqlite3_bind_int64(st, 1, cut);
            rc = sqlite3_step(st);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
        }
        sqlite3_finalize(st);
        if (rc != SQLITE_OK) {
            db_err(s, err, "compact usage");
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
    }
    if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        db_err(s, err, "compact usage");
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return 0;
}
