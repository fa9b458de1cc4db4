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

#include "common/log.h"
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

/*
 * A driver's messages name host paths (the state directory, images, loop devices) and quote
 * runsc's output: they go to the daemon's log, and err keeps only what an API client may see:
 * the operation, the sandbox, the step that failed ("(step NAME)" in the driver's message) and
 * the errno's words. The kind is kept. Returns rc.
 */
static int public_failure(const struct driver_spec *spec, const char *op, const char *verb, int rc,
                          struct wr_err *err)
{
    if (rc >= 0 || !err)
        return rc;
    const char *id = spec && spec->id ? spec->id : "(none)";
    log_error(spec ? spec->id : NULL, "driver.failed", "op=%s error=\"%s\"", op, err->msg);
    char step[32] = "";
    const char *s = strstr(err->msg, "(step ");
    if (s) {
        s += strlen("(step ");
        size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyz_");
        if (n > 0 && n < sizeof(step) && s[n] == ')')
            snprintf(step, sizeof(step), " at step %.*s", (int)n, s);
    }
    enum wr_kind kind = err->kind;
    int code = err->code > 0 ? err->code : EIO;
    wr_err_set(err, code, "%s sandbox %.64s failed%s: %s (the daemon log has the details)", verb,
               id, step, strerror(code));
    err->kind = kind;
    return rc;
}

int driver_start(const struct driver_ops *drv, const struct driver_spec *spec, int *chan_fd,
                 struct wr_err *err)
{
    check_thread("start");
    return public_failure(spec, "start", "starting", drv->start(spec, chan_fd, err), err);
}

int driver_stop(const struct driver_ops *drv, const struct driver_spec *spec, struct wr_err *err)
{
    check_thread("stop");
    return public_failure(spec, "stop", "stopping", drv->stop(spec, err), err);
}

int driver_destroy(const struct driver_ops *drv, const struct driver_spec *spec, struct wr_err *err)
{
    check_thread("destroy");
    return public_failure(spec, "destroy", "deleting", drv->destroy(spec, err), err);
}

int driver_stats(const struct driver_ops *drv, const struct driver_spec *spec,
                 struct driver_stats *out, struct wr_err *err)
{
    check_thread("stats");
    return drv->stats(spec, out, err);
}

int driver_freeze(const struct driver_ops *drv, const struct driver_spec *spec, int frozen,
                  struct wr_err *err)
{
    check_thread("freeze");
    if (!drv->freeze)
        return wr_err_set(err, ENOTSUP, "the %s driver cannot freeze sandboxes", drv->name);
    return drv->freeze(spec, frozen, err);
}
