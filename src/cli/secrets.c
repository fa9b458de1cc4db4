/*
 * `withruntime secrets set|update|list|rm`: secrets bound to hosts, granted to keys (docs/api.md,
 * "Secrets"). A value is read from stdin or a file, never from the command line (argv is
 * visible to every user); `update` changes who may use one and where it goes without it.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/client.h"
#include "cli/sandbox.h"
#include "common/util.h"

#define VALUE_MAX 8192

static int name_ok(const char *n)
{
    size_t len = strlen(n);
    if (len < 1 || len > 64)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((n[i] >= 'A' && n[i] <= 'Z') || (n[i] >= '0' && n[i] <= '9') || n[i] == '_'))
            return 0;
    return 1;
}

/* Reads the value from fd: all of it, one trailing newline (CRLF too) dropped. */
static int read_value(int fd, char *buf, size_t cap, size_t *len)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == cap)
            return -2;
    }
    if (n && buf[n - 1] == '\n')
        n--;
    if (n && buf[n - 1] == '\r')
        n--;
    buf[n] = '\0';
    *len = n;
    return 0;
}

/* "a,b,,c" as a JSON list of its non-empty items ("" is the empty list). */
static json_t *comma_list(const char *text)
{
    json_t *list = json_array();
    char *copy = xstrdup(text), *save = NULL;
    for (char *h = strtok_r(copy, ",", &save); h; h = strtok_r(NULL, ",", &save))
        if (h[0])
            json_array_append_new(list, json_string(h));
    free(copy);
    return list;
}

/* What set and update share: --hosts, --keys, --headers (each a comma list; NULL if not given)
 * and, for set, --from-file. */
struct secret_args {
    const char *hosts, *keys, *headers, *file, *name;
};

/* Parses argv into a (one NAME). Returns CLI_GO_ON, or an exit status (help printed, or a
 * usage error). */
static int secret_args(const char *cmd, int set, int argc, char **argv, struct secret_args *a)
{
    static const struct option opts[] = {
        {"hosts", required_argument, 0, 'H'},   {"keys", required_argument, 0, 'k'},
        {"headers", required_argument, 0, 'e'}, {"from-file", required_argument, 0, 'f'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    memset(a, 0, sizeof(*a));
    optind = 1;
    opterr = 0;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'H': a->hosts = optarg; break;
        case 'k': a->keys = optarg; break;
        case 'e': a->headers = optarg; break;
        case 'f':
            if (!set)
                return cli_usage_error(cmd, "--from-file: update keeps the value (a new one "
                                            "goes in with 'secrets set')");
            a->file = optarg;
            break;
        case 'h': return cli_print_help();
        default: return cli_bad_option(cmd, argc, argv);
        }
    }
    if (optind != argc - 1)
        return cli_usage_error(cmd, "want one NAME");
    a->name = argv[optind];
    if (!name_ok(a->name))
        return cli_usage_error(cmd, "NAME: 1 to 64 of A-Z, 0-9 and _");
    if (set && (!a->hosts || !a->hosts[0]))
        return cli_usage_error(cmd, "--hosts HOST[,HOST...] is required");
    if (!set && !a->hosts && !a->keys && !a->headers)
        return cli_usage_error(cmd, "nothing to change: give --hosts, --keys or --headers");
    if (!set && a->hosts && !a->hosts[0])
        return cli_usage_error(cmd, "--hosts: at least one HOST");
    return CLI_GO_ON;
}

/* {"hosts", "keys", "headers"} of those a gives. */
static json_t *secret_body(const struct secret_args *a)
{
    json_t *body = json_object();
    if (a->hosts)
        json_object_set_new(body, "hosts", comma_list(a->hosts));
    if (a->keys)
        json_object_set_new(body, "keys", comma_list(a->keys));
    if (a->headers)
        json_object_set_new(body, "headers", comma_list(a->headers));
    return body;
}

/* "key_a,key_b" from a secret's keys, or "the admin only". */
static void print_keys(json_t *secret)
{
    json_t *keys = json_object_get(secret, "keys"), *k;
    size_t i;
    if (!json_array_size(keys))
        printf("the admin's sandboxes only");
    json_array_foreach(keys, i, k) printf("%s%s", i ? "," : "", json_string_value(k));
}

int cli_secrets_set(struct cli_ctx *c, int argc, char **argv)
{
    struct secret_args a;
    int r = secret_args("secrets set", 1, argc, argv, &a);
    if (r != CLI_GO_ON)
        return r;
    const char *name = a.name, *file = a.file;
    int fd = file ? open(file, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
    if (fd < 0) {
        cli_errorf("secrets set: cannot open %s: %s", file, strerror(errno));
        return CLI_EXIT_ERR;
    }
    if (!file && isatty(fd))
        fprintf(stderr, "value for %s (then Enter and Ctrl-D): ", name);
    char *value = xmalloc(VALUE_MAX + 2);
    size_t len = 0;
    r = read_value(fd, value, VALUE_MAX + 1, &len);
    if (file)
        close(fd);
    int ret = CLI_EXIT_ERR;
    if (r == -2 || len > VALUE_MAX) {
        cli_errorf("secrets set: the value is over %d bytes", VALUE_MAX);
    } else if (r < 0 || len == 0) {
        cli_errorf("secrets set: no value read from %s", file ? file : "stdin");
    } else {
        const struct cli_endpoint *ep;
        if ((ret = cli_endpoint(c, &ep)) == 0) {
            json_t *body = secret_body(&a);
            json_object_set_new(body, "value", json_stringn(value, len));
            char path[128];
            snprintf(path, sizeof(path), "/v1/secrets/%s", name);
            struct wr_err err = {0};
            json_t *res = NULL;
            if (cli_json_call(ep, "PUT", path, body, &res, &err) < 0) {
                ret = cli_fail(&err);
            } else {
                printf("secret %s set for %s, usable by ", name, a.hosts);
                print_keys(res);
                printf("\n");
                ret = CLI_EXIT_OK;
            }
            json_decref(res);
            json_decref(body);
        }
    }
    explicit_bzero(value, VALUE_MAX + 2);
    free(value);
    return ret;
}

int cli_secrets_update(struct cli_ctx *c, int argc, char **argv)
{
    struct secret_args a;
    int r = secret_args("secrets update", 0, argc, argv, &a);
    if (r != CLI_GO_ON)
        return r;
    const struct cli_endpoint *ep;
    if (cli_endpoint(c, &ep) != 0)
        return CLI_EXIT_DAEMON;
    json_t *body = secret_body(&a), *res = NULL;
    char path[128];
    snprintf(path, sizeof(path), "/v1/secrets/%s", a.name);
    struct wr_err err = {0};
    int ret = CLI_EXIT_OK;
    if (cli_json_call(ep, "PATCH", path, body, &res, &err) < 0) {
        ret = cli_fail(&err);
    } else {
        printf("secret %s usable by ", a.name);
        print_keys(res);
        printf("\n");
    }
    json_decref(res);
    json_decref(body);
    return ret;
}

int cli_secrets_list(struct cli_ctx *c, int argc, char **argv)
{
    bool as_json = false;
    int r = cli_simple_opts("secrets list", argc, argv, &as_json);
    if (r != CLI_GO_ON)
        return r;
    if (optind < argc)
        return cli_usage_error("secrets list", "unexpected argument '%s'", argv[optind]);
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    struct wr_err err = {0};
    json_t *res = NULL;
    if (cli_json_call(ep, "GET", "/v1/secrets", NULL, &res, &err) < 0)
        return cli_fail(&err);
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    printf("%-32s  %-20s  %-32s  %s\n", "NAME", "UPDATED", "HOSTS", "KEYS");
    size_t i, k;
    json_t *s, *h;
    json_array_foreach(json_object_get(res, "secrets"), i, s)
    {
        printf("%-32s  %-20s  ", cli_shown(s, "name", "?"), cli_shown(s, "updated_at", "-"));
        int w = 0;
        json_array_foreach(json_object_get(s, "hosts"), k, h) w += printf(
            "%s%s", k ? "," : "", json_string_value(h) ? cli_safe(json_string_value(h)) : "?");
        printf("%*s  ", w < 32 ? 32 - w : 0, "");
        json_t *keys = json_object_get(s, "keys");
        if (!json_array_size(keys))
            printf("-");
        json_array_foreach(keys, k, h) printf(
            "%s%s", k ? "," : "", json_string_value(h) ? cli_safe(json_string_value(h)) : "?");
        printf("\n");
    }
    json_decref(res);
    return CLI_EXIT_OK;
}

int cli_secrets_rm(struct cli_ctx *c, int argc, char **argv)
{
    int r = cli_simple_opts("secrets rm", argc, argv, NULL);
    if (r != CLI_GO_ON)
        return r;
    if (optind >= argc)
        return cli_usage_error("secrets rm", "want NAME");
    const struct cli_endpoint *ep;
    int ep_rc = cli_endpoint(c, &ep);
    if (ep_rc != 0)
        return ep_rc;
    int ret = CLI_EXIT_OK;
    for (int i = optind; i < argc; i++) {
        if (!name_ok(argv[i])) {
            ret = cli_usage_error("secrets rm", "bad NAME '%s'", argv[i]);
            continue;
        }
        char path[128];
        snprintf(path, sizeof(path), "/v1/secrets/%s", argv[i]);
        struct wr_err err = {0};
        if (cli_json_call(ep, "DELETE", path, NULL, NULL, &err) < 0)
            ret = cli_fail(&err);
        else
            printf("%s\n", argv[i]);
    }
    return ret;
}
