/* Standard base64 (RFC 4648, with padding), for binary data inside JSON. */
#ifndef WR_COMMON_BASE64_H
#define WR_COMMON_BASE64_H

#include <stddef.h>

/** Encodes len bytes; returns a malloc'd NUL-terminated string (caller frees). */
char *base64_encode(const void *data, size_t len);

/**
 * Decodes a padded base64 string of slen chars into a malloc'd buffer (caller frees), setting
 * *outlen. Returns NULL if the input is not valid base64.
 */
unsigned char *base64_decode(const char *s, size_t slen, size_t *outlen);

#endif
