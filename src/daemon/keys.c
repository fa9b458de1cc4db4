/*
 * API keys (keys.h). Kept in memory, a list in the order they were made, and in the store as
 * one JSON document each. A presented token is hashed once and compared with every key's hash
 * in constant time, so neither the answer nor its timing says how close a guess came.
 */
#include "daemon/keys.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "common/util.h"
#include "store/store.h"

#define NAME_MAX_LEN 64
#define DAILY_LIMIT_MAX 1000000000000LL /* a million dollars a day, in micro-dollars */
#define MAX_SANDBOXES_MAX 100000

struct keys {
    struct store *store;
    struct api_key *list; /* oldest first */
    struct api_key *tail;
    int n;
};

static const char b32[] = "abcdefghijklmnopqrstuvwxyz234567";

static void hash_token(const char *token, size_t len, unsigned char out[32])
{
    unsigned int n = 32;
    EVP_Digest(token, len, out, &n, EVP_sha256(), NULL);
}

static int random_b32(char *out, size_t chars, struct wr_err *err)
{
    unsigned char rnd[KEY_TOKEN_LEN]; /* a byte per character, 5 bits of each used */
    if (chars > sizeof(rnd) || getrandom(rnd, chars, 0) != (ssize_t)chars)
        return wr_err_sys(err, errno, "getrandom");
    for (size_t i = 0; i < chars; i++)
        out[i] = b32[rnd[i] & 31];
    out[chars] = '\0';
    explicit_bzero(rnd, sizeof(rnd));
    return 0;
}

static void hex(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int unhex(const char *in, unsigned char *out, size_t n)
{
    if (!in || strlen(in) != 2 * n)
        return -1;
    for (size_t i = 0; i < 2 * n; i++) {
        int v = hex_digit((unsigned char)in[i]);
        if (v < 0)
            return -1;
        out[i / 2] = (unsigned char)(i % 2 ? (out[i / 2] | v) : v << 4);
    }
    return 0;
}

/* The stored document: the API's object plus the hash. */
static int persist(struct keys *k, const struct api_key *key, struct wr_err *err)
{
    json_t *o = key_to_json(key);
    char h[65];
    hex(key->hash, sizeof(key->hash), h);
    json_object_set_new(o, "sha256", json_string(h));
    json_object_set_new(o, "created_unix", json_integer(key->created_at));
    json_object_set_new(o, "revoked_unix", json_integer(key->revoked_at));
    char *doc = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    int rc = store_key_put(k->store, key->id, doc, err);
    free(doc);
    return rc;
}

static void append(struct keys *k, struct api_key *key)
{
    if (k->tail)
        k->tail->next = key;
    else
        k->list = key;
    k->tail = key;
    k->n++;
}

static int load_one(void *arg, const char *id, const char *doc)
{
    struct keys *k = arg;
    json_t *o = json_loads(doc, 0, NULL);
    struct api_key *key = xcalloc(1, sizeof(*key));
    const char *name = NULL, *sha = NULL;
    json_t *limit = NULL, *maxsb = NULL;
    json_int_t created = 0, revoked = 0;
    if (!o || strlen(id) >= sizeof(key->id) ||
        json_unpack(o, "{s:s, s:s, s:b, s:o, s:o, s:I, s:I}", "name", &name, "sha256", &sha,
                    "read_only", &key->read_only, "daily_limit_micros", &limit, "max_sandboxes",
                    &maxsb, "created_unix", &created, "revoked_unix", &revoked) < 0 ||
        unhex(sha, key->hash, sizeof(key->hash)) < 0) {
        /* A key that cannot be read cannot be checked: it is left out (fails closed). */
        log_error(NULL, "keys.bad_row", "id=\"%.40s\"", id);
        free(key);
        json_decref(o);
        return 0;
    }
    snprintf(key->id, sizeof(key->id), "%s", id);
    const char *owner = json_string_value(json_object_get(o, "owner_id"));
    snprintf(key->owner_id, sizeof(key->owner_id), "%s", owner ? owner : id);
    snprintf(key->name, sizeof(key->name), "%s", name);
    key->daily_limit_micros = json_is_integer(limit) ? json_integer_value(limit) : -1;
    key->max_sandboxes = json_is_integer(maxsb) ? (int)json_integer_value(maxsb) : -1;
    key->metrics = json_is_true(json_object_get(o, "metrics")); /* absent in older rows */
    key->auditor = json_is_true(json_object_get(o, "auditor")); /* absent before auditors */
    key->created_at = created;
    key->revoked_at = revoked;
    append(k, key);
    json_decref(o);
    return 0;
}

struct keys *keys_open(struct store *st, struct wr_err *err)
{
    struct keys *k = xcalloc(1, sizeof(*k));
    k->store = st;
    if (store_key_foreach(st, load_one, k, err) < 0) {
        keys_free(k);
        return NULL;
    }
    return k;
}

void keys_free(struct keys *k)
{
    if (!k)
        return;
    while (k->list) {
        struct api_key *next = k->list->next;
        explicit_bzero(k->list, sizeof(*k->list));
        free(k->list);
        k->list = next;
    }
    free(k);
}

static int token_shape(const char *t)
{
    if (!t || strlen(t) != KEY_TOKEN_LEN || strncmp(t, "wr_", 3) != 0)
        return 0;
    for (const char *p = t + 3; *p; p++)
        if (!strchr(b32, *p))
            return 0;
    return 1;
}

const struct api_key *keys_check(struct keys *k, const char *token)
{
    if (!token_shape(token))
        return NULL;
    unsigned char h[32];
    hash_token(token, strlen(token), h);
    const struct api_key *found = NULL;
    for (const struct api_key *key = k->list; key; key = key->next)
        if (CRYPTO_memcmp(h, key->hash, sizeof(h)) == 0 && !key->revoked_at)
            found = key;
    /* A key made --of another works only while that one does: its owner's revoke revokes it
     * too (keys_revoke), and this covers rows revoked before that, or a revoke cut short. */
    if (found && strcmp(found->owner_id, found->id) != 0) {
        const struct api_key *owner = keys_find(k, found->owner_id);
        if (!owner || owner->revoked_at)
            return NULL;
    }
    return found;
}

const struct api_key *keys_find(struct keys *k, const char *id)
{
    for (const struct api_key *key = k->list; key; key = key->next)
        if (strcmp(key->id, id) == 0)
            return key;
    return NULL;
}

/* Returns 1 if s has the shape of a key id: "key_" and 16 base32 characters. */
static int key_id_shaped(const char *s)
{
    if (strncmp(s, "key_", 4) != 0 || strlen(s) != 20)
        return 0;
    return strspn(s + 4, "abcdefghijklmnopqrstuvwxyz234567") == 16;
}

struct api_key *keys_head(struct keys *k)
{
    return k->list;
}

int principal_sees(const struct principal *who, const char *key_id)
{
    return !who || who->admin || strcmp(who->owner_id, key_id) == 0;
}

static int name_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > NAME_MAX_LEN)
        return 0;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return 0;
    return 1;
}

/* Checks the limits o gives (an update may give none). */
static int opts_check(const struct key_opts *o, struct wr_err *err)
{
    if (o->has_daily_limit &&
        (o->daily_limit_micros < -1 || o->daily_limit_micros > DAILY_LIMIT_MAX))
        return wr_err_kind(err, WR_E_INVALID, 0,
                           "daily_limit_micros: must be 0 to %lld micro-dollars, or null for none",
                           DAILY_LIMIT_MAX);
    if (o->has_max_sandboxes && (o->max_sandboxes < -1 || o->max_sandboxes > MAX_SANDBOXES_MAX))
        return wr_err_kind(err, WR_E_INVALID, 0, "max_sandboxes: must be 0 to %d, or null for none",
                           MAX_SANDBOXES_MAX);
    return 0;
}

const struct api_key *keys_create(struct keys *k, const struct key_opts *o,
                                  char token[KEY_TOKEN_LEN + 1], struct wr_err *err)
{
    if (!name_valid(o->name)) {
        wr_err_kind(err, WR_E_INVALID, 0, "name: must be 1 to %d printable ASCII characters",
                    NAME_MAX_LEN);
        return NULL;
    }
    if (opts_check(o, err) < 0)
        return NULL;
    /* An auditor key reads what the admin reads and owns no sandboxes: it is read-only, is no
     * metrics key (least privilege: a scraper gets a key of its own) and sees no one's. */
    if (o->auditor && (o->metrics || o->owner_id || (o->has_read_only && !o->read_only))) {
        wr_err_kind(err, WR_E_INVALID, 0, "auditor: an auditor key cannot also be %s",
                    o->metrics    ? "a metrics key (make one of each)"
                    : o->owner_id ? "made for another key's sandboxes (owner_id)"
                                  : "writable (read_only: false)");
        return NULL;
    }
    if (k->n >= KEYS_MAX) {
        wr_err_kind(err, WR_E_CONFLICT, 0,
                    "there are %d keys already (revoked ones count), the most kept", KEYS_MAX);
        return NULL;
    }
    for (const struct api_key *x = k->list; x; x = x->next)
        if (!x->revoked_at && strcmp(x->name, o->name) == 0) {
            wr_err_kind(err, WR_E_CONFLICT, 0,
                        "a key named \"%s\" is in use already (%s); revoke it first or choose "
                        "another name",
                        o->name, x->id);
            return NULL;
        }
    const struct api_key *owner = o->owner_id ? keys_find(k, o->owner_id) : NULL;
    if (o->owner_id && !owner) {
        wr_err_kind(err, key_id_shaped(o->owner_id) ? WR_E_NOT_FOUND : WR_E_INVALID, 0,
                    "owner_id: no key %.40s", o->owner_id);
        return NULL;
    }
    if (owner && (owner->revoked_at || strcmp(owner->owner_id, owner->id))) {
        wr_err_kind(err, WR_E_CONFLICT, 0, "owner_id: %s is %s", owner->id,
                    owner->revoked_at ? "revoked" : "made for another key's sandboxes itself");
        return NULL;
    }
    struct api_key *key = xcalloc(1, sizeof(*key));
    memcpy(key->id, "key_", 4);
    memcpy(token, "wr_", 3);
    do {
        if (random_b32(key->id + 4, 16, err) < 0 ||
            random_b32(token + 3, KEY_TOKEN_LEN - 3, err) < 0) {
            free(key);
            return NULL;
        }
    } while (keys_find(k, key->id));
    hash_token(token, KEY_TOKEN_LEN, key->hash);
    snprintf(key->owner_id, sizeof(key->owner_id), "%s", owner ? owner->id : key->id);
    snprintf(key->name, sizeof(key->name), "%s", o->name);
    key->read_only = o->has_read_only && o->read_only;
    key->metrics = o->metrics;
    key->auditor = o->auditor;
    if (key->auditor)
        key->read_only = 1;
    key->daily_limit_micros = o->has_daily_limit ? o->daily_limit_micros : -1;
    key->max_sandboxes = o->has_max_sandboxes ? o->max_sandboxes : -1;
    key->created_at = now_unix();
    if (persist(k, key, err) < 0) {
        explicit_bzero(token, KEY_TOKEN_LEN + 1);
        free(key);
        return NULL;
    }
    append(k, key);
    log_info(NULL, "keys.created", "key=%s name=\"%s\" read_only=%d metrics=%d auditor=%d", key->id,
             key->name, key->read_only, key->metrics, key->auditor);
    return key;
}

static struct api_key *find_mut(struct keys *k, const char *id, struct wr_err *err)
{
    for (struct api_key *key = k->list; key; key = key->next)
        if (strcmp(key->id, id) == 0)
            return key;
    wr_err_kind(err, WR_E_NOT_FOUND, 0, "no key %.40s", id);
    return NULL;
}

const struct api_key *keys_update(struct keys *k, const char *id, const struct key_opts *o,
                                  struct wr_err *err)
{
    struct api_key *key = find_mut(k, id, err);
    if (!key || opts_check(o, err) < 0)
        return NULL;
    if (key->revoked_at) {
        wr_err_kind(err, WR_E_CONFLICT, 0, "key %s is revoked", id);
        return NULL;
    }
    if (key->auditor && o->has_read_only && !o->read_only) {
        wr_err_kind(err, WR_E_CONFLICT, 0, "key %s is an auditor key: it stays read-only", id);
        return NULL;
    }
    struct api_key was = *key;
    if (o->has_read_only)
        key->read_only = o->read_only;
    if (o->has_daily_limit) {
        key->daily_limit_micros = o->daily_limit_micros;
        key->exhausted_day = 0; /* the admin decided: its sandboxes may run again */
    }
    if (o->has_max_sandboxes)
        key->max_sandboxes = o->max_sandboxes;
    if (persist(k, key, err) < 0) {
        *key = was;
        return NULL;
    }
    log_info(NULL, "keys.updated", "key=%s read_only=%d daily_limit_micros=%lld max_sandboxes=%d",
             key->id, key->read_only, (long long)key->daily_limit_micros, key->max_sandboxes);
    return key;
}

/* Marks key revoked and stores it; on a store failure it is as it was. */
static int revoke_one(struct keys *k, struct api_key *key, int64_t now, struct wr_err *err)
{
    key->revoked_at = now;
    if (persist(k, key, err) < 0) {
        key->revoked_at = 0;
        return -1;
    }
    return 0;
}

const struct api_key *keys_revoke(struct keys *k, const char *id,
                                  void (*also)(void *arg, const struct api_key *dep), void *arg,
                                  struct wr_err *err)
{
    struct api_key *key = find_mut(k, id, err);
    if (!key)
        return NULL;
    int64_t now = now_unix();
    /* The keys made --of it first, so that a store failure part way leaves no key working
     * whose owner is revoked; a revoke repeated (of a key revoked before keys were revoked
     * with their owner, too) goes on with the ones left. */
    for (struct api_key *dep = k->list; dep; dep = dep->next) {
        if (dep == key || dep->revoked_at || strcmp(dep->owner_id, key->id) != 0)
            continue;
        if (revoke_one(k, dep, now, err) < 0)
            return NULL;
        log_info(NULL, "keys.revoked", "key=%s with_owner=%s", dep->id, key->id);
        if (also)
            also(arg, dep);
    }
    if (key->revoked_at)
        return key;
    if (revoke_one(k, key, now, err) < 0)
        return NULL;
    log_info(NULL, "keys.revoked", "key=%s", key->id);
    return key;
}

json_t *key_to_json(const struct api_key *k)
{
    char created[32], revoked[32];
    format_rfc3339(k->created_at, created, sizeof(created));
    format_rfc3339(k->revoked_at, revoked, sizeof(revoked));
    json_t *limit = k->daily_limit_micros >= 0 ? json_integer(k->daily_limit_micros) : json_null();
    json_t *maxsb = k->max_sandboxes >= 0 ? json_integer(k->max_sandboxes) : json_null();
    return json_pack("{s:s, s:s, s:s, s:b, s:b, s:b, s:o, s:I, s:o, s:s, s:o}", "id", k->id,
                     "owner_id", k->owner_id, "name", k->name, "read_only", k->read_only, "metrics",
                     k->metrics, "auditor", k->auditor, "daily_limit_micros", limit,
                     "spent_today_micros", (json_int_t)k->spent_micros, "max_sandboxes", maxsb,
                     "created_at", created, "revoked_at",
                     k->revoked_at ? json_string(revoked) : json_null());
}

json_t *keys_list_json(const struct keys *k)
{
    json_t *a = json_array();
    for (const struct api_key *key = k->list; key; key = key->next)
        json_array_append_new(a, key_to_json(key));
    return a;
}
