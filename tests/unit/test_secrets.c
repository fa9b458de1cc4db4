/*
 * Secrets (daemon/secrets.h): sealed in the database under a key kept beside it, opened again by
 * a daemon with that key and by no other, checked on the way in, and put into request heads
 * only in credential fields (Authorization and the ones declared), only for the hosts and ports
 * they are bound to, and only for sandboxes whose owner the admin granted them to.
 */
#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "daemon/secrets.h"
#include "store/store.h"
#include "tap.h"

#define VALUE "ghp_TopSecretValue0123456789"

static char dir[64], dbpath[128], keypath[128];

static json_t *hosts(const char *a, const char *b)
{
    return b ? json_pack("[s, s]", a, b) : json_pack("[s]", a);
}

static int set(struct secrets *s, struct store *st, const char *name, const char *value, json_t *h,
               struct wr_err *err)
{
    struct secret_fields f = {.hosts = h};
    return secrets_set(s, st, name, value, strlen(value), &f, err);
}

/* head rewritten for owner at host:port: 1 if the value went in, 0 if not (freed either way) */
static int injected(struct secrets *s, json_t *ph, const char *owner, const char *host, int port,
                    const char *head)
{
    size_t outlen = 0;
    char *out = secrets_rewrite_head(s, ph, owner, host, port, head, strlen(head), &outlen);
    int in = out && memmem(out, outlen, VALUE, strlen(VALUE));
    free(out);
    return in;
}

/* Who may use a secret, and a grant changed after the sandbox was made. */
static void owners(struct secrets *s, struct store *st, json_t *ph, const char *head)
{
    struct wr_err err = {0};
    ok(injected(s, ph, "", "api.github.test", 443, head),
       "the admin's sandboxes may use a secret granted to nobody");
    ok(!injected(s, ph, "key_A", "api.github.test", 443, head) && !secrets_usable(s, "GH", "key_A"),
       "a key's may not: the secret is the admin's alone until granted");
    struct secret_fields f = {.keys = json_pack("[s, s]", "key_A", "key_A")};
    ok(secrets_update(s, st, "GH", &f, &err) == 0, "granted to key_A: %s", err.msg);
    json_decref(f.keys);
    ok(injected(s, ph, "key_A", "api.github.test", 443, head) && secrets_usable(s, "GH", "key_A"),
       "key_A's sandboxes now get the value");
    ok(!injected(s, ph, "key_B", "api.github.test", 443, head) && !secrets_usable(s, "GH", "key_B"),
       "key_B's do not");
    json_t *one = secrets_get_json(s, "GH");
    char *text = json_dumps(one, JSON_COMPACT);
    ok(text && strstr(text, "\"keys\":[\"key_A\"]") && strstr(text, "\"api.github.test\"") &&
           !strstr(text, VALUE),
       "an update keeps hosts and value, drops the duplicate: %s", text ? text : "?");
    free(text);
    json_decref(one);
    f.keys = json_array();
    ok(secrets_update(s, st, "GH", &f, &err) == 0 &&
           !injected(s, ph, "key_A", "api.github.test", 443, head),
       "the grant taken back: key_A's next request gets nothing");
    json_decref(f.keys);
    ok(secrets_update(s, st, "NOPE", &f, &err) < 0 && err.kind == WR_E_NOT_FOUND,
       "updating a secret that is not there: not found");
    f.keys = json_pack("[i]", 7);
    ok(secrets_update(s, st, "GH", &f, &err) < 0 && err.kind == WR_E_INVALID &&
           strstr(err.msg, "keys[0]"),
       "a key that is not a string is refused: %s", err.msg);
    json_decref(f.keys);
}

/* Only credential fields, only safe methods. */
static void fields(struct secrets *s, struct store *st, json_t *ph, const char *p)
{
    struct wr_err err = {0};
    char head[2048], want[2048];
    size_t outlen = 0;
    snprintf(head, sizeof(head),
             "GET /q=%s HTTP/1.1\r\nHost: %s.api.github.test\r\nOrigin: https://%s\r\n"
             "X-Api-Key: %s\r\nX-Echo: %s\r\nauthorization: Bearer %s\r\n"
             "X-Not-Authorization: %s\r\n\r\n",
             p, p, p, p, p, p, p);
    char *out =
        secrets_rewrite_head(s, ph, "", "api.github.test", 443, head, strlen(head), &outlen);
    snprintf(want, sizeof(want),
             "GET /q=%s HTTP/1.1\r\nHost: %s.api.github.test\r\nOrigin: https://%s\r\n"
             "X-Api-Key: %s\r\nX-Echo: %s\r\nauthorization: Bearer %s\r\n"
             "X-Not-Authorization: %s\r\n\r\n",
             p, p, p, p, p, VALUE, p);
    ok(out && outlen == strlen(want) && !memcmp(out, want, outlen),
       "only Authorization (any case) gets the value: not the request line, Host, Origin, an "
       "undeclared field or one whose name merely ends in it");
    free(out);
    struct secret_fields f = {.headers = json_pack("[s, s]", "x-api-key", "Authorization")};
    ok(secrets_update(s, st, "GH", &f, &err) == 0, "X-Api-Key declared: %s", err.msg);
    json_decref(f.headers);
    out = secrets_rewrite_head(s, ph, "", "api.github.test", 443, head, strlen(head), &outlen);
    snprintf(want, sizeof(want),
             "GET /q=%s HTTP/1.1\r\nHost: %s.api.github.test\r\nOrigin: https://%s\r\n"
             "X-Api-Key: %s\r\nX-Echo: %s\r\nauthorization: Bearer %s\r\n"
             "X-Not-Authorization: %s\r\n\r\n",
             p, p, p, VALUE, p, VALUE, p);
    ok(out && outlen == strlen(want) && !memcmp(out, want, outlen),
       "a declared field gets it too, and nothing else changes");
    free(out);
    static const char *const methods[] = {"TRACE", "OPTIONS", "CONNECT", "PROPFIND", "get", NULL};
    for (size_t i = 0; methods[i]; i++) {
        snprintf(head, sizeof(head),
                 "%s / HTTP/1.1\r\nHost: api.github.test\r\n"
                 "Authorization: Bearer %s\r\n\r\n",
                 methods[i], p);
        ok(!injected(s, ph, "", "api.github.test", 443, head), "%s gets no value", methods[i]);
    }
    static const char *const bad[] = {
        "Host", "origin", "Content-Length", "Transfer-Encoding", "X Api", "X-Api:", "", NULL};
    for (size_t i = 0; bad[i]; i++) {
        f.headers = json_pack("[s]", bad[i]);
        ok(secrets_update(s, st, "GH", &f, &err) < 0 && err.kind == WR_E_INVALID &&
               strstr(err.msg, "headers[0]"),
           "declaring \"%s\" is refused: %s", bad[i], err.msg);
        json_decref(f.headers);
    }
    f.headers = json_array();
    ok(secrets_update(s, st, "GH", &f, &err) == 0, "declarations cleared");
    json_decref(f.headers);
}

/* A binding's port: 443 unless it names one. */
static void ports(struct secrets *s, struct store *st, json_t *ph, const char *head)
{
    struct wr_err err = {0};
    ok(injected(s, ph, "", "api.github.test", 443, head) &&
           !injected(s, ph, "", "api.github.test", 8443, head) &&
           !injected(s, ph, "", "api.github.test", 80, head),
       "bound to api.github.test: on 443 only, not 8443 or 80");
    struct secret_fields f = {.hosts = hosts("api.github.test:8443", "*.example.test")};
    ok(secrets_update(s, st, "GH", &f, &err) == 0, "bound to api.github.test:8443: %s", err.msg);
    json_decref(f.hosts);
    ok(injected(s, ph, "", "api.github.test", 8443, head) &&
           !injected(s, ph, "", "api.github.test", 443, head) &&
           injected(s, ph, "", "a.example.test", 443, head) &&
           !injected(s, ph, "", "a.example.test", 8443, head),
       "then on 8443 only, and the wildcard still on 443 only");
    json_t *one = secrets_get_json(s, "GH");
    char *text = json_dumps(json_object_get(one, "hosts"), JSON_COMPACT);
    ok(text && !strcmp(text, "[\"api.github.test:8443\",\"*.example.test\"]"),
       "hosts are listed as given: %s", text ? text : "?");
    free(text);
    json_decref(one);
    f.hosts = hosts("api.github.test", "*.example.test");
    ok(secrets_update(s, st, "GH", &f, &err) == 0, "bound back to 443");
    json_decref(f.hosts);
}

/* A database from before `access`: opened, its secrets the admin's alone. */
static void migration(struct store **st, json_t *ph, const char *head)
{
    struct wr_err err = {0};
    struct secrets *s = secrets_open(dir, *st, &err);
    struct secret_fields f = {.keys = json_pack("[s]", "key_A")};
    ok(s && secrets_update(s, *st, "GH", &f, &err) == 0, "granted to key_A");
    json_decref(f.keys);
    secrets_free(s);
    store_close(*st);
    sqlite3 *db = NULL;
    int dropped =
        sqlite3_open(dbpath, &db) == SQLITE_OK &&
        sqlite3_exec(db, "ALTER TABLE secrets DROP COLUMN access", NULL, NULL, NULL) == SQLITE_OK;
    sqlite3_close(db);
    ok(dropped, "the column dropped, as an older daemon's database");
    *st = store_open(dbpath, &err);
    s = *st ? secrets_open(dir, *st, &err) : NULL;
    ok(s && secrets_exists(s, "GH"), "the older database opens, its secret in it: %s", err.msg);
    ok(s && injected(s, ph, "", "api.github.test", 443, head) &&
           !injected(s, ph, "key_A", "api.github.test", 443, head),
       "usable by the admin's sandboxes alone");
    json_t *one = s ? secrets_get_json(s, "GH") : NULL;
    ok(one && json_array_size(json_object_get(one, "keys")) == 0 &&
           json_array_size(json_object_get(one, "headers")) == 0,
       "listed with no keys and no headers");
    json_decref(one);
    secrets_free(s);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/wr-secrets-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(dbpath, sizeof(dbpath), "%s/withruntime.db", dir);
    snprintf(keypath, sizeof(keypath), "%s/secrets.key", dir);
    struct wr_err err = {0};
    struct store *st = store_open(dbpath, &err);
    ok(st != NULL, "store opens: %s", err.msg);
    struct secrets *s = secrets_open(dir, st, &err);
    ok(s != NULL, "secrets open on an empty state directory: %s", err.msg);
    struct stat sb;
    ok(stat(keypath, &sb) == 0 && sb.st_size == 32 && (sb.st_mode & 0777) == 0600,
       "the key is made: 32 bytes, mode 0600");

    /* checks on the way in */
    json_t *h = hosts("API.GitHub.test.", "*.example.test");
    ok(set(s, st, "lower", "v", h, &err) < 0 && err.kind == WR_E_INVALID,
       "a lower-case name is refused: %s", err.msg);
    ok(set(s, st, "9X", "v", h, &err) < 0, "a name starting with a digit is refused");
    ok(set(s, st, "OK", "a\r\nb", h, &err) < 0 && !strstr(err.msg, "a\r\nb"),
       "a value with CR LF is refused, and not quoted: %s", err.msg);
    ok(set(s, st, "OK", "", h, &err) < 0, "an empty value is refused");
    json_t *bad = hosts("127.0.0.1", NULL);
    ok(set(s, st, "OK", "v", bad, &err) < 0 && strstr(err.msg, "hosts"),
       "an address as a host is refused: %s", err.msg);
    json_decref(bad);
    json_t *none = json_array();
    ok(set(s, st, "OK", "v", none, &err) < 0, "no hosts is refused");
    json_decref(none);

    ok(set(s, st, "GH", VALUE, h, &err) == 0, "a secret is set: %s", err.msg);
    json_decref(h);
    json_t *one = secrets_get_json(s, "GH");
    char *text = json_dumps(one, JSON_COMPACT);
    ok(text && strstr(text, "\"api.github.test\"") && strstr(text, "\"*.example.test\"") &&
           !strstr(text, VALUE),
       "it is listed normalised, without its value: %s", text ? text : "?");
    free(text);
    json_decref(one);
    json_t *list = secrets_list_json(s);
    text = json_dumps(list, JSON_COMPACT);
    ok(text && !strstr(text, VALUE), "the list holds no value");
    free(text);
    json_decref(list);
    ok(!tap_file_has(dbpath, VALUE) && !tap_file_has(keypath, VALUE),
       "neither the database nor the key file holds the value");
    char wal[160];
    snprintf(wal, sizeof(wal), "%s-wal", dbpath);
    ok(!tap_file_has(wal, VALUE), "nor the database's write-ahead log");

    /* rewriting */
    json_t *ph = json_object();
    char p[SECRET_PLACEHOLDER_LEN + 1], q[SECRET_PLACEHOLDER_LEN + 1];
    secrets_placeholder(p);
    secrets_placeholder(q);
    ok(strlen(p) == SECRET_PLACEHOLDER_LEN && !strncmp(p, "wr-placeholder-", 15) && strcmp(p, q),
       "placeholders are random: %s %s", p, q);
    json_object_set_new(ph, "GH", json_string(p));
    json_object_set_new(ph, "GONE", json_string(q)); /* a secret deleted since: left alone */
    char head[1024];
    snprintf(head, sizeof(head),
             "GET /search?q=%s HTTP/1.1\r\nHost: api.github.test\r\nAuthorization: Bearer %s,%s\r\n"
             "Authorization: %s\r\nX-Other: %s\r\n\r\n",
             p, p, p, q, p);
    size_t outlen = 0;
    char *out =
        secrets_rewrite_head(s, ph, "", "api.github.test", 443, head, strlen(head), &outlen);
    ok(out != NULL, "a head to the bound host is rewritten");
    if (out) {
        char want[1024];
        snprintf(want, sizeof(want),
                 "GET /search?q=%s HTTP/1.1\r\nHost: api.github.test\r\nAuthorization: Bearer "
                 "%s,%s\r\nAuthorization: %s\r\nX-Other: %s\r\n\r\n",
                 p, VALUE, VALUE, q, p);
        ok(outlen == strlen(want) && !memcmp(out, want, outlen),
           "every placeholder in Authorization fields is replaced, the request line's and "
           "another field's are not, and an unknown secret's placeholder stays");
        free(out);
    }
    ok(injected(s, ph, "", "a.b.example.test", 443, head),
       "a wildcard host matches a name under it");
    ok(!injected(s, ph, "", "example.test", 443, head),
       "the wildcard does not match the name itself");
    ok(!injected(s, ph, "", "evil.test", 443, head), "another host gets nothing");
    ok(!injected(s, ph, "", "api.github.test.evil.test", 443, head), "a lookalike gets nothing");
    owners(s, st, ph, head);
    fields(s, st, ph, p);
    ports(s, st, ph, head);

    /* a daemon restarted with the same key opens it; one with another key does not */
    secrets_free(s);
    s = secrets_open(dir, st, &err);
    ok(s && secrets_exists(s, "GH"), "reopened with its key, the secret is there: %s", err.msg);
    ok(s && injected(s, ph, "", "api.github.test", 443, head), "and its value is the same");
    secrets_free(s);
    migration(&st, ph, head);
    unlink(keypath);
    s = secrets_open(dir, st, &err);
    ok(s && !secrets_exists(s, "GH"),
       "with another key the sealed value does not open (the secret is not usable)");
    list = s ? secrets_list_json(s) : NULL;
    text = list ? json_dumps(list, JSON_COMPACT) : NULL;
    ok(text && strstr(text, "\"GH\""), "but it is listed, to be set again or deleted: %s",
       text ? text : "?");
    free(text);
    json_decref(list);
    secrets_free(s);
    chmod(keypath, 0644);
    s = secrets_open(dir, st, &err);
    ok(!s && strstr(err.msg, "chmod"), "a key readable by others is refused: %s", err.msg);
    secrets_free(s);
    chmod(keypath, 0600);
    s = secrets_open(dir, st, &err);
    ok(s && secrets_delete(s, st, "GH", &err) == 0 && !secrets_exists(s, "GH"),
       "a secret is deleted");
    ok(secrets_delete(s, st, "GH", &err) < 0 && err.kind == WR_E_NOT_FOUND,
       "deleting it again is not found");
    secrets_free(s);
    json_decref(ph);
    store_close(st);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return tap_done();
}
