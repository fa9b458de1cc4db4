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
