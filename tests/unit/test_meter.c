/*
 * The meter's arithmetic (daemon/meter.h): the seed's prices give its numbers exactly, in
 * integer micro-dollars; CPU is billed between the floor and every vCPU busy; a cap's
 * reservation is the most a sandbox can cost, never less; and the usage ledger adds up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/meter.h"
#include "store/store.h"
#include "tap.h"

#define HOUR_MS 3600000ULL
#define HOUR_US (HOUR_MS * 1000)

struct sums {
    int n;
    char group[4][64];
    struct store_usage u[4];
};

static int collect(void *arg, const char *group, const struct store_usage *u)
{
    struct sums *s = arg;
    if (s->n < 4) {
        snprintf(s->group[s->n], sizeof(s->group[0]), "%s", group);
        s->u[s->n] = *u;
    }
    s->n++;
    return 0;
}

int main(void)
{
    struct meter_prices p = {METER_DEFAULT_VCPU_HOUR, METER_DEFAULT_GIB_HOUR,
                             METER_DEFAULT_CPU_FLOOR};

    /* The seed: 2 vCPU / 4 GiB, an hour idle is $0.03125, an hour with both vCPUs busy $0.08. */
    uint64_t idle = meter_billed_cpu(&p, 2, HOUR_MS, 0, 1000000 /* 1 s of CPU in the hour */);
    ok(idle == 2 * HOUR_US * 25 / 1000, "idle CPU is billed at the floor, 2.5 %% of 2 vCPUs (%llu)",
       (unsigned long long)idle);
    int64_t c = meter_price(&p, idle, 4096 * HOUR_MS);
    ok(c == 31250, "a 2 vCPU / 4 GiB sandbox idle for an hour costs 31,250 (%lld)", (long long)c);
    uint64_t busy = meter_billed_cpu(&p, 2, HOUR_MS, 0, 2 * HOUR_US);
    c = meter_price(&p, busy, 4096 * HOUR_MS);
    ok(c == 80000, "with both vCPUs busy for the hour, 80,000 (%lld)", (long long)c);
    ok(meter_price(&p, HOUR_US, 0) == 25000, "a vCPU-hour is 25,000");
    ok(meter_price(&p, 0, 1024 * HOUR_MS) == 7500, "a GiB-hour is 7,500");
    ok(meter_billed_cpu(&p, 2, 1000, 0, 5000000) == 2000000,
       "CPU billed is at most every vCPU busy for the time");
    ok(meter_billed_cpu(&p, 1, 1000, 0, 300000) == 300000, "between the two, what was measured");

    /* Rounding down, never up; whole sums priced once. */
    ok(meter_price(&p, 1, 1) == 0, "a microsecond and a MiB-ms cost nothing (rounded down)");
    ok(meter_price(&p, 144000, 0) == 1, "144 ms of CPU is one micro-dollar");
    /* A year of a 64 vCPU, 64 GiB sandbox: no overflow. */
    uint64_t year = 365 * 24 * HOUR_MS;
    c = meter_price(&p, 64 * year * 1000, 65536 * year);
    ok(c == 365LL * 24 * (64 * 25000 + 64 * 7500), "a year of a big sandbox prices exactly (%lld)",
       (long long)c);

    /* The reservation is the most the time can cost, at least. */
    int64_t r = meter_max_cost(&p, 2, 4096, METER_RESERVE_MS);
    ok(r >= meter_price(&p, 2 * METER_RESERVE_MS * 1000, 4096 * METER_RESERVE_MS) && r > 0,
       "a reservation covers %d ms of every vCPU busy (%lld)", METER_RESERVE_MS, (long long)r);

    /* Other prices. */
    struct meter_prices q = {100000, 0, 0};
    ok(meter_billed_cpu(&q, 4, 1000, 0, 0) == 0 && meter_price(&q, HOUR_US / 2, 12345) == 50000,
       "prices come from the config (no floor, memory free)");

    /* The ledger: rows add up per (sandbox, minute), and sum by group within a range. */
    char dir[] = "/tmp/wr-test-meter-XXXXXX";
    ok(mkdtemp(dir) != NULL, "temp dir");
    char db[128];
    snprintf(db, sizeof(db), "%s/db", dir);
    struct wr_err err = {0};
    struct store *st = store_open(db, &err);
    ok(st != NULL, "store_open (%s)", err.msg);
    struct store_usage rows[] = {
        {"sb-a", "key_x", 100, 10, 1000, 5000},
        {"sb-a", "key_x", 100, 5, 500, 2500}, /* the same minute: added */
        {"sb-a", "key_x", 1440 + 1, 7, 0, 0}, /* the next day */
        {"sb-b", "", 101, 3, 0, 0},           /* the admin's */
    };
    ok(store_usage_add(st, rows, 4, &err) == 0, "rows recorded (%s)", err.msg);
    struct sums s = {0};
    ok(store_usage_sum(st, STORE_USAGE_BY_SANDBOX, 0, 1440, NULL, NULL, 100, collect, &s, &err) ==
               0 &&
           s.n == 2 && !strcmp(s.group[0], "sb-a") && s.u[0].cost_micros == 15 &&
           s.u[0].cpu_usec == 1500 && s.u[0].memory_mib_ms == 7500 && s.u[1].cost_micros == 3,
       "by sandbox on day 0: sb-a 15, sb-b 3 (%d groups)", s.n);
    memset(&s, 0, sizeof(s));
    ok(store_usage_sum(st, STORE_USAGE_BY_DAY, 0, 3 * 1440, "key_x", NULL, 100, collect, &s,
                       &err) == 0 &&
           s.n == 2 && s.u[0].minute == 0 && s.u[0].cost_micros == 15 && s.u[1].minute == 1440 &&
           s.u[1].cost_micros == 7,
       "by day, one key's only: 15 then 7");
    memset(&s, 0, sizeof(s));
    ok(store_usage_sum(st, STORE_USAGE_BY_KEY, 0, 3 * 1440, NULL, NULL, 1, collect, &s, &err) ==
               0 &&
           s.n == 1 && s.group[0][0] == '\0' && s.u[0].cost_micros == 3,
       "by key, at most `limit` groups (the admin's first: \"\")");
    memset(&s, 0, sizeof(s));
    ok(store_usage_sum(st, STORE_USAGE_BY_MINUTE, 0, 3 * 1440, NULL, "sb-a", 100, collect, &s,
                       &err) == 0 &&
           s.n == 2 && s.u[0].minute == 100 && s.u[0].cost_micros == 15 && s.u[1].minute == 1441 &&
           s.u[1].cost_micros == 7,
       "by minute, one sandbox's only: 15 at minute 100, 7 at 1441 (%d groups)", s.n);
    memset(&s, 0, sizeof(s));
    ok(store_usage_sum(st, STORE_USAGE_BY_MINUTE, 0, 3 * 1440, "key_x", "sb-b", 100, collect, &s,
                       &err) == 0 &&
           s.n == 0,
       "one sandbox of another key's: nothing");
    /* Compacting folds the days before the cutoff's into one row per sandbox per day. */
    ok(store_usage_compact(st, 2 * 1440 + 5, &err) == 0, "compacted (%s)", err.msg);
    memset(&s, 0, sizeof(s));
    ok(store_usage_sum(st, STORE_USAGE_BY_SANDBOX, 0, 3 * 1440, NULL, NULL, 100, collect, &s,
                       &err) == 0 &&
           s.n == 2 && s.u[0].cost_micros == 22 && s.u[0].cpu_usec == 1500 &&
           s.u[0].memory_mib_ms == 7500 && s.u[1].cost_micros == 3,
       "the sums are the same after compacting");
    memset(&s, 0, sizeof(s));
    ok(store_usage_sum(st, STORE_USAGE_BY_SANDBOX, 1, 1440, NULL, NULL, 100, collect, &s, &err) ==
               0 &&
           s.n == 0,
       "day 0's minutes are now its first minute's row");
    ok(store_usage_compact(st, 2 * 1440 + 5, &err) == 0, "compacting again is harmless");
    memset(&s, 0, sizeof(s));
    ok(store_usage_sum(st, STORE_USAGE_BY_DAY, 0, 3 * 1440, NULL, NULL, 100, collect, &s, &err) ==
               0 &&
           s.n == 2 && s.u[0].cost_micros == 18 && s.u[1].cost_micros == 7,
       "by day: still 18 then 7");
    store_close(st);
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ok(system(cmd) == 0, "cleaned up");
    return tap_done();
}
