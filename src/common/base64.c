/* Base64 codec; see base64.h. */
#include "common/base64.h"

#include "common/util.h"

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *base64_encode(const void *data, size_t len)
{
    const unsigned char *in = data;
    char *out = xmalloc((len + 2) / 3 * 4 + 1);
    size_t o = 0, i = 0;
    for (; i + 2 < len; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = alphabet[(v >> 6) & 63];
        out[o++] = alphabet[v & 63];
    }
    if (i < len) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < len ? (unsigned)in[i + 1] << 8 : 0);
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < len ? alphabet[(v >> 6) & 63] : '=';
        out[o++] = '=';
    }
    out[o] = '\0';
    return out;
}

static int value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

unsigned char *base64_decode(const char *s, size_t slen, size_t *outlen)
{
    if (slen % 4 != 0)
        return NULL;
    unsigned char *out = xmalloc(slen / 4 * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; i < slen; i += 4) {
        int a = value(s[i]), b = value(s[i + 1]);
        int last = i + 4 == slen;
        int pad2 = last && s[i + 2] == '=' && s[i + 3] == '=';
        int pad1 = last && !pad2 && s[i + 3] == '=';
        int c = pad2 ? 0 : value(s[i + 2]);
        int d = (pad1 || pad2) ? 0 : value(s[i + 3]);
        if (a < 0 || b < 0 || c < 0 || d < 0) {
            free(out);
            return NULL;
        }
        unsigned v = (unsigned)a << 18 | (unsigned)b << 12 | (unsigned)c << 6 | (unsigned)d;
        out[o++] = (unsigned char)(v >> 16);
        if (!pad2)
            out[o++] = (unsigned char)(v >> 8);
        if (!pad1 && !pad2)
            out[o++] = (unsigned char)v;
    }
    *outlen = o;
    return out;
}
