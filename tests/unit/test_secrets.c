/*
 * Secrets (daemon/secrets.h): sealed in the database under a key kept beside it, opened again by
 * a daemon with that key and by no other, checked on the way in, and put into request heads
 * only in header fields and only for the hosts they are bound to.
 */
#include <jansson.h>
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
    ok(secrets_set(s, st, "lower", "v", 1, h, &err) < 0 && err.kind == WR_E_INVALID,
       "a lower-case name is refused: %s", err.msg);
    ok(secrets_set(s, st, "9X", "v", 1, h, &err) < 0, "a name starting with a digit is refused");
    ok(secrets_set(s, st, "OK", "a\r\nb", 4, h, &err) < 0 && !strstr(err.msg, "a\r\nb"),
       "a value with CR LF is refused, and not quoted: %s", err.msg);
    ok(secrets_set(s, st, "OK", "", 0, h, &err) < 0, "an empty value is refused");
    json_t *bad = hosts("127.0.0.1", NULL);
    ok(secrets_set(s, st, "OK", "v", 1, bad, &err) < 0 && strstr(err.msg, "hosts"),
       "an address as a host is refused: %s", err.msg);
    json_decref(bad);
    json_t *none = json_array();
    ok(secrets_set(s, st, "OK", "v", 1, none, &err) < 0, "no hosts is refused");
    json_decref(none);

    ok(secrets_set(s, st, "GH", VALUE, strlen(VALUE), h, &err) == 0, "a secret is set: %s",
       err.msg);
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
             "GET /search?q=%s HTTP/1.1\r\nHost: api.github.test\r\nAuthorization: Bearer %s\r\n"
             "X-Two: %s,%s\r\nX-Other: %s\r\n\r\n",
             p, p, p, p, q);
    size_t outlen = 0;
    char *out = secrets_rewrite_head(s, ph, "api.github.test", head, strlen(head), &outlen);
    ok(out != NULL, "a head to the bound host is rewritten");
    if (out) {
        char want[1024];
        snprintf(want, sizeof(want),
                 "GET /search?q=%s HTTP/1.1\r\nHost: api.github.test\r\nAuthorization: Bearer "
                 "%s\r\nX-Two: %s,%s\r\nX-Other: %s\r\n\r\n",
                 p, VALUE, VALUE, VALUE, q);
        ok(outlen == strlen(want) && !memcmp(out, want, outlen),
           "every placeholder in the header fields is replaced, the request line's is not, "
           "and an unknown secret's placeholder stays");
        free(out);
    }
    out = secrets_rewrite_head(s, ph, "a.b.example.test", head, strlen(head), &outlen);
    ok(out != NULL, "a wildcard host matches a name under it");
    free(out);
    ok(secrets_rewrite_head(s, ph, "example.test", head, strlen(head), &outlen) == NULL,
       "the wildcard does not match the name itself");
    ok(secrets_rewrite_head(s, ph, "evil.test", head, strlen(head), &outlen) == NULL,
       "another host gets nothing");
    ok(secrets_rewrite_head(s, ph, "api.github.test.evil.test", head, strlen(head), &outlen) ==
           NULL,
       "a lookalike gets nothing");
    ok(secrets_bound(s, ph, "api.github.test") && !secrets_bound(s, ph, "evil.test"),
       "secrets_bound says which hosts are bound");

    /* a daemon restarted with the same key opens it; one with another key does not */
    secrets_free(s);
    s = secrets_open(dir, st, &err);
    ok(s && secrets_exists(s, "GH"), "reopened with its key, the secret is there: %s", err.msg);
    out = s ? secrets_rewrite_head(s, ph, "api.github.test", head, strlen(head), &outlen) : NULL;
    ok(out && memmem(out, outlen, VALUE, strlen(VALUE)), "and its value is the same");
    free(out);
    secrets_free(s);
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
