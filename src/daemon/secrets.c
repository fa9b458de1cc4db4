/*
 * Secrets bound to hosts and ports, usable by the keys the admin names, sealed at rest
 * (secrets.h). Who may use one and which header fields it goes into are kept beside the sealed
 * value, in the `access` column ({"keys": [...], "headers": [...]}): a secret stored before that
 * column existed reads as {}, the admin's alone, until the admin grants it to keys.
 */
#include "daemon/secrets.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "net/inject.h"
#include "net/netpolicy.h"
#include "store/store.h"

#define KEY_LEN 32
#define NONCE_LEN 12
#define TAG_LEN 16
#define SEAL_VERSION 1
#define SEALED_MAX (1 + NONCE_LEN + SECRET_VALUE_MAX + TAG_LEN)

struct secret {
    char name[SECRET_NAME_MAX + 1];
    json_t *hosts;   /* the normalised list, as shown */
    json_t *policy;  /* {"internet": true, "allow": hosts with ":443" where they name no port} */
    json_t *keys;    /* key ids whose sandboxes may use it; [] = the admin's alone */
    json_t *headers; /* field names besides Authorization that may carry it */
    char *value;
    size_t len;
    int64_t updated_at;
    struct secret *next;
};

struct secrets {
    unsigned char key[KEY_LEN];
    struct secret *list;
    unsigned n;
};

int secrets_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n < 1 || n > SECRET_NAME_MAX || (name[0] >= '0' && name[0] <= '9'))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

static int value_valid(const char *v, size_t len)
{
    if (len < 1 || len > SECRET_VALUE_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] > 0x7e)
            return 0;
    return 1;
}

/* ---- the key and sealing ---- */

static int read_or_make_key(const char *state_dir, unsigned char key[KEY_LEN], struct wr_err *err)
{
    char path[4200], tmp[4210];
    snprintf(path, sizeof(path), "%s/secrets.key", state_dir);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        struct stat st;
        ssize_t n = fstat(fd, &st) == 0 && st.st_size == KEY_LEN ? read(fd, key, KEY_LEN) : -1;
        close(fd);
        if (n != KEY_LEN)
            return wr_err_set(err, EINVAL, "%s is not a %d-byte key", path, KEY_LEN);
        if ((st.st_mode & 077) != 0)
            return wr_err_set(err, EPERM, "%s is readable by others (mode %o): chmod 600 it", path,
                              (unsigned)(st.st_mode & 0777));
        return 0;
    }
    if (errno != ENOENT)
        return wr_err_sys(err, errno, "opening %s", path);
    if (getrandom(key, KEY_LEN, 0) != KEY_LEN)
        return wr_err_sys(err, errno, "getrandom");
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return wr_err_sys(err, errno, "creating %s", tmp);
    int ok = write_all(fd, key, KEY_LEN) == 0 && fsync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp, path) < 0)
        return wr_err_sys(err, errno, "writing %s", path);
    log_info(NULL, "secrets.key_created", "path=\"%s\"", path);
    return 0;
}

/* version | nonce | ciphertext | tag, into out (cap >= 1 + NONCE_LEN + len + TAG_LEN). */
static int seal(const unsigned char *key, const char *name, const char *value, size_t len,
                unsigned char *out, size_t *outlen)
{
    out[0] = SEAL_VERSION;
    unsigned char *nonce = out + 1, *ct = out + 1 + NONCE_LEN;
    if (getrandom(nonce, NONCE_LEN, 0) != NONCE_LEN)
        return -1;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int n = 0, f = 0,
        ok = c && EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, nonce) == 1 &&
             EVP_EncryptUpdate(c, NULL, &n, (const unsigned char *)name, (int)strlen(name)) == 1 &&
             EVP_EncryptUpdate(c, ct, &n, (const unsigned char *)value, (int)len) == 1 &&
             EVP_EncryptFinal_ex(c, ct + n, &f) == 1 &&
             EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG_LEN, ct + n + f) == 1;
    EVP_CIPHER_CTX_free(c);
    if (!ok)
        return -1;
    *outlen = 1 + NONCE_LEN + (size_t)(n + f) + TAG_LEN;
    return 0;
}

/* Opens a sealed value into a new buffer (NUL-terminated); NULL if it does not authenticate. */
static char *unseal(const unsigned char *key, const char *name, const unsigned char *in, size_t len,
                    size_t *outlen)
{
    if (len < 1 + NONCE_LEN + TAG_LEN || len > SEALED_MAX || in[0] != SEAL_VERSION)
        return NULL;
    size_t ctlen = len - 1 - NONCE_LEN - TAG_LEN;
    const unsigned char *nonce = in + 1, *ct = in + 1 + NONCE_LEN, *tag = ct + ctlen;
    char *out = xmalloc(ctlen + 1);
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int n = 0, f = 0,
        ok = c && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, nonce) == 1 &&
             EVP_DecryptUpdate(c, NULL, &n, (const unsigned char *)name, (int)strlen(name)) == 1 &&
             EVP_DecryptUpdate(c, (unsigned char *)out, &n, ct, (int)ctlen) == 1 &&
             EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG_LEN, (void *)tag) == 1 &&
             EVP_DecryptFinal_ex(c, (unsigned char *)out + n, &f) == 1;
    EVP_CIPHER_CTX_free(c);
    if (!ok) {
        explicit_bzero(out, ctlen + 1);
        free(out);
        return NULL;
    }
    out[ctlen] = '\0';
    *outlen = ctlen;
    return out;
}

/* ---- the set ---- */

static void secret_free(struct secret *x)
{
    if (!x)
        return;
    if (x->value) {
        explicit_bzero(x->value, x->len);
        free(x->value);
    }
    json_decref(x->hosts);
    json_decref(x->policy);
    json_decref(x->keys);
    json_decref(x->headers);
    free(x);
}

static struct secret *find(const struct secrets *s, const char *name)
{
    for (struct secret *x = s->list; x; x = x->next)
        if (!strcmp(x->name, name))
            return x;
    return NULL;
}

/* hosts checked and normalised as a policy's allow list; NULL with err naming the entry. */
static json_t *parse_hosts(json_t *hosts, json_t **policy, struct wr_err *err)
{
    if (!json_is_array(hosts) || json_array_size(hosts) < 1 ||
        json_array_size(hosts) > SECRET_HOSTS_MAX) {
        wr_err_kind(err, WR_E_INVALID, 0, "hosts: must be 1 to %d host names", SECRET_HOSTS_MAX);
        return NULL;
    }
    json_t *in = json_pack("{s:b, s:O}", "internet", 1, "allow", hosts);
    json_t *p = netpolicy_parse(in, err);
    json_decref(in);
    if (!p) {
        wr_err_prefix(err, "hosts");
        return NULL;
    }
    /* A policy's entry without a port covers 80 and 443; a secret's, only 443: it is injected
     * over TLS alone, and a port it was not bound to may be another service's. */
    json_t *norm = json_incref(json_object_get(p, "allow")), *ported = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(norm, i, e)
    {
        const char *h = json_string_value(e);
        json_array_append_new(ported, strchr(h, ':') ? json_string(h)
                                                     : json_sprintf("%s:%d", h, SECRET_PORT));
    }
    json_object_set_new(p, "allow", ported);
    *policy = p;
    return norm;
}

/* Whether name is an HTTP field name (RFC 9110 token characters). */
static int field_name_ok(const char *name, size_t n)
{
    if (n < 1 || n > SECRET_HEADER_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("!#$%&'*+-.^_`|~", c)))
            return 0;
    }
    return 1;
}

/* Fields a value must never go into: what routes or frames the request (rewriting them changes
 * where it goes or how it is read) and Origin, which servers echo back by design (CORS). */
static const char *const never_fields[] = {
    "host",       "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer",
    "keep-alive", "expect",         "proxy-connection",  "origin",     NULL};

/* headers: a list of field names, normalised (duplicates and Authorization dropped); NULL with
 * err naming the entry. */
static json_t *parse_headers(json_t *headers, struct wr_err *err)
{
    if (!json_is_array(headers) || json_array_size(headers) > SECRET_HEADERS_MAX) {
        wr_err_kind(err, WR_E_INVALID, 0, "headers: must be a list of at most %d header names",
                    SECRET_HEADERS_MAX);
        return NULL;
    }
    json_t *out = json_array(), *e;
    size_t i, j;
    json_array_foreach(headers, i, e)
    {
        const char *h = json_string_value(e);
        if (!h || !field_name_ok(h, json_string_length(e))) {
            wr_err_kind(err, WR_E_INVALID, 0,
                        "headers[%zu]: must be a header name (1 to %d of "
                        "A-Z, a-z, 0-9 and !#$%%&'*+-.^_`|~)",
                        i, SECRET_HEADER_NAME_MAX);
            json_decref(out);
            return NULL;
        }
        for (j = 0; never_fields[j]; j++)
            if (!strcasecmp(h, never_fields[j])) {
                wr_err_kind(err, WR_E_INVALID, 0,
                            "headers[%zu]: a secret never goes into %s (it routes or frames "
                            "the request, or servers echo it back)",
                            i, h);
                json_decref(out);
                return NULL;
            }
        int dup = !strcasecmp(h, "authorization"); /* always one */
        json_t *seen;
        json_array_foreach(out, j, seen) dup |= !strcasecmp(json_string_value(seen), h);
        if (!dup)
            json_array_append_new(out, json_string(h));
    }
    return out;
}

/* keys: a list of key ids (the caller checked that they are keys), duplicates dropped. */
static json_t *parse_keys(json_t *keys, struct wr_err *err)
{
    if (!json_is_array(keys) || json_array_size(keys) > SECRET_KEYS_MAX) {
        wr_err_kind(err, WR_E_INVALID, 0, "keys: must be a list of at most %d key ids",
                    SECRET_KEYS_MAX);
        return NULL;
    }
    json_t *out = json_array(), *e, *seen;
    size_t i, j;
    json_array_foreach(keys, i, e)
    {
        const char *k = json_string_value(e);
        if (!k || json_string_length(e) < 1 || json_string_length(e) > 31) {
            wr_err_kind(err, WR_E_INVALID, 0, "keys[%zu]: must be a key id (key_...)", i);
            json_decref(out);
            return NULL;
        }
        int dup = 0;
        json_array_foreach(out, j, seen) dup |= !strcmp(json_string_value(seen), k);
        if (!dup)
            json_array_append_new(out, json_string(k));
    }
    return out;
}

/* Adds or replaces name in memory (takes value and the references). */
static void put(struct secrets *s, const char *name, char *value, size_t len, json_t *hosts,
                json_t *policy, json_t *keys, json_t *headers, int64_t updated_at)
{
    struct secret *x = find(s, name);
    if (!x) {
        x = xcalloc(1, sizeof(*x));
        snprintf(x->name, sizeof(x->name), "%s", name);
        x->next = s->list;
        s->list = x;
        s->n++;
    } else {
        if (x->value) {
            explicit_bzero(x->value, x->len);
            free(x->value);
        }
        json_decref(x->hosts);
        json_decref(x->policy);
        json_decref(x->keys);
        json_decref(x->headers);
    }
    x->value = value;
    x->len = len;
    x->hosts = hosts;
    x->policy = policy;
    x->keys = keys;
    x->headers = headers;
    x->updated_at = updated_at;
}

struct load_ctx {
    struct secrets *s;
    unsigned bad;
};

static int load_one(void *arg, const char *name, const char *hosts_text, const char *access_text,
                    const void *sealed, size_t len, int64_t updated_at)
{
    struct load_ctx *lc = arg;
    json_t *hosts = json_loads(hosts_text, 0, NULL), *policy = NULL, *norm = NULL;
    json_t *access = json_loads(access_text, 0, NULL), *keys = NULL, *headers = NULL;
    json_t *kin = json_object_get(access, "keys"), *hin = json_object_get(access, "headers");
    struct wr_err e = {0};
    size_t vlen = 0;
    char *value =
        hosts && secrets_name_valid(name) ? unseal(lc->s->key, name, sealed, len, &vlen) : NULL;
    if (value)
        norm = parse_hosts(hosts, &policy, &e);
    /* No access (a row from before it was kept): the admin's alone, Authorization only. */
    if (norm && json_is_object(access)) {
        keys = kin ? parse_keys(kin, &e) : json_array();
        headers = hin ? parse_headers(hin, &e) : json_array();
    }
    json_decref(hosts);
    json_decref(access);
    if (!value || !norm || !keys || !headers) {
        json_decref(keys);
        json_decref(headers);
        lc->bad++;
        log_error(NULL, "secrets.unusable", "name=\"%.64s\" why=\"%s\"", name,
                  !value  ? "cannot unseal it (another secrets.key?)"
                  : !norm ? "bad hosts"
                          : "bad access");
        if (value) {
            explicit_bzero(value, vlen);
            free(value);
        }
        json_decref(norm);
        json_decref(policy);
        /* Kept without a value, so that it is listed and can be deleted or set again. */
        if (secrets_name_valid(name))
            put(lc->s, name, NULL, 0, json_array(), NULL, json_array(), json_array(), updated_at);
        return 0;
    }
    put(lc->s, name, value, vlen, norm, policy, keys, headers, updated_at);
    return 0;
}

struct secrets *secrets_open(const char *state_dir, struct store *store, struct wr_err *err)
{
    struct secrets *s = xcalloc(1, sizeof(*s));
    if (read_or_make_key(state_dir, s->key, err) < 0) {
        free(s);
        return NULL;
    }
    struct load_ctx lc = {.s = s};
    if (store_secret_foreach(store, load_one, &lc, err) < 0) {
        secrets_free(s);
        return NULL;
    }
    if (s->n || lc.bad)
        log_info(NULL, "secrets.loaded", "count=%u unusable=%u", s->n, lc.bad);
    return s;
}

void secrets_free(struct secrets *s)
{
    if (!s)
        return;
    while (s->list) {
        struct secret *x = s->list;
        s->list = x->next;
        secret_free(x);
    }
    explicit_bzero(s->key, sizeof(s->key));
    free(s);
}

/* Seals value and stores the secret with these fields, then holds it in memory (takes the
 * references: released on failure too). */
static int store_and_put(struct secrets *s, struct store *store, const char *name,
                         const char *value, size_t len, json_t *hosts, json_t *policy, json_t *keys,
                         json_t *headers, struct wr_err *err)
{
    unsigned char sealed[SEALED_MAX];
    size_t slen = 0;
    char *htext = json_dumps(hosts, JSON_COMPACT);
    json_t *access = json_pack("{s:O, s:O}", "keys", keys, "headers", headers);
    char *atext = json_dumps(access, JSON_COMPACT);
    json_decref(access);
    int64_t now = now_unix();
    int rc = seal(s->key, name, value, len, sealed, &slen) < 0
                 ? wr_err_set(err, EIO, "cannot seal the secret")
                 : store_secret_put(store, name, htext, atext, sealed, slen, now, err);
    free(htext);
    free(atext);
    explicit_bzero(sealed, sizeof(sealed));
    if (rc < 0) {
        json_decref(hosts);
        json_decref(policy);
        json_decref(keys);
        json_decref(headers);
        return -1;
    }
    char *copy = xmalloc(len + 1);
    memcpy(copy, value, len);
    copy[len] = '\0';
    put(s, name, copy, len, hosts, policy, keys, headers, now);
    return 0;
}

/* The fields of f parsed, each falling back to *was (new references; NULL was: an empty list);
 * -1 with err naming the field. */
static int parse_fields(const struct secret_fields *f, const struct secret *was, json_t **hosts,
                        json_t **policy, json_t **keys, json_t **headers, struct wr_err *err)
{
    *hosts = *policy = *keys = *headers = NULL;
    if (f->hosts)
        *hosts = parse_hosts(f->hosts, policy, err);
    else if (was) {
        *hosts = json_incref(was->hosts);
        *policy = json_incref(was->policy);
    }
    if (*hosts && f->keys)
        *keys = parse_keys(f->keys, err);
    else if (*hosts)
        *keys = was ? json_incref(was->keys) : json_array();
    if (*keys && f->headers)
        *headers = parse_headers(f->headers, err);
    else if (*keys)
        *headers = was ? json_incref(was->headers) : json_array();
    if (*headers)
        return 0;
    json_decref(*hosts);
    json_decref(*policy);
    json_decref(*keys);
    return -1;
}

int secrets_set(struct secrets *s, struct store *store, const char *name, const char *value,
                size_t len, const struct secret_fields *f, struct wr_err *err)
{
    if (!secrets_name_valid(name))
        return wr_err_kind(err, WR_E_INVALID, 0,
                           "name: must be 1 to %d of A-Z, 0-9 and _, not starting with a digit "
                           "(it becomes an environment variable)",
                           SECRET_NAME_MAX);
    if (!value_valid(value, len))
        return wr_err_kind(err, WR_E_INVALID, 0,
                           "value: must be 1 to %d bytes of printable ASCII (it goes into "
                           "request headers)",
                           SECRET_VALUE_MAX);
    if (!find(s, name) && s->n >= SECRETS_MAX)
        return wr_err_kind(err, WR_E_CONFLICT, 0, "there are %d secrets already, the most kept",
                           SECRETS_MAX);
    if (!f->hosts)
        return wr_err_kind(err, WR_E_INVALID, 0, "hosts: required");
    json_t *hosts, *policy, *keys, *headers;
    if (parse_fields(f, NULL, &hosts, &policy, &keys, &headers, err) < 0 ||
        store_and_put(s, store, name, value, len, hosts, policy, keys, headers, err) < 0)
        return -1;
    log_info(NULL, "secrets.set", "name=%s keys=%zu", name, json_array_size(keys));
    return 0;
}

int secrets_update(struct secrets *s, struct store *store, const char *name,
                   const struct secret_fields *f, struct wr_err *err)
{
    struct secret *x = find(s, name);
    if (!x)
        return wr_err_kind(err, WR_E_NOT_FOUND, ENOENT, "no secret named %.64s", name);
    if (!x->value)
        return wr_err_kind(err, WR_E_CONFLICT, 0,
                           "secret %s cannot be opened with this daemon's secrets.key: set its "
                           "value again (PUT)",
                           name);
    json_t *hosts, *policy, *keys, *headers;
    if (parse_fields(f, x, &hosts, &policy, &keys, &headers, err) < 0)
        return -1;
    /* put() frees the old value before taking the copy: seal from a copy of our own */
    size_t len = x->len;
    char *value = xmalloc(len + 1);
    memcpy(value, x->value, len + 1);
    int rc = store_and_put(s, store, name, value, len, hosts, policy, keys, headers, err);
    explicit_bzero(value, len);
    free(value);
    if (rc < 0)
        return -1;
    log_info(NULL, "secrets.updated", "name=%s keys=%zu", name, json_array_size(keys));
    return 0;
}

int secrets_delete(struct secrets *s, struct store *store, const char *name, struct wr_err *err)
{
    struct secret **p = &s->list;
    while (*p && strcmp((*p)->name, name))
        p = &(*p)->next;
    if (!*p)
        return wr_err_kind(err, WR_E_NOT_FOUND, ENOENT, "no secret named %.64s", name);
    if (store_secret_delete(store, name, err) < 0)
        return -1;
    struct secret *x = *p;
    *p = x->next;
    secret_free(x);
    s->n--;
    log_info(NULL, "secrets.deleted", "name=%s", name);
    return 0;
}

int secrets_exists(const struct secrets *s, const char *name)
{
    const struct secret *x = find(s, name);
    return x && x->value;
}

/* Whether the sandboxes of owner ("" for the admin's) may use x. */
static int usable_by(const struct secret *x, const char *owner)
{
    if (!x->value)
        return 0;
    if (!owner || !owner[0])
        return 1;
    size_t i;
    json_t *k;
    json_array_foreach(x->keys, i, k) if (!strcmp(json_string_value(k), owner)) return 1;
    return 0;
}

int secrets_usable(const struct secrets *s, const char *name, const char *owner)
{
    const struct secret *x = find(s, name);
    return x && usable_by(x, owner);
}

static json_t *one_json(const struct secret *x)
{
    char ts[32];
    format_rfc3339(x->updated_at, ts, sizeof(ts));
    return json_pack("{s:s, s:O, s:O, s:O, s:s}", "name", x->name, "hosts", x->hosts, "keys",
                     x->keys, "headers", x->headers, "updated_at", ts);
}

json_t *secrets_get_json(const struct secrets *s, const char *name)
{
    const struct secret *x = find(s, name);
    return x ? one_json(x) : NULL;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "name")),
                  json_string_value(json_object_get(*(json_t *const *)b, "name")));
}

json_t *secrets_list_json(const struct secrets *s)
{
    json_t **v = xcalloc(s->n + 1, sizeof(*v));
    size_t n = 0;
    for (const struct secret *x = s->list; x && n < s->n; x = x->next)
        v[n++] = one_json(x);
    qsort(v, n, sizeof(*v), by_name);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, v[i]);
    free(v);
    return json_pack("{s:o}", "secrets", arr);
}

void secrets_placeholder(char out[SECRET_PLACEHOLDER_LEN + 1])
{
    unsigned char r[16];
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
        abort(); /* a guessable placeholder would be worse than no daemon */
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "wr-placeholder-", 15);
    for (size_t i = 0; i < sizeof(r); i++) {
        out[15 + 2 * i] = hex[r[i] >> 4];
        out[16 + 2 * i] = hex[r[i] & 15];
    }
    out[SECRET_PLACEHOLDER_LEN] = '\0';
}

/* The injections of placeholders ({NAME: placeholder}) that owner may use now, into out (at most
 * SANDBOX_SECRETS_MAX; borrowed from s). Returns how many. */
static size_t usable_injections(const struct secrets *s, json_t *placeholders, const char *owner,
                                struct inject *out)
{
    size_t n = 0;
    const char *name;
    json_t *phj;
    json_object_foreach(placeholders, name, phj)
    {
        const struct secret *x = find(s, name);
        const char *ph = json_string_value(phj);
        if (n == SANDBOX_SECRETS_MAX || !x || !ph || !ph[0] || !usable_by(x, owner))
            continue;
        out[n++] = (struct inject){.placeholder = ph,
                                   .value = x->value,
                                   .len = x->len,
                                   .policy = x->policy,
                                   .headers = x->headers};
    }
    return n;
}

char *secrets_rewrite_head(const struct secrets *s, json_t *placeholders, const char *owner,
                           const char *host, int port, const char *head, size_t len, size_t *outlen)
{
    struct inject in[SANDBOX_SECRETS_MAX];
    size_t n = usable_injections(s, placeholders, owner, in);
    return inject_head(in, n, host, port, head, len, outlen);
}

json_t *secrets_injections_json(const struct secrets *s, json_t *placeholders, const char *owner)
{
    struct inject in[SANDBOX_SECRETS_MAX];
    size_t n = usable_injections(s, placeholders, owner, in);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:s, s:s%, s:O, s:O}", "placeholder",
                                           in[i].placeholder, "value", in[i].value, in[i].len,
                                           "policy", in[i].policy, "headers", in[i].headers));
    return a;
}
