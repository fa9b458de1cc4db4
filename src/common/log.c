/* One log line per event; see log.h. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

static enum wr_log_level min_level = WR_LOG_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

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
    fprintf(stderr, "ts=%s.%03dZ level=%s event=%s", ts, (int)(tv.tv_usec / 1000),
            level_name(level), event);
    if (sandbox)
        fprintf(stderr, " sandbox=%s", sandbox);
    if (safe[0])
        fprintf(stderr, " %s", safe);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
}
