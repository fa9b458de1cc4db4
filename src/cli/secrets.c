/*
 * `withruntime secrets set|list|rm`: secrets bound to hosts (docs/api.md, "Secrets"). A value is
 * read from stdin or a file, never from the command line (argv is visible to every user).
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

int cli_secrets_set(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {{"hosts", required_argument, 0, 'H'},
                                         {"from-file", required_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *hosts = NULL, *file = NULL;
    optind = 1;
    opterr = 0;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'H': hosts = optarg; break;
        case 'f': file = optarg; break;
        case 'h': return cli_print_help();
        default: return cli_bad_option("secrets set", argc, argv);
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("secrets set", "want one NAME");
    const char *name = argv[optind];
    if (!name_ok(name))
        return cli_usage_error("secrets set", "NAME: 1 to 64 of A-Z, 0-9 and _");
    if (!hosts || !hosts[0])
        return cli_usage_error("secrets set", "--hosts HOST[,HOST...] is required");
    json_t *list = json_array();
    char *copy = xstrdup(hosts), *save = NULL;
    for (char *h = strtok_r(copy, ",", &save); h; h = strtok_r(NULL, ",", &save))
        if (h[0])
            json_array_append_new(list, json_string(h));
    free(copy);
    int fd = file ? open(file, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
    if (fd < 0) {
        json_decref(list);
        cli_errorf("secrets set: cannot open %s: %s", file, strerror(errno));
        return CLI_EXIT_ERR;
    }
    if (!file && isatty(fd))
        fprintf(stderr, "value for %s (then Enter and Ctrl-D): ", name);
    char *value = xmalloc(VALUE_MAX + 2);
    size_t len = 0;
    int r = read_value(fd, value, VALUE_MAX + 1, &len);
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
            json_t *body = json_pack("{s:s%, s:O}", "value", value, len, "hosts", list);
            char path[128];
            snprintf(path, sizeof(path), "/v1/secrets/%s", name);
            struct wr_err err = {0};
            json_t *res = NULL;
            if (cli_json_call(ep, "PUT", path, body, &res, &err) < 0) {
                ret = cli_fail(&err);
            } else {
                printf("secret %s set for %s\n", name, hosts);
                ret = CLI_EXIT_OK;
            }
            json_decref(res);
            json_decref(body);
        }
    }
    explicit_bzero(value, VALUE_MAX + 2);
    free(value);
    json_decref(list);
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
    if (cli_endpoint(c, &ep) != 0)
        return CLI_EXIT_DAEMON;
    struct wr_err err = {0};
    json_t *res = NULL;
    if (cli_json_call(ep, "GET", "/v1/secrets", NULL, &res, &err) < 0)
        return cli_fail(&err);
    if (as_json) {
        cli_print_json(res);
        json_decref(res);
        return CLI_EXIT_OK;
    }
    printf("%-32s  %-20s  %s\n", "NAME", "UPDATED", "HOSTS");
    size_t i, k;
    json_t *s, *h;
    json_array_foreach(json_object_get(res, "secrets"), i, s)
    {
        printf("%-32s  %-20s  ", cli_shown(s, "name", "?"), cli_shown(s, "updated_at", "-"));
        json_array_foreach(json_object_get(s, "hosts"), k, h) printf(
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
    if (cli_endpoint(c, &ep) != 0)
        return CLI_EXIT_DAEMON;
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
