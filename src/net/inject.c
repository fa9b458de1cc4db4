/*
 * Secrets into request heads (inject.h).
 */
#include "net/inject.h"

#include <string.h>
#include <strings.h>

#include "common/util.h"
#include "net/netpolicy.h"

/* Whether a request with this request line may carry a secret: only the methods that send a
 * credential and do not echo the request (TRACE does, whole; OPTIONS needs none). */
static int method_ok(const char *line, size_t n)
{
    static const char *const ok[] = {"GET ", "HEAD ", "POST ", "PUT ", "PATCH ", "DELETE ", NULL};
    for (size_t i = 0; ok[i]; i++)
        if (n > strlen(ok[i]) && !memcmp(line, ok[i], strlen(ok[i])))
            return 1;
    return 0;
}

/* Whether the field line [p, p+n) (no CRLF) is one x's value may go into: Authorization or a
 * field x declares. Sets *value to where its value starts (after the colon). */
static int credential_field(const struct inject *x, const char *p, size_t n, size_t *value)
{
    const char *colon = memchr(p, ':', n);
    if (!colon)
        return 0;
    size_t nl = (size_t)(colon - p);
    *value = nl + 1;
    if (nl == 13 && !strncasecmp(p, "authorization", 13))
        return 1;
    size_t i;
    json_t *h;
    json_array_foreach(x->headers, i, h)
    {
        if (json_string_length(h) == nl && !strncasecmp(p, json_string_value(h), nl))
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

/* src (len bytes; its field lines from first on) with x's placeholder ph replaced in x's
 * credential fields, into a new buffer (*outlen bytes); NULL if none of them holds it. */
static char *rewrite_fields(const struct inject *x, const char *ph, const char *src, size_t len,
                            size_t first, size_t *outlen)
{
    size_t phlen = strlen(ph);
    /* each occurrence grows by at most vlen - phlen */
    size_t most = len + (len / phlen + 1) * (x->len > phlen ? x->len - phlen : 0);
    char *out = xmalloc(most + 1);
    memcpy(out, src, first);
    size_t o = first;
    int changed = 0;
    for (size_t i = first; i < len;) {
        const char *eol = memmem(src + i, len - i, "\r\n", 2);
        size_t n = eol ? (size_t)(eol - (src + i)) : len - i, v = 0;
        size_t end = eol ? n + 2 : n;
        if (credential_field(x, src + i, n, &v) && memmem(src + i + v, n - v, ph, phlen)) {
            memcpy(out + o, src + i, v);
            o += v;
            o += replace_into(out + o, src + i + v, n - v, ph, phlen, x->value, x->len);
            memcpy(out + o, src + i + n, end - n);
            o += end - n;
            changed = 1;
        } else {
            memcpy(out + o, src + i, end);
            o += end;
        }
        i += end;
    }
    if (!changed) {
        explicit_bzero(out, o);
        free(out);
        return NULL;
    }
    *outlen = o;
    return out;
}

char *inject_head(const struct inject *in, size_t n, const char *host, int port, const char *head,
                  size_t len, size_t *outlen)
{
    const char *fields = memchr(head, '\n', len);
    if (!fields || !method_ok(head, len))
        return NULL;
    fields++;
    size_t first = (size_t)(fields - head);
    char *cur = NULL;
    size_t curlen = len;
    for (size_t i = 0; i < n; i++) {
        const struct inject *x = &in[i];
        if (!x->placeholder || !x->placeholder[0] ||
            netpolicy_check(x->policy, host, port) != NETPOLICY_ALLOW)
            continue;
        size_t got = 0;
        char *next = rewrite_fields(x, x->placeholder, cur ? cur : head, curlen, first, &got);
        if (!next)
            continue;
        if (cur) {
            explicit_bzero(cur, curlen);
            free(cur);
        }
        cur = next;
        curlen = got;
    }
    if (cur)
        *outlen = curlen;
    return cur;
}
