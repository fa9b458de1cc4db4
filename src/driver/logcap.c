/*
 * Capping a sandbox's agent.log on the host (logcap.h). The file is cut in place rather than
 * rotated: runsc holds it open, so a renamed file would go on growing, and a new file in the
 * sandbox directory could race with its removal on delete.
 */
#include "driver/logcap.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

int driver_log_cap(const char *dir, uint64_t max, uint64_t keep, uint64_t *dropped,
                   struct wr_err *err)
{
    if (dropped)
        *dropped = 0;
    if (keep > max)
        keep = max;
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/agent.log", dir) >= (int)sizeof(path))
        return wr_err_set(err, ENAMETOOLONG, "sandbox directory too long");
    cleanup_close int fd = open(path, O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? 0 : wr_err_sys(err, errno, "opening %s", path);
    struct stat st;
    if (fstat(fd, &st) < 0)
        return wr_err_sys(err, errno, "stat %s", path);
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size <= max)
        return 0;
    uint64_t size = (uint64_t)st.st_size;
    char *tail = malloc(keep ? keep : 1);
    if (!tail)
        return wr_err_set(err, ENOMEM, "no memory to cap %s", path);
    ssize_t n = keep ? pread(fd, tail, keep, (off_t)(size - keep)) : 0;
    if (n < 0) {
        int e = errno;
        free(tail);
        return wr_err_sys(err, e, "reading %s", path);
    }
    /* Start at a line: the first, partial one goes. */
    size_t from = 0;
    char *nl = n > 0 ? memchr(tail, '\n', (size_t)n) : NULL;
    from = nl ? (size_t)(nl - tail) + 1 : (size_t)n;
    if (ftruncate(fd, 0) < 0) {
        int e = errno;
        free(tail);
        return wr_err_sys(err, e, "truncating %s", path);
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    time_t t = tv.tv_sec;
    gmtime_r(&t, &tm);
    char ts[32], marker[160];
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    uint64_t gone = size - ((uint64_t)n - from);
    int m = snprintf(marker, sizeof(marker),
                     "ts=%s.%03dZ level=warn event=log.truncated bytes=%llu limit=%llu\n", ts,
                     (int)(tv.tv_usec / 1000), (unsigned long long)gone, (unsigned long long)max);
    /* O_APPEND: lines the agent writes meanwhile land after these, never inside them. */
    if (write_all(fd, marker, (size_t)m) < 0 || write_all(fd, tail + from, (size_t)n - from) < 0) {
        int e = errno;
        free(tail);
        return wr_err_sys(err, e, "writing %s", path);
    }
    free(tail);
    if (dropped)
        *dropped = gone;
    return 1;
}
