/*
 * A minimal TAP producer for the unit tests: `ok(cond, name)`, then
 * `return tap_done();` from main. Prints "N passed, N failed" at the end.
 */
#ifndef WR_TESTS_TAP_H
#define WR_TESTS_TAP_H

#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;

#define ok(cond, ...)                                                                              \
    do {                                                                                           \
        int ok_c_ = (cond) ? 1 : 0;                                                                \
        tap_n++;                                                                                   \
        if (!ok_c_)                                                                                \
            tap_failed++;                                                                          \
        printf("%sok %d - ", ok_c_ ? "" : "not ", tap_n);                                          \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        if (!ok_c_)                                                                                \
            printf("#   failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
    } while (0)

static inline int tap_done(void)
{
    printf("1..%d\n", tap_n);
    printf("# %d passed, %d failed\n", tap_n - tap_failed, tap_failed);
    return tap_failed ? 1 : 0;
}

/* Whether the file at path holds needle anywhere in its first MiB (0 if it cannot be read). */
static inline int tap_file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    return memmem(buf, n, needle, strlen(needle)) != NULL;
}

#endif
