/*
 * Egress policies (net/netpolicy.h): what a `network` object may say and how it comes back
 * normalised, the errors that name the bad entry, and the decisions: exact names, wildcards,
 * ports, case and trailing dots, deny over allow, and the lookalikes and addresses that must
 * never match.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "net/netpolicy.h"
#include "tap.h"

/* The policy written as JSON text, normalised; NULL and err's message if refused. */
static json_t *parse(const char *text, char *msg, size_t cap)
{
    json_t *in = text ? json_loads(text, 0, NULL) : NULL;
    struct wr_err err = {0};
    json_t *out = netpolicy_parse(in, &err);
    json_decref(in);
    snprintf(msg, cap, "%s", out ? "" : err.msg);
    return out;
}

static int same(json_t *out, const char *want)
{
    json_t *w = json_loads(want, 0, NULL);
    int eq = out && w && json_equal(out, w);
    json_decref(w);
    return eq;
}

static void parse_checks(void)
{
    char msg[512];
    json_t *p = parse(NULL, msg, sizeof(msg));
    ok(same(p, "{\"internet\": false}"), "no network given: no internet");
    json_decref(p);
    p = parse("{}", msg, sizeof(msg));
    ok(same(p, "{\"internet\": false}"), "{}: no internet");
    json_decref(p);
    p = parse("{\"internet\": true}", msg, sizeof(msg));
    ok(same(p, "{\"internet\": true}"), "internet alone: any public host");
    json_decref(p);
    p = parse("{\"internet\": true, \"allow\": [\"PyPI.org.\", \"*.PythonHosted.org\", "
              "\"pypi.org\", \"api.github.test:8443\"], \"deny\": [\"bad.pythonhosted.org\"]}",
              msg, sizeof(msg));
    ok(same(p, "{\"internet\": true, \"allow\": [\"pypi.org\", \"*.pythonhosted.org\", "
               "\"api.github.test:8443\"], \"deny\": [\"bad.pythonhosted.org\"]}"),
       "entries come back lower case, without the trailing dot, once each, in order (%s)", msg);
    json_decref(p);

    static const struct {
        const char *in, *want;
    } bad[] = {
        {"[]", "network: must be an object"},
        {"{\"internet\": \"yes\"}", "network.internet: must be true or false"},
        {"{\"internet\": true, \"alow\": []}", "network.alow: unknown field"},
        {"{\"allow\": [\"pypi.org\"]}", "network.allow: needs \"internet\": true"},
        {"{\"internet\": true, \"allow\": \"pypi.org\"}", "network.allow: must be a list"},
        {"{\"internet\": true, \"allow\": [\"pypi.org\", 7]}", "network.allow[1]: must be a host"},
        {"{\"internet\": true, \"allow\": [\"\"]}", "network.allow[0]: \"\" is not a host name"},
        {"{\"internet\": true, \"allow\": [\"pypi.org\", \"evil test\"]}",
         "network.allow[1]: \"evil test\" is not a host name"},
        {"{\"internet\": true, \"allow\": [\"http://pypi.org\"]}",
         "network.allow[0]: \"http://pypi.org\""},
        {"{\"internet\": true, \"allow\": [\"pypi.org@evil.test\"]}", "is not a host name"},
        {"{\"internet\": true, \"allow\": [\"127.0.0.1\"]}", "is an address; allow names"},
        {"{\"internet\": true, \"allow\": [\"0x7f000001\"]}", "is an address"},
        {"{\"internet\": true, \"allow\": [\"[::1]:443\"]}", "is an address"},
        {"{\"internet\": true, \"allow\": [\"pypi.org:0\"]}", "has a port that is not 1 to 65535"},
        {"{\"internet\": true, \"allow\": [\"pypi.org:65536\"]}", "has a port"},
        {"{\"internet\": true, \"allow\": [\"pypi.org:\"]}", "has a port"},
        {"{\"internet\": true, \"allow\": [\"pypi.org:0443\"]}", "has a port"},
        {"{\"internet\": true, \"allow\": [\"pypi.org:+443\"]}", "has a port"},
        {"{\"internet\": true, \"allow\": [\"*\"]}", "for any host, leave \"allow\" out"},
        {"{\"internet\": true, \"allow\": [\"*.org\"]}", "a whole top-level domain"},
        {"{\"internet\": true, \"allow\": [\"a.*.org\"]}", "a '*' that is not a leading"},
        {"{\"internet\": true, \"allow\": [\"-a.org\"]}", "is not a host name"},
        {"{\"internet\": true, \"allow\": [\"abc..def\"]}", "is not a host name"},
        {"{\"internet\": true, \"deny\": [\"under_score.org\"]}",
         "network.deny[0]: \"under_score.org\" is not a host name"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = parse(bad[i].in, msg, sizeof(msg));
        ok(!p && strstr(msg, bad[i].want), "%s: 400 \"%s\"", bad[i].in, msg);
        json_decref(p);
    }
    char big[64 * 300 + 64];
    size_t n = (size_t)snprintf(big, sizeof(big), "{\"internet\": true, \"allow\": [");
    for (int i = 0; i <= NETPOLICY_MAX_ENTRIES; i++)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "%s\"h%d.example\"", i ? "," : "", i);
    snprintf(big + n, sizeof(big) - n, "]}");
    p = parse(big, msg, sizeof(msg));
    ok(!p && strstr(msg, "at most 256 entries"), "more than 256 entries: 400 (%s)", msg);
    json_decref(p);
}

static enum netpolicy_verdict check(const char *policy, const char *host, int port)
{
    char msg[256];
    json_t *p = parse(policy, msg, sizeof(msg));
    enum netpolicy_verdict v = netpolicy_check(p, host, port);
    json_decref(p);
    return v;
}

static void check_checks(void)
{
    const char *seed = "{\"internet\": true, \"allow\": [\"pypi.org\", \"*.pythonhosted.org\"]}";
    static const struct {
        const char *host;
        int port;
        enum netpolicy_verdict want;
    } cases[] = {
        {"pypi.org", 443, NETPOLICY_ALLOW},
        {"PYPI.ORG.", 443, NETPOLICY_ALLOW},
        {"pypi.org", 80, NETPOLICY_ALLOW},
        {"pypi.org", 8080, NETPOLICY_NOT_ALLOWED}, /* no port in the entry: 80 and 443 */
        {"files.pythonhosted.org", 443, NETPOLICY_ALLOW},
        {"a.b.pythonhosted.org", 443, NETPOLICY_ALLOW},
        {"pythonhosted.org", 443, NETPOLICY_NOT_ALLOWED}, /* the wildcard is for names under it */
        {"evilpythonhosted.org", 443, NETPOLICY_NOT_ALLOWED},
        {"pythonhosted.org.evil.test", 443, NETPOLICY_NOT_ALLOWED},
        {"pypi.org.evil.test", 443, NETPOLICY_NOT_ALLOWED},
        {"evil.test", 443, NETPOLICY_NOT_ALLOWED},
        {"xpypi.org", 443, NETPOLICY_NOT_ALLOWED},
        {"pypi.org@evil.test", 443, NETPOLICY_BAD_NAME},
        {"127.0.0.1", 443, NETPOLICY_BAD_NAME},
        {"127.1", 443, NETPOLICY_BAD_NAME},
        {"0x7f000001", 443, NETPOLICY_BAD_NAME},
        {"2130706433", 443, NETPOLICY_BAD_NAME},
        {"169.254.169.254", 80, NETPOLICY_BAD_NAME},
        {"::1", 443, NETPOLICY_BAD_NAME},
        {"", 443, NETPOLICY_BAD_NAME},
        {"pypi.org", 0, NETPOLICY_BAD_NAME},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum netpolicy_verdict v = check(seed, cases[i].host, cases[i].port);
        ok(v == cases[i].want, "seed policy, %s:%d: %s", cases[i].host, cases[i].port,
           netpolicy_reason(v));
    }
    ok(check("{\"internet\": false}", "pypi.org", 443) == NETPOLICY_NO_INTERNET,
       "no internet: nothing, named or not");
    ok(check("{\"internet\": true}", "anything.example", 443) == NETPOLICY_ALLOW &&
           check("{\"internet\": true}", "anything.example", 22) == NETPOLICY_ALLOW,
       "internet without a list: any name, any port");
    const char *both =
        "{\"internet\": true, \"allow\": [\"*.github.test\", \"api.github.test:8443\"],"
        " \"deny\": [\"gist.github.test\", \"*.evil.github.test\"]}";
    ok(check(both, "api.github.test", 443) == NETPOLICY_ALLOW, "allowed by the wildcard");
    ok(check(both, "api.github.test", 8443) == NETPOLICY_ALLOW, "and on the entry's own port");
    ok(check(both, "x.github.test", 8443) == NETPOLICY_NOT_ALLOWED,
       "a port belongs to its own entry only");
    ok(check(both, "gist.github.test", 443) == NETPOLICY_DENIED, "deny wins over allow");
    ok(check(both, "a.evil.github.test", 443) == NETPOLICY_DENIED, "a deny wildcard too");
    ok(check("{\"internet\": true, \"deny\": [\"evil.test\"]}", "evil.test", 443) ==
               NETPOLICY_DENIED &&
           check("{\"internet\": true, \"deny\": [\"evil.test\"]}", "good.test", 443) ==
               NETPOLICY_ALLOW,
       "deny alone: everything else is allowed");

    char out[300];
    ok(netpolicy_host("Files.PythonHosted.Org.", out, sizeof(out)) == 0 &&
           strcmp(out, "files.pythonhosted.org") == 0,
       "netpolicy_host normalises (%s)", out);
    char long_label[80];
    memset(long_label, 'a', 64);
    strcpy(long_label + 64, ".org");
    ok(netpolicy_host(long_label, out, sizeof(out)) == -1, "a 64-byte label is not a name");
    ok(netpolicy_host("127.1", out, sizeof(out)) == -2 &&
           netpolicy_host("0x7f.0.0.1.", out, sizeof(out)) == -2,
       "an address is told apart from a bad name");
    /* 254 bytes in all, as "*." and four labels: the entry, not just its name, is limited */
    char entry[300], pol[400], msg[256];
    snprintf(entry, sizeof(entry), "*.%.62s.%.62s.%.62s.%.63s", long_label, long_label, long_label,
             long_label);
    snprintf(pol, sizeof(pol), "{\"internet\": true, \"allow\": [\"%s\"]}", entry);
    json_t *p = parse(pol, msg, sizeof(msg));
    ok(strlen(entry) == 254 && !p && strstr(msg, "longer than 253 bytes"),
       "a 254-byte entry is refused (%s)", msg);
    json_decref(p);
    entry[strlen(entry) - 1] = '\0';
    snprintf(pol, sizeof(pol), "{\"internet\": true, \"allow\": [\"%s\"]}", entry);
    p = parse(pol, msg, sizeof(msg));
    ok(p != NULL, "and a 253-byte one taken (%s)", msg);
    json_decref(p);
}

static int name_allowed(const char *policy, const char *host)
{
    char msg[256];
    json_t *p = parse(policy, msg, sizeof(msg));
    int r = netpolicy_name_allowed(p, host);
    json_decref(p);
    return r;
}

/* What the DNS resolver may answer: a name some port of which is allowed. */
static void name_checks(void)
{
    const char *seed = "{\"internet\": true, \"allow\": [\"pypi.org\", \"*.pythonhosted.org\","
                       " \"api.github.test:8443\"], \"deny\": [\"bad.pythonhosted.org\","
                       " \"files.pythonhosted.org:443\"]}";
    static const struct {
        const char *host;
        int want;
    } cases[] = {
        {"pypi.org", 1},
        {"PyPI.Org.", 1},
        {"api.github.test", 1}, /* only on 8443, and that is enough to look it up */
        {"github.test", 0},
        {"files.pythonhosted.org", 1}, /* a deny with a port leaves the name (port 80) */
        {"bad.pythonhosted.org", 0},   /* a deny without one takes it out */
        {"x.bad.pythonhosted.org", 1}, /* an exact deny is exact */
        {"pythonhosted.org", 0},
        {"evilpythonhosted.org", 0},
        {"pypi.org.evil.test", 0},
        {"127.0.0.1", 0},
        {"0x7f000001", 0},
        {"under_score.pypi.org", 0},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ok(name_allowed(seed, cases[i].host) == cases[i].want, "seed policy, lookup of \"%s\": %s",
           cases[i].host, cases[i].want ? "answered" : "refused");
    ok(!name_allowed("{\"internet\": false}", "pypi.org") && !name_allowed(NULL, "pypi.org"),
       "no internet: no name is looked up");
    ok(!name_allowed("{\"internet\": true}", NULL), "no name: refused");
    ok(name_allowed("{\"internet\": true}", "anything.example"),
       "internet without a list: any name");
    const char *deny = "{\"internet\": true, \"deny\": [\"*.evil.test\", \"mail.test:25\"]}";
    ok(!name_allowed(deny, "a.evil.test") && name_allowed(deny, "evil.test"),
       "deny wildcard without a port: names under it are refused, the name itself is not");
    ok(name_allowed(deny, "mail.test"), "a deny on one port leaves the name resolvable");
    ok(!name_allowed("{\"internet\": true, \"allow\": [\"a.test:8080\"], \"deny\": [\"a.test\"]}",
                     "a.test"),
       "a port-less deny wins over an allow on another port");
}

int main(void)
{
    parse_checks();
    check_checks();
    name_checks();
    return tap_done();
}
