/*
 * UTF-8 checks: whatever a sandbox sends back (command output, file names,
 * messages) becomes a JSON string only if it is valid UTF-8, else base64.
 */
#ifndef WR_COMMON_UTF8_H
#define WR_COMMON_UTF8_H

#include <stddef.h>

/** Returns 1 if buf[len] is valid UTF-8 (no overlongs, no surrogates). */
int utf8_valid(const unsigned char *buf, size_t len);

/**
 * Length of the longest prefix of buf[len] that ends on a whole UTF-8 character, so a stream
 * can hold back a character split across chunks (at most 3 bytes are held back).
 */
size_t utf8_complete_prefix(const unsigned char *buf, size_t len);

#endif
