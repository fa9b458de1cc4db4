/*
 * Memory pressure: reading the host each second and freezing idle sandboxes while it is short
 * (pressure.h). Runs on the loop thread, like idle.c, whose freeze it uses.
 */
#include "daemon/pressure.h"

#include <stdlib.h>

#include "common/fault.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/idle.h"
#include "daemon/sandbox.h"

/* How often the host is read: the tick runs four times a second, and MemAvailable and PSI's
 * 10 s average move slower than that; a second is also how often the meter reads sandboxes. */
#define PRESSURE_EVERY_MS 1000
/* The margin over admission's kept share (1/N of host memory) below which the host is under
 * pressure: admission refuses creates once sandboxes would eat into the kept share, and the
 * kernel starts reclaiming only far lower (its watermarks: 66-99 MiB of a 24 GiB host), so
 * freezing here comes first. Freezing costs an idle sandbox a few ms at its next request, so
 * acting early is cheap. */
#define PRESSURE_MARGIN_DIV 16
/* PSI "some avg10" at or above this (percent) is pressure too: the kernel is already making
 * tasks wait on reclaim, whatever MemAvailable says (a host with much dirty or unevictable
 * memory). Below admission's "full" 10 % (every task stalled), which refuses creates. */
#define PRESSURE_SOME_MIN 10.0

int pressure_on(long long host_mib, const struct admission_host *h, int was_on)
{
    if (h->pressure_some >= PRESSURE_SOME_MIN)
        return 1;
    if (host_mib <= 0 || h->mem_available_mib < 0)
        return 0;
    long long keep = host_mib / ADMISSION_HOST_KEEP_DIV, margin = host_mib / PRESSURE_MARGIN_DIV;
    /* Once on, it stays on until a second margin is free again: no flapping at the edge. */
    return h->mem_available_mib < keep + margin * (was_on ? 2 : 1);
}

int pressure_check(struct daemon *d, const struct admission_host *h)
{
    int on = pressure_on(d->host_memory_mib, h, d->memory_pressure);
    if (on && !d->memory_pressure)
        log_warn(NULL, "host.memory_pressure",
                 "available_mib=%lld host_mib=%lld psi_some=%.2f psi_full=%.2f",
                 h->mem_available_mib, d->host_memory_mib, h->pressure_some, h->pressure_full);
    else if (!on && d->memory_pressure)
        log_info(NULL, "host.memory_pressure_ended", "available_mib=%lld psi_some=%.2f",
                 h->mem_available_mib, h->pressure_some);
    d->memory_pressure = on;
    if (!on || d->nsandboxes <= 0)
        return 0;
    struct sandbox **idle = xcalloc((size_t)d->nsandboxes, sizeof(*idle));
    size_t n = idle_pick_lru(d, 0, idle, (size_t)d->nsandboxes);
    int asked = 0;
    for (size_t i = 0; i < n; i++)
        asked += idle_freeze_now(idle[i], "memory_pressure");
    free(idle);
    return asked;
}

void pressure_tick(struct daemon *d)
{
    uint64_t now = now_ms_monotonic();
    if (now - d->pressure_read_ms < PRESSURE_EVERY_MS)
        return;
    d->pressure_read_ms = now;
    struct admission_host h;
    admission_read_memory(&h);
    struct wr_err err = {0};
    if (fault_hit("daemon.memory_pressure", &err) < 0)
        h.mem_available_mib = 0;
    pressure_check(d, &h);
}
