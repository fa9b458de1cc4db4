/* Durations (duration.h). */
#include "common/duration.h"

#include <string.h>

int duration_parse(const char *s, int64_t *seconds)
{
    int64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > DURATION_MAX_SECONDS)
            return -1;
    }
    int64_t unit = 1;
    if (*p) {
        static const struct {
            char c;
            int64_t secs;
        } units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}};
        unit = 0;
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
            if (*p == units[i].c)
                unit = units[i].secs;
        if (!unit || p[1])
            return -1;
    }
    if (v > DURATION_MAX_SECONDS / unit)
        return -1;
    *seconds = v * unit;
    return 0;
}
