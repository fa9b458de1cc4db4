/* One log line per event; see log.h. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

static enum wr_log_level min_level = WR_LOG_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* The rate limit (log_set_rate), under log_lock. */
static int rate_burst, rate_per_sec;
static double rate_tokens;
static struct timespec rate_last;
static unsigned long long rate_dropped;

void log_set_rate(int burst, int per_sec)
{
    pthread_mutex_lock(&log_lock);
    rate_burst = burst > 0 && per_sec > 0 ? burst : 0;
    rate_per_sec = per_sec;
    rate_tokens = rate_burst;
    clock_gettime(CLOCK_MONOTONIC, &rate_last);
    rate_dropped = 0;
    pthread_mutex_unlock(&log_lock);
}

/* Under log_lock: takes a token for one line, or counts it dropped. Returns 1 to print. */
static int rate_take(void)
{
    if (!rate_burst)
        return 1;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double dt =
        (double)(now.tv_sec - rate_last.tv_sec) + (double)(now.tv_nsec - rate_last.tv_nsec) / 1e9;
    rate_last = now;
    if (dt > 0)
        rate_tokens += dt * rate_per_sec;
    if (rate_tokens > rate_burst)
        rate_tokens = rate_burst;
    if (rate_tokens < 1) {
        rate_dropped++;
        return 0;
    }
    /* The summary of what was dropped is a line too: it takes a token of its own (owed, if
     * need be), so the lines written never outrun the rate. */
    rate_tokens -= rate_dropped ? 2 : 1;
    return 1;
}

void log_set_level(enum wr_log_level level)
{
    min_level = level;
}

static const char *level_name(enum wr_log_level l)
{
    switch (l) {
    case WR_LOG_DEBUG: return "debug";
    case WR_LOG_INFO: return "info";
    case WR_LOG_WARN: return "warn";
    default: return "error";
    }
}

void log_event(enum wr_log_level level, const char *sandbox, const char *event, const char *fmt,
               ...)
{
    if (level < min_level)
        return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    time_t t = tv.tv_sec;
    gmtime_r(&t, &tm);
    char ts[32];
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);

    char extra[1024] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(extra, sizeof(extra), fmt, ap);
        va_end(ap);
    }
    /* Values may hold what a sandbox sent (messages, paths): a control character is written
     * as an escape, so one event is always one line. */
    char safe[sizeof(extra) * 4];
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)extra; *p && o + 5 < sizeof(safe); p++) {
        if (*p == '\n')
            o += (size_t)snprintf(safe + o, sizeof(safe) - o, "\\n");
        else if (*p == '\r')
            o += (size_t)snprintf(safe + o, sizeof(safe) - o, "\\r");
        else if (*p < 0x20 || *p == 0x7f)
            o += (size_t)snprintf(safe + o, sizeof(safe) - o, "\\x%02x", *p);
        else
            safe[o++] = (char)*p;
    }
    safe[o] = '\0';
    pthread_mutex_lock(&log_lock);
    if (!rate_take()) {
        pthread_mutex_unlock(&log_lock);
        return;
    }
    if (rate_dropped) {
        fprintf(stderr, "ts=%s.%03dZ level=warn event=log.suppressed lines=%llu\n", ts,
                (int)(tv.tv_usec / 1000), rate_dropped);
        rate_dropped = 0;
    }
    /* One write per line (stderr is unbuffered: piece by piece it was four), so lines from
     * two processes sharing a file never interleave either. */
    static char line[sizeof(safe) + 512];
    int n = snprintf(line, sizeof(line), "ts=%s.%03dZ level=%s event=%s%s%s%s%s\n", ts,
                     (int)(tv.tv_usec / 1000), level_name(level), event, sandbox ? " sandbox=" : "",
                     sandbox ? sandbox : "", safe[0] ? " " : "", safe);
    if (n >= (int)sizeof(line)) {
        line[sizeof(line) - 2] = '\n';
        n = (int)sizeof(line) - 1;
    }
    if (n > 0)
        fwrite(line, 1, (size_t)n, stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
}
