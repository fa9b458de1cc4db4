/*
 * The resolvers' answer cache: see dnscache.h. A fixed array of entries, found by a chained hash
 * of the name, on three intrusive lists by index: the global least-recently-used order, the
 * order of each owner's own entries (for its share), and the free list. Every operation is O(1)
 * but the hash chain's walk, which the table's size (twice the entries) keeps short.
 */
#include "net/dnscache.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define NO_OWNER UINT32_MAX
#define BUCKETS (2 * DNSCACHE_MAX) /* a power of two */

struct entry {
    char name[DNS_NAME_MAX + 1]; /* "" when free */
    uint32_t hnext;              /* the hash chain */
    uint32_t prev, next;         /* the LRU list (most recent first), or the free list (next) */
    uint32_t oprev, onext;       /* the owner's list (most recent first) */
    uint32_t owner;              /* NO_OWNER once disowned */
    uint64_t expires_ms;
    uint8_t kind, n;
    uint8_t v4[DNSCACHE_ADDRS_MAX][4];
};

struct owner_list {
    uint32_t head, tail, count;
};

struct dnscache {
    unsigned owners;
    struct owner_list *olist;
    uint32_t lru_head, lru_tail, free_head;
    struct dnscache_stats stats;
    uint32_t buckets[BUCKETS];
    struct entry e[DNSCACHE_MAX];
};

static uint32_t hash(const char *name)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *name; name++)
        h = (h ^ (uint8_t)*name) * 16777619u;
    return h & (BUCKETS - 1);
}

static uint32_t find(const struct dnscache *c, const char *name)
{
    for (uint32_t i = c->buckets[hash(name)]; i != NIL; i = c->e[i].hnext)
        if (strcmp(c->e[i].name, name) == 0)
            return i;
    return NIL;
}

static void lru_unlink(struct dnscache *c, uint32_t i)
{
    struct entry *e = &c->e[i];
    if (e->prev != NIL)
        c->e[e->prev].next = e->next;
    else
        c->lru_head = e->next;
    if (e->next != NIL)
        c->e[e->next].prev = e->prev;
    else
        c->lru_tail = e->prev;
    e->prev = e->next = NIL;
}

static void lru_push(struct dnscache *c, uint32_t i)
{
    struct entry *e = &c->e[i];
    e->prev = NIL;
    e->next = c->lru_head;
    if (c->lru_head != NIL)
        c->e[c->lru_head].prev = i;
    else
        c->lru_tail = i;
    c->lru_head = i;
}

static void owner_unlink(struct dnscache *c, uint32_t i)
{
    struct entry *e = &c->e[i];
    if (e->owner == NO_OWNER)
        return;
    struct owner_list *o = &c->olist[e->owner];
    if (e->oprev != NIL)
        c->e[e->oprev].onext = e->onext;
    else
        o->head = e->onext;
    if (e->onext != NIL)
        c->e[e->onext].oprev = e->oprev;
    else
        o->tail = e->oprev;
    o->count--;
    e->oprev = e->onext = NIL;
    e->owner = NO_OWNER;
}

static void owner_push(struct dnscache *c, uint32_t i, uint32_t owner)
{
    struct entry *e = &c->e[i];
    struct owner_list *o = &c->olist[owner];
    e->owner = owner;
    e->oprev = NIL;
    e->onext = o->head;
    if (o->head != NIL)
        c->e[o->head].oprev = i;
    else
        o->tail = i;
    o->head = i;
    o->count++;
}

/* Frees entry i: off every list, onto the free list. */
static void drop(struct dnscache *c, uint32_t i)
{
    struct entry *e = &c->e[i];
    uint32_t *link = &c->buckets[hash(e->name)];
    while (*link != i)
        link = &c->e[*link].hnext;
    *link = e->hnext;
    lru_unlink(c, i);
    owner_unlink(c, i);
    e->name[0] = '\0';
    e->next = c->free_head;
    c->free_head = i;
    c->stats.entries--;
}

/* Drops entry i to make room, counting it if it was still live. */
static void evict(struct dnscache *c, uint32_t i, uint64_t now_ms, int for_owner)
{
    if (c->e[i].expires_ms > now_ms) {
        c->stats.evicted++;
        c->stats.owner_evicted += for_owner != 0;
    }
    drop(c, i);
}

struct dnscache *dnscache_new(unsigned owners)
{
    struct dnscache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->olist = calloc(owners ? owners : 1, sizeof(*c->olist));
    if (!c->olist) {
        free(c);
        return NULL;
    }
    c->owners = owners;
    for (unsigned o = 0; o < owners; o++)
        c->olist[o].head = c->olist[o].tail = NIL;
    for (uint32_t b = 0; b < BUCKETS; b++)
        c->buckets[b] = NIL;
    c->lru_head = c->lru_tail = NIL;
    for (uint32_t i = 0; i < DNSCACHE_MAX; i++) {
        c->e[i].owner = NO_OWNER;
        c->e[i].prev = c->e[i].oprev = c->e[i].onext = NIL;
        c->e[i].next = i + 1 < DNSCACHE_MAX ? i + 1 : NIL;
    }
    c->free_head = 0;
    c->stats.bytes = sizeof(*c) + (owners ? owners : 1) * sizeof(*c->olist);
    return c;
}

void dnscache_free(struct dnscache *c)
{
    if (!c)
        return;
    free(c->olist);
    free(c);
}

int dnscache_get(struct dnscache *c, const char *name, uint64_t now_ms, struct dnscache_answer *out)
{
    uint32_t i = find(c, name);
    if (i != NIL && c->e[i].expires_ms <= now_ms) {
        drop(c, i);
        i = NIL;
    }
    if (i == NIL) {
        c->stats.misses++;
        return 0;
    }
    struct entry *e = &c->e[i];
    c->stats.hits++;
    lru_unlink(c, i);
    lru_push(c, i);
    if (e->owner != NO_OWNER) {
        uint32_t owner = e->owner;
        owner_unlink(c, i);
        owner_push(c, i, owner);
    }
    memset(out, 0, sizeof(*out));
    out->kind = e->kind;
    out->n = e->n;
    for (size_t k = 0; k < e->n; k++) {
        out->addrs[k].family = AF_INET;
        memcpy(out->addrs[k].addr, e->v4[k], 4);
    }
    /* Rounded up: an answer with 300 ms left says 1 s, never 0 (which a stub would not cache
     * at all, nor should it read as "expired"). */
    out->ttl = (uint32_t)((e->expires_ms - now_ms + 999) / 1000);
    return 1;
}

void dnscache_put(struct dnscache *c, unsigned owner, const char *name, enum dnscache_kind kind,
                  const struct dns_addr *addrs, size_t n, uint32_t ttl, uint64_t now_ms)
{
    size_t len = strlen(name);
    if (owner >= c->owners || len == 0 || len > DNS_NAME_MAX ||
        (kind != DNSCACHE_ADDRS && kind != DNSCACHE_NODATA && kind != DNSCACHE_NXDOMAIN))
        return;
    uint8_t v4[DNSCACHE_ADDRS_MAX][4];
    size_t k = 0;
    for (size_t j = 0; kind == DNSCACHE_ADDRS && j < n && k < DNSCACHE_ADDRS_MAX; j++)
        if (addrs[j].family == AF_INET)
            memcpy(v4[k++], addrs[j].addr, 4);
    if (kind == DNSCACHE_ADDRS && k == 0)
        return;
    if (kind == DNSCACHE_ADDRS)
        ttl = ttl > DNSCACHE_TTL_MAX   ? DNSCACHE_TTL_MAX
              : ttl < DNSCACHE_TTL_MIN ? DNSCACHE_TTL_MIN
                                       : ttl;
    else
        ttl = DNSCACHE_NEG_TTL;

    uint32_t i = find(c, name);
    if (i != NIL)
        drop(c, i); /* the newer answer replaces it, under the new owner */
    if (c->olist[owner].count >= DNSCACHE_OWNER_MAX)
        evict(c, c->olist[owner].tail, now_ms, 1);
    else if (c->free_head == NIL)
        evict(c, c->lru_tail, now_ms, 0);
    i = c->free_head;
    struct entry *e = &c->e[i];
    c->free_head = e->next;
    memcpy(e->name, name, len + 1);
    e->kind = (uint8_t)kind;
    e->n = (uint8_t)k;
    memcpy(e->v4, v4, k * 4);
    e->expires_ms = now_ms + (uint64_t)ttl * 1000;
    uint32_t *bucket = &c->buckets[hash(name)];
    e->hnext = *bucket;
    *bucket = i;
    lru_push(c, i);
    owner_push(c, i, owner);
    c->stats.entries++;
    c->stats.stored++;
}

void dnscache_disown(struct dnscache *c, unsigned owner)
{
    if (!c || owner >= c->owners)
        return;
    while (c->olist[owner].head != NIL)
        owner_unlink(c, c->olist[owner].head);
}

unsigned dnscache_owner_entries(const struct dnscache *c, unsigned owner)
{
    return owner < c->owners ? c->olist[owner].count : 0;
}

void dnscache_stats(const struct dnscache *c, struct dnscache_stats *out)
{
    *out = c->stats;
}
