/*
 * The proxy's DNS client: see lookup.h. Shaped like resolver.c (one unconnected socket, a fixed
 * table of queries with their timers, random ids, replies only from the upstream's address), with
 * what a client needs on top: requests that wait on a query, a cache, and a queue of results that
 * are delivered on the next turn of the loop.
 *
 * A request is on exactly one list at a time: a query's waiters, or the queue of results to
 * deliver. It records which, so that lookup_cancel can unlink it from anywhere, including from
 * the batch being delivered right now (one callback may cancel another request).
 */
#include "net/lookup.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/util.h"
#include "net/addr.h"

/* Datagrams read per readiness callback, so one busy socket does not starve the loop. */
#define READ_BATCH 64
/* We advertise DNS_EDNS_UDP; a larger answer is a broken upstream (dropped; the query times
 * out), and the slack byte is what lets us see it was larger. */
#define UPSTREAM_BUF (DNS_EDNS_UDP + 1)
/* Attempts at a random id not already in flight (at most LOOKUP_PENDING_MAX of 65536 are). */
#define ID_TRIES 64

struct req_list {
    struct lookup_req *head, *tail;
};

struct lookup_req {
    struct lookup *l;
    struct lookup_req *prev, *next;
    struct req_list *on; /* the list it is on */
    lookup_cb cb;
    void *arg;
    /* A result queued for delivery. */
    int rc;
    const char *why;
    struct dns_addr addrs[LOOKUP_ADDRS_MAX];
    size_t n;
};

struct query {
    struct lookup *l;
    struct event *timer; /* made at lookup_new, added while the slot is used */
    int used;
    int tries;
    uint16_t id;
    char name[DNS_NAME_MAX + 1];
    struct req_list waiters;
};

struct cache_entry {
    char name[DNS_NAME_MAX + 1]; /* "" for a free entry */
    struct dns_addr addrs[LOOKUP_ADDRS_MAX];
    size_t n;
    uint64_t expires_ms; /* monotonic */
    uint64_t used_ms;    /* last hit or fill, for eviction */
};

struct lookup {
    struct event_base *base;
    int fd;
    struct event *ev_read;
    struct event *ev_deliver; /* made active when results are queued */
    struct sockaddr_storage upstream;
    socklen_t upstream_len;
    struct req_list queued; /* results waiting for the next turn */
    struct lookup_stats stats;
    int retry_ms, timeout_ms; /* LOOKUP_RETRY_MS, LOOKUP_TIMEOUT_MS unless a test says */
    uint8_t out[DNS_EDNS_UDP];
    uint8_t in[UPSTREAM_BUF];
    struct query queries[LOOKUP_PENDING_MAX];
    struct cache_entry cache[LOOKUP_CACHE_MAX];
};

static void list_push(struct req_list *list, struct lookup_req *r)
{
    r->on = list;
    r->next = NULL;
    r->prev = list->tail;
    if (list->tail)
        list->tail->next = r;
    else
        list->head = r;
    list->tail = r;
}

static void list_unlink(struct lookup_req *r)
{
    struct req_list *list = r->on;
    if (r->prev)
        r->prev->next = r->next;
    else
        list->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        list->tail = r->prev;
    r->on = NULL;
    r->prev = r->next = NULL;
}

/* Moves every request of from onto to (which must be empty). */
static void list_take(struct req_list *to, struct req_list *from)
{
    *to = *from;
    from->head = from->tail = NULL;
    for (struct lookup_req *r = to->head; r; r = r->next)
        r->on = to;
}

static void list_free(struct req_list *list)
{
    struct lookup_req *r = list->head;
    while (r) {
        struct lookup_req *next = r->next;
        free(r);
        r = next;
    }
    list->head = list->tail = NULL;
}

static void timer_add_ms(struct event *ev, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(ev, &tv);
}

/* Calls each request of list and frees it, in order. A callback may cancel a request still on
 * the list (it is unlinked and never called) or start new ones (they go elsewhere). */
static void deliver(struct req_list *list)
{
    struct lookup_req *r;
    while ((r = list->head) != NULL) {
        list_unlink(r);
        r->cb(r->arg, r->rc, r->addrs, r->n, r->why);
        free(r);
    }
}

static void on_deliver(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct lookup *l = arg;
    struct req_list batch;
    /* Only what was queued before this turn: results queued by these callbacks wait for the
     * next one, so a caller that retries on failure cannot spin here. */
    list_take(&batch, &l->queued);
    deliver(&batch);
}

/* Queues r's result (already filled in) for the next turn of the loop. */
static void queue_result(struct lookup *l, struct lookup_req *r)
{
    list_push(&l->queued, r);
    event_active(l->ev_deliver, EV_TIMEOUT, 1);
}

static void set_result(struct lookup_req *r, int rc, const char *why, const struct dns_addr *addrs,
                       size_t n)
{
    r->rc = rc;
    r->why = why;
    r->n = n;
    if (n)
        memcpy(r->addrs, addrs, n * sizeof(*addrs));
}

/* ---- the cache ---- */

static struct cache_entry *cache_find(struct lookup *l, const char *name, uint64_t now)
{
    for (size_t i = 0; i < LOOKUP_CACHE_MAX; i++) {
        struct cache_entry *e = &l->cache[i];
        if (e->name[0] && strcmp(e->name, name) == 0)
            return e->expires_ms > now ? e : NULL;
    }
    return NULL;
}

/* Whether e should be replaced before v: a free entry first, then an expired one, then the least
 * recently used. */
static int evict_before(const struct cache_entry *e, const struct cache_entry *v, uint64_t now)
{
    if (!v->name[0] || !e->name[0])
        return !e->name[0] && v->name[0];
    int e_old = e->expires_ms <= now, v_old = v->expires_ms <= now;
    if (e_old != v_old)
        return e_old;
    return e->used_ms < v->used_ms;
}

static void cache_put(struct lookup *l, const char *name, const struct dns_addr *addrs, size_t n,
                      uint32_t ttl, uint64_t now)
{
    struct cache_entry *slot = NULL;
    for (size_t i = 0; i < LOOKUP_CACHE_MAX; i++) {
        struct cache_entry *e = &l->cache[i];
        if (e->name[0] && strcmp(e->name, name) == 0) {
            slot = e; /* this name's expired entry */
            break;
        }
        if (!slot || evict_before(e, slot, now))
            slot = e;
    }
    if (!slot->name[0])
        l->stats.cached++;
    if (ttl > LOOKUP_TTL_MAX)
        ttl = LOOKUP_TTL_MAX;
    if (ttl < LOOKUP_TTL_MIN)
        ttl = LOOKUP_TTL_MIN;
    snprintf(slot->name, sizeof(slot->name), "%s", name);
    memcpy(slot->addrs, addrs, n * sizeof(*addrs));
    slot->n = n;
    slot->expires_ms = now + (uint64_t)ttl * 1000;
    slot->used_ms = now;
}

/* ---- queries ---- */

static struct query *query_by_id(struct lookup *l, uint16_t id)
{
    for (size_t i = 0; i < LOOKUP_PENDING_MAX; i++)
        if (l->queries[i].used && l->queries[i].id == id)
            return &l->queries[i];
    return NULL;
}

static struct query *query_by_name(struct lookup *l, const char *name)
{
    for (size_t i = 0; i < LOOKUP_PENDING_MAX; i++)
        if (l->queries[i].used && strcmp(l->queries[i].name, name) == 0)
            return &l->queries[i];
    return NULL;
}

/* Sends (or sends again) q's question; a failed send is left to the retry timer. */
static void query_send(struct query *q)
{
    struct lookup *l = q->l;
    int n = dnsmsg_build_query(q->id, q->name, DNS_TYPE_A, l->out, sizeof(l->out));
    q->tries++;
    if (n < 0)
        return;
    if (sendto(l->fd, l->out, (size_t)n, MSG_NOSIGNAL, (struct sockaddr *)&l->upstream,
               l->upstream_len) == n)
        l->stats.sent++;
}

/* Ends q: frees its slot, then gives every waiter the result. */
static void query_done(struct query *q, int rc, const char *why, const struct dns_addr *addrs,
                       size_t n)
{
    struct lookup *l = q->l;
    struct req_list waiters;
    list_take(&waiters, &q->waiters);
    event_del(q->timer);
    q->used = 0;
    l->stats.pending--;
    for (struct lookup_req *r = waiters.head; r; r = r->next)
        set_result(r, rc, why, addrs, n);
    deliver(&waiters);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct query *q = arg;
    if (q->tries < 2) {
        q->l->stats.retries++;
        query_send(q);
        timer_add_ms(q->timer, q->l->timeout_ms - q->l->retry_ms);
        return;
    }
    q->l->stats.timeouts++;
    query_done(q, -1, "timeout", NULL, 0);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct lookup *l = arg;
    for (int i = 0; i < READ_BATCH; i++) {
        struct sockaddr_storage from;
        socklen_t flen = sizeof(from);
        memset(&from, 0, sizeof(from));
        ssize_t n = recvfrom(fd, l->in, sizeof(l->in), MSG_TRUNC, (struct sockaddr *)&from, &flen);
        if (n < 0)
            return;
        if ((size_t)n > sizeof(l->in) || n < DNS_HEADER_LEN || !addr_same(&from, &l->upstream))
            continue;
        struct query *q = query_by_id(l, (uint16_t)(l->in[0] << 8 | l->in[1]));
        if (!q)
            continue;
        struct dns_addr addrs[LOOKUP_ADDRS_MAX];
        size_t na = 0;
        uint32_t ttl = 0;
        int rc = dnsmsg_parse_answer(l->in, (size_t)n, q->id, q->name, DNS_TYPE_A, addrs,
                                     LOOKUP_ADDRS_MAX, &na, &ttl);
        if (rc == DNS_ANSWER_NOT_OURS)
            continue; /* a stray or a spoof: keep waiting for the real one */
        if (rc == DNS_RCODE_NOERROR && na > 0) {
            cache_put(l, q->name, addrs, na, ttl, now_ms_monotonic());
            query_done(q, 0, "ok", addrs, na);
        } else if (rc == DNS_RCODE_NOERROR) {
            query_done(q, -1, "no_address", NULL, 0);
        } else if (rc == DNS_RCODE_NXDOMAIN) {
            query_done(q, -1, "nxdomain", NULL, 0);
        } else {
            query_done(q, -1, "upstream_error", NULL, 0);
        }
    }
}

/* Lower case, no trailing dot, into out (DNS_NAME_MAX + 1 bytes). Returns 0, or -1 for what
 * cannot be a name (the characters are checked by dnsmsg_build_query). */
static int normalise(const char *name, char *out)
{
    size_t n = name ? strlen(name) : 0;
    if (n > 0 && name[n - 1] == '.')
        n--;
    if (n == 0 || n > DNS_NAME_MAX)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        out[i] = ch >= 'A' && ch <= 'Z' ? (char)(ch - 'A' + 'a') : ch;
    }
    out[n] = '\0';
    return 0;
}

struct lookup_req *lookup_start(struct lookup *l, const char *name, lookup_cb cb, void *arg)
{
    struct lookup_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->l = l;
    r->cb = cb;
    r->arg = arg;
    l->stats.started++;

    char key[DNS_NAME_MAX + 1];
    if (normalise(name, key) < 0 || dnsmsg_build_query(0, key, DNS_TYPE_A, l->out, 512) < 0) {
        set_result(r, -1, "bad_name", NULL, 0);
        queue_result(l, r);
        return r;
    }
    uint64_t now = now_ms_monotonic();
    struct cache_entry *e = cache_find(l, key, now);
    if (e) {
        l->stats.cache_hits++;
        e->used_ms = now;
        set_result(r, 0, "ok", e->addrs, e->n);
        queue_result(l, r);
        return r;
    }
    struct query *q = query_by_name(l, key);
    if (q) {
        l->stats.shared++;
        list_push(&q->waiters, r);
        return r;
    }
    for (size_t i = 0; i < LOOKUP_PENDING_MAX && !q; i++)
        if (!l->queries[i].used)
            q = &l->queries[i];
    uint16_t id = 0;
    int found = 0;
    for (int t = 0; q && t < ID_TRIES && !found; t++)
        found = getrandom(&id, sizeof(id), 0) == (ssize_t)sizeof(id) && !query_by_id(l, id);
    if (!found) {
        l->stats.busy++;
        set_result(r, -1, "busy", NULL, 0);
        queue_result(l, r);
        return r;
    }
    q->used = 1;
    q->tries = 0;
    q->id = id;
    memcpy(q->name, key, sizeof(key));
    list_push(&q->waiters, r);
    l->stats.pending++;
    query_send(q);
    timer_add_ms(q->timer, l->retry_ms);
    return r;
}

void lookup_cancel(struct lookup_req *req)
{
    if (!req)
        return;
    list_unlink(req);
    free(req);
}

void lookup_set_timeouts(struct lookup *l, int retry_ms, int timeout_ms)
{
    if (retry_ms > 0 && timeout_ms > retry_ms) {
        l->retry_ms = retry_ms;
        l->timeout_ms = timeout_ms;
    }
}

void lookup_stats(const struct lookup *l, struct lookup_stats *out)
{
    *out = l->stats;
}

struct lookup *lookup_new(struct event_base *base, const struct sockaddr *upstream,
                          socklen_t upstream_len, struct wr_err *err)
{
    if (!base || !upstream || upstream_len > sizeof(struct sockaddr_storage) ||
        (upstream->sa_family != AF_INET && upstream->sa_family != AF_INET6)) {
        wr_err_set(err, EINVAL, "lookup: bad arguments");
        return NULL;
    }
    struct lookup *l = calloc(1, sizeof(*l));
    if (!l) {
        wr_err_sys(err, ENOMEM, "lookup");
        return NULL;
    }
    l->base = base;
    l->retry_ms = LOOKUP_RETRY_MS;
    l->timeout_ms = LOOKUP_TIMEOUT_MS;
    memcpy(&l->upstream, upstream, upstream_len);
    l->upstream_len = upstream_len;
    l->fd = socket(upstream->sa_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0) {
        wr_err_sys(err, errno, "lookup: socket");
        free(l);
        return NULL;
    }
    l->ev_read = event_new(base, l->fd, EV_READ | EV_PERSIST, on_read, l);
    l->ev_deliver = event_new(base, -1, 0, on_deliver, l);
    if (!l->ev_read || !l->ev_deliver)
        goto fail;
    for (size_t i = 0; i < LOOKUP_PENDING_MAX; i++) {
        l->queries[i].l = l;
        l->queries[i].timer = event_new(base, -1, 0, on_timer, &l->queries[i]);
        if (!l->queries[i].timer)
            goto fail;
    }
    if (event_add(l->ev_read, NULL) < 0)
        goto fail;
    return l;
fail:
    wr_err_set(err, ENOMEM, "lookup: events");
    lookup_free(l);
    return NULL;
}

void lookup_free(struct lookup *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < LOOKUP_PENDING_MAX; i++) {
        list_free(&l->queries[i].waiters);
        if (l->queries[i].timer)
            event_free(l->queries[i].timer);
    }
    list_free(&l->queued);
    if (l->ev_read)
        event_free(l->ev_read);
    if (l->ev_deliver)
        event_free(l->ev_deliver);
    if (l->fd >= 0)
        close(l->fd);
    free(l);
}
