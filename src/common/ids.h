/*
 * The shape of a sandbox id, for the daemon that makes them and for anything that checks one
 * before asking (the CLI): "sb-" and 21 characters of lower-case base32, fixed width because
 * runsc matches container ids by prefix.
 */
#ifndef WR_COMMON_IDS_H
#define WR_COMMON_IDS_H

#include <string.h>

#define SB_ID_PREFIX "sb-"
#define SB_ID_LEN 24 /* the prefix and 21 characters */
#define SB_ID_ALPHABET "abcdefghijklmnopqrstuvwxyz234567"

/** Returns 1 if s has the shape of a sandbox id. */
static inline int sb_id_valid(const char *s)
{
    size_t plen = sizeof(SB_ID_PREFIX) - 1;
    return strlen(s) == SB_ID_LEN && strncmp(s, SB_ID_PREFIX, plen) == 0 &&
           strspn(s + plen, SB_ID_ALPHABET) == SB_ID_LEN - plen;
}

#endif
