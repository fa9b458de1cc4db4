/*
 * Small helpers shared by every part: cleanup attributes, ownership transfer,
 * checked allocation, and whole-buffer I/O that retries on EINTR.
 */
#ifndef WR_COMMON_UTIL_H
#define WR_COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#define WR_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static inline void wr_freep(void *p)
{
    free(*(void **)p);
}
static inline void wr_closep(int *fd)
{
    if (*fd >= 0)
        close(*fd);
}

#define cleanup_free __attribute__((cleanup(wr_freep)))
#define cleanup_close __attribute__((cleanup(wr_closep)))

/** Returns *pp and sets *pp to NULL: hands ownership on. */
static inline void *wr_steal_ptr(void *pp)
{
    void **p = pp;
    void *v = *p;
    *p = NULL;
    return v;
}
#define steal_pointer(pp) wr_steal_ptr(pp)

/** Returns *fdp and sets *fdp to -1. */
static inline int steal_fd(int *fdp)
{
    int fd = *fdp;
    *fdp = -1;
    return fd;
}

/** malloc/calloc/realloc/strdup that abort on failure (small fixed-size allocations only). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t m);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/** Writes all of buf, retrying on EINTR and short writes. Returns 0 or -1 (errno set). */
int write_all(int fd, const void *buf, size_t len);

/** Reads exactly len bytes unless EOF comes first. Returns bytes read or -1 (errno set). */
ssize_t read_full(int fd, void *buf, size_t len);

/** Monotonic clock in milliseconds. */
uint64_t now_ms_monotonic(void);

/** CLOCK_MONOTONIC in microseconds. */
uint64_t now_us_monotonic(void);

/** Wall clock in milliseconds since the epoch. */
int64_t now_ms_wall(void);

/** Wall clock in seconds since the epoch. */
int64_t now_unix(void);

/** Formats a unix time as RFC 3339 UTC ("2026-11-29T09:32:12Z") into out (>= 21 bytes). */
void format_rfc3339(int64_t t, char *out, size_t outlen);

/** Big-endian load/store. */
static inline void put_be16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}
static inline void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static inline void put_be64(uint8_t *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}
static inline uint16_t get_be16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}
static inline uint32_t get_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t get_be64(const uint8_t *p)
{
    return ((uint64_t)get_be32(p) << 32) | get_be32(p + 4);
}

/** The value of a hexadecimal digit (either case), or -1 if c is not one. */
int hex_digit(int c);

/** Micro-dollars as dollars, "$0.002000" ("-$..." below zero), into out[len]; returns out. */
const char *usd_format(long long micros, char *out, size_t len);

#endif
