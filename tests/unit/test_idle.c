/*
 * The pure parts of idle freezing (daemon/idle.h) and of frozen time's price (daemon/meter.h):
 * when a sandbox is due for the question that may freeze it, and that frozen time is billed
 * no CPU floor.
 */
#include <stdint.h>

#include "daemon/idle.h"
#include "daemon/meter.h"
#include "tap.h"

int main(void)
{
    ok(!idle_due(0, 1000000, 0, 0), "freeze_after 0: never due");
    ok(!idle_due(3000, 2999, 0, 0), "idle less than freeze_after: not due");
    ok(idle_due(3000, 3000, 0, 0), "idle freeze_after: due");
    ok(!idle_due(3000, 60000, 1, 0), "a request open (exec, transfer, stream): not due");
    ok(!idle_due(3000, 60000, 0, 1), "a background command running: not due");

    struct meter_prices p = {.vcpu_hour_micros = METER_DEFAULT_VCPU_HOUR,
                             .gib_hour_micros = METER_DEFAULT_GIB_HOUR,
                             .cpu_floor_permille = METER_DEFAULT_CPU_FLOOR};
    /* 10 s on 2 vCPUs: the floor is 2.5 % of 20 CPU-seconds = 500 ms. */
    ok(meter_billed_cpu(&p, 2, 10000, 0, 0) == 500000, "awake and idle: the floor");
    ok(meter_billed_cpu(&p, 2, 10000, 10000, 0) == 0, "frozen throughout: no CPU billed");
    ok(meter_billed_cpu(&p, 2, 10000, 4000, 0) == 300000, "frozen 4 s of 10: the floor for 6 s");
    ok(meter_billed_cpu(&p, 2, 10000, 4000, 2000000) == 2000000,
       "what was measured, when more than the awake floor");
    ok(meter_billed_cpu(&p, 2, 10000, 20000, 0) == 0, "frozen longer than the slice: clamped");
    return tap_done();
}
