/*
 * Money: the meter, the caps and the usage ledger (meter.h).
 */
#include "daemon/meter.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/keys.h"
#include "daemon/sandbox.h"
#include "daemon/sink.h"
#include "store/store.h"

/* How often a running sandbox is metered, and how often charges go to the store. */
#define METER_EVERY_MS 1000
#define FLUSH_EVERY_MS 5000
/* Charges held in memory before they are written at once. */
#define PENDING_MAX 4096
/* A gap longer than this (a clock set far ahead) is charged only this far. */
#define MAX_GAP_MS (7LL * 86400 * 1000)
/* The ledger keeps per-minute rows for this many days; older days are folded into one row per
 * sandbox per day, checked this often. */
#define MINUTE_ROWS_DAYS 7
#define COMPACT_EVERY_MS (3600LL * 1000)
/* Groups a usage query answers at most. */
#define USAGE_GROUPS_MAX 10000

#define MS_PER_HOUR 3600000ULL
#define MS_PER_DAY 86400000LL

struct meter_row {
    char sandbox_id[40];
    char key_id[32];
    int64_t minute;
    int64_t cost_micros;
    int64_t cpu_usec;
    int64_t memory_mib_ms;
};

struct meter {
    struct meter_row *rows; /* charges not yet in the store */
    size_t n;
    uint64_t flushed_at; /* meter clock */
    uint64_t rolled_at;
    uint64_t compacted_at;
    uint64_t clock_last; /* the test clock's last good reading */
};

/* ---- the arithmetic ---- */

int64_t meter_price(const struct meter_prices *p, uint64_t cpu_usec, uint64_t mem_mib_ms)
{
    /* vcpu_hour_micros per 3.6e9 CPU-usec; gib_hour_micros per 1024 MiB x 3.6e6 ms. 128-bit
     * products: a year of a big sandbox does not overflow. */
    unsigned __int128 cpu = (unsigned __int128)cpu_usec * (uint64_t)p->vcpu_hour_micros;
    unsigned __int128 mem = (unsigned __int128)mem_mib_ms * (uint64_t)p->gib_hour_micros;
    return (int64_t)(cpu / (MS_PER_HOUR * 1000) + mem / (1024 * MS_PER_HOUR));
}

uint64_t meter_billed_cpu(const struct meter_prices *p, int cpus, uint64_t ms, uint64_t frozen_ms,
                          uint64_t used_usec)
{
    uint64_t all = (uint64_t)cpus * ms * 1000;
    uint64_t awake = (uint64_t)cpus * (ms - (frozen_ms < ms ? frozen_ms : ms)) * 1000;
    uint64_t floor = awake * (uint64_t)p->cpu_floor_permille / 1000;
    if (used_usec > all)
        used_usec = all;
    return used_usec > floor ? used_usec : floor;
}

int64_t meter_max_cost(const struct meter_prices *p, int cpus, int mem_mib, uint64_t ms)
{
    return meter_price(p, (uint64_t)cpus * ms * 1000, (uint64_t)mem_mib * ms) + 1;
}

/* ---- the clock ---- */

/* The meter's clock, ms: monotonic, or (tests) the number in cfg.meter_clock_file, which only
 * moves when the test moves it. */
static uint64_t meter_clock(struct daemon *d)
{
    if (!d->cfg.meter_clock_file[0])
        return now_ms_monotonic();
    char buf[32];
    int fd = open(d->cfg.meter_clock_file, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (n > 0) {
        buf[n] = '\0';
        char *end;
        errno = 0;
        unsigned long long v = strtoull(buf, &end, 10);
        if (!errno && end != buf && v >= d->meter->clock_last)
            d->meter->clock_last = v;
    }
    return d->meter->clock_last;
}

/* The wall clock (unix ms) at meter time t, for the ledger's minutes and the keys' days. */
static int64_t wall_at(struct daemon *d, uint64_t now, uint64_t t)
{
    if (d->cfg.meter_clock_file[0])
        return (int64_t)t; /* the test clock is a unix time in ms */
    return now_ms_wall() - (int64_t)(now - t);
}

static int64_t meter_today(struct daemon *d)
{
    uint64_t now = meter_clock(d);
    return wall_at(d, now, now) / MS_PER_DAY;
}

/* ---- keys' budgets ---- */

static struct api_key *budget_of(struct daemon *d, const char *key_id)
{
    if (!key_id[0] || !d->keys)
        return NULL;
    for (struct api_key *k = keys_head(d->keys); k; k = k->next)
        if (strcmp(k->id, key_id) == 0)
            return k;
    return NULL;
}

static void roll(struct api_key *k, int64_t day)
{
    if (k->spent_day != day) {
        k->spent_day = day;
        k->spent_micros = 0;
    }
}

int64_t meter_key_spent_today(struct daemon *d, const char *key_id)
{
    struct api_key *k = budget_of(d, key_id);
    if (!k || !d->meter)
        return 0;
    roll(k, meter_today(d));
    return k->spent_micros;
}

/* ---- reservations ---- */

static void release(struct sandbox *sb)
{
    struct api_key *k = budget_of(sb->d, sb->key_id);
    if (k) {
        k->reserved_micros -= sb->reserved_micros;
        if (k->reserved_micros < 0)
            k->reserved_micros = 0;
    }
    sb->reserved_micros = 0;
}

enum room { ROOM_OK, ROOM_CAP, ROOM_DAILY };

/* Gives back sb's reservation and takes a new one: the most its next METER_RESERVE_MS can
 * cost, or what its cap and its key's limit leave if less. ROOM_CAP or ROOM_DAILY if they
 * leave nothing (then it holds none). */
static enum room renew(struct sandbox *sb, int64_t day, int running)
{
    struct daemon *d = sb->d;
    release(sb);
    int64_t want = meter_max_cost(&d->cfg.prices, sb->cpus, sb->memory_mib, METER_RESERVE_MS);
    if (sb->max_cost_micros >= 0) {
        int64_t left = sb->max_cost_micros - sb->cost_micros;
        if (left <= 0)
            return ROOM_CAP;
        if (left < want)
            want = left;
    }
    struct api_key *k = budget_of(d, sb->key_id);
    if (k && k->daily_limit_micros >= 0) {
        roll(k, day);
        int64_t left = k->daily_limit_micros - k->spent_micros - k->reserved_micros;
        /* Reached once, reached for the day: what its stopped sandboxes held and did not use
         * is no invitation to start again. */
        if (k->exhausted_day == day)
            return ROOM_DAILY;
        if (left <= 0) {
            /* A running sandbox that cannot go on: the limit is reached. (A create refused
             * while the rest is held by running sandboxes is not yet.) */
            if (running)
                k->exhausted_day = day;
            return ROOM_DAILY;
        }
        if (left < want)
            want = left;
    }
    sb->reserved_micros = want;
    if (k)
        k->reserved_micros += want;
    return ROOM_OK;
}

static int room_err(const struct sandbox *sb, enum room r, struct wr_err *err)
{
    if (r == ROOM_CAP)
        return wr_err_kind(err, WR_E_COST_LIMIT, 0,
                           "sandbox %s has cost %lld micro-dollars, its max_cost_micros (%lld): "
                           "it does not run again (its files are kept and can be read back "
                           "once a new sandbox is made)",
                           sb->id, (long long)sb->cost_micros, (long long)sb->max_cost_micros);
    struct api_key *k = budget_of(sb->d, sb->key_id);
    /* In dollars: people read them, and a limit is set in them (keys set --daily-limit-usd). */
    char limit[32], spent[32], held[32];
    return wr_err_kind(err, WR_E_COST_LIMIT, 0,
                       "key %s has reached its daily limit of %s (spent %s today, UTC; %s held "
                       "by its running sandboxes); only the admin can raise it: withruntime "
                       "keys set %s --daily-limit-usd X",
                       sb->key_id, usd_format(k ? (long long)k->daily_limit_micros : 0, limit, 32),
                       usd_format(k ? (long long)k->spent_micros : 0, spent, 32),
                       usd_format(k ? (long long)k->reserved_micros : 0, held, 32), sb->key_id);
}

int meter_admit(struct sandbox *sb, struct wr_err *err)
{
    if (!sb->d->meter)
        return 0;
    enum room r = renew(sb, meter_today(sb->d), 0);
    if (r != ROOM_OK) {
        log_info(sb->id, "meter.refused", "why=%s key=%s",
                 r == ROOM_CAP ? "cost_cap" : "daily_limit", sb->key_id);
        return room_err(sb, r, err);
    }
    return 0;
}

static void stop_for(struct sandbox *sb, enum room r);

int meter_check_exec(struct sandbox *sb, struct wr_err *err)
{
    if (!sb->d->meter || !sb->metering || sb->reserved_micros > 0)
        return 0;
    /* Holding none (just started, or its last one used up before the next tick): it may go
     * on if it can take one now. */
    enum room r = renew(sb, meter_today(sb->d), 1);
    if (r == ROOM_OK)
        return 0;
    stop_for(sb, r);
    return room_err(sb, r, err);
}

/* ---- charges ---- */

static void flush(struct daemon *d)
{
    struct meter *m = d->meter;
    if (!m || m->n == 0)
        return;
    struct store_usage *rows = xcalloc(m->n, sizeof(*rows));
    for (size_t i = 0; i < m->n; i++)
        rows[i] = (struct store_usage){m->rows[i].sandbox_id, m->rows[i].key_id,
                                       m->rows[i].minute,     m->rows[i].cost_micros,
                                       m->rows[i].cpu_usec,   m->rows[i].memory_mib_ms};
    struct wr_err err = {0};
    if (store_usage_add(d->store, rows, m->n, &err) < 0)
        /* Kept for the next try, unless the buffer is full: then they are lost, and said so. */
        log_error(NULL, "meter.store_failed", "rows=%zu error=\"%s\"", m->n, err.msg);
    if (err.msg[0] == '\0' || m->n >= PENDING_MAX)
        m->n = 0;
    free(rows);
}

void meter_flush(struct daemon *d)
{
    flush(d);
}

static void record(struct daemon *d, const struct sandbox *sb, int64_t wall_ms, int64_t cost,
                   uint64_t cpu, uint64_t mem)
{
    struct meter *m = d->meter;
    int64_t minute = wall_ms / 60000;
    for (size_t i = m->n; i-- > 0;) {
        struct meter_row *r = &m->rows[i];
        if (r->minute == minute && strcmp(r->sandbox_id, sb->id) == 0) {
            r->cost_micros += cost;
            r->cpu_usec += (int64_t)cpu;
            r->memory_mib_ms += (int64_t)mem;
            return;
        }
    }
    if (m->n == PENDING_MAX)
        flush(d);
    struct meter_row *r = &m->rows[m->n++];
    snprintf(r->sandbox_id, sizeof(r->sandbox_id), "%s", sb->id);
    snprintf(r->key_id, sizeof(r->key_id), "%s", sb->key_id);
    r->minute = minute;
    r->cost_micros = cost;
    r->cpu_usec = (int64_t)cpu;
    r->memory_mib_ms = (int64_t)mem;
}

/*
 * Charges sb for ms of meter time ending at `now`, in which it used cpu_used usec, in slices of
 * at most METER_RESERVE_MS: each slice is priced (billed CPU at least the floor), cut to the
 * reservation it is taken from, recorded, and (if again) the reservation renewed. Returns
 * ROOM_OK, or why it has no room left (then it holds no reservation).
 */
static enum room charge(struct sandbox *sb, uint64_t now, uint64_t ms, uint64_t frozen_ms,
                        uint64_t cpu_used, int again)
{
    struct daemon *d = sb->d;
    const struct meter_prices *p = &d->cfg.prices;
    if ((int64_t)ms > MAX_GAP_MS) {
        log_warn(sb->id, "meter.gap", "ms=%llu charged_ms=%lld", (unsigned long long)ms,
                 MAX_GAP_MS);
        ms = MAX_GAP_MS;
    }
    if (frozen_ms > ms)
        frozen_ms = ms;
    struct api_key *k = budget_of(d, sb->key_id);
    uint64_t left = ms;
    while (left > 0) {
        uint64_t slice = left > METER_RESERVE_MS ? METER_RESERVE_MS : left;
        uint64_t most = (uint64_t)sb->cpus * slice * 1000;
        uint64_t used = cpu_used < most ? cpu_used : most;
        cpu_used -= used;
        uint64_t fz = frozen_ms < slice ? frozen_ms : slice;
        frozen_ms -= fz;
        uint64_t cpu = meter_billed_cpu(p, sb->cpus, slice, fz, used);
        uint64_t mem = (uint64_t)sb->memory_mib * slice;
        int64_t before = meter_price(p, sb->acc_cpu_usec, sb->acc_mem_mib_ms);
        sb->acc_cpu_usec += cpu;
        sb->acc_mem_mib_ms += mem;
        int64_t cost = meter_price(p, sb->acc_cpu_usec, sb->acc_mem_mib_ms) - before;
        if (cost > sb->reserved_micros)
            cost = sb->reserved_micros; /* never past a cap */
        left -= slice;
        int64_t wall = wall_at(d, now, now - left);
        int64_t day = wall / MS_PER_DAY;
        record(d, sb, wall, cost, cpu, mem);
        sb->cost_micros += cost;
        sb->reserved_micros -= cost;
        if (k) {
            roll(k, day);
            k->spent_micros += cost;
            k->reserved_micros -= cost;
        }
        if (!again)
            continue;
        enum room r = renew(sb, day, 1);
        if (r != ROOM_OK)
            return r;
    }
    return ROOM_OK;
}

/* Of the time since the last reading, how much sb was frozen (up to now, when it still is);
 * the open span is counted from now on. */
static uint64_t take_frozen(struct sandbox *sb, uint64_t now)
{
    if (sb->meter_frozen_at) {
        uint64_t from =
            sb->meter_frozen_at > sb->meter_at_ms ? sb->meter_frozen_at : sb->meter_at_ms;
        if (now > from)
            sb->meter_frozen_ms += now - from;
        sb->meter_frozen_at = now;
    }
    uint64_t fz = sb->meter_frozen_ms;
    sb->meter_frozen_ms = 0;
    return fz;
}

void meter_freeze(struct sandbox *sb)
{
    if (!sb->d->meter || !sb->metering || sb->meter_frozen_at)
        return;
    sb->meter_frozen_at = meter_clock(sb->d);
    if (!sb->meter_frozen_at)
        sb->meter_frozen_at = 1; /* a test clock at 0: still "frozen" */
}

void meter_thaw(struct sandbox *sb)
{
    if (!sb->d->meter || !sb->meter_frozen_at)
        return;
    uint64_t now = meter_clock(sb->d);
    uint64_t from = sb->meter_frozen_at > sb->meter_at_ms ? sb->meter_frozen_at : sb->meter_at_ms;
    if (now > from)
        sb->meter_frozen_ms += now - from;
    sb->meter_frozen_at = 0;
}

void meter_begin(struct sandbox *sb)
{
    if (!sb->d->meter)
        return;
    sb->metering = 1;
    sb->meter_frozen_at = 0;
    sb->meter_frozen_ms = 0;
    sb->meter_at_ms = meter_clock(sb->d);
    /* A new cgroup counts from zero: its boot's CPU is the first slice's. */
    sb->meter_cpu_usec = 0;
    sb->meter_cpu_known = 1;
}

void meter_end(struct sandbox *sb)
{
    struct daemon *d = sb->d;
    if (!d->meter)
        return;
    if (sb->metering) {
        /* The cgroup goes with the stop: the time since the last reading is charged at the
         * floor. */
        uint64_t now = meter_clock(d);
        uint64_t frozen = take_frozen(sb, now);
        if (now > sb->meter_at_ms)
            charge(sb, now, now - sb->meter_at_ms, frozen, 0, 0);
        sb->metering = 0;
        sb->meter_frozen_at = 0;
    }
    release(sb);
}

static void stop_done(struct sandbox *sb, int ok, const char *message, void *arg)
{
    if (!ok)
        log_error(sb->id, "meter.stop_failed", "error=\"%s\"", message);
}

static void stop_one(struct sandbox *sb, const char *why)
{
    if (sb->busy || sb->state != SB_RUNNING)
        return;
    log_info(sb->id, "meter.stopping", "why=%s cost=%lld key=%s", why, (long long)sb->cost_micros,
             sb->key_id);
    sandbox_stop(sb, why, stop_done, NULL);
}

/* A sandbox without room is stopped (files kept); at a key's daily limit, every running
 * sandbox of the key is. One with a driver operation in flight is left for the next tick (it
 * holds no reservation meanwhile, so it costs nothing). */
static void stop_for(struct sandbox *sb, enum room r)
{
    if (r == ROOM_CAP) {
        stop_one(sb, "cost_cap");
        return;
    }
    struct daemon *d = sb->d;
    char key[sizeof(sb->key_id)];
    snprintf(key, sizeof(key), "%s", sb->key_id);
    struct sandbox *next;
    for (struct sandbox *s = d->sandboxes; s; s = next) {
        next = s->next;
        if (strcmp(s->key_id, key) == 0)
            stop_one(s, "daily_limit");
    }
}

static void on_meter_stats(struct sandbox *sb, int rc, const struct driver_stats *st, void *arg)
{
    sb->meter_reading = 0;
    if (!sb->metering || sb->state != SB_RUNNING || rc < 0)
        return; /* stopped meanwhile (meter_end charged it), or the read failed: next tick */
    uint64_t now = meter_clock(sb->d);
    uint64_t used = 0;
    if (sb->meter_cpu_known)
        used =
            st->cpu_usec >= sb->meter_cpu_usec ? st->cpu_usec - sb->meter_cpu_usec : st->cpu_usec;
    sb->meter_cpu_usec = st->cpu_usec;
    sb->meter_cpu_known = 1;
    uint64_t ms = now > sb->meter_at_ms ? now - sb->meter_at_ms : 0;
    uint64_t frozen = take_frozen(sb, now);
    sb->meter_at_ms = now;
    enum room r = charge(sb, now, ms, frozen, used, 1);
    if (r != ROOM_OK)
        stop_for(sb, r);
}

void meter_tick(struct daemon *d)
{
    struct meter *m = d->meter;
    if (!m)
        return;
    uint64_t now = meter_clock(d);
    int64_t today = wall_at(d, now, now) / MS_PER_DAY;
    struct sandbox *next;
    for (struct sandbox *sb = d->sandboxes; sb; sb = next) {
        next = sb->next;
        if (sb->state != SB_RUNNING || sb->pooled)
            continue;
        if (!sb->metering) {
            /* Running when this daemon started (adopted): metered from now, its CPU from the
             * first reading. */
            meter_begin(sb);
            sb->meter_cpu_known = 0;
        }
        if (sb->reserved_micros == 0) {
            enum room r = renew(sb, today, 1);
            if (r != ROOM_OK) {
                stop_for(sb, r);
                continue;
            }
        }
        if (!sb->meter_reading && !sb->busy && now - sb->meter_at_ms >= METER_EVERY_MS) {
            sb->meter_reading = 1;
            sandbox_read_stats(sb, on_meter_stats, NULL);
        }
    }
    if (now - m->rolled_at >= METER_EVERY_MS) {
        m->rolled_at = now;
        for (struct api_key *k = d->keys ? keys_head(d->keys) : NULL; k; k = k->next)
            roll(k, today);
    }
    if (now - m->flushed_at >= FLUSH_EVERY_MS || m->n >= PENDING_MAX / 2) {
        m->flushed_at = now;
        flush(d);
    }
    if (now - m->compacted_at >= (uint64_t)COMPACT_EVERY_MS) {
        m->compacted_at = now;
        struct wr_err err = {0};
        int64_t before = (today - MINUTE_ROWS_DAYS) * 1440;
        if (store_usage_compact(d->store, before, &err) < 0)
            log_error(NULL, "meter.compact_failed", "error=\"%s\"", err.msg);
    }
}

/* ---- start: rebuilt from the ledger ---- */

static int load_sandbox_cost(void *arg, const char *group, const struct store_usage *u)
{
    struct sandbox *sb = sandbox_find(arg, group);
    if (sb)
        sb->cost_micros = u->cost_micros;
    return 0;
}

struct key_load {
    struct daemon *d;
    int64_t today;
};

static int load_key_spend(void *arg, const char *group, const struct store_usage *u)
{
    struct key_load *kl = arg;
    struct api_key *k = budget_of(kl->d, group);
    if (k) {
        k->spent_day = kl->today;
        k->spent_micros = u->cost_micros;
    }
    return 0;
}

int meter_open(struct daemon *d, struct wr_err *err)
{
    struct meter *m = xcalloc(1, sizeof(*m));
    m->rows = xcalloc(PENDING_MAX, sizeof(*m->rows));
    d->meter = m;
    uint64_t now = meter_clock(d);
    m->flushed_at = m->rolled_at = now;
    m->compacted_at = now - COMPACT_EVERY_MS; /* on the first tick */
    int64_t today = wall_at(d, now, now) / MS_PER_DAY;
    for (struct api_key *k = d->keys ? keys_head(d->keys) : NULL; k; k = k->next)
        roll(k, today);
    struct key_load kl = {d, today};
    if (store_usage_sum(d->store, STORE_USAGE_BY_SANDBOX, 0, INT64_MAX, NULL, NULL, INT32_MAX,
                        load_sandbox_cost, d, err) < 0 ||
        store_usage_sum(d->store, STORE_USAGE_BY_KEY, today * 1440, (today + 1) * 1440, NULL, NULL,
                        INT32_MAX, load_key_spend, &kl, err) < 0)
        return wr_err_prefix(err, "the usage ledger");
    return 0;
}

void meter_close(struct daemon *d)
{
    if (!d->meter)
        return;
    flush(d);
    free(d->meter->rows);
    free(d->meter);
    d->meter = NULL;
}

/* ---- GET /v1/usage ---- */

struct usage_answer {
    json_t *rows;
    enum store_usage_group g;
    int64_t total;
    int n;
};

static int usage_row(void *arg, const char *group, const struct store_usage *u)
{
    struct usage_answer *a = arg;
    json_t *row = json_object();
    if (a->g == STORE_USAGE_BY_DAY) {
        char day[32];
        format_rfc3339(u->minute * 60, day, sizeof(day));
        day[10] = '\0';
        json_object_set_new(row, "day", json_string(day));
    } else if (a->g == STORE_USAGE_BY_MINUTE) {
        char at[32];
        format_rfc3339(u->minute * 60, at, sizeof(at));
        json_object_set_new(row, "minute", json_string(at));
    } else {
        json_object_set_new(row, a->g == STORE_USAGE_BY_SANDBOX ? "sandbox_id" : "key_id",
                            group[0] ? json_string(group) : json_null());
    }
    json_object_set_new(row, "cost_micros", json_integer(u->cost_micros));
    json_object_set_new(row, "cpu_usec", json_integer(u->cpu_usec));
    json_object_set_new(row, "memory_mib_ms", json_integer(u->memory_mib_ms));
    json_array_append_new(a->rows, row);
    a->total += u->cost_micros;
    a->n++;
    return 0;
}

void svc_usage(struct daemon *d, int64_t from, int64_t to, const char *group_by,
               const char *sandbox_id, struct sink *s)
{
    struct usage_answer a = {.rows = json_array()};
    a.g = !strcmp(group_by, "key")      ? STORE_USAGE_BY_KEY
          : !strcmp(group_by, "day")    ? STORE_USAGE_BY_DAY
          : !strcmp(group_by, "minute") ? STORE_USAGE_BY_MINUTE
                                        : STORE_USAGE_BY_SANDBOX;
    /* The admin and auditor keys see everyone's; a key its owner's. */
    const char *only = s->who && !s->who->admin && !s->who->auditor ? s->who->owner_id : NULL;
    if (!s->who)
        only = "-"; /* no one: nothing */
    flush(d);
    struct wr_err err = {0};
    /* Minutes that overlap [from, to). */
    int64_t fm = from / 60, tm = to > from ? (to + 59) / 60 : fm;
    /* With sandbox_id, still only the caller's: another key's sandbox gives no rows, as an
     * unknown one does, so the answer says nothing about whose it is. */
    if (store_usage_sum(d->store, a.g, fm, tm, only, sandbox_id, USAGE_GROUPS_MAX + 1, usage_row,
                        &a, &err) < 0) {
        json_decref(a.rows);
        sink_fail(s, &err);
        return;
    }
    int truncated = a.n > USAGE_GROUPS_MAX;
    if (truncated) {
        json_t *last = json_array_get(a.rows, USAGE_GROUPS_MAX);
        a.total -= json_integer_value(json_object_get(last, "cost_micros"));
        json_array_remove(a.rows, USAGE_GROUPS_MAX);
    }
    char f[32], t[32];
    format_rfc3339(from, f, sizeof(f));
    format_rfc3339(to, t, sizeof(t));
    json_t *out =
        json_pack("{s:s, s:s, s:s, s:o, s:I, s:b}", "from", f, "to", t, "group_by", group_by,
                  "rows", a.rows, "total_micros", (json_int_t)a.total, "truncated", truncated);
    if (sandbox_id)
        json_object_set_new(out, "sandbox_id", json_string(sandbox_id));
    sink_reply(s, SINK_OK, out);
}
