/*
 * Unit tests for the bounds on log files a sandbox can make grow: the daemon's cut of a
 * sandbox's agent.log (driver/logcap.h), the pump that holds it to its limit at every write,
 * and the agent's own rate limit (log_set_rate).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "driver/logcap.h"
#include "tap.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    *len = fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* A writer far past the limit, as a sandbox writing to its agent's stderr: the file is never
 * larger than the limit, whenever it is looked at, and ends with the newest lines. */
static void pump_checks(const char *dir)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/agent.log", dir);
    unlink(path);
    const uint64_t max = 8192;
    struct wr_err err = {0};
    int wfd = -1;
    off_t before = -1;
    struct logpump *p = logpump_open(dir, "sb-test", max, &wfd, &before, &err);
    ok(p && wfd >= 0 && before == 0, "a pump into a new agent.log (%s)", err.msg);
    if (!p)
        return;
    char line[64];
    uint64_t written = 0;
    off_t biggest = 0;
    int i = 0;
    while (written < (8u << 20)) { /* 8 MiB: a thousand times the limit */
        for (int k = 0; k < 1000; k++, i++) {
            int n = snprintf(line, sizeof(line), "line %07d xxxxxxxxxxxxxxxxxxxxxxxx\n", i);
            if (write_all(wfd, line, (size_t)n) < 0)
                return;
            written += (uint64_t)n;
        }
        /* Looked at now and then, as it is being written. */
        struct stat st;
        if (stat(path, &st) == 0 && st.st_size > biggest)
            biggest = st.st_size;
    }
    logpump_drain(p); /* everything written is in the file now */
    struct stat st;
    ok(stat(path, &st) == 0 && st.st_size <= (off_t)max && biggest <= (off_t)max,
       "%llu bytes written: the file is %lld bytes, never more than %llu (at most %lld seen)",
       (unsigned long long)written, (long long)st.st_size, (unsigned long long)max,
       (long long)biggest);
    size_t len;
    char *text = slurp(path, &len);
    snprintf(line, sizeof(line), "line %07d xxxxxxxxxxxxxxxxxxxxxxxx\n", i - 1);
    ok(text && count(text, "event=log.truncated") == 1 && strstr(text, "limit=8192"),
       "behind one marker line");
    ok(text && len >= strlen(line) && !strcmp(text + len - strlen(line), line),
       "ending with the newest line");
    free(text);
    ok(!logpump_closed(p), "open while a writer holds the pipe");
    if (write_all(wfd, "last words\n", 11) < 0)
        return;
    close(wfd);
    logpump_settle(dir, 10000);
    ok(logpump_closed(p), "settled: closed once the last writer has gone");
    text = slurp(path, &len);
    ok(text && len >= 11 && !strcmp(text + len - 11, "last words\n"),
       "with the writer's last words in the file");
    free(text);
    logpump_release(p);

    /* A link in place of the file is never opened. */
    unlink(path);
    char target[160];
    snprintf(target, sizeof(target), "%s/target", dir);
    close(open(target, O_WRONLY | O_CREAT, 0600));
    if (symlink(target, path) < 0)
        return;
    ok(logpump_open(dir, "sb-test", max, &wfd, NULL, &err) == NULL && wfd == -1,
       "a symlink for agent.log is refused");
    unlink(path);
    unlink(target);
}

int main(void)
{
    char dir[] = "/tmp/wr-test-logcap-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char path[128];
    snprintf(path, sizeof(path), "%s/agent.log", dir);
    struct wr_err err = {0};
    uint64_t dropped = 1;

    ok(driver_log_cap(dir, 4096, 1024, &dropped, &err) == 0 && dropped == 0, "no file: nothing");

    /* A writer holding the file with O_APPEND, as runsc does. */
    int w = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    char line[64];
    for (int i = 0; i < 1000; i++) {
        int n = snprintf(line, sizeof(line), "line %04d\n", i);
        if (write(w, line, (size_t)n) != n)
            return 1;
    }
    ok(driver_log_cap(dir, 1 << 20, 1024, &dropped, &err) == 0, "under the cap: nothing");
    ok(driver_log_cap(dir, 4096, 1024, &dropped, &err) == 1, "over the cap: cut (%s)", err.msg);
    size_t len;
    char *text = slurp(path, &len);
    ok(text && !strncmp(text, "ts=", 3) && strstr(text, "event=log.truncated bytes=") &&
           strstr(text, "limit=4096"),
       "a marker line first");
    ok(len < 1024 + 160, "the newest 1 KiB or less is kept (%zu bytes)", len);
    ok(text && strstr(text, "\nline 0999\n") && !strstr(text, "line 0000"), "the newest lines");
    const char *after = text ? strchr(text, '\n') + 1 : NULL;
    ok(after && !strncmp(after, "line ", 5), "from a line start");
    ok(after && dropped == 10000 - (uint64_t)(len - (size_t)(after - text)),
       "bytes dropped: %llu, the rest kept", (unsigned long long)dropped);
    free(text);
    /* The writer goes on at the new end. */
    if (write(w, "after\n", 6) != 6)
        return 1;
    text = slurp(path, &len);
    ok(text && len > 6 && !strcmp(text + len - 6, "after\n") && count(text, "after") == 1,
       "appends land at the new end, no hole");
    free(text);
    close(w);

    /* A link in place of the file is not followed. */
    unlink(path);
    char target[160];
    snprintf(target, sizeof(target), "%s/target", dir);
    FILE *t = fopen(target, "w");
    for (int i = 0; i < 1000; i++)
        fprintf(t, "line %04d\n", i);
    fclose(t);
    if (symlink(target, path) < 0)
        return 1;
    ok(driver_log_cap(dir, 4096, 1024, &dropped, &err) < 0, "a symlink is refused");
    struct stat st;
    ok(stat(target, &st) == 0 && st.st_size == 10000, "its target untouched");
    unlink(path);
    unlink(target);

    pump_checks(dir);

    /* The rate limit: stderr to a file, 200 lines at once against a burst of 10. */
    char errpath[160];
    snprintf(errpath, sizeof(errpath), "%s/stderr", dir);
    int saved = dup(2);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
    log_set_rate(10, 1);
    for (int i = 0; i < 200; i++)
        log_info(NULL, "test.line", "i=%d", i);
    sleep(2); /* two tokens: the summary and one line */
    log_info(NULL, "test.after", NULL);
    log_set_rate(0, 0);
    for (int i = 0; i < 20; i++)
        log_info(NULL, "test.unlimited", NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    text = slurp(errpath, &len);
    ok(text && count(text, "event=test.line") == 10, "a burst of 10 (%d)",
       text ? count(text, "event=test.line") : -1);
    ok(text && strstr(text, "event=log.suppressed lines=190\n"), "one summary of the 190 dropped");
    ok(text && count(text, "event=test.after") == 1, "lines again once tokens came back");
    ok(text && count(text, "event=test.unlimited") == 20, "0 = no limit");
    free(text);
    unlink(errpath);
    rmdir(dir);
    return tap_done();
}
