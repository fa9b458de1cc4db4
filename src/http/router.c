/* Route matching; see router.h. */
#include "http/router.h"

#include <stdio.h>
#include <string.h>

/* Matches one pattern against path, filling params. Returns 1 on a match. */
static int match(const char *pattern, const char *path, struct route_match *m)
{
    const char *p = pattern, *s = path;
    m->nparams = 0;
    while (*p && *s) {
        if (*p != '/' || *s != '/')
            return 0;
        p++;
        s++;
        const char *pe = strchr(p, '/');
        size_t plen = pe ? (size_t)(pe - p) : strlen(p);
        const char *se = strchr(s, '/');
        size_t slen = se ? (size_t)(se - s) : strlen(s);
        if (plen >= 2 && p[0] == '{' && p[plen - 1] == '}') {
            if (slen == 0 || slen >= ROUTE_MAX_PARAM_LEN || m->nparams >= ROUTE_MAX_PARAMS)
                return 0;
            memcpy(m->params[m->nparams], s, slen);
            m->params[m->nparams][slen] = '\0';
            m->nparams++;
        } else if (plen != slen || memcmp(p, s, plen) != 0) {
            return 0;
        }
        p += plen;
        s += slen;
    }
    return *p == '\0' && *s == '\0';
}

enum route_result route_find(const struct route *routes, size_t n, const char *method,
                             const char *path, struct route_match *m)
{
    int path_known = 0;
    m->allow[0] = '\0';
    /* A pattern that matches the path word for word (/v1/sandboxes/prune) wins over one with
     * parameters (/v1/sandboxes/{id}): the path names that resource, not an id. */
    int literal = 0;
    for (size_t i = 0; i < n && !literal; i++) {
        struct route_match tmp;
        literal = match(routes[i].pattern, path, &tmp) && tmp.nparams == 0;
    }
    for (size_t i = 0; i < n; i++) {
        struct route_match tmp;
        if (!match(routes[i].pattern, path, &tmp) || (literal && tmp.nparams > 0))
            continue;
        if (strcmp(routes[i].method, method) == 0) {
            tmp.handler = routes[i].handler;
            tmp.query = routes[i].query;
            memcpy(tmp.allow, m->allow, sizeof(tmp.allow));
            *m = tmp;
            return ROUTE_OK;
        }
        size_t used = strlen(m->allow);
        if (!strstr(m->allow, routes[i].method))
            snprintf(m->allow + used, sizeof(m->allow) - used, "%s%s", path_known ? ", " : "",
                     routes[i].method);
        path_known = 1;
    }
    return path_known ? ROUTE_BAD_METHOD : ROUTE_NOT_FOUND;
}
