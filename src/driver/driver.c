/*
 * The table of drivers behind the isolation seam (driver.h): lookup and
 * choice by name, and the one door through which the daemon calls a driver,
 * which checks that the caller is not the event loop.
 */
#include "driver/driver.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "driver/fake.h"
#include "driver/gvisor.h"

/* Production drivers first, in order of preference; test drivers are chosen only by name. */
static const struct driver_ops *const drivers[] = {&driver_gvisor, &driver_fake};

static int is_test_driver(const struct driver_ops *drv)
{
    return !strcmp(drv->name, "fake");
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

static const struct driver_ops *try_one(const struct driver_ops *drv,
                                        const struct driver_config *cfg, char *detail,
                                        size_t detail_len, struct wr_err *err)
{
    if (drv->configure(cfg, err) < 0 || drv->probe(detail, detail_len, err) < 0) {
        wr_err_prefix(err, "the %s driver cannot run here", drv->name);
        return NULL;
    }
    return drv;
}

const struct driver_ops *driver_select(const char *name, const struct driver_config *cfg,
                                       char *detail, size_t detail_len, struct wr_err *err)
{
    if (name && name[0]) {
        const struct driver_ops *drv = driver_find(name);
        if (!drv) {
            wr_err_set(err, EINVAL, "unknown driver \"%s\" (gvisor or fake)", name);
            return NULL;
        }
        return try_one(drv, cfg, detail, detail_len, err);
    }
    struct wr_err first = {0};
    for (size_t i = 0; i < WR_ARRAY_LEN(drivers); i++) {
        if (is_test_driver(drivers[i]))
            continue;
        struct wr_err e = {0};
        const struct driver_ops *drv = try_one(drivers[i], cfg, detail, detail_len, &e);
        if (drv)
            return drv;
        if (!first.msg[0])
            first = e;
    }
    if (err)
        *err = first;
    return NULL;
}

int driver_check_id(const char *id, struct wr_err *err)
{
    if (!id || strlen(id) != DRIVER_ID_LEN)
        return wr_err_set(err, EINVAL, "sandbox id must be %d characters", DRIVER_ID_LEN);
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
            return wr_err_set(err, EINVAL, "sandbox id \"%s\" has characters outside [a-z0-9-]",
                              id);
    return 0;
}

int driver_check_overlay_path(const char *what, const char *p, struct wr_err *err)
{
    if (!p || p[0] != '/')
        return wr_err_set(err, EINVAL, "%s must be an absolute path", what);
    if (strpbrk(p, ",:\\\n"))
        return wr_err_set(err, EINVAL, "%s \"%s\" contains ',', ':' or '\\'", what, p);
    if (strlen(p) > PATH_MAX - 64)
        return wr_err_set(err, ENAMETOOLONG, "%s is too long", what);
    if (!strcmp(p, "/"))
        return wr_err_set(err, EINVAL, "refusing to use / as %s", what);
    return 0;
}

static pthread_t forbidden;
static int have_forbidden;

void driver_forbid_this_thread(void)
{
    forbidden = pthread_self();
    have_forbidden = 1;
}

static void check_thread(const char *op)
{
#ifndef NDEBUG
    if (have_forbidden && pthread_equal(pthread_self(), forbidden)) {
        fprintf(stderr, "withruntime: driver %s called on the event-loop thread\n", op);
        abort();
    }
#else
    (void)op;
#endif
}

int driver_start(const struct driver_ops *drv, const struct driver_spec *spec, int *chan_fd,
                 struct wr_err *err)
{
    check_thread("start");
    return drv->start(spec, chan_fd, err);
}

int driver_stop(const struct driver_ops *drv, const struct driver_spec *spec, struct wr_err *err)
{
    check_thread("stop");
    return drv->stop(spec, err);
}

int driver_destroy(const struct driver_ops *drv, const struct driver_spec *spec, struct wr_err *err)
{
    check_thread("destroy");
    return drv->destroy(spec, err);
}

int driver_stats(const struct driver_ops *drv, const struct driver_spec *spec,
                 struct driver_stats *out, struct wr_err *err)
{
    check_thread("stats");
    return drv->stats(spec, out, err);
}
