/*
 * What the CLI shows a person: text that came from a sandbox or the daemon (file names, paths
 * in messages, command lines, a sandbox's metadata) made harmless for a terminal. A file name
 * planted in a sandbox could otherwise hold escape sequences (ESC, CSI, OSC, BEL, a carriage
 * return) that retitle the window, rewrite lines already shown or hide what follows. --json
 * output is not touched: it is exact JSON, where such characters are escaped already.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/util.h"

/* Slots handed out in turn, so one printf can show several values. */
#define SHOW_SLOTS 8

/* Length of the valid UTF-8 character at s (n bytes left), or 0 if the bytes there are not
 * one (overlong, surrogate, past U+10FFFF, cut short). */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : 2;
    if (s[0] < 0xc2 || s[0] > 0xf4 || n < len)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

size_t cli_escape(const char *in, char *out, size_t cap)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t n = strlen(in), o = 0, w = 0; /* needed, written (whole escapes only) */
    for (size_t i = 0; i < n;) {
        char e[12];
        size_t elen, adv = 1;
        if (s[i] == '\n' || s[i] == '\r' || s[i] == '\t') {
            elen = (size_t)snprintf(e, sizeof(e), "\\%c",
                                    "nrt"[s[i] == '\n'   ? 0
                                          : s[i] == '\r' ? 1
                                                         : 2]);
        } else if (s[i] < 0x20 || s[i] == 0x7f) {
            elen = (size_t)snprintf(e, sizeof(e), "\\x%02x", s[i]);
        } else if (s[i] < 0x80) {
            e[0] = (char)s[i];
            elen = 1;
        } else if ((adv = utf8_char(s + i, n - i)) == 0) {
            adv = 1; /* not UTF-8: the byte, as a byte */
            elen = (size_t)snprintf(e, sizeof(e), "\\x%02x", s[i]);
        } else if (s[i] == 0xc2 && s[i + 1] < 0xa0) {
            /* C1 controls (U+0080..U+009F): U+009B is a CSI to a terminal, as ESC [ is */
            elen = (size_t)snprintf(e, sizeof(e), "\\u%04x", s[i + 1]);
        } else {
            memcpy(e, s + i, adv);
            elen = adv;
        }
        if (out && w == o && o + elen < cap) {
            memcpy(out + o, e, elen);
            w += elen;
        }
        o += elen;
        i += adv;
    }
    if (out && cap)
        out[w] = '\0';
    return o;
}

const char *cli_safe(const char *s)
{
    static char *slot[SHOW_SLOTS];
    static size_t size[SHOW_SLOTS];
    static unsigned next;
    if (!s)
        return NULL;
    unsigned k = next++ % SHOW_SLOTS;
    size_t need = cli_escape(s, NULL, 0) + 1;
    if (size[k] < need) {
        slot[k] = xrealloc(slot[k], need);
        size[k] = need;
    }
    cli_escape(s, slot[k], need);
    return slot[k];
}
