/*
 * Egress policies: see netpolicy.h. Pure functions on JSON: the API checks and normalises with
 * them, and the egress proxy and DNS resolver decide with netpolicy_check.
 */
#include "net/netpolicy.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 253
#define LABEL_MAX_LEN 63

static const char *const fields[] = {"internet", "allow", "deny", NULL};

/* All digits, or 0x and hex digits: a label an address could be made of ("127", "0x7f"). */
static int numeric_label(const char *s, size_t n)
{
    size_t i = 0;
    int hex = n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    if (hex)
        i = 2;
    if (i == n)
        return 0;
    for (; i < n; i++)
        if (hex ? !isxdigit((unsigned char)s[i]) : !isdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

int netpolicy_host(const char *in, char *out, size_t cap)
{
    size_t n = strlen(in);
    if (n > 0 && in[n - 1] == '.')
        n--; /* the root's dot */
    if (n == 0 || n > NAME_MAX_LEN || n + 1 > cap)
        return -1;
    size_t label = 0;
    int all_numeric = 1;
    const char *start = out;
    for (size_t i = 0; i <= n; i++) {
        char c = i < n ? in[i] : '.';
        if (c == '.') {
            /* a label: 1..63 of [a-z0-9-], not starting or ending with '-' */
            if (label == 0 || label > LABEL_MAX_LEN || start[0] == '-' || out[i - 1] == '-')
                return -1;
            if (!numeric_label(start, label))
                all_numeric = 0;
            label = 0;
            if (i < n)
                out[i] = '.';
            start = out + i + 1;
            continue;
        }
        c = (char)tolower((unsigned char)c);
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
            return -1; /* '_', '@', ':', '%', '*', spaces: not in a host name */
        out[i] = c;
        label++;
    }
    out[n] = '\0';
    /* 127.1, 10.0.0.1, 0x7f000001, 2130706433: addresses (in any form inet_aton takes) */
    return all_numeric ? -2 : 0;
}

/* One entry, normalised into out ("[*.]name[:port]"). Returns 0, or -1 with why in *why. */
static int parse_entry(const char *in, char *out, size_t cap, const char **why)
{
    char buf[NAME_MAX_LEN + 16];
    size_t n = strlen(in);
    if (n == 0 || n > NAME_MAX_LEN) { /* the whole entry, wildcard and port included */
        *why = n ? "is longer than 253 bytes" : "is not a host name";
        return -1;
    }
    memcpy(buf, in, n + 1);
    int port = 0;
    char *colon = strrchr(buf, ':');
    if (colon) {
        if (strchr(buf, ':') != colon || buf[0] == '[') {
            *why = "is an address; allow names";
            return -1;
        }
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (!isdigit((unsigned char)colon[1]) || colon[1] == '0' || *end || p < 1 || p > 65535) {
            *why = "has a port that is not 1 to 65535";
            return -1;
        }
        port = (int)p;
        *colon = '\0';
    }
    if (strcmp(buf, "*") == 0) {
        *why = "is not a host name (for any host, leave \"allow\" out)";
        return -1;
    }
    const char *name = buf;
    int wild = 0;
    if (strncmp(name, "*.", 2) == 0) {
        wild = 1;
        name += 2;
    }
    char host[NAME_MAX_LEN + 1];
    if (strchr(name, '*')) {
        *why = "has a '*' that is not a leading \"*.\"";
        return -1;
    }
    int hr = netpolicy_host(name, host, sizeof(host));
    if (hr < 0) {
        *why = hr == -2 ? "is an address; allow names" : "is not a host name";
        return -1;
    }
    if (wild && !strchr(host, '.')) {
        *why = "is a wildcard for a whole top-level domain";
        return -1;
    }
    if (port)
        snprintf(out, cap, "%s%s:%d", wild ? "*." : "", host, port);
    else
        snprintf(out, cap, "%s%s", wild ? "*." : "", host);
    return 0;
}

/* field: a list of entries, normalised into a new array (duplicates dropped, order kept). */
static json_t *parse_list(json_t *list, const char *field, struct wr_err *err)
{
    if (!json_is_array(list)) {
        wr_err_kind(err, WR_E_INVALID, 0, "network.%s: must be a list of host names", field);
        return NULL;
    }
    if (json_array_size(list) > NETPOLICY_MAX_ENTRIES) {
        wr_err_kind(err, WR_E_INVALID, 0, "network.%s: at most %d entries", field,
                    NETPOLICY_MAX_ENTRIES);
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        char norm[NAME_MAX_LEN + 16];
        const char *why = "must be a host name (a string)";
        if (!json_is_string(e) || parse_entry(json_string_value(e), norm, sizeof(norm), &why) < 0) {
            if (json_is_string(e)) /* quoted in part: the message has room for the reason */
                wr_err_kind(err, WR_E_INVALID, 0, "network.%s[%zu]: \"%.64s%s\" %s", field, i,
                            json_string_value(e), json_string_length(e) > 64 ? "..." : "", why);
            else
                wr_err_kind(err, WR_E_INVALID, 0, "network.%s[%zu]: %s", field, i, why);
            json_decref(out);
            return NULL;
        }
        int dup = 0;
        size_t j;
        json_t *seen;
        json_array_foreach(out, j, seen) dup |= strcmp(json_string_value(seen), norm) == 0;
        if (!dup)
            json_array_append_new(out, json_string(norm));
    }
    return out;
}

json_t *netpolicy_parse(json_t *in, struct wr_err *err)
{
    if (!in)
        return json_pack("{s:b}", "internet", 0);
    if (!json_is_object(in)) {
        wr_err_kind(
            err, WR_E_INVALID, 0,
            "network: must be an object like {\"internet\": true, \"allow\": [\"pypi.org\"]}");
        return NULL;
    }
    const char *key;
    json_t *v;
    json_object_foreach(in, key, v)
    {
        int known = 0;
        for (size_t i = 0; fields[i]; i++)
            known |= strcmp(key, fields[i]) == 0;
        if (!known) {
            wr_err_kind(err, WR_E_INVALID, 0,
                        "network.%.100s: unknown field (known: internet, allow, deny)", key);
            return NULL;
        }
    }
    json_t *internet = json_object_get(in, "internet");
    if (internet && !json_is_boolean(internet)) {
        wr_err_kind(err, WR_E_INVALID, 0, "network.internet: must be true or false");
        return NULL;
    }
    int on = internet && json_is_true(internet);
    json_t *out = json_pack("{s:b}", "internet", on);
    static const char *const lists[] = {"allow", "deny"};
    for (size_t k = 0; k < 2; k++) {
        json_t *l = json_object_get(in, lists[k]);
        if (!l || (!on && json_is_array(l) && json_array_size(l) == 0))
            continue; /* an empty list says nothing without internet */
        if (!on) {
            wr_err_kind(err, WR_E_INVALID, 0,
                        "network.%s: needs \"internet\": true (without it nothing is reached)",
                        lists[k]);
            json_decref(out);
            return NULL;
        }
        json_t *norm = parse_list(l, lists[k], err);
        if (!norm) {
            json_decref(out);
            return NULL;
        }
        json_object_set_new(out, lists[k], norm);
    }
    return out;
}

/* Whether a normalised entry covers host (normalised) and port; port 0: on any port. */
static int entry_matches(const char *entry, const char *host, int port)
{
    char name[NAME_MAX_LEN + 16];
    snprintf(name, sizeof(name), "%s", entry);
    int eport = 0;
    char *colon = strchr(name, ':');
    if (colon) {
        eport = atoi(colon + 1);
        *colon = '\0';
    }
    if (port != 0 && (eport ? port != eport : port != 80 && port != 443))
        return 0;
    if (strncmp(name, "*.", 2) != 0)
        return strcmp(name, host) == 0;
    /* "*.x.y" covers names that end in ".x.y" and have a label before it */
    const char *suffix = name + 1; /* ".x.y" */
    size_t hl = strlen(host), sl = strlen(suffix);
    return hl > sl && strcmp(host + hl - sl, suffix) == 0;
}

static int list_matches(json_t *list, const char *host, int port)
{
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) if (entry_matches(json_string_value(e), host, port)) return 1;
    return 0;
}

enum netpolicy_verdict netpolicy_check(json_t *policy, const char *host, int port)
{
    if (!json_is_true(json_object_get(policy, "internet")))
        return NETPOLICY_NO_INTERNET;
    char h[NAME_MAX_LEN + 1];
    if (!host || netpolicy_host(host, h, sizeof(h)) < 0 || port < 1 || port > 65535)
        return NETPOLICY_BAD_NAME;
    json_t *deny = json_object_get(policy, "deny");
    if (deny && list_matches(deny, h, port))
        return NETPOLICY_DENIED;
    json_t *allow = json_object_get(policy, "allow");
    if (allow && !list_matches(allow, h, port))
        return NETPOLICY_NOT_ALLOWED;
    return NETPOLICY_ALLOW;
}

int netpolicy_name_allowed(json_t *policy, const char *host)
{
    char h[NAME_MAX_LEN + 1];
    if (!json_is_true(json_object_get(policy, "internet")) || !host ||
        netpolicy_host(host, h, sizeof(h)) < 0)
        return 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(policy, "deny"), i, e)
    {
        const char *entry = json_string_value(e);
        if (entry && !strchr(entry, ':') && entry_matches(entry, h, 0))
            return 0;
    }
    json_t *allow = json_object_get(policy, "allow");
    return !allow || list_matches(allow, h, 0);
}

const char *netpolicy_reason(enum netpolicy_verdict v)
{
    switch (v) {
    case NETPOLICY_ALLOW: return "allowed";
    case NETPOLICY_NO_INTERNET: return "no_internet";
    case NETPOLICY_DENIED: return "denied";
    case NETPOLICY_NOT_ALLOWED: return "not_allowed";
    case NETPOLICY_BAD_NAME: return "not_a_name";
    }
    return "unknown";
}
