/* JSON body validation; see jsonv.h. */
#include "api/jsonv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

json_t *jv_parse_object(const char *body, struct wr_err *err)
{
    json_error_t e;
    json_t *o = json_loads(body, JSON_REJECT_DUPLICATES, &e);
    if (!o) {
        wr_err_kind(err, WR_E_INVALID, 0, "request body is not valid JSON: %s (line %d, column %d)",
                    e.text, e.line, e.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        wr_err_kind(err, WR_E_INVALID, 0, "request body must be a JSON object");
        return NULL;
    }
    return o;
}

int jv_only(json_t *o, const char *const *allowed, struct wr_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        int known = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0)
                known = 1;
        if (!known) {
            wr_err_kind(err, WR_E_INVALID, 0, "%.64s: unknown field", key);
            return -1;
        }
    }
    return 0;
}

int jv_int(json_t *o, const char *name, long long min, long long max, long long def, long long *out,
           struct wr_err *err)
{
    json_t *v = json_object_get(o, name);
    if (!v) {
        *out = def;
        return 0;
    }
    /* JSON has one number type: 65535.0 is the integer 65535 (as JSON Schema says). */
    int whole =
        json_is_integer(v) || (json_is_real(v) && fabs(json_real_value(v)) < 9007199254740992.0 &&
                               json_real_value(v) == floor(json_real_value(v)));
    long long n = json_is_integer(v) ? json_integer_value(v)
                  : whole            ? (long long)json_real_value(v)
                                     : 0;
    if (!whole || n < min || n > max) {
        wr_err_kind(err, WR_E_INVALID, 0, "%s: must be an integer from %lld to %lld", name, min,
                    max);
        return -1;
    }
    *out = n;
    return 0;
}

int jv_number(json_t *o, const char *name, double min_excl, double max, double def, double *out,
              struct wr_err *err)
{
    json_t *v = json_object_get(o, name);
    if (!v) {
        *out = def;
        return 0;
    }
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    if (!json_is_number(v) || !isfinite(d) || d <= min_excl || d > max) {
        wr_err_kind(err, WR_E_INVALID, 0, "%s: must be a number greater than %g and at most %g",
                    name, min_excl, max);
        return -1;
    }
    *out = d;
    return 0;
}

int jv_bool(json_t *o, const char *name, int def, int *out, struct wr_err *err)
{
    json_t *v = json_object_get(o, name);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) {
        wr_err_kind(err, WR_E_INVALID, 0, "%s: must be true or false", name);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

static int str_ok(json_t *v, size_t maxlen)
{
    return json_is_string(v) && json_string_length(v) <= maxlen &&
           !memchr(json_string_value(v), '\0', json_string_length(v));
}

int jv_string(json_t *o, const char *name, size_t maxlen, const char **out, struct wr_err *err)
{
    json_t *v = json_object_get(o, name);
    if (!v)
        return 0;
    if (!str_ok(v, maxlen)) {
        wr_err_kind(err, WR_E_INVALID, 0, "%s: must be a string of at most %zu bytes without NUL",
                    name, maxlen);
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

int jv_string_map(json_t *o, const char *name, size_t max_entries, size_t max_key, size_t max_val,
                  int env_keys, json_t **out, struct wr_err *err)
{
    json_t *m = json_object_get(o, name);
    if (!m)
        return 0;
    if (!json_is_object(m)) {
        wr_err_kind(err, WR_E_INVALID, 0, "%s: must be an object of strings", name);
        return -1;
    }
    if (json_object_size(m) > max_entries) {
        wr_err_kind(err, WR_E_INVALID, 0, "%s: at most %zu entries", name, max_entries);
        return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v)
    {
        size_t klen = strlen(key);
        if (klen == 0 || klen > max_key || (env_keys && strchr(key, '='))) {
            wr_err_kind(err, WR_E_INVALID, 0, "%s: keys must be 1 to %zu bytes%s", name, max_key,
                        env_keys ? " without '='" : "");
            return -1;
        }
        if (!str_ok(v, max_val)) {
            wr_err_kind(err, WR_E_INVALID, 0,
                        "%s.%.64s: must be a string of at most %zu bytes without NUL", name, key,
                        max_val);
            return -1;
        }
    }
    *out = m;
    return 0;
}

int jv_string_array(json_t *o, const char *name, size_t max_items, size_t max_len, json_t **out,
                    struct wr_err *err)
{
    json_t *a = json_object_get(o, name);
    if (!a)
        return 0;
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > max_items) {
        wr_err_kind(err, WR_E_INVALID, 0, "%s: must be an array of 1 to %zu strings", name,
                    max_items);
        return -1;
    }
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v)
    {
        if (!str_ok(v, max_len)) {
            wr_err_kind(err, WR_E_INVALID, 0,
                        "%s[%zu]: must be a string of at most %zu bytes without NUL", name, i,
                        max_len);
            return -1;
        }
    }
    *out = a;
    return 0;
}

int jv_parse_mode(const char *s, unsigned *out)
{
    if (!s || !*s || strlen(s) > 6)
        return -1;
    unsigned v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '7')
            return -1;
        v = v * 8 + (unsigned)(*p - '0');
    }
    if (v > 07777)
        return -1;
    *out = v;
    return 0;
}
