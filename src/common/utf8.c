/* UTF-8 checks for output and names that may come back as JSON strings; see utf8.h. */
#include "common/utf8.h"

/* Length of the UTF-8 sequence starting at buf (1..4), or 0 if invalid there; needs len bytes. */
static size_t utf8_seq(const unsigned char *b, size_t len)
{
    unsigned char c = b[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned cp;
    if ((c & 0xE0) == 0xC0) {
        n = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (len < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((b[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (b[i] & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

int utf8_valid(const unsigned char *buf, size_t len)
{
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_seq(buf + i, len - i);
        if (!n)
            return 0;
        i += n;
    }
    return 1;
}

size_t utf8_complete_prefix(const unsigned char *buf, size_t len)
{
    /* Look back at most 3 bytes for the lead byte of a sequence that runs past the end. */
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        unsigned char c = buf[len - back];
        if ((c & 0xC0) == 0x80)
            continue; /* continuation byte: keep looking for the lead */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (c >= 0xC2 && c <= 0xF4 && need > back)
            return len - back;
        return len;
    }
    return len;
}
