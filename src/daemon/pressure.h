/*
 * Memory pressure: the daemon acts before the kernel does. Admission (admission.h) refuses
 * new creates while the host is short; this is what is done for the sandboxes already
 * running. Once a second, from the daemon's tick, the host's memory is read (the two /proc
 * files admission reads) and, while it is under pressure, every idle sandbox is frozen at once
 * (daemon/idle.h's rule, least recently used first) instead of after `--freeze-after`: a
 * frozen sandbox allocates nothing, so what the host has left goes to the ones at work. Each
 * such freeze is an event of the sandbox's with reason `memory_pressure`; a request thaws it
 * as any frozen sandbox. Once the pressure is gone nothing more is frozen early, and what was
 * frozen stays so until used.
 *
 * Under pressure means (constants in pressure.c, with why):
 *   - MemAvailable below the share admission keeps for the host (1/16 of its memory) plus as
 *     much again as a margin: 1/8 of its memory. Left only once it is back above 3/16, so a
 *     host at the edge does not flap;
 *   - or PSI "some avg10" (/proc/pressure/memory) at 10 % or more: some task stalled on memory
 *     a tenth of the last 10 s (PSI is an average already: no hysteresis).
 *
 * Tests: the fault point `daemon.memory_pressure` (common/fault.h), armed, makes the host read
 * as having no memory available, so an e2e test can drive this with the fake driver.
 */
#ifndef WR_DAEMON_PRESSURE_H
#define WR_DAEMON_PRESSURE_H

#include "daemon/admission.h"

struct daemon;

/**
 * Whether a host of host_mib MiB with the numbers h is under memory pressure, was_on: whether
 * it was at the last check (pure; tests/unit/test_pressure.c). Unknown numbers (-1) never are.
 */
int pressure_on(long long host_mib, const struct admission_host *h, int was_on);

/**
 * One check with the host's numbers given: notes the start or end of pressure (logged), and
 * while under it asks every idle sandbox to freeze (idle_freeze_now). Returns how many were
 * asked.
 */
int pressure_check(struct daemon *d, const struct admission_host *h);

/** From the daemon's tick: reads the host once a second and checks (pressure_check). */
void pressure_tick(struct daemon *d);

#endif
