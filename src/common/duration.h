/*
 * Durations as people write them on a command line: "90" or "90s", "15m", "12h", "7d".
 */
#ifndef WR_COMMON_DURATION_H
#define WR_COMMON_DURATION_H

#include <stdint.h>

/** The longest duration accepted: 100 years, in seconds. */
#define DURATION_MAX_SECONDS ((int64_t)100 * 365 * 86400)

/**
 * Parses s (digits, then optionally one of s, m, h, d) into seconds. Returns 0, or -1 if s is
 * not such a duration or is longer than DURATION_MAX_SECONDS.
 */
int duration_parse(const char *s, int64_t *seconds);

#endif
