/* Secrets bound to hosts, sealed at rest (secrets.h). */
#include "daemon/secrets.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "net/netpolicy.h"
#include "store/store.h"

#define KEY_LEN 32
#define NONCE_LEN 12
#define TAG_LEN 16
#define SEAL_VERSION 1
#define SEALED_MAX (1 + NONCE_LEN + SECRET_VALUE_MAX + TAG_LEN)

struct secret {
    char name[SECRET_NAME_MAX + 1];
    json_t *hosts;  /* the normalised list */
    json_t *policy; /* {"internet": true, "allow": hosts}, to match a host with */
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
    *policy = p;
    return json_incref(json_object_get(p, "allow"));
}

/* Adds or replaces name in memory (takes value). */
static void put(struct secrets *s, const char *name, char *value, size_t len, json_t *hosts,
                json_t *policy, int64_t updated_at)
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
    }
    x->value = value;
    x->len = len;
    x->hosts = hosts;
    x->policy = policy;
    x->updated_at = updated_at;
}

struct load_ctx {
    struct secrets *s;
    unsigned bad;
};

static int load_one(void *arg, const char *name, const char *hosts_text, const void *sealed,
                    size_t len, int64_t updated_at)
{
    struct load_ctx *lc = arg;
    json_t *hosts = json_loads(hosts_text, 0, NULL), *policy = NULL, *norm = NULL;
    struct wr_err e = {0};
    size_t vlen = 0;
    char *value =
        hosts && secrets_name_valid(name) ? unseal(lc->s->key, name, sealed, len, &vlen) : NULL;
    if (value)
        norm = parse_hosts(hosts, &policy, &e);
    json_decref(hosts);
    if (!value || !norm) {
        lc->bad++;
        log_error(NULL, "secrets.unusable", "name=\"%.64s\" why=\"%s\"", name,
                  value ? "bad hosts" : "cannot unseal it (another secrets.key?)");
        if (value) {
            explicit_bzero(value, vlen);
            free(value);
        }
        json_decref(norm);
        json_decref(policy);
        /* Kept without a value, so that it is listed and can be deleted or set again. */
        if (secrets_name_valid(name))
            put(lc->s, name, NULL, 0, json_array(), NULL, updated_at);
        return 0;
    }
    put(lc->s, name, value, vlen, norm, policy, updated_at);
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

int secrets_set(struct secrets *s, struct store *store, const char *name, const char *value,
                size_t len, json_t *hosts, struct wr_err *err)
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
    json_t *policy = NULL;
    json_t *norm = parse_hosts(hosts, &policy, err);
    if (!norm)
        return -1;
    unsigned char sealed[SEALED_MAX];
    size_t slen = 0;
    char *text = json_dumps(norm, JSON_COMPACT);
    int64_t now = now_unix();
    int rc = seal(s->key, name, value, len, sealed, &slen) < 0
                 ? wr_err_set(err, EIO, "cannot seal the secret")
                 : store_secret_put(store, name, text, sealed, slen, now, err);
    free(text);
    explicit_bzero(sealed, sizeof(sealed));
    if (rc < 0) {
        json_decref(norm);
        json_decref(policy);
        return -1;
    }
    char *copy = xmalloc(len + 1);
    memcpy(copy, value, len);
    copy[len] = '\0';
    put(s, name, copy, len, norm, policy, now);
    log_info(NULL, "secrets.set", "name=%s", name);
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

static json_t *one_json(const struct secret *x)
{
    char ts[32];
    format_rfc3339(x->updated_at, ts, sizeof(ts));
    return json_pack("{s:s, s:O, s:s}", "name", x->name, "hosts", x->hosts, "updated_at", ts);
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

int secrets_bound(const struct secrets *s, json_t *placeholders, const char *host)
{
    const char *name;
    json_t *ph;
    json_object_foreach(placeholders, name, ph)
    {
        const struct secret *x = find(s, name);
        if (x && x->value && netpolicy_name_allowed(x->policy, host))
            return 1;
    }
    return 0;
}

/* Replaces every occurrence of ph in [p, p+len) by value, appending to *out. */
static size_t replace_into(char *out, const char *p, size_t len, const char *ph, size_t phlen,
                           const char *value, size_t vlen)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (i + phlen <= len && !memcmp(p + i, ph, phlen)) {
            memcpy(out + o, value, vlen);
            o += vlen;
            i += phlen;
        } else {
            out[o++] = p[i++];
        }
    }
    return o;
}

char *secrets_rewrite_head(const struct secrets *s, json_t *placeholders, const char *host,
                           const char *head, size_t len, size_t *outlen)
{
    const char *fields = memchr(head, '\n', len);
    if (!fields)
        return NULL;
    fields++;
    size_t first = (size_t)(fields - head);
    char *cur = NULL;
    size_t curlen = len;
    const char *name;
    json_t *phj;
    json_object_foreach(placeholders, name, phj)
    {
        const struct secret *x = find(s, name);
        const char *ph = json_string_value(phj);
        if (!x || !x->value || !ph || !netpolicy_name_allowed(x->policy, host))
            continue;
        const char *src = cur ? cur : head;
        size_t phlen = strlen(ph);
        if (!memmem(src + first, curlen - first, ph, phlen))
            continue;
        /* each occurrence grows by at most vlen - phlen */
        size_t most = curlen + (curlen / phlen + 1) * (x->len > phlen ? x->len - phlen : 0);
        char *next = xmalloc(most + 1);
        memcpy(next, src, first);
        size_t n = first + replace_into(next + first, src + first, curlen - first, ph, phlen,
                                        x->value, x->len);
        if (cur) {
            explicit_bzero(cur, curlen);
            free(cur);
        }
        cur = next;
        curlen = n;
    }
    if (cur)
        *outlen = curlen;
    return cur;
}
