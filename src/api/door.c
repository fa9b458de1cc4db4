/*
 * The door: what every request passes before a route sees it.
 *
 * - On TCP, the Host header must name the daemon: its own address as the client reached it,
 *   `localhost` on a loopback listener, or a name given with `serve --host-name`; and an
 *   Origin header, if any, must name the same, with the listener's scheme (https on TLS). A
 *   web page the user visits cannot then drive the API, neither cross-site nor by rebinding a
 *   name of its own to 127.0.0.1.
 * - Who is asking: root on the Unix socket without a key is the admin; everyone else needs a
 *   key (`Authorization: Bearer wr_...`). Every failure gets the same 401.
 * - A client that keeps sending wrong keys (by address on TCP, by uid on the Unix socket) is
 *   answered 429 with Retry-After for a while, without a look at its keys, so guessing is
 *   slowed to a key a second; other clients are not slowed. (No key at all is not a guess.)
 */
#include "api/door.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/api.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/keys.h"

/* Failed attempts: a client may fail DOOR_BURST times at once, then once per DOOR_EVERY_MS. */
#define DOOR_BURST 10
#define DOOR_EVERY_MS 1000
#define DOOR_SLOTS 4096
#define DOOR_PROBE 8

struct slot {
    char who[64];
    int64_t tat; /* when the client's failures will have drained (ms, monotonic) */
};

/* One API server per process: its clients' failures, in a fixed table. */
static struct slot slots[DOOR_SLOTS];

static uint32_t hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The client's slot; a new client takes a free one or the one whose failures drain first. */
static struct slot *slot_of(const char *who, int64_t now, int create)
{
    uint32_t h = hash(who);
    struct slot *victim = NULL;
    for (int i = 0; i < DOOR_PROBE; i++) {
        struct slot *s = &slots[(h + (uint32_t)i) % DOOR_SLOTS];
        if (strcmp(s->who, who) == 0)
            return s;
        if (!victim || s->tat < victim->tat)
            victim = s;
    }
    if (!create)
        return NULL;
    snprintf(victim->who, sizeof(victim->who), "%s", who);
    victim->tat = now;
    return victim;
}

/* Milliseconds until the client may try again; 0 if it may now. */
static int64_t door_wait(const char *who, int64_t now)
{
    struct slot *s = slot_of(who, now, 0);
    int64_t over = s ? s->tat - now - (int64_t)DOOR_BURST * DOOR_EVERY_MS : 0;
    return over > 0 ? over : 0;
}

static void door_failed(const char *who, int64_t now)
{
    struct slot *s = slot_of(who, now, 1);
    s->tat = (s->tat > now ? s->tat : now) + DOOR_EVERY_MS;
}

/* ---- Host and Origin ---- */

/* Splits "host[:port]" or "[v6][:port]" into host and port (-1 if none). -1 if malformed. */
static int split_host(const char *in, size_t n, char *host, size_t hostlen, int *port)
{
    const char *end = in + n, *colon;
    *port = -1;
    if (n && in[0] == '[') {
        const char *rb = memchr(in, ']', n);
        if (!rb)
            return -1;
        if ((size_t)(rb - in - 1) >= hostlen)
            return -1;
        memcpy(host, in + 1, (size_t)(rb - in - 1));
        host[rb - in - 1] = '\0';
        colon = rb + 1 < end ? rb + 1 : NULL;
        if (colon && *colon != ':')
            return -1;
    } else {
        colon = memchr(in, ':', n);
        size_t hl = colon ? (size_t)(colon - in) : n;
        if (hl == 0 || hl >= hostlen)
            return -1;
        memcpy(host, in, hl);
        host[hl] = '\0';
    }
    if (colon) {
        const char *p = colon + 1;
        if (p == end || end - p > 5)
            return -1;
        int v = 0;
        for (; p < end; p++) {
            if (*p < '0' || *p > '9')
                return -1;
            v = v * 10 + (*p - '0');
        }
        if (v < 1 || v > 65535)
            return -1;
        *port = v;
    }
    return 0;
}

/* Returns 1 if a and b are the same IP address written two ways ("::1", "0:0::1"). */
static int same_ip(const char *a, const char *b)
{
    unsigned char x[16], y[16];
    if (inet_pton(AF_INET, a, x) == 1 && inet_pton(AF_INET, b, y) == 1)
        return memcmp(x, y, 4) == 0;
    if (inet_pton(AF_INET6, a, x) == 1 && inet_pton(AF_INET6, b, y) == 1)
        return memcmp(x, y, 16) == 0;
    return 0;
}

static int is_loopback(const char *ip)
{
    unsigned char a[16];
    if (inet_pton(AF_INET, ip, a) == 1)
        return a[0] == 127;
    static const unsigned char one[16] = {[15] = 1};
    return inet_pton(AF_INET6, ip, a) == 1 && memcmp(a, one, 16) == 0;
}

/* Returns 1 if name is in the comma-separated list (case-insensitive). */
static int in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        if (l == n && strncasecmp(p, name, n) == 0)
            return 1;
        p += l + (p[l] == ',');
    }
    return 0;
}

/* Returns 1 if "host[:port]" (n bytes) names this daemon as peer reached it. */
static int names_us(const struct daemon *d, const struct http_peer *peer, const char *in, size_t n,
                    int default_port)
{
    char host[256];
    int port;
    if (split_host(in, n, host, sizeof(host), &port) < 0)
        return 0;
    if (port < 0)
        port = default_port;
    if (port != peer->local_port)
        return 0;
    if (same_ip(host, peer->local_addr))
        return 1;
    if (strcasecmp(host, "localhost") == 0 && is_loopback(peer->local_addr))
        return 1;
    return in_list(d->cfg.host_names, host);
}

/* Returns 1 if the Origin header (present) is the daemon's own: its scheme too (https on a
 * TLS listener, http on a plain one). */
static int origin_ok(const struct daemon *d, const struct http_peer *peer, const char *origin)
{
    int def;
    const char *rest;
    if (!peer->tls && strncasecmp(origin, "http://", 7) == 0) {
        rest = origin + 7;
        def = 80;
    } else if (peer->tls && strncasecmp(origin, "https://", 8) == 0) {
        rest = origin + 8;
        def = 443;
    } else {
        return 0; /* "null", file:, anything else */
    }
    size_t n = strlen(rest);
    if (n && rest[n - 1] == '/')
        n--;
    return names_us(d, peer, rest, n, def);
}

/* ---- who is asking ---- */

static void reply_unauthorized(struct http_req *req)
{
    http_reply_header(req, "WWW-Authenticate", "Bearer realm=\"withruntime\"");
    http_reply_error(req, 401, "unauthorized",
                     "a valid API key is needed: send Authorization: Bearer <key> (keys are made "
                     "by the admin with `withruntime keys create`)");
}

/* A WebSocket handshake's key offered as a subprotocol, "withruntime.key.<key>" (a browser
 * cannot set Authorization on a WebSocket), copied into buf; NULL if there is none. Only on a
 * GET with Upgrade: a handshake (a page's fetch can set neither header). */
static const char *ws_key(struct http_req *req, char *buf, size_t len)
{
    static const char prefix[] = "withruntime.key.";
    const char *h = http_req_header(req, "Sec-WebSocket-Protocol");
    if (!h || !http_req_header(req, "Upgrade") || strcmp(http_req_method(req), "GET") != 0)
        return NULL;
    for (const char *p = h; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        size_t l = strcspn(p, ", \t");
        if (l > sizeof(prefix) - 1 && l - (sizeof(prefix) - 1) < len &&
            strncmp(p, prefix, sizeof(prefix) - 1) == 0) {
            memcpy(buf, p + sizeof(prefix) - 1, l - (sizeof(prefix) - 1));
            buf[l - (sizeof(prefix) - 1)] = '\0';
            return buf;
        }
        p += l;
    }
    return NULL;
}

/* The token of "Authorization: Bearer <token>" (or a WebSocket's, ws_key); NULL if there is
 * none; "" if malformed. */
static const char *bearer(struct http_req *req, char *buf, size_t len)
{
    const char *h = http_req_header(req, "Authorization");
    if (!h)
        return ws_key(req, buf, len);
    if (strncasecmp(h, "Bearer ", 7) != 0)
        return "";
    h += 7;
    while (*h == ' ')
        h++;
    return h;
}

/* The Host and Origin checks; fills peer. Answers and returns -1 if they fail. */
static int door_where(struct daemon *d, struct http_req *req, struct http_peer *out)
{
    struct http_peer peer;
    if (http_req_peer(req, &peer) < 0) {
        http_reply_error(req, 400, "invalid_request", "cannot tell where the request came from");
        return -1;
    }
    *out = peer;
    if (!peer.unix_socket) {
        const char *host = http_req_header(req, "Host");
        if (!host || !names_us(d, &peer, host, strlen(host), peer.local_port)) {
            http_reply_error(req, 403, "forbidden",
                             "the Host header (%.100s) does not name this daemon; a daemon "
                             "reached by a name of its own is started with `serve --host-name "
                             "NAME`",
                             host ? host : "none");
            return -1;
        }
        const char *origin = http_req_header(req, "Origin");
        if (origin && !origin_ok(d, &peer, origin)) {
            http_reply_error(req, 403, "forbidden",
                             "requests from web pages of other origins (%.100s) are refused",
                             origin);
            return -1;
        }
    }
    return 0;
}

int door_meant_for_us(struct daemon *d, struct http_req *req)
{
    struct http_peer peer;
    return door_where(d, req, &peer);
}

int door_check(struct daemon *d, struct http_req *req, struct principal *who)
{
    struct http_peer peer;
    memset(who, 0, sizeof(*who));
    if (door_where(d, req, &peer) < 0)
        return -1;
    char wsbuf[256];
    const char *token = bearer(req, wsbuf, sizeof(wsbuf));
    if (!token && peer.unix_socket && peer.uid == 0) {
        who->admin = 1;
        return 0;
    }
    char client[64];
    if (peer.unix_socket)
        snprintf(client, sizeof(client), "uid:%ld", peer.uid);
    else
        snprintf(client, sizeof(client), "ip:%s", peer.addr);
    int64_t now = (int64_t)now_ms_monotonic();
    int64_t wait = door_wait(client, now);
    if (wait > 0) {
        char secs[24];
        snprintf(secs, sizeof(secs), "%lld", (long long)((wait + 999) / 1000));
        http_reply_header(req, "Retry-After", secs);
        http_reply_error(req, 429, "rate_limited",
                         "too many requests without a valid key from this client; try again in "
                         "%s s",
                         secs);
        return -1;
    }
    const struct api_key *key = token ? keys_check(d->keys, token) : NULL;
    if (!key) {
        if (token) /* a wrong key is a guess; no key at all is not */
            door_failed(client, now);
        reply_unauthorized(req);
        return -1;
    }
    who->read_only = key->read_only;
    who->metrics_only = key->metrics;
    who->auditor = key->auditor;
    snprintf(who->key_id, sizeof(who->key_id), "%s", key->id);
    snprintf(who->owner_id, sizeof(who->owner_id), "%s", key->owner_id);
    return 0;
}

int door_content_type_ok(struct http_req *req)
{
    const char *ct = http_req_header(req, "Content-Type");
    if (!ct)
        return http_req_body_len(req) == 0;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    static const char json[] = "application/json";
    size_t n = sizeof(json) - 1;
    if (strncasecmp(ct, json, n) != 0)
        return 0;
    ct += n;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}
