/*
 * Admission's arithmetic (daemon/admission.h) with the host's numbers given: that it counts
 * what sandboxes use and the host has, with reserves, not the sum of their limits; that a
 * sandbox's measurement frees what its reserve held; and that every refusal is a capacity
 * error saying what is short.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/admission.h"
#include "daemon/daemon.h"
#include "daemon/sandbox.h"
#include "tap.h"

#define MAXSB 256

static struct daemon d;
static struct sandbox sbs[MAXSB];
static int nsb;

static void reset(void)
{
    memset(&d, 0, sizeof(d));
    memset(sbs, 0, sizeof(sbs));
    nsb = 0;
    d.cfg.max_running = 1000;
    d.cfg.max_sandboxes = 10000;
    d.cfg.memory_overcommit = 32;
    d.cfg.disk_overcommit = 16;
    d.cfg.disk_reserve_mib = 2048;
    d.host_memory_mib = 24000;
}

/* Adds a default-shape sandbox (2 vCPU, 4096 MiB, 10 GiB) in state st to the daemon's list. */
static struct sandbox *add(enum sb_state st, long long used_mib)
{
    if (nsb == MAXSB)
        abort();
    struct sandbox *s = &sbs[nsb++];
    s->state = st;
    s->cpus = 2;
    s->memory_mib = 4096;
    s->disk_mib = 10240;
    s->memory_used_mib = used_mib;
    s->next = d.sandboxes;
    d.sandboxes = s;
    return s;
}

/* Admits a new sandbox of the default shape with disk_mib; 0 or -1 with err. */
static int admit_disk(const struct admission_host *h, int disk_mib, struct wr_err *err)
{
    struct sandbox sb = {.state = SB_CREATING, .cpus = 2, .memory_mib = 4096, .disk_mib = disk_mib};
    wr_err_clear(err);
    return admission_limits_on(&d, &sb, 1, h, err);
}

/* Admits a new default-shape sandbox (2 vCPU, 4096 MiB, 10 GiB); 0 or -1 with err. */
static int admit(const struct admission_host *h, struct wr_err *err)
{
    return admit_disk(h, 10240, err);
}

static int refused(int rc, const struct wr_err *err, const char *words)
{
    return rc < 0 && err->kind == WR_E_CAPACITY && strstr(err->msg, words) != NULL;
}

int main(void)
{
    struct wr_err err;
    struct admission_host roomy = {
        .mem_available_mib = 20000, .pressure_full = 0, .disk_free_mib = 70000};

    reset();
    for (int i = 0; i < 99; i++)
        add(SB_RUNNING, 17);
    ok(admit(&roomy, &err) == 0,
       "the 100th default-shape sandbox fits a 24 GiB host: 400 GiB of limits, ~17 MiB each in "
       "use (%s)",
       err.msg);

    reset();
    for (int i = 0; i < 20; i++)
        add(SB_CREATING, 0);
    ok(admit(&roomy, &err) == 0, "a burst: 20 starting ones count 32 MiB each (%s)", err.msg);

    /* 50 MiB to spare over the host's 1/16 (1500 MiB): one unmeasured sandbox holds 32 of it,
     * and the new one needs 32 more. */
    struct admission_host tight = {
        .mem_available_mib = 1550, .pressure_full = 0, .disk_free_mib = 70000};
    reset();
    struct sandbox *a = add(SB_RUNNING, 0);
    int rc = admit(&tight, &err);
    ok(refused(rc, &err, "not enough memory: the host has 1550 MiB available, 1500 MiB of it kept"),
       "short of memory: refused, saying so (%s)", err.msg);
    ok(strstr(err.msg, "1 running sandboxes are counted at 32 MiB each at least (32 MiB not yet "
                       "in use); this one needs 32 MiB") != NULL,
       "the message counts the reserves (%s)", err.msg);
    a->memory_used_mib = 80; /* the meter's reading: its use is in MemAvailable already */
    ok(admit(&tight, &err) == 0, "once measured above its reserve, it holds none back (%s)",
       err.msg);
    a->state = SB_STOPPED;
    a->memory_used_mib = 0;
    ok(admit(&tight, &err) == 0, "a stopped one holds no memory (%s)", err.msg);

    reset();
    struct admission_host stalled = roomy;
    stalled.pressure_full = 12.5;
    rc = admit(&stalled, &err);
    ok(refused(rc, &err, "every task stalled on memory 12% of the last 10 s"),
       "under memory stall: refused (%s)", err.msg);
    stalled.pressure_full = -1;
    ok(admit(&stalled, &err) == 0, "no PSI on this kernel: not a refusal (%s)", err.msg);
    struct admission_host unknown = {
        .mem_available_mib = -1, .pressure_full = -1, .disk_free_mib = -1};
    ok(admit(&unknown, &err) == 0, "nothing readable: only the limits count (%s)", err.msg);

    reset();
    for (int i = 0; i < 187; i++)
        add(SB_RUNNING, 17);
    rc = admit(&roomy, &err);
    ok(refused(rc, &err, "--memory-overcommit 32"),
       "the limits bound: 188 x 4096 MiB is past 24000 MiB x 32 (%s)", err.msg);

    reset();
    for (int i = 0; i < 40; i++)
        add(SB_STOPPED, 0);
    ok(admit(&roomy, &err) == 0,
       "40 stopped default-shape sandboxes (400 GiB of quotas) do not block a create (%s)",
       err.msg);

    /* Disk: 300 MiB over the reserve; each running one is given 128 MiB to write. */
    struct admission_host small_disk = {
        .mem_available_mib = 20000, .pressure_full = 0, .disk_free_mib = 2048 + 300};
    ok(admit_disk(&small_disk, 256, &err) == 0, "stopped ones hold no room to write (%s)", err.msg);
    add(SB_RUNNING, 17)->disk_mib = 256;
    add(SB_STARTING, 0)->disk_mib = 256;
    rc = admit_disk(&small_disk, 256, &err);
    ok(refused(rc, &err,
               "not enough disk: 2348 MiB free, 2048 MiB of it kept in reserve "
               "(--disk-reserve-mib), and 2 running sandboxes are given 128 MiB each"),
       "running ones' room to write counts (%s)", err.msg);
    ok(strstr(err.msg, "40 stopped sandboxes hold 0.0 GiB; `withruntime sandbox prune`") != NULL,
       "and the message says what the stopped ones hold and what frees it (%s)", err.msg);
    rc = admit(&small_disk, &err);
    ok(refused(rc, &err, "disk_mib 10240 is more than the state directory's filesystem can hold"),
       "one disk_mib alone past the free space (%s)", err.msg);

    reset();
    struct admission_host one_disk = {
        .mem_available_mib = 20000, .pressure_full = 0, .disk_free_mib = 2048 + 10240};
    for (int i = 0; i < 16; i++)
        add(SB_RUNNING, 17);
    rc = admit(&one_disk, &err);
    ok(refused(rc, &err, "x --disk-overcommit 16"),
       "the disk limits bound: 17 x 10 GiB past 10 GiB free x 16 (%s)", err.msg);

    reset();
    d.cfg.max_running = 2;
    add(SB_RUNNING, 17);
    add(SB_STOPPING, 17);
    rc = admit(&roomy, &err);
    ok(refused(rc, &err, "too many running sandboxes: 2 are running or starting"),
       "--max-running: a capacity error too (%s)", err.msg);
    return tap_done();
}
