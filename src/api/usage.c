/*
 * GET /v1/usage: what sandboxes cost, from the usage ledger (daemon/meter.h).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "common/util.h"
#include "daemon/meter.h"

/* A time in the query: "2026-12-01" (that day's start, UTC) or "2026-12-01T13:45:00Z".
 * Returns 0 with *out in unix seconds, or -1. */
static int parse_when(const char *s, int64_t *out)
{
    struct tm tm = {0};
    int y, mo, d, h = 0, mi = 0, sec = 0, n = 0;
    size_t len = strlen(s);
    if (len == 10) {
        if (sscanf(s, "%4d-%2d-%2d%n", &y, &mo, &d, &n) != 3 || n != 10)
            return -1;
    } else if (len == 20) {
        if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2dZ%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 || n != 20)
            return -1;
    } else {
        return -1;
    }
    if (y < 1970 || y > 9999 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 ||
        sec > 59 || h < 0 || mi < 0 || sec < 0)
        return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    time_t t = timegm(&tm);
    if (t == (time_t)-1 || tm.tm_mday != d) /* 2026-02-31 */
        return -1;
    *out = (int64_t)t;
    return 0;
}

void api_usage(struct daemon *d, struct http_req *req, struct route_match *m)
{
    const char *from_s = http_req_query(req, "from"), *to_s = http_req_query(req, "to");
    const char *g = http_req_query(req, "group_by");
    int64_t now = now_unix(), from = now - now % 86400, to = now + 1;
    if (from_s && parse_when(from_s, &from) < 0) {
        api_reply_invalid(req, "from: want a UTC date (2026-12-01) or time (2026-12-01T13:45:00Z)");
        return;
    }
    if (to_s && parse_when(to_s, &to) < 0) {
        api_reply_invalid(req, "to: want a UTC date (2026-12-01) or time (2026-12-01T13:45:00Z)");
        return;
    }
    if (to <= from) {
        api_reply_invalid(req, "to: must be after from");
        return;
    }
    if (!g)
        g = "sandbox";
    if (strcmp(g, "sandbox") && strcmp(g, "key") && strcmp(g, "day")) {
        api_reply_invalid(req, "group_by: must be sandbox, key or day");
        return;
    }
    svc_usage(d, from, to, g, api_sink_new(req));
}
