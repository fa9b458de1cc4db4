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

/*
 * What kind of failure it is, for whoever answers the caller: the API turns a kind into an
 * HTTP status and error code, the CLI into an exit status. Most errors are internal.
 */
enum wr_kind {
    WR_E_INTERNAL = 0,   /* something failed on the host */
    WR_E_INVALID,        /* the request is malformed */
    WR_E_NOT_FOUND,      /* no such sandbox, command, route, or file (code = ENOENT) */
    WR_E_CONFLICT,       /* not now: the sandbox is in the wrong state, or busy */
    WR_E_TOO_LARGE,      /* a body or value beyond its limit */
    WR_E_UNAVAILABLE,    /* the daemon is shutting down */
    WR_E_SANDBOX_FAILED, /* the sandbox's agent died or misbehaved under the request */
    WR_E_EXEC_FAILED,    /* the command could not be started */
    WR_E_FILE,           /* a file operation failed inside the sandbox (code = its errno) */
    WR_E_UNAUTHORIZED,   /* no key, or not a valid one */
    WR_E_FORBIDDEN,      /* the caller may not do this (a read-only key; an admin action) */
    WR_E_COST_LIMIT,     /* a sandbox's cost cap or a key's daily limit is reached */
    WR_E_RATE_LIMITED,   /* too many attempts: try again later */
    WR_E_CAPACITY,       /* the host has no room for one more sandbox now (admission.c) */
};

struct wr_err {
    int code;                 /* errno-style code, 0 when unset */
    enum wr_kind kind;        /* WR_E_INTERNAL unless set by wr_err_kind */
    char msg[WR_ERR_MSG_MAX]; /* human-readable, NUL-terminated */
};

/** Sets err (if not NULL) to code and a formatted message; returns -1. */
int wr_err_set(struct wr_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** Like wr_err_set, appending ": strerror(code)". Returns -1. */
int wr_err_sys(struct wr_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** Like wr_err_set, with the kind of failure. Returns -1. */
int wr_err_kind(struct wr_err *err, enum wr_kind kind, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** Prefixes the existing message with formatted context ("ctx: old"). Returns -1. */
int wr_err_prefix(struct wr_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Clears err. */
void wr_err_clear(struct wr_err *err);

#endif
