/*
 * Structured logging: one line per event, "ts=... level=... event=... k=v ...",
 * to stderr. Callers quote values that may hold spaces (k="%s"). Every value a
 * conversion formats is escaped, since it may hold what a sandbox or a client
 * sent (a path, an agent's message): control characters as \n, \r, \t, \xNN (an
 * event never splits into two lines); `\` as \\; inside quotes `"` as \";
 * outside them a space, `=` and `"` as \x20, \x3d and \x22. So no value can end itself
 * early or write a field of its own.
 */
#ifndef WR_COMMON_LOG_H
#define WR_COMMON_LOG_H

#include <stdarg.h>
#include <stddef.h>

enum wr_log_level { WR_LOG_DEBUG, WR_LOG_INFO, WR_LOG_WARN, WR_LOG_ERROR };

/** Sets the minimum level printed (default INFO). */
void log_set_level(enum wr_log_level level);

/**
 * Limits the lines printed (the agent's, whose stderr is a host file a sandbox could make it
 * fill): a token bucket of `burst` lines refilled at `per_sec` lines a second. Lines past it
 * are dropped and counted; the next line printed is preceded by one "event=log.suppressed
 * lines=K", which counts as a line too. 0 (the default) = no limit.
 */
void log_set_rate(int burst, int per_sec);

/**
 * Logs one event. `sandbox` may be NULL. `fmt` formats extra "k=v" pairs and may be NULL.
 * Example: log_event(WR_LOG_INFO, sb->id, "sandbox.created", "image=%s", image);
 */
void log_event(enum wr_log_level level, const char *sandbox, const char *event, const char *fmt,
               ...) __attribute__((format(printf, 4, 5)));

/**
 * Formats fmt's pairs into buf[cap] as log_event does, each conversion's output escaped (see
 * above); cut short at a whole escape, a quoted value cut short still closed. Returns the
 * length written (buf is NUL-terminated when cap > 0).
 */
size_t log_format_pairs(char *buf, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

#define log_info(sb, ev, ...) log_event(WR_LOG_INFO, sb, ev, __VA_ARGS__)
#define log_warn(sb, ev, ...) log_event(WR_LOG_WARN, sb, ev, __VA_ARGS__)
#define log_error(sb, ev, ...) log_event(WR_LOG_ERROR, sb, ev, __VA_ARGS__)
#define log_debug(sb, ev, ...) log_event(WR_LOG_DEBUG, sb, ev, __VA_ARGS__)

#endif
