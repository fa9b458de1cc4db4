/*
 * Fuzz target: the JSON body validators on arbitrary request bodies, the
 * way the create and exec handlers call them, plus the UTF-8 and base64
 * helpers on the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/jsonv.h"
#include "common/base64.h"
#include "common/utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = malloc(size + 1);
    if (!body)
        return 0;
    memcpy(body, data, size);
    body[size] = '\0';
    struct wr_err e = {0};
    json_t *o = jv_parse_object(body, &e);
    if (o) {
        static const char *const allowed[] = {"command",         "argv",  "env",  "cpus",
                                              "timeout_seconds", "stdin", "mode", NULL};
        long long v;
        double d;
        int b;
        const char *s = NULL;
        json_t *m = NULL;
        jv_only(o, allowed, &e);
        jv_int(o, "cpus", 1, 64, 2, &v, &e);
        jv_number(o, "timeout_seconds", 0, 86400, 300, &d, &e);
        jv_bool(o, "stream", 0, &b, &e);
        jv_string(o, "command", 1 << 20, &s, &e);
        jv_string_map(o, "env", 256, 256, 32768, 1, &m, &e);
        jv_string_array(o, "argv", 4096, 1 << 20, &m, &e);
        unsigned mode;
        if (jv_string(o, "mode", 8, &s, &e) == 0 && s)
            jv_parse_mode(s, &mode);
        json_decref(o);
    }
    size_t whole = utf8_complete_prefix(data, size);
    if (whole > size || size - whole > 3)
        abort();
    utf8_valid(data, size);
    size_t n;
    unsigned char *dec = base64_decode(body, size, &n);
    if (dec) {
        char *again = base64_encode(dec, n);
        if (strcmp(again, body) != 0 && memchr(body, '=', size) == NULL)
            abort(); /* canonical input without padding must round-trip */
        free(again);
        free(dec);
    }
    free(body);
    return 0;
}
