/*
 * Structured logging: one line per event, "ts=... level=... event=... k=v ...",
 * to stderr. Callers quote values that may hold spaces (k="%s"); control
 * characters in the pairs (a newline from a sandbox's message) are written as
 * escapes (\n, \r, \xNN), so an event never splits into two lines.
 */
#ifndef WR_COMMON_LOG_H
#define WR_COMMON_LOG_H

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

#define log_info(sb, ev, ...) log_event(WR_LOG_INFO, sb, ev, __VA_ARGS__)
#define log_warn(sb, ev, ...) log_event(WR_LOG_WARN, sb, ev, __VA_ARGS__)
#define log_error(sb, ev, ...) log_event(WR_LOG_ERROR, sb, ev, __VA_ARGS__)
#define log_debug(sb, ev, ...) log_event(WR_LOG_DEBUG, sb, ev, __VA_ARGS__)

#endif
