/*
 * Fuzz target: the CLI's HTTP response parsers (head, chunked bodies, NDJSON
 * lines, error envelopes, base URLs) on arbitrary bytes, since a daemon at
 * RUNTIME_URL is as untrusted to the CLI as a client is to the daemon.
 * The input is also split at a byte chosen by its first byte, to exercise
 * the incremental decoders across feeds.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int sink(void *ctx, const char *d, size_t n, struct wr_err *err)
{
    size_t *total = ctx;
    *total += n;
    (void)d;
    (void)err;
    return 0;
}

static int line(void *ctx, const char *l, size_t n, struct wr_err *err)
{
    char msg[256], code[64];
    cli_error_describe(400, "Bad Request", l, n, msg, sizeof(msg), code, sizeof(code));
    (void)ctx;
    (void)err;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    size_t split = size ? data[0] % (size + 1) : 0;
    struct wr_err err = {0};

    struct cli_head h;
    ssize_t n = cli_head_parse(in, size, &h, &err);
    if (n > (ssize_t)size)
        abort();

    struct cli_chunked c;
    cli_chunked_init(&c);
    size_t total = 0;
    ssize_t used = cli_chunked_feed(&c, in, split, sink, &total, &err);
    if (used >= 0 && (size_t)used == split && !cli_chunked_done(&c))
        cli_chunked_feed(&c, in + split, size - split, sink, &total, &err);
    if (total > size)
        abort();

    struct cli_ndjson s;
    cli_ndjson_init(&s, 4096);
    if (cli_ndjson_feed(&s, in, split, line, NULL, &err) == 0)
        cli_ndjson_feed(&s, in + split, size - split, line, NULL, &err);
    cli_ndjson_finish(&s, &err);
    cli_ndjson_free(&s);

    char *str = malloc(size + 1);
    if (!str)
        return 0;
    memcpy(str, data, size);
    str[size] = '\0';
    struct cli_url u;
    cli_url_parse(str, &u, &err);
    char *q = cli_query_escape(str);
    free(q);
    free(str);
    return 0;
}
