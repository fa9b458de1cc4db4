/*
 * Prometheus metrics (daemon/metrics.h): histogram buckets are cumulative and end in +Inf,
 * labels come from fixed sets whatever string a caller passes (a hostile reason becomes
 * "other"), and a daemon with nothing in it renders every family once.
 */
#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "tap.h"

static char *render(struct daemon *d)
{
    struct evbuffer *b = evbuffer_new();
    metrics_render(d, b);
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = 0;
    evbuffer_free(b);
    return s;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

int main(void)
{
    struct daemon d;
    memset(&d, 0, sizeof(d));
    metrics_reset();

    metrics_observe_us(MH_EXEC, 3000);          /* <= 5 ms */
    metrics_observe_us(MH_EXEC, 5000);          /* <= 5 ms: bounds are inclusive */
    metrics_observe_us(MH_EXEC, 7000);          /* <= 10 ms */
    metrics_observe_us(MH_EXEC, 9000000000ull); /* past every bound */
    metrics_add(MC_EXECS, 4);
    metrics_failed("oom");
    metrics_failed("oom");
    metrics_failed("sb-\"}\n{injected");
    metrics_failed(NULL);
    metrics_denied("dns", "not_allowed");
    metrics_denied("proxy", "x\"} 1\nevil_metric 9");
    metrics_add(MC_FILES_READ_BYTES, 123);

    char *s = render(&d);
    ok(strstr(s, "withruntime_exec_duration_seconds_bucket{le=\"0.005000\"} 2\n") != NULL,
       "two observations at or under 5 ms");
    ok(strstr(s, "withruntime_exec_duration_seconds_bucket{le=\"0.010000\"} 3\n") != NULL,
       "buckets are cumulative");
    ok(strstr(s, "withruntime_exec_duration_seconds_bucket{le=\"60.000000\"} 3\n") != NULL,
       "the largest finite bucket leaves out the 9000 s one");
    ok(strstr(s, "withruntime_exec_duration_seconds_bucket{le=\"+Inf\"} 4\n") != NULL,
       "+Inf holds everything");
    ok(strstr(s, "withruntime_exec_duration_seconds_count 4\n") != NULL, "count = +Inf");
    ok(strstr(s, "withruntime_exec_duration_seconds_sum 9000.015000\n") != NULL, "sum in seconds");
    ok(strstr(s, "withruntime_execs_total 4\n") != NULL, "a counter");
    ok(strstr(s, "withruntime_sandbox_failures_total{reason=\"oom\"} 2\n") != NULL,
       "failures by a known reason");
    ok(strstr(s, "withruntime_sandbox_failures_total{reason=\"other\"} 2\n") != NULL,
       "an unknown reason (or none) counts as other");
    ok(strstr(s, "withruntime_egress_denials_total{via=\"dns\",reason=\"not_allowed\"} 1\n") !=
           NULL,
       "a denial by path and reason");
    ok(strstr(s, "withruntime_egress_denials_total{via=\"proxy\",reason=\"other\"} 1\n") != NULL,
       "a hostile reason is other");
    ok(!strstr(s, "injected") && !strstr(s, "evil_metric"), "no caller's string reaches the text");
    ok(strstr(s, "withruntime_files_bytes_total{direction=\"read\"} 123\n") != NULL, "bytes read");
    ok(strstr(s, "withruntime_sandboxes{state=\"running\"} 0\n") != NULL,
       "an empty daemon: zero running");
    ok(count(s, "# TYPE ") == count(s, "# HELP "), "each family has its HELP and TYPE");
    ok(count(s, "# TYPE withruntime_sandboxes gauge\n") == 1, "once each");
    ok(strstr(s, "process_resident_memory_bytes ") != NULL, "the daemon's memory");
    ok(s[strlen(s) - 1] == '\n', "ends in a newline");
    free(s);

    metrics_reset();
    s = render(&d);
    ok(strstr(s, "withruntime_execs_total 0\n") != NULL, "reset");
    free(s);
    return tap_done();
}
