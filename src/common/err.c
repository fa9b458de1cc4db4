/* Error objects: see err.h for the convention. */
#include "err.h"

#include <stdio.h>
#include <string.h>

static void vset(struct wr_err *err, int code, const char *fmt, va_list ap)
{
    err->code = code;
    err->kind = WR_E_INTERNAL;
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
}

int wr_err_set(struct wr_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vset(err, code, fmt, ap);
    va_end(ap);
    return -1;
}

int wr_err_sys(struct wr_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vset(err, code, fmt, ap);
    va_end(ap);
    size_t n = strlen(err->msg);
    if (n < sizeof(err->msg) - 1)
        snprintf(err->msg + n, sizeof(err->msg) - n, ": %s", strerror(code));
    return -1;
}

int wr_err_kind(struct wr_err *err, enum wr_kind kind, int code, const char *fmt, ...)
{
    if (!err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vset(err, code, fmt, ap);
    va_end(ap);
    err->kind = kind;
    return -1;
}

int wr_err_prefix(struct wr_err *err, const char *fmt, ...)
{
    if (!err)
        return -1;
    char prefix[WR_ERR_MSG_MAX];
    char old[WR_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof(old));
    snprintf(err->msg, sizeof(err->msg), "%s: %s", prefix, old);
    return -1;
}

void wr_err_clear(struct wr_err *err)
{
    if (!err)
        return;
    err->code = 0;
    err->kind = WR_E_INTERNAL;
    err->msg[0] = '\0';
}
