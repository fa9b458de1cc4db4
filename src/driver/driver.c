/*
 * The table of drivers behind the isolation seam (driver.h): configuration
 * and lookup by name, so the daemon and the CLI never name a driver's
 * functions directly.
 */
#include "driver/driver.h"

#include <string.h>

#include "common/util.h"

static const struct driver_ops *const drivers[] = {&driver_gvisor};

int driver_init(const struct driver_config *cfg, struct wr_err *err)
{
    return gvisor_configure(cfg, err);
}

const struct driver_ops *driver_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < WR_ARRAY_LEN(drivers); i++)
        if (!strcmp(drivers[i]->name, name))
            return drivers[i];
    return NULL;
}
