/*
 * Errors that travel up: a fallible function returns a negative int and fills
 * an `struct wr_err` passed as its last argument (errno plus a message).
 * Context is prefixed as it travels up; only the top turns it into an exit
 * code or an HTTP status.
 */
#ifndef WR_COMMON_ERR_H
#define WR_COMMON_ERR_H

#include <stdarg.h>

#define WR_ERR_MSG_MAX 512

struct wr_err {
    int code;                 /* errno-style code, 0 when unset */
    char msg[WR_ERR_MSG_MAX]; /* human-readable, NUL-terminated */
};

/** Sets err (if not NULL) to code and a formatted message; returns -1. */
int wr_err_set(struct wr_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** Like wr_err_set, appending ": strerror(code)". Returns -1. */
int wr_err_sys(struct wr_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** Prefixes the existing message with formatted context ("ctx: old"). Returns -1. */
int wr_err_prefix(struct wr_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Clears err. */
void wr_err_clear(struct wr_err *err);

#endif
