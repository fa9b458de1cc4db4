/*
 * Log lines cannot be forged (common/log.h): a value holding what a sandbox or a client sent
 * (a path, an agent's message) stays one value, whatever it holds: quotes, backslashes, spaces,
 * '=', newlines. Each line here is read back as a logfmt reader would, and its fields counted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "tap.h"

#define MAX_FIELDS 16

struct field {
    char key[64];
    char value[4096];
};

/* Decodes the escapes log.h names into out; returns the length, or -1 for a bad escape. */
static int unescape(const char *in, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        if (in[i] != '\\') {
            out[o++] = in[i];
            continue;
        }
        if (++i >= n)
            return -1;
        switch (in[i]) {
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case '"':
        case '\\': out[o++] = in[i]; break;
        case 'x': {
            unsigned v;
            if (i + 2 >= n || sscanf(in + i + 1, "%2x", &v) != 1)
                return -1;
            out[o++] = (char)v;
            i += 2;
            break;
        }
        default: return -1;
        }
    }
    out[o] = '\0';
    return (int)o;
}

/* Reads a logfmt line: key=value or key="value" pairs split by spaces. Returns the number of
 * fields, or -1 if the line is not well formed. */
static int parse(const char *line, struct field *f, int max)
{
    int n = 0;
    const char *p = line;
    while (*p && *p != '\n') {
        if (n == max)
            return -1;
        const char *eq = strchr(p, '=');
        if (!eq || eq == p || (size_t)(eq - p) >= sizeof(f[n].key) || memchr(p, ' ', eq - p))
            return -1;
        snprintf(f[n].key, sizeof(f[n].key), "%.*s", (int)(eq - p), p);
        const char *v = eq + 1, *end;
        if (*v == '"') {
            v++;
            for (end = v; *end && *end != '"'; end++)
                if (*end == '\\' && end[1])
                    end++;
            if (*end != '"')
                return -1;
            if (unescape(v, (size_t)(end - v), f[n].value, sizeof(f[n].value)) < 0)
                return -1;
            end++;
        } else {
            end = v + strcspn(v, " \n");
            if (memchr(v, '"', (size_t)(end - v)) ||
                unescape(v, (size_t)(end - v), f[n].value, sizeof(f[n].value)) < 0)
                return -1;
        }
        n++;
        if (*end == ' ')
            end++;
        else if (*end && *end != '\n')
            return -1;
        p = end;
    }
    return n;
}

static int captured = -1; /* the read end of the pipe stderr writes to */

/* Logs one event with the pairs fmt makes and reads back the line (a line fits in a pipe). */
#define LOG_LINE(out, ...)                                                                         \
    do {                                                                                           \
        log_info(NULL, "test.event", __VA_ARGS__);                                                 \
        ssize_t got_ = read(captured, out, sizeof(out) - 1);                                       \
        out[got_ > 0 ? got_ : 0] = '\0';                                                           \
    } while (0)

static const char *value_of(struct field *f, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(f[i].key, key))
            return f[i].value;
    return NULL;
}

int main(void)
{
    int p[2];
    if (pipe(p) < 0 || dup2(p[1], STDERR_FILENO) < 0)
        return 1;
    captured = p[0];
    static char line[16384];
    static struct field f[MAX_FIELDS];
    /* the fields every line has, before the pairs: ts, level, event */
    enum { BASE = 3 };

    static const char *const hostile[] = {
        "/tmp/a\" evil=\"1",          /* ends the quoted value, starts a field */
        "/tmp/a\\\" evil=1 x=\"",     /* a backslash to eat the escape of the quote */
        "line one\nts=x level=error", /* a second line */
        "tail\\",                     /* a backslash that would escape the closing quote */
        "\x1b]0;title\x07 \r\t\x7f",  /* terminal escapes, other controls */
        "",
    };
    for (size_t i = 0; i < sizeof(hostile) / sizeof(*hostile); i++) {
        LOG_LINE(line, "path=\"%s\" bytes=%d", hostile[i], 7);
        int n = parse(line, f, MAX_FIELDS);
        const char *path = n > 0 ? value_of(f, n, "path") : NULL;
        ok(n == BASE + 2 && path && !strcmp(path, hostile[i]) &&
               !strcmp(value_of(f, n, "bytes"), "7"),
           "a quoted value holding %zu stays one field, read back as sent: %.*s", i,
           (int)strcspn(line, "\n"), line);
        ok(strchr(line, '\n') == line + strlen(line) - 1, "and one line");
    }
    for (size_t i = 0; i < sizeof(hostile) / sizeof(*hostile); i++) {
        LOG_LINE(line, "host=%s port=%d", hostile[i], 443);
        int n = parse(line, f, MAX_FIELDS);
        const char *host = n > 0 ? value_of(f, n, "host") : NULL;
        ok(n == BASE + 2 && host && !strcmp(host, hostile[i]),
           "an unquoted value holding %zu stays one field, read back as sent: %.*s", i,
           (int)strcspn(line, "\n"), line);
    }
    log_info("sb-x y=\"1\"\n", "test.event", "k=%d", 1);
    ssize_t got = read(captured, line, sizeof(line) - 1);
    line[got > 0 ? got : 0] = '\0';
    int fields = parse(line, f, MAX_FIELDS);
    ok(fields == BASE + 2 && !strcmp(value_of(f, fields, "sandbox"), "sb-x y=\"1\"\n"),
       "the sandbox field is escaped too: %.*s", (int)strcspn(line, "\n"), line);
    LOG_LINE(line, "a=%s b=\"%s\"", "x y=z", "p\"q");
    ok(strstr(line, "a=x\\x20y\\x3dz b=\"p\\\"q\""), "the escapes as log.h says: %s", line);

    /* every conversion the daemon uses is formatted as printf would */
    LOG_LINE(line, "n=%d u=%u z=%zu ll=%lld x=%x s=%.3s w=%5s|%-3s| p=%*d f=%.2f c=%c pc=%%", -3,
             4u, (size_t)5, -6LL, 255, "abcdef", "ab", "c", 4, 7, 1.5, 'q');
    ok(strstr(line, "n=-3 u=4 z=5 ll=-6 x=ff s=abc w=\\x20\\x20\\x20ab|c\\x20\\x20| "
                    "p=\\x20\\x20\\x207 f=1.50 c=q pc=%"),
       "conversions as printf makes them: %s", line);

    /* a value past the line's room is cut at a whole escape, still closed */
    static char big[6000];
    memset(big, '"', sizeof(big) - 1);
    LOG_LINE(line, "msg=\"%s\" after=1", big);
    int n = parse(line, f, MAX_FIELDS);
    const char *msg = n > 0 ? value_of(f, n, "msg") : NULL;
    ok(n >= BASE + 1 && msg && strspn(msg, "\"") == strlen(msg) && strlen(msg) > 100,
       "a value too long is cut, and the line still reads (%d fields)", n);
    return tap_done();
}
