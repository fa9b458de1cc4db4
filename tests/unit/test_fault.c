/*
 * Unit tests for fault points (src/common/fault): the spec syntax from the environment and
 * from a file that changes under a running process, counts, prefixes and delays.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fault.h"
#include "common/util.h"
#include "tap.h"

static void arm_env(const char *spec)
{
    unsetenv("WR_FAULTS_FILE");
    setenv("WR_FAULTS", spec, 1);
    fault_reset();
}

static void test_env(void)
{
    struct wr_err err = {0};
    unsetenv("WR_FAULTS");
    unsetenv("WR_FAULTS_FILE");
    fault_reset();
    ok(fault_hit("store.put", &err) == 0 && err.code == 0 && !err.msg[0],
       "nothing armed: no fault, err untouched");

    arm_env("store.put=EBUSY:2, fake.start.*=ENOSPC,x=17,y=bogus");
    ok(fault_hit("store.put", &err) < 0 && err.code == EBUSY && errno == EBUSY,
       "armed point fails with its errno (and sets errno)");
    ok(strstr(err.msg, "fault injected at store.put") != NULL, "message names the point: %s",
       err.msg);
    ok(fault_hit("store.put", NULL) < 0, "second hit fails too (count 2), err may be NULL");
    ok(fault_hit("store.put", &err) == 0, "third hit passes: the count is used up");
    ok(fault_hit("store.delete", &err) == 0, "other points are not armed");
    ok(fault_hit("fake.start.dir", &err) < 0 && err.code == ENOSPC, "prefix* arms fake.start.dir");
    ok(fault_hit("fake.start.spawn", &err) < 0 && fault_hit("fake.start.spawn", &err) < 0,
       "a point without a count fails every time");
    ok(fault_hit("fake.stop", &err) == 0, "the prefix does not match fake.stop");
    ok(fault_hit("x", &err) < 0 && err.code == 17, "numeric errno");
    ok(fault_hit("y", &err) < 0 && err.code == EIO, "unknown errno name means EIO");
}

static void test_delay(void)
{
    struct wr_err err = {0};
    arm_env("slow=delay120:1");
    uint64_t t0 = now_ms_monotonic();
    int rc = fault_hit("slow", &err);
    uint64_t took = now_ms_monotonic() - t0;
    ok(rc == 0 && err.code == 0, "a delay succeeds");
    ok(took >= 120 && took < 2000, "a delay sleeps its time (%llu ms)", (unsigned long long)took);
    t0 = now_ms_monotonic();
    ok(fault_hit("slow", &err) == 0 && now_ms_monotonic() - t0 < 100,
       "a used-up delay does not sleep");
}

static void write_file(const char *path, const char *text)
{
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    fputs(text, f);
    fclose(f);
    rename(tmp, path);
}

static void test_file(void)
{
    struct wr_err err = {0};
    char dir[] = "/tmp/wr-test-fault-XXXXXX";
    if (!mkdtemp(dir)) {
        ok(0, "mkdtemp");
        return;
    }
    char path[128];
    snprintf(path, sizeof(path), "%s/faults", dir);
    unsetenv("WR_FAULTS");
    setenv("WR_FAULTS_FILE", path, 1);
    fault_reset();
    ok(fault_hit("a", &err) == 0, "a missing file arms nothing");
    write_file(path, "a=EACCES\n");
    ok(fault_hit("a", &err) < 0 && err.code == EACCES, "the file is read once it exists");
    write_file(path, "b=EPIPE:1\nc=ENOMEM\n");
    ok(fault_hit("a", &err) == 0, "a changed file replaces the armed set");
    ok(fault_hit("b", &err) < 0 && err.code == EPIPE && fault_hit("b", &err) == 0,
       "newline-separated entries with counts");
    ok(fault_hit("c", &err) < 0 && err.code == ENOMEM, "second line");
    unlink(path);
    ok(fault_hit("c", &err) == 0, "removing the file disarms everything");
    write_file(path, "");
    ok(fault_hit("c", &err) == 0, "an empty file arms nothing");
    unlink(path);
    rmdir(dir);
    unsetenv("WR_FAULTS_FILE");
    fault_reset();
}

int main(void)
{
    test_env();
    test_delay();
    test_file();
    return tap_done();
}
