/*
 * Unit tests for the API's pure parts: route matching, JSON body validation,
 * UTF-8 checks and base64.
 */
#include <string.h>

#include "api/jsonv.h"
#include "common/base64.h"
#include "common/utf8.h"
#include "http/router.h"
#include "tap.h"

static const struct route routes[] = {
    {"GET", "/v1/health", 0, NULL},
    {"POST", "/v1/sandboxes", 1, NULL},
    {"GET", "/v1/sandboxes", 2, NULL},
    {"GET", "/v1/sandboxes/{id}", 3, NULL},
    {"DELETE", "/v1/sandboxes/{id}", 4, NULL},
    {"POST", "/v1/sandboxes/{id}/exec", 5, NULL},
    {"GET", "/v1/sandboxes/{id}/files/content", 6, NULL},
    {"PUT", "/v1/sandboxes/{id}/files/content", 7, NULL},
};
#define NR (sizeof(routes) / sizeof(routes[0]))

static void test_router(void)
{
    struct route_match m;
    ok(route_find(routes, NR, "GET", "/v1/health", &m) == ROUTE_OK && m.handler == 0,
       "exact route");
    ok(route_find(routes, NR, "GET", "/v1/sandboxes/sb-abc", &m) == ROUTE_OK && m.handler == 3 &&
           m.nparams == 1 && strcmp(m.params[0], "sb-abc") == 0,
       "parameter captured");
    ok(route_find(routes, NR, "POST", "/v1/sandboxes/x/exec", &m) == ROUTE_OK && m.handler == 5,
       "nested route");
    ok(route_find(routes, NR, "PUT", "/v1/sandboxes/x/files/content", &m) == ROUTE_OK &&
           m.handler == 7,
       "method picks among routes on one path");
    ok(route_find(routes, NR, "POST", "/v1/sandboxes/x", &m) == ROUTE_BAD_METHOD &&
           strcmp(m.allow, "GET, DELETE") == 0,
       "wrong method gives 405 with Allow: %s", m.allow);
    ok(route_find(routes, NR, "GET", "/v1/nothing", &m) == ROUTE_NOT_FOUND, "unknown route");
    ok(route_find(routes, NR, "GET", "/v1/sandboxes//exec", &m) == ROUTE_NOT_FOUND,
       "empty segment is no parameter");
    ok(route_find(routes, NR, "GET", "/v1/health/", &m) == ROUTE_NOT_FOUND, "trailing slash");
    ok(route_find(routes, NR, "GET", "", &m) == ROUTE_NOT_FOUND, "empty path");
    char longp[400] = "/v1/sandboxes/";
    memset(longp + strlen(longp), 'a', 200);
    ok(route_find(routes, NR, "GET", longp, &m) == ROUTE_NOT_FOUND, "overlong parameter rejected");
}

static void test_jsonv(void)
{
    struct wr_err e = {0};
    const char *msg = e.msg;
    ok(jv_parse_object("[1]", &e) == NULL && strstr(msg, "object"), "array body rejected");
    ok(jv_parse_object("{\"a\":", &e) == NULL && strstr(msg, "not valid JSON"), "bad JSON: %s",
       msg);
    ok(jv_parse_object("{\"a\":1,\"a\":2}", &e) == NULL, "duplicate keys rejected");
    json_t *o = jv_parse_object("{\"cpus\":\"two\",\"x\":1,\"env\":{\"A\":\"b\"},\"argv\":[]}", &e);
    ok(o != NULL, "object parsed");
    long long v;
    ok(jv_int(o, "cpus", 1, 2, 2, &v, &e) < 0 && strncmp(msg, "cpus:", 5) == 0,
       "wrong type names the field: %s", msg);
    ok(jv_int(o, "memory_mib", 1, 2, 2, &v, &e) == 0 && v == 2, "absent takes the default");
    static const char *const allowed[] = {"cpus", "env", "argv", NULL};
    ok(jv_only(o, allowed, &e) < 0 && strncmp(msg, "x:", 2) == 0, "unknown field named: %s", msg);
    json_t *m = NULL;
    ok(jv_string_map(o, "env", 10, 10, 10, 1, &m, &e) == 0 && m, "string map accepted");
    ok(jv_string_array(o, "argv", 10, 10, &m, &e) < 0, "empty argv rejected");
    json_decref(o);
    ok(jv_parse_object("{\"s\":\"a\\u0000b\"}", &e) == NULL, "string with NUL rejected");
    o = jv_parse_object("{\"env\":{\"A=B\":\"c\"},\"t\":0,\"s\":7}", &e);
    ok(jv_string_map(o, "env", 10, 10, 10, 1, &m, &e) < 0, "env key with = rejected");
    double d;
    ok(jv_number(o, "t", 0, 10, 1, &d, &e) < 0, "zero timeout rejected");
    const char *s = NULL;
    ok(jv_string(o, "s", 100, &s, &e) < 0 && strncmp(msg, "s:", 2) == 0,
       "number as string rejected");
    json_decref(o);
    unsigned mode;
    ok(jv_parse_mode("0644", &mode) == 0 && mode == 0644, "mode 0644");
    ok(jv_parse_mode("755", &mode) == 0 && mode == 0755, "mode 755");
    ok(jv_parse_mode("0689", &mode) < 0 && jv_parse_mode("", &mode) < 0 &&
           jv_parse_mode("77777", &mode) < 0,
       "bad modes rejected");
}

static void test_utf8(void)
{
    ok(utf8_valid((const unsigned char *)"h\xc3\xa9llo", 6), "valid UTF-8");
    ok(!utf8_valid((const unsigned char *)"\xff", 1), "0xff invalid");
    ok(!utf8_valid((const unsigned char *)"\xc0\xaf", 2), "overlong invalid");
    ok(!utf8_valid((const unsigned char *)"\xed\xa0\x80", 3), "surrogate invalid");
    ok(utf8_complete_prefix((const unsigned char *)"ab\xe2\x82", 4) == 2,
       "split 3-byte char held back");
    ok(utf8_complete_prefix((const unsigned char *)"ab\xe2\x82\xac", 5) == 5,
       "whole char not held back");
    ok(utf8_complete_prefix((const unsigned char *)"ab\xff", 3) == 3, "invalid byte not held back");
}

static void test_base64(void)
{
    const char *cases[][2] = {{"", ""},        {"f", "Zg=="},        {"fo", "Zm8="},
                              {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"\xff\x00\xfe", "/wD+"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = i == 5 ? 3 : strlen(cases[i][0]);
        char *e = base64_encode(cases[i][0], n);
        size_t dn = 0;
        unsigned char *dd = base64_decode(e, strlen(e), &dn);
        ok(strcmp(e, cases[i][1]) == 0 && dd && dn == n && memcmp(dd, cases[i][0], n) == 0,
           "base64 round trip %zu", i);
        free(e);
        free(dd);
    }
    size_t n;
    ok(base64_decode("Zm9", 3, &n) == NULL, "bad length rejected");
    ok(base64_decode("Zm9*", 4, &n) == NULL, "bad char rejected");
    ok(base64_decode("Z===", 4, &n) == NULL, "bad padding rejected");
}

int main(void)
{
    test_router();
    test_jsonv();
    test_utf8();
    test_base64();
    return tap_done();
}
