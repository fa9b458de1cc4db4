/*
 * A sandbox's egress policy: what `network` on create (or PUT .../network) says, checked and
 * normalised, and the one function that decides whether a host and port may be reached.
 *
 *   {"internet": false}                          nothing at all (the default)
 *   {"internet": true}                           any public host
 *   {"internet": true, "allow": [...]}           only hosts matching an entry
 *   ... "deny": [...]                            never hosts matching one of these (wins)
 *
 * An entry is a host name ("pypi.org") or a wildcard for the names under one ("*.pythonhosted.org":
 * a.pythonhosted.org, a.b.pythonhosted.org, not pythonhosted.org itself), with an optional
 * ":port". Without a port an entry covers ports 80 and 443. Names are case-insensitive and a
 * trailing dot is ignored; addresses are not names (the proxy dials only what it resolved).
 * Normalised: lower case, no trailing dot, duplicates dropped, the given order kept.
 */
#ifndef WR_NETPOLICY_H
#define WR_NETPOLICY_H

#include <jansson.h>

#include "common/err.h"

#define NETPOLICY_MAX_ENTRIES 256

/**
 * Checks a `network` object and returns it normalised (a new reference), as
 * {"internet": bool[, "allow": [...]][, "deny": [...]]}; NULL (absent) gives {"internet": false}.
 * On a bad one returns NULL with err set (WR_E_INVALID), its message naming the field or entry.
 */
json_t *netpolicy_parse(json_t *in, struct wr_err *err);

enum netpolicy_verdict {
    NETPOLICY_ALLOW,
    NETPOLICY_NO_INTERNET, /* "internet": false */
    NETPOLICY_DENIED,      /* matches a deny entry */
    NETPOLICY_NOT_ALLOWED, /* an allow list that does not name it */
    NETPOLICY_BAD_NAME,    /* not a host name (an address, or not a name at all) */
};

/** Whether a normalised policy lets a connection to host:port out. */
enum netpolicy_verdict netpolicy_check(json_t *policy, const char *host, int port);

/**
 * Whether the DNS resolver may answer for host: a lookup has no port, so a name is resolvable if
 * an allow entry names it on any port (or there is no allow list) and no deny entry without a
 * port names it. A port-less deny takes the whole name out of DNS, even where a port-specific
 * allow entry would let a connection to it through. Returns 1 or 0 (also for a policy without
 * internet and for what is not a host name).
 */
int netpolicy_name_allowed(json_t *policy, const char *host);

/** A short reason for a verdict, for logs and the sandbox's network log. */
const char *netpolicy_reason(enum netpolicy_verdict v);

/**
 * Normalises a host name as entries are (lower case, no trailing dot) into out (cap bytes).
 * Returns 0; -1 if it is not a valid DNS name; -2 if it is an address: every label a number,
 * decimal or 0x-hex (127.1, 0x7f000001), as inet_aton would take it.
 */
int netpolicy_host(const char *in, char *out, size_t cap);

#endif
