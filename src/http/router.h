/*
 * Route matching, apart from the HTTP library so it can be unit-tested and
 * fuzzed: a table of (method, pattern) pairs where a pattern segment `{x}`
 * matches one non-empty path segment.
 */
#ifndef WR_HTTP_ROUTER_H
#define WR_HTTP_ROUTER_H

#include <stddef.h>

#define ROUTE_MAX_PARAMS 4
#define ROUTE_MAX_PARAM_LEN 128

struct route {
    const char *method;  /* "GET", ... */
    const char *pattern; /* "/v1/sandboxes/{id}/exec" */
    int handler;         /* the caller's handler number */
    const char *query;   /* the query parameters it takes, comma-separated; NULL = none */
};

struct route_match {
    int handler;
    const char *query; /* the matched route's query parameters */
    int nparams;
    char params[ROUTE_MAX_PARAMS][ROUTE_MAX_PARAM_LEN];
    char allow[128]; /* on ROUTE_BAD_METHOD: the methods that would match, "GET, DELETE" */
};

enum route_result { ROUTE_OK = 0, ROUTE_NOT_FOUND = 1, ROUTE_BAD_METHOD = 2 };

/**
 * Finds the route for method and path among n routes. Returns ROUTE_OK with m filled,
 * ROUTE_NOT_FOUND, or ROUTE_BAD_METHOD (path known, method not; m->allow lists the methods).
 * A path segment longer than ROUTE_MAX_PARAM_LEN - 1 never matches a parameter.
 */
enum route_result route_find(const struct route *routes, size_t n, const char *method,
                             const char *path, struct route_match *m);

#endif
