/*
 * Prometheus metrics (daemon/metrics.h). Names follow the Prometheus conventions: a
 * `withruntime_` prefix, base units (seconds, bytes), `_total` on counters, the standard
 * `process_*` names for the daemon process itself.
 */
#include "daemon/metrics.h"

#include <dirent.h>
#include <event2/buffer.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/keys.h"
#include "daemon/meter.h"
#include "daemon/pool.h"
#include "daemon/sandbox.h"
#include "net/gateway.h"

/* Upper bounds of the latency buckets, in microseconds (then +Inf). */
static const uint64_t bucket_us[] = {5000,    10000,   25000,   50000,    100000,   250000,  500000,
                                     1000000, 2500000, 5000000, 10000000, 30000000, 60000000};
#define NBUCKETS (sizeof(bucket_us) / sizeof(bucket_us[0]))

/* The gateway's denial reasons (src/net: proxy.c, resolver.c, netpolicy.c); others count as
 * "other". */
static const char *const denial_reasons[] = {"no_internet",
                                             "denied",
                                             "not_allowed",
                                             "not_a_name",
                                             "address",
                                             "private_address",
                                             "connect",
                                             "host_mismatch",
                                             "host_changed",
                                             "port_mismatch",
                                             "unknown_client",
                                             "protocol",
                                             "no_sni",
                                             "malformed",
                                             "timeout",
                                             "no_original_dst",
                                             "too_many_connections",
                                             "fair_share",
                                             "policy_changed",
                                             "connect_failed",
                                             "busy",
                                             "upstream_tls",
                                             "tls_handshake",
                                             "alpn",
                                             "upgrade",
                                             "upstream_answer",
                                             "handshake_rate",
                                             "no_address",
                                             "upstream_error",
                                             "bad_name",
                                             "nxdomain",
                                             "other"};
#define NDENIAL (sizeof(denial_reasons) / sizeof(denial_reasons[0]))
#define NREASON_MAX 32

static struct {
    uint64_t counter[MC_COUNTERS];
    uint64_t bucket[MH_COUNT][NBUCKETS + 1]; /* the last: above every bound */
    uint64_t sum_us[MH_COUNT];
    uint64_t failed[NREASON_MAX + 1]; /* by sandbox_reason_names; the last: other */
    uint64_t denied[2][NDENIAL];      /* [0] proxy, [1] dns */
} m;

static void bump(uint64_t *p, uint64_t n)
{
    __atomic_fetch_add(p, n, __ATOMIC_RELAXED);
}

static uint64_t get(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

void metrics_add(enum metric_counter c, uint64_t n)
{
    if ((unsigned)c < MC_COUNTERS)
        bump(&m.counter[c], n);
}

void metrics_observe_us(enum metric_hist h, uint64_t us)
{
    if ((unsigned)h >= MH_COUNT)
        return;
    size_t i = 0;
    while (i < NBUCKETS && us > bucket_us[i])
        i++;
    bump(&m.bucket[h][i], 1);
    bump(&m.sum_us[h], us);
}

void metrics_failed(const char *reason)
{
    size_t i = 0;
    for (; i < NREASON_MAX && sandbox_reason_names[i]; i++)
        if (reason && strcmp(reason, sandbox_reason_names[i]) == 0)
            break;
    if (i >= NREASON_MAX || !sandbox_reason_names[i])
        i = NREASON_MAX;
    bump(&m.failed[i], 1);
}

void metrics_denied(const char *via, const char *reason)
{
    int v = via && strcmp(via, "dns") == 0;
    size_t i = 0;
    while (i < NDENIAL - 1 && !(reason && strcmp(reason, denial_reasons[i]) == 0))
        i++;
    bump(&m.denied[v][i], 1);
}

void metrics_reset(void)
{
    memset(&m, 0, sizeof(m));
}

/* ---- the exposition ---- */

static void head(struct evbuffer *out, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(struct evbuffer *out, const char *name, const char *labels, uint64_t v)
{
    evbuffer_add_printf(out, "%s%s%s%s %llu\n", name, labels ? "{" : "", labels ? labels : "",
                        labels ? "}" : "", (unsigned long long)v);
}

static void one(struct evbuffer *out, const char *name, const char *type, const char *help,
                uint64_t v)
{
    head(out, name, type, help);
    sample(out, name, NULL, v);
}

static void seconds(struct evbuffer *out, uint64_t us)
{
    evbuffer_add_printf(out, "%llu.%06llu", (unsigned long long)(us / 1000000),
                        (unsigned long long)(us % 1000000));
}

static void histogram(struct evbuffer *out, enum metric_hist h, const char *name, const char *help)
{
    head(out, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i <= NBUCKETS; i++) {
        cum += get(&m.bucket[h][i]);
        evbuffer_add_printf(out, "%s_bucket{le=\"", name);
        if (i < NBUCKETS)
            seconds(out, bucket_us[i]);
        else
            evbuffer_add(out, "+Inf", 4);
        evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)cum);
    }
    evbuffer_add_printf(out, "%s_sum ", name);
    seconds(out, get(&m.sum_us[h]));
    evbuffer_add_printf(out, "\n%s_count %llu\n", name, (unsigned long long)cum);
}

/* The daemon process: resident memory, open fds, CPU, start time. */
static void process_metrics(struct evbuffer *out)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "re");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    one(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
        (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE));
    uint64_t fds = 0;
    DIR *dir = opendir("/proc/self/fd");
    if (dir) {
        for (struct dirent *e; (e = readdir(dir));)
            fds += e->d_name[0] != '.';
        closedir(dir);
        fds--; /* the directory's own */
    }
    one(out, "process_open_fds", "gauge", "Number of open file descriptors.", fds);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        one(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
            (uint64_t)rl.rlim_cur);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        uint64_t us = (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 +
                      (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
        head(out, "process_cpu_seconds_total", "counter",
             "Total user and system CPU time "
             "spent in seconds.");
        evbuffer_add_printf(out, "process_cpu_seconds_total ");
        seconds(out, us);
        evbuffer_add(out, "\n", 1);
    }
}

void metrics_render(struct daemon *d, struct evbuffer *out)
{
    /* Gauges read now. */
    uint64_t by_state[16] = {0};
    uint64_t frozen = 0, pooled = 0, ready = 0;
    size_t nstates = 0;
    while (sandbox_state_names[nstates] && nstates < 16)
        nstates++;
    for (struct sandbox *sb = d->sandboxes; sb; sb = sb->next) {
        if (sb->pooled) {
            pooled++;
            ready += pool_ready(sb) != 0;
            continue;
        }
        if ((size_t)sb->state < nstates)
            by_state[sb->state]++;
        frozen += sb->frozen != 0;
    }
    head(out, "withruntime_sandboxes", "gauge",
         "Sandboxes the daemon keeps, by state (warm pool entries not included).");
    char lab[96];
    for (size_t i = 0; i < nstates; i++) {
        snprintf(lab, sizeof(lab), "state=\"%s\"", sandbox_state_names[i]);
        sample(out, "withruntime_sandboxes", lab, by_state[i]);
    }
    one(out, "withruntime_sandboxes_frozen", "gauge",
        "Running sandboxes frozen for being idle (they use no CPU).", frozen);
    one(out, "withruntime_pool_size", "gauge", "Warm pool entries wanted (serve --pool).",
        (uint64_t)(d->cfg.pool_size > 0 ? d->cfg.pool_size : 0));
    one(out, "withruntime_pool_entries", "gauge", "Warm pool entries kept now, ready or starting.",
        pooled);
    one(out, "withruntime_pool_ready", "gauge", "Warm pool entries ready to be claimed.", ready);

    head(out, "withruntime_sandbox_creates_total", "counter",
         "Sandbox creates, by result: created, failed (after admission), refused (before).");
    sample(out, "withruntime_sandbox_creates_total", "result=\"created\"",
           get(&m.counter[MC_CREATES_OK]));
    sample(out, "withruntime_sandbox_creates_total", "result=\"failed\"",
           get(&m.counter[MC_CREATES_FAILED]));
    sample(out, "withruntime_sandbox_creates_total", "result=\"refused\"",
           get(&m.counter[MC_CREATES_REFUSED]));
    one(out, "withruntime_sandbox_deletes_total", "counter", "Sandboxes deleted.",
        get(&m.counter[MC_DELETES]));
    head(out, "withruntime_sandbox_failures_total", "counter",
         "Sandboxes that became failed, by reason.");
    for (size_t i = 0; i < NREASON_MAX && sandbox_reason_names[i]; i++) {
        snprintf(lab, sizeof(lab), "reason=\"%s\"", sandbox_reason_names[i]);
        sample(out, "withruntime_sandbox_failures_total", lab, get(&m.failed[i]));
    }
    sample(out, "withruntime_sandbox_failures_total", "reason=\"other\"",
           get(&m.failed[NREASON_MAX]));
    histogram(out, MH_CREATE, "withruntime_sandbox_create_duration_seconds",
              "Time from a create request to its answer, for creates that succeeded.");
    one(out, "withruntime_execs_total", "counter", "Foreground commands that ended.",
        get(&m.counter[MC_EXECS]));
    histogram(out, MH_EXEC, "withruntime_exec_duration_seconds",
              "Time from an exec request to its command's answer (foreground commands).");

    head(out, "withruntime_files_bytes_total", "counter",
         "Bytes through the files API: read (to callers) and written (from callers).");
    sample(out, "withruntime_files_bytes_total", "direction=\"read\"",
           get(&m.counter[MC_FILES_READ_BYTES]));
    sample(out, "withruntime_files_bytes_total", "direction=\"write\"",
           get(&m.counter[MC_FILES_WRITE_BYTES]));

    struct gateway_stats gs;
    gateway_stats(d->gw, &gs);
    head(out, "withruntime_proxy_bytes_total", "counter",
         "Bytes through the egress proxy: up (sandboxes to the internet) and down.");
    sample(out, "withruntime_proxy_bytes_total", "direction=\"up\"", gs.proxy_bytes_up);
    sample(out, "withruntime_proxy_bytes_total", "direction=\"down\"", gs.proxy_bytes_down);
    one(out, "withruntime_proxy_connections_total", "counter",
        "Connections the egress proxy accepted (refused ones included).", gs.proxy_connections);
    one(out, "withruntime_egress_restarts_total", "counter",
        "Times the egress process (proxy, resolvers) and its signer were started again.",
        gs.egress_restarts);
    head(out, "withruntime_egress_denials_total", "counter",
         "What sandboxes were refused on the network, by path (proxy, dns) and reason.");
    for (int v = 0; v < 2; v++)
        for (size_t i = 0; i < NDENIAL; i++) {
            uint64_t n = get(&m.denied[v][i]);
            if (!n && strcmp(denial_reasons[i], "not_allowed") != 0)
                continue; /* every series that ever moved, and the common one always */
            snprintf(lab, sizeof(lab), "via=\"%s\",reason=\"%s\"", v ? "dns" : "proxy",
                     denial_reasons[i]);
            sample(out, "withruntime_egress_denials_total", lab, n);
        }

    head(out, "withruntime_key_spend_today_micros", "gauge",
         "What each key's sandboxes were charged today (UTC), in micro-dollars.");
    for (struct api_key *k = d->keys ? keys_head(d->keys) : NULL; k; k = k->next) {
        if (k->revoked_at || strcmp(k->owner_id, k->id) != 0)
            continue; /* spend is its owner's */
        snprintf(lab, sizeof(lab), "key_id=\"%s\"", k->id);
        int64_t v = meter_key_spent_today(d, k->id);
        sample(out, "withruntime_key_spend_today_micros", lab, v > 0 ? (uint64_t)v : 0);
    }
    process_metrics(out);
}
