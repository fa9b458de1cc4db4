/*
 * GET /v1/usage: what sandboxes cost, from the usage ledger (daemon/meter.h); by sandbox, key,
 * day or minute, optionally of one sandbox (the dashboard's chart asks once, by minute).
 */
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "common/ids.h"
#include "common/util.h"
#include "daemon/meter.h"
#include "daemon/sandbox.h"

/* Reads n digits at *p into *out; advances. */
static int digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++, (*p)++) {
        if (**p < '0' || **p > '9')
            return -1;
        v = v * 10 + (**p - '0');
    }
    *out = v;
    return 0;
}

/* A time in the query, RFC 3339: a full-date ("2026-12-01", that day's start, UTC) or a
 * date-time ("2026-12-01T13:45:00Z", "2026-12-01t13:45:00.5+02:00"). Returns 0 with *out in
 * unix seconds (before 1970: 0), or -1. */
static int parse_when(const char *s, int64_t *out)
{
    const char *p = s;
    int y, mo, d, h = 0, mi = 0, sec = 0, off = 0;
    if (digits(&p, 4, &y) < 0 || *p++ != '-' || digits(&p, 2, &mo) < 0 || *p++ != '-' ||
        digits(&p, 2, &d) < 0)
        return -1;
    if (*p) {
        if (*p != 'T' && *p != 't' && *p != ' ')
            return -1;
        p++;
        if (digits(&p, 2, &h) < 0 || *p++ != ':' || digits(&p, 2, &mi) < 0 || *p++ != ':' ||
            digits(&p, 2, &sec) < 0)
            return -1;
        if (*p == '.') {
            p++;
            if (*p < '0' || *p > '9')
                return -1;
            while (*p >= '0' && *p <= '9')
                p++;
        }
        if (*p == 'Z' || *p == 'z') {
            p++;
        } else if (*p == '+' || *p == '-') {
            int sign = *p++ == '-' ? -1 : 1, oh, om;
            if (digits(&p, 2, &oh) < 0 || *p++ != ':' || digits(&p, 2, &om) < 0 || oh > 23 ||
                om > 59)
                return -1;
            off = sign * (oh * 3600 + om * 60);
        } else {
            return -1;
        }
        if (*p)
            return -1;
    }
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap) ||
        h > 23 || mi > 59 || sec > 60)
        return -1;
    /* Days from the civil date (proleptic Gregorian), without the C library's time_t limits. */
    int64_t yy = y - (mo <= 2);
    int64_t era = (yy >= 0 ? yy : yy - 399) / 400;
    int64_t yoe = yy - era * 400;
    int64_t doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    int64_t days = era * 146097 + doe - 719468;
    int64_t t = days * 86400 + h * 3600 + mi * 60 + (sec > 59 ? 59 : sec) - off;
    *out = t < 0 ? 0 : t;
    return 0;
}

void api_usage(struct daemon *d, struct http_req *req, struct route_match *m)
{
    const char *from_s = http_req_query(req, "from"), *to_s = http_req_query(req, "to");
    const char *g = http_req_query(req, "group_by");
    int64_t now = now_unix(), from = now - now % 86400, to = now + 1;
    if (from_s && parse_when(from_s, &from) < 0) {
        api_reply_invalid(req, "from: want an RFC 3339 date (2026-12-01, UTC) or date-time "
                               "(2026-12-01T13:45:00Z)");
        return;
    }
    if (to_s && parse_when(to_s, &to) < 0) {
        api_reply_invalid(req, "to: want an RFC 3339 date (2026-12-01, UTC) or date-time "
                               "(2026-12-01T13:45:00Z)");
        return;
    }
    if (to < from)
        to = from; /* an empty range: nothing in it */
    if (!g)
        g = "sandbox";
    if (strcmp(g, "sandbox") && strcmp(g, "key") && strcmp(g, "day") && strcmp(g, "minute")) {
        api_reply_invalid(req, "group_by: must be sandbox, key, day or minute");
        return;
    }
    const char *sb = http_req_query(req, "sandbox");
    if (sb && !sb_id_valid(sb)) {
        api_reply_invalid(req, "sandbox: not a sandbox id (sb- and 21 base32 characters)");
        return;
    }
    svc_usage(d, from, to, g, sb, api_sink_new(req));
}
