/* One log line per event; see log.h. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <sys/types.h>
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

/* ---- formatting the pairs: values escaped, so no input makes a field of its own ---- */

struct out {
    char *p;
    size_t cap, n;
    int full;
};

/* Appends s[0..len) whole, or nothing (and the buffer counts as full): an escape is never cut
 * in two. One byte is kept back for a closing quote. */
static void put(struct out *o, const char *s, size_t len)
{
    if (o->full || o->n + len + 2 > o->cap) {
        o->full = 1;
        return;
    }
    memcpy(o->p + o->n, s, len);
    o->n += len;
}

/*
 * Appends a formatted value. `\` is escaped, and inside quotes `"` too; outside them a space,
 * `=` and `"` are written as \xNN (a value there ends at a space, and a quote would start a
 * quoted one); control characters are escaped everywhere. So
 * a value can neither end itself early nor start a field, whatever it holds.
 */
static void put_value(struct out *o, const char *v, int quoted)
{
    for (const unsigned char *c = (const unsigned char *)v; *c; c++) {
        char e[8];
        if ((*c == '"' && quoted) || *c == '\\')
            snprintf(e, sizeof(e), "\\%c", *c);
        else if (*c == '\n')
            snprintf(e, sizeof(e), "\\n");
        else if (*c == '\r')
            snprintf(e, sizeof(e), "\\r");
        else if (*c == '\t')
            snprintf(e, sizeof(e), "\\t");
        else if (*c < 0x20 || *c == 0x7f || (!quoted && (*c == ' ' || *c == '=' || *c == '"')))
            snprintf(e, sizeof(e), "\\x%02x", *c);
        else {
            put(o, (const char *)c, 1);
            continue;
        }
        put(o, e, strlen(e));
    }
}

/* The length modifier of a conversion, read at *f (which it moves past). */
enum len_mod { L_NONE, L_HH, L_H, L_L, L_LL, L_Z, L_J, L_T, L_BIG_L };

static enum len_mod read_len(const char **f)
{
    const char *s = *f;
    enum len_mod m = L_NONE;
    if (s[0] == 'h' && s[1] == 'h')
        m = L_HH, s += 2;
    else if (s[0] == 'l' && s[1] == 'l')
        m = L_LL, s += 2;
    else if (*s == 'h')
        m = L_H, s++;
    else if (*s == 'l')
        m = L_L, s++;
    else if (*s == 'z')
        m = L_Z, s++;
    else if (*s == 'j')
        m = L_J, s++;
    else if (*s == 't')
        m = L_T, s++;
    else if (*s == 'L')
        m = L_BIG_L, s++;
    *f = s;
    return m;
}

/* snprintf of one conversion with its `*` arguments (stars of them, 0 to 2) before the value. */
#define ONE(out, cap, spec, stars, star, value)                                                    \
    ((stars) == 0   ? snprintf(out, cap, spec, value)                                              \
     : (stars) == 1 ? snprintf(out, cap, spec, star[0], value)                                     \
                    : snprintf(out, cap, spec, star[0], star[1], value))

/* Formats the conversion spec (one, "%...c") taking its arguments from ap, into v. */
static void format_one(char *v, size_t cap, const char *spec, char conv, enum len_mod m, int stars,
                       const int *star, va_list *ap)
{
    switch (conv) {
    case 'd':
    case 'i':
        if (m == L_LL)
            ONE(v, cap, spec, stars, star, va_arg(*ap, long long));
        else if (m == L_L)
            ONE(v, cap, spec, stars, star, va_arg(*ap, long));
        else if (m == L_Z)
            ONE(v, cap, spec, stars, star, va_arg(*ap, ssize_t));
        else if (m == L_J)
            ONE(v, cap, spec, stars, star, va_arg(*ap, intmax_t));
        else if (m == L_T)
            ONE(v, cap, spec, stars, star, va_arg(*ap, ptrdiff_t));
        else
            ONE(v, cap, spec, stars, star, va_arg(*ap, int));
        break;
    case 'u':
    case 'x':
    case 'X':
    case 'o':
        if (m == L_LL)
            ONE(v, cap, spec, stars, star, va_arg(*ap, unsigned long long));
        else if (m == L_L)
            ONE(v, cap, spec, stars, star, va_arg(*ap, unsigned long));
        else if (m == L_Z)
            ONE(v, cap, spec, stars, star, va_arg(*ap, size_t));
        else if (m == L_J)
            ONE(v, cap, spec, stars, star, va_arg(*ap, uintmax_t));
        else if (m == L_T)
            ONE(v, cap, spec, stars, star, va_arg(*ap, ptrdiff_t));
        else
            ONE(v, cap, spec, stars, star, va_arg(*ap, unsigned int));
        break;
    case 'c': ONE(v, cap, spec, stars, star, va_arg(*ap, int)); break;
    case 'p': ONE(v, cap, spec, stars, star, va_arg(*ap, void *)); break;
    case 's': {
        const char *s = va_arg(*ap, const char *);
        ONE(v, cap, spec, stars, star, s ? s : "(null)");
        break;
    }
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G':
    case 'a':
    case 'A':
        if (m == L_BIG_L)
            ONE(v, cap, spec, stars, star, va_arg(*ap, long double));
        else
            ONE(v, cap, spec, stars, star, va_arg(*ap, double));
        break;
    default: v[0] = '\0'; /* %n and the unknown: nothing is written, nothing taken */
    }
}

size_t log_format_pairs(char *buf, size_t cap, const char *fmt, va_list ap)
{
    struct out o = {.p = buf, .cap = cap};
    int quoted = 0;
    va_list aq;
    va_copy(aq, ap);
    for (const char *f = fmt; *f && !o.full;) {
        if (*f != '%' || f[1] == '%') {
            /* The format's own text (the code's): its quotes open and close values. */
            char c[2] = {*f, '\0'};
            if (*f == '"') {
                quoted = !quoted;
                put(&o, c, 1);
            } else {
                put_value(&o, c, 1);
            }
            f += *f == '%' ? 2 : 1;
            continue;
        }
        const char *start = f++;
        int stars = 0, star[2] = {0, 0};
        f += strspn(f, "-+ #0'");
        if (*f == '*')
            star[stars++] = va_arg(aq, int), f++;
        else
            f += strspn(f, "0123456789");
        if (*f == '.') {
            f++;
            if (*f == '*')
                star[stars++] = va_arg(aq, int), f++;
            else
                f += strspn(f, "0123456789");
        }
        enum len_mod m = read_len(&f);
        char conv = *f ? *f++ : '\0';
        char spec[32];
        snprintf(spec, sizeof(spec), "%.*s", (int)(f - start), start);
        char v[1024];
        format_one(v, sizeof(v), spec, conv, m, stars, star, &aq);
        put_value(&o, v, quoted);
    }
    va_end(aq);
    if (quoted && cap) /* cut short inside a value: it is closed all the same (put kept room) */
        buf[o.n++] = '"';
    if (cap)
        buf[o.n] = '\0';
    return o.n;
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

    char safe[4096] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        log_format_pairs(safe, sizeof(safe), fmt, ap);
        va_end(ap);
    }
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
    char sb[256] = ""; /* a sandbox's id is the daemon's, but escaped as any value all the same */
    if (sandbox) {
        struct out so = {.p = sb, .cap = sizeof(sb)};
        put_value(&so, sandbox, 0);
        sb[so.n] = '\0';
    }
    static char line[sizeof(safe) + sizeof(sb) + 512];
    int n = snprintf(line, sizeof(line), "ts=%s.%03dZ level=%s event=%s%s%s%s%s\n", ts,
                     (int)(tv.tv_usec / 1000), level_name(level), event, sandbox ? " sandbox=" : "",
                     sb, safe[0] ? " " : "", safe);
    if (n >= (int)sizeof(line)) {
        line[sizeof(line) - 2] = '\n';
        n = (int)sizeof(line) - 1;
    }
    if (n > 0)
        fwrite(line, 1, (size_t)n, stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
}
